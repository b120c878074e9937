//! A listed task: its row of the listing's table, and its JSON object.

use sas::domain::{Outcome, TaskRecord, Timestamp, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, one_line, step_name};
use super::map::{map_cell, map_summary_json, map_view};
use super::stage::stage_view;
use super::waits::{callback_step_attempt, queued_line, throttled_until, waits_for};

/// A listed task as one JSON object.
pub fn task_summary_json(task: &TaskRecord, wf: Option<&Workflow>) -> Value {
    let mut v = json!({
        "id": task.order_id.as_str(),
        "state": task.state().as_str(),
        "workflow": task.workflow,
        "version": task.workflow_version,
        "step": task.step,
        "step_name": step_name(wf, task.step),
        "failure_count": task.failure_count,
        "updated_at": iso(task.updated_at),
        "last_error": task.last_error,
    });
    if let Some(at) = task.wake_at() {
        v["wake_at"] = json!(iso(at));
    }
    if task.paused() {
        v["paused"] = json!(true);
    }
    if let Some(kind) = waits_for(task) {
        v["waits_for"] = json!(kind);
    }
    if let Some(q) = task.queued() {
        v["queued"] = json!({"agent": q.agent, "ticket": q.ticket, "since": iso(q.since)});
    }
    if let Some(at) = throttled_until(task) {
        v["throttled_until"] = json!(iso(at));
    }
    if let (Some("callback"), Some(cb)) = (waits_for(task), &task.callback()) {
        v["callback_attempt"] = json!(callback_step_attempt(task, cb));
        v["callback_task_attempt"] = json!(cb.attempt);
        v["callback_due"] = json!(iso(cb.due()));
    }
    if let Some(view) = stage_view(task, wf).filter(|v| v.going_forward(task)) {
        v["stage"] = json!({
            "name": view.name(),
            "branches": view.run.branches.len(),
            "succeeded": view.count(Outcome::Succeeded),
            "in_flight": view.run.branches.iter().filter(|b| b.in_flight()).count(),
        });
    }
    if let Some(view) = map_view(task, wf) {
        v["map"] = map_summary_json(&view);
    }
    v
}

/// The state as a listing shows it: a waiting timer with its wake time, a waiting
/// callback with when its heartbeat or completion is due, a task waiting for a place in
/// its agent's gate with its ticket and how long it has waited, a throttled one with when
/// it is tried again.
fn state_cell(task: &TaskRecord, now: Timestamp) -> String {
    let state = match (task.wake_at(), waits_for(task), &task.callback()) {
        (Some(at), ..) => format!("{} until {}", task.state().as_str(), iso(at)),
        (None, Some("callback"), Some(cb)) => {
            format!("{} for callback, due {}", task.state().as_str(), iso(cb.due()))
        }
        _ => match (queued_line(task, now), throttled_until(task)) {
            (Some(q), _) => format!("{}, {q}", task.state().as_str()),
            (None, Some(at)) => format!("{}, throttled until {}", task.state().as_str(), iso(at)),
            (None, None) => task.state().as_str().to_owned(),
        },
    };
    if task.paused() { format!("{state} (paused)") } else { state }
}

/// The header and rows of a listing's table, columns padded; waits for a place measured
/// to `now`.
pub fn table_at(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    let mut rows = vec![[
        "ID".to_owned(),
        "STATE".to_owned(),
        "WORKFLOW".to_owned(),
        "STEP".to_owned(),
        "FAILURES".to_owned(),
        "UPDATED".to_owned(),
        "LAST ERROR".to_owned(),
    ]];
    for (task, wf) in tasks {
        let step = match (stage_view(task, *wf).filter(|v| v.going_forward(task)), step_name(*wf, task.step))
        {
            (Some(view), _) => format!(
                "{} {} (stage, {} of {} done)",
                task.step,
                view.name(),
                view.count(Outcome::Succeeded),
                view.run.branches.len()
            ),
            (None, name) => {
                let step = match name {
                    Some(name) => format!("{} {name}", task.step),
                    None => task.step.to_string(),
                };
                match map_view(task, *wf) {
                    Some(view) if view.map.is_some() => {
                        format!("{} {} {}", task.step, view.name(), map_cell(&view))
                    }
                    Some(view) => format!("{step} {}", map_cell(&view)),
                    None => step,
                }
            }
        };
        rows.push([
            task.order_id.to_string(),
            state_cell(task, now),
            format!("{} v{}", task.workflow, task.workflow_version),
            step,
            task.failure_count.to_string(),
            iso(task.updated_at),
            task.last_error.as_deref().map_or_else(|| "-".to_owned(), |e| one_line(e, 80)),
        ]);
    }
    crate::text::columns(&rows, "")
}

/// The listing's table as `sasctl tasks list` prints it: waits for a place measured to
/// the wall clock's now.
#[cfg(test)]
pub(super) fn table(tasks: &[(&TaskRecord, Option<&Workflow>)]) -> String {
    use sas::ports::Clock as _;
    table_at(tasks, sas::adapters::system::SystemClock.now())
}
