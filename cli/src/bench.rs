//! `sasctl bench`: the figures of docs/BENCHMARKS.md, each measured in one run.
//!
//! - `throughput`: the whole pipeline in-process on the embedded backend, the remote
//!   service answered in-process, orders per second, CPU time per order and microseconds
//!   per message per handler.
//! - `sweep`: items the supervisor reads per sweep with 100 due tasks among N finished ones.
//! - `recovery`: simulated time from an agent crash to the order's completion.
//! - `cost`: AWS requests and billed units per order, counted around the ports, priced.
//! - `cold-start`: function binaries launched against a stub Runtime API and an HTTPS
//!   stub of AWS (`aws_stub`): init, first invocation with its TLS connection, peak RSS.
//!
//! Nothing here asserts a timing: the smoke test in `tests` checks structure only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;

use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::{FastRandom, SystemClock};
use sas::domain::breaker::BreakerPolicy;
use sas::domain::retry::Backoff;
use sas::domain::{
    LineItem, OperatorAlert, Order, OrderId, Policy, ProcessState, TaskRecord, Timestamp, Workflows,
};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, DEFAULT_MAX_HOLD, DeadLetters, Deps, Inbound, Scheduler, SendCoalescer,
    Settings, Submission, Supervisor, run_batch,
};
use sas::ports::{
    AlertError, Alerts, Clock, Inserted, Metrics, Outgoing, QueueError, QueueUrl, Queues, RemoteCall,
    RemoteError, RemoteService, StateStore, StoreError, Written,
};

use sas::adapters::embedded::queue_names::{self, *};

use crate::aws_stub::{AwsStub, StubCall, read_request};
const BATCH: usize = 10;

// ------------------------------------------------------------------ CPU time

/// User + system CPU time of this process so far.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Peak resident set of this process, in KiB.
pub fn peak_rss_kib() -> u64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_maxrss as u64
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

// ------------------------------------------------------------------ the in-process remote

/// The remote service answered in-process: no I/O, optional injected failures.
pub struct InstantRemote {
    transient_rate: f64,
    permanent_rate: f64,
    rng: Mutex<fastrand::Rng>,
    pub calls: AtomicU64,
}

impl InstantRemote {
    pub fn new(transient_rate: f64, permanent_rate: f64, seed: u64) -> InstantRemote {
        InstantRemote {
            transient_rate,
            permanent_rate,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            calls: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl RemoteService for InstantRemote {
    async fn call(&self, _call: &RemoteCall<'_>, _timeout_ms: u64) -> Result<Vec<u8>, RemoteError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.transient_rate == 0.0 && self.permanent_rate == 0.0 {
            return Ok(Vec::new());
        }
        let r = self.rng.lock().unwrap_or_else(|p| p.into_inner()).f64();
        if r < self.permanent_rate {
            Err(RemoteError::permanent("injected: 422"))
        } else if r < self.permanent_rate + self.transient_rate {
            Err(RemoteError::Transient("injected: 503".into()))
        } else {
            Ok(Vec::new())
        }
    }
}

// ------------------------------------------------------------------ counting ports

/// AWS requests and billed units, counted around the ports (see `cost`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct AwsUsage {
    pub ddb_gets: u64,
    pub ddb_puts: u64,
    pub ddb_queries: u64,
    /// Write request units, including the due index's writes.
    pub wru: f64,
    /// Read request units: strongly consistent gets, eventually consistent index queries.
    pub rru: f64,
    /// SendMessage / SendMessageBatch requests (one per 10 messages of one call).
    pub sqs_sends: u64,
    pub sqs_messages_sent: u64,
    /// ReceiveMessage requests the event source mapping makes that return messages.
    pub sqs_receives: u64,
    /// DeleteMessageBatch requests for the successfully handled messages.
    pub sqs_deletes: u64,
    pub sns_publishes: u64,
    /// Function invocations, by function.
    pub invocations: BTreeMap<String, u64>,
}

/// Size of a record as DynamoDB would bill it, approximated by its JSON length (attribute
/// names plus values; JSON's quotes and braces make it a slight over-estimate).
fn item_bytes<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

fn kb_units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

pub struct CountingStore {
    inner: Arc<EmbeddedStore>,
    usage: Arc<Mutex<AwsUsage>>,
    /// Queries per `due` call (the DynamoDB adapter queries each due shard).
    due_shards: u32,
}

impl CountingStore {
    fn with(&self, f: impl FnOnce(&mut AwsUsage)) {
        f(&mut self.usage.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// The due index's key of a record: it has an index entry exactly while it has a deadline.
fn index_key(task: Option<&TaskRecord>) -> Option<Timestamp> {
    task.and_then(|t| t.deadline)
}

/// Writes a table write costs the KEYS_ONLY due index: an entry put when the key appears,
/// deleted when it goes, both when it changes; a write that keeps it costs nothing.
fn index_writes(before: Option<Timestamp>, after: Option<Timestamp>) -> f64 {
    match (before, after) {
        (Some(a), Some(b)) if a == b => 0.0,
        (Some(_), Some(_)) => 2.0,
        (None, Some(_)) | (Some(_), None) => 1.0,
        (None, None) => 0.0,
    }
}

#[async_trait]
impl StateStore for CountingStore {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let inserted = self.inner.insert(task).await?;
        // A conditional PutItem; a failed condition (duplicate) bills the write too.
        let size = match &inserted {
            Inserted::New => item_bytes(task),
            Inserted::Exists(existing) => item_bytes(task).max(item_bytes(existing)),
        };
        let index = if inserted == Inserted::New { index_writes(None, index_key(Some(task))) } else { 0.0 };
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += kb_units(size, 1024) + index;
        });
        Ok(inserted)
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        let r = self.inner.task(id).await?;
        let bytes = r.as_ref().map_or(0, item_bytes);
        self.with(|u| {
            u.ddb_gets += 1;
            u.rru += kb_units(bytes, 4096);
        });
        Ok(r)
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        // Billed on the larger of the old and new item; a failed condition bills too.
        let before = self.inner.task(&next.order_id).await?;
        let size = item_bytes(next).max(before.as_ref().map_or(0, item_bytes));
        let written = self.inner.replace(next, expected_revision).await?;
        let index = match written {
            Written::RevisionMoved => 0.0,
            Written::Applied => index_writes(index_key(before.as_ref()), index_key(Some(next))),
        };
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += kb_units(size, 1024) + index;
        });
        Ok(written)
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        let r = self.inner.due(now, limit).await?;
        // A KEYS_ONLY entry: shard, deadline and the table key, well under 100 bytes.
        let bytes: usize = r.iter().map(|id| id.as_str().len() + 40).sum();
        let shards = self.due_shards.max(1) as f64;
        self.with(|u| {
            u.ddb_queries += self.due_shards.max(1) as u64;
            // Eventually consistent: half a unit per 4 KB, at least half a unit per query.
            u.rru += (0.5 * bytes.div_ceil(4096) as f64).max(0.5 * shards);
        });
        Ok(r)
    }
}

pub struct CountingQueues {
    inner: Arc<EmbeddedQueues>,
    usage: Arc<Mutex<AwsUsage>>,
}

#[async_trait]
impl Queues for CountingQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        let n = messages.len() as u64;
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sqs_sends += n.div_ceil(10).max(1);
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sqs_messages_sent += n;
        self.inner.send_batch(queue, messages).await
    }
}

pub struct CountingAlerts {
    inner: RecordingAlerts,
    usage: Arc<Mutex<AwsUsage>>,
}

#[async_trait]
impl Alerts for CountingAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sns_publishes += 1;
        self.inner.raise(alert).await
    }
}

// ------------------------------------------------------------------ the rig

/// The agent's view of a manual clock: it reads the shared time, but its retry sleeps
/// take no simulated time. On one shared manual clock an agent's backoff sleep would jump
/// every other order's time forward, and thousands of orders in flight at once would
/// then miss their complete-by for no reason of their own.
struct NoSleepClock(Arc<ManualClock>);

#[async_trait]
impl Clock for NoSleepClock {
    fn now(&self) -> Timestamp {
        self.0.now()
    }
    async fn sleep_until(&self, _until: Timestamp) {
        tokio::task::yield_now().await;
    }
}

#[derive(Debug, Clone)]
pub struct RigOptions {
    pub workflow: String,
    pub transient_rate: f64,
    pub permanent_rate: f64,
    /// Probability an agent invocation crashes: its message is neither handled nor deleted.
    pub crash_rate: f64,
    pub policy: Policy,
    pub supervisor_period_ms: u64,
    pub seed: u64,
    /// Count AWS usage around the ports.
    pub count: bool,
    /// Orders carry `reply_to` (status updates are sent).
    pub reply_to: bool,
}

impl Default for RigOptions {
    fn default() -> Self {
        RigOptions {
            workflow: "single-step".into(),
            transient_rate: 0.0,
            permanent_rate: 0.0,
            crash_rate: 0.0,
            policy: Policy::default(),
            supervisor_period_ms: 60_000,
            seed: 1,
            count: false,
            reply_to: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Function {
    Submission,
    Scheduler,
    Agent,
}

impl Function {
    fn name(self) -> &'static str {
        match self {
            Function::Submission => "submission",
            Function::Scheduler => "scheduler",
            Function::Agent => "agent",
        }
    }
}

/// Time spent and messages handled per function.
#[derive(Debug, Default)]
struct HandlerTimes {
    nanos: [AtomicU64; 3],
    messages: [AtomicU64; 3],
    batches: [AtomicU64; 3],
}

/// The pipeline in-process: all four handlers over the embedded backend, driven by
/// `drain` (no pump threads, no polling) instead of `sasctl dev`'s pumps.
pub struct Rig {
    pub options: RigOptions,
    pub store: Arc<EmbeddedStore>,
    pub queues: Arc<EmbeddedQueues>,
    pub clock: Arc<dyn Clock>,
    pub manual: Option<Arc<ManualClock>>,
    pub usage: Arc<Mutex<AwsUsage>>,
    pub remote: Arc<InstantRemote>,
    send: Arc<dyn Queues>,
    submission: Submission,
    scheduler: Scheduler,
    agent: Agent,
    pub supervisor: Supervisor,
    dead_letters: [DeadLetters; 3],
    times: HandlerTimes,
    crash_rng: Mutex<fastrand::Rng>,
    pub crashes: Mutex<Vec<(OrderId, Timestamp)>>,
}

impl Rig {
    /// `manual`: a ManualClock starting at 1,000,000 ms (discrete-event runs); else the
    /// system clock.
    pub fn new(options: RigOptions, manual: bool) -> Rig {
        let manual = manual.then(|| Arc::new(ManualClock::at(1_000_000)));
        let clock: Arc<dyn Clock> = match &manual {
            Some(m) => m.clone(),
            None => Arc::new(SystemClock),
        };
        let usage = Arc::new(Mutex::new(AwsUsage::default()));
        let store = Arc::new(EmbeddedStore::new());
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), options.seed));
        for q in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, STATUS] {
            queues.create(q, QueueSettings::default());
        }
        let step = options.policy.step_timeout_ms;
        let qs = |vis: u64, dlq: &str| QueueSettings {
            visibility_timeout_ms: vis,
            max_receives: 5,
            dead_letter: Some(dlq.into()),
            duplicate_rate: 0.0,
        };
        queues.create(ORDERS, qs(60_000, ORDERS_DLQ));
        queues.create(SCHEDULER, qs(90_000, SCHEDULER_DLQ));
        queues.create(AGENT, qs(step * 6, AGENT_DLQ));
        let (state, send, alerts): (Arc<dyn StateStore>, Arc<dyn Queues>, Arc<dyn Alerts>) = if options.count
        {
            (
                Arc::new(CountingStore { inner: store.clone(), usage: usage.clone(), due_shards: 4 }),
                Arc::new(CountingQueues { inner: queues.clone(), usage: usage.clone() }),
                Arc::new(CountingAlerts { inner: RecordingAlerts::default(), usage: usage.clone() }),
            )
        } else {
            (store.clone(), queues.clone(), Arc::new(RecordingAlerts::default()))
        };
        // As the Lambda functions send: each invocation's sends coalesced, the counting
        // wrapper inside so it counts the requests that would reach SQS.
        let send: Arc<dyn Queues> = Arc::new(SendCoalescer::new(send, DEFAULT_MAX_HOLD));
        let metrics: Arc<dyn Metrics> = Arc::new(CountingMetrics::default());
        let random = Arc::new(FastRandom::seeded(options.seed));
        let remote =
            Arc::new(InstantRemote::new(options.transient_rate, options.permanent_rate, options.seed));
        let deps = Deps {
            store: state,
            queues: send.clone(),
            alerts,
            clock: clock.clone(),
            random: random.clone(),
            metrics: metrics.clone(),
        };
        let settings = Settings {
            policy: options.policy,
            workflows: Workflows::builtin(),
            topology: queue_names::topology(),
            reply_to: queue_names::reply_to_rules(),
        };
        let agent_clock: Arc<dyn Clock> = match &manual {
            Some(m) => Arc::new(NoSleepClock(m.clone())),
            None => clock.clone(),
        };
        let agent = Agent::new(
            AgentDeps {
                queues: send.clone(),
                clock: agent_clock,
                random,
                metrics: metrics.clone(),
                remote: remote.clone(),
                scheduler_queue: QueueUrl(SCHEDULER.into()),
            },
            AgentSettings {
                retry: Backoff { base_ms: 100, cap_ms: step / 4 },
                breaker: BreakerPolicy { failure_threshold: 1_000_000, open_ms: 1 },
            },
            settings.workflows.clone(),
        );
        let dl = |source: &str, dlq: &str| DeadLetters {
            queues: send.clone(),
            source: QueueUrl(source.into()),
            dead_letter_queue: QueueUrl(dlq.into()),
            metrics: metrics.clone(),
        };
        Rig {
            submission: Submission::new(deps.clone(), settings.clone()),
            scheduler: Scheduler::new(deps.clone(), settings.clone()),
            agent,
            supervisor: Supervisor::new(deps, settings),
            dead_letters: [dl(ORDERS, ORDERS_DLQ), dl(SCHEDULER, SCHEDULER_DLQ), dl(AGENT, AGENT_DLQ)],
            crash_rng: Mutex::new(fastrand::Rng::with_seed(options.seed ^ 0xc7a5)),
            crashes: Mutex::default(),
            options,
            store,
            queues,
            clock,
            manual,
            usage,
            remote,
            send,
            times: HandlerTimes::default(),
        }
    }

    pub fn order_body(&self, i: usize) -> String {
        let reply = if self.options.reply_to { format!(r#","reply_to":"{STATUS}""#) } else { String::new() };
        format!(
            r#"{{"order_id":"order-{i:08}","customer_id":"cust-{}","items":[{{"sku":"sku-{}","quantity":{}}}],"workflow":"{}"{reply}}}"#,
            i % 97,
            i % 1013,
            1 + i % 4,
            self.options.workflow
        )
    }

    /// Puts `orders` orders on the orders queue, ids `first..first + orders`.
    pub async fn send_orders(&self, first: usize, orders: usize) {
        let url = QueueUrl(ORDERS.into());
        let bodies: Vec<String> = (first..first + orders).map(|i| self.order_body(i)).collect();
        for chunk in bodies.chunks(BATCH) {
            self.queues
                .send_batch(&url, chunk.iter().cloned().map(Outgoing::new).collect())
                .await
                .expect("orders queue exists");
        }
    }

    /// One invocation of `function` on up to 10 messages of its queue, as Lambda's event
    /// source mapping makes it; false if the queue had nothing visible.
    pub async fn invoke(&self, function: Function) -> bool {
        let queue = match function {
            Function::Submission => ORDERS,
            Function::Scheduler => SCHEDULER,
            Function::Agent => AGENT,
        };
        let started = Instant::now();
        let batch = self.queues.receive(queue, BATCH).expect("queue exists");
        if batch.is_empty() {
            return false;
        }
        let mut crashed = Vec::new();
        let receipts: Vec<String> = batch.iter().map(|r| r.receipt.clone()).collect();
        let inbound: Vec<Inbound> = batch
            .into_iter()
            .filter(|r| {
                let crash = function == Function::Agent
                    && self.options.crash_rate > 0.0
                    && self.crash_rng.lock().unwrap_or_else(|p| p.into_inner()).f64()
                        < self.options.crash_rate;
                if crash {
                    crashed.push(r.receipt.clone());
                    if let Ok(req) = sas::domain::AgentRequest::parse(&r.message.body) {
                        self.crashes
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((req.order_id, self.clock.now()));
                    }
                }
                !crash
            })
            .map(|r| Inbound {
                message_id: r.receipt,
                body: r.message.body,
                receive_count: r.message.receive_count,
            })
            .collect();
        let handled = inbound.len() as u64;
        let dl = &self.dead_letters[function as usize];
        let report = match function {
            Function::Submission => run_batch(inbound, dl, |m| self.submission.handle(m)).await,
            Function::Scheduler => run_batch(inbound, dl, |m| self.scheduler.handle(m)).await,
            Function::Agent => run_batch(inbound, dl, |m| self.agent.handle(m)).await,
        };
        let mut deleted = 0;
        for receipt in &receipts {
            if !report.failures.contains(receipt) && !crashed.contains(receipt) {
                self.queues.delete(queue, receipt);
                deleted += 1;
            }
        }
        if self.options.count {
            let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            u.sqs_receives += 1;
            if deleted > 0 {
                u.sqs_deletes += 1;
            }
            *u.invocations.entry(function.name().into()).or_default() += 1;
        }
        let i = function as usize;
        self.times.nanos[i].fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.times.messages[i].fetch_add(handled, Ordering::Relaxed);
        self.times.batches[i].fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Invokes the functions round-robin until no queue has a visible message.
    pub async fn drain(&self) {
        loop {
            let mut any = false;
            for f in [Function::Submission, Function::Scheduler, Function::Agent] {
                // Several batches of one function before moving on, like parallel pollers.
                for _ in 0..4 {
                    if !self.invoke(f).await {
                        break;
                    }
                    any = true;
                }
            }
            if !any {
                return;
            }
        }
    }

    pub fn terminal(&self) -> (usize, usize) {
        let counts = self.store.state_counts();
        let all = counts.values().sum();
        let terminal = counts.iter().filter(|(s, _)| s.is_terminal()).map(|(_, n)| n).sum();
        (terminal, all)
    }

    /// Discrete-event run on the manual clock: drain, then jump to the next event (a
    /// message becoming visible or the next supervisor tick) until `expected` orders are
    /// terminal. Returns the simulated time taken.
    pub async fn run_simulated(&self, expected: usize, first_tick: Timestamp) -> u64 {
        let manual = self.manual.clone().expect("manual clock");
        let start = manual.now();
        let mut next_tick = first_tick;
        let mut supervisor_runs = 0u64;
        loop {
            self.drain().await;
            let (terminal, all) = self.terminal();
            if all >= expected && terminal == all && self.queues.depth(ORDERS) == 0 {
                break;
            }
            let next_msg =
                [ORDERS, SCHEDULER, AGENT].iter().filter_map(|q| self.queues.next_visible(q)).min();
            match next_msg {
                Some(at) if at < next_tick => manual.set(at),
                _ => {
                    manual.set(next_tick);
                    let _ = self.supervisor.sweep().await;
                    supervisor_runs += 1;
                    if self.options.count {
                        *self
                            .usage
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .invocations
                            .entry("supervisor".into())
                            .or_default() += 1;
                    }
                    next_tick = next_tick.plus_ms(self.options.supervisor_period_ms);
                }
            }
            if supervisor_runs > 100_000 {
                break;
            }
        }
        manual.now().millis_since(start)
    }

    /// Microseconds per message and messages per invocation, per function.
    pub fn handler_times(&self) -> BTreeMap<String, HandlerTime> {
        [Function::Submission, Function::Scheduler, Function::Agent]
            .iter()
            .map(|&f| {
                let i = f as usize;
                let nanos = self.times.nanos[i].load(Ordering::Relaxed) as f64;
                let messages = self.times.messages[i].load(Ordering::Relaxed);
                let batches = self.times.batches[i].load(Ordering::Relaxed);
                (
                    f.name().to_owned(),
                    HandlerTime {
                        messages,
                        batches,
                        us_per_message: if messages == 0 { 0.0 } else { nanos / 1_000.0 / messages as f64 },
                    },
                )
            })
            .collect()
    }

    pub fn sender(&self) -> Arc<dyn Queues> {
        self.send.clone()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HandlerTime {
    pub messages: u64,
    pub batches: u64,
    pub us_per_message: f64,
}

// ------------------------------------------------------------------ 1. throughput

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRun {
    pub orders: usize,
    pub processed: usize,
    pub seconds: f64,
    pub orders_per_second: f64,
    pub cpu_us_per_order: f64,
    pub handlers: BTreeMap<String, HandlerTime>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    pub workflow: String,
    pub orders: usize,
    pub workers: usize,
    pub runs: Vec<ThroughputRun>,
    pub median_orders_per_second: f64,
    pub median_cpu_us_per_order: f64,
    pub median_us_per_message: BTreeMap<String, f64>,
}

/// One run: `orders` orders pre-loaded on the orders queue, then `workers` drivers
/// invoke the functions until every order is terminal. The clock is the system clock;
/// the remote service answers at once.
pub async fn throughput_once(workflow: &str, orders: usize, workers: usize, seed: u64) -> ThroughputRun {
    let rig =
        Arc::new(Rig::new(RigOptions { workflow: workflow.into(), seed, ..RigOptions::default() }, false));
    rig.send_orders(0, orders).await;
    let cpu = cpu_time();
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let rig = rig.clone();
            tokio::spawn(async move { rig.drain().await })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    // A worker may stop while another still produces: finish on this one.
    rig.drain().await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu).as_secs_f64();
    let processed = rig.store.state_counts().get(&ProcessState::Processed).copied().unwrap_or(0);
    ThroughputRun {
        orders,
        processed,
        seconds,
        orders_per_second: processed as f64 / seconds,
        cpu_us_per_order: cpu * 1e6 / orders.max(1) as f64,
        handlers: rig.handler_times(),
    }
}

pub async fn throughput(workflow: &str, orders: usize, workers: usize, repeats: usize) -> ThroughputReport {
    let mut runs = Vec::new();
    for r in 0..repeats.max(1) {
        runs.push(throughput_once(workflow, orders, workers, 1 + r as u64).await);
    }
    let mut ops: Vec<f64> = runs.iter().map(|r| r.orders_per_second).collect();
    let mut cpu: Vec<f64> = runs.iter().map(|r| r.cpu_us_per_order).collect();
    let mut per: BTreeMap<String, f64> = BTreeMap::new();
    for name in ["submission", "scheduler", "agent"] {
        let mut v: Vec<f64> =
            runs.iter().filter_map(|r| r.handlers.get(name)).map(|h| h.us_per_message).collect();
        per.insert(name.into(), median(&mut v));
    }
    ThroughputReport {
        workflow: workflow.into(),
        orders,
        workers,
        median_orders_per_second: median(&mut ops),
        median_cpu_us_per_order: median(&mut cpu),
        median_us_per_message: per,
        runs,
    }
}

// ------------------------------------------------------------------ 2. sweep cost

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub finished: usize,
    pub due: usize,
    /// Index entries read by the sweep (`EmbeddedStore::due_items_read`).
    pub items_read: u64,
    /// Strongly consistent re-reads of the tasks found, before each recovery.
    pub task_reads: u64,
    pub recovered: usize,
    pub sweep_ms: f64,
}

fn bench_order(id: &str) -> Order {
    Order {
        order_id: OrderId::parse(id).expect("valid id"),
        customer_id: "cust-1".into(),
        items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
        workflow: "single-step".into(),
        workflow_version: None,
    }
}

/// 100 (`due`) due tasks among `finished` terminal ones, inserted through the store
/// port; one supervisor sweep.
pub async fn sweep_once(finished: usize, due: usize) -> SweepRow {
    let manual = Arc::new(ManualClock::at(1_000_000));
    let policy = Policy::default();
    let store = Arc::new(EmbeddedStore::new());
    let usage = Arc::new(Mutex::new(AwsUsage::default()));
    for i in 0..finished {
        let order = bench_order(&format!("done-{i:08}"));
        let mut task = TaskRecord::new(&order, None, manual.now(), &policy);
        task.state = ProcessState::Processed;
        task.deadline = None;
        task.step = 1;
        store.insert(&task).await.expect("insert");
    }
    for i in 0..due {
        let order = bench_order(&format!("due-{i:08}"));
        let task = TaskRecord::new(&order, None, manual.now(), &policy);
        store.insert(&task).await.expect("insert");
    }
    manual.advance(policy.pending_timeout_ms + 1);
    let queues = Arc::new(EmbeddedQueues::new(manual.clone(), 1));
    queues.create(SCHEDULER, QueueSettings::default());
    queues.create(AGENT, QueueSettings::default());
    let counting = Arc::new(CountingStore { inner: store.clone(), usage: usage.clone(), due_shards: 4 });
    let deps = Deps {
        store: counting,
        queues,
        alerts: Arc::new(RecordingAlerts::default()),
        clock: manual.clone(),
        random: Arc::new(FastRandom::seeded(1)),
        metrics: Arc::new(CountingMetrics::default()),
    };
    let settings = Settings {
        policy,
        workflows: Workflows::builtin(),
        topology: queue_names::topology(),
        reply_to: queue_names::reply_to_rules(),
    };
    let supervisor = Supervisor::new(deps, settings);
    let before = store.due_items_read();
    let started = Instant::now();
    let report = supervisor.sweep().await.expect("sweep");
    let sweep_ms = started.elapsed().as_secs_f64() * 1e3;
    let usage = usage.lock().unwrap_or_else(|p| p.into_inner()).clone();
    SweepRow {
        finished,
        due,
        items_read: store.due_items_read() - before,
        task_reads: usage.ddb_gets,
        recovered: report.retried + report.gave_up,
        sweep_ms,
    }
}

// ------------------------------------------------------------------ 3. recovery latency

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryReport {
    pub orders: usize,
    pub crashes: usize,
    pub step_timeout_ms: u64,
    pub reply_grace_ms: u64,
    pub pending_timeout_ms: u64,
    pub supervisor_period_ms: u64,
    pub retry_base_ms: u64,
    /// Crash to Processed, simulated ms.
    pub p50_ms: u64,
    pub p90_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
    pub min_ms: u64,
    /// max(step timeout + reply grace, pending timeout) + supervisor period + first
    /// retry backoff (max).
    pub bound_ms: u64,
    pub within_bound: usize,
    pub all_processed: bool,
}

/// `orders` single-step orders, each in a world of its own on a manual clock. Each
/// order's agent crashes on its first attempt at a uniformly random time within the
/// step timeout, and the supervisor's phase is uniformly random: the distribution of
/// crash-to-completion times over those two.
pub async fn recovery(orders: usize, policy: Policy, supervisor_period_ms: u64, seed: u64) -> RecoveryReport {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut latencies = Vec::new();
    let mut all_processed = true;
    for i in 0..orders {
        let rig = Rig::new(
            RigOptions {
                workflow: "single-step".into(),
                policy,
                supervisor_period_ms,
                seed: seed.wrapping_add(i as u64),
                reply_to: false,
                ..RigOptions::default()
            },
            true,
        );
        let manual = rig.manual.clone().expect("manual");
        rig.send_orders(i, 1).await;
        // Submission and claim, then the agent receives its request and crashes.
        rig.invoke(Function::Submission).await;
        rig.invoke(Function::Scheduler).await;
        let got = rig.queues.receive(AGENT, 1).expect("agent queue");
        let crash_at = manual.advance(rng.u64(0..policy.step_timeout_ms));
        drop(got); // never deleted, never answered: redelivered after the visibility timeout
        let first_tick = manual.now().plus_ms(rng.u64(0..supervisor_period_ms.max(1)));
        rig.run_simulated(1, first_tick).await;
        let task = rig.store.tasks().pop().expect("one task");
        all_processed &= task.state == ProcessState::Processed;
        latencies.push(task.updated_at.millis_since(crash_at));
    }
    latencies.sort_unstable();
    // The claim keeps the pending deadline when it covers complete-by + grace (it does
    // here: the claim comes at once), so the supervisor acts at the later of the two.
    let deadline_after_claim =
        (policy.step_timeout_ms + policy.reply_grace_ms).max(policy.pending_timeout_ms);
    let bound = deadline_after_claim + supervisor_period_ms + policy.retry_backoff.base_ms;
    RecoveryReport {
        orders,
        crashes: orders,
        step_timeout_ms: policy.step_timeout_ms,
        reply_grace_ms: policy.reply_grace_ms,
        pending_timeout_ms: policy.pending_timeout_ms,
        supervisor_period_ms,
        retry_base_ms: policy.retry_backoff.base_ms,
        p50_ms: percentile(&latencies, 50.0),
        p90_ms: percentile(&latencies, 90.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0),
        min_ms: latencies.first().copied().unwrap_or(0),
        bound_ms: bound,
        within_bound: latencies.iter().filter(|&&l| l <= bound).count(),
        all_processed,
    }
}

// ------------------------------------------------------------------ 4. cost per order

/// Published us-east-1 prices (November 2026 list prices; see docs/BENCHMARKS.md).
pub mod prices {
    pub const DDB_PER_MILLION_WRU: f64 = 0.625;
    pub const DDB_PER_MILLION_RRU: f64 = 0.125;
    pub const SQS_PER_MILLION_REQUESTS: f64 = 0.40;
    pub const SNS_PER_MILLION_PUBLISHES: f64 = 0.50;
    pub const LAMBDA_PER_MILLION_REQUESTS: f64 = 0.20;
    pub const LAMBDA_ARM_PER_GB_SECOND: f64 = 0.000_013_333_4;
    pub const SFN_STANDARD_PER_TRANSITION: f64 = 0.025 / 1_000.0;
    pub const SFN_EXPRESS_PER_MILLION_REQUESTS: f64 = 1.00;
    pub const SFN_EXPRESS_PER_GB_SECOND: f64 = 0.000_016_67;
}

#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    pub workflow: String,
    pub failures: bool,
    pub orders: usize,
    pub processed: usize,
    pub compensated: usize,
    pub failed: usize,
    pub remote_calls_per_order: f64,
    pub per_order: BTreeMap<String, f64>,
    /// Dollars per million orders, by service, and the total.
    pub dollars_per_million: BTreeMap<String, f64>,
    pub sas_total: f64,
    pub step_functions_standard: f64,
    pub step_functions_express: f64,
}

#[derive(Debug, Clone)]
pub struct CostAssumptions {
    pub memory_mb: u64,
    /// Billed duration of one invocation (a batch of up to 10 messages handled concurrently).
    pub invocation_ms: u64,
    /// Duration of one remote call, for Express's duration charge and its Lambda task.
    pub remote_call_ms: u64,
}

impl Default for CostAssumptions {
    fn default() -> Self {
        CostAssumptions { memory_mb: 256, invocation_ms: 50, remote_call_ms: 50 }
    }
}

pub async fn cost(workflow: &str, orders: usize, failures: bool, a: &CostAssumptions) -> CostRow {
    let policy = Policy::default();
    let (transient, permanent, crash) = if failures { (0.10, 0.01, 0.02) } else { (0.0, 0.0, 0.0) };
    let rig = Rig::new(
        RigOptions {
            workflow: workflow.into(),
            transient_rate: transient,
            permanent_rate: permanent,
            crash_rate: crash,
            policy,
            supervisor_period_ms: 60_000,
            seed: 7,
            count: true,
            reply_to: true,
        },
        true,
    );
    rig.send_orders(0, orders).await;
    let first_tick = rig.clock.now().plus_ms(60_000);
    rig.run_simulated(orders, first_tick).await;
    let counts = rig.store.state_counts();
    let u = rig.usage.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let n = orders.max(1) as f64;
    let calls = rig.remote.calls.load(Ordering::Relaxed) as f64;
    // Function invocations the pipeline made (the supervisor's runs are on a schedule,
    // not per order: a fixed 43,200 a month at rate(1 minute), left out here).
    let invocations: u64 =
        u.invocations.iter().filter(|(k, _)| k.as_str() != "supervisor").map(|(_, v)| v).sum();
    let gb_s = invocations as f64 * (a.memory_mb as f64 / 1024.0) * (a.invocation_ms as f64 / 1000.0);
    // The application's own SendMessage of each order, as in Step Functions' intake below.
    let order_sends = n;
    let sqs_requests = order_sends + (u.sqs_sends + u.sqs_receives + u.sqs_deletes) as f64;
    let per_order: BTreeMap<String, f64> = [
        ("ddb_wru", u.wru / n),
        ("ddb_rru", u.rru / n),
        ("ddb_requests", (u.ddb_gets + u.ddb_puts) as f64 / n),
        ("sqs_order_sends", order_sends / n),
        ("sqs_sends", u.sqs_sends as f64 / n),
        ("sqs_receives", u.sqs_receives as f64 / n),
        ("sqs_deletes", u.sqs_deletes as f64 / n),
        ("sns_publishes", u.sns_publishes as f64 / n),
        ("lambda_invocations", invocations as f64 / n),
        ("lambda_gb_seconds", gb_s / n),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    use prices::*;
    let m = 1e6 / n;
    let dollars: BTreeMap<String, f64> = [
        ("dynamodb", (u.wru * DDB_PER_MILLION_WRU + u.rru * DDB_PER_MILLION_RRU) / 1e6 * m),
        ("sqs", sqs_requests * SQS_PER_MILLION_REQUESTS / 1e6 * m),
        ("sns", u.sns_publishes as f64 * SNS_PER_MILLION_PUBLISHES / 1e6 * m),
        ("lambda_requests", invocations as f64 * LAMBDA_PER_MILLION_REQUESTS / 1e6 * m),
        ("lambda_duration", gb_s * LAMBDA_ARM_PER_GB_SECOND * m),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let sas_total = dollars.values().sum();
    // Step Functions doing the scheduler's and supervisor's work: one Task state per
    // remote call (a Retry is a transition too), one terminal state per order; each Task
    // invokes the agent Lambda once, unbatched. Intake (orders queue -> StartExecution)
    // costs one SQS send + receive/delete at batch 10 + one Lambda invocation per 10.
    let transitions = calls + n;
    let agent_lambda = calls
        * (LAMBDA_PER_MILLION_REQUESTS / 1e6
            + (a.memory_mb as f64 / 1024.0) * (a.remote_call_ms as f64 / 1000.0) * LAMBDA_ARM_PER_GB_SECOND);
    let intake = n * (1.2 * SQS_PER_MILLION_REQUESTS / 1e6 + 0.1 * LAMBDA_PER_MILLION_REQUESTS / 1e6);
    let standard = (transitions * SFN_STANDARD_PER_TRANSITION + agent_lambda + intake) * m;
    // Express: per execution, billed in 100 ms steps at 64 MB (the minimum).
    let express_ms = (calls / n * a.remote_call_ms as f64 / 100.0).ceil() * 100.0;
    let express = (n
        * (SFN_EXPRESS_PER_MILLION_REQUESTS / 1e6
            + 0.0625 * express_ms / 1000.0 * SFN_EXPRESS_PER_GB_SECOND)
        + agent_lambda
        + intake)
        * m;
    CostRow {
        workflow: workflow.into(),
        failures,
        orders,
        processed: counts.get(&ProcessState::Processed).copied().unwrap_or(0),
        compensated: counts.get(&ProcessState::Compensated).copied().unwrap_or(0),
        failed: counts.get(&ProcessState::Error).copied().unwrap_or(0),
        remote_calls_per_order: calls / n,
        per_order,
        dollars_per_million: dollars,
        sas_total,
        step_functions_standard: standard,
        step_functions_express: express,
    }
}

// ------------------------------------------------------------------ the command

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// End-to-end orders/s, CPU per order, microseconds per message per handler.
    Throughput {
        #[arg(long, default_value_t = 100_000)]
        orders: usize,
        /// single-step, three-step or both.
        #[arg(long, default_value = "both")]
        workflow: String,
        /// Concurrent drivers (tokio tasks on the runtime's worker threads).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Runs per workflow; medians are quoted.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// Items read per supervisor sweep with 100 due tasks among N finished ones.
    Sweep {
        /// Finished-task counts, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,1000000")]
        finished: Vec<usize>,
        #[arg(long, default_value_t = 100)]
        due: usize,
    },
    /// Simulated time from an agent crash to the order's completion.
    Recovery {
        #[arg(long, default_value_t = 1_000)]
        orders: usize,
        #[arg(long, default_value_t = 30_000)]
        step_timeout_ms: u64,
        #[arg(long, default_value_t = 10_000)]
        reply_grace_ms: u64,
        /// A waiting task's deadline; a prompt claim keeps it when it covers the attempt.
        #[arg(long, default_value_t = 60_000)]
        pending_timeout_ms: u64,
        #[arg(long, default_value_t = 60_000)]
        supervisor_period_ms: u64,
        /// Base of the supervisor's retry backoff (the first retry waits up to this).
        #[arg(long, default_value_t = 1_000)]
        retry_base_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// AWS requests, billed units and dollars per million orders, against Step Functions.
    Cost {
        #[arg(long, default_value_t = 10_000)]
        orders: usize,
        #[arg(long, default_value_t = 256)]
        memory_mb: u64,
        #[arg(long, default_value_t = 50)]
        invocation_ms: u64,
        #[arg(long, default_value_t = 50)]
        remote_call_ms: u64,
    },
    /// Launch function binaries against a stub Lambda Runtime API and a local HTTPS stub
    /// of AWS (and the remote service): init time, first invocation including its first
    /// TLS connection, peak RSS.
    ColdStart {
        /// Function binaries (e.g. target/release/submission).
        #[arg(required = true)]
        binaries: Vec<std::path::PathBuf>,
        #[arg(long, default_value_t = 7)]
        repeats: usize,
    },
}

fn workflows(arg: &str) -> Vec<&'static str> {
    match arg {
        "single-step" => vec!["single-step"],
        "three-step" => vec!["three-step"],
        _ => vec!["single-step", "three-step"],
    }
}

fn emit<T: Serialize>(json: bool, value: &T, text: impl FnOnce(&T) -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
    } else {
        println!("{}", text(value));
    }
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    match args.what {
        BenchCommand::Throughput { orders, workflow, workers, repeats } => {
            let mut reports = Vec::new();
            for wf in workflows(&workflow) {
                reports.push(throughput(wf, orders, workers, repeats).await);
            }
            emit(args.json, &reports, |reports| {
                let mut out = String::new();
                for r in reports {
                    out += &format!(
                        "{}: {} orders x {} runs, {} worker(s)\n  median {:.0} orders/s, {:.1} us CPU per order\n",
                        r.workflow,
                        r.orders,
                        r.runs.len(),
                        r.workers,
                        r.median_orders_per_second,
                        r.median_cpu_us_per_order
                    );
                    for (h, us) in &r.median_us_per_message {
                        out += &format!("  {h:<10} {us:.2} us/message\n");
                    }
                    let all: Vec<String> =
                        r.runs.iter().map(|x| format!("{:.0}", x.orders_per_second)).collect();
                    out += &format!("  runs (orders/s): {}\n", all.join(" "));
                }
                out
            });
        }
        BenchCommand::Sweep { finished, due } => {
            let mut rows = Vec::new();
            for n in finished {
                rows.push(sweep_once(n, due).await);
            }
            emit(args.json, &rows, |rows| {
                let mut out =
                    "finished  due  index items read  task re-reads  recovered  sweep ms\n".to_owned();
                for r in rows {
                    out += &format!(
                        "{:>8}  {:>3}  {:>16}  {:>13}  {:>9}  {:>8.2}\n",
                        r.finished, r.due, r.items_read, r.task_reads, r.recovered, r.sweep_ms
                    );
                }
                out
            });
        }
        BenchCommand::Recovery {
            orders,
            step_timeout_ms,
            reply_grace_ms,
            pending_timeout_ms,
            supervisor_period_ms,
            retry_base_ms,
            seed,
        } => {
            let mut policy =
                Policy { step_timeout_ms, reply_grace_ms, pending_timeout_ms, ..Policy::default() };
            policy.retry_backoff.base_ms = retry_base_ms;
            let r = recovery(orders, policy, supervisor_period_ms, seed).await;
            emit(args.json, &r, |r| {
                format!(
                    "{} crashes; step timeout {} ms, reply grace {} ms, pending timeout {} ms, supervisor period {} ms, retry base {} ms\n\
                     crash -> processed (simulated ms): min {} p50 {} p90 {} p99 {} max {}\n\
                     bound (max(timeout + grace, pending) + period + retry base): {} ms; within bound {}/{}; all processed: {}\n",
                    r.crashes,
                    r.step_timeout_ms,
                    r.reply_grace_ms,
                    r.pending_timeout_ms,
                    r.supervisor_period_ms,
                    r.retry_base_ms,
                    r.min_ms,
                    r.p50_ms,
                    r.p90_ms,
                    r.p99_ms,
                    r.max_ms,
                    r.bound_ms,
                    r.within_bound,
                    r.orders,
                    r.all_processed
                )
            });
        }
        BenchCommand::Cost { orders, memory_mb, invocation_ms, remote_call_ms } => {
            let a = CostAssumptions { memory_mb, invocation_ms, remote_call_ms };
            let mut rows = Vec::new();
            for wf in ["single-step", "three-step"] {
                for failures in [false, true] {
                    rows.push(cost(wf, orders, failures, &a).await);
                }
            }
            emit(args.json, &rows, |rows| {
                let mut out = String::new();
                for r in rows {
                    out += &format!(
                        "{} {} ({} orders: {} processed, {} compensated, {} error; {:.3} remote calls/order)\n",
                        r.workflow,
                        if r.failures { "with failures" } else { "no failures" },
                        r.orders,
                        r.processed,
                        r.compensated,
                        r.failed,
                        r.remote_calls_per_order
                    );
                    let per: Vec<String> = r.per_order.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
                    out += &format!("  per order: {}\n", per.join(", "));
                    let d: Vec<String> =
                        r.dollars_per_million.iter().map(|(k, v)| format!("{k} ${v:.2}")).collect();
                    out += &format!("  $/million orders: {}\n", d.join(", "));
                    out += &format!(
                        "  sas ${:.2}  |  Step Functions Standard ${:.2}  Express ${:.2}\n",
                        r.sas_total, r.step_functions_standard, r.step_functions_express
                    );
                }
                out
            });
        }
        BenchCommand::ColdStart { binaries, repeats } => {
            let mut reports = Vec::new();
            for b in &binaries {
                reports.push(cold_start(b, repeats).await.map_err(|e| format!("{}: {e}", b.display()))?);
            }
            emit(args.json, &reports, |reports| {
                let mut out =
                    "binary                  bytes  init ms  init+first ms  CPU ms  peak RSS MB  TLS conns  ok runs\n"
                        .to_owned();
                for r in reports {
                    out += &format!(
                        "{:<18} {:>10}  {:>7.2}  {:>13.2}  {:>6.2}  {:>11.1}  {:>9}  {}/{}\n",
                        short_path(&r.binary),
                        r.binary_bytes,
                        r.median_init_ms,
                        r.median_first_invocation_ms,
                        r.median_cpu_ms,
                        r.median_peak_rss_kib / 1024.0,
                        r.runs.first().map_or(0, |x| x.tls_connections),
                        r.ok_runs,
                        r.runs.len(),
                    );
                    if let Some(first) = r.runs.first() {
                        let calls: Vec<&str> = first.calls.iter().map(|c| c.call.as_str()).collect();
                        out += &format!("  run 1: {}; calls: {}\n", first.outcome, calls.join(", "));
                    }
                    for (i, run) in r.runs.iter().enumerate().skip(1).filter(|(_, x)| x.outcome != "ok") {
                        out += &format!("  run {}: {}\n", i + 1, run.outcome);
                    }
                    let firsts: Vec<String> =
                        r.runs.iter().map(|x| format!("{:.1}", x.first_invocation_ms)).collect();
                    out += &format!("  init+first per run (ms): {}\n", firsts.join(" "));
                }
                if let Some(r) = reports.first() {
                    out += &format!("root store: {} certificates (SSL_CERT_FILE)\n", r.root_certificates);
                }
                out
            });
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ 5. cold start

#[derive(Debug, Clone, Serialize)]
pub struct ColdStartRun {
    /// Process launch to its first `GET .../invocation/next`.
    pub init_ms: f64,
    /// Launch to the first invocation's response (or error) POST: init, then the event's
    /// work, with every AWS call (and the agent's remote call) over a first TLS connection.
    pub first_invocation_ms: f64,
    /// Peak RSS (VmHWM) after the first invocation, KiB.
    pub peak_rss_kib: u64,
    /// CPU time of all the process's threads up to the first invocation's response
    /// (`/proc/PID/task/*/schedstat`). On Lambda a function gets CPU in proportion to its
    /// memory (1 vCPU at 1,769 MB), so this is the part of the cold start that stretches.
    pub cpu_ms: f64,
    /// TLS handshakes the HTTPS stub completed during the run.
    pub tls_connections: u64,
    /// The requests the HTTPS stub answered, in order.
    pub calls: Vec<StubCall>,
    /// `ok`, or what went wrong (see [`judge`]).
    pub outcome: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColdStartReport {
    pub binary: String,
    pub binary_bytes: u64,
    /// Which function's first event the binary got (from its file name), if any.
    pub function: Option<String>,
    /// Certificates in the root store the binary was given (`SSL_CERT_FILE`).
    pub root_certificates: usize,
    pub runs: Vec<ColdStartRun>,
    pub ok_runs: usize,
    pub median_init_ms: f64,
    pub median_first_invocation_ms: f64,
    pub median_peak_rss_kib: f64,
    pub median_cpu_ms: f64,
}

/// A function's first event and the calls that event must make. Each requirement is a
/// list of alternatives; one of the stub's call labels must equal an alternative or
/// extend it (`sqs SendMessageBatch bench-scheduler` matches `... bench-scheduler x1`).
#[derive(Debug, Clone)]
pub struct ColdStartCase {
    pub function: Option<&'static str>,
    pub event: String,
    pub required: Vec<Vec<&'static str>>,
}

pub const BENCH_STATE_TABLE: &str = "bench-state";

fn bench_queue_url(name: &str) -> String {
    format!("https://sqs.us-east-1.amazonaws.com/000000000000/bench-{name}")
}

fn sqs_event(queue: &str, body: String) -> String {
    let now = SystemClock.now().0.to_string();
    serde_json::json!({"Records": [{
        "messageId": "00000000-0000-0000-0000-00000000000a",
        "receiptHandle": "bench-receipt",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now,
            "SenderId": "000000000000",
            "ApproximateFirstReceiveTimestamp": now,
        },
        "messageAttributes": {},
        "md5OfBody": "-",
        "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:us-east-1:000000000000:bench-{queue}"),
        "awsRegion": "us-east-1",
    }]})
    .to_string()
}

/// The first event each function gets, chosen by the binary's file name, so that the
/// invocation does its real work against the HTTPS stub:
///
/// - submission: one valid order -> the task (and order) write, `Schedule` to the
///   scheduler's queue;
/// - scheduler: `Schedule` for an order the stub's GetItem does not find -> the message
///   is rejected and kept in the scheduler's DLQ (a GetItem and a send);
/// - agent: a request for the single-step workflow's step -> the remote POST (200), the
///   reply to the scheduler's queue;
/// - supervisor: a scheduled event -> the sweep's queries of the due index (empty).
///
/// Any other binary gets an empty SQS batch and is only checked to answer it.
pub fn cold_start_case(binary: &std::path::Path) -> ColdStartCase {
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let order_id = OrderId::parse("bench-order-1").expect("a valid id");
    let scheduler_send = vec!["sqs SendMessageBatch bench-scheduler", "sqs SendMessage bench-scheduler"];
    match name {
        "submission" => {
            let order = sas::domain::OrderRequest {
                order_id,
                customer_id: "bench-customer".into(),
                items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
                workflow: None,
                workflow_version: None,
                reply_to: None,
            };
            ColdStartCase {
                function: Some("submission"),
                event: sqs_event("orders", serde_json::to_string(&order).expect("serializes")),
                required: vec![vec!["dynamodb PutItem", "dynamodb TransactWriteItems"], scheduler_send],
            }
        }
        "scheduler" => ColdStartCase {
            function: Some("scheduler"),
            event: sqs_event("scheduler", sas::domain::SchedulerMessage::Schedule { order_id }.to_body()),
            required: vec![
                vec!["dynamodb GetItem"],
                vec!["sqs SendMessageBatch bench-scheduler-dlq", "sqs SendMessage bench-scheduler-dlq"],
            ],
        },
        "agent" => {
            let order = Order {
                order_id: order_id.clone(),
                customer_id: "bench-customer".into(),
                items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
                workflow: "single-step".into(),
                workflow_version: None,
            };
            // A request the scheduler could have sent: the agent checks it against its
            // workflows (key included) before calling anything.
            let idempotency_key = sas::domain::idempotency_key(&order_id, 0, sas::domain::Action::Do);
            let request = sas::domain::AgentRequest {
                order_id,
                workflow: "single-step".into(),
                workflow_version: 1,
                step: 0,
                step_name: "process-order".into(),
                agent: "orders".into(),
                action: sas::domain::Action::Do,
                attempt: 1,
                lease: sas::domain::LeaseToken(uuid::Uuid::new_v4()),
                complete_by: SystemClock.now().plus_ms(60_000),
                idempotency_key,
                order,
                outputs: Default::default(),
                reply_queue: None,
            };
            ColdStartCase {
                function: Some("agent"),
                event: sqs_event("agent", request.to_body()),
                required: vec![vec!["remote POST /remote/orders/process-order"], scheduler_send],
            }
        }
        "supervisor" => ColdStartCase {
            function: Some("supervisor"),
            event: r#"{"version":"0","id":"e-1","detail-type":"Scheduled Event","source":"aws.events","account":"000000000000","time":"2026-11-21T00:00:00Z","region":"us-east-1","resources":[],"detail":{}}"#.into(),
            required: vec![vec!["dynamodb Query"]],
        },
        _ => ColdStartCase { function: None, event: r#"{"Records":[]}"#.into(), required: vec![] },
    }
}

/// `ok` when the invocation answered with a success, reported no failed batch item (SQS)
/// or sweep error (supervisor), every request the stub saw was one it serves, and every
/// required call was made; otherwise what went wrong.
pub fn judge(case: &ColdStartCase, response: Option<&(String, String)>, calls: &[StubCall]) -> String {
    let Some((path, body)) = response else { return "no response".into() };
    if path.ends_with("/init/error") {
        return format!("init error: {}", body.chars().take(300).collect::<String>());
    }
    if !path.ends_with("/response") {
        return format!("error response: {}", body.chars().take(300).collect::<String>());
    }
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    if let Some(failures) = json.get("batchItemFailures").and_then(|f| f.as_array())
        && !failures.is_empty()
    {
        return format!("{} failed batch item(s)", failures.len());
    }
    if let Some(errors) = json.get("errors").and_then(|e| e.as_u64())
        && errors > 0
    {
        return format!("sweep reported {errors} error(s)");
    }
    if let Some(bad) = calls.iter().find(|c| c.status >= 300) {
        return format!("refused by the stub: {} ({})", bad.call, bad.status);
    }
    for alternatives in &case.required {
        let made = calls.iter().any(|c| {
            alternatives
                .iter()
                .any(|a| c.call == *a || c.call.strip_prefix(a).is_some_and(|r| r.starts_with(' ')))
        });
        if !made {
            return format!("missing call: {}", alternatives.join(" or "));
        }
    }
    "ok".into()
}

/// Launches `binary` against a stub Lambda Runtime API on loopback (TCP_NODELAY), hands
/// it one event, and times init and the first invocation; the binary's AWS endpoint and
/// remote service are `stub`, trusted through `SSL_CERT_FILE`.
pub async fn cold_start_once(
    binary: &std::path::Path,
    case: &ColdStartCase,
    stub: &AwsStub,
) -> std::io::Result<ColdStartRun> {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let _ = stub.take();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_MAX_ATTEMPTS", "1")
        // One stub, two host names, so DynamoDB and SQS get a connection each, as on AWS
        // (where they are different hosts); SNS (unused by these events) falls back to
        // AWS_ENDPOINT_URL.
        .env("AWS_ENDPOINT_URL", stub.endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", stub.endpoint())
        .env("AWS_ENDPOINT_URL_SQS", stub.endpoint_by_ip())
        // The only roots the binary's TLS clients load (no SSL_CERT_DIR: env cleared).
        .env("SSL_CERT_FILE", &stub.roots_file)
        .env("STATE_TABLE", BENCH_STATE_TABLE)
        .env("ORDERS_QUEUE_URL", bench_queue_url("orders"))
        .env("ORDERS_DLQ_URL", bench_queue_url("orders-dlq"))
        .env("SCHEDULER_QUEUE_URL", bench_queue_url("scheduler"))
        .env("SCHEDULER_DLQ_URL", bench_queue_url("scheduler-dlq"))
        .env("AGENT_QUEUE_URL", bench_queue_url("agent"))
        .env("AGENT_DLQ_URL", bench_queue_url("agent-dlq"))
        .env("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:bench")
        .env("STATUS_QUEUE_ARN", "arn:aws:sqs:us-east-1:000000000000:bench-status")
        .env("REMOTE_SERVICE_URL", format!("{}/remote", stub.endpoint()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    // (what, ms since launch, body): "next" or the path of a POST.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, f64, String)>();
    let event: Arc<str> = case.event.as_str().into();
    let server = tokio::spawn(async move {
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        loop {
            let Ok((socket, _)) = listener.accept().await else { return };
            let _ = socket.set_nodelay(true);
            let (tx, first, event) = (tx.clone(), first.clone(), event.clone());
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(socket);
                while let Ok(Some(request)) = read_request(&mut stream).await {
                    let at = started.elapsed().as_secs_f64() * 1e3;
                    if request.method == "GET" && request.path.ends_with("/invocation/next") {
                        let _ = tx.send(("next".into(), at, String::new()));
                        if !first.swap(false, Ordering::SeqCst) {
                            return; // second `next`: never answered
                        }
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nLambda-Runtime-Aws-Request-Id: req-1\r\n\
                             Lambda-Runtime-Deadline-Ms: {}\r\nLambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:000000000000:function:bench\r\n\
                             Lambda-Runtime-Trace-Id: Root=1-0-0\r\nContent-Length: {}\r\n\r\n",
                            std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap_or_default()
                                .as_millis()
                                + 60_000,
                            event.len()
                        );
                        let _ = stream.get_mut().write_all(head.as_bytes()).await;
                        let _ = stream.get_mut().write_all(event.as_bytes()).await;
                    } else {
                        let _ = stream
                            .get_mut()
                            .write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        let _ =
                            tx.send((request.path, at, String::from_utf8_lossy(&request.body).into_owned()));
                    }
                }
            });
        }
    });
    let mut init_ms = None;
    let mut first_ms = None;
    let mut response = None;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some((what, at, body)) = rx.recv().await {
            if what == "next" {
                if init_ms.is_none() {
                    init_ms = Some(at);
                } else {
                    return;
                }
            } else if what.ends_with("/init/error") {
                response = Some((what, body));
                return;
            } else if first_ms.is_none() && what.contains("/invocation/") {
                first_ms = Some(at);
                response = Some((what, body));
            }
        }
    })
    .await;
    server.abort();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cpu_ms = process_cpu_ms(pid);
    let _ = child.kill().await;
    let (calls, tls_connections) = stub.take();
    Ok(ColdStartRun {
        init_ms: init_ms.unwrap_or(f64::NAN),
        first_invocation_ms: first_ms.unwrap_or(f64::NAN),
        peak_rss_kib,
        cpu_ms,
        tls_connections,
        outcome: judge(case, response.as_ref(), &calls),
        calls,
    })
}

/// The file name and its directory's (`ring/agent`): enough to tell builds apart.
fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// CPU time of every thread of process `pid` so far, from the scheduler's statistics
/// (nanoseconds, unlike `/proc/PID/stat`'s 10 ms ticks); NaN where they are not available.
fn process_cpu_ms(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return f64::NAN };
    let mut ns = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else { return f64::NAN };
        ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    ns as f64 / 1e6
}

pub async fn cold_start(binary: &std::path::Path, repeats: usize) -> std::io::Result<ColdStartReport> {
    let case = cold_start_case(binary);
    let stub = AwsStub::start(&std::env::temp_dir()).await?;
    let mut runs = Vec::new();
    for _ in 0..repeats.max(1) {
        runs.push(cold_start_once(binary, &case, &stub).await?);
    }
    let med = |f: &dyn Fn(&ColdStartRun) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    Ok(ColdStartReport {
        binary: binary.display().to_string(),
        binary_bytes: std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0),
        function: case.function.map(str::to_owned),
        root_certificates: stub.roots,
        ok_runs: runs.iter().filter(|r| r.outcome == "ok").count(),
        median_init_ms: med(&|r| r.init_ms),
        median_first_invocation_ms: med(&|r| r.first_invocation_ms),
        median_peak_rss_kib: med(&|r| r.peak_rss_kib as f64),
        median_cpu_ms: med(&|r| r.cpu_ms),
        runs,
    })
}
