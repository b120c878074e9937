//! Compensation: in the records and at the remote side, newest first and once each, only
//! what may have taken effect (a parallel stage's branches exactly), and nothing undone once
//! a pivot took effect.

use std::collections::{BTreeMap, BTreeSet};

use sas::adapters::embedded::WriteRecord;
use sas::domain::{Action, Cause, OrderId, ProcessState, StepKind, TaskRecord, Workflow};

use super::catalogue::Invariant;
use super::history::{Ran, dispatched_branches, history_of_writes};
use super::transitions::{applied, branch_live};
use crate::ledger::Ledger;

/// Undoing a parallel stage, judged from the order's history (claims, replies, undo
/// claims), not from the branches the record keeps. A branch *may have taken effect* once
/// a claim dispatched it, unless its service refused that dispatch for good (a refusal
/// applied while it was in flight). A resubmit alone does not undo a refusal; a dispatch
/// after it does, as for a lone step (sas then no longer leans on the refusal). Then:
/// - a compensation is dispatched only for a branch that may have taken effect;
/// - each such branch is undone at most once (per forward dispatch);
/// - a task that ends Compensated undid every one that has a compensation, and none of
///   its pivot branches may have taken effect.
pub(super) fn stage_undo_exact(
    task: &TaskRecord,
    workflow: &Workflow,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    if workflow.stages.is_empty() {
        return;
    }
    let id = &task.order_id;
    #[derive(Default, Clone, Copy)]
    struct Seen {
        dispatched: bool,
        refused: bool,
        undone: u32,
    }
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    let may_have_taken_effect = |s: &Seen| s.dispatched && !s.refused;
    for w in history {
        let Some(before) = &w.before else { continue };
        let after = &w.after;
        if let Some(branches) = dispatched_branches(w) {
            for b in branches.into_iter().filter(|b| workflow.stage_of(*b).is_some()) {
                seen.insert(b, Seen { dispatched: true, refused: false, undone: 0 });
            }
        }
        match &after.last_cause {
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. }
                if workflow.stage_of(*step).is_some() && branch_live(before, *step, after.updated_at) =>
            {
                seen.entry(*step).or_default().refused = true;
            }
            Cause::Claimed { step, action: Action::Undo } if workflow.stage_of(*step).is_some() => {
                let s = seen.get(step).copied().unwrap_or_default();
                if !may_have_taken_effect(&s) {
                    add(
                        Invariant::StageUndoExact,
                        format!(
                            "order {id}: compensation of branch {step} dispatched, though it {}; history: {}",
                            if s.dispatched { "was refused" } else { "was never dispatched" },
                            history_of_writes(history)
                        ),
                    );
                }
            }
            Cause::Succeeded { step, action: Action::Undo } if workflow.stage_of(*step).is_some() => {
                let s = seen.entry(*step).or_default();
                s.undone += 1;
                if s.undone > 1 {
                    add(
                        Invariant::StageUndoExact,
                        format!("order {id}: branch {step} undone {} times", s.undone),
                    );
                }
            }
            _ => {}
        }
        if after.state() == ProcessState::Compensated && before.state() != ProcessState::Compensated {
            for (step, s) in seen.iter().filter(|(_, s)| may_have_taken_effect(s)) {
                let Some(def) = workflow.step(*step) else { continue };
                let wrong = match def.kind() {
                    StepKind::Pivot => Some("a pivot branch that may have taken effect"),
                    StepKind::Compensable if s.undone == 0 => {
                        Some("a branch that may have taken effect, never undone")
                    }
                    _ => None,
                };
                if let Some(wrong) = wrong {
                    add(
                        Invariant::StageUndoExact,
                        format!(
                            "order {id} Compensated with branch {step} ({}) {wrong}; history: {}",
                            def.name,
                            history_of_writes(history)
                        ),
                    );
                }
            }
        }
    }
}

/// Compensation in the records: descending, once each, only what ran forward and can be
/// undone; a Compensated task undid every compensable step it did, a Processed one did
/// every step and undid none.
pub(super) fn compensated_in_the_records(
    task: &TaskRecord,
    workflow: &Workflow,
    ran: &Ran,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    let Ran { claimed_do, done, undone, .. } = ran;
    // A map's items are undone one by one at its step: one step of the walk down.
    let mut undone = undone.clone();
    undone.dedup_by(|a, b| a == b && workflow.map_at(*a).is_some());
    let undone = &undone;
    if undone.windows(2).any(|p| p[0] <= p[1]) {
        add(Invariant::Compensation, format!("order {id}: compensations in order {undone:?}"));
    }
    for step in undone {
        if !claimed_do.contains(step) || workflow.step(*step).is_none_or(|s| s.compensation.is_none()) {
            add(
                Invariant::Compensation,
                format!("order {id}: undid step {step}, which never ran or cannot be undone"),
            );
        }
    }
    if task.state() == ProcessState::Compensated {
        // A map's items are undone item by item, only those that took effect (`maps.rs`).
        let compensable = |s: &&u32| workflow.step(**s).is_some_and(|d| d.compensation.is_some());
        for step in done.iter().filter(compensable).filter(|s| workflow.map_at(**s).is_none()) {
            if !undone.contains(step) {
                add(
                    Invariant::Compensation,
                    format!("order {id} Compensated but step {step} was done and never undone"),
                );
            }
        }
    }
    if task.state() == ProcessState::Processed && (done.len() as u32 != workflow.len() || !undone.is_empty())
    {
        add(
            Invariant::Compensation,
            format!("order {id} Processed with steps {done:?} done and {undone:?} undone"),
        );
    }
}

/// Compensation at the remote side: newest first, and nothing done after its undo.
pub(super) fn compensated_at_the_remote(
    id: &OrderId,
    effects: &[(u32, Action)],
    add: &mut impl FnMut(Invariant, String),
) {
    let undo_steps: Vec<u32> = effects.iter().filter(|(_, a)| *a == Action::Undo).map(|(s, _)| *s).collect();
    if undo_steps.windows(2).any(|p| p[0] <= p[1]) {
        add(Invariant::Compensation, format!("order {id}: the remote undid steps in order {undo_steps:?}"));
    }
    for (i, (step, action)) in effects.iter().enumerate() {
        if *action == Action::Do && effects[..i].contains(&(*step, Action::Undo)) {
            add(Invariant::Compensation, format!("order {id}: step {step} took effect after it was undone"));
        }
    }
}

/// Once a pivot's effect was applied, the task only goes forward: no compensation may be
/// applied for it at all, whatever state it ends in.
pub(super) fn pivot_goes_forward(
    ledger: &Ledger,
    id: &OrderId,
    workflow: &Workflow,
    effects: &[(u32, Action)],
    declined: &BTreeSet<u32>,
    add: &mut impl FnMut(Invariant, String),
) {
    let pivot_applied = (0..workflow.len()).find(|&s| {
        workflow.step(s).is_some_and(|d| d.is_pivot())
            && applied(ledger, id, s, Action::Do)
            && !declined.contains(&s)
    });
    if let Some(pivot) = pivot_applied
        && let Some((step, _)) = effects.iter().find(|(_, a)| *a == Action::Undo)
    {
        add(
            Invariant::PivotGoesForward,
            format!("order {id}: pivot step {pivot} took effect, yet step {step} was undone"),
        );
    }
}
