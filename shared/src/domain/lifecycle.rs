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
    pub const ALL: [ProcessState; 6] = [
        ProcessState::Pending,
        ProcessState::Processing,
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
    /// The last forward step succeeded.
    Finished,
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
}

impl Trigger {
    pub const ALL: [Trigger; 9] = [
        Trigger::Claimed,
        Trigger::Advanced,
        Trigger::Finished,
        Trigger::Retry,
        Trigger::Fail,
        Trigger::ForwardOnly,
        Trigger::Undo,
        Trigger::UndoAdvanced,
        Trigger::Undone,
    ];
}

use ProcessState::*;
use Trigger::*;

/// (from, trigger, to). Terminal states have no rows: they absorb every trigger.
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
    fn terminal_states_absorb_every_trigger() {
        for state in ProcessState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for trigger in Trigger::ALL {
                assert_eq!(next(state, trigger), None, "{state:?} moved on {trigger:?}");
            }
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
