//! `sasctl up --endpoint-url URL`: the four functions running continuously against an
//! AWS endpoint (moto, LocalStack or AWS itself) until Ctrl-C, each wired from its own
//! configuration exactly as its Lambda binary is, with the real adapters and the real
//! HTTP remote adapter: what a deployment does, on one machine.
//!
//! The resources are created under a prefix when missing and found when not, so a
//! second `up` with the same prefix carries on where the first stopped; `up` never
//! removes them. Each queue is pumped as Lambda's event source mapping does it
//! (`pump`), the supervisor fires on a timer instead of EventBridge. The scheduler's
//! second event source, the callback queue, is pumped into the callback handler with the
//! callback DLQ, as the deployed scheduler routes that queue's records.

mod console;
mod events;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas::adapters::aws::provision::{self, Layout, Provisioned};
use sas::adapters::aws::{AwsSecrets, Clients, DynamoStore, SnsAlerts, SqsQueues};
use sas::adapters::embedded::CountingMetrics;
use sas::adapters::http_remote::HttpRemote;
use sas::adapters::system::{SystemClock, SystemRandom};
use sas::config::{AgentConfig, SchedulerConfig, Source, SubmissionConfig, SupervisorConfig};
use sas::domain::Definitions;
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchOrder, Callbacks, DeadLetters, Deps, Inbound, Scheduler,
    SendCoalescer, Settings, Submission, Supervisor,
};
use sas::ports::{QueueConsumer, QueueUrl, Queues};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use events::CancelWatch;
pub use events::{EventLog, UpCounts};

use crate::endpoint::{EndpointError, check_url, one_line, probe, sdk_config};
use crate::pump::{PumpEvents, PumpSettings, pump};
use crate::remote_sim::{CallbackFaults, KeptToken, LoopbackRemote, Outside};
use crate::tap::{TapStore, TeeAlerts};

/// The prefix when none is given: the same every time, so a restarted `up` finds the
/// resources (and the orders in them) of the last one.
pub const DEFAULT_PREFIX: &str = "sas-local";

/// How long one receive waits. Lambda's pollers wait 20 s; a stop waits for the
/// receives under way (`pump` says why), so shorter waits make Ctrl-C quick, at one
/// request per queue every 2 s when idle.
pub const RECEIVE_WAIT_MS: u64 = 2_000;

/// The deployed supervisor's schedule (template.yaml's `SupervisorSchedule` default).
pub const DEPLOYED_SCHEDULE: &str = "rate(1 minute)";

/// Stands in for `REMOTE_SERVICE_URL` when every HTTP agent names its own `url`: the
/// agent's configuration requires one, and no call ever goes to it (port 9, discard).
const UNUSED_REMOTE: &str = "http://127.0.0.1:9";

/// The remote service `up` runs on loopback for agents without a url of their own: the
/// simulation's well-behaved service (`remote_sim`), with these faults, and the outside
/// party of callback steps, which keeps each token and either completes it after up to
/// `callback_delay_ms` or leaves it to the user (`up` prints the command).
#[derive(Debug, Clone)]
pub struct Simulated {
    pub faults: crate::remote_sim::RemoteFaults,
    pub agent_faults: BTreeMap<String, crate::remote_sim::RemoteFaults>,
    pub callback_delay_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct UpOptions {
    /// Every service's endpoint, or every one but DynamoDB's when `dynamodb_endpoint` names it.
    pub endpoint: String,
    /// DynamoDB's own endpoint (DynamoDB Local beside LocalStack), if it is not `endpoint`.
    pub dynamodb_endpoint: Option<String>,
    pub prefix: String,
    /// The definition file; the built-in examples/workflows.json when `None`.
    pub workflows: Option<PathBuf>,
    /// `REMOTE_SERVICE_URL`: where agents without a `url` of their own send their calls.
    /// `None`: to the simulated service `simulated` describes, which `up` runs.
    pub remote_service_url: Option<String>,
    /// The simulated remote service (and callback steps' outside party) `up` runs when no
    /// `remote_service_url` is given; `None` with none given: every agent needs its own url.
    pub simulated: Option<Simulated>,
    pub supervisor_period: Duration,
    /// Batches in flight per function.
    pub concurrency: usize,
    /// Each queue's batching window (the template's `OrdersBatchingWindowSeconds`,
    /// `SchedulerBatchingWindowSeconds` and `AgentBatchingWindowSeconds`).
    pub windows: Windows,
    /// How long one receive waits (`RECEIVE_WAIT_MS` unless a benchmark says otherwise).
    pub receive_wait_ms: u64,
    pub json: bool,
    /// Start `sasctl console` beside the functions and print its URL (`up/console.rs`).
    pub console: bool,
}

impl UpOptions {
    /// The endpoints, as the startup line names them.
    /// The environment that makes every later `sasctl tasks`, `agents` and `dlq` command
    /// (and the aws CLI v2) find this run's resources without a flag.
    pub fn exports(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![("AWS_ENDPOINT_URL", self.endpoint.clone())];
        vars.extend(self.dynamodb_endpoint.clone().map(|d| ("AWS_ENDPOINT_URL_DYNAMODB", d)));
        // What the aws CLI needs too (v1 reads only AWS_DEFAULT_REGION): the region `up`
        // signs for, and throwaway credentials unless the environment has its own.
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let region =
            env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into());
        vars.push(("AWS_REGION", region.clone()));
        vars.push(("AWS_DEFAULT_REGION", region));
        if env("AWS_ACCESS_KEY_ID").is_none() && env("AWS_PROFILE").is_none() {
            vars.push(("AWS_ACCESS_KEY_ID", "test".into()));
            vars.push(("AWS_SECRET_ACCESS_KEY", "test".into()));
        }
        vars.push((crate::deployment::PREFIX_VAR, self.prefix.clone()));
        if let Some(file) = &self.workflows {
            let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
            vars.push((crate::tasks::WORKFLOWS_VAR, file.display().to_string()));
        }
        vars
    }

    pub fn endpoints(&self) -> String {
        match &self.dynamodb_endpoint {
            Some(dynamodb) => format!("{} (DynamoDB at {dynamodb})", self.endpoint),
            None => self.endpoint.clone(),
        }
    }
}

/// MaximumBatchingWindowInSeconds of each function's event source, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Windows {
    pub orders_ms: u64,
    pub scheduler_ms: u64,
    pub agent_ms: u64,
}

/// The deployed windows: template.yaml's `OrdersBatchingWindowSeconds`,
/// `SchedulerBatchingWindowSeconds` and `AgentBatchingWindowSeconds` defaults.
pub const DEPLOYED_WINDOWS: &str = "5/0/0";

impl Windows {
    /// `ORDERS/SCHEDULER/AGENT` in whole seconds, e.g. `5/0/0`.
    pub fn parse(arg: &str) -> Result<Windows, String> {
        let parts: Vec<&str> = arg.split('/').collect();
        let secs: Vec<u64> = parts.iter().filter_map(|p| p.trim().parse::<u64>().ok()).collect();
        match secs[..] {
            [o, s, a] if parts.len() == 3 && [o, s, a].iter().all(|w| *w <= 300) => {
                Ok(Windows { orders_ms: o * 1000, scheduler_ms: s * 1000, agent_ms: a * 1000 })
            }
            _ => Err(format!(
                "{arg:?}: give the batching windows as ORDERS/SCHEDULER/AGENT whole seconds, 0 to 300 each \
                 (e.g. {DEPLOYED_WINDOWS})"
            )),
        }
    }

    pub fn label(&self) -> String {
        format!("{}/{}/{}", self.orders_ms / 1000, self.scheduler_ms / 1000, self.agent_ms / 1000)
    }
}

/// Why `up` could not start. Each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("--prefix {0:?} must be 1 to 40 of [A-Za-z0-9_-] (it names the table, queues and topic)")]
    Prefix(String),
    #[error("{0}")]
    Definitions(String),
    #[error(
        "agents {agents} of {file} have no url of their own: give --remote-service-url URL (they then call \
         URL/<agent>/<step>), or a --workflows file whose agents each name their url"
    )]
    NoRemote { agents: String, file: String },
    #[error("cannot start the simulated remote service on loopback: {0}")]
    Service(String),
    #[error("cannot create the resources at {url}: {reason}")]
    Provision { url: String, reason: String },
    #[error("the functions' configuration is not valid: {0}")]
    Config(String),
    #[error("cannot listen for signals: {0}")]
    Signals(String),
}

fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 40
        && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Where each HTTP agent's calls go, as a line each; and the agents with no `url` of
/// their own (they go to `REMOTE_SERVICE_URL`).
fn agent_targets(definitions: &Definitions, remote: Option<&str>) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut without_url = Vec::new();
    for (name, def) in &definitions.agents {
        if let Some(queue) = def.queue() {
            lines.push(format!(
                "{name}: requests go to {queue}; a worker of yours serves them (docs/WORKERS.md)"
            ));
            continue;
        }
        match (&def.url, remote) {
            (Some(url), _) => lines.push(format!("{name}: POST {}/<step>", url.trim_end_matches('/'))),
            (None, Some(base)) => {
                lines.push(format!("{name}: POST {}/{name}/<step>", base.trim_end_matches('/')));
                without_url.push(name.clone());
            }
            (None, None) => without_url.push(name.clone()),
        }
    }
    (lines, without_url)
}

/// The four functions' configurations, read by their own code from the variables a
/// deployment would set (the resources' names and URLs) plus the tuning variables (`Source::Tuning` in the
/// functions' variable list) from ours, as the functions take them from theirs.
struct Configs {
    submission: SubmissionConfig,
    scheduler: SchedulerConfig,
    agent: AgentConfig,
    supervisor: SupervisorConfig,
}

fn configs(
    provisioned: &Provisioned,
    options: &UpOptions,
    region: &str,
    remote: &str,
) -> Result<Configs, UpError> {
    let mut vars: BTreeMap<&str, String> = provisioned.env();
    vars.insert("AWS_ENDPOINT_URL", options.endpoint.clone());
    vars.insert("AWS_REGION", region.to_owned());
    vars.insert("REMOTE_SERVICE_URL", remote.to_owned());
    if let Some(file) = &options.workflows {
        let path = file.to_str().ok_or_else(|| {
            UpError::Definitions(format!("--workflows {}: the path is not UTF-8", file.display()))
        })?;
        vars.insert("WORKFLOWS_FILE", path.to_owned());
    }
    let lookup = |name: &str| match vars.get(name) {
        Some(v) => Some(v.clone()),
        None if sas::config::variables::variable(name).is_some_and(|v| v.source == Source::Tuning) => {
            std::env::var(name).ok()
        }
        None => None,
    };
    let config = |e: sas::config::ConfigError| UpError::Config(e.problems.join("; "));
    Ok(Configs {
        submission: SubmissionConfig::from_lookup(&lookup).map_err(config)?,
        scheduler: SchedulerConfig::from_lookup(&lookup).map_err(config)?,
        agent: AgentConfig::from_lookup(&lookup).map_err(config)?,
        supervisor: SupervisorConfig::from_lookup(&lookup).map_err(config)?,
    })
}

/// A ready-to-paste `aws sqs send-message` of a valid order for `workflow`.
pub fn send_example(endpoint: &str, orders_queue: &str, workflow: &str) -> String {
    let id = format!(
        "o-{}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs())
    );
    // Written out rather than serialised, to keep the contract's field order.
    let body = format!(
        r#"{{"order_id":"{id}","customer_id":"c-1","items":[{{"sku":"A-1","quantity":1}}],"workflow":{}}}"#,
        serde_json::Value::from(workflow)
    );
    format!(
        "aws --endpoint-url {endpoint} sqs send-message --queue-url {orders_queue} --message-body '{body}'"
    )
}

/// What `up` found and made, for the startup block.
struct Startup<'a> {
    options: &'a UpOptions,
    provisioned: &'a Provisioned,
    created: usize,
    definitions: &'a Definitions,
    targets: &'a [String],
    step_timeout_ms: u64,
    /// The console's URL, or why it did not start; `None` with --no-console.
    console: Option<Result<&'a str, &'a str>>,
    /// The functions' log lines' file (`history`), or why it could not be opened.
    history: Result<&'a std::path::Path, &'a str>,
}

impl Startup<'_> {
    fn print(&self, events: &EventLog) {
        let p = self.provisioned;
        let o = self.options;
        let workflows = self.definitions.workflows.names();
        let example =
            send_example(&o.endpoint, &p.orders_queue, workflows.first().copied().unwrap_or("single-step"));
        let file = crate::workflows::source_name(o.workflows.as_deref());
        let every = o.supervisor_period.as_millis() as u64;
        if o.json {
            events.tell(
                "ready",
                "",
                serde_json::json!({
                    "endpoint": o.endpoint, "dynamodb_endpoint": o.dynamodb_endpoint,
                    "prefix": o.prefix, "created": self.created,
                    "queues": {
                        "orders": p.orders_queue, "orders_dlq": p.orders_dlq,
                        "scheduler": p.scheduler_queue, "scheduler_dlq": p.scheduler_dlq,
                        "agent": p.agent_queue, "agent_dlq": p.agent_dlq,
                        "callbacks": p.callback_queue, "callbacks_dlq": p.callback_dlq,
                        "status": p.status_queue,
                    },
                    "table": p.tables.state, "topic": p.alert_topic_arn,
                    "workflows_file": file, "workflows": workflows, "agents": self.targets,
                    "supervisor_period_ms": every, "step_timeout_ms": self.step_timeout_ms,
                    "windows": o.windows,
                    "send_example": example,
                    "exports": o.exports().into_iter().collect::<BTreeMap<_, _>>(),
                    "console": self.console.and_then(Result::ok),
                    "history": self.history.ok(),
                }),
            );
            return;
        }
        let total = crate::resources::names(&Layout::standard(&o.prefix)).len();
        let made = match self.created {
            0 => format!("all {total} found and reused"),
            n if n == total => format!("all {total} created"),
            n => format!("{n} of {total} created, the rest reused"),
        };
        let mut lines = vec![
            format!("sasctl up: the four functions against {}, prefix {} ({made})", o.endpoints(), o.prefix),
            format!("  orders queue     {}  (rejected orders: {})", p.orders_queue, p.orders_dlq),
            format!("  scheduler queue  {}", p.scheduler_queue),
            format!("  agent queue      {}", p.agent_queue),
            format!(
                "  callback queue   {}  (completes callback steps: {{\"token\": ..., \"outcome\": \"success\"}}; refused: {})",
                p.callback_queue, p.callback_dlq
            ),
            format!("  status queue     {}  (an order's reply_to may name it)", p.status_queue),
            format!("  state table      {}", p.tables.state),
            format!("  alerts topic     {}", p.alert_topic_arn),
            format!("  workflows        {} from {file}", workflows.join(", ")),
        ];
        for (i, target) in self.targets.iter().enumerate() {
            lines.push(format!("  {:<16} {target}", if i == 0 { "agents" } else { "" }));
        }
        lines.push(format!(
            "  supervisor       every {} (deployed: {DEPLOYED_SCHEDULE}); step timeout {} ms",
            fmt_period(o.supervisor_period),
            self.step_timeout_ms
        ));
        lines.push(format!(
            "  batching windows {} s orders/scheduler/agent (deployed: {DEPLOYED_WINDOWS})",
            o.windows.label()
        ));
        lines.push("send an order:".to_owned());
        lines.push(format!("  {example}"));
        let exports: Vec<String> =
            o.exports().iter().map(|(k, v)| format!("{k}={}", crate::tasks::render::shell_word(v))).collect();
        lines.push(
            "watch it from another terminal (every sasctl tasks, agents and dlq command then needs no flag):"
                .to_owned(),
        );
        lines.push(format!("  export {}", exports.join(" ")));
        lines.push("  sasctl tasks list --state processing; sasctl tasks show <order id>".to_owned());
        match self.console {
            Some(Ok(url)) => {
                lines.push(
                    "or in a browser, the web console (the URL holds its token; --no-console: none):".into(),
                );
                lines.push(format!("  {url}"));
            }
            Some(Err(why)) => lines.push(format!("no web console: {why}")),
            None => {}
        }
        match self.history {
            Ok(path) => lines.push(format!(
                "each order's whole history (the functions' log lines; the console's task page reads it): {}",
                path.display()
            )),
            Err(why) => lines.push(format!("no history file: {why}")),
        }
        lines.push("running; Ctrl-C stops (the resources stay)".to_owned());
        let mut out = std::io::stdout().lock();
        for line in lines {
            let _ = std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes());
        }
        let _ = std::io::Write::flush(&mut out);
    }
}

fn fmt_period(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1_000) { format!("{} s", ms / 1_000) } else { format!("{ms} ms") }
}

/// What a finished `up` leaves: its counts and where its resources stay.
pub struct Stopped {
    pub summary: UpCounts,
    pub endpoint: String,
    pub dynamodb_endpoint: Option<String>,
    pub prefix: String,
}

impl Stopped {
    /// The closing lines: the counts, and what became of the resources.
    pub fn render(&self) -> String {
        let (at, dynamodb_arg) = match &self.dynamodb_endpoint {
            Some(d) => {
                (format!("{} (DynamoDB at {d})", self.endpoint), format!(" --dynamodb-endpoint-url {d}"))
            }
            None => (self.endpoint.clone(), String::new()),
        };
        format!(
            "stopped: {}\nthe resources stay at {at} under the prefix {}: `sasctl up --endpoint-url {}{dynamodb_arg} --prefix {}` \
             carries on with them. No sasctl command removes them: stopping moto or LocalStack discards them, \
             or delete the table, queues and topic named {}-*\n",
            self.summary.line(),
            self.prefix,
            self.endpoint,
            self.prefix,
            self.prefix
        )
    }
}

/// Runs until SIGINT or SIGTERM, then stops receiving, lets every batch in flight finish
/// (its deletes included) and returns the counts. A second signal exits at once (130):
/// what was in flight then comes back after its queue's visibility timeout.
pub async fn run(options: UpOptions) -> Result<Stopped, UpError> {
    let ready = prepare(&options).await?;
    let configs = &ready.configs;

    // Signals are caught from here on: a Ctrl-C after the startup block always stops cleanly.
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| UpError::Signals(e.to_string()))?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| UpError::Signals(e.to_string()))?;

    let events = Arc::new(EventLog::new(options.json).with_workflows(ready.definitions.workflows.clone()));
    let console = match options.console {
        true => Some(console::start(&options.exports()).await),
        false => None,
    };
    let history = crate::history::start(&options.prefix).map_err(|e| e.to_string());
    Startup {
        options: &options,
        provisioned: &ready.provisioned,
        created: ready.created.len(),
        definitions: &ready.definitions,
        targets: &ready.targets,
        step_timeout_ms: configs.scheduler.state.policy.step_timeout_ms,
        console: console.as_ref().map(|c| c.as_ref().map(|c| c.url.as_str()).map_err(String::as_str)),
        history: history.as_deref().map_err(String::as_str),
    }
    .print(&events);

    let (stop_all, stop) = watch::channel(false);
    let workers = start(&ready, &options, events.clone(), stop);
    let kept = ready.kept.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(mut kept) = kept {
        let (events, by_hand) =
            (events.clone(), options.simulated.as_ref().is_some_and(|s| s.callback_delay_ms.is_none()));
        // Not one of the workers a stop waits for: it ends with the run.
        tokio::spawn(async move {
            while let Some(token) = kept.recv().await {
                events.kept_token(&token, by_hand);
            }
        });
    }
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    let _ = stop_all.send(true);
    eprintln!("sasctl up: stopping: finishing the batches in flight (Ctrl-C again quits at once)");
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        std::process::exit(130);
    });
    for worker in workers {
        let _ = worker.await;
    }
    Ok(Stopped {
        summary: events.summary(),
        endpoint: options.endpoint,
        dynamodb_endpoint: options.dynamodb_endpoint,
        prefix: options.prefix,
    })
}

/// What `up` found and made before its functions start.
pub struct Ready {
    pub definitions: Definitions,
    /// Where each agent's calls go, one line each.
    pub targets: Vec<String>,
    pub sdk: aws_config::SdkConfig,
    pub clients: Clients,
    pub provisioned: Provisioned,
    /// The resources this call created (the rest were found).
    pub created: Vec<crate::resources::Resource>,
    configs: Configs,
    /// The simulated remote service, held while `up` runs (dropped, it stops serving),
    /// and the tokens its outside party keeps (taken once, by the event log's teller).
    _service: Option<LoopbackRemote>,
    kept: Mutex<Option<KeptTokens>>,
}

type KeptTokens = tokio::sync::mpsc::UnboundedReceiver<KeptToken>;

/// Checks the options, finds or creates the resources and reads the functions'
/// configurations from them.
pub async fn prepare(options: &UpOptions) -> Result<Ready, UpError> {
    check_url(&options.endpoint)?;
    if let Some(url) = &options.dynamodb_endpoint {
        check_url(url)?;
    }
    if !valid_prefix(&options.prefix) {
        return Err(UpError::Prefix(options.prefix.clone()));
    }
    let definitions = crate::workflows::load(options.workflows.as_deref()).map_err(UpError::Definitions)?;
    let (_, without_url) = agent_targets(&definitions, options.remote_service_url.as_deref());
    if options.remote_service_url.is_none() && options.simulated.is_none() && !without_url.is_empty() {
        let file = crate::workflows::source_name(options.workflows.as_deref());
        return Err(UpError::NoRemote { agents: without_url.join(", "), file });
    }

    let sdk = sdk_config(&options.endpoint).await;
    probe(&sdk, &options.endpoint).await?;
    let mut clients = Clients::new(&sdk);
    if let Some(url) = &options.dynamodb_endpoint {
        clients.dynamodb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(url).build(),
        );
    }
    let layout = Layout::standard(&options.prefix);
    let provision_failed =
        |reason: String| UpError::Provision { url: options.endpoint.clone(), reason: one_line(&reason) };
    let before = crate::resources::existing(&clients, &layout).await.map_err(provision_failed)?;
    let provisioned =
        provision::provision_with(&clients, &layout).await.map_err(|e| provision_failed(e.to_string()))?;
    let now = crate::resources::existing(&clients, &layout).await.map_err(provision_failed)?;
    let created = crate::resources::made(&before, now);
    let region = sdk.region().map_or_else(|| "us-east-1".to_owned(), ToString::to_string);
    let service = match (&options.remote_service_url, &options.simulated) {
        (None, Some(simulated)) if !without_url.is_empty() => {
            Some(simulated_service(simulated, &definitions, &clients, &provisioned).await?)
        }
        _ => None,
    };
    let remote = match (&options.remote_service_url, &service) {
        (Some(url), _) => url.clone(),
        (None, Some((service, _))) => service.base_url(),
        (None, None) => UNUSED_REMOTE.to_owned(),
    };
    let (mut targets, _) =
        agent_targets(&definitions, Some(remote.as_str()).filter(|_| !without_url.is_empty()));
    if service.is_some() {
        for line in targets.iter_mut().filter(|l| l.contains(&remote)) {
            line.push_str(" (the simulated service)");
        }
    }
    let (service, kept) = service.map_or((None, None), |(s, k)| (Some(s), Some(k)));
    let configs = configs(&provisioned, options, &region, &remote)?;
    Ok(Ready {
        definitions,
        targets,
        sdk,
        clients,
        provisioned,
        created,
        configs,
        _service: service,
        kept: Mutex::new(kept),
    })
}

/// Starts the simulated service on loopback, its outside party sending completions on
/// the run's callback queue and telling of each token it keeps.
async fn simulated_service(
    simulated: &Simulated,
    definitions: &Definitions,
    clients: &Clients,
    provisioned: &Provisioned,
) -> Result<(LoopbackRemote, KeptTokens), UpError> {
    let (keeper, kept) = tokio::sync::mpsc::unbounded_channel();
    let callbacks = match simulated.callback_delay_ms {
        Some(delay_max_ms) => CallbackFaults { delay_max_ms, ..CallbackFaults::default() },
        // Kept for the user: no word of its own.
        None => CallbackFaults { never: 1.0, keep_alive: true, ..CallbackFaults::default() },
    };
    let queues: Arc<dyn Queues> = Arc::new(SqsQueues::new(clients.sqs.clone()));
    let outside = Outside::new(
        callbacks,
        fastrand::u64(..),
        &definitions.workflows,
        queues,
        QueueUrl(provisioned.callback_queue.clone()),
    )
    .with_keeper(keeper);
    let service = LoopbackRemote::start_with(
        simulated.faults,
        simulated.agent_faults.clone(),
        fastrand::u64(..),
        Some(outside),
    )
    .await
    .map_err(|e| UpError::Service(e.to_string()))?;
    Ok((service, kept))
}

/// The four functions, wired as their Lambda binaries wire them, with the event log watching
/// the store, the alerts and the dead-letter queues; their pumps and the supervisor's
/// timer, each stopping when `stop` says so.
pub fn start(
    ready: &Ready,
    options: &UpOptions,
    events: Arc<EventLog>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (sdk, clients, configs) = (&ready.sdk, &ready.clients, &ready.configs);
    let sqs = Arc::new(SqsQueues::new(clients.sqs.clone()));
    let hold = Duration::from_millis(configs.scheduler.state.send_max_hold_ms);
    let sends: Arc<dyn Queues> = Arc::new(SendCoalescer::new(sqs.clone(), hold));
    // The agent holds its sends for less: its handlers wait on remote services.
    let agent_hold = Duration::from_millis(configs.agent.send_max_hold_ms);
    let agent_sends: Arc<dyn Queues> = Arc::new(SendCoalescer::new(sqs.clone(), agent_hold));
    let metrics = Arc::new(CountingMetrics::default());
    let deps = Deps {
        store: Arc::new(TapStore::new(
            DynamoStore::new(clients.dynamodb.clone(), configs.scheduler.state.tables.clone()),
            events.clone(),
        )),
        queues: sends.clone(),
        alerts: Arc::new(TeeAlerts {
            first: Arc::new(SnsAlerts::new(
                clients.sns.clone(),
                configs.scheduler.alerts.topic_arn.clone(),
                sas::adapters::aws::sns::Deployment::Prefix(options.prefix.clone()),
            )),
            then: events.clone(),
        }),
        clock: Arc::new(SystemClock),
        random: Arc::new(SystemRandom::new()),
        metrics: metrics.clone(),
    };
    let agent_config = &configs.agent;
    let agent = Agent::new(
        AgentDeps {
            queues: agent_sends,
            clock: deps.clock.clone(),
            random: deps.random.clone(),
            metrics: metrics.clone(),
            remote: Arc::new(
                HttpRemote::new(agent_config.remote_service_url.clone())
                    .with_agents(&agent_config.definitions.agents)
                    .with_secrets(Arc::new(AwsSecrets::new(sdk))),
            ),
            scheduler_queue: agent_config.scheduler_queue.clone(),
            // As the agent function builds it: the table only where an agent has limits.
            call_starts: agent_config.state_table.as_ref().map(|table| {
                Arc::new(DynamoStore::new(clients.dynamodb.clone(), sas::ports::TableNames::new(table)))
                    as Arc<dyn sas::ports::CallStarts>
            }),
        },
        AgentSettings::default(),
        agent_config.definitions.workflows.clone(),
    )
    .with_agents(&agent_config.definitions.agents);
    let submission = Submission::new(deps.clone(), Settings::from_config(&configs.submission.state));
    // One process, one scheduler: its messages share its turns at the gates (a clone of a
    // `Scheduler` is another container's).
    let scheduler = Arc::new(Scheduler::new(deps.clone(), Settings::from_config(&configs.scheduler.state)));
    let callbacks = Callbacks::new(deps.clone(), Settings::from_config(&configs.scheduler.state));
    let supervisor = Supervisor::new(deps.clone(), Settings::from_config(&configs.supervisor.state));

    let pumps = Pumps {
        consumer: sqs,
        kept: Arc::new(events::RejectionTap {
            inner: sends,
            log: events.clone(),
            refused_at: QueueUrl(ready.provisioned.callback_dlq.clone()),
        }),
        metrics,
        settings: PumpSettings {
            batch_size: 10,
            concurrency: options.concurrency,
            wait_ms: options.receive_wait_ms,
            window_ms: 0,
            order: BatchOrder::Concurrent,
        },
        by_order: configs.scheduler.state.scheduler_queue.clone(),
        stop: stop.clone(),
        events: events.clone(),
    };
    let (orders, scheduler_queue) = (&configs.submission, &configs.scheduler);
    let submission = CancelWatch { submission, log: events.clone() };
    vec![
        pumps.spawn(&orders.orders_queue, &orders.orders_dlq, options.windows.orders_ms, move |m| {
            let s = submission.clone();
            async move { s.handle(m).await }
        }),
        pumps.spawn(
            &scheduler_queue.state.scheduler_queue,
            &scheduler_queue.scheduler_dlq,
            options.windows.scheduler_ms,
            move |m| {
                let s = scheduler.clone();
                async move { s.handle(m).await }
            },
        ),
        pumps.spawn(&agent_config.agent_queue, &agent_config.agent_dlq, options.windows.agent_ms, move |m| {
            let a = agent.clone();
            async move { a.handle(m).await }
        }),
        // The deployed event source of the callback queue has no batching window.
        pumps.spawn(&scheduler_queue.callback_queue, &scheduler_queue.callback_dlq, 0, move |m| {
            let c = callbacks.clone();
            async move { c.handle(m).await }
        }),
        tokio::spawn(supervise(supervisor, options.supervisor_period, events, stop)),
    ]
}

/// What every function's pump shares.
struct Pumps {
    consumer: Arc<dyn QueueConsumer>,
    /// The sends that keep rejected messages, watched by the event log.
    kept: Arc<dyn Queues>,
    metrics: Arc<CountingMetrics>,
    settings: PumpSettings,
    /// The queue whose batches run one order's messages in turn: the scheduler's.
    by_order: QueueUrl,
    stop: watch::Receiver<bool>,
    events: Arc<dyn PumpEvents>,
}

impl Pumps {
    fn order_of(&self, queue: &QueueUrl) -> BatchOrder {
        if *queue == self.by_order { BatchOrder::ByOrder } else { BatchOrder::Concurrent }
    }

    fn spawn<F, Fut>(
        &self,
        queue: &QueueUrl,
        dead_letter_queue: &QueueUrl,
        window_ms: u64,
        handle: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Fn(Inbound) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), sas::handlers::HandlerError>> + Send + 'static,
    {
        let dead_letters = DeadLetters {
            queues: self.kept.clone(),
            source: queue.clone(),
            dead_letter_queue: dead_letter_queue.clone(),
            metrics: self.metrics.clone(),
        };
        tokio::spawn(pump(
            self.consumer.clone(),
            queue.clone(),
            PumpSettings { window_ms, order: self.order_of(queue), ..self.settings },
            dead_letters,
            self.stop.clone(),
            self.events.clone(),
            handle,
        ))
    }
}

/// The supervisor on a timer: at once (a restarted `up` recovers what is overdue right
/// away), then every `period`. A run under way when the stop comes finishes first.
async fn supervise(
    supervisor: Supervisor,
    period: Duration,
    events: Arc<EventLog>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        match supervisor.sweep().await {
            Ok(report) => events.swept(&report),
            Err(e) => events.sweep_failed(&one_line(&e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default of a template parameter, read from template.yaml's text.
    fn template_default(name: &str) -> String {
        let template = include_str!("../../template.yaml");
        let at =
            template.find(&format!("\n  {name}:\n")).unwrap_or_else(|| panic!("{name} in template.yaml"));
        let rest = &template[at..];
        let line = rest.lines().find(|l| l.trim_start().starts_with("Default:")).expect("a Default");
        line.trim_start().trim_start_matches("Default:").trim().to_owned()
    }

    #[test]
    fn up_runs_with_the_deployed_windows_and_schedule() {
        let w = Windows::parse(DEPLOYED_WINDOWS).expect("parses");
        assert_eq!(template_default("OrdersBatchingWindowSeconds"), (w.orders_ms / 1000).to_string());
        assert_eq!(template_default("SchedulerBatchingWindowSeconds"), (w.scheduler_ms / 1000).to_string());
        assert_eq!(template_default("AgentBatchingWindowSeconds"), (w.agent_ms / 1000).to_string());
        assert_eq!(template_default("SupervisorSchedule").trim_matches('"'), DEPLOYED_SCHEDULE);
    }

    #[test]
    fn windows_are_three_whole_seconds() {
        assert_eq!(
            Windows::parse("5/0/1"),
            Ok(Windows { orders_ms: 5_000, scheduler_ms: 0, agent_ms: 1_000 })
        );
        for bad in ["5/0", "5/0/0/0", "a/0/0", "-1/0/0", "301/0/0", ""] {
            assert!(Windows::parse(bad).is_err(), "{bad}");
        }
    }
}
