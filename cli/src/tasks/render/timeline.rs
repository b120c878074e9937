//! A task's timeline as `show` gives it: each entry as a line or a JSON object, in its
//! lane at a parallel stage (the stage's own entries, or one branch's).

use sas::domain::workflow::Stage;
use sas::domain::{Entry, Happened, TaskRecord, Trigger, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, one_line, step_name};

/// Where the entries the record let go were, as an index into its timeline: after
/// `Submitted`, which the timeline keeps, or before the first entry of a record that lost
/// it before it was kept; `None` when none were let go.
pub fn let_go_at(task: &TaskRecord) -> Option<usize> {
    (task.timeline_dropped > 0)
        .then(|| usize::from(task.timeline.first().is_some_and(|e| e.what == Happened::Submitted)))
}

/// The line standing for the entries let go.
pub fn let_go_line(n: u32) -> String {
    format!("... {n} {} let go ...", if n == 1 { "entry" } else { "entries" })
}

/// Where a timeline entry belongs at a parallel stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane<'a> {
    /// Not at a stage: a lone step's entry.
    Step,
    /// The stage as a whole: its submission, its claim, its retry, an operator's action
    /// on it. The mask has a bit for each branch the entry concerns (bit 0: the first):
    /// a claim dispatches, and a retry counts a lapse against, only the branches that have
    /// not succeeded, as far as the timeline shows.
    Stage(&'a Stage, u32),
    /// One branch's own: its success, its refusal, its give-up, its undoing; `usize` is
    /// its place among the stage's branches.
    Branch(&'a Stage, usize),
}

/// Each entry's lane. An entry names the step its cause is about: a branch's, or the
/// stage's first step for what concerns the whole stage (the task's submission, a forward
/// claim, a retry, an operator's action). Undoing (after an Undo, a cancel or an operator's
/// compensate, until a resubmit) every entry is one branch's, its first too.
pub fn lanes<'a>(timeline: &[Entry], wf: Option<&'a Workflow>) -> Vec<Lane<'a>> {
    let mut undoing = false;
    // The branches of the stage at hand that succeeded (a stage keeps them through a
    // retry and a resubmit; the task leaves the stage with its last one).
    let mut succeeded: u32 = 0;
    timeline
        .iter()
        .map(|e| {
            let trigger = match e.what {
                Happened::Moved(t) => Some(t),
                Happened::Submitted => None,
            };
            let lane = match wf.and_then(|w| w.stage_of(e.step)) {
                None => Lane::Step,
                Some(stage) => {
                    let all = (1u32 << stage.len) - 1;
                    // Submitted (no trigger) too: a workflow may begin with a stage.
                    let open = matches!(trigger, None | Some(Trigger::Claimed | Trigger::Retry));
                    let operator = trigger.is_some_and(Trigger::is_operator) || e.by.is_some();
                    if (open || operator) && !undoing && e.step == stage.start {
                        Lane::Stage(stage, if operator { all } else { all & !succeeded })
                    } else {
                        Lane::Branch(stage, (e.step - stage.start) as usize)
                    }
                }
            };
            match (trigger, lane) {
                (Some(Trigger::BranchDone), Lane::Branch(_, i)) => succeeded |= 1 << i,
                (Some(Trigger::Advanced | Trigger::Finished), _) => succeeded = 0,
                _ => {}
            }
            match trigger {
                Some(Trigger::Undo | Trigger::Cancel | Trigger::OperatorUndo) => undoing = true,
                Some(Trigger::Resubmit) => undoing = false,
                _ => {}
            }
            lane
        })
        .collect()
}

/// The lanes of a stage's branches, `*` in those of the `mask`, `|` in the others', so
/// concurrent branches read side by side.
fn gutter(stage: &Stage, mask: u32) -> String {
    (0..stage.len).map(|i| if mask & (1 << i) != 0 { "*" } else { "|" }).collect::<Vec<_>>().join(" ")
}

/// One timeline entry as a line: time, what, step, the step's own attempt, why and who.
/// In its lane at a parallel stage (`lanes`): the stage's own entries name the stage and
/// its attempt; a branch's name its step after the lanes' gutter, without an attempt (the
/// entry keeps the stage's, not the branch's: the stage's table has each branch's).
pub fn entry_line(entry: &Entry, wf: Option<&Workflow>, lane: Lane) -> String {
    let step = match step_name(wf, entry.step) {
        Some(name) => format!("step {} {name}", entry.step),
        None => format!("step {}", entry.step),
    };
    let subject = match lane {
        // A map's entries are its items' too: named by the map, as `show` names it.
        Lane::Step => match wf.and_then(|w| w.map_at(entry.step)) {
            Some(map) => format!("{step} (map {})  attempt {}", map.name, entry.step_attempt()),
            None => format!("{step}  attempt {}", entry.step_attempt()),
        },
        Lane::Stage(stage, mask) => format!(
            "{}  stage {} (steps {}-{})  attempt {}",
            gutter(stage, mask),
            stage.name,
            stage.start,
            stage.end() - 1,
            entry.step_attempt()
        ),
        Lane::Branch(stage, i) => format!("{}  {step}", gutter(stage, 1 << i)),
    };
    let mut line = format!("{}  {:<12}  {subject}", iso(entry.at), entry.what.as_str());
    match (&entry.note, flow_note(entry, wf)) {
        (Some(note), _) => line.push_str(&format!("  {}", one_line(note, 160))),
        (None, Some(flow)) => line.push_str(&format!("  {flow}")),
        (None, None) => {}
    }
    if let Some(by) = &entry.by {
        line.push_str(&format!("  by {by}"));
    }
    line
}

/// What a flow-control entry meant, when it has no note of its own: a `Queued` entry
/// (the step's agent had no room, or the supervisor asked its gate again) and a
/// `Throttled` one (the remote said it had too many requests).
fn flow_note(entry: &Entry, wf: Option<&Workflow>) -> Option<String> {
    match entry.what {
        Happened::Moved(Trigger::Queued) => Some(match wf.and_then(|w| w.step(entry.step)) {
            Some(step) => format!("waiting for a place at {} (its limits)", step.agent),
            None => "waiting for a place at the step's agent (its limits)".to_owned(),
        }),
        Happened::Moved(Trigger::Throttled) => {
            Some("the remote asked to wait (429 or 503 with Retry-After); no failure counted".to_owned())
        }
        _ => None,
    }
}

/// An entry as JSON (`attempt` the step's own, `task_attempt` the task's counter); at a
/// parallel stage also the stage's name and, for a branch's own
/// entry, the branch's (null for the stage's own, which has the `branches` it concerns);
/// at a map step, the map's name (`map`).
pub fn entry_json(entry: &Entry, wf: Option<&Workflow>, lane: Lane) -> Value {
    let mut v = json!({
        "at": iso(entry.at),
        "what": entry.what.as_str(),
        "step": entry.step,
        "step_name": step_name(wf, entry.step),
        "attempt": entry.step_attempt(),
        "task_attempt": entry.attempt,
        "note": entry.note,
        "by": entry.by,
    });
    match lane {
        Lane::Step => {
            if let Some(map) = wf.and_then(|w| w.map_at(entry.step)) {
                v["map"] = json!(map.name);
            }
        }
        Lane::Stage(stage, mask) => {
            v["stage"] = json!(stage.name);
            v["branch"] = Value::Null;
            let of: Vec<Option<String>> = stage
                .branches()
                .filter(|s| mask & (1 << (s - stage.start)) != 0)
                .map(|s| step_name(wf, s))
                .collect();
            v["branches"] = json!(of);
        }
        Lane::Branch(stage, _) => {
            v["stage"] = json!(stage.name);
            v["branch"] = json!(step_name(wf, entry.step));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{Step, Timestamp};

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("reserve", "inv", "release"), Step::pivot("ship", "ship")])
    }

    #[test]
    fn timeline_entries_say_when_what_step_attempt_why_and_who() {
        let e = Entry {
            at: Timestamp(1_700_000_000_000),
            what: Happened::Moved(Trigger::Resubmit),
            step: 1,
            attempt: 3,
            step_attempt: Some(1),
            note: Some("remote\nfixed".into()),
            by: Some("arn:aws:sts::1:user/me".into()),
        };
        assert_eq!(
            entry_line(&e, Some(&wf()), Lane::Step),
            "2023-11-14T22:13:20.000Z  Resubmit      step 1 ship  attempt 1  remote fixed  by arn:aws:sts::1:user/me"
        );
        assert_eq!(
            entry_json(&e, None, Lane::Step),
            json!({"at": "2023-11-14T22:13:20.000Z", "what": "Resubmit", "step": 1, "step_name": null,
                   "attempt": 1, "task_attempt": 3, "note": "remote\nfixed", "by": "arn:aws:sts::1:user/me"})
        );
    }
}
