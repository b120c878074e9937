//! Reading a write back: which trigger of the transition table it carried out (restated
//! from the README's lifecycle, not taken from the domain's code), which parallel stage a
//! record runs and which a write takes it past, and whether the remote applied an effect.

use std::collections::BTreeMap;

use sas::adapters::embedded::WriteRecord;
use sas::domain::workflow::Stage;
use sas::domain::{
    Action, Cause, OrderId, ProcessState, StepKind, TaskRecord, Trigger, Workflow, Workflows, idempotency_key,
};

use crate::ledger::Ledger;

/// Whether a give-up leaves the task in Error because a pivot's effect stands or may
/// stand, restated from docs/REFERENCE.md's give-up rule (not from the domain's code) so the
/// checker can tell `ForwardOnly` from `Fail`.
fn forward_only(before: &TaskRecord, after: &TaskRecord, wf: &Workflow) -> bool {
    // In doubt: dispatched and never answered for good, or answered with something that
    // cannot be kept (an agent's output, or the outside's completion, too large).
    let in_doubt = (matches!(after.last_cause, Cause::DeadlinePassed { .. }) && before.step_attempts > 0)
        || matches!(after.last_cause, Cause::Failed { in_doubt: true, .. });
    let redoing = before.redo_until.is_some_and(|u| before.step <= u);
    // At a stage, a pivot among its branches that was dispatched and not refused (the
    // branches as the give-up left them: Error keeps them).
    let pivot_branch_in_doubt = || {
        wf.stage_at(before.step).is_some_and(|stage| {
            stage.branches().any(|i| {
                wf.step(i).is_some_and(|s| s.is_pivot())
                    && after
                        .stage()
                        .as_ref()
                        .and_then(|run| run.branch(i))
                        .is_some_and(|b| b.may_have_taken_effect())
            })
        })
    };
    // At a pivot map, an item dispatched and not refused.
    let pivot_item_in_doubt = || {
        wf.step(before.step).is_some_and(|s| s.is_pivot())
            && after
                .stage()
                .is_some_and(|run| run.map && run.branches.iter().any(|b| b.may_have_taken_effect()))
    };
    let current_in_doubt = match wf.stage_at(before.step) {
        Some(_) => pivot_branch_in_doubt(),
        None if wf.map_at(before.step).is_some() => pivot_item_in_doubt(),
        None => in_doubt && wf.step(before.step).is_some_and(|s| s.kind() == StepKind::Pivot),
    };
    before.action() == Action::Do && (redoing || wf.pivot_before(before.step).is_some() || current_in_doubt)
}

/// The trigger a landed write carried out, read back from the record before and after.
pub fn infer_trigger(before: &TaskRecord, after: &TaskRecord, wf: Option<&Workflow>) -> Option<Trigger> {
    use ProcessState::*;
    // A gated map's item answered for good, more to go: the lease goes back, the step stays.
    let next_item = before.state() == Processing
        && after.state() == Pending
        && after.step == before.step
        && after.stage().is_some_and(|run| run.map && run.at == after.step);
    Some(match &after.last_cause {
        Cause::Submitted => return None,
        Cause::Succeeded { action: Action::Do, .. } | Cause::Failed { .. } if next_item => Trigger::NextItem,
        Cause::Claimed { .. } => Trigger::Claimed,
        Cause::Slept { .. } => Trigger::Slept,
        Cause::Woke { .. } if after.state() == Processed => Trigger::Finished,
        Cause::Woke { .. } => Trigger::Woke,
        Cause::Succeeded { action: Action::Do, .. } if after.state() == Processed => Trigger::Finished,
        // A branch's success while others of its stage still run: the task stays Processing.
        Cause::Succeeded { action: Action::Do, .. } if after.state() == Processing => Trigger::BranchDone,
        Cause::Succeeded { action: Action::Do, .. } => Trigger::Advanced,
        Cause::Succeeded { action: Action::Undo, .. } if after.state() == Compensated => Trigger::Undone,
        Cause::Succeeded { action: Action::Undo, .. } => Trigger::UndoAdvanced,
        Cause::Started { .. } => Trigger::Started,
        Cause::Heartbeat { .. } => Trigger::Heartbeat,
        Cause::Queued { .. } => Trigger::Queued,
        Cause::Throttled { .. } | Cause::StoreThrottled { .. } => Trigger::Throttled,
        Cause::Completed { .. } | Cause::NoItems { .. } if after.state() == Processed => Trigger::Finished,
        Cause::Completed { .. } | Cause::NoItems { .. } => Trigger::Advanced,
        Cause::Operator { act, .. } => match (act, after.state()) {
            (sas::domain::Act::Resubmit { .. }, _) => Trigger::Resubmit,
            (sas::domain::Act::Compensate, _) => Trigger::OperatorUndo,
            (sas::domain::Act::Cancel, Compensated) => Trigger::CancelUndone,
            (sas::domain::Act::Cancel, _) => Trigger::Cancel,
            (sas::domain::Act::Pause, _) => Trigger::Pause,
            (sas::domain::Act::Resume, _) => Trigger::Resume,
        },
        Cause::Failed { .. } | Cause::DeadlinePassed { .. } => match (before.state(), after.state()) {
            (_, Error) if wf.is_some_and(|wf| forward_only(before, after, wf)) => Trigger::ForwardOnly,
            (_, Error) => Trigger::Fail,
            (_, Compensated) => Trigger::Undone,
            (Compensating, Compensating) => Trigger::Retry,
            (_, Compensating) => Trigger::Undo,
            (_, Pending) => Trigger::Retry,
            // A map's item refused within its tolerance: the map goes on.
            (Processing, Processing) if matches!(after.last_cause, Cause::Failed { .. }) => {
                Trigger::BranchDone
            }
            _ => return None,
        },
    })
}

/// (state, trigger) of every landed transition.
pub fn coverage(writes: &[WriteRecord], workflows: &Workflows) -> BTreeMap<(ProcessState, Trigger), u64> {
    let mut seen = BTreeMap::new();
    for w in writes {
        if let Some(before) = &w.before
            && let Some(trigger) = infer_trigger(
                before,
                &w.after,
                workflows.get_version(&w.after.workflow, w.after.workflow_version),
            )
        {
            *seen.entry((before.state(), trigger)).or_default() += 1;
        }
    }
    seen
}

/// The parallel stage `t` runs going forward: Pending or Processing at its first step.
/// Anything else (past it, undoing it, given up, ended) means the stage ended.
pub fn running_stage<'w>(t: &TaskRecord, wf: &'w Workflow) -> Option<&'w Stage> {
    wf.stage_at(t.step).filter(|_| matches!(t.state(), ProcessState::Pending | ProcessState::Processing))
}

/// Whether branch `step` of the stage `before` runs has a dispatch in flight under the live
/// lease, its reply in time at `at`: the one record a branch's reply may change.
pub fn branch_live(before: &TaskRecord, step: u32, at: sas::domain::Timestamp) -> bool {
    before.state() == ProcessState::Processing
        && before.locked_by().is_some()
        && before.stage().is_some_and(|run| {
            run.at == before.step && run.branch(step).and_then(|b| b.complete_by).is_some_and(|cb| at <= cb)
        })
}

/// How far forward a record stands: its step, or past the last once Processed; `None`
/// while undoing (it goes no further forward).
fn forward_position(t: &TaskRecord, wf: &Workflow) -> Option<u32> {
    match t.state() {
        ProcessState::Processed => Some(wf.len()),
        ProcessState::Compensating | ProcessState::Compensated => None,
        _ => Some(t.step),
    }
}

/// The stages a write takes the task past (from a step before a stage's end to one at or
/// after it, or to Processed).
pub fn stages_passed<'w>(before: &TaskRecord, after: &TaskRecord, wf: &'w Workflow) -> Vec<&'w Stage> {
    let (Some(from), Some(to)) = (forward_position(before, wf), forward_position(after, wf)) else {
        return Vec::new();
    };
    wf.stages.iter().filter(|st| from < st.end() && to >= st.end()).collect()
}

/// Whether the remote applied the effect of `step`'s `action` for order `id`.
pub(super) fn applied(ledger: &Ledger, id: &OrderId, step: u32, action: Action) -> bool {
    ledger.is_applied(&idempotency_key(id, step, action).0)
}
