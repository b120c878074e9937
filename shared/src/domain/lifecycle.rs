//! The task lifecycle as an explicit transition table. Every decision in
//! [`crate::domain::task`] looks its target state up here, so the table is the
//! single statement of which moves exist; a move missing from it is refused.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting to be claimed by a scheduler for its current step.
    Pending,
    /// Claimed: an agent works on the current step under a lease until complete-by.
    Processing,
    /// A timer step, or a callback step whose agent started the work, waits with no lease
    /// and nothing running: its deadline is its wake time (a timer) or when its callback
    /// is due (the timeout or the next heartbeat), so the due index holds it and nothing
    /// runs until then.
    Waiting,
    /// Undoing completed steps in reverse order; claimable when unlocked.
    Compensating,
    /// Terminal: every step succeeded.
    Processed,
    /// Terminal: needs an operator (no compensation defined, a compensation failed, or a
    /// pivot's effect stands or may stand).
    Error,
    /// Terminal: the order failed and nothing it did stands: every step that may have
    /// taken effect was undone (or only read).
    Compensated,
}

impl ProcessState {
    pub const ALL: [ProcessState; 7] = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Waiting,
        ProcessState::Compensating,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::Compensated,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, ProcessState::Processed | ProcessState::Error | ProcessState::Compensated)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Waiting => "Waiting",
            ProcessState::Compensating => "Compensating",
            ProcessState::Processed => "Processed",
            ProcessState::Error => "Error",
            ProcessState::Compensated => "Compensated",
        }
    }
}

/// What moves a task. The cause (a reply, a passed deadline) decides the trigger;
/// the trigger and the current state decide the next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Trigger {
    /// A scheduler won the conditional claim.
    Claimed,
    /// A forward step succeeded and more remain.
    Advanced,
    /// The last forward step succeeded (an agent's, or a timer's when it woke).
    Finished,
    /// A branch of a parallel stage succeeded while others still run: the stage waits
    /// for them, under the same lease.
    BranchDone,
    /// A timer step started waiting: nothing is dispatched, and no failure can happen.
    Slept,
    /// A waiting timer's time came and more steps remain: on to the next, no failure
    /// counted.
    Woke,
    /// A callback step's agent answered that it started the work: wait for the outside
    /// to complete it.
    Started,
    /// The outside says a callback step is still being worked on: its heartbeat deadline
    /// moves out; nothing else changes.
    Heartbeat,
    /// The deadline passed (or an attempt was lost) below the failure threshold: try again.
    Retry,
    /// Give up with no way to undo: operator needed.
    Fail,
    /// Give up where undoing would leave a pivot's effect standing (a pivot was
    /// dispatched with no definitive answer, or one already succeeded): nothing is
    /// undone, and an operator goes forward or undoes by hand.
    ForwardOnly,
    /// Give up and undo the completed steps.
    Undo,
    /// A compensation succeeded and more remain.
    UndoAdvanced,
    /// Nothing (more) to undo.
    Undone,
    /// Operator: an Error task runs forward again from its failed step (or an earlier
    /// one), with a fresh failure budget.
    Resubmit,
    /// Operator: undo the completed steps of an Error task, or resume an undo that failed.
    OperatorUndo,
    /// Operator or app: stop a live task and undo what it may have done; the attempt in
    /// flight is fenced off (its lease is dropped).
    Cancel,
    /// Cancel, where nothing the task did needs undoing.
    CancelUndone,
    /// Operator: hold a live task where it is: nothing new is dispatched (an attempt in
    /// flight finishes and its reply applies; timers and callbacks still arrive), and a
    /// task that comes to wait for a claim is parked off the supervisor's sweep.
    Pause,
    /// Operator: let a paused task go on from where it stopped.
    Resume,
    /// The step's agent has limits and no room: the task waits for a place in its gate,
    /// with a ticket, no lease and no failure counted (also when the supervisor finds it
    /// still waiting and asks again).
    Queued,
    /// The agent's remote answered 429 or 503 with Retry-After: the lease ends, the agent's
    /// gate pauses, and the step is tried again after the pause, no failure counted. Or
    /// the state store throttled the claim: the task's deadline moves out past the
    /// Schedule's backoff, no failure counted.
    Throttled,
    /// An item of a map over an agent with limits answered for good and items remain: the
    /// lease ends, and the next item's claim takes its own place in the agent's gate
    /// (`MapStep::gated`).
    NextItem,
}

impl Trigger {
    pub const ALL: [Trigger; 23] = [
        Trigger::Claimed,
        Trigger::Advanced,
        Trigger::Finished,
        Trigger::BranchDone,
        Trigger::Slept,
        Trigger::Woke,
        Trigger::Started,
        Trigger::Heartbeat,
        Trigger::Retry,
        Trigger::Fail,
        Trigger::ForwardOnly,
        Trigger::Undo,
        Trigger::UndoAdvanced,
        Trigger::Undone,
        Trigger::Resubmit,
        Trigger::OperatorUndo,
        Trigger::Cancel,
        Trigger::CancelUndone,
        Trigger::Pause,
        Trigger::Resume,
        Trigger::Queued,
        Trigger::Throttled,
        Trigger::NextItem,
    ];

    /// Triggers only an operator (or an app's cancel) pulls: the only moves out of a
    /// terminal state are theirs.
    pub fn is_operator(self) -> bool {
        matches!(
            self,
            Trigger::Resubmit
                | Trigger::OperatorUndo
                | Trigger::Cancel
                | Trigger::CancelUndone
                | Trigger::Pause
                | Trigger::Resume
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Claimed => "Claimed",
            Trigger::Advanced => "Advanced",
            Trigger::Finished => "Finished",
            Trigger::BranchDone => "BranchDone",
            Trigger::Slept => "Slept",
            Trigger::Woke => "Woke",
            Trigger::Started => "Started",
            Trigger::Heartbeat => "Heartbeat",
            Trigger::Retry => "Retry",
            Trigger::Fail => "Fail",
            Trigger::ForwardOnly => "ForwardOnly",
            Trigger::Undo => "Undo",
            Trigger::UndoAdvanced => "UndoAdvanced",
            Trigger::Undone => "Undone",
            Trigger::Resubmit => "Resubmit",
            Trigger::OperatorUndo => "OperatorUndo",
            Trigger::Cancel => "Cancel",
            Trigger::CancelUndone => "CancelUndone",
            Trigger::Pause => "Pause",
            Trigger::Resume => "Resume",
            Trigger::Queued => "Queued",
            Trigger::Throttled => "Throttled",
            Trigger::NextItem => "NextItem",
        }
    }

    pub fn parse(name: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

use ProcessState::*;
use Trigger::*;

/// (from, trigger, to). Terminal states absorb every trigger of the pipeline; only an
/// operator's triggers leave one, and only Error.
pub const TRANSITIONS: &[(ProcessState, Trigger, ProcessState)] = &[
    (Pending, Claimed, Processing),
    (Pending, Retry, Pending),
    (Pending, Fail, Error),
    (Pending, ForwardOnly, Error),
    (Pending, Undo, Compensating),
    (Pending, Undone, Compensated),
    (Processing, Advanced, Pending),
    (Processing, Finished, Processed),
    (Processing, Retry, Pending),
    (Processing, Fail, Error),
    (Processing, ForwardOnly, Error),
    (Processing, Undo, Compensating),
    (Processing, Undone, Compensated),
    (Compensating, Claimed, Compensating),
    (Compensating, UndoAdvanced, Compensating),
    (Compensating, Undone, Compensated),
    (Compensating, Retry, Compensating),
    (Compensating, Fail, Error),
    (Error, Resubmit, Pending),
    (Error, OperatorUndo, Compensating),
    (Pending, Cancel, Compensating),
    (Processing, Cancel, Compensating),
    (Pending, CancelUndone, Compensated),
    (Processing, CancelUndone, Compensated),
    // Timer steps: a claim of one waits instead of dispatching; its time wakes it on to the
    // next step (or the end). No row retries or fails a waiting task: waiting cannot fail.
    (Pending, Slept, Waiting),
    (Waiting, Woke, Pending),
    (Waiting, Finished, Processed),
    (Waiting, Cancel, Compensating),
    (Waiting, CancelUndone, Compensated),
    // Callback steps: the claim dispatches the agent as for any step, and its answer that
    // the work started waits for the outside. The outside's completion (also before the
    // agent's answer, while Processing) ends the step as an agent's reply would: success
    // goes on, failure is a refusal. A missed timeout or heartbeat is a lapse like any
    // other, so only a callback's wait (never a timer's: `timer.rs` wakes those) retries
    // or gives up from Waiting.
    (Processing, Started, Waiting),
    (Processing, Heartbeat, Processing),
    (Waiting, Heartbeat, Waiting),
    (Waiting, Advanced, Pending),
    (Waiting, Retry, Pending),
    (Waiting, Fail, Error),
    (Waiting, ForwardOnly, Error),
    (Waiting, Undo, Compensating),
    (Waiting, Undone, Compensated),
    // Pause and resume: an operator's hold on a live task changes no state; what it
    // changes is what a claim may do (`claim.rs`) and whether a task waiting for a claim
    // is due (`record.rs`, `parked`).
    (Pending, Pause, Pending),
    (Processing, Pause, Processing),
    (Waiting, Pause, Waiting),
    (Compensating, Pause, Compensating),
    (Pending, Resume, Pending),
    (Processing, Resume, Processing),
    (Waiting, Resume, Waiting),
    (Compensating, Resume, Compensating),
    // Parallel stages: the claim of a stage dispatches every branch still to do under one
    // lease, each with its own attempt. A branch's success while others run keeps the
    // task Processing; the last one's is Advanced or Finished, and a refusal or a lapse
    // gives up through the rows above, as a lone step's would.
    (Processing, BranchDone, Processing),
    // Flow control: a step whose agent has no room waits for its turn in the agent's gate
    // (`gate.rs`) before its claim, and a remote's "too many requests" puts the step back
    // to wait. Neither counts a failure, and neither leaves the task without a deadline.
    (Pending, Queued, Pending),
    (Compensating, Queued, Compensating),
    (Processing, Throttled, Pending),
    (Pending, Throttled, Pending),
    (Compensating, Throttled, Compensating),
    // Map steps: a map's items are dispatched by its claim and by each item's reply, up
    // to its cap, under one lease (`BranchDone` while items remain). A map over no items
    // is done at its claim, with nothing dispatched.
    (Pending, Advanced, Pending),
    (Pending, Finished, Processed),
    // A map over an agent with limits sends one item at a time, each by a claim through
    // the agent's gate: an item's answer hands the lease back while items remain.
    (Processing, NextItem, Pending),
];

/// The next state, or `None` when the table has no such move.
pub fn next(from: ProcessState, trigger: Trigger) -> Option<ProcessState> {
    TRANSITIONS.iter().find(|(f, t, _)| *f == from && *t == trigger).map(|(_, _, to)| *to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_row_is_reachable_through_next() {
        for &(from, trigger, to) in TRANSITIONS {
            assert_eq!(next(from, trigger), Some(to), "{from:?} --{trigger:?}-->");
        }
    }

    #[test]
    fn the_table_is_a_function() {
        let mut seen = HashSet::new();
        for &(from, trigger, _) in TRANSITIONS {
            assert!(seen.insert((from, trigger)), "duplicate row {from:?} {trigger:?}");
        }
    }

    #[test]
    fn terminal_states_absorb_every_trigger_of_the_pipeline() {
        for state in ProcessState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for trigger in Trigger::ALL.into_iter().filter(|t| !t.is_operator()) {
                assert_eq!(next(state, trigger), None, "{state:?} moved on {trigger:?}");
            }
        }
        // An operator moves only Error; Processed and Compensated stay as they are.
        for trigger in Trigger::ALL {
            assert_eq!(next(Processed, trigger), None);
            assert_eq!(next(Compensated, trigger), None);
        }
        // Pausing is for live tasks: it changes no state, only whether anything is dispatched.
        for &(from, trigger, to) in TRANSITIONS {
            if matches!(trigger, Pause | Resume) {
                assert!(!from.is_terminal() && from == to, "{from:?} {trigger:?}");
            }
        }
        // Cancelling is for live tasks; one that is undoing already is left to it.
        for state in [Error, Compensating] {
            assert_eq!(next(state, Cancel), None);
            assert_eq!(next(state, CancelUndone), None);
        }
    }

    #[test]
    fn trigger_names_round_trip() {
        for trigger in Trigger::ALL {
            assert_eq!(Trigger::parse(trigger.as_str()), Some(trigger));
            assert_eq!(serde_json::to_string(&trigger).unwrap(), format!("\"{}\"", trigger.as_str()));
        }
    }

    #[test]
    fn moves_not_in_the_table_are_refused() {
        let rows: HashSet<_> = TRANSITIONS.iter().map(|(f, t, _)| (*f, *t)).collect();
        for state in ProcessState::ALL {
            for trigger in Trigger::ALL {
                assert_eq!(next(state, trigger).is_some(), rows.contains(&(state, trigger)));
            }
        }
        // The ones that matter most: a claimed task cannot be claimed again,
        // and the forward phase cannot be re-entered from compensation.
        assert_eq!(next(Processing, Claimed), None);
        assert_eq!(next(Compensating, Advanced), None);
        assert_eq!(next(Compensating, Finished), None);
        assert_eq!(next(Compensating, Undo), None);
        // Compensation never starts past a pivot, so it never meets one.
        assert_eq!(next(Compensating, ForwardOnly), None);
    }

    #[test]
    fn a_waiting_task_wakes_is_completed_lapses_or_is_cancelled() {
        let leaving: Vec<(Trigger, ProcessState)> =
            TRANSITIONS.iter().filter(|(f, _, _)| *f == Waiting).map(|(_, t, to)| (*t, *to)).collect();
        assert_eq!(
            leaving,
            [
                (Woke, Pending),
                (Finished, Processed),
                (Cancel, Compensating),
                (CancelUndone, Compensated),
                (Heartbeat, Waiting),
                (Advanced, Pending),
                (Retry, Pending),
                (Fail, Error),
                (ForwardOnly, Error),
                (Undo, Compensating),
                (Undone, Compensated),
                (Pause, Waiting),
                (Resume, Waiting),
            ]
        );
        // Nothing claims a waiting task: no lease while it waits.
        for trigger in [Claimed, Slept, Started, UndoAdvanced] {
            assert_eq!(next(Waiting, trigger), None, "{trigger:?}");
        }
        // Only a forward step waits: a timer from Pending, a callback from its claim.
        let into: Vec<ProcessState> =
            TRANSITIONS.iter().filter(|(_, _, to)| *to == Waiting).map(|(f, _, _)| *f).collect();
        assert_eq!(into, [Pending, Processing, Waiting, Waiting, Waiting]);
        for state in ProcessState::ALL.into_iter().filter(|s| *s != Waiting) {
            assert_eq!(next(state, Woke), None, "{state:?}");
        }
        // A heartbeat never moves a task to another state.
        for &(from, trigger, to) in TRANSITIONS {
            if trigger == Heartbeat {
                assert_eq!(from, to);
            }
        }
    }

    #[test]
    fn waiting_for_capacity_never_leaves_the_state_it_waits_in_for_another_than_its_claims() {
        // Queued holds a task where it waits for its claim; Throttled hands a lease back to
        // the state its claim came from (or, for the store's throttle, keeps a waiting task
        // where it waits). Neither reaches a terminal state or Error.
        let rows: Vec<_> = TRANSITIONS.iter().filter(|(_, t, _)| matches!(t, Queued | Throttled)).collect();
        assert_eq!(
            rows,
            [
                &(Pending, Queued, Pending),
                &(Compensating, Queued, Compensating),
                &(Processing, Throttled, Pending),
                &(Pending, Throttled, Pending),
                &(Compensating, Throttled, Compensating),
            ]
        );
        for &&(from, trigger, to) in &rows {
            assert!(next(to, Claimed).is_some(), "{from:?} --{trigger:?}--> {to:?} must be claimable");
        }
    }

    #[test]
    fn every_terminal_state_is_reachable_and_every_state_can_end() {
        let reachable_to: HashSet<_> = TRANSITIONS.iter().map(|(_, _, to)| *to).collect();
        for state in ProcessState::ALL.into_iter().filter(|s| s.is_terminal()) {
            assert!(reachable_to.contains(&state), "{state:?} unreachable");
        }
        for state in ProcessState::ALL.into_iter().filter(|s| !s.is_terminal()) {
            assert!(
                TRANSITIONS.iter().any(|(f, _, to)| *f == state && to.is_terminal()),
                "{state:?} has no way to end"
            );
        }
    }
}
