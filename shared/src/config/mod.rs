//! Each function's configuration, read once at cold start from environment variables.
//!
//! A bad configuration fails the cold start with one message naming every missing or
//! invalid variable, so a broken deployment is fixed in one round rather than one
//! variable at a time. `variables.rs` is the one list of the names, which functions read
//! each and who sets it, and the problems come in its order; `env.rs` reads and checks
//! them.
//!
//! This layer sits below the handlers: it knows the domain and the ports' plain types,
//! and the handlers build their `Settings` from it (`handlers::Settings::from_config`),
//! never the other way round. The adapters do not know it: what they are built with
//! (`TableNames`, `Deployment`) is the ports', which this layer reads from the environment.

mod env;
pub mod variables;

use env::{process_env, read};
pub use variables::{FunctionName, Need, Source, VARIABLES, Variable};

use crate::domain::{Definitions, Policy, QueueId, ReplyToRules};
use crate::ports::QueueUrl;

/// The tables' defaults, and the types the adapters are built with, are the ports': this
/// layer reads them from the environment.
pub use crate::ports::{
    DEFAULT_DUE_INDEX, DEFAULT_DUE_SHARDS, DEFAULT_ERROR_INDEX, DEFAULT_FINISHED_INDEX,
    DEFAULT_RETENTION_DAYS, Deployment, TableNames,
};
/// A century: beyond it "keep forever" (0) says what is meant.
pub const MAX_RETENTION_DAYS: u32 = 36_500;
pub const MAX_DUE_SHARDS: u32 = 1_000;
pub const DEFAULT_METRICS_NAMESPACE: &str = "sas";
/// The submission, scheduler and supervisor: their handlers wait only on AWS calls, so a
/// round's sends are held until all of them arrive unless one call is very slow. On a
/// store that serves one request at a time the ten handlers of a batch reach their sends
/// hundreds of ms apart; 300 ms keeps them in one request (docs/BENCHMARKS.md, section 8).
pub const DEFAULT_SEND_MAX_HOLD_MS: u64 = 300;
/// The agent: a handler waiting on its remote service holds the others' replies for up to
/// this long, so it stays short (docs/BENCHMARKS.md, section 6).
pub const DEFAULT_AGENT_SEND_MAX_HOLD_MS: u64 = 20;
/// Past a second a held send costs more in latency than batching saves.
pub const MAX_SEND_MAX_HOLD_MS: u64 = 1_000;
/// The one limit on a step's lease, the same as `StepTimeoutMs` in template.yaml: an
/// attempt must end, reply included, within the agent function's 60 s timeout.
pub use crate::domain::definitions::{MAX_STEP_TIMEOUT_MS, MIN_STEP_TIMEOUT_MS};
/// The queues of the deployment itself: `reply_to` may never name one of them, nor a
/// queue agent's `queue_url`.
pub const OWN_QUEUE_VARIABLES: [&str; 8] = [
    "ORDERS_QUEUE_URL",
    "ORDERS_DLQ_URL",
    "SCHEDULER_QUEUE_URL",
    "SCHEDULER_DLQ_URL",
    "AGENT_QUEUE_URL",
    "AGENT_DLQ_URL",
    "CALLBACK_QUEUE_URL",
    "CALLBACK_DLQ_URL",
];

/// Stands in for `AGENT_QUEUE_URL` in functions that never dispatch (submission and
/// supervisor: only a claim dispatches, and only the scheduler claims). Not a URL, so
/// a send to it would fail and be retried rather than go anywhere.
pub const UNUSED_AGENT_QUEUE: &str = "unconfigured:AGENT_QUEUE_URL";

/// Every missing or invalid variable, not just the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", .problems.join("; "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// What every function that writes the state table reads (submission, scheduler,
/// supervisor): the handlers' `Settings` are built from this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    pub tables: TableNames,
    /// The agents and workflows (`WORKFLOWS_FILE`).
    pub definitions: Definitions,
    /// Where orders may ask for status.
    pub reply_to: ReplyToRules,
    pub scheduler_queue: QueueUrl,
    /// Only the scheduler dispatches to agents, so only it requires this.
    pub agent_queue: Option<QueueUrl>,
    pub policy: Policy,
    pub metrics_namespace: String,
    /// The longest a send waits to go out in one request with the invocation's others.
    pub send_max_hold_ms: u64,
}

/// Where operator alerts go, and the deployment each alert's `show` command names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertConfig {
    pub topic_arn: String,
    pub deployment: Deployment,
}

impl env::Env<'_> {
    fn state(&mut self, agent_queue: Need) -> StateConfig {
        let config = StateConfig {
            tables: self.tables(),
            definitions: self.definitions(),
            scheduler_queue: self.queue("SCHEDULER_QUEUE_URL"),
            agent_queue: match agent_queue {
                Need::Required => Some(self.queue("AGENT_QUEUE_URL")),
                Need::Optional => self.optional_queue("AGENT_QUEUE_URL"),
            },
            policy: self.policy(),
            metrics_namespace: self.namespace(),
            send_max_hold_ms: self.send_max_hold(DEFAULT_SEND_MAX_HOLD_MS),
            reply_to: self.reply_to(),
        };
        self.queue_agents_apart(&config);
        config
    }

    /// A queue agent's requests carry lease tokens and orders, and its worker may answer
    /// on the scheduler queue. Pointed at one of the deployment's own queues, requests
    /// would land among the pipeline's messages (a Schedule queue that parses them as
    /// bad input, the orders queue that would read them as orders, the callback queue as
    /// completions; `OWN_QUEUE_VARIABLES` names them all); pointed at a queue
    /// status may go to, every app reading status would see the leases.
    fn queue_agents_apart(&mut self, config: &StateConfig) {
        for (name, agent) in &config.definitions.agents {
            let Some(url) = agent.queue() else { continue };
            let Some((account, queue)) = QueueId::account_and_name(url) else { continue };
            let id = QueueId { region: String::new(), account, name: queue };
            let why = if config.reply_to.is_own(&id) {
                "allowed: it is one of this deployment's own queues; a queue agent needs a queue of its own"
            } else if config.reply_to.allowed().any(|q| q.account == id.account && q.name == id.name) {
                "allowed: orders may ask for status there (STATUS_QUEUE_ARN, REPLY_TO_EXTRA_QUEUE_ARNS); a queue agent needs a queue of its own"
            } else {
                continue;
            };
            self.check(&format!("WORKFLOWS_FILE: agent {name}'s queue_url"), url, false, why);
        }
    }

    /// Under Lambda the Runtime API listens on loopback (`AWS_LAMBDA_RUNTIME_API`), where
    /// plain http is otherwise allowed for local runs: a remote service there would be
    /// handed orders and could answer the function's own invocations. No agent may call it.
    fn not_the_runtime_api(&mut self, config: &AgentConfig) {
        let Some(api) = self.optional("AWS_LAMBDA_RUNTIME_API") else { return };
        // Every name of this host's loopback is one address: `localhost:9001` is
        // `127.0.0.1:9001`.
        let address = |raw: &str| {
            let url = url::Url::parse(raw).ok()?;
            let host = match url.host()? {
                url::Host::Domain(d) if d.eq_ignore_ascii_case("localhost") => "loopback".to_owned(),
                url::Host::Ipv4(ip) if ip.is_loopback() => "loopback".to_owned(),
                url::Host::Ipv6(ip) if ip.is_loopback() => "loopback".to_owned(),
                other => other.to_string(),
            };
            Some((host, url.port_or_known_default()?))
        };
        // Lambda gives `host:port`; cargo-lambda's emulator a URL.
        let Some(runtime) = address(&api).or_else(|| address(&format!("http://{api}"))) else { return };
        let mut targets = vec![("REMOTE_SERVICE_URL".to_owned(), config.remote_service_url.as_str())];
        for (name, agent) in &config.definitions.agents {
            if let Some(url) = &agent.url {
                targets.push((format!("WORKFLOWS_FILE: agent {name}'s url"), url));
            }
        }
        for (what, url) in targets {
            if address(url).is_some_and(|a| a == runtime) {
                self.check(
                    &what,
                    url,
                    false,
                    "allowed: it is the Lambda Runtime API (AWS_LAMBDA_RUNTIME_API)",
                );
            }
        }
    }

    /// `CALLBACK_QUEUE_URL`: a queue named by account and name (the scheduler matches
    /// each record's `eventSourceARN` against it; `reply_to` reports a URL without them,
    /// as for every queue of the deployment), other than the scheduler queue, whose
    /// records would then all be read as completions.
    fn callback_queue(&mut self, scheduler_queue: &QueueUrl) -> QueueUrl {
        let url = self.queue("CALLBACK_QUEUE_URL");
        let id = QueueId::account_and_name(&url.0);
        if id.is_some() && id == QueueId::account_and_name(&scheduler_queue.0) {
            self.check(
                "CALLBACK_QUEUE_URL",
                &url.0,
                false,
                "a queue of its own: it names the scheduler queue (SCHEDULER_QUEUE_URL), whose messages would all be read as completions",
            );
        }
        url
    }

    fn alerts(&mut self, tables: &TableNames) -> AlertConfig {
        AlertConfig { deployment: self.deployment(tables), topic_arn: self.arn("ALERT_TOPIC_ARN") }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmissionConfig {
    pub state: StateConfig,
    pub orders_queue: QueueUrl,
    pub orders_dlq: QueueUrl,
}

impl SubmissionConfig {
    pub fn from_env() -> Result<SubmissionConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SubmissionConfig, ConfigError> {
        read(FunctionName::Submission, lookup, |env| {
            let state = env.state(Need::Optional);
            SubmissionConfig {
                state,
                orders_queue: env.queue("ORDERS_QUEUE_URL"),
                orders_dlq: env.queue("ORDERS_DLQ_URL"),
            }
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Its `agent_queue` is always set: the scheduler requires `AGENT_QUEUE_URL`.
    pub state: StateConfig,
    pub scheduler_dlq: QueueUrl,
    /// The callback queue, the function's second event source: its records are told
    /// apart from the scheduler queue's by this queue (`lambda::serve_sqs_routed`).
    pub callback_queue: QueueUrl,
    /// Where a refused or malformed completion is kept with its reason.
    pub callback_dlq: QueueUrl,
    pub alerts: AlertConfig,
}

impl SchedulerConfig {
    pub fn from_env() -> Result<SchedulerConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SchedulerConfig, ConfigError> {
        read(FunctionName::Scheduler, lookup, |env| {
            let state = env.state(Need::Required);
            let scheduler_dlq = env.queue("SCHEDULER_DLQ_URL");
            let callback_queue = env.callback_queue(&state.scheduler_queue);
            let callback_dlq = env.queue("CALLBACK_DLQ_URL");
            let alerts = env.alerts(&state.tables);
            SchedulerConfig { state, scheduler_dlq, callback_queue, callback_dlq, alerts }
        })
    }
}

/// The `reply_to` rules of a deployment's functions, from the variables they read them
/// from (`STATUS_QUEUE_ARN`, `REPLY_TO_EXTRA_QUEUE_ARNS`, the region and endpoint, the eight
/// queues) given through `lookup`. `sasctl tasks` sends an operator action's status
/// updates under these rules, so it allows no `reply_to` the functions would refuse.
pub fn reply_to_rules(lookup: &dyn Fn(&str) -> Option<String>) -> Result<ReplyToRules, ConfigError> {
    // The scheduler reads every one of these variables.
    read(FunctionName::Scheduler, lookup, |env| env.reply_to())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The agents and workflows (`WORKFLOWS_FILE`): each agent's URL, timeout, retry and
    /// breaker, and the workflows requests are checked against.
    pub definitions: Definitions,
    pub agent_queue: QueueUrl,
    pub agent_dlq: QueueUrl,
    pub scheduler_queue: QueueUrl,
    pub remote_service_url: String,
    pub metrics_namespace: String,
    /// The longest a send waits to go out in one request with the invocation's others.
    pub send_max_hold_ms: u64,
    /// Where limited agents' calls leave their marks (`STATE_TABLE`): set exactly when an
    /// agent of the definitions has limits, which then requires it.
    pub state_table: Option<String>,
}

impl AgentConfig {
    pub fn from_env() -> Result<AgentConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<AgentConfig, ConfigError> {
        read(FunctionName::Agent, lookup, |env| {
            let remote = env.required("REMOTE_SERVICE_URL");
            let config = AgentConfig {
                definitions: env.definitions(),
                agent_queue: env.queue("AGENT_QUEUE_URL"),
                agent_dlq: env.queue("AGENT_DLQ_URL"),
                scheduler_queue: env.queue("SCHEDULER_QUEUE_URL"),
                remote_service_url: if remote.is_empty() {
                    remote
                } else {
                    env.remote_url("REMOTE_SERVICE_URL", remote)
                },
                metrics_namespace: env.namespace(),
                send_max_hold_ms: env.send_max_hold(DEFAULT_AGENT_SEND_MAX_HOLD_MS),
                state_table: None,
            };
            let limited: Vec<&str> = config
                .definitions
                .agents
                .iter()
                .filter(|(_, def)| def.limits().any())
                .map(|(name, _)| name.as_str())
                .collect();
            // Without limits the agent touches no table, whatever the variable says.
            let state_table = match (env.optional("STATE_TABLE"), limited.is_empty()) {
                (_, true) => None,
                (Some(_), false) => Some(env.table("STATE_TABLE")),
                (None, false) => {
                    env.problem(format!(
                        "STATE_TABLE is not set: the agent marks each call of an agent with limits there \
                         before it makes it (WORKFLOWS_FILE gives limits to {})",
                        limited.join(", ")
                    ));
                    None
                }
            };
            let config = AgentConfig { state_table, ..config };
            env.not_the_runtime_api(&config);
            config
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    pub state: StateConfig,
    pub alerts: AlertConfig,
}

impl SupervisorConfig {
    pub fn from_env() -> Result<SupervisorConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SupervisorConfig, ConfigError> {
        read(FunctionName::Supervisor, lookup, |env| {
            let state = env.state(Need::Optional);
            let alerts = env.alerts(&state.tables);
            SupervisorConfig { state, alerts }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    const Q: &str = "http://localhost:5000/000000000000/q";
    const STATUS_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:sas-status";

    #[test]
    fn names_every_missing_and_invalid_variable_at_once() {
        let err = SchedulerConfig::from_lookup(&lookup(&[
            ("STATE_TABLE", "bad name!"),
            ("DUE_SHARDS", "0"),
            ("SCHEDULER_QUEUE_URL", "sqs-queue"),
            ("ALERT_TOPIC_ARN", "topic"),
            ("FAILURE_THRESHOLD", "five"),
            ("RETRY_BASE_MS", "5000"),
            ("RETRY_CAP_MS", "100"),
        ]))
        .unwrap_err();
        let text = err.to_string();
        for want in [
            "STATE_TABLE=\"bad name!\" is not a DynamoDB table",
            "DUE_SHARDS=\"0\" is not a whole number from 1 to 1000",
            "SCHEDULER_QUEUE_URL=\"sqs-queue\" is not an http(s) URL",
            "SCHEDULER_DLQ_URL is not set",
            "AGENT_QUEUE_URL is not set",
            "ALERT_TOPIC_ARN=\"topic\" is not an ARN",
            "FAILURE_THRESHOLD=\"five\"",
            "RETRY_CAP_MS (100) is below RETRY_BASE_MS (5000)",
            "STATUS_QUEUE_ARN is not set",
            "CALLBACK_QUEUE_URL is not set",
            "CALLBACK_DLQ_URL is not set",
        ] {
            assert!(text.contains(want), "missing {want:?} in {text}");
        }
        assert_eq!(err.problems.len(), 11, "{text}");
    }

    #[test]
    fn defaults_fill_optional_variables() {
        let c = SupervisorConfig::from_lookup(&lookup(&[
            ("STATE_TABLE", "sas-state"),
            ("SCHEDULER_QUEUE_URL", Q),
            ("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:sas-alerts"),
            ("STATUS_QUEUE_ARN", STATUS_ARN),
            ("AGENT_QUEUE_URL", ""),
            ("STEP_TIMEOUT_MS", " 5000 "),
        ]))
        .unwrap();
        assert_eq!(c.state.tables.due_index, "due-index");
        assert_eq!(c.state.tables.due_shards, 4);
        assert_eq!(c.state.tables.error_index, "error-index");
        assert_eq!(c.state.tables.retention_days, 30);
        assert_eq!(c.alerts.deployment, Deployment::Prefix("sas".into()));
        assert_eq!(c.state.policy.step_timeout_ms, 5_000);
        assert_eq!(c.state.policy.failure_threshold, 5);
        assert_eq!(c.state.metrics_namespace, "sas");
        assert_eq!(c.state.agent_queue, None);
        assert_eq!(c.state.send_max_hold_ms, DEFAULT_SEND_MAX_HOLD_MS);
    }

    fn supervisor(extra: &[(&str, &str)]) -> Result<SupervisorConfig, ConfigError> {
        let mut vars = vec![
            ("STATE_TABLE", "sas-state"),
            ("SCHEDULER_QUEUE_URL", Q),
            ("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:sas-alerts"),
            ("STATUS_QUEUE_ARN", STATUS_ARN),
        ];
        vars.extend_from_slice(extra);
        SupervisorConfig::from_lookup(&lookup(&vars))
    }

    #[test]
    fn retention_is_whole_days_and_zero_keeps_forever() {
        assert_eq!(supervisor(&[("RETENTION_DAYS", "0")]).unwrap().state.tables.retention_days, 0);
        assert_eq!(supervisor(&[("RETENTION_DAYS", " 365 ")]).unwrap().state.tables.retention_days, 365);
        for bad in ["-1", "30d", "1.5", "36501"] {
            let err = supervisor(&[("RETENTION_DAYS", bad)]).unwrap_err();
            assert_eq!(
                err.problems,
                [format!("RETENTION_DAYS={bad:?} is not a whole number from 0 to 36500")],
                "{bad}"
            );
        }
    }

    #[test]
    fn alerts_name_the_stack_else_the_prefix() {
        let c = supervisor(&[("STACK_NAME", "shop-prod")]).unwrap();
        assert_eq!(c.alerts.deployment, Deployment::Stack("shop-prod".into()));
        assert_eq!(supervisor(&[]).unwrap().alerts.deployment, Deployment::Prefix("sas".into()));
        let c = supervisor(&[("STATE_TABLE", "orders-table")]).unwrap();
        assert_eq!(c.alerts.deployment, Deployment::Unnamed);
        assert_eq!(Deployment::infer(None, "-state"), Deployment::Unnamed);
    }

    #[test]
    fn the_send_hold_is_bounded() {
        let read = |hold: &str| {
            AgentConfig::from_lookup(&lookup(&[
                ("AGENT_QUEUE_URL", Q),
                ("AGENT_DLQ_URL", Q),
                ("SCHEDULER_QUEUE_URL", Q),
                ("REMOTE_SERVICE_URL", "http://127.0.0.1:9/"),
                ("SEND_MAX_HOLD_MS", hold),
            ]))
        };
        assert_eq!(read("0").unwrap().send_max_hold_ms, 0);
        // Without it the agent holds briefly: its handlers may be waiting on remote services.
        let agent = AgentConfig::from_lookup(&lookup(&[
            ("AGENT_QUEUE_URL", Q),
            ("AGENT_DLQ_URL", Q),
            ("SCHEDULER_QUEUE_URL", Q),
            ("REMOTE_SERVICE_URL", "http://127.0.0.1:9/"),
        ]))
        .unwrap();
        assert_eq!(agent.send_max_hold_ms, DEFAULT_AGENT_SEND_MAX_HOLD_MS);
        const { assert!(DEFAULT_AGENT_SEND_MAX_HOLD_MS < DEFAULT_SEND_MAX_HOLD_MS) };
        let err = read("5000").unwrap_err();
        assert_eq!(err.problems, ["SEND_MAX_HOLD_MS=\"5000\" is not a whole number from 0 to 1000"]);
    }

    #[test]
    fn each_function_reads_its_own_set() {
        let agent = AgentConfig::from_lookup(&lookup(&[
            ("AGENT_QUEUE_URL", Q),
            ("AGENT_DLQ_URL", Q),
            ("SCHEDULER_QUEUE_URL", Q),
            ("REMOTE_SERVICE_URL", "http://127.0.0.1:9/"),
        ]));
        assert!(agent.is_ok(), "the agent needs no table: {agent:?}");
        let err = SubmissionConfig::from_lookup(&lookup(&[])).unwrap_err();
        assert_eq!(
            err.problems,
            [
                "STATE_TABLE is not set",
                "ORDERS_QUEUE_URL is not set",
                "ORDERS_DLQ_URL is not set",
                "SCHEDULER_QUEUE_URL is not set",
                "STATUS_QUEUE_ARN is not set",
            ]
        );
    }

    fn agent_with_remote(remote: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::from_lookup(&lookup(&[
            ("AGENT_QUEUE_URL", Q),
            ("AGENT_DLQ_URL", Q),
            ("SCHEDULER_QUEUE_URL", Q),
            ("REMOTE_SERVICE_URL", remote),
        ]))
    }

    /// The agent needs the state table only for limited agents' call marks: required
    /// then, with a message that says why; otherwise not kept, whatever is set.
    #[test]
    fn the_agent_requires_the_state_table_only_for_limited_agents() {
        let dir = std::env::temp_dir().join(format!("sas-config-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limited.json");
        std::fs::write(&file, r#"{"agents": {"pay": {"url": "https://pay.example/sas", "max_in_flight": 2}}, "workflows": [{"name": "buy", "steps": [{"name": "charge", "agent": "pay"}]}]}"#).unwrap();
        let path = file.to_str().unwrap().to_owned();
        let agent = |extra: &[(&str, &str)]| {
            let mut vars = vec![
                ("AGENT_QUEUE_URL", Q),
                ("AGENT_DLQ_URL", Q),
                ("SCHEDULER_QUEUE_URL", Q),
                ("REMOTE_SERVICE_URL", "https://remote.example/"),
            ];
            vars.extend_from_slice(extra);
            AgentConfig::from_lookup(&lookup(&vars))
        };
        let err = agent(&[("WORKFLOWS_FILE", &path)]).unwrap_err();
        assert_eq!(
            err.problems,
            ["STATE_TABLE is not set: the agent marks each call of an agent with limits there before it \
              makes it (WORKFLOWS_FILE gives limits to pay)"]
        );
        let limited = agent(&[("WORKFLOWS_FILE", &path), ("STATE_TABLE", "sas-state")]).unwrap();
        assert_eq!(limited.state_table.as_deref(), Some("sas-state"));
        let err = agent(&[("WORKFLOWS_FILE", &path), ("STATE_TABLE", "bad name!")]).unwrap_err();
        assert!(err.problems[0].starts_with("STATE_TABLE=\"bad name!\" is not a DynamoDB table"), "{err}");
        // The built-in definitions have no limits.
        assert_eq!(agent(&[("STATE_TABLE", "sas-state")]).unwrap().state_table, None);
        assert_eq!(agent(&[]).unwrap().state_table, None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn workflows_file_names_the_definitions_and_every_problem_stops_the_cold_start() {
        let dir = std::env::temp_dir().join(format!("sas-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let agent_with = |path: &std::path::Path| {
            let path = path.to_str().unwrap().to_owned();
            AgentConfig::from_lookup(&lookup(&[
                ("AGENT_QUEUE_URL", Q),
                ("AGENT_DLQ_URL", Q),
                ("SCHEDULER_QUEUE_URL", Q),
                ("REMOTE_SERVICE_URL", "http://127.0.0.1:9/"),
                ("WORKFLOWS_FILE", &path),
            ]))
        };
        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"agents": {"pay": {"url": "https://pay.example/sas"}}, "workflows": [{"name": "buy", "steps": [{"name": "charge", "agent": "pay"}]}]}"#).unwrap();
        let config = agent_with(&good).unwrap();
        assert_eq!(config.definitions.workflows.names(), ["buy"]);
        assert!(config.definitions.agents.contains_key("pay"));

        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"agents": {}, "workflows": [{"name": "buy", "steps": [{"name": "charge", "agent": "pay"}]}]}"#).unwrap();
        let err = agent_with(&bad).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err:?}");
        assert!(
            err.problems[0].starts_with(&format!(
                "WORKFLOWS_FILE={:?} is not valid: error: workflow buy v1, step charge, agent: unknown agent",
                bad.to_str().unwrap()
            )),
            "{err:?}"
        );

        // A secret bound for plain http, or for the deployment's URL, stops the agent too
        // (issue 24, finding 4): the same check as `sasctl workflows validate`.
        let auth = r#""auth": {"header": "Authorization", "secret": "ssm:/sas/pay"}"#;
        for agent in [format!(r#"{{"url": "http://127.0.0.1:9/pay", {auth}}}"#), format!("{{{auth}}}")] {
            let text = format!(
                r#"{{"agents": {{"pay": {agent}}}, "workflows": [{{"name": "buy", "steps": [{{"name": "charge", "agent": "pay"}}]}}]}}"#
            );
            std::fs::write(&bad, text).unwrap();
            let err = agent_with(&bad).unwrap_err();
            assert!(err.problems[0].contains("error: agent pay, auth: an agent with auth must"), "{err:?}");
        }

        let err = agent_with(&dir.join("missing.json")).unwrap_err();
        assert!(err.problems[0].contains("cannot be read"), "{err:?}");
        std::fs::remove_dir_all(&dir).unwrap();

        // Unset: the built-in definitions.
        assert_eq!(agent_with_remote("http://127.0.0.1:9/").unwrap().definitions, Definitions::example());
    }

    #[test]
    fn the_remote_service_is_https_except_on_loopback() {
        for ok in [
            "https://remote.example/api",
            "http://127.0.0.1:9/",
            "http://localhost:8080",
            "http://[::1]:80/x",
        ] {
            assert!(agent_with_remote(ok).is_ok(), "{ok}");
        }
        for bad in ["http://remote.example/api", "http://10.0.0.1/", "ftp://x", "https://", "remote.example"]
        {
            let err = agent_with_remote(bad).unwrap_err();
            assert_eq!(
                err.problems,
                [format!(
                    "REMOTE_SERVICE_URL={bad:?} is not an https URL (plain http is accepted only to a loopback host)"
                )],
                "{bad}"
            );
        }
    }

    #[test]
    fn the_step_timeout_has_the_templates_limit() {
        let read = |ms: &str| {
            SupervisorConfig::from_lookup(&lookup(&[
                ("STATE_TABLE", "sas-state"),
                ("SCHEDULER_QUEUE_URL", Q),
                ("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:sas-alerts"),
                ("STATUS_QUEUE_ARN", STATUS_ARN),
                ("STEP_TIMEOUT_MS", ms),
            ]))
        };
        assert_eq!(read("50000").unwrap().state.policy.step_timeout_ms, MAX_STEP_TIMEOUT_MS);
        for bad in ["50001", "86400000", "999"] {
            let err = read(bad).unwrap_err();
            assert_eq!(
                err.problems,
                [format!("STEP_TIMEOUT_MS={bad:?} is not a whole number from 1000 to 50000")]
            );
        }
        // The template's StepTimeoutMs parameter carries the same bounds.
        let template = include_str!("../../../template.yaml");
        let param =
            template.split("  StepTimeoutMs:").nth(1).unwrap().split("\n  ").take(5).collect::<String>();
        assert!(param.contains(&format!("MinValue: {MIN_STEP_TIMEOUT_MS}")), "{param}");
        assert!(param.contains(&format!("MaxValue: {MAX_STEP_TIMEOUT_MS}")), "{param}");
    }

    fn submission(extra: &[(&str, &str)]) -> Result<SubmissionConfig, ConfigError> {
        let mut vars = vec![
            ("STATE_TABLE", "sas-state"),
            ("ORDERS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders"),
            ("ORDERS_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders-dlq"),
            ("SCHEDULER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-scheduler"),
            ("SCHEDULER_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-scheduler-dlq"),
            ("AGENT_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-agent"),
            ("AGENT_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-agent-dlq"),
            ("CALLBACK_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-callbacks"),
            ("CALLBACK_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-callbacks-dlq"),
            ("STATUS_QUEUE_ARN", STATUS_ARN),
        ];
        vars.extend_from_slice(extra);
        SubmissionConfig::from_lookup(&lookup(&vars))
    }

    #[test]
    fn reply_to_rules_come_from_the_status_queue_the_extras_and_the_own_queues() {
        let c = submission(&[
            ("AWS_REGION", "us-east-1"),
            ("REPLY_TO_EXTRA_QUEUE_ARNS", "arn:aws:sqs:eu-west-1:210987654321:app-status, ,"),
        ])
        .unwrap();
        let r = &c.state.reply_to;
        assert!(r.check("https://sqs.us-east-1.amazonaws.com/123456789012/sas-status").is_ok());
        assert!(r.check("https://sqs.eu-west-1.amazonaws.com/210987654321/app-status").is_ok());
        for own in [
            "sas-orders",
            "sas-orders-dlq",
            "sas-scheduler",
            "sas-scheduler-dlq",
            "sas-agent",
            "sas-agent-dlq",
            "sas-callbacks",
            "sas-callbacks-dlq",
        ] {
            let url = format!("https://sqs.us-east-1.amazonaws.com/123456789012/{own}");
            assert_eq!(r.check(&url), Err(crate::domain::ReplyToError::OwnQueue), "{own}");
        }
        assert_eq!(
            r.check("https://sqs.us-east-1.amazonaws.com/123456789012/other"),
            Err(crate::domain::ReplyToError::NotAllowed)
        );
        // A local endpoint's form, in the configured region.
        let c = submission(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")]).unwrap();
        assert!(c.state.reply_to.check("http://127.0.0.1:5000/123456789012/sas-status").is_ok());
    }

    fn scheduler(extra: &[(&str, &str)]) -> Result<SchedulerConfig, ConfigError> {
        let sqs = "https://sqs.us-east-1.amazonaws.com/123456789012";
        let urls: Vec<(&str, String)> = [
            ("SCHEDULER_QUEUE_URL", "sas-scheduler"),
            ("SCHEDULER_DLQ_URL", "sas-scheduler-dlq"),
            ("AGENT_QUEUE_URL", "sas-agent"),
            ("CALLBACK_QUEUE_URL", "sas-callbacks"),
            ("CALLBACK_DLQ_URL", "sas-callbacks-dlq"),
        ]
        .into_iter()
        .map(|(name, queue)| (name, format!("{sqs}/{queue}")))
        .collect();
        let mut vars: Vec<(&str, &str)> = vec![
            ("STATE_TABLE", "sas-state"),
            ("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:sas-alerts"),
            ("STATUS_QUEUE_ARN", STATUS_ARN),
        ];
        vars.extend(urls.iter().map(|(name, url)| (*name, url.as_str())));
        // Later entries win: `extra` overrides the defaults above.
        vars.extend_from_slice(extra);
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        SchedulerConfig::from_lookup(&move |k| map.get(k).cloned())
    }

    /// The scheduler reads the callback queue and its DLQ once, and stops on one it
    /// could not tell apart from its own queue; every function keeps reply_to off both.
    #[test]
    fn the_scheduler_knows_the_callback_queue_and_reply_to_may_not_name_it() {
        let c = scheduler(&[]).unwrap();
        let sqs = "https://sqs.us-east-1.amazonaws.com/123456789012";
        assert_eq!(c.callback_queue, QueueUrl(format!("{sqs}/sas-callbacks")));
        assert_eq!(c.callback_dlq, QueueUrl(format!("{sqs}/sas-callbacks-dlq")));
        for own in ["sas-callbacks", "sas-callbacks-dlq"] {
            let url = format!("{sqs}/{own}");
            assert_eq!(c.state.reply_to.check(&url), Err(crate::domain::ReplyToError::OwnQueue), "{own}");
        }
        let s = submission(&[]).unwrap();
        let url = format!("{sqs}/sas-callbacks-dlq");
        assert_eq!(s.state.reply_to.check(&url), Err(crate::domain::ReplyToError::OwnQueue));

        // The scheduler queue again (in another form of its URL): records could not be told apart.
        let err = scheduler(&[("CALLBACK_QUEUE_URL", "http://127.0.0.1:5000/123456789012/sas-scheduler")])
            .unwrap_err();
        assert_eq!(
            err.problems,
            [
                "CALLBACK_QUEUE_URL=\"http://127.0.0.1:5000/123456789012/sas-scheduler\" is not a queue of its own: it names the scheduler queue (SCHEDULER_QUEUE_URL), whose messages would all be read as completions"
            ]
        );
        // Malformed: named once, with what was expected.
        let err = scheduler(&[("CALLBACK_QUEUE_URL", "sas-callbacks")]).unwrap_err();
        assert_eq!(err.problems, ["CALLBACK_QUEUE_URL=\"sas-callbacks\" is not an http(s) URL"]);
        let err = scheduler(&[("CALLBACK_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/sas-callbacks")])
            .unwrap_err();
        assert_eq!(
            err.problems,
            [
                "CALLBACK_QUEUE_URL=\"https://sqs.us-east-1.amazonaws.com/sas-callbacks\" is not a queue URL ending in /<account>/<queue name>"
            ]
        );
        // One the records' source cannot be matched against (a trailing slash): refused,
        // or every completion would reach the scheduler's own handler.
        let slash = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-callbacks/";
        let err = scheduler(&[("CALLBACK_QUEUE_URL", slash)]).unwrap_err();
        assert!(err.problems.iter().all(|p| p.starts_with("CALLBACK_QUEUE_URL=")), "{:?}", err.problems);
        let err = scheduler(&[("CALLBACK_DLQ_URL", "")]).unwrap_err();
        assert_eq!(err.problems, ["CALLBACK_DLQ_URL is not set"]);
    }

    #[test]
    fn a_queue_agent_on_a_stack_queue_or_a_status_queue_stops_the_cold_start() {
        let dir = std::env::temp_dir().join(format!("sas-queue-agents-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sqs = "https://sqs.us-east-1.amazonaws.com";
        let file = |queue: &str| {
            let path = dir.join(format!("{}.json", queue.replace(['/', ':', '.'], "_")));
            let text = format!(
                r#"{{"agents": {{"w": {{"kind": "queue", "queue_url": "{queue}"}}}}, "workflows": [{{"name": "buy", "steps": [{{"name": "charge", "agent": "w"}}]}}]}}"#
            );
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let extra = "arn:aws:sqs:eu-west-1:210987654321:app-status";
        let with = |queue: &str| {
            let path = file(queue);
            submission(&[("WORKFLOWS_FILE", path.as_str()), ("REPLY_TO_EXTRA_QUEUE_ARNS", extra)])
        };
        assert!(with(&format!("{sqs}/123456789012/fulfilment-worker")).is_ok());
        for own in ["sas-orders", "sas-scheduler", "sas-agent", "sas-agent-dlq", "sas-callbacks"] {
            let err = with(&format!("{sqs}/123456789012/{own}")).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{own}: {err}");
            assert!(err.problems[0].contains("it is one of this deployment's own queues"), "{err}");
        }
        for status in [
            format!("{sqs}/123456789012/sas-status"),
            "https://sqs.eu-west-1.amazonaws.com/210987654321/app-status".to_owned(),
        ] {
            let err = with(&status).unwrap_err();
            assert!(err.problems[0].starts_with("WORKFLOWS_FILE: agent w's queue_url="), "{err}");
            assert!(err.problems[0].contains("orders may ask for status there"), "{err}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_reply_to_rules_alone_are_the_functions_rules() {
        let vars = [
            ("ORDERS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders"),
            ("ORDERS_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders-dlq"),
            ("SCHEDULER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-scheduler"),
            ("AGENT_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/sas-agent-dlq"),
            ("STATUS_QUEUE_ARN", STATUS_ARN),
            ("REPLY_TO_EXTRA_QUEUE_ARNS", "arn:aws:sqs:eu-west-1:210987654321:app-status"),
            ("AWS_REGION", "us-east-1"),
        ];
        let rules = reply_to_rules(&lookup(&vars)).unwrap();
        let mut all = vec![("STATE_TABLE", "sas-state")];
        all.extend_from_slice(&vars);
        assert_eq!(rules, SubmissionConfig::from_lookup(&lookup(&all)).unwrap().state.reply_to);
        let err = reply_to_rules(&lookup(&[])).unwrap_err();
        assert_eq!(err.problems, ["STATUS_QUEUE_ARN is not set"]);
    }

    #[test]
    fn a_bad_allow_list_stops_the_cold_start() {
        let err = submission(&[(
            "REPLY_TO_EXTRA_QUEUE_ARNS",
            "arn:aws:sqs:us-east-1:123456789012:*,arn:aws:sqs:us-east-1:123456789012:sas-scheduler",
        )])
        .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(
            err.problems[0].contains("\"arn:aws:sqs:us-east-1:123456789012:*\" is not an SQS queue ARN"),
            "{err}"
        );
        assert!(err.problems[1].contains("own queue sqs:us-east-1:123456789012:sas-scheduler"), "{err}");
        let err = submission(&[("STATUS_QUEUE_ARN", "https://sqs.us-east-1.amazonaws.com/123456789012/s")])
            .unwrap_err();
        assert!(err.problems[0].contains("is not an SQS queue ARN"), "{err}");
    }

    /// What each function's configuration reads, with nothing set (so every fallback is
    /// read too), is exactly what the list says it reads.
    #[test]
    fn each_function_reads_what_the_list_says() {
        fn asked(read: impl FnOnce(&dyn Fn(&str) -> Option<String>)) -> std::collections::BTreeSet<String> {
            let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
            read(&|name: &str| {
                asked.borrow_mut().insert(name.to_owned());
                None
            });
            asked.into_inner()
        }
        for function in FunctionName::ALL {
            let got = asked(|lookup| match function {
                FunctionName::Submission => drop(SubmissionConfig::from_lookup(lookup)),
                FunctionName::Scheduler => drop(SchedulerConfig::from_lookup(lookup)),
                FunctionName::Agent => drop(AgentConfig::from_lookup(lookup)),
                FunctionName::Supervisor => drop(SupervisorConfig::from_lookup(lookup)),
            });
            let listed: std::collections::BTreeSet<String> =
                variables::read_by(function).map(|v| v.name.to_owned()).collect();
            assert_eq!(got, listed, "{}", function.as_str());
        }
    }

    /// Required in the list exactly when the function refuses to start without it.
    #[test]
    fn the_list_says_which_variables_are_required() {
        for function in FunctionName::ALL {
            let err = match function {
                FunctionName::Submission => SubmissionConfig::from_lookup(&|_| None).unwrap_err(),
                FunctionName::Scheduler => SchedulerConfig::from_lookup(&|_| None).unwrap_err(),
                FunctionName::Agent => AgentConfig::from_lookup(&|_| None).unwrap_err(),
                FunctionName::Supervisor => SupervisorConfig::from_lookup(&|_| None).unwrap_err(),
            };
            let missing: std::collections::BTreeSet<&str> =
                err.problems.iter().filter_map(|p| p.strip_suffix(" is not set")).collect();
            let required: std::collections::BTreeSet<&str> = variables::read_by(function)
                .filter(|v| v.need(function) == Some(Need::Required))
                .map(|v| v.name)
                .collect();
            assert_eq!(missing, required, "{}", function.as_str());
        }
    }

    /// Problems come in the list's order, whatever order a function reads its variables in.
    #[test]
    fn problems_come_in_the_lists_order() {
        let vars = [("RETRY_CAP_MS", "1"), ("RETRY_BASE_MS", "2"), ("SCHEDULER_QUEUE_URL", "x")];
        let err = SchedulerConfig::from_lookup(&lookup(&vars)).unwrap_err();
        assert_eq!(
            err.problems,
            [
                "STATE_TABLE is not set",
                "SCHEDULER_QUEUE_URL=\"x\" is not an http(s) URL",
                "SCHEDULER_DLQ_URL is not set",
                "AGENT_QUEUE_URL is not set",
                "CALLBACK_QUEUE_URL is not set",
                "CALLBACK_DLQ_URL is not set",
                "ALERT_TOPIC_ARN is not set",
                "STATUS_QUEUE_ARN is not set",
                "RETRY_CAP_MS (1) is below RETRY_BASE_MS (2)",
            ]
        );
        let err = SupervisorConfig::from_lookup(&lookup(&[])).unwrap_err();
        assert_eq!(
            err.problems,
            [
                "STATE_TABLE is not set",
                "SCHEDULER_QUEUE_URL is not set",
                "ALERT_TOPIC_ARN is not set",
                "STATUS_QUEUE_ARN is not set"
            ]
        );
    }

    #[test]
    fn no_agent_calls_the_lambda_runtime_api() {
        let dir = std::env::temp_dir().join(format!("sas-config-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("w.json");
        std::fs::write(&file, r#"{"agents": {"pay": {"url": "http://127.0.0.1:9001/x"}}, "workflows": [{"name": "buy", "steps": [{"name": "charge", "agent": "pay"}]}]}"#).unwrap();
        let read = |remote: &str, api: Option<&str>, workflows: bool| {
            let mut vars = vec![
                ("AGENT_QUEUE_URL", Q),
                ("AGENT_DLQ_URL", Q),
                ("SCHEDULER_QUEUE_URL", Q),
                ("REMOTE_SERVICE_URL", remote),
            ];
            let path = file.to_str().unwrap().to_owned();
            if workflows {
                vars.push(("WORKFLOWS_FILE", path.as_str()));
            }
            if let Some(api) = api {
                vars.push(("AWS_LAMBDA_RUNTIME_API", api));
            }
            AgentConfig::from_lookup(&lookup(&vars)).map(|_| ())
        };
        // Lambda's form of the variable, and cargo-lambda's.
        let err = read("http://127.0.0.1:9001/", Some("127.0.0.1:9001"), false).unwrap_err();
        assert_eq!(
            err.problems,
            [
                "REMOTE_SERVICE_URL=\"http://127.0.0.1:9001/\" is not allowed: it is the Lambda Runtime API (AWS_LAMBDA_RUNTIME_API)"
            ]
        );
        assert!(read("http://127.0.0.1:9555", Some("http://127.0.0.1:9555/.rt/agent"), false).is_err());
        assert!(read("http://localhost:9001/x", Some("127.0.0.1:9001"), false).is_err());
        assert!(read("http://[::1]:9001/x", Some("127.0.0.1:9001"), false).is_err());
        let err = read("http://127.0.0.1:3000", Some("127.0.0.1:9001"), true).unwrap_err();
        assert!(err.problems[0].starts_with("WORKFLOWS_FILE: agent pay's url="), "{err:?}");
        // Another loopback port, or no Runtime API at all (a local run): allowed.
        assert_eq!(read("http://127.0.0.1:3000", Some("127.0.0.1:9001"), false), Ok(()));
        assert_eq!(read("http://127.0.0.1:9001", None, true), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
