//! The checks of each final task against its order's writes: it ended terminal once (and
//! once more per reopening), a cancelled task stayed out, every give-up raised an alert;
//! then the compensation, remote and output checks of `compensation.rs`, `remote.rs` and
//! `outputs.rs`.

use std::collections::BTreeMap;

use sas::adapters::embedded::WriteRecord;
use sas::domain::{Act, Action, Cause, OrderId, ProcessState, TaskRecord, Trigger, Workflow};

use super::catalogue::{Invariant, Records};
use super::compensation::{
    compensated_at_the_remote, compensated_in_the_records, pivot_goes_forward, stage_undo_exact,
};
use super::history::{Ran, declined, remote_effects};
use super::maps::check_maps;
use super::outputs::check_outputs_and_pins;
use super::remote::remote_agrees;
use super::transitions::infer_trigger;

/// Each task against its order's writes, its alerts and what the remote did for it.
pub(super) fn check_tasks(r: &Records, add: &mut impl FnMut(Invariant, String)) {
    let mut histories: BTreeMap<&str, Vec<&WriteRecord>> = BTreeMap::new();
    for w in r.writes {
        histories.entry(w.after.order_id.as_str()).or_default().push(w);
    }
    for task in r.tasks {
        let id = &task.order_id;
        let Some(workflow) = r.workflows.get_version(&task.workflow, task.workflow_version) else {
            add(
                Invariant::Shape,
                format!("order {id}: unknown workflow {} v{}", task.workflow, task.workflow_version),
            );
            continue;
        };
        if task.order.order_id != task.order_id || task.order.workflow != task.workflow {
            add(
                Invariant::Shape,
                format!(
                    "task {id} carries order {} of workflow {}",
                    task.order.order_id, task.order.workflow
                ),
            );
        }
        let history = histories.get(id.as_str()).map(Vec::as_slice).unwrap_or_default();
        cancelled_stays_out(id, history, add);
        let ran = Ran::of(history);
        stage_undo_exact(task, workflow, history, add);
        terminal_once(task, &ran, add);
        alerted(r, task, workflow, history, add);
        compensated_in_the_records(task, workflow, &ran, add);
        // A map's items are judged item by item (`maps.rs`).
        let effects: Vec<_> =
            remote_effects(r.ledger, id).into_iter().filter(|(s, _)| workflow.map_at(*s).is_none()).collect();
        compensated_at_the_remote(id, &effects, add);
        let declined = declined(history);
        pivot_goes_forward(r.ledger, id, workflow, &effects, &declined, add);
        if task.order.workflow_version.is_some_and(|v| v != task.workflow_version) {
            add(
                Invariant::Pinned,
                format!(
                    "order {id} asked for v{:?} and runs v{}",
                    task.order.workflow_version, task.workflow_version
                ),
            );
        }
        check_outputs_and_pins(r.ledger, id, workflow, task.order.items.len(), add);
        remote_agrees(r, task, workflow, &declined, add);
        check_maps(r.ledger, task, workflow, history, add);
    }
}

/// After a cancel, no write claims a forward step.
fn cancelled_stays_out(id: &OrderId, history: &[&WriteRecord], add: &mut impl FnMut(Invariant, String)) {
    let mut cancelled = false;
    for w in history {
        match &w.after.last_cause {
            Cause::Claimed { step, action: Action::Do } if cancelled => add(
                Invariant::CancelledStaysOut,
                format!("order {id}: step {step} claimed to run forward after the task was cancelled"),
            ),
            Cause::Operator { act: Act::Cancel, .. } => cancelled = true,
            _ => {}
        }
    }
}

/// The task ended terminal, entering a terminal state once, and once more for each time an
/// operator reopened it.
fn terminal_once(task: &TaskRecord, ran: &Ran, add: &mut impl FnMut(Invariant, String)) {
    let id = &task.order_id;
    if !task.state().is_terminal() {
        add(Invariant::TerminalOnce, format!("order {id} ended {:?} at step {}", task.state(), task.step));
    } else if ran.terminal_entries != 1 + ran.reopened {
        add(
            Invariant::TerminalOnce,
            format!(
                "order {id} entered a terminal state {} times, reopened by operators {} times",
                ran.terminal_entries, ran.reopened
            ),
        );
    }
}

/// Giving up tells an operator: every move to Error, and every give-up at a spent budget,
/// has its alert (same state and FailureCount).
fn alerted(
    r: &Records,
    task: &TaskRecord,
    workflow: &Workflow,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    let alerted = |state: ProcessState, failures: u32| {
        r.alerts.iter().any(|a| &a.order_id == id && a.state == state && a.failure_count == failures)
    };
    for w in history {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let gave_up = matches!(after.last_cause, Cause::DeadlinePassed { .. })
            && infer_trigger(before, after, Some(workflow)) != Some(Trigger::Retry);
        if (after.state() == ProcessState::Error || gave_up) && !alerted(after.state(), after.failure_count) {
            add(
                Invariant::Alerted,
                format!("order {id} went to {:?} ({:?}) without an alert", after.state(), after.last_cause),
            );
        }
    }
    if task.state() == ProcessState::Error && !r.alerts.iter().any(|a| &a.order_id == id) {
        add(Invariant::Alerted, format!("order {id} is Error without an alert"));
    }
}
