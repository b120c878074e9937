//! One task's record as `show` prints it: its fields, its stage, what it waits for, its
//! timeline and the commands that apply, as text or as one JSON object.

use sas::domain::{TaskRecord, Timestamp, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, one_line, step_name};
use super::map::{map_json, map_lines, map_view};
use super::stage::{stage_json, stage_lines, stage_view};
use super::timeline::{entry_json, entry_line, lanes, let_go_at, let_go_line};
use super::waits::{callback_json, callback_lines, queued_line, waits_for};

/// The record as lines of text, its timeline last.
pub fn show_text(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp, next: &[String]) -> String {
    let mut lines = Vec::new();
    let version = format!("{} v{}", task.workflow, task.workflow_version);
    lines.push(format!("task {}: {} (workflow {version})", task.order_id, task.state().as_str()));
    let mut field = |name: &str, value: String| lines.push(format!("  {name:<14}{value}"));
    let stage = stage_view(task, wf);
    let map = map_view(task, wf);
    match (stage.as_ref().filter(|v| v.going_forward(task)), map.as_ref().filter(|m| m.going_forward())) {
        (_, Some(view)) if view.map.is_some() => {
            let m = view.map.expect("known");
            let step = step_name(wf, task.step).unwrap_or_default();
            field(
                "step",
                format!(
                    "{} {}, a map step: {step} over each item of {}, attempt {} of this step, {} in all",
                    task.step, m.name, m.items, task.step_attempts, task.attempt
                ),
            );
            field(
                "failures",
                format!("{} in all; each item's own below (its budget is its step's)", task.failure_count),
            );
        }
        (Some(view), _) => {
            field(
                "step",
                format!(
                    "{} {}, a parallel stage of {} ({} at once), attempt {} of this stage, {} in all",
                    task.step,
                    view.name(),
                    view.steps(),
                    view.run.branches.len(),
                    task.step_attempts,
                    task.attempt
                ),
            );
            field(
                "failures",
                format!("{} in all; each branch's own below (its budget is its step's)", task.failure_count),
            );
        }
        _ => {
            let step = match step_name(wf, task.step) {
                Some(name) => format!("{} {name}", task.step),
                None => format!("{} (its name: pass --workflows FILE with workflow {version})", task.step),
            };
            field(
                "step",
                format!("{step}, attempt {} of this step, {} in all", task.step_attempts, task.attempt),
            );
            field(
                "failures",
                format!(
                    "{} in all, {} of this step in this direction",
                    task.failure_count, task.step_failures
                ),
            );
        }
    }
    match (task.locked_by(), task.complete_by()) {
        (Some(lease), Some(by)) => field("lease", format!("{lease}, complete by {}", iso(by))),
        _ => field("lease", "none".to_owned()),
    }
    field(
        "deadline",
        match task.deadline() {
            Some(d) if d <= now => format!("{} (passed: the supervisor recovers it)", iso(d)),
            Some(d) => iso(d),
            None => "none (ended)".to_owned(),
        },
    );
    if let Some(w) = task.wake_at() {
        field("wakes at", format!("{} (a timer step: nothing runs until then)", iso(w)));
    }
    if let (Some(q), Some(line)) = (&task.queued(), queued_line(task, now)) {
        field("queued", format!("{line}, since {}: the agent has no room; no failure counted", iso(q.since)));
    }
    if let Some(cb) = task.callback() {
        for (name, value) in callback_lines(task, cb, wf, now) {
            field(name, value);
        }
    }
    if let Some(view) = &stage {
        let forward = view.going_forward(task) && !task.state().is_terminal();
        let mut stage_lines = stage_lines(view, forward, wf, now).into_iter();
        if let Some(first) = stage_lines.next() {
            field("stage", first);
        }
        for line in stage_lines {
            field("", line);
        }
    }
    if let Some(view) = &map {
        let mut lines = map_lines(view, task, wf, now).into_iter();
        if let Some(first) = lines.next() {
            field("map", first);
        }
        for line in lines {
            field("", line);
        }
    }
    if task.paused() {
        let held = if task.parked() {
            "it waits for a resume, off the supervisor's sweep"
        } else {
            "what runs or waits now goes on; nothing new is dispatched"
        };
        field("paused", format!("yes: {held} (sasctl tasks resume)"));
    }
    if let Some(h) = task.hold_until() {
        let why = if task.stage().is_some_and(|r| r.map) {
            "items of the map still out may run until then: the undo waits"
        } else if task.stage().is_some() {
            "branches of the stage still out may run until then: the undo waits"
        } else {
            "a cancelled attempt may still run until then"
        };
        field("hold until", format!("{} ({why})", iso(h)));
    }
    if let Some(r) = task.redo_until {
        field(
            "redo until",
            format!("step {r} (resubmitted from an earlier step: nothing is undone before it)"),
        );
    }
    let outputs: Vec<&str> = task.outputs.keys().map(String::as_str).collect();
    field("outputs", if outputs.is_empty() { "none".to_owned() } else { outputs.join(", ") });
    field("last error", task.last_error.as_deref().map_or_else(|| "none".to_owned(), |e| one_line(e, 400)));
    field("reply_to", task.reply_to.clone().unwrap_or_else(|| "none".to_owned()));
    field("created", iso(task.created_at));
    field("updated", format!("{} (revision {})", iso(task.updated_at), task.revision));
    lines.push("timeline, oldest first:".to_owned());
    let mut timeline: Vec<String> = task
        .timeline
        .iter()
        .zip(lanes(&task.timeline, wf))
        .map(|(entry, lane)| format!("  {}", entry_line(entry, wf, lane)))
        .collect();
    if let Some(at) = let_go_at(task) {
        timeline.insert(at, format!("  {}", let_go_line(task.timeline_dropped)));
    }
    lines.extend(timeline);
    if next.is_empty() {
        lines.push("next: nothing to do by hand".to_owned());
    } else {
        lines.push("next:".to_owned());
        lines.extend(next.iter().map(|c| format!("  {c}")));
    }
    lines.join("\n") + "\n"
}

/// The record as one JSON object: its fields (times in ISO-8601, the outputs as an object
/// of each step's output by step name), the timeline's entries as objects (where entries
/// were let go, `{"let_go": N}` between them), and the commands that apply.
pub fn show_json(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp, next: &[String]) -> Value {
    let mut v = serde_json::to_value(task).unwrap_or_else(|_| json!({}));
    let time = |t: Option<Timestamp>| t.map(iso);
    // What the phase holds is shown flat, each field curated below, as before the record
    // stored it as one map.
    if let Some(map) = v.as_object_mut() {
        map.remove("phase");
    }
    // `attempt` is the step's own, what people read; the task's counter (what tokens,
    // idempotency keys and the fence carry) is `task_attempt`.
    if let Some(map) = v.as_object_mut() {
        map.remove("step_attempts");
    }
    v["attempt"] = json!(task.step_attempts);
    v["task_attempt"] = json!(task.attempt);
    v["locked_by"] = json!(task.locked_by());
    v["reply_to"] = json!(task.reply_to);
    v["workflow_version"] = json!(task.workflow_version);
    v["failure_count"] = json!(task.failure_count);
    v["step_failures"] = json!(task.step_failures);
    v["last_error"] = json!(task.last_error);
    if task.paused() {
        v["paused"] = json!(true);
    }
    v["id"] = json!(task.order_id.as_str());
    v["step_name"] = json!(step_name(wf, task.step));
    v["created_at"] = json!(iso(task.created_at));
    v["updated_at"] = json!(iso(task.updated_at));
    v["deadline"] = json!(time(task.deadline()));
    v["deadline_passed"] = json!(task.deadline().is_some_and(|d| d <= now));
    v["complete_by"] = json!(time(task.complete_by()));
    v["hold_until"] = json!(time(task.hold_until()));
    if task.wake_at().is_some() {
        v["wake_at"] = json!(time(task.wake_at()));
    }
    if let Some(kind) = waits_for(task) {
        v["waits_for"] = json!(kind);
    }
    match &task.queued() {
        Some(q) => {
            v["queued"] = json!({
                "agent": q.agent,
                "ticket": q.ticket,
                "since": iso(q.since),
                "waited_ms": now.millis_since(q.since),
            });
        }
        None => {
            if let Some(map) = v.as_object_mut() {
                map.remove("queued");
            }
        }
    }
    // Curated as the rest: times in ISO-8601, and no digest (harmless, but nobody's to use).
    if let Some(cb) = task.callback() {
        v["callback"] = callback_json(task, cb, wf);
    }
    v["redo_until"] = json!(task.redo_until);
    // A stage's branches, curated as the rest (the record's own `stage` keeps bare times);
    // a map's items likewise, as `map` (the items worth a look, not all of them).
    match stage_view(task, wf) {
        Some(view) => v["stage"] = stage_json(&view, wf),
        None => {
            if let Some(map) = v.as_object_mut() {
                map.remove("stage");
            }
        }
    }
    if let Some(view) = map_view(task, wf) {
        v["map"] = map_json(&view, task, wf);
    }
    // Each output with its value, by step name: what a refund needs of its charge.
    v["outputs"] = Value::Object(task.outputs.iter().map(|(step, o)| (step.clone(), o.to_value())).collect());
    let lanes = lanes(&task.timeline, wf);
    let mut timeline: Vec<Value> =
        task.timeline.iter().zip(lanes).map(|(e, lane)| entry_json(e, wf, lane)).collect();
    if let Some(at) = let_go_at(task) {
        timeline.insert(at, json!({"let_go": task.timeline_dropped}));
    }
    v["timeline"] = Value::Array(timeline);
    v["timeline_dropped"] = json!(task.timeline_dropped);
    v["next"] = json!(next);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{ProcessState, Step};

    fn task(state: ProcessState) -> TaskRecord {
        crate::fixtures::task("o-1", state)
    }

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("reserve", "inv", "release"), Step::pivot("ship", "ship")])
    }

    #[test]
    fn show_says_how_many_entries_were_let_go_and_what_is_next() {
        let mut t = task(ProcessState::Error);
        t.timeline_dropped = 3;
        t.last_error = Some("do-it: 422\nno such customer".into());
        let text =
            show_text(&t, Some(&wf()), Timestamp(1_700_000_001_000), &["sasctl tasks resubmit o-1".into()]);
        assert!(text.starts_with("task o-1: Error (workflow w v1)\n"), "{text}");
        assert!(text.contains("  step          0 reserve, attempt 0 of this step, 0 in all\n"), "{text}");
        assert!(text.contains("  deadline      none (ended)\n"), "{text}");
        assert!(text.contains("  last error    do-it: 422 no such customer\n"), "{text}");
        assert!(
            text.contains(
                "timeline, oldest first:\n  2023-11-14T22:13:20.000Z  Submitted     step 0 reserve  attempt 0\n  ... 3 entries let go ...\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("next:\n  sasctl tasks resubmit o-1\n"), "{text}");
        let v = show_json(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[]);
        assert_eq!(v["timeline"][0]["what"], "Submitted");
        assert_eq!(v["timeline"][1], json!({"let_go": 3}));
        assert_eq!(v["timeline_dropped"], 3);
        // A record that lost its Submitted before it was kept: the gap comes first.
        std::sync::Arc::make_mut(&mut t.timeline)[0].what =
            sas::domain::Happened::Moved(sas::domain::Trigger::Claimed);
        let text = show_text(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[]);
        assert!(text.contains("timeline, oldest first:\n  ... 3 entries let go ...\n  2023"), "{text}");
        assert_eq!(show_json(&t, Some(&wf()), Timestamp(0), &[])["timeline"][0], json!({"let_go": 3}));
        assert_eq!(v["deadline"], Value::Null);
        assert_eq!(v["updated_at"], "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn show_json_gives_each_output_with_its_value() {
        let mut t = task(ProcessState::Error);
        let charge = json!({"charge_id": "ch_1", "amount": 12});
        std::sync::Arc::make_mut(&mut t.outputs)
            .insert("charge".into(), sas::domain::StepOutput::from_value(&charge).unwrap());
        let v = show_json(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[]);
        assert_eq!(v["outputs"], json!({"charge": {"charge_id": "ch_1", "amount": 12}}));
        assert!(
            show_text(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[])
                .contains("  outputs       charge\n")
        );
    }
}
