//! The catalogue: every invariant a run is judged by ([`Invariant`], each stated in words
//! as the README states it), a [`Violation`] of one, and the [`Records`] every run leaves
//! behind for the checks to judge.

use std::fmt;

use sas::adapters::embedded::WriteRecord;
use sas::domain::{OperatorAlert, Policy, TaskRecord, Workflows};

use crate::ledger::Ledger;

/// Every invariant a run is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    AcceptedOrRejected,
    TerminalOnce,
    Absorbing,
    Lifecycle,
    Shape,
    OneLease,
    Fenced,
    Failures,
    Compensation,
    NothingStands,
    PivotGoesForward,
    Outputs,
    Pinned,
    Idempotency,
    RemoteAgrees,
    Liveness,
    Supervised,
    NoPanic,
    BadInputKept,
    NoInternalReject,
    Alerted,
    Status,
    OperatorOnce,
    CancelledStaysOut,
    CancelBySubmitter,
    TimerNotEarly,
    TimerOnTime,
    PausedHoldsStill,
    CallbackOnce,
    RefusedCompletionChangesNothing,
    StageJoinsOnlyWhenAll,
    StageUndoExact,
    LateBranchReplyChangesNothing,
    RemoteWithinLimits,
    TicketsHandedBack,
    ThrottleBudget,
    HeartbeatsKept,
    StoreWaitUncounted,
    MapCapHeld,
    MapItemOnce,
    MapUndoExact,
    MapItemsThroughGate,
}

impl Invariant {
    pub const ALL: [Invariant; 42] = [
        Invariant::AcceptedOrRejected,
        Invariant::TerminalOnce,
        Invariant::Absorbing,
        Invariant::Lifecycle,
        Invariant::Shape,
        Invariant::OneLease,
        Invariant::Fenced,
        Invariant::Failures,
        Invariant::Compensation,
        Invariant::NothingStands,
        Invariant::PivotGoesForward,
        Invariant::Outputs,
        Invariant::Pinned,
        Invariant::Idempotency,
        Invariant::RemoteAgrees,
        Invariant::Liveness,
        Invariant::Supervised,
        Invariant::NoPanic,
        Invariant::BadInputKept,
        Invariant::NoInternalReject,
        Invariant::Alerted,
        Invariant::Status,
        Invariant::OperatorOnce,
        Invariant::CancelledStaysOut,
        Invariant::CancelBySubmitter,
        Invariant::TimerNotEarly,
        Invariant::TimerOnTime,
        Invariant::PausedHoldsStill,
        Invariant::CallbackOnce,
        Invariant::RefusedCompletionChangesNothing,
        Invariant::StageJoinsOnlyWhenAll,
        Invariant::StageUndoExact,
        Invariant::LateBranchReplyChangesNothing,
        Invariant::RemoteWithinLimits,
        Invariant::TicketsHandedBack,
        Invariant::ThrottleBudget,
        Invariant::HeartbeatsKept,
        Invariant::StoreWaitUncounted,
        Invariant::MapCapHeld,
        Invariant::MapItemOnce,
        Invariant::MapUndoExact,
        Invariant::MapItemsThroughGate,
    ];

    /// The invariant in words (docs/ARCHITECTURE.md, "What every run checks", lists them).
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::AcceptedOrRejected => {
                "every order sent is accepted or rejected with a reason, never lost"
            }
            Invariant::TerminalOnce => {
                "every accepted order reaches exactly one terminal state (again only after an operator reopened it)"
            }
            Invariant::Absorbing => "terminal states never change, except Error by an operator's action",
            Invariant::Lifecycle => "every write is a move of the transition table on the latest revision",
            Invariant::Shape => "every record is well-formed (lease, deadline)",
            Invariant::OneLease => "at most one live lease per task",
            Invariant::Fenced => "a stale reply never changes state",
            Invariant::Failures => "FailureCount only grows and each step's failure budget is honoured",
            Invariant::Compensation => {
                "each completed step of an undone task is compensated exactly once, in reverse order"
            }
            Invariant::NothingStands => {
                "a Compensated task left no effect standing at the remote side (no pivot, nothing un-undone)"
            }
            Invariant::PivotGoesForward => "once a pivot took effect, nothing of its task is undone",
            Invariant::Outputs => {
                "each step is handed the outputs of the steps before it, each compensation also the output of the step it undoes"
            }
            Invariant::Pinned => "a task runs only the steps of the workflow version it was accepted under",
            Invariant::Idempotency => "one idempotency key per step, its remote effect applied at most once",
            Invariant::RemoteAgrees => "the remote side agrees with the final state",
            Invariant::Liveness => "every order is terminal within a bound after the faults stop",
            Invariant::Supervised => "a task past its deadline is acted on by the next supervisor run",
            Invariant::NoPanic => "no handler panics",
            Invariant::BadInputKept => "bad input is kept with its reason",
            Invariant::NoInternalReject => "no message the pipeline made itself is rejected or lost",
            Invariant::Alerted => "every give-up (Error, or a spent failure budget) raises an operator alert",
            Invariant::Status => "reply_to receives each order's final status",
            Invariant::OperatorOnce => {
                "an operator's action lands at most once, however often it is sent, and only where it applies"
            }
            Invariant::CancelledStaysOut => "a cancelled task never runs a step forward again",
            Invariant::CancelBySubmitter => "no order is cancelled by a sender other than its submitter",
            Invariant::TimerNotEarly => "a timer never wakes before its time",
            Invariant::TimerOnTime => {
                "a due timer wakes within one supervisor period (plus the run's clock slack) once the faults stop; none is lost"
            }
            Invariant::CallbackOnce => {
                "a callback step's attempt is completed (success or failure) at most once"
            }
            Invariant::RefusedCompletionChangesNothing => {
                "a completion, failure or heartbeat changes a task only with the live attempt's own token, in time"
            }
            Invariant::PausedHoldsStill => {
                "a paused task dispatches nothing: no step is claimed and no timer starts"
            }
            Invariant::StageJoinsOnlyWhenAll => {
                "a task goes past a parallel stage only once every branch of it took effect at the remote side"
            }
            Invariant::StageUndoExact => {
                "undoing a parallel stage compensates exactly its branches that may have taken effect, each once"
            }
            Invariant::LateBranchReplyChangesNothing => {
                "a branch's reply that comes after its stage ended changes nothing"
            }
            Invariant::RemoteWithinLimits => {
                "a limited agent's service never sees more than max_in_flight calls at once (copies of a request included), nor more than max_per_second starting in any one second"
            }
            Invariant::TicketsHandedBack => {
                "a task that leaves an agent's line without its turn hands its ticket back: the ticket is never let through after"
            }
            Invariant::ThrottleBudget => {
                "a step's remote never has it wait, throttled, longer in all than its throttle budget: past it, the step gives up"
            }
            Invariant::HeartbeatsKept => {
                "a party that heartbeats at least every interval is never lapsed, and a heartbeating step is written at most once per floor"
            }
            Invariant::MapCapHeld => "a map step never has more than its max_concurrency items in flight",
            Invariant::MapItemOnce => {
                "each item of a map step is called under its own key, and a map goes on only once every item it did not tolerate as refused took effect"
            }
            Invariant::MapUndoExact => {
                "undoing a map step compensates exactly its items that may have taken effect, each after its effect, newest first"
            }
            Invariant::MapItemsThroughGate => {
                "a map over an agent with limits has one item in flight at a time, and each item is sent by a claim of its own"
            }
            Invariant::StoreWaitUncounted => {
                "a claim the state store throttled counts no failure and moves the task's deadline past the longest backoff its Schedule waits"
            }
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.statement())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: Invariant, detail: impl Into<String>) -> Violation {
        Violation { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

/// What every run leaves behind, whatever ran it.
pub struct Records<'a> {
    pub workflows: &'a Workflows,
    pub policy: &'a Policy,
    /// The final records.
    pub tasks: &'a [TaskRecord],
    /// Every landed write, in the order they landed.
    pub writes: &'a [WriteRecord],
    pub alerts: &'a [OperatorAlert],
    pub ledger: &'a Ledger,
}
