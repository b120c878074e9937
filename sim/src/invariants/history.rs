//! What one order's history shows: the steps it claimed, ran and undid, the branches a
//! stage's claim dispatched, the callback steps the outside declined, the effects the
//! remote applied for it, and its causes in words for a violation's detail.

use std::collections::BTreeSet;

use sas::adapters::embedded::WriteRecord;
use sas::domain::{Act, Action, Cause, OrderId};

use crate::ledger::Ledger;

/// One order's causes, compactly, for a violation's detail.
pub fn history_of(writes: &[WriteRecord], id: &OrderId) -> String {
    let causes: Vec<String> = writes
        .iter()
        .filter(|w| &w.after.order_id == id)
        .map(|w| format!("{:?}->{:?}", w.after.last_cause, w.after.state()))
        .collect();
    causes.join(", ")
}

pub(super) fn history_of_writes(history: &[&WriteRecord]) -> String {
    let causes: Vec<String> =
        history.iter().map(|w| format!("{:?}->{:?}", w.after.last_cause, w.after.state())).collect();
    causes.join(", ")
}

/// What one order's writes show of its steps.
#[derive(Default)]
pub(super) struct Ran {
    /// Steps claimed to run forward.
    pub(super) claimed_do: BTreeSet<u32>,
    /// Steps that ran forward.
    pub(super) done: BTreeSet<u32>,
    /// Steps undone, in the order undone.
    pub(super) undone: Vec<u32>,
    /// Writes that entered a terminal state, and operators' actions that reopened one.
    pub(super) terminal_entries: u32,
    pub(super) reopened: u32,
}

impl Ran {
    pub(super) fn of(history: &[&WriteRecord]) -> Ran {
        let mut ran = Ran::default();
        for w in history {
            match &w.after.last_cause {
                // Not counted as reopening: the table has no cancel from a terminal state,
                // so such a write is already an Absorbing violation.
                Cause::Operator { act: Act::Cancel, .. } => {}
                Cause::Operator { .. } if w.before.as_ref().is_some_and(|b| b.state().is_terminal()) => {
                    ran.reopened += 1;
                }
                // A stage's claim dispatches its branches: each counts as claimed.
                Cause::Claimed { step, action: Action::Do } => match dispatched_branches(w) {
                    Some(branches) => ran.claimed_do.extend(branches),
                    None => {
                        ran.claimed_do.insert(*step);
                    }
                },
                Cause::Succeeded { step, action: Action::Do }
                | Cause::Woke { step, .. }
                | Cause::Completed { step }
                | Cause::NoItems { step } => {
                    ran.done.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Undo } => ran.undone.push(*step),
                _ => {}
            }
            if w.after.state().is_terminal() && w.before.as_ref().is_none_or(|b| !b.state().is_terminal()) {
                ran.terminal_entries += 1;
            }
        }
        ran
    }
}

/// The branches a write's claim of a parallel stage dispatched (those whose dispatches it
/// counted up), or `None` when the write claimed no stage.
pub fn dispatched_branches(w: &WriteRecord) -> Option<Vec<u32>> {
    let Cause::Claimed { step, action: Action::Do } = w.after.last_cause else { return None };
    let run = w.after.stage().filter(|run| run.at == step)?;
    // A map's items all run its one step.
    if run.map {
        return Some(vec![step]);
    }
    let was =
        |i: u32| w.before.as_ref().and_then(|b| b.stage()).filter(|r| r.at == step).and_then(|r| r.branch(i));
    Some(
        run.each()
            .filter(|(i, b)| b.dispatches > was(*i).map_or(0, |w| w.dispatches))
            .map(|(i, _)| i)
            .collect(),
    )
}

/// Callback steps whose work the outside declined (docs/DESIGN.md: the outside's failure is a
/// refusal: the step had no effect), as the task last heard: a failure of the step while it
/// waited on a callback, not followed by the work starting or completing again. The remote's
/// ledger shows such a step's call applied (the work started), yet nothing of it stands.
pub(super) fn declined(history: &[&WriteRecord]) -> BTreeSet<u32> {
    let mut declined = BTreeSet::new();
    for w in history {
        let Some(before) = &w.before else { continue };
        match &w.after.last_cause {
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. }
                if before.callback().is_some_and(|cb| cb.step == *step) =>
            {
                declined.insert(*step);
            }
            Cause::Started { step } | Cause::Completed { step } => {
                declined.remove(step);
            }
            _ => {}
        }
    }
    declined
}

/// The effects the remote applied for order `id`, in the order applied: (step, action).
pub(super) fn remote_effects(ledger: &Ledger, id: &OrderId) -> Vec<(u32, Action)> {
    ledger
        .effects
        .iter()
        .filter(|(_, o, ..)| o == id.as_str())
        .map(|(_, _, step, action)| (*step, *action))
        .collect()
}
