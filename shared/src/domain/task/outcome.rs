//! What every decision shares: the policy it decides under, the causes it records, the
//! effects it asks for and the refusals it returns.

use serde::{Deserialize, Serialize};

use crate::domain::callback::{CallbackToken, CompletionRefused};
use crate::domain::ids::{OrderId, Sender, Timestamp};
use crate::domain::lifecycle::ProcessState;
use crate::domain::messages::{OperatorAlert, OrderStatus};
use crate::domain::retry::Backoff;
use crate::domain::workflow::Action;

/// Timing and limits that decisions need; read once from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// A claim's complete-by is this far after the claim.
    pub step_timeout_ms: u64,
    /// Time allowed after complete-by for a reply to travel before the supervisor acts.
    pub reply_grace_ms: u64,
    /// A waiting (unclaimed) task is due this long after it started waiting.
    pub pending_timeout_ms: u64,
    /// Lapses of one step before giving up (its forward action and its compensation
    /// each get this budget), for steps that set no `max_failures` of their own.
    pub failure_threshold: u32,
    /// Delay before a recovered task is scheduled again.
    pub retry_backoff: Backoff,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            step_timeout_ms: 30_000,
            reply_grace_ms: 10_000,
            pending_timeout_ms: 60_000,
            failure_threshold: 5,
            retry_backoff: Backoff { base_ms: 1_000, cap_ms: 60_000 },
        }
    }
}

/// Why the record last changed; the history of a task is the sequence of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    Submitted,
    Claimed {
        step: u32,
        action: Action,
    },
    Succeeded {
        step: u32,
        action: Action,
    },
    Failed {
        step: u32,
        action: Action,
        reason: String,
        /// The step answered, but its answer leaves its effect in doubt (an output that
        /// cannot be kept): a refusal has this false, and the step had no effect. Stored
        /// only when false: a record written before the field existed reads as in doubt,
        /// since a refusal and an unusable output then looked alike, and only "in doubt"
        /// can never undo around a pivot's effect.
        #[serde(default = "in_doubt_unless_stored", skip_serializing_if = "Clone::clone")]
        in_doubt: bool,
    },
    DeadlinePassed {
        step: u32,
        state: ProcessState,
    },
    /// A timer step started waiting until `wake_at`.
    Slept {
        step: u32,
        wake_at: Timestamp,
    },
    /// A timer step's time came (`late_ms` after it: the wake's lateness).
    Woke {
        step: u32,
        late_ms: u64,
    },
    /// A callback step's agent started the work; the task waits for the outside.
    Started {
        step: u32,
    },
    /// The outside sent a heartbeat for a callback step.
    Heartbeat {
        step: u32,
    },
    /// The outside completed a callback step with success.
    Completed {
        step: u32,
    },
    /// A map step's list of items was empty: it is done, with nothing dispatched.
    NoItems {
        step: u32,
    },
    /// The step's agent had no room: the task waits with `ticket` in its gate.
    Queued {
        step: u32,
        ticket: u64,
    },
    /// The agent's remote answered "too many requests": tried again after `retry_after_ms`.
    Throttled {
        step: u32,
        action: Action,
        retry_after_ms: u64,
    },
    /// The state store throttled the step's claim (`Draft::defer`): its Schedule comes
    /// back after a backoff, and its deadline moved out past it.
    StoreThrottled {
        step: u32,
        action: Action,
    },
    /// An operator (or an app's cancel message) acted on the task at `step`.
    Operator {
        step: u32,
        act: Act,
    },
}

/// An operator's action, as recorded in the task's cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "act", rename_all = "snake_case")]
pub enum Act {
    Resubmit {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_step: Option<u32>,
    },
    Compensate,
    Cancel,
    Pause,
    Resume,
}

impl Act {
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Resubmit { .. } => "resubmit",
            Act::Compensate => "compensate",
            Act::Cancel => "cancel",
            Act::Pause => "pause",
            Act::Resume => "resume",
        }
    }
}

/// How far out a paused task's deadline goes while it waits for a claim (`parked`): it
/// leaves the supervisor's sweep, which reads only what is due. A task paused longer is
/// read again by each sweep, which changes nothing, until it is resumed.
pub const PARKED_MS: u64 = 366 * 24 * 60 * 60 * 1_000;

/// Something to do once the decision's write has landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the agent request for the claimed step, with the callback token of a callback
    /// step (the only time the token exists whole: the record keeps its digest).
    Dispatch {
        step: u32,
        action: Action,
        callback: Option<CallbackToken>,
        /// A map step's item, by index: each item is dispatched on its own.
        item: Option<u32>,
    },
    /// Put a `Schedule` message on the scheduler's queue.
    Schedule {
        delay_ms: u64,
    },
    /// Tell `reply_to`, if the order named one.
    Status {
        status: OrderStatus,
        step: Option<String>,
        reason: Option<String>,
    },
    Alert(OperatorAlert),
    /// The task left its place in a limited agent's line without taking its turn (a
    /// cancel, or a new ticket in place of one whose turn lapsed): withdraw the ticket
    /// from the gate, so a place reserved for it goes to the next in line now and its
    /// turn is skipped. Best effort: a reservation not handed back lapses after
    /// `gate::RESERVATION_MS`.
    HandBack(crate::domain::gate::Ticket),
}

/// Why a decision was refused: each is an expected outcome, not a fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("claim lost: task is {state:?} and {}", if *.locked { "locked" } else { "unlocked" })]
    ClaimLost { state: ProcessState, locked: bool },
    #[error("stale reply: {0}")]
    StaleReply(StaleReason),
    /// Paused by an operator: nothing is claimed until it is resumed.
    #[error("paused: nothing is dispatched until it is resumed")]
    Paused,
    /// Not claimable yet: held after a cancel until the cancelled attempt is over.
    #[error("held until {until}: an attempt of a cancelled task or a stopped stage may still be running")]
    Held { until: Timestamp },
    /// A Schedule for a waiting timer that came before its time: nothing changes.
    #[error("asleep until {wake_at}: woken early at {now}")]
    Asleep { wake_at: Timestamp, now: Timestamp },
    #[error("not due: deadline {deadline:?} is after {now}")]
    NotDue { deadline: Option<Timestamp>, now: Timestamp },
    /// A callback completion or heartbeat that does not apply: nothing changed.
    #[error("completion refused: {0}")]
    Completion(CompletionRefused),
    /// Not a refusal to its sender: a heartbeat that passed the token's fence less than
    /// the floor after the last one written, acknowledged without a write (the wait's due
    /// time allows for it: `Awaiting::due`).
    #[error(
        "heartbeat noted: the last one written at {written_at} stands (floor {floor_ms} ms); due by {due}"
    )]
    HeartbeatNoted { written_at: Timestamp, floor_ms: u64, due: Timestamp },
    #[error("task record does not fit workflow {workflow:?}: {why}")]
    Corrupt { workflow: String, why: String },
    /// An operator's action that does not apply to the task as it is: nothing changed.
    #[error("cannot {act} a task that is {state}: {why}")]
    NotAllowed { act: &'static str, state: &'static str, why: String },
    /// A message about an order from a sender other than the one that submitted it (an
    /// app's cancel, or the same order id sent again): nothing changed. It names the
    /// message's own sender, never the submitter.
    #[error("order {order_id} was submitted by another sender{}", from_whom(.sent_by.as_ref()))]
    OtherSender { order_id: OrderId, sent_by: Option<Sender> },
}

impl Refusal {
    /// For a Schedule that found its timer still asleep (a copy of the one that put it to
    /// sleep, or one read on a clock behind the writer's): the delay of a Schedule that
    /// comes back when the timer is due, so it wakes then rather than at the supervisor's
    /// next sweep, up to a period late. None for any other refusal, and for a wake further
    /// off than a message can be delayed: the supervisor's sweep is that timer's wake.
    pub fn rearm_ms(&self) -> Option<u64> {
        match self {
            Refusal::Asleep { wake_at, now } => {
                let left = wake_at.millis_since(*now).max(1);
                (left <= crate::domain::wait::MAX_DELAYED_WAKE_MS).then_some(left)
            }
            _ => None,
        }
    }
}

fn from_whom(sent_by: Option<&Sender>) -> String {
    match sent_by {
        Some(s) => format!(" (this message came from {s})"),
        None => " (this message carries no sender)".to_owned(),
    }
}

fn in_doubt_unless_stored() -> bool {
    true
}

/// Why the fence (`reply.rs`) turned a reply away. Here rather than beside the fence
/// because `Refusal::StaleReply` carries it, and every file of the task returns `Refusal`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StaleReason {
    #[error("task is {0:?} with no live lease")]
    NoLease(ProcessState),
    #[error("the lease was superseded")]
    OtherLease,
    #[error("reply is for attempt {reply}, task is at attempt {current}")]
    OtherAttempt { current: u32, reply: u32 },
    #[error("reply is for step {reply} ({reply_action:?}), task is at step {current}")]
    OtherStep { current: u32, reply: u32, reply_action: Action },
    #[error("reply arrived at {now}, after complete-by {complete_by}")]
    PastCompleteBy { complete_by: Timestamp, now: Timestamp },
    /// A branch of a parallel stage that has no dispatch in flight: it answered already,
    /// or it lapsed and waits to be dispatched again.
    #[error("branch {step} has no attempt in flight")]
    BranchIdle { step: u32 },
}

impl Cause {
    /// The step the cause is about (a branch's own, at a parallel stage).
    pub fn step(&self) -> Option<u32> {
        match self {
            Cause::Submitted => None,
            Cause::Claimed { step, .. }
            | Cause::Succeeded { step, .. }
            | Cause::Failed { step, .. }
            | Cause::DeadlinePassed { step, .. }
            | Cause::Slept { step, .. }
            | Cause::Woke { step, .. }
            | Cause::Started { step }
            | Cause::Heartbeat { step }
            | Cause::Completed { step }
            | Cause::NoItems { step }
            | Cause::Queued { step, .. }
            | Cause::Throttled { step, .. }
            | Cause::StoreThrottled { step, .. }
            | Cause::Operator { step, .. } => Some(*step),
        }
    }
}

/// Who acts and why: both go into the task's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor<'a> {
    /// The caller's identity (an IAM ARN for `sasctl`; the orders queue for an app).
    pub by: &'a str,
    pub why: &'a str,
    /// The revision the action was decided on, when the caller looked first (a bulk
    /// action acts on what its listing showed): refused if the task moved since. The
    /// same request sent twice then lands once, even if the task comes back to the same
    /// state in between (a resubmit that failed again).
    pub seen: Option<u64>,
    pub origin: Origin<'a>,
}

/// Where an action comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin<'a> {
    /// An operator through `sasctl tasks`: IAM decides who may run it, and it acts on
    /// every task.
    Operator,
    /// An app's message on the orders queue, from `sender` (the principal of the
    /// message's SQS `SenderId`; `None` when the message carried none): it acts only on
    /// orders that sender submitted.
    App { sender: Option<&'a Sender> },
}
