//! What the handlers need from the world, as traits over domain types. Adapters
//! (embedded, AWS) implement them; no SDK type crosses this line. Also the plain values an
//! adapter is built with that the configuration reads (`TableNames`, `Deployment`): they
//! live here, below both, so the adapters never import the configuration.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::domain::gate::{CallMark, CallStart, Gate};
use crate::domain::{
    Action, IdempotencyKey, LeaseToken, OperatorAlert, Order, OrderId, SecretSource, SecretValue, TaskRecord,
    Timestamp,
};

/// The state table's index names, its due index's shards and its records' retention when
/// the deployment sets none (`config` reads what it sets).
pub const DEFAULT_DUE_INDEX: &str = "due-index";
pub const DEFAULT_ERROR_INDEX: &str = "error-index";
pub const DEFAULT_FINISHED_INDEX: &str = "finished-index";
/// Why `Listing::Finished` is refused by a deployment without the finished index.
pub const NOT_INDEXED: &str = "this deployment keeps no index of finished orders: deploy it with ListFinished=true (one more index write per order), or show one order by id with `sasctl tasks show`";
/// How long a finished task's record is kept before DynamoDB's TTL deletes it.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
pub const DEFAULT_DUE_SHARDS: u32 = 4;

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
    /// Whether finished tasks (Processed, Compensated) are written into the sparse
    /// finished index (`finished_index`), so operators can list them: one more index
    /// write per finished order, which is why a deployment opts in.
    pub list_finished: bool,
    pub finished_index: String,
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
            list_finished: false,
            finished_index: DEFAULT_FINISHED_INDEX.to_owned(),
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }

    /// The same tables with finished tasks indexed, or not.
    pub fn with_list_finished(mut self, on: bool) -> TableNames {
        self.list_finished = on;
        self
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

/// Failures of infrastructure, each with its retry class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Worth retrying: throttling, a timeout, a dropped connection.
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// Worth retrying later: the table (or one of its items) refused more work for now.
    /// A Schedule met by it is sent again after a backoff rather than left to redelivery,
    /// which counts toward the queue's limit of receives (`handlers::scheduler`).
    #[error("state store throttled: {0}")]
    Throttled(String),
    /// The deployment keeps no index for this listing (`Listing::Finished` without
    /// `TableNames::list_finished`).
    #[error("{0}")]
    NotIndexed(String),
    /// Not worth retrying: the stored item does not decode.
    #[error("stored record for {order_id} is unreadable: {reason}")]
    Corrupt { order_id: String, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    New,
    /// A task with this order id exists already; this is the one stored.
    Exists(Box<TaskRecord>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Applied,
    /// The row's revision is no longer the one the decision was made on.
    RevisionMoved,
}

/// What came of noting a ticket's waiter (`StateStore::put_waiter`). A gate hands each
/// ticket to one task only, so once written a note never comes to name another order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noted {
    /// The note names this order: written now, or already written by this order (a
    /// retried or duplicated Schedule).
    Applied,
    /// Another order's note holds the ticket; nothing was written.
    HeldByAnother,
}

/// Which tasks `TaskListing::list` reads: always through an index, never by scanning the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// Tasks in Error updated at or after `since`, newest first: a sparse index holds exactly them.
    Errors { since: Option<Timestamp> },
    /// Every live (non-terminal) task, from the due index, oldest deadline first.
    Live,
    /// Finished tasks (Processed and Compensated) that ended at or after `since`, newest
    /// first, from the sparse finished index of a deployment that keeps one
    /// (`TableNames::list_finished`); else refused with `StoreError::NotIndexed`.
    Finished { since: Option<Timestamp> },
}

/// The state table: one item per order, holding the order and its task.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Inserts the task (with its order) unless a task with that order id exists.
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError>;
    /// A strongly consistent read of the task.
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError>;
    /// Writes `next` only if the stored revision is still `expected_revision`.
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError>;
    /// Up to `limit` tasks whose deadline is at or before `now`, oldest deadline first,
    /// from the sparse due index. The index holds keys only and may lag the table:
    /// re-read each task before acting on it.
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError>;
    /// A strongly consistent read of an agent's gate (`domain::gate`); `None` before its
    /// first write. Gates live in the same table, under keys no order id can take.
    async fn gate(&self, agent: &str) -> Result<Option<Gate>, StoreError>;
    /// Writes the gate only if its stored revision is still `expected_revision` (0: only
    /// if it was never written).
    async fn replace_gate(&self, next: &Gate, expected_revision: u64) -> Result<Written, StoreError>;
    /// Notes which order holds `ticket` in the agent's line, so whoever lets the ticket
    /// through can wake it. Expires on its own. Conditional like every other write: only
    /// if the ticket has no note, or one naming this same order ([`Noted`]); a failed
    /// condition is that outcome, never a [`StoreError`].
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError>;
    /// The order noted for `ticket`, if it was noted.
    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError>;
}

/// Listing tasks for operators (`sasctl tasks list` and its bulk actions): a port of its
/// own rather than a method of [`StateStore`], because the functions never list and a
/// trait object links every method of its trait: the listing's queries would add to every
/// function's package, which has a 4 MB ceiling (docs/BENCHMARKS.md, "Package sizes").
#[async_trait]
pub trait TaskListing: Send + Sync {
    /// Up to `limit` tasks of `listing`. Index reads may lag the table: callers re-read a
    /// task before acting on it.
    async fn list(&self, listing: &Listing, limit: usize) -> Result<Vec<TaskRecord>, StoreError>;
}

/// The agent's one write, for limited agents only: a call's mark (`domain::gate::CallMark`)
/// in the state table. A port of its own rather than a method of [`StateStore`]: the
/// agent links nothing else of the table, and agents without limits never use it.
#[async_trait]
pub trait CallStarts: Send + Sync {
    /// Writes the mark only if no mark with its key exists; it expires on its own after
    /// `mark.until`. A failed condition is [`CallStart::AlreadyStarted`], never a
    /// [`StoreError`].
    async fn start_call(&self, mark: &CallMark) -> Result<CallStart, StoreError>;
}

/// A queue's address: an SQS queue URL, or the embedded backend's queue name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueUrl(pub String);

impl std::fmt::Display for QueueUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outgoing {
    pub body: String,
    pub delay_ms: u64,
    pub attributes: BTreeMap<String, String>,
}

impl Outgoing {
    pub fn new(body: String) -> Outgoing {
        Outgoing { body, ..Outgoing::default() }
    }
    pub fn delayed(body: String, delay_ms: u64) -> Outgoing {
        Outgoing { body, delay_ms, ..Outgoing::default() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("queue {queue} unavailable: {reason}")]
    Unavailable { queue: String, reason: String },
    #[error("queue {0} does not exist")]
    NoSuchQueue(String),
}

#[async_trait]
pub trait Queues: Send + Sync {
    /// Sends every message or fails; adapters split into the service's batch size.
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError>;

    async fn send(&self, queue: &QueueUrl, message: Outgoing) -> Result<(), QueueError> {
        self.send_batch(queue, vec![message]).await
    }

    /// Sends every message and answers for each, in order: where the service accepts some
    /// entries of a request and refuses others, only the refused ones fail. The default
    /// is all or nothing.
    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Vec<Result<(), QueueError>> {
        let n = messages.len();
        let result = self.send_batch(queue, messages).await;
        vec![result; n]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("alert not delivered: {0}")]
pub struct AlertError(pub String);

/// The operators' topic.
#[async_trait]
pub trait Alerts: Send + Sync {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError>;
}

/// Every read of the time goes through here, so tests and the simulation own time.
#[async_trait]
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
    async fn sleep_until(&self, until: Timestamp);
}

/// Every random choice goes through here, so a seed replays a run.
pub trait Random: Send + Sync {
    fn lease(&self) -> LeaseToken;
    fn jitter(&self) -> u64;
    /// The unguessable part of a callback token (`domain::callback`).
    fn callback_secret(&self) -> crate::domain::CallbackSecret;
}

/// One call of one action of one step, as the agent makes it. Its `Debug` shows a callback
/// token only up to its secret, as the token's own does.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteCall<'a> {
    pub agent: &'a str,
    pub action: Action,
    pub step: u32,
    pub step_name: &'a str,
    pub idempotency_key: &'a IdempotencyKey,
    pub order: &'a Order,
    /// The outputs of earlier steps (of the undone step, for a compensation), by name.
    pub outputs: &'a std::collections::BTreeMap<String, serde_json::Value>,
    /// A callback step's token, for the service to hand to whoever completes the step.
    pub callback_token: Option<&'a str>,
    /// A map step's item: its index among the map's items, and the item.
    pub index: Option<u32>,
    pub item: Option<&'a serde_json::Value>,
}

impl std::fmt::Debug for RemoteCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.callback_token.map(|t| match t.rsplit_once('.') {
            Some((head, _)) => format!("{head}.…"),
            None => "…".to_owned(),
        });
        f.debug_struct("RemoteCall")
            .field("agent", &self.agent)
            .field("action", &self.action)
            .field("step", &self.step)
            .field("step_name", &self.step_name)
            .field("idempotency_key", &self.idempotency_key)
            .field("order", &self.order)
            .field("outputs", &self.outputs)
            .field("callback_token", &token)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// Might work if tried again: 5xx, 429, timeouts, connection errors.
    #[error("transient: {0}")]
    Transient(String),
    /// A 429 or 503 with Retry-After: nothing was done, and the service asks to be left
    /// alone for `retry_after_ms`. Transient, with a delay the agent honours.
    #[error("busy: {reason}")]
    Busy { reason: String, retry_after_ms: u64 },
    /// Will not work however often tried: the service said no (4xx). `reason` says what
    /// failed and its status class, fit for the order's submitter; `detail` (bounded) is
    /// the service's own answer, for operators only (the record and the alert).
    #[error("permanent: {reason}")]
    Permanent { reason: String, detail: Option<String> },
    /// A 401 or 403 to a call that carried the agent's auth header. The adapter has
    /// dropped the value it sent, so the next call reads the secret again: the first such
    /// answer of an attempt may be a rotated secret and is retried once; a second is a
    /// refusal (`handlers::agent`). Fields as for `Permanent`.
    #[error("auth refused: {reason}")]
    AuthRefused { reason: String, detail: Option<String> },
}

impl RemoteError {
    /// A permanent refusal with nothing more to say.
    pub fn permanent(reason: impl Into<String>) -> RemoteError {
        RemoteError::Permanent { reason: reason.into(), detail: None }
    }
}

/// The remote service an agent fronts.
#[async_trait]
pub trait RemoteService: Send + Sync {
    /// Success answers with the body the service sent (the step's output, if any): at
    /// most [`crate::domain::MAX_OUTPUT_BYTES`] + 1 bytes of it are read, enough to tell
    /// that it is too large.
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<Vec<u8>, RemoteError>;
}

/// A secret could not be read. The text says why (not found, access denied, throttled,
/// unreachable, not text) and never holds a value: it is logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reading {source_name}: {reason}")]
pub struct SecretError {
    /// The source as the definition file names it (`ssm:...`, `secretsmanager:...`).
    pub source_name: String,
    pub reason: String,
}

/// Where agents' auth header values live: Parameter Store and Secrets Manager on AWS.
#[async_trait]
pub trait Secrets: Send + Sync {
    /// The current value, read from the store every time: caching is the caller's choice.
    async fn get(&self, source: &SecretSource) -> Result<SecretValue, SecretError>;
}

/// What the pipeline counts; CloudWatch EMF in Lambda, counters in `dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    OrderAccepted,
    OrderDuplicate,
    OrderRejected,
    MessageKept,
    Claimed,
    ClaimLost,
    StepSucceeded,
    Processed,
    CompensationStarted,
    CompensationStep,
    Compensated,
    Failed,
    StaleReply,
    Recovered,
    AgentRetry,
    AgentGaveUp,
    CircuitOpen,
    StepLatencyMs,
    OrderLatencyMs,
    /// An operator's resubmit, compensate or cancel (an app's cancel included) landed.
    OperatorAction,
    /// A service refused an agent's auth header (401/403); the secret is read again and
    /// the call retried once.
    AuthRetry,
    /// A service refused an agent's auth header again after it was read afresh: the step
    /// is refused, and the `auth-refused` alarm fires.
    AuthRefused,
    /// A timer step started waiting.
    TimerStarted,
    /// A timer step woke (its time came).
    TimerWoke,
    /// A Schedule came for a timer before its time: dropped, nothing changed.
    TimerEarly,
    /// How long after its wake time a timer woke.
    TimerLatenessMs,
    /// A callback step's agent started the work; the task waits for the outside.
    CallbackStarted,
    /// A completion (success or failure) from the outside was applied.
    CallbackApplied,
    /// A heartbeat from the outside was applied.
    CallbackHeartbeat,
    /// A heartbeat came within the floor of the last one written: acknowledged, not written.
    CallbackHeartbeatNoted,
    /// A completion or heartbeat changed nothing: an old, foreign, forged or malformed
    /// token, or one for a step that has ended.
    CallbackRefused,
    /// A callback's timeout or heartbeat passed with no word from the outside.
    CallbackTimedOut,
    /// A supervisor run stopped at its time budget, perhaps with due tasks left for the
    /// next run: a backlog larger than one run wakes.
    SweepCutShort,
    /// A decision's conditional write found the task moved since it was read (another
    /// writer won): it is read and decided again. Branch replies of a parallel stage race
    /// so on one record.
    WriteConflict,
    /// A step found its agent's gate full and took a ticket (again, when the supervisor
    /// asked the gate for a task still waiting).
    CapacityQueued,
    /// How long a step waited for a place in its agent's gate, at its claim.
    CapacityWaitMs,
    /// A remote answered 429 or 503 with Retry-After: its agent's gate paused.
    Throttled,
    /// A gate's conditional write found the gate moved since it was read: read and
    /// decided again.
    GateConflict,
    /// A task left an agent's line without taking its turn and its ticket was withdrawn
    /// (a place reserved for it freed, or its turn marked to be skipped).
    TicketHandedBack,
    /// A turn let through was claimed by the scheduler invocation that made the room,
    /// with no queue hop (`Scheduler::hand_over`).
    HandedOver,
    /// The state store throttled a Schedule's handling: the Schedule was sent again after
    /// a backoff (`domain::retry::THROTTLED_SCHEDULE`).
    ScheduleThrottled,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::OrderAccepted => "OrdersAccepted",
            Metric::OrderDuplicate => "OrdersDuplicate",
            Metric::OrderRejected => "OrdersRejected",
            Metric::MessageKept => "MessagesKept",
            Metric::Claimed => "Claims",
            Metric::ClaimLost => "ClaimsLost",
            Metric::StepSucceeded => "StepsSucceeded",
            Metric::Processed => "OrdersProcessed",
            Metric::CompensationStarted => "CompensationsStarted",
            Metric::CompensationStep => "CompensationSteps",
            Metric::Compensated => "OrdersCompensated",
            Metric::Failed => "OrdersFailed",
            Metric::StaleReply => "StaleReplies",
            Metric::Recovered => "Recovered",
            Metric::AgentRetry => "AgentRetries",
            Metric::AgentGaveUp => "AgentGaveUp",
            Metric::CircuitOpen => "CircuitOpen",
            Metric::StepLatencyMs => "StepLatency",
            Metric::OrderLatencyMs => "OrderLatency",
            Metric::OperatorAction => "OperatorActions",
            Metric::AuthRetry => "AuthRetries",
            Metric::AuthRefused => "AuthRefused",
            Metric::TimerStarted => "TimersStarted",
            Metric::TimerWoke => "TimersWoken",
            Metric::TimerEarly => "TimerSchedulesEarly",
            Metric::TimerLatenessMs => "TimerLateness",
            Metric::CallbackStarted => "CallbacksStarted",
            Metric::CallbackApplied => "CallbackCompletionsApplied",
            Metric::CallbackHeartbeat => "CallbackHeartbeats",
            Metric::CallbackHeartbeatNoted => "CallbackHeartbeatsNoted",
            Metric::CallbackRefused => "CallbackCompletionsRefused",
            Metric::CallbackTimedOut => "CallbacksTimedOut",
            Metric::SweepCutShort => "SweepsCutShort",
            Metric::WriteConflict => "WriteConflicts",
            Metric::CapacityQueued => "CapacityQueued",
            Metric::CapacityWaitMs => "CapacityWait",
            Metric::Throttled => "Throttled",
            Metric::GateConflict => "GateConflicts",
            Metric::TicketHandedBack => "TicketsHandedBack",
            Metric::HandedOver => "HandedOver",
            Metric::ScheduleThrottled => "SchedulesThrottled",
        }
    }
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Metric::StepLatencyMs | Metric::OrderLatencyMs | Metric::TimerLatenessMs | Metric::CapacityWaitMs
        )
    }
}

pub trait Metrics: Send + Sync {
    /// Adds `value` to a counter, or records one latency sample in milliseconds.
    fn record(&self, metric: Metric, value: u64);
    /// Writes out what was recorded (one EMF line per invocation in Lambda).
    fn flush(&self) {}
}

/// One received message and the handle that deletes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: String,
    pub body: String,
    pub attributes: BTreeMap<String, String>,
    /// 1 on first delivery.
    pub receive_count: u32,
    pub receipt: String,
    /// SQS's `SenderId` system attribute, when the backend gives one.
    pub sender: Option<String>,
}

/// The consuming side of a queue: what Lambda's SQS event source mapping does for the
/// functions, and what `sasctl dev` and the conformance tests do themselves.
#[async_trait]
pub trait QueueConsumer: Send + Sync {
    /// Up to `max` messages (at most 10), waiting up to `wait_ms` for the first.
    async fn receive(&self, queue: &QueueUrl, max: usize, wait_ms: u64) -> Result<Vec<Delivery>, QueueError>;
    async fn delete(&self, queue: &QueueUrl, receipt: &str) -> Result<(), QueueError>;

    /// Deletes a handled batch, as the event source mapping does after an invocation (one
    /// request per 10 on SQS). Returns how many deletes failed: those messages come back
    /// after the visibility timeout.
    async fn delete_batch(&self, queue: &QueueUrl, receipts: &[String]) -> usize {
        let mut failed = 0;
        for receipt in receipts {
            if self.delete(queue, receipt).await.is_err() {
                failed += 1;
            }
        }
        failed
    }
}

/// Where the pipeline's own messages go: the handlers send there, and every backend's
/// wiring (the functions' configuration, an embedded run's queue names) builds one.
#[derive(Debug, Clone)]
pub struct Topology {
    pub scheduler_queue: QueueUrl,
    pub agent_queue: QueueUrl,
    /// The `queue` agents' queues, by agent: their requests go there, not to the agent
    /// function's queue.
    pub queue_agents: std::collections::BTreeMap<String, QueueUrl>,
    /// The flow-control limits of the agents that have any (`domain::gate`): a call of
    /// one of these takes a place in the agent's gate first.
    pub limits: std::collections::BTreeMap<String, crate::domain::gate::Limits>,
}

impl Topology {
    pub fn new(scheduler_queue: QueueUrl, agent_queue: QueueUrl) -> Topology {
        Topology {
            scheduler_queue,
            agent_queue,
            queue_agents: Default::default(),
            limits: Default::default(),
        }
    }

    /// The queue agents of a definition file, and the limits of its agents.
    pub fn with_queue_agents(
        mut self,
        agents: &std::collections::BTreeMap<String, crate::domain::definitions::AgentDef>,
    ) -> Topology {
        self.queue_agents = agents
            .iter()
            .filter_map(|(name, def)| def.queue().map(|q| (name.clone(), QueueUrl(q.to_owned()))))
            .collect();
        self.limits = agents
            .iter()
            .filter(|(_, def)| def.limits().any())
            .map(|(name, def)| (name.clone(), def.limits()))
            .collect();
        self
    }
}

/// One received message, independent of how it arrived (Lambda event or embedded pump).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    pub message_id: String,
    pub body: String,
    pub receive_count: u32,
    /// The message's SQS `SenderId` (set by SQS from the sender's credentials; a sender
    /// cannot forge it), when the backend gives one: the orders queue binds an order to it.
    pub sender: Option<String>,
}
