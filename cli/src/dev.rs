//! `sasctl dev`: the whole pipeline in one process, on the embedded backend (or, through
//! [`Backend`], the real adapters: see `endpoint`). Each
//! function's handler is pumped from its queue the way Lambda's SQS event source
//! mapping does it (batches, partial batch failures, redelivery after the visibility
//! timeout), the supervisor fires on a schedule, and the agents call a simulated remote
//! service over loopback HTTP, which also plays the outside party of callback steps: it
//! completes them on the callback queue, which is pumped into the callbacks' handler.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sas::adapters::embedded::{
    CapacityReport, CountingMetrics, EmbeddedQueues, EmbeddedStore, MetricsSnapshot, QueueSettings,
    RecordingAlerts, StoredMessage, WriteRecord,
};
use sas::adapters::http_remote::HttpRemote;
use sas::adapters::system::{FastRandom, SystemClock};
use sas::domain::breaker::BreakerPolicy;
use sas::domain::definitions::AgentDef;
use sas::domain::retry::Backoff;
use sas::domain::{Definitions, OperatorAlert, Policy, ProcessState, TaskRecord, Workflows};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchOrder, Callbacks, DeadLetters, Deps, Inbound, Scheduler,
    SendCoalescer, Settings, Submission, Supervisor,
};
use sas::ports::{Alerts, CallStarts, Clock, Outgoing, QueueConsumer, QueueUrl, Queues, StateStore};
use tokio::sync::watch;

use crate::pump::{PumpSettings, Quiet, pump};
use crate::remote_sim::{
    CallbackAttempt, CallbackFaults, CallbackSend, Flights, Ledger, LoopbackRemote, Outside, RemoteFaults,
};

pub use sas::adapters::embedded::queue_names::{self, *};

/// Where every `queue` agent's requests go in a dev run, and where its worker takes them
/// from. The worker is the agent function's own code, as a team's worker would do the
/// same: call the service, reply on the scheduler's queue with the lease and attempt.
pub const WORKER: &str = "worker";
pub const WORKER_DLQ: &str = "worker-dlq";

/// Where the outside party of callback steps sends its word in a dev run, and where the
/// messages the callbacks' handler refused are kept (with their `sas-reason`).
pub const CALLBACKS: &str = "callbacks";
pub const CALLBACKS_DLQ: &str = "callbacks-dlq";

/// The `SenderId` a dev run's app sends with on the embedded backend (an IAM user's
/// unique id, as SQS would give it); against an endpoint, the endpoint sets its own.
pub const DEV_APP_SENDER_ID: &str = "AIDASASCTLDEVAPP";

#[derive(Debug, Clone)]
pub struct DevOptions {
    pub orders: usize,
    /// The definition file (the built-in one by default): its workflows, and its agents'
    /// timeouts, retries and breakers; every agent calls the simulated remote service.
    pub definitions: Definitions,
    pub workflow: String,
    pub faults: RemoteFaults,
    /// Agents whose simulated service fails differently from `faults`.
    pub agent_faults: std::collections::BTreeMap<String, RemoteFaults>,
    /// How the simulated outside party answers callback steps.
    pub callbacks: CallbackFaults,
    /// Share of orders submitted a second time, byte for byte.
    pub duplicate_rate: f64,
    /// Bad messages sent alongside the orders (malformed, invalid, conflicting).
    pub malformed: usize,
    /// Probability the internal queues deliver a message twice (SQS at-least-once).
    pub queue_duplicate_rate: f64,
    pub step_timeout_ms: u64,
    pub supervisor_period_ms: u64,
    pub failure_threshold: u32,
    /// Concurrent batches per function, like Lambda's concurrency.
    pub concurrency: usize,
    pub batch_size: usize,
    /// The longest a send waits to go out in one request with its invocation's others.
    pub send_max_hold_ms: u64,
    pub seed: u64,
    /// Give up waiting for every order to end after this long.
    pub max_runtime: Duration,
    /// Orders per second, sent in tenth-of-a-second slices; `None`: all at once.
    pub arrival_per_s: Option<u32>,
    /// More orders of another workflow, sent as a steady trickle while the others go as
    /// `arrival_per_s` says (`bench flow`: a burst and a neighbour's trickle at once).
    pub trickle: Option<Trickle>,
    /// Scheduler containers pumping the scheduler's queue side by side, each its own
    /// `Scheduler` (its own turns at the gates, its own send coalescer), so their writes
    /// race as containers' do; they share `concurrency` between them.
    pub schedulers: usize,
    /// Whether the embedded store bills and throttles each item as DynamoDB does
    /// (`EmbeddedStore::with_capacity`); the outcome's `capacity` then says what it saw.
    pub capacity: bool,
    /// The customers of the orders (`bench fair`): every order of the run's own is
    /// `burst`'s, the trickle's are drawn from `others` of their own; else drawn from 99.
    pub customers: Option<Customers>,
}

/// Who sends the orders: one customer's burst, and a few others' trickle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customers {
    pub burst: String,
    pub others: u32,
}

/// Orders of `workflow` at `per_s` a second, ids `trickle-0000000` on, beside the run's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trickle {
    pub workflow: String,
    pub orders: usize,
    pub per_s: u32,
}

impl Default for DevOptions {
    fn default() -> Self {
        DevOptions {
            orders: 1_000,
            definitions: Definitions::example(),
            workflow: "single-step".into(),
            faults: RemoteFaults {
                transient: 0.1,
                permanent: 0.01,
                undo_permanent: 0.0,
                hang: 0.02,
                latency_max_ms: 2,
                bad_output: 0.0,
                ignores_undone: false,
            },
            agent_faults: Default::default(),
            callbacks: CallbackFaults {
                delay_max_ms: 200,
                failure: 0.05,
                late: 0.02,
                never: 0.02,
                duplicate: 0.05,
                stale: 0.02,
                forged: 0.02,
                keep_alive: false,
            },
            duplicate_rate: 0.05,
            malformed: 10,
            queue_duplicate_rate: 0.01,
            step_timeout_ms: 1_000,
            supervisor_period_ms: 250,
            failure_threshold: 5,
            concurrency: 64,
            batch_size: 10,
            send_max_hold_ms: sas::config::DEFAULT_AGENT_SEND_MAX_HOLD_MS,
            seed: 1,
            max_runtime: Duration::from_secs(300),
            arrival_per_s: None,
            trickle: None,
            schedulers: 1,
            capacity: false,
            customers: None,
        }
    }
}

impl DevOptions {
    /// The definitions' `queue` agents: a dev run serves them with its own worker.
    pub fn queue_agents(&self) -> Vec<&str> {
        self.definitions.agents.iter().filter(|(_, d)| d.queue().is_some()).map(|(n, _)| n.as_str()).collect()
    }

    /// The definitions' callback steps: a dev run plays their outside party, pumps the callback queue.
    pub fn callback_steps(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .definitions
            .workflows
            .all()
            .iter()
            .flat_map(|w| &w.steps)
            .filter(|s| s.is_callback())
            .map(|s| s.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    pub fn policy(&self) -> Policy {
        Policy {
            step_timeout_ms: self.step_timeout_ms,
            reply_grace_ms: self.step_timeout_ms / 2,
            pending_timeout_ms: self.step_timeout_ms * 2,
            failure_threshold: self.failure_threshold,
            retry_backoff: Backoff { base_ms: self.step_timeout_ms / 5, cap_ms: self.step_timeout_ms * 2 },
        }
    }
}

/// What was sent, so the run can be checked against it.
#[derive(Debug, Clone)]
pub struct SentMessages {
    /// Valid orders, by id, with their body.
    pub orders: Vec<(String, String)>,
    pub duplicates: usize,
    /// Bad bodies and the reason we expect them to be rejected for.
    pub bad: Vec<(String, &'static str)>,
}

/// Everything a finished run leaves behind.
pub struct DevOutcome {
    pub options: DevOptions,
    pub sent: SentMessages,
    pub tasks: Vec<TaskRecord>,
    pub writes: Vec<sas::adapters::embedded::WriteRecord>,
    pub kept: Vec<StoredMessage>,
    pub internal_dead_letters: Vec<StoredMessage>,
    pub statuses: Vec<StoredMessage>,
    pub alerts: Vec<OperatorAlert>,
    pub metrics: MetricsSnapshot,
    pub ledger: Ledger,
    /// Each agent's calls as the simulated service saw them: how many were open at once,
    /// and when each arrived (`remote_sim::Flights`), by agent name.
    pub flights: BTreeMap<String, Flights>,
    /// Every attempt of a callback step the outside party was handed, with its word.
    pub callback_attempts: Vec<CallbackAttempt>,
    /// Everything the outside party of callback steps sent, bad tokens included.
    pub callback_sends: Vec<CallbackSend>,
    /// What the callbacks' handler refused, kept in the callback queue's DLQ with the reason.
    pub callback_kept: Vec<StoredMessage>,
    pub supervisor_runs: u64,
    pub elapsed: Duration,
    pub timed_out: bool,
    pub workflows: Workflows,
    /// The store's capacity use, when it was modelled (`DevOptions::capacity`).
    pub capacity: Option<StoreCapacity>,
}

/// What the store's items took of DynamoDB's capacity: all of them, the gates' and waiter
/// notes' (keys `gate#<gate>` and `gate#<gate>#<ticket>`), and the gates' alone.
#[derive(Debug, Clone, Default)]
pub struct StoreCapacity {
    pub all: CapacityReport,
    pub gates_and_waiters: CapacityReport,
    pub gates: CapacityReport,
}

/// Progress as the run goes: tasks per state and how many are expected.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub expected: usize,
    pub accepted: usize,
    pub terminal: usize,
    pub by_state: std::collections::BTreeMap<ProcessState, usize>,
}

fn queue_settings(
    visibility_timeout_ms: u64,
    dead_letter: Option<&str>,
    duplicate_rate: f64,
) -> QueueSettings {
    QueueSettings {
        visibility_timeout_ms,
        max_receives: 5,
        dead_letter: dead_letter.map(str::to_owned),
        duplicate_rate,
    }
}

/// Bad inputs a real sender produces, each with the words its rejection must contain.
fn bad_bodies(valid: &[(String, String)]) -> Vec<(String, &'static str)> {
    let conflicting = valid.first().map(|(id, _)| {
        format!(r#"{{"order_id":"{id}","customer_id":"someone-else","items":[{{"sku":"X","quantity":9}}],"reply_to":"{STATUS}"}}"#)
    });
    let mut kinds: Vec<(String, &'static str)> = vec![
        ("{not json".into(), "not a valid message"),
        ("".into(), "not a valid message"),
        (r#"{"order_id":"bad-1"}"#.into(), "missing field"),
        (
            r#"{"order_id":"bad-2","customer_id":"c","items":[{"sku":"A","quantity":1}],"colour":"red"}"#
                .into(),
            "unknown field",
        ),
        (
            r#"{"order_id":"bad-3","customer_id":"c","items":[{"sku":"A","quantity":-2}]}"#.into(),
            "invalid value",
        ),
        (
            r#"{"order_id":"bad-4","customer_id":"c","items":[{"sku":"A","quantity":0}]}"#.into(),
            "quantity is 0",
        ),
        (r#"{"order_id":"bad/5","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#.into(), "only ASCII"),
        (r#"{"order_id":"bad-6","customer_id":"c","items":[]}"#.into(), "items is empty"),
        (
            r#"{"order_id":"bad-7","customer_id":"c","items":[{"sku":"A","quantity":1}],"workflow":"nope"}"#
                .into(),
            "unknown workflow",
        ),
        (
            format!(r#"{{"order_id":"bad-8","customer_id":"{}","items":[]}}"#, "x".repeat(300 * 1024)),
            "bytes; at most",
        ),
        (r#"[1,2,3]"#.into(), "not a valid message"),
        (r#"{"order_id":12,"customer_id":"c","items":[{"sku":"A","quantity":1}]}"#.into(), "invalid type"),
    ];
    if let Some(c) = conflicting {
        kinds.insert(0, (c, "different payload"));
    }
    kinds
}

/// An order of `customer`, or of one drawn from 99.
fn order_body_of(id: &str, workflow: &str, customer: Option<&str>, rng: &mut fastrand::Rng) -> String {
    let items: Vec<String> = (0..rng.usize(1..4))
        .map(|i| format!(r#"{{"sku":"sku-{}-{i}","quantity":{}}}"#, rng.u32(1..1000), rng.u32(1..5)))
        .collect();
    let drawn = rng.u32(1..100);
    let customer = customer.map_or_else(|| format!("cust-{drawn}"), str::to_owned);
    format!(
        r#"{{"order_id":"{id}","customer_id":"{customer}","items":[{}],"workflow":"{workflow}","reply_to":"{STATUS}"}}"#,
        items.join(",")
    )
}

/// What a dev run needs from its backend beyond the ports: where to look at the end
/// of the run, and how to see progress while it goes.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    fn store(&self) -> Arc<dyn StateStore>;
    /// The same table, for the agent's call marks (limited agents only).
    fn call_starts(&self) -> Arc<dyn CallStarts>;
    fn queues(&self) -> Arc<dyn Queues>;
    /// Where the run's app sends its orders from: SQS records the sender (`SenderId`),
    /// and the submission function binds each order to it.
    fn app_queues(&self) -> Arc<dyn Queues> {
        self.queues()
    }
    fn consumer(&self) -> Arc<dyn QueueConsumer>;
    fn alerts(&self) -> Arc<dyn Alerts>;
    /// Tasks per state, cheap enough to poll.
    fn state_counts(&self) -> BTreeMap<ProcessState, usize>;
    /// Every landed task write, in order.
    fn writes(&self) -> Vec<WriteRecord>;
    /// Every alert raised.
    fn raised_alerts(&self) -> Vec<OperatorAlert>;
    /// Messages waiting or in flight in a queue (by the dev run's queue name).
    async fn depth(&self, queue: &str) -> Result<usize, DevError>;
    /// Every message in a queue, removed.
    async fn drain(&self, queue: &str) -> Result<Vec<StoredMessage>, DevError>;
    /// The final task records, as the store holds them.
    async fn final_tasks(&self) -> Result<Vec<TaskRecord>, DevError>;
    /// Whether the backend's queue can carry this body at all (SQS has a size limit).
    fn can_carry(&self, _body: &str) -> bool {
        true
    }
    /// What the store's items took of their capacity, where the backend models it.
    fn capacity(&self) -> Option<StoreCapacity> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("queue: {0}")]
    Queue(#[from] sas::ports::QueueError),
    #[error("store: {0}")]
    Store(#[from] sas::ports::StoreError),
    #[error("remote service simulator: {0}")]
    Remote(#[from] std::io::Error),
}

/// The embedded backend: in-process store, queues and topic.
pub struct Embedded {
    pub store: Arc<EmbeddedStore>,
    pub queues: Arc<EmbeddedQueues>,
    pub alerts: Arc<RecordingAlerts>,
}

impl Embedded {
    pub fn new(options: &DevOptions, clock: Arc<dyn Clock>) -> Embedded {
        let store =
            if options.capacity { EmbeddedStore::with_capacity(clock.clone()) } else { EmbeddedStore::new() };
        let queues = Arc::new(EmbeddedQueues::new(clock, options.seed));
        let dup = options.queue_duplicate_rate;
        for dlq in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, WORKER_DLQ, CALLBACKS_DLQ, STATUS] {
            queues.create(dlq, QueueSettings::default());
        }
        queues.create(ORDERS, queue_settings(5_000, Some(ORDERS_DLQ), dup));
        queues.create(SCHEDULER, queue_settings(5_000, Some(SCHEDULER_DLQ), dup));
        queues.create(AGENT, queue_settings(options.step_timeout_ms * 6, Some(AGENT_DLQ), dup));
        queues.create(WORKER, queue_settings(options.step_timeout_ms * 6, Some(WORKER_DLQ), dup));
        queues.create(CALLBACKS, queue_settings(5_000, Some(CALLBACKS_DLQ), dup));
        Embedded { store: Arc::new(store), queues, alerts: Arc::new(RecordingAlerts::default()) }
    }
}

#[async_trait::async_trait]
impl Backend for Embedded {
    fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }
    fn call_starts(&self) -> Arc<dyn CallStarts> {
        self.store.clone()
    }
    fn queues(&self) -> Arc<dyn Queues> {
        self.queues.clone()
    }
    /// As an IAM user's sends would arrive on SQS: with the user's unique id as `SenderId`.
    fn app_queues(&self) -> Arc<dyn Queues> {
        Arc::new(self.queues.sending_as(DEV_APP_SENDER_ID))
    }
    fn consumer(&self) -> Arc<dyn QueueConsumer> {
        self.queues.clone()
    }
    fn alerts(&self) -> Arc<dyn Alerts> {
        self.alerts.clone()
    }
    fn state_counts(&self) -> BTreeMap<ProcessState, usize> {
        self.store.state_counts()
    }
    fn writes(&self) -> Vec<WriteRecord> {
        self.store.writes()
    }
    fn raised_alerts(&self) -> Vec<OperatorAlert> {
        self.alerts.all()
    }
    async fn depth(&self, queue: &str) -> Result<usize, DevError> {
        Ok(self.queues.depth(queue))
    }
    async fn drain(&self, queue: &str) -> Result<Vec<StoredMessage>, DevError> {
        Ok(self.queues.drain(queue))
    }
    async fn final_tasks(&self) -> Result<Vec<TaskRecord>, DevError> {
        Ok(self.store.tasks())
    }
    fn capacity(&self) -> Option<StoreCapacity> {
        let all = self.store.capacity()?;
        let gates_and_waiters = self.store.capacity_where(|key| key.starts_with("gate#")).unwrap_or_default();
        let gates = self.store.capacity_where(|key| key.matches('#').count() == 1).unwrap_or_default();
        Some(StoreCapacity { all, gates_and_waiters, gates })
    }
}

/// Runs the pipeline on the embedded backend until every accepted order is terminal
/// (or `max_runtime` passes).
pub async fn run(options: DevOptions, on_progress: impl Fn(&Progress)) -> Result<DevOutcome, std::io::Error> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let backend = Embedded::new(&options, clock.clone());
    run_on(&backend, clock, options, 100, on_progress).await.map_err(std::io::Error::other)
}

#[allow(clippy::too_many_arguments)]
fn spawn_pump<H, Fut>(
    backend: &dyn Backend,
    sends: Arc<dyn Queues>,
    queue: &'static str,
    dead_letter_queue: &'static str,
    (options, concurrency): (&DevOptions, usize),
    metrics: Arc<CountingMetrics>,
    stop: watch::Receiver<bool>,
    handle: H,
) -> tokio::task::JoinHandle<()>
where
    H: Fn(Inbound) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), sas::handlers::HandlerError>> + Send + 'static,
{
    let dead_letters = DeadLetters {
        queues: sends,
        source: QueueUrl(queue.into()),
        dead_letter_queue: QueueUrl(dead_letter_queue.into()),
        metrics,
    };
    // The scheduler's batches run one order's messages one after another, as deployed.
    let order = if queue == SCHEDULER { BatchOrder::ByOrder } else { BatchOrder::Concurrent };
    let settings =
        PumpSettings { batch_size: options.batch_size, concurrency, wait_ms: 20, window_ms: 0, order };
    tokio::spawn(pump(
        backend.consumer(),
        QueueUrl(queue.into()),
        settings,
        dead_letters,
        stop,
        Arc::new(Quiet),
        handle,
    ))
}

/// Runs the pipeline on any backend: the four handlers pumped from their queues, the
/// supervisor on its schedule, the agents calling the simulated remote service.
pub async fn run_on(
    backend: &dyn Backend,
    clock: Arc<dyn Clock>,
    options: DevOptions,
    poll_ms: u64,
    on_progress: impl Fn(&Progress),
) -> Result<DevOutcome, DevError> {
    let started = Instant::now();
    let metrics = Arc::new(CountingMetrics::default());
    let random = Arc::new(FastRandom::seeded(options.seed));
    let callbacks = !options.callback_steps().is_empty();
    // The outside party sends as an app would: straight to the queue, no coalescing.
    let outside = callbacks.then(|| {
        Outside::new(
            options.callbacks,
            options.seed,
            &options.definitions.workflows,
            backend.queues(),
            QueueUrl(CALLBACKS.into()),
        )
    });
    let remote =
        LoopbackRemote::start_with(options.faults, options.agent_faults.clone(), options.seed, outside)
            .await?;
    // Every agent at the simulated service, each with its own call timeout; without its
    // auth, which the simulated service does not ask for (and no secret store is read).
    let at_the_simulated_service: std::collections::BTreeMap<_, _> = options
        .definitions
        .agents
        .iter()
        .map(|(name, def)| (name.clone(), AgentDef { url: None, auth: None, ..def.clone() }))
        .collect();
    let http = HttpRemote::new(remote.base_url()).with_agents(&at_the_simulated_service);

    // As the Lambda functions send: each invocation's sends coalesced into one request per queue.
    let sends: Arc<dyn Queues> =
        Arc::new(SendCoalescer::new(backend.queues(), Duration::from_millis(options.send_max_hold_ms)));
    let deps = Deps {
        store: backend.store(),
        queues: sends.clone(),
        alerts: backend.alerts(),
        clock: clock.clone(),
        random: random.clone(),
        metrics: metrics.clone(),
    };
    let workflows = options.definitions.workflows.clone();
    // The agents' limits go into the topology as the deployed functions' configuration
    // puts them (`Topology::with_queue_agents`): without them no claim meets a gate. Every
    // queue agent's requests then go to the run's one worker, whatever queue it names.
    let mut topology = queue_names::topology().with_queue_agents(&options.definitions.agents);
    for name in options.queue_agents() {
        topology.queue_agents.insert(name.to_owned(), QueueUrl(WORKER.into()));
    }
    let settings =
        Settings::new(options.policy(), workflows.clone(), topology, queue_names::reply_to_rules());
    let submission = Submission::new(deps.clone(), settings.clone());
    let agent = Agent::new(
        AgentDeps {
            queues: sends.clone(),
            clock: clock.clone(),
            random: random.clone(),
            metrics: metrics.clone(),
            remote: Arc::new(http),
            scheduler_queue: QueueUrl(SCHEDULER.into()),
            call_starts: Some(backend.call_starts()),
        },
        AgentSettings {
            retry: Backoff { base_ms: 10, cap_ms: options.step_timeout_ms / 4 },
            breaker: BreakerPolicy { failure_threshold: 20, open_ms: options.step_timeout_ms / 10 },
            ..AgentSettings::default()
        },
        workflows.clone(),
    )
    .with_agents(&options.definitions.agents);
    let supervisor = Supervisor::new(deps.clone(), settings.clone());
    let completions = Callbacks::new(deps.clone(), settings.clone());

    let (stop_all, stop) = watch::channel(false);
    let (s, a, w) = (submission.clone(), agent.clone(), agent.clone());
    let mut workers = vec![
        spawn_pump(
            backend,
            sends.clone(),
            ORDERS,
            ORDERS_DLQ,
            (&options, options.concurrency),
            metrics.clone(),
            stop.clone(),
            move |m| {
                let s = s.clone();
                async move { s.handle(m).await }
            },
        ),
        spawn_pump(
            backend,
            sends.clone(),
            AGENT,
            AGENT_DLQ,
            (&options, options.concurrency),
            metrics.clone(),
            stop.clone(),
            move |m| {
                let a = a.clone();
                async move { a.handle(m).await }
            },
        ),
    ];
    // Each scheduler container its own `Scheduler` and send coalescer, on one queue.
    let containers = options.schedulers.max(1);
    for _ in 0..containers {
        let own: Arc<dyn Queues> =
            Arc::new(SendCoalescer::new(backend.queues(), Duration::from_millis(options.send_max_hold_ms)));
        // One `Scheduler` per container, shared by its messages: a clone would be another
        // container's (its own turns).
        let c = Arc::new(Scheduler::new(Deps { queues: own, ..deps.clone() }, settings.clone()));
        workers.push(spawn_pump(
            backend,
            sends.clone(),
            SCHEDULER,
            SCHEDULER_DLQ,
            (&options, options.concurrency.div_ceil(containers)),
            metrics.clone(),
            stop.clone(),
            move |m| {
                let c = c.clone();
                async move { c.handle(m).await }
            },
        ));
    }
    if !options.queue_agents().is_empty() {
        workers.push(spawn_pump(
            backend,
            sends.clone(),
            WORKER,
            WORKER_DLQ,
            (&options, options.concurrency),
            metrics.clone(),
            stop.clone(),
            move |m| {
                let w = w.clone();
                async move { w.handle(m).await }
            },
        ));
    }
    if callbacks {
        workers.push(spawn_pump(
            backend,
            sends.clone(),
            CALLBACKS,
            CALLBACKS_DLQ,
            (&options, options.concurrency),
            metrics.clone(),
            stop.clone(),
            move |m| {
                let c = completions.clone();
                async move { c.handle(m).await }
            },
        ));
    }
    let supervisor_runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (stop, runs, period) = (stop.clone(), supervisor_runs.clone(), options.supervisor_period_ms);
        workers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(period));
            while !*stop.borrow() {
                tick.tick().await;
                if let Err(e) = supervisor.sweep().await {
                    tracing::error!(error = %e, "supervisor run failed");
                }
                runs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let queues = backend.app_queues();
    let mut sent = send_orders(&options, queues.as_ref()).await?;
    sent.bad.retain(|(body, _)| backend.can_carry(body));
    let expected = sent.orders.len();
    let mut timed_out = false;
    // Bad messages go once every valid order is in, so a conflicting payload always
    // meets its original (a conflicting one first would be accepted in its place).
    let mut bad_sent = false;
    loop {
        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
        let by_state = backend.state_counts();
        let accepted: usize = by_state.values().sum();
        let terminal: usize = by_state.iter().filter(|(s, _)| s.is_terminal()).map(|(_, n)| n).sum();
        on_progress(&Progress { expected, accepted, terminal, by_state });
        if !bad_sent && accepted >= expected {
            send_bodies(queues.as_ref(), sent.bad.iter().map(|(b, _)| b.clone()).collect()).await?;
            bad_sent = true;
            continue;
        }
        // The outside party's last words (a late or second copy, due after its order
        // ended) are waited for too: each must reach the handler to be judged.
        if bad_sent
            && terminal == accepted
            && backend.depth(ORDERS).await? == 0
            && (!callbacks || backend.depth(CALLBACKS).await? == 0)
        {
            break;
        }
        if started.elapsed() > options.max_runtime {
            timed_out = true;
            break;
        }
    }
    let _ = stop_all.send(true);
    for w in workers {
        w.abort();
        let _ = w.await;
    }
    remote.stop();

    let mut internal_dead_letters = backend.drain(SCHEDULER_DLQ).await?;
    internal_dead_letters.extend(backend.drain(AGENT_DLQ).await?);
    if !options.queue_agents().is_empty() {
        internal_dead_letters.extend(backend.drain(WORKER_DLQ).await?);
    }
    let callback_kept = if callbacks { backend.drain(CALLBACKS_DLQ).await? } else { Vec::new() };
    Ok(DevOutcome {
        sent,
        tasks: backend.final_tasks().await?,
        writes: backend.writes(),
        kept: backend.drain(ORDERS_DLQ).await?,
        internal_dead_letters,
        statuses: backend.drain(STATUS).await?,
        alerts: backend.raised_alerts(),
        metrics: metrics.snapshot(),
        ledger: remote.ledger(),
        flights: remote.flights(),
        callback_attempts: remote.callback_attempts(),
        callback_sends: remote.callback_sends(),
        callback_kept,
        supervisor_runs: supervisor_runs.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        timed_out,
        workflows,
        capacity: backend.capacity(),
        options,
    })
}

pub async fn send_orders(
    options: &DevOptions,
    queues: &dyn Queues,
) -> Result<SentMessages, sas::ports::QueueError> {
    let mut rng = fastrand::Rng::with_seed(options.seed ^ 0x5eed);
    let orders: Vec<(String, String)> = (0..options.orders)
        .map(|i| {
            let id = format!("order-{i:07}");
            // `--workflow a,b`: the orders take the workflows in turn.
            let names: Vec<&str> = options.workflow.split(',').collect();
            let burst = options.customers.as_ref().map(|c| c.burst.as_str());
            let body = order_body_of(&id, names[i % names.len()], burst, &mut rng);
            (id, body)
        })
        .collect();
    let mut bodies: Vec<String> = orders.iter().map(|(_, b)| b.clone()).collect();
    let mut duplicates = 0;
    for (_, body) in &orders {
        if rng.f64() < options.duplicate_rate {
            bodies.push(body.clone());
            duplicates += 1;
        }
    }
    let kinds = bad_bodies(&orders);
    let bad: Vec<(String, &'static str)> =
        (0..options.malformed).map(|i| kinds[i % kinds.len()].clone()).collect();
    rng.shuffle(&mut bodies);
    let mut orders = orders;
    let trickle: Vec<String> = match &options.trickle {
        Some(t) => {
            let first = orders.len();
            orders.extend((0..t.orders).map(|i| {
                let id = format!("trickle-{i:07}");
                let other =
                    options.customers.as_ref().map(|c| format!("other-{}", i as u32 % c.others.max(1)));
                let body = order_body_of(&id, &t.workflow, other.as_deref(), &mut rng);
                (id, body)
            }));
            orders[first..].iter().map(|(_, b)| b.clone()).collect()
        }
        None => Vec::new(),
    };
    let trickle_rate = options.trickle.as_ref().map(|t| t.per_s);
    tokio::try_join!(paced(queues, bodies, options.arrival_per_s), paced(queues, trickle, trickle_rate))?;
    Ok(SentMessages { orders, duplicates, bad })
}

/// Sends `bodies` at `rate` a second, or all at once.
async fn paced(
    queues: &dyn Queues,
    bodies: Vec<String>,
    rate: Option<u32>,
) -> Result<(), sas::ports::QueueError> {
    match rate {
        None => send_bodies(queues, bodies).await,
        Some(rate) => {
            // A steady trickle: a tenth of a second's orders every tenth of a second.
            let slice = (rate as usize).div_ceil(10).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for chunk in bodies.chunks(slice) {
                tick.tick().await;
                send_bodies(queues, chunk.to_vec()).await?;
            }
            Ok(())
        }
    }
}

pub async fn send_bodies(queues: &dyn Queues, bodies: Vec<String>) -> Result<(), sas::ports::QueueError> {
    let url = QueueUrl(ORDERS.into());
    for chunk in bodies.chunks(10) {
        queues.send_batch(&url, chunk.iter().cloned().map(Outgoing::new).collect()).await?;
    }
    Ok(())
}
