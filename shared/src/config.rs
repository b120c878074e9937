//! Each function's configuration, read once at cold start from environment variables.
//!
//! A bad configuration fails the cold start with one message naming every missing or
//! invalid variable, so a broken deployment is fixed in one round rather than one
//! variable at a time. The names are a contract with `template.yaml`.
//!
//! | variable | read by | default |
//! |---|---|---|
//! | `STATE_TABLE` | submission, scheduler, supervisor | required |
//! | `DUE_INDEX` | submission, scheduler, supervisor | `due-index` |
//! | `DUE_SHARDS` | submission, scheduler, supervisor (all must agree: writers place tasks in shards, the supervisor queries them) | 4 |
//! | `RETENTION_DAYS` | submission, scheduler, supervisor: days a finished task's record is kept (its `expires_at` TTL); 0 keeps it forever | 30 |
//! | `STACK_NAME` | scheduler, supervisor: named in every alert's `show` command (`sasctl tasks show ID --stack NAME`); unset, the command names `--prefix` when `STATE_TABLE` is `{prefix}-state` | none |
//! | `ORDERS_QUEUE_URL`, `ORDERS_DLQ_URL` | submission | required |
//! | `SCHEDULER_QUEUE_URL` | all four | required |
//! | `SCHEDULER_DLQ_URL` | scheduler | required |
//! | `AGENT_QUEUE_URL` | scheduler, agent (required); submission, supervisor (optional, unused) | |
//! | `AGENT_DLQ_URL`, `REMOTE_SERVICE_URL` | agent | required |
//! | `ALERT_TOPIC_ARN` | scheduler, supervisor | required |
//! | `STEP_TIMEOUT_MS`, `REPLY_GRACE_MS`, `PENDING_TIMEOUT_MS`, `FAILURE_THRESHOLD`, `RETRY_BASE_MS`, `RETRY_CAP_MS` | submission, scheduler, supervisor | 30000, 10000, 60000, 5, 1000, 60000 |
//! | `METRICS_NAMESPACE` | all four | `sas` |
//! | `SEND_MAX_HOLD_MS` | all four: how long an invocation's send may wait to be batched with its other handlers' (`handlers::coalesce`) | 300; the agent 20 |
//! | `STATUS_QUEUE_ARN` | submission, scheduler, supervisor: the status queue, always on the `reply_to` allow-list | required |
//! | `REPLY_TO_EXTRA_QUEUE_ARNS` | submission, scheduler, supervisor: more queue ARNs `reply_to` may name (comma-separated, no wildcards) | none |
//! | `WORKFLOWS_FILE` | all four: the definition file of the agents and workflows (a path in the function's package or a layer), read and checked once at cold start | the built-in `examples/workflows.json` |
//! | `AWS_REGION` (or `AWS_DEFAULT_REGION`), `AWS_ENDPOINT_URL_SQS` (or `AWS_ENDPOINT_URL`) | submission, scheduler, supervisor: the region of a `reply_to` in the endpoint's form (local runs), and that form | the status queue's region; AWS's forms only |
//! | `AWS_ENDPOINT_URL_SSM`, `AWS_ENDPOINT_URL_SECRETS_MANAGER` (or `AWS_ENDPOINT_URL`) | agent, on an agent's first call with `auth`: where its value is read (`adapters::aws::secrets`) | the region's endpoint |

use std::str::FromStr;

use crate::domain::retry::Backoff;
use crate::domain::{Definitions, Invalid, Policy, QueueId, ReplyToRules};
use crate::handlers::{Settings, Topology};
use crate::ports::QueueUrl;

pub const DEFAULT_DUE_INDEX: &str = "due-index";
pub const DEFAULT_ERROR_INDEX: &str = "error-index";
/// How long a finished task's record is kept before DynamoDB's TTL deletes it.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
/// A century: beyond it "keep forever" (0) says what is meant.
pub const MAX_RETENTION_DAYS: u32 = 36_500;
pub const DEFAULT_DUE_SHARDS: u32 = 4;
pub const MAX_DUE_SHARDS: u32 = 1_000;
pub const DEFAULT_METRICS_NAMESPACE: &str = "sas";
/// The submission, scheduler and supervisor: their handlers wait only on AWS calls, so a
/// round's sends are held until all of them arrive unless one call is very slow. On a
/// store that serves one request at a time the ten handlers of a batch reach their sends
/// hundreds of ms apart; 300 ms keeps them in one request (docs/BENCHMARKS.md, section 8).
pub const DEFAULT_SEND_MAX_HOLD_MS: u64 = 300;
/// The agent: a handler waiting on its remote service holds the others' replies for up to
/// this long, so it stays short (docs/BENCHMARKS.md, section 6).
pub const DEFAULT_AGENT_SEND_MAX_HOLD_MS: u64 = crate::handlers::DEFAULT_MAX_HOLD.as_millis() as u64;
/// Past a second a held send costs more in latency than batching saves.
pub const MAX_SEND_MAX_HOLD_MS: u64 = 1_000;
/// The one limit on a step's lease, the same as `StepTimeoutMs` in template.yaml: an
/// attempt must end, reply included, within the agent function's 60 s timeout.
pub use crate::domain::definitions::{MAX_STEP_TIMEOUT_MS, MIN_STEP_TIMEOUT_MS};
/// The queues of the deployment itself: `reply_to` may never name one of them.
pub const OWN_QUEUE_VARIABLES: [&str; 6] = [
    "ORDERS_QUEUE_URL",
    "ORDERS_DLQ_URL",
    "SCHEDULER_QUEUE_URL",
    "SCHEDULER_DLQ_URL",
    "AGENT_QUEUE_URL",
    "AGENT_DLQ_URL",
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

/// Where the store's data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableNames {
    /// One item per order: the order and its task.
    pub state: String,
    pub due_index: String,
    /// Partitions of the due index. Tasks are spread over them by a hash of the order
    /// id so no single index partition takes every write. Raising it is safe (old
    /// entries keep their lower shard numbers, which are still queried); lowering it
    /// hides the tasks in the dropped shards until they are rewritten.
    pub due_shards: u32,
    /// The sparse index of the tasks in Error, newest first (`TaskListing::list`).
    pub error_index: String,
    /// Days a finished (terminal) task's record is kept after its last write before
    /// DynamoDB's TTL deletes it; 0 keeps records forever.
    pub retention_days: u32,
}

impl TableNames {
    pub fn new(state: impl Into<String>) -> TableNames {
        TableNames {
            state: state.into(),
            due_index: DEFAULT_DUE_INDEX.to_owned(),
            due_shards: DEFAULT_DUE_SHARDS,
            error_index: DEFAULT_ERROR_INDEX.to_owned(),
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }

    /// The same tables with another retention (0 = keep forever).
    pub fn with_retention_days(mut self, days: u32) -> TableNames {
        self.retention_days = days;
        self
    }
}

/// How operators name this deployment to `sasctl`: what every alert's `show` command
/// passes beside the order id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// A CloudFormation stack (`STACK_NAME`, which template.yaml sets).
    Stack(String),
    /// Resources named `{prefix}-...` without a stack: a bootstrap or a dev run.
    Prefix(String),
    /// Neither is known: the command names the order only.
    Unnamed,
}

impl Deployment {
    /// `STACK_NAME`, else the prefix of a `{prefix}-state` table (the standard names
    /// `sasctl --prefix` looks for), else nothing.
    pub fn infer(stack_name: Option<&str>, state_table: &str) -> Deployment {
        match (stack_name, state_table.strip_suffix("-state")) {
            (Some(stack), _) if !stack.trim().is_empty() => Deployment::Stack(stack.trim().to_owned()),
            (_, Some(prefix)) if !prefix.is_empty() => Deployment::Prefix(prefix.to_owned()),
            _ => Deployment::Unnamed,
        }
    }
}

/// Reads variables through `lookup`, collecting problems instead of stopping at one.
struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<String>,
}

impl Env<'_> {
    /// Unset and empty are the same: templates often render a missing value as "".
    fn optional(&mut self, name: &str) -> Option<String> {
        (self.lookup)(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
    }

    fn required(&mut self, name: &str) -> String {
        self.optional(name).unwrap_or_else(|| {
            self.problems.push(format!("{name} is not set"));
            String::new()
        })
    }

    fn check(&mut self, name: &str, value: &str, ok: bool, expected: &str) {
        if !ok {
            self.problems.push(format!("{name}={value:?} is not {expected}"));
        }
    }

    fn table(&mut self, name: &str) -> String {
        let value = self.required(name);
        if !value.is_empty() {
            let ok = (3..=255).contains(&value.len())
                && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            self.check(
                name,
                &value,
                ok,
                "a DynamoDB table or index name ([A-Za-z0-9_.-], 3 to 255 characters)",
            );
        }
        value
    }

    fn url(&mut self, name: &str, value: String) -> String {
        let ok = value.starts_with("https://") || value.starts_with("http://");
        self.check(name, &value, ok, "an http(s) URL");
        value
    }

    /// The remote service gets the order: https only, so it cannot be read or altered on
    /// the way, except to a loopback host (local runs, `sasctl dev`'s simulated service).
    fn remote_url(&mut self, name: &str, value: String) -> String {
        let ok = crate::domain::definitions::remote_url_allowed(&value);
        self.check(name, &value, ok, "an https URL (plain http is accepted only to a loopback host)");
        value
    }

    fn queue(&mut self, name: &str) -> QueueUrl {
        let value = self.required(name);
        QueueUrl(if value.is_empty() { value } else { self.url(name, value) })
    }

    fn optional_queue(&mut self, name: &str) -> Option<QueueUrl> {
        self.optional(name).map(|v| QueueUrl(self.url(name, v)))
    }

    fn arn(&mut self, name: &str) -> String {
        let value = self.required(name);
        if !value.is_empty() {
            self.check(name, &value, value.starts_with("arn:"), "an ARN");
        }
        value
    }

    fn number<T>(&mut self, name: &str, default: T, range: std::ops::RangeInclusive<T>) -> T
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let Some(raw) = self.optional(name) else {
            return default;
        };
        match raw.parse::<T>() {
            Ok(v) if range.contains(&v) => v,
            _ => {
                self.problems.push(format!(
                    "{name}={raw:?} is not a whole number from {} to {}",
                    range.start(),
                    range.end()
                ));
                default
            }
        }
    }

    /// The definition file named by `WORKFLOWS_FILE`, or the built-in one. Every
    /// problem of the file is reported, as one line naming the variable.
    fn definitions(&mut self) -> Definitions {
        let Some(path) = self.optional("WORKFLOWS_FILE") else {
            return Definitions::example();
        };
        let parsed =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot be read: {e}")).and_then(|text| {
                Definitions::parse(&text).map_err(|Invalid(problems)| {
                    let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
                    format!("is not valid: {}", all.join("; "))
                })
            });
        match parsed {
            Ok(definitions) => definitions,
            Err(why) => {
                self.problems.push(format!("WORKFLOWS_FILE={path:?} {why}"));
                Definitions::example()
            }
        }
    }

    fn tables(&mut self) -> TableNames {
        let state = self.table("STATE_TABLE");
        let due_index = match self.optional("DUE_INDEX") {
            Some(_) => self.table("DUE_INDEX"),
            None => DEFAULT_DUE_INDEX.to_owned(),
        };
        let due_shards = self.number("DUE_SHARDS", DEFAULT_DUE_SHARDS, 1..=MAX_DUE_SHARDS);
        // No function queries the error index (operators' `sasctl` does): only writers
        // need its key attribute, which `task_item` adds whatever the index is called.
        let error_index = DEFAULT_ERROR_INDEX.to_owned();
        let retention_days = self.number("RETENTION_DAYS", DEFAULT_RETENTION_DAYS, 0..=MAX_RETENTION_DAYS);
        TableNames { state, due_index, due_shards, error_index, retention_days }
    }

    fn policy(&mut self) -> Policy {
        let d = Policy::default();
        let day = 24 * 3600 * 1000;
        let policy = Policy {
            step_timeout_ms: self.number(
                "STEP_TIMEOUT_MS",
                d.step_timeout_ms,
                MIN_STEP_TIMEOUT_MS..=MAX_STEP_TIMEOUT_MS,
            ),
            reply_grace_ms: self.number("REPLY_GRACE_MS", d.reply_grace_ms, 0..=day),
            pending_timeout_ms: self.number("PENDING_TIMEOUT_MS", d.pending_timeout_ms, 1..=day),
            failure_threshold: self.number("FAILURE_THRESHOLD", d.failure_threshold, 1..=1_000),
            retry_backoff: Backoff {
                base_ms: self.number("RETRY_BASE_MS", d.retry_backoff.base_ms, 0..=day),
                cap_ms: self.number("RETRY_CAP_MS", d.retry_backoff.cap_ms, 0..=day),
            },
        };
        if policy.retry_backoff.cap_ms < policy.retry_backoff.base_ms {
            self.problems.push(format!(
                "RETRY_CAP_MS ({}) is below RETRY_BASE_MS ({})",
                policy.retry_backoff.cap_ms, policy.retry_backoff.base_ms
            ));
        }
        policy
    }

    /// The `reply_to` rules: SQS URLs only, the status queue plus the extra ARNs, never
    /// one of the six queues of the deployment (`domain::reply_to`).
    fn reply_to(&mut self) -> ReplyToRules {
        let status_arn = self.required("STATUS_QUEUE_ARN");
        let status = (!status_arn.is_empty()).then(|| QueueId::from_arn(&status_arn)).flatten();
        if !status_arn.is_empty() && status.is_none() {
            self.check("STATUS_QUEUE_ARN", &status_arn, false, "an SQS queue ARN");
        }
        let mut extras = Vec::new();
        for arn in self.optional("REPLY_TO_EXTRA_QUEUE_ARNS").unwrap_or_default().split(',') {
            let arn = arn.trim();
            if arn.is_empty() {
                continue;
            }
            match QueueId::from_arn(arn) {
                Some(id) => extras.push(id),
                None => self.problems.push(format!(
                    "REPLY_TO_EXTRA_QUEUE_ARNS: {arn:?} is not an SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>, no wildcards)"
                )),
            }
        }
        let region = self
            .optional("AWS_REGION")
            .or_else(|| self.optional("AWS_DEFAULT_REGION"))
            .or_else(|| status.as_ref().map(|s| s.region.clone()))
            .unwrap_or_default();
        let endpoint =
            match self.optional("AWS_ENDPOINT_URL_SQS").or_else(|| self.optional("AWS_ENDPOINT_URL")) {
                Some(raw) => match url::Url::parse(&raw) {
                    Ok(url) if url.has_host() => Some(url),
                    _ => {
                        self.check("AWS_ENDPOINT_URL", &raw, false, "a URL");
                        None
                    }
                },
                None => None,
            };
        let mut rules = ReplyToRules::sqs(region, endpoint);
        for name in OWN_QUEUE_VARIABLES {
            let Some(url) = self.optional(name) else { continue };
            match QueueId::account_and_name(&url) {
                Some((account, queue)) => rules = rules.own_queue(account, queue),
                // A value that is not a URL at all is reported by the function's own read.
                None if url.starts_with("http") => {
                    self.check(name, &url, false, "a queue URL ending in /<account>/<queue name>")
                }
                None => {}
            }
        }
        for queue in status.into_iter().chain(extras) {
            if rules.is_own(&queue) {
                self.problems.push(format!(
                    "reply_to allow-list names this deployment's own queue {queue}: status would land among its messages"
                ));
            }
            rules = rules.allow(queue);
        }
        rules
    }

    fn deployment(&mut self, tables: &TableNames) -> Deployment {
        Deployment::infer(self.optional("STACK_NAME").as_deref(), &tables.state)
    }

    fn namespace(&mut self) -> String {
        self.optional("METRICS_NAMESPACE").unwrap_or_else(|| DEFAULT_METRICS_NAMESPACE.to_owned())
    }

    fn send_max_hold(&mut self, default: u64) -> u64 {
        self.number("SEND_MAX_HOLD_MS", default, 0..=MAX_SEND_MAX_HOLD_MS)
    }

    fn finish<T>(self, config: T) -> Result<T, ConfigError> {
        if self.problems.is_empty() { Ok(config) } else { Err(ConfigError { problems: self.problems }) }
    }
}

fn read<T>(
    lookup: &dyn Fn(&str) -> Option<String>,
    build: impl FnOnce(&mut Env<'_>) -> T,
) -> Result<T, ConfigError> {
    let mut env = Env { lookup, problems: Vec::new() };
    let config = build(&mut env);
    env.finish(config)
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn settings(
    policy: Policy,
    definitions: &Definitions,
    reply_to: &ReplyToRules,
    scheduler_queue: &QueueUrl,
    agent_queue: Option<&QueueUrl>,
) -> Settings {
    // A queue agent's queue is the deployment's too: status must never land among its
    // requests.
    let mut reply_to = reply_to.clone();
    for queue in definitions.agents.values().filter_map(|a| a.queue()) {
        if let Some((account, name)) = QueueId::account_and_name(queue) {
            reply_to = reply_to.own_queue(account, name);
        }
    }
    Settings {
        policy,
        workflows: definitions.workflows.clone(),
        reply_to,
        topology: Topology::new(
            scheduler_queue.clone(),
            agent_queue.cloned().unwrap_or_else(|| QueueUrl(UNUSED_AGENT_QUEUE.to_owned())),
        )
        .with_queue_agents(&definitions.agents),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmissionConfig {
    pub tables: TableNames,
    /// The agents and workflows (`WORKFLOWS_FILE`).
    pub definitions: Definitions,
    /// Where orders may ask for status.
    pub reply_to: ReplyToRules,
    pub orders_queue: QueueUrl,
    pub orders_dlq: QueueUrl,
    pub scheduler_queue: QueueUrl,
    pub agent_queue: Option<QueueUrl>,
    pub policy: Policy,
    pub metrics_namespace: String,
    /// The longest a send waits to go out in one request with the invocation's others.
    pub send_max_hold_ms: u64,
}

impl SubmissionConfig {
    pub fn from_env() -> Result<SubmissionConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SubmissionConfig, ConfigError> {
        read(lookup, |env| SubmissionConfig {
            tables: env.tables(),
            definitions: env.definitions(),
            orders_queue: env.queue("ORDERS_QUEUE_URL"),
            orders_dlq: env.queue("ORDERS_DLQ_URL"),
            scheduler_queue: env.queue("SCHEDULER_QUEUE_URL"),
            agent_queue: env.optional_queue("AGENT_QUEUE_URL"),
            policy: env.policy(),
            metrics_namespace: env.namespace(),
            send_max_hold_ms: env.send_max_hold(DEFAULT_SEND_MAX_HOLD_MS),
            reply_to: env.reply_to(),
        })
    }
    pub fn settings(&self) -> Settings {
        settings(
            self.policy,
            &self.definitions,
            &self.reply_to,
            &self.scheduler_queue,
            self.agent_queue.as_ref(),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub tables: TableNames,
    /// The agents and workflows (`WORKFLOWS_FILE`).
    pub definitions: Definitions,
    /// Where orders may ask for status.
    pub reply_to: ReplyToRules,
    pub scheduler_queue: QueueUrl,
    pub scheduler_dlq: QueueUrl,
    pub agent_queue: QueueUrl,
    pub alert_topic_arn: String,
    /// Named in every alert's `show` command.
    pub deployment: Deployment,
    pub policy: Policy,
    pub metrics_namespace: String,
    /// The longest a send waits to go out in one request with the invocation's others.
    pub send_max_hold_ms: u64,
}

impl SchedulerConfig {
    pub fn from_env() -> Result<SchedulerConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SchedulerConfig, ConfigError> {
        read(lookup, |env| {
            let tables = env.tables();
            SchedulerConfig {
                deployment: env.deployment(&tables),
                tables,
                definitions: env.definitions(),
                scheduler_queue: env.queue("SCHEDULER_QUEUE_URL"),
                scheduler_dlq: env.queue("SCHEDULER_DLQ_URL"),
                agent_queue: env.queue("AGENT_QUEUE_URL"),
                alert_topic_arn: env.arn("ALERT_TOPIC_ARN"),
                policy: env.policy(),
                metrics_namespace: env.namespace(),
                send_max_hold_ms: env.send_max_hold(DEFAULT_SEND_MAX_HOLD_MS),
                reply_to: env.reply_to(),
            }
        })
    }
    pub fn settings(&self) -> Settings {
        settings(
            self.policy,
            &self.definitions,
            &self.reply_to,
            &self.scheduler_queue,
            Some(&self.agent_queue),
        )
    }
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
}

impl AgentConfig {
    pub fn from_env() -> Result<AgentConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<AgentConfig, ConfigError> {
        read(lookup, |env| {
            let remote = env.required("REMOTE_SERVICE_URL");
            AgentConfig {
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
            }
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    pub tables: TableNames,
    /// The agents and workflows (`WORKFLOWS_FILE`).
    pub definitions: Definitions,
    /// Where orders may ask for status.
    pub reply_to: ReplyToRules,
    pub scheduler_queue: QueueUrl,
    pub agent_queue: Option<QueueUrl>,
    pub alert_topic_arn: String,
    /// Named in every alert's `show` command.
    pub deployment: Deployment,
    pub policy: Policy,
    pub metrics_namespace: String,
    /// The longest a send waits to go out in one request with the invocation's others.
    pub send_max_hold_ms: u64,
}

impl SupervisorConfig {
    pub fn from_env() -> Result<SupervisorConfig, ConfigError> {
        Self::from_lookup(&process_env)
    }
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<SupervisorConfig, ConfigError> {
        read(lookup, |env| {
            let tables = env.tables();
            SupervisorConfig {
                deployment: env.deployment(&tables),
                tables,
                definitions: env.definitions(),
                scheduler_queue: env.queue("SCHEDULER_QUEUE_URL"),
                agent_queue: env.optional_queue("AGENT_QUEUE_URL"),
                alert_topic_arn: env.arn("ALERT_TOPIC_ARN"),
                policy: env.policy(),
                metrics_namespace: env.namespace(),
                send_max_hold_ms: env.send_max_hold(DEFAULT_SEND_MAX_HOLD_MS),
                reply_to: env.reply_to(),
            }
        })
    }
    pub fn settings(&self) -> Settings {
        settings(
            self.policy,
            &self.definitions,
            &self.reply_to,
            &self.scheduler_queue,
            self.agent_queue.as_ref(),
        )
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
        ] {
            assert!(text.contains(want), "missing {want:?} in {text}");
        }
        assert_eq!(err.problems.len(), 9, "{text}");
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
        assert_eq!(c.tables.due_index, "due-index");
        assert_eq!(c.tables.due_shards, 4);
        assert_eq!(c.tables.error_index, "error-index");
        assert_eq!(c.tables.retention_days, 30);
        assert_eq!(c.deployment, Deployment::Prefix("sas".into()));
        assert_eq!(c.policy.step_timeout_ms, 5_000);
        assert_eq!(c.policy.failure_threshold, 5);
        assert_eq!(c.metrics_namespace, "sas");
        assert_eq!(c.agent_queue, None);
        assert_eq!(c.send_max_hold_ms, DEFAULT_SEND_MAX_HOLD_MS);
        let s = c.settings();
        assert_eq!(s.topology.scheduler_queue.0, Q);
        assert_eq!(s.topology.agent_queue.0, UNUSED_AGENT_QUEUE);
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
        assert_eq!(supervisor(&[("RETENTION_DAYS", "0")]).unwrap().tables.retention_days, 0);
        assert_eq!(supervisor(&[("RETENTION_DAYS", " 365 ")]).unwrap().tables.retention_days, 365);
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
        assert_eq!(c.deployment, Deployment::Stack("shop-prod".into()));
        assert_eq!(supervisor(&[]).unwrap().deployment, Deployment::Prefix("sas".into()));
        let c = supervisor(&[("STATE_TABLE", "orders-table")]).unwrap();
        assert_eq!(c.deployment, Deployment::Unnamed);
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
        assert!(DEFAULT_AGENT_SEND_MAX_HOLD_MS < DEFAULT_SEND_MAX_HOLD_MS);
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
        assert_eq!(read("50000").unwrap().policy.step_timeout_ms, MAX_STEP_TIMEOUT_MS);
        for bad in ["50001", "86400000", "999"] {
            let err = read(bad).unwrap_err();
            assert_eq!(
                err.problems,
                [format!("STEP_TIMEOUT_MS={bad:?} is not a whole number from 1000 to 50000")]
            );
        }
        // The template's StepTimeoutMs parameter carries the same bounds.
        let template = include_str!("../../template.yaml");
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
        let r = &c.reply_to;
        assert!(r.check("https://sqs.us-east-1.amazonaws.com/123456789012/sas-status").is_ok());
        assert!(r.check("https://sqs.eu-west-1.amazonaws.com/210987654321/app-status").is_ok());
        for own in [
            "sas-orders",
            "sas-orders-dlq",
            "sas-scheduler",
            "sas-scheduler-dlq",
            "sas-agent",
            "sas-agent-dlq",
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
        assert!(c.reply_to.check("http://127.0.0.1:5000/123456789012/sas-status").is_ok());
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
}
