//! The checks of each landed write, on its own and against the one before it on its
//! order: a move of the transition table, one live lease, a stage joined only when every
//! branch took effect; and each operator's action landing at most once.

use std::collections::{BTreeMap, BTreeSet};

use sas::adapters::embedded::WriteRecord;
use sas::domain::{Action, Cause, ProcessState, TaskRecord, Workflow, lifecycle};

use super::catalogue::{Invariant, Records};
use super::failures::failures_within_budget;
use super::fences::{completions_fenced, replies_fenced};
use super::transitions::{applied, infer_trigger, stages_passed};
use crate::ledger::Ledger;

/// Every write, on its own and against the one before it on its order, in the order
/// they landed.
pub(super) fn check_writes(r: &Records, add: &mut impl FnMut(Invariant, String)) {
    // The latest record of each order, as the writes so far left it: each write must start
    // from it.
    let mut latest: BTreeMap<&str, &TaskRecord> = BTreeMap::new();
    // Each order's throttled wait at its current step and direction, summed from the
    // pauses of its Throttled moves in the log, not read from the record's own count.
    let mut throttled: BTreeMap<&str, u64> = BTreeMap::new();
    for w in r.writes {
        let after: &TaskRecord = &w.after;
        let id = after.order_id.as_str();
        if let Some(v) = after.shape_violation() {
            add(Invariant::Shape, format!("order {id} revision {}: {v}", after.revision));
        }
        let Some(before) = w.before.as_deref() else {
            inserted(&latest, after, add);
            latest.insert(id, after);
            continue;
        };
        // The store shares a write's `before` with the write it came from: the same record
        // is equal without comparing it field by field.
        if latest.get(id).is_none_or(|l| !std::ptr::eq(*l, before) && *l != before) {
            add(Invariant::Lifecycle, format!("order {id}: a write did not start from the latest revision"));
        }
        latest.insert(id, after);
        let wf = r.workflows.get_version(&before.workflow, before.workflow_version);
        a_move_of_the_table(r, before, after, add);
        one_live_lease(before, after, add);
        let spent = throttled.entry(id).or_default();
        *spent = throttled_so_far(*spent, before, after);
        throttled_within_budget(after, *spent, wf, add);
        store_wait_uncounted(before, after, add);
        failures_within_budget(r, before, after, add);
        // A timer step whose time cannot be read fails with no reply: there is nothing to fence.
        let timer = wf.and_then(|wf| wf.step(before.step)).is_some_and(|s| s.is_timer());
        if !(timer && before.state() == ProcessState::Pending) {
            replies_fenced(before, after, wf, add);
        }
        completions_fenced(before, after, add);
        if let Some(wf) = wf {
            joins_only_when_all(r.ledger, before, after, wf, add);
        }
    }
}

/// A new task: the first of its order, and Pending.
fn inserted(
    latest: &BTreeMap<&str, &TaskRecord>,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    if latest.contains_key(id) {
        add(Invariant::TerminalOnce, format!("order {id} inserted twice"));
    }
    if after.state() != ProcessState::Pending {
        add(Invariant::Lifecycle, format!("order {id} inserted as {:?}", after.state()));
    }
}

/// A write is a row of the transition table, bumps the revision by one, and leaves a
/// terminal state only for an operator's action on Error.
fn a_move_of_the_table(
    r: &Records,
    before: &TaskRecord,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    let operator = matches!(after.last_cause, Cause::Operator { .. });
    if before.state().is_terminal() && !(operator && before.state() == ProcessState::Error) {
        add(
            Invariant::Absorbing,
            format!("order {id} left {:?} for {:?} ({:?})", before.state(), after.state(), after.last_cause),
        );
    }
    if after.revision != before.revision + 1 {
        add(Invariant::Lifecycle, format!("order {id}: revision {} -> {}", before.revision, after.revision));
    }
    match infer_trigger(before, after, r.workflows.get_version(&after.workflow, after.workflow_version)) {
        Some(t) if lifecycle::next(before.state(), t) == Some(after.state()) => {}
        t => add(
            Invariant::Lifecycle,
            format!("order {id}: {:?} --{t:?}--> {:?} is not in the table", before.state(), after.state()),
        ),
    }
}

/// The throttled wait of `after`'s step and direction, given `spent` before the write: it
/// starts again at a new step, a new direction (an undo begins), an undo that succeeded
/// (the next is another step's, or another item's of a map, each with a budget of its
/// own), and an operator's resubmit or undo; a Throttled move adds its pause.
fn throttled_so_far(spent: u64, before: &TaskRecord, after: &TaskRecord) -> u64 {
    let anew = before.step != after.step
        || before.action() != after.action()
        || matches!(
            after.last_cause,
            Cause::Operator { act: sas::domain::Act::Resubmit { .. } | sas::domain::Act::Compensate, .. }
                | Cause::Succeeded { action: sas::domain::Action::Undo, .. }
        );
    let spent = if anew { 0 } else { spent };
    match after.last_cause {
        Cause::Throttled { retry_after_ms, .. } if after.revision > before.revision => spent + retry_after_ms,
        _ => spent,
    }
}

/// A claim the store throttled (`TaskRecord::defer`) counts no failure, holds no lease,
/// and puts the deadline past the longest backoff its Schedule waits, so the supervisor
/// finds nothing due while it does.
fn store_wait_uncounted(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    if !matches!(after.last_cause, Cause::StoreThrottled { .. }) || after.revision == before.revision {
        return;
    }
    let backoff = sas::domain::retry::THROTTLED_SCHEDULE.cap_ms;
    let past = after.deadline().is_some_and(|d| d >= after.updated_at.plus_ms(backoff));
    let counted = (after.failure_count, after.step_failures) != (before.failure_count, before.step_failures);
    if !past || counted || after.locked_by().is_some() {
        add(
            Invariant::StoreWaitUncounted,
            format!(
                "order {} revision {}: the store's throttle left deadline {:?} at {}, failures {} -> {}",
                after.order_id,
                after.revision,
                after.deadline(),
                after.updated_at.to_rfc3339(),
                before.failure_count,
                after.failure_count
            ),
        );
    }
}

/// A step's remote never has it wait, throttled, longer in all than its budget (`spent`,
/// summed from the log); and at each Throttled move the record's own count
/// (`step_throttled_ms`, which the give-up reads) says the same.
fn throttled_within_budget(
    after: &TaskRecord,
    spent: u64,
    wf: Option<&Workflow>,
    add: &mut impl FnMut(Invariant, String),
) {
    let Some(budget) = wf.map(|wf| wf.max_throttled_ms(after.step)) else { return };
    let moved = matches!(after.last_cause, Cause::Throttled { .. });
    if spent > budget || (moved && after.step_throttled_ms != spent) {
        add(
            Invariant::ThrottleBudget,
            format!(
                "order {} revision {}: step {} throttled {spent} ms in all (the record says {}), budget {budget} ms",
                after.order_id, after.revision, after.step, after.step_throttled_ms
            ),
        );
    }
}

/// No write replaces a live lease with another, and no claim lands while one is live.
fn one_live_lease(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    let id = after.order_id.as_str();
    if let (Some(old), Some(new)) = (before.locked_by(), after.locked_by())
        && old != new
    {
        add(
            Invariant::OneLease,
            format!("order {id}: live lease {old} replaced by {new} ({:?})", after.last_cause),
        );
    }
    if matches!(after.last_cause, Cause::Claimed { .. }) && before.locked_by().is_some() {
        add(
            Invariant::OneLease,
            format!("order {id}: claimed while lease {:?} was live", before.locked_by()),
        );
    }
    // A stage's branches run under the one lease: none is in flight without it, or past
    // the lease's complete-by; and a claim gives each branch it dispatches an attempt no
    // dispatch had before, so a reply names one dispatch only.
    let Some(run) = after.stage() else { return };
    if run.branches.iter().any(|b| b.in_flight())
        && (after.locked_by().is_none()
            || after.state() != ProcessState::Processing
            || run.latest_complete_by() > after.complete_by())
    {
        add(
            Invariant::OneLease,
            format!(
                "order {id}: a branch in flight outside the lease ({:?}, lease {:?} until {:?}, branches {:?})",
                after.state(),
                after.locked_by(),
                after.complete_by(),
                run.branches
            ),
        );
    }
    // A map's items are dispatched by replies and a resume too; an undo's run of a finished
    // map is rebuilt from its outputs, dispatching nothing.
    let forward = after.action() == Action::Do;
    if matches!(after.last_cause, Cause::Claimed { .. }) || (run.map && forward) {
        let mut seen = BTreeSet::new();
        let was_run = before.stage().filter(|r| r.at == run.at && r.map == run.map);
        for ((step, b), i) in run.each().zip(0usize..) {
            let was = was_run.and_then(|r| r.branches.get(i));
            let dispatched = forward && b.dispatches > was.map_or(0, |w| w.dispatches);
            if dispatched && (b.attempt <= before.attempt || !seen.insert(b.attempt)) {
                add(
                    Invariant::OneLease,
                    format!(
                        "order {id}: branch {step} dispatched as attempt {}, not a fresh one (task attempt {} before)",
                        b.attempt, before.attempt
                    ),
                );
            }
        }
    }
}

/// A task goes past a stage only when every branch took effect at the remote side: judged
/// from the ledger, not from the record's branches. (The simulation also checks that each
/// was applied before the write landed, in true time: `check.rs`.)
fn joins_only_when_all(
    ledger: &Ledger,
    before: &TaskRecord,
    after: &TaskRecord,
    wf: &Workflow,
    add: &mut impl FnMut(Invariant, String),
) {
    for stage in stages_passed(before, after, wf) {
        let missing: Vec<u32> =
            stage.branches().filter(|b| !applied(ledger, &after.order_id, *b, Action::Do)).collect();
        if !missing.is_empty() {
            add(
                Invariant::StageJoinsOnlyWhenAll,
                format!(
                    "order {}: went past stage {} ({:?} -> {:?} at step {}, {:?}) though branches {missing:?} never took effect at the remote",
                    after.order_id,
                    stage.name,
                    before.state(),
                    after.state(),
                    after.step,
                    after.last_cause
                ),
            );
        }
    }
}

/// Each operator's action (who and why) lands at most once.
pub(super) fn operator_actions_land_once(writes: &[WriteRecord], add: &mut impl FnMut(Invariant, String)) {
    let mut actions: BTreeMap<(&str, Option<&str>, Option<&str>), usize> = BTreeMap::new();
    for w in writes {
        if matches!(w.after.last_cause, Cause::Operator { .. }) {
            let entry = w.after.timeline.last();
            let key = (
                w.after.order_id.as_str(),
                entry.and_then(|e| e.by.as_deref()),
                entry.and_then(|e| e.note.as_deref()),
            );
            *actions.entry(key).or_default() += 1;
        }
    }
    for ((order, by, why), n) in actions {
        if n > 1 {
            add(
                Invariant::OperatorOnce,
                format!("order {order}: the action of {by:?} ({why:?}) landed {n} times"),
            );
        }
    }
}
