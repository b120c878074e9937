//! A test harness for the handlers on the embedded backend: every port is in-process and
//! deterministic (a manual clock, a seeded random source, a scripted remote service), and
//! messages move only when a test pumps them, so each test reads as a script.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, MetricsSnapshot, QueueSettings,
    RecordingAlerts, StoredMessage,
};
use sas::adapters::system::FastRandom;
use sas::domain::{
    Action, IdempotencyKey, OrderId, OrderStatus, Policy, ProcessState, StatusUpdate, TaskRecord, Timestamp,
    Workflows, lifecycle,
};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchReport, DeadLetters, Deps, HandlerError, Inbound, Scheduler,
    Settings, Submission, Supervisor, SweepReport, run_batch,
};
use sas::ports::{Metric, Outgoing, QueueUrl, Queues, RemoteCall, RemoteError, RemoteService};

pub use sas::adapters::embedded::queue_names::{self, *};

/// Visibility timeouts: the agent's is shorter than a step's timeout so a crashed agent's
/// request comes back while its lease is still live.
pub const ORDERS_VISIBILITY_MS: u64 = 30_000;
pub const SCHEDULER_VISIBILITY_MS: u64 = 30_000;
pub const AGENT_VISIBILITY_MS: u64 = 10_000;

pub const START: u64 = 1_700_000_000_000;

/// What the fake remote service does on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    Ok,
    Transient,
    Permanent(&'static str),
    /// Success with this body (the step's output).
    Answer(String),
    /// Never answers in time: the clock moves past the call's timeout, then the call
    /// fails as a timed-out HTTP call would.
    Hang,
    /// A 429 with Retry-After of this many milliseconds.
    Busy(u64),
}

/// One call the remote service received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub agent: String,
    pub action: Action,
    pub step: u32,
    pub step_name: String,
    pub key: IdempotencyKey,
    pub order_id: OrderId,
    pub at: Timestamp,
    pub outcome: Script,
    /// The outputs the call was handed, as compact JSON.
    pub outputs: String,
}

/// A remote service that plays a script, then the default, and records every call.
pub struct ScriptedRemote {
    clock: Arc<ManualClock>,
    script: Mutex<VecDeque<Script>>,
    default: Mutex<Script>,
    calls: Mutex<Vec<Call>>,
}

impl ScriptedRemote {
    pub fn then(&self, steps: impl IntoIterator<Item = Script>) {
        self.script.lock().unwrap().extend(steps);
    }
    pub fn by_default(&self, s: Script) {
        *self.default.lock().unwrap() = s;
    }
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    /// (step, action) of every call, in order.
    pub fn steps(&self) -> Vec<(u32, Action)> {
        self.calls().iter().map(|c| (c.step, c.action)).collect()
    }
}

#[async_trait]
impl RemoteService for ScriptedRemote {
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<Vec<u8>, RemoteError> {
        let next = self.script.lock().unwrap().pop_front();
        let outcome = next.unwrap_or_else(|| self.default.lock().unwrap().clone());
        self.calls.lock().unwrap().push(Call {
            agent: call.agent.to_owned(),
            action: call.action,
            step: call.step,
            step_name: call.step_name.to_owned(),
            key: call.idempotency_key.clone(),
            order_id: call.order.order_id.clone(),
            at: sas::ports::Clock::now(&*self.clock),
            outcome: outcome.clone(),
            outputs: serde_json::to_string(call.outputs).unwrap(),
        });
        match outcome {
            Script::Ok => Ok(Vec::new()),
            Script::Answer(body) => Ok(body.into_bytes()),
            Script::Transient => Err(RemoteError::Transient("503 service unavailable".into())),
            Script::Permanent(reason) => Err(RemoteError::permanent(reason)),
            Script::Busy(retry_after_ms) => {
                Err(RemoteError::Busy { reason: "429 too many requests".into(), retry_after_ms })
            }
            Script::Hang => {
                self.clock.advance(timeout_ms + 1);
                Err(RemoteError::Transient("timed out".into()))
            }
        }
    }
}

pub struct Harness {
    pub clock: Arc<ManualClock>,
    pub store: Arc<EmbeddedStore>,
    pub queues: Arc<EmbeddedQueues>,
    pub alerts: Arc<RecordingAlerts>,
    pub metrics: Arc<CountingMetrics>,
    pub remote: Arc<ScriptedRemote>,
    pub deps: Deps,
    pub settings: Settings,
    pub submission: Submission,
    pub scheduler: Scheduler,
    pub agent: Agent,
    pub supervisor: Supervisor,
    /// Everything drained from the status queue so far.
    statuses: Mutex<Vec<StatusUpdate>>,
}

pub fn policy() -> Policy {
    Policy::default()
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_policy(policy())
    }

    pub fn with_policy(policy: Policy) -> Harness {
        Harness::with_workflows(policy, Workflows::builtin())
    }

    pub fn with_workflows(policy: Policy, workflows: Workflows) -> Harness {
        let clock = Arc::new(ManualClock::at(START));
        let store = Arc::new(EmbeddedStore::new());
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 7));
        let with_dlq = |visibility_timeout_ms, dlq: &str| QueueSettings {
            visibility_timeout_ms,
            max_receives: 5,
            dead_letter: Some(dlq.to_owned()),
            duplicate_rate: 0.0,
        };
        for dlq in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, STATUS] {
            queues.create(dlq, QueueSettings::default());
        }
        queues.create(ORDERS, with_dlq(ORDERS_VISIBILITY_MS, ORDERS_DLQ));
        queues.create(SCHEDULER, with_dlq(SCHEDULER_VISIBILITY_MS, SCHEDULER_DLQ));
        queues.create(AGENT, with_dlq(AGENT_VISIBILITY_MS, AGENT_DLQ));
        let alerts = Arc::new(RecordingAlerts::default());
        let metrics = Arc::new(CountingMetrics::default());
        let remote = Arc::new(ScriptedRemote {
            clock: clock.clone(),
            script: Mutex::default(),
            default: Mutex::new(Script::Ok),
            calls: Mutex::default(),
        });
        let deps = Deps {
            store: store.clone(),
            queues: queues.clone(),
            alerts: alerts.clone(),
            clock: clock.clone(),
            random: Arc::new(FastRandom::seeded(42)),
            metrics: metrics.clone(),
        };
        let settings =
            Settings::new(policy, workflows, queue_names::topology(), queue_names::reply_to_rules());
        let agent = Agent::new(
            AgentDeps {
                queues: queues.clone(),
                clock: clock.clone(),
                random: Arc::new(FastRandom::seeded(43)),
                metrics: metrics.clone(),
                remote: remote.clone(),
                scheduler_queue: QueueUrl(SCHEDULER.into()),
                call_starts: Some(store.clone()),
            },
            AgentSettings::default(),
            settings.workflows.clone(),
        );
        Harness {
            submission: Submission::new(deps.clone(), settings.clone()),
            scheduler: Scheduler::new(deps.clone(), settings.clone()),
            supervisor: Supervisor::new(deps.clone(), settings.clone()),
            agent,
            clock,
            store,
            queues,
            alerts,
            metrics,
            remote,
            deps,
            settings,
            statuses: Mutex::default(),
        }
    }

    pub fn now(&self) -> Timestamp {
        sas::ports::Clock::now(&*self.clock)
    }

    // ---- sending ----

    pub async fn send(&self, queue: &str, body: impl Into<String>) {
        self.queues.send(&QueueUrl(queue.into()), Outgoing::new(body.into())).await.unwrap();
    }

    /// An order for `o-1`-style ids, with status updates to the status queue.
    pub fn order_body(id: &str, workflow: &str) -> String {
        format!(
            r#"{{"order_id":"{id}","customer_id":"c-1","items":[{{"sku":"A","quantity":1}}],"workflow":"{workflow}","reply_to":"{STATUS}"}}"#
        )
    }

    pub async fn submit(&self, id: &str, workflow: &str) {
        self.send(ORDERS, Harness::order_body(id, workflow)).await;
    }

    // ---- pumping: receive a batch, handle each message, delete it on Ok ----

    pub async fn pump_with<F, Fut>(&self, queue: &str, handle: F) -> Vec<Result<(), HandlerError>>
    where
        F: Fn(Inbound) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let mut results = Vec::new();
        for received in self.queues.receive(queue, 10).unwrap() {
            let inbound = inbound(&received.message);
            let result = handle(inbound).await;
            if result.is_ok() {
                self.queues.delete(queue, &received.receipt);
            }
            results.push(result);
        }
        results
    }

    pub async fn pump_orders(&self) -> Vec<Result<(), HandlerError>> {
        self.pump_with(ORDERS, |m| self.submission.handle(m)).await
    }

    pub async fn pump_scheduler(&self) -> Vec<Result<(), HandlerError>> {
        self.pump_with(SCHEDULER, |m| self.scheduler.handle(m)).await
    }

    pub async fn pump_agent(&self) -> Vec<Result<(), HandlerError>> {
        self.pump_with(AGENT, |m| self.agent.handle(m)).await
    }

    /// Receives one batch from `queue` the way Lambda's event source mapping would, and
    /// runs it through `run_batch` with `queue`'s dead-letter queue.
    pub async fn batch<F, Fut>(&self, queue: &str, dlq: &str, handle: F) -> BatchReport
    where
        F: Fn(Inbound) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let received = self.queues.receive(queue, 10).unwrap();
        let messages: Vec<Inbound> = received.iter().map(|r| inbound(&r.message)).collect();
        let dead_letters = DeadLetters {
            queues: self.queues.clone(),
            source: QueueUrl(queue.into()),
            dead_letter_queue: QueueUrl(dlq.into()),
            metrics: self.metrics.clone(),
        };
        let report = run_batch(messages, &dead_letters, handle).await;
        for r in received {
            if !report.failures.contains(&r.message.message_id) {
                self.queues.delete(queue, &r.receipt);
            }
        }
        report
    }

    /// Pumps every queue in pipeline order until nothing is visible; every result must be Ok.
    pub async fn run_until_quiet(&self) {
        for _ in 0..100 {
            let mut moved = 0;
            for results in [self.pump_orders().await, self.pump_scheduler().await, self.pump_agent().await] {
                moved += results.len();
                for r in results {
                    r.expect("every message handled");
                }
            }
            if moved == 0 {
                return;
            }
        }
        panic!("the pipeline did not go quiet");
    }

    /// Takes every visible message off `queue` for good (deleted) and returns the bodies:
    /// a message "in transit" that a test delivers later with [`Harness::send`].
    pub fn intercept(&self, queue: &str) -> Vec<String> {
        let received = self.queues.receive(queue, 10).unwrap();
        for r in &received {
            self.queues.delete(queue, &r.receipt);
        }
        received.into_iter().map(|r| r.message.body).collect()
    }

    pub async fn sweep(&self) -> SweepReport {
        self.supervisor.sweep().await.expect("sweep")
    }

    // ---- time ----

    /// Moves the clock to `t` (never backwards).
    pub fn at(&self, t: Timestamp) {
        self.clock.set(t);
    }

    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    /// Moves the clock to the task's deadline: the first moment the supervisor may act.
    pub fn to_deadline(&self, id: &str) {
        let deadline = self.task(id).deadline().expect("a non-terminal task has a deadline");
        self.at(deadline);
    }

    /// The delay of the Schedule a supervisor retry just sent, read back from the record
    /// (its deadline is now + delay + pending timeout).
    pub fn retry_delay(&self, id: &str) -> u64 {
        let t = self.task(id);
        t.deadline().unwrap().millis_since(t.updated_at) - self.settings.policy.pending_timeout_ms
    }

    // ---- looking ----

    pub fn id(id: &str) -> OrderId {
        OrderId::parse(id).unwrap()
    }

    pub fn task(&self, id: &str) -> TaskRecord {
        self.store.tasks().into_iter().find(|t| t.order_id.as_str() == id).expect("task exists")
    }

    pub fn history(&self, id: &str) -> Vec<TaskRecord> {
        self.store.history(&Harness::id(id))
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    pub fn count(&self, metric: Metric) -> u64 {
        self.metrics.snapshot().count(metric)
    }

    pub fn depth(&self, queue: &str) -> usize {
        self.queues.depth(queue)
    }

    pub fn drain(&self, queue: &str) -> Vec<StoredMessage> {
        self.queues.drain(queue)
    }

    /// Every status update sent to the status queue so far, in order.
    pub fn statuses(&self) -> Vec<StatusUpdate> {
        let mut all = self.statuses.lock().unwrap();
        all.extend(self.queues.drain(STATUS).iter().map(|m| serde_json::from_str(&m.body).unwrap()));
        all.clone()
    }

    pub fn status_kinds(&self) -> Vec<OrderStatus> {
        self.statuses().iter().map(|s| s.status).collect()
    }

    /// The invariants every test ends on, over the whole write log.
    pub fn finish(&self) {
        let writes = self.store.writes();
        let mut last: std::collections::HashMap<OrderId, TaskRecord> = Default::default();
        for (i, w) in writes.iter().enumerate() {
            let after = &w.after;
            assert_eq!(after.shape_violation(), None, "write {i}: {after:?}");
            match &w.before {
                None => {
                    assert_eq!(
                        after.state(),
                        ProcessState::Pending,
                        "write {i}: inserted as {:?}",
                        after.state()
                    );
                    assert!(!last.contains_key(&after.order_id), "write {i}: inserted twice");
                }
                Some(before) => {
                    assert_eq!(
                        last.get(&after.order_id),
                        Some(&**before),
                        "write {i}: not on the latest revision"
                    );
                    let operator = matches!(after.last_cause, sas::domain::Cause::Operator { .. });
                    assert!(
                        !before.state().is_terminal() || (operator && before.state() == ProcessState::Error),
                        "write {i}: terminal {:?} changed",
                        before.state()
                    );
                    assert!(
                        lifecycle::TRANSITIONS
                            .iter()
                            .any(|(from, _, to)| *from == before.state() && *to == after.state()),
                        "write {i}: {:?} -> {:?} is not in the table",
                        before.state(),
                        after.state()
                    );
                    assert!(
                        after.failure_count >= before.failure_count,
                        "write {i}: FailureCount went from {} to {}",
                        before.failure_count,
                        after.failure_count
                    );
                    assert_eq!(after.revision, before.revision + 1, "write {i}");
                }
            }
            last.insert(after.order_id.clone(), TaskRecord::clone(after));
        }
        for task in self.store.tasks() {
            assert_eq!(last.get(&task.order_id), Some(&task), "the table holds the last write");
        }
    }
}

fn inbound(m: &StoredMessage) -> Inbound {
    m.inbound()
}

/// Asserts a pump handled exactly `n` messages, all Ok.
#[track_caller]
pub fn all_ok(results: Vec<Result<(), HandlerError>>, n: usize) {
    assert_eq!(results.len(), n, "{results:?}");
    for r in results {
        r.unwrap();
    }
}
