//! The rig: the whole pipeline in-process on the embedded backend, invoked the way
//! Lambda's event source mappings invoke it, on the system clock or a manual one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use serde::Serialize;

use sas::adapters::embedded::queue_names::{self, *};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::{FastRandom, SystemClock};
use sas::domain::breaker::BreakerPolicy;
use sas::domain::retry::Backoff;
use sas::domain::{OrderId, Policy, Timestamp, Workflows};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchOrder, Callbacks, DEFAULT_MAX_HOLD, DeadLetters, Deps, Inbound,
    Scheduler, SendCoalescer, Settings, Submission, Supervisor, run_batch, run_batch_in,
};
use sas::ports::{Alerts, CallStarts, Clock, Metrics, Outgoing, QueueUrl, Queues, StateStore};

use super::counting::{AwsUsage, CountingAlerts, CountingQueues, CountingStore, RoundTrips};
use super::remote::InstantRemote;

/// Messages per receive, as the event source mappings' batch size.
const BATCH: usize = 10;
/// The callback queue and its dead-letter queue: the scheduler's second event source.
const CALLBACKS: &str = "callbacks";
const CALLBACKS_DLQ: &str = "callbacks-dlq";
/// The benchmarks' own workflow beside the built-in ones: a callback step (the outside
/// completes it as soon as its agent started it) and a one-hour timer.
pub const CALLBACK_TIMER: &str = "callback-timer";
/// Timers of 5 minutes (woken by their delayed Schedule) and of an hour (by the sweep).
pub const SHORT_TIMER: &str = "timer-5m";
pub const LONG_TIMER: &str = "timer-1h";
/// And one timer of the longest wait there is (`wait::MAX_WAIT_MS`, 366 days).
pub const LONGEST_TIMER: &str = "longest-timer";
/// The order of examples/parallel.json (reserve in two warehouses and screen for fraud at
/// once, then charge and ship), and the same five steps one after the other
/// (examples/sequential.json).
pub const PARALLEL_ORDER: &str = "parallel-order";
pub const SEQUENTIAL_ORDER: &str = "sequential-order";
/// Contention: one stage of five branches, whose replies race on one record, against
/// the same five steps one after the other.
pub const PARALLEL_5: &str = "parallel-5";
pub const SEQUENTIAL_5: &str = "sequential-5";
/// Map steps (issue 39): one compensable step on one agent run over the order's lines,
/// ten at a time (`MAP_LINES`; `RigOptions::line_items` lines an order), against one stage
/// of ten branches of that step (`PARALLEL_10`); and a list step whose bench remote answers
/// `RigOptions::list_items` lines, then the same map over them, 10 or 50 at a time
/// (`LIST_MAP_10`, `LIST_MAP_50`: `bench map`).
pub const MAP_LINES: &str = "map-lines";
pub const PARALLEL_10: &str = "parallel-10";
pub const LIST_MAP_10: &str = "list-map-10";
pub const LIST_MAP_50: &str = "list-map-50";
/// The list step: the bench remote answers a step whose name ends in `-list` with lines,
/// as the simulation's service model does (`sas_sim::ledger`).
pub const LIST_STEP: &str = "lines-list";
/// The map's name in those workflows: its outputs are kept under it.
pub const MAP_NAME: &str = "reserve-lines";

/// The workflows of an example file of this repository.
fn example(text: &str) -> Vec<sas::domain::Workflow> {
    sas::domain::Definitions::parse(text).expect("the examples are valid (tested)").workflows.all().to_vec()
}

/// The built-in workflows, `CALLBACK_TIMER`, the timers of `bench timers`,
/// `LONGEST_TIMER`, the parallel stages' (`PARALLEL_ORDER`, `PARALLEL_5`) beside
/// their sequential twins, and the map steps' (`MAP_LINES`, `PARALLEL_10`, `LIST_MAP_*`).
pub fn bench_workflows() -> Workflows {
    use sas::domain::workflow::{Entry, MapText, StageText};
    use sas::domain::{Callback, Step, Wait, Workflow};
    let mut all = Workflows::builtin().all().to_vec();
    all.extend(example(include_str!("../../../examples/parallel.json")));
    all.extend(example(include_str!("../../../examples/sequential.json")));
    let five: Vec<Step> = (1..=5)
        .map(|i| {
            Step::compensable(&format!("reserve-{i}"), &format!("warehouse-{i}"), &format!("release-{i}"))
        })
        .collect();
    all.push(Workflow::of_entries(
        PARALLEL_5,
        vec![Entry::Parallel { parallel: StageText { name: "reserve-all".into(), steps: five.clone() } }],
    ));
    all.push(Workflow::new(SEQUENTIAL_5, five));
    let map = |items: &str, cap: u32| Entry::Map {
        map: MapText {
            name: MAP_NAME.into(),
            items: items.into(),
            max_concurrency: cap,
            tolerated_failures: 0,
            step: Step::compensable("reserve-line", "warehouse", "release-line"),
        },
    };
    all.push(Workflow::of_entries(MAP_LINES, vec![map("$.order.items", 10)]));
    let ten: Vec<Step> =
        (1..=10).map(|i| Step::compensable(&format!("reserve-{i}"), "warehouse", "release-line")).collect();
    all.push(Workflow::of_entries(
        PARALLEL_10,
        vec![Entry::Parallel { parallel: StageText { name: "reserve-ten".into(), steps: ten } }],
    ));
    for (name, cap) in [(LIST_MAP_10, 10), (LIST_MAP_50, 50)] {
        let lines = format!("$.steps.{LIST_STEP}.output.lines");
        all.push(Workflow::of_entries(
            name,
            vec![Entry::Step(Step::read_only(LIST_STEP, "catalogue")), map(&lines, cap)],
        ));
    }
    all.push(Workflow::new(
        CALLBACK_TIMER,
        vec![
            Step::compensable("approve", "approvals", "withdraw")
                .with_callback(Callback { timeout_ms: 24 * 3_600_000, heartbeat_ms: None }),
            Step::timer("cool-off", Wait::for_ms(3_600_000)),
        ],
    ));
    all.push(Workflow::new(SHORT_TIMER, vec![Step::timer("five-minutes", Wait::for_ms(300_000))]));
    all.push(Workflow::new(LONG_TIMER, vec![Step::timer("an-hour", Wait::for_ms(3_600_000))]));
    all.push(Workflow::new(
        LONGEST_TIMER,
        vec![Step::timer("a-year-and-a-day", Wait::for_ms(sas::domain::wait::MAX_WAIT_MS))],
    ));
    Workflows::new(all)
}

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
    /// Each store call is a round trip, as on DynamoDB: the other handlers of the
    /// invocation run meanwhile, so handlers that write one record can race (the
    /// counting store's calls always are).
    pub round_trips: bool,
    /// Flow-control limits by agent (`domain::gate`): their claims meet a gate.
    pub limits: BTreeMap<String, sas::domain::gate::Limits>,
    /// Lines of each order (1 to 100): a map over `$.order.items` runs one item each.
    pub line_items: usize,
    /// Lines the bench remote answers a `-list` step with (0 to 1,000).
    pub list_items: usize,
    /// Keep every landed write in the store's log (`EmbeddedStore::writes`); without it
    /// `drain` lets them go after each round, for runs of many large records.
    pub keep_writes: bool,
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
            round_trips: false,
            limits: BTreeMap::new(),
            line_items: 1,
            list_items: 0,
            keep_writes: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LambdaFunction {
    Submission,
    Scheduler,
    Agent,
    /// The scheduler function invoked by its callback queue's event source.
    SchedulerCallbacks,
}

impl LambdaFunction {
    fn name(self) -> &'static str {
        match self {
            LambdaFunction::Submission => "submission",
            LambdaFunction::Scheduler => "scheduler",
            LambdaFunction::Agent => "agent",
            LambdaFunction::SchedulerCallbacks => "scheduler-callbacks",
        }
    }
}

/// Time spent and messages handled per function.
#[derive(Debug, Default)]
struct HandlerTimes {
    nanos: [AtomicU64; 4],
    messages: [AtomicU64; 4],
    batches: [AtomicU64; 4],
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
    /// What the handlers counted (timer lateness among it).
    pub metrics: Arc<CountingMetrics>,
    send: Arc<dyn Queues>,
    submission: Submission,
    scheduler: Scheduler,
    agent: Agent,
    callbacks: Callbacks,
    pub supervisor: Supervisor,
    dead_letters: [DeadLetters; 4],
    /// Completions the outside party sent (its own SendMessage each, as the app's orders).
    pub completions_sent: AtomicU64,
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
        for q in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, STATUS, CALLBACKS_DLQ] {
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
        queues.create(CALLBACKS, qs(90_000, CALLBACKS_DLQ));
        let (state, send, alerts): (Arc<dyn StateStore>, Arc<dyn Queues>, Arc<dyn Alerts>) = if options.count
        {
            (
                Arc::new(CountingStore { inner: store.clone(), usage: usage.clone(), due_shards: 4 }),
                Arc::new(CountingQueues { inner: queues.clone(), usage: usage.clone() }),
                Arc::new(CountingAlerts { inner: RecordingAlerts::default(), usage: usage.clone() }),
            )
        } else {
            let state: Arc<dyn StateStore> =
                if options.round_trips { Arc::new(RoundTrips(store.clone())) } else { store.clone() };
            (state, queues.clone(), Arc::new(RecordingAlerts::default()))
        };
        // The agents' call marks go to the same table, counted with the rest.
        let call_starts: Arc<dyn CallStarts> = if options.count {
            Arc::new(CountingStore { inner: store.clone(), usage: usage.clone(), due_shards: 4 })
        } else {
            store.clone()
        };
        // As the Lambda functions send: each invocation's sends coalesced, the counting
        // wrapper inside so it counts the requests that would reach SQS.
        let send: Arc<dyn Queues> = Arc::new(SendCoalescer::new(send, DEFAULT_MAX_HOLD));
        let counted = Arc::new(CountingMetrics::default());
        let metrics: Arc<dyn Metrics> = counted.clone();
        let random = Arc::new(FastRandom::seeded(options.seed));
        let remote = Arc::new(
            InstantRemote::new(options.transient_rate, options.permanent_rate, options.seed)
                .listing(options.list_items),
        );
        let deps = Deps {
            store: state,
            queues: send.clone(),
            alerts,
            clock: clock.clone(),
            random: random.clone(),
            metrics: metrics.clone(),
        };
        let mut topology = queue_names::topology();
        topology.limits = options.limits.clone();
        let settings =
            Settings::new(options.policy, bench_workflows(), topology, queue_names::reply_to_rules());
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
                call_starts: Some(call_starts),
            },
            AgentSettings {
                retry: Backoff { base_ms: 100, cap_ms: step / 4 },
                breaker: BreakerPolicy { failure_threshold: 1_000_000, open_ms: 1 },
                ..AgentSettings::default()
            },
            settings.workflows.clone(),
        )
        // The limited agents as a definition file gives them to the agent function: it
        // marks their calls and hands a Retry-After back to the gate.
        .with_agents(
            &options
                .limits
                .iter()
                .map(|(name, limits)| {
                    let def = sas::domain::definitions::AgentDef {
                        max_in_flight: limits.max_in_flight,
                        max_per_second: limits.max_per_second,
                        ..Default::default()
                    };
                    (name.clone(), def)
                })
                .collect(),
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
            callbacks: Callbacks::new(deps.clone(), settings.clone()),
            supervisor: Supervisor::new(deps, settings),
            dead_letters: [
                dl(ORDERS, ORDERS_DLQ),
                dl(SCHEDULER, SCHEDULER_DLQ),
                dl(AGENT, AGENT_DLQ),
                dl(CALLBACKS, CALLBACKS_DLQ),
            ],
            completions_sent: AtomicU64::new(0),
            crash_rng: Mutex::new(fastrand::Rng::with_seed(options.seed ^ 0xc7a5)),
            crashes: Mutex::default(),
            options,
            store,
            queues,
            clock,
            manual,
            usage,
            remote,
            metrics: counted,
            send,
            times: HandlerTimes::default(),
        }
    }

    pub fn order_body(&self, i: usize) -> String {
        let reply = if self.options.reply_to { format!(r#","reply_to":"{STATUS}""#) } else { String::new() };
        // The first line as ever; more lines (`line_items`) each a SKU of their own.
        let lines: Vec<String> = (0..self.options.line_items.max(1))
            .map(|j| format!(r#"{{"sku":"sku-{}","quantity":{}}}"#, (i + 7 * j) % 1013, 1 + (i + j) % 4))
            .collect();
        format!(
            r#"{{"order_id":"order-{i:08}","customer_id":"cust-{}","items":[{}],"workflow":"{}"{reply}}}"#,
            i % 97,
            lines.join(","),
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
    pub async fn invoke(&self, function: LambdaFunction) -> bool {
        let queue = match function {
            LambdaFunction::Submission => ORDERS,
            LambdaFunction::Scheduler => SCHEDULER,
            LambdaFunction::Agent => AGENT,
            LambdaFunction::SchedulerCallbacks => CALLBACKS,
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
                let crash = function == LambdaFunction::Agent
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
                sender: r.message.sender,
            })
            .collect();
        let handled = inbound.len() as u64;
        let dl = &self.dead_letters[function as usize];
        let report = match function {
            LambdaFunction::Submission => run_batch(inbound, dl, |m| self.submission.handle(m)).await,
            LambdaFunction::Scheduler => {
                run_batch_in(BatchOrder::ByOrder, inbound, dl, |m| self.scheduler.handle(m)).await
            }
            LambdaFunction::Agent => run_batch(inbound, dl, |m| self.agent.handle(m)).await,
            LambdaFunction::SchedulerCallbacks => run_batch(inbound, dl, |m| self.callbacks.handle(m)).await,
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

    /// The outside party: completes every callback step the remote service started, one
    /// SendMessage to the callback queue each (as a webhook through the template's API
    /// would). False if there was nothing to complete.
    async fn complete_started(&self) -> bool {
        let started = std::mem::take(&mut *self.remote.started.lock().unwrap_or_else(|p| p.into_inner()));
        let url = QueueUrl(CALLBACKS.into());
        for token in &started {
            let done = sas::domain::Completion::Success { output: None };
            let body = sas::domain::CallbackMessage::new(token, &done).to_body();
            self.queues.send(&url, Outgoing::new(body)).await.expect("callback queue exists");
        }
        self.completions_sent.fetch_add(started.len() as u64, Ordering::Relaxed);
        !started.is_empty()
    }

    /// Invokes the functions round-robin until no queue has a visible message.
    pub async fn drain(&self) {
        loop {
            let mut any = self.complete_started().await;
            for f in [
                LambdaFunction::Submission,
                LambdaFunction::Scheduler,
                LambdaFunction::Agent,
                LambdaFunction::SchedulerCallbacks,
            ] {
                // Several batches of one function before moving on, like parallel pollers.
                for _ in 0..4 {
                    if !self.invoke(f).await {
                        break;
                    }
                    any = true;
                }
            }
            if !self.options.keep_writes {
                drop(self.store.take_writes());
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
            let next_msg = [ORDERS, SCHEDULER, AGENT, CALLBACKS]
                .iter()
                .filter_map(|q| self.queues.next_visible(q))
                .min();
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
        [
            LambdaFunction::Submission,
            LambdaFunction::Scheduler,
            LambdaFunction::Agent,
            LambdaFunction::SchedulerCallbacks,
        ]
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
