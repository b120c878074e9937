//! A map step as `show` and the listing give it: how far it is over its items, and the
//! items worth a look (in flight, to retry, in doubt, refused, undone), never a row for
//! each of a thousand: the items that succeeded or have not run are counted, not listed.

use sas::domain::{MapStep, Outcome, ProcessState, StageRun, StepKind, TaskRecord, Timestamp, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, step_name};

/// The most item rows `show` prints as text; `--json` lists every one worth a look.
pub const MAX_ROWS: usize = 20;

/// Where the task is with its map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapPhase {
    /// Going forward, its items kept by the record (its first claim read them).
    Running,
    /// Going forward, not claimed yet: its first claim reads its items. How many it would
    /// read now, or why they cannot be read (its claim then gives up, nothing sent).
    NotStarted(Result<usize, String>),
    /// Undoing its items, newest first, one at a time.
    Undoing,
    /// Stopped at it (in Error) with its items still kept.
    Stopped,
}

/// A map step as a task's record shows it: the map (when the workflow is known) and its
/// items as the record keeps them (or, undoing a finished map, as its output array and
/// refused items say they were, as the undo reads them; or none before its first claim).
pub struct MapView<'a> {
    pub map: Option<&'a MapStep>,
    pub at: u32,
    pub run: StageRun,
    pub phase: MapPhase,
    /// The item whose undo is dispatched now (under the task's lease), or is next.
    pub undoing: Option<u32>,
    /// Whether that undo is in flight now.
    pub undo_in_flight: bool,
}

/// What became of one item, as the table says it; `None` for the items only counted.
fn item_state(view: &MapView, index: u32, forward: bool, read_only: bool) -> Option<&'static str> {
    let b = view.run.branches.get(index as usize)?;
    if view.undoing == Some(index) {
        return Some(if view.undo_in_flight { "undoing" } else { "next to undo" });
    }
    match b.outcome {
        Outcome::Open if b.in_flight() => Some("in flight"),
        Outcome::Open if b.dispatches == 0 => None,
        // Dispatched and unanswered: the map's next claim sends it again.
        Outcome::Open if forward => Some("to retry"),
        Outcome::Open if read_only => Some("unanswered"),
        Outcome::Open => Some("in doubt"),
        Outcome::Succeeded => None,
        Outcome::Refused => Some("refused"),
        Outcome::Undone => Some("undone"),
    }
}

/// Which rows matter most when not all fit: what runs now, then what may stand, then the rest.
fn rank(state: &str) -> u8 {
    match state {
        "undoing" | "in flight" | "next to undo" => 0,
        "to retry" | "in doubt" | "unanswered" => 1,
        "refused" => 2,
        _ => 3,
    }
}

impl MapView<'_> {
    /// The map's name, or where it is when the workflow is unknown.
    pub fn name(&self) -> String {
        self.map.map_or_else(|| format!("at step {}", self.at), |m| m.name.clone())
    }
    pub fn items(&self) -> Option<usize> {
        match &self.phase {
            MapPhase::NotStarted(read) => read.as_ref().ok().copied(),
            _ => Some(self.run.branches.len()),
        }
    }
    pub fn count(&self, outcome: Outcome) -> usize {
        self.run.branches.iter().filter(|b| b.outcome == outcome).count()
    }
    /// Items in flight: dispatched forward and not answered yet, or the one being undone.
    pub fn in_flight(&self) -> usize {
        self.run.in_flight() + usize::from(self.undo_in_flight)
    }
    pub fn not_run(&self) -> usize {
        self.run.branches.iter().filter(|b| b.outcome == Outcome::Open && b.dispatches == 0).count()
    }
    pub fn going_forward(&self) -> bool {
        matches!(self.phase, MapPhase::Running | MapPhase::NotStarted(_))
    }
    /// Every item worth a row, in item order, with what became of it.
    fn listed(&self, wf: Option<&Workflow>) -> Vec<(u32, &'static str)> {
        let forward = self.going_forward();
        let read_only = wf.and_then(|w| w.step(self.at)).is_some_and(|s| s.kind() == StepKind::ReadOnly);
        (0..self.run.branches.len() as u32)
            .filter_map(|i| item_state(self, i, forward, read_only).map(|s| (i, s)))
            .collect()
    }
    /// How far the map is, in one line: "reserve-lines (step 1, 3 items, at most 2 at a
    /// time): 1 of 3 done, 0 refused, 2 in flight".
    pub fn summary(&self) -> String {
        let mut about = vec![format!("step {}", self.at)];
        if let Some(n) = self.items() {
            about.push(format!("{n} {}", if n == 1 { "item" } else { "items" }));
        }
        if let Some(m) = self.map {
            about.push(format!("at most {} at a time", m.max_concurrency));
        }
        let head = format!("{} ({})", self.name(), about.join(", "));
        let path = self.map.map_or_else(|| "its items".to_owned(), |m| m.items.clone());
        match &self.phase {
            MapPhase::NotStarted(Ok(n)) => {
                format!("{head}: not started: its first claim reads its {n} items from {path}")
            }
            MapPhase::NotStarted(Err(why)) => format!(
                "{head}: not started: its items cannot be read from {path} ({why}): its claim gives up, nothing sent"
            ),
            _ => {
                let n = self.run.branches.len();
                let mut line = format!(
                    "{head}: {} of {n} done, {} refused",
                    self.count(Outcome::Succeeded),
                    self.count(Outcome::Refused)
                );
                if let Some(t) = self.map.map(|m| m.tolerated_failures).filter(|t| *t > 0) {
                    line.push_str(&format!(" ({t} tolerated)"));
                }
                line.push_str(&format!(", {} in flight", self.in_flight()));
                if self.phase == MapPhase::Undoing || self.count(Outcome::Undone) > 0 {
                    line.push_str(&format!(", {} undone", self.count(Outcome::Undone)));
                }
                match (&self.phase, self.undoing) {
                    (MapPhase::Undoing, Some(i)) => {
                        line.push_str(&format!("; undoing them newest first, item {i} now"))
                    }
                    (MapPhase::Stopped, _) if self.count(Outcome::Open) > 0 => {
                        line.push_str("; stopped here")
                    }
                    _ => {}
                }
                line
            }
        }
    }
}

/// The map step the task is at: its items as the record keeps them (from its first claim
/// until the task goes past it; in Error after it gave up; while undoing them), rebuilt
/// while the undo of a finished map has not claimed yet, or none read before its first
/// claim.
pub fn map_view<'a>(task: &TaskRecord, wf: Option<&'a Workflow>) -> Option<MapView<'a>> {
    let (run, phase) = match task.stage().filter(|r| r.map) {
        Some(run) => {
            let phase = match task.state() {
                ProcessState::Compensating => MapPhase::Undoing,
                s if s.is_terminal() => MapPhase::Stopped,
                _ => MapPhase::Running,
            };
            (run.clone(), phase)
        }
        None => {
            let map = wf.and_then(|w| w.map_at(task.step))?;
            match task.state() {
                // Undoing a finished map: what it keeps says which items took effect.
                ProcessState::Compensating => (rebuilt(task, map), MapPhase::Undoing),
                s if s.is_terminal() => return None,
                _ => {
                    let read = map.items_path().and_then(|path| {
                        path.resolve(|| task.order_items(), &task.outputs)
                            .map(|items| items.len())
                            .map_err(|e| e.to_string())
                    });
                    (StageRun::for_map(task.step, 0), MapPhase::NotStarted(read))
                }
            }
        }
    };
    let undoing = (phase == MapPhase::Undoing && task.step == run.at).then(|| run.next_to_undo()).flatten();
    let undo_in_flight = undoing.is_some() && task.locked_by().is_some();
    Some(MapView { map: wf.and_then(|w| w.map_at(run.at)), at: run.at, run, phase, undoing, undo_in_flight })
}

/// A finished map's items as its undo reads them: one per element of its output array,
/// the refused ones refused, every other one succeeded (`map_run_for_undo` in the domain).
fn rebuilt(task: &TaskRecord, map: &MapStep) -> StageRun {
    let n = match task.outputs.get(&map.name).map(|o| o.to_value()) {
        Some(Value::Array(items)) => items.len(),
        _ => 0,
    };
    let mut run = StageRun::for_map(map.at, n);
    for (i, b) in (0u32..).zip(run.branches.iter_mut()) {
        b.dispatches = 1;
        b.outcome = if task.refused_items.contains(&i) { Outcome::Refused } else { Outcome::Succeeded };
    }
    run
}

/// The map as `show` prints it: how far it is, then the items worth a look, one a row (at
/// most [`MAX_ROWS`]), then what was counted rather than listed.
pub(super) fn map_lines(
    view: &MapView,
    task: &TaskRecord,
    wf: Option<&Workflow>,
    now: Timestamp,
) -> Vec<String> {
    let mut lines = vec![view.summary()];
    let listed = view.listed(wf);
    if matches!(view.phase, MapPhase::NotStarted(_)) {
        return lines;
    }
    let mut shown = listed.clone();
    if shown.len() > MAX_ROWS {
        shown.sort_by_key(|(i, s)| (rank(s), *i));
        shown.truncate(MAX_ROWS);
        shown.sort_by_key(|(i, _)| *i);
    }
    let when = |t: Option<Timestamp>| match t {
        Some(t) if t <= now => format!("{} (passed)", iso(t)),
        Some(t) => iso(t),
        None => "-".to_owned(),
    };
    if !shown.is_empty() {
        let mut rows =
            vec![["ITEM", "ATTEMPT", "FAILURES", "OUTCOME", "COMPLETE BY"].map(str::to_owned).to_vec()];
        for (i, state) in &shown {
            let b = &view.run.branches[*i as usize];
            let complete_by = match *state {
                "undoing" => task.complete_by(),
                _ => b.complete_by,
            };
            // The item's own attempt: its dispatches (`attempt` is the task's counter).
            let attempt = if b.dispatches == 0 { "-".to_owned() } else { b.dispatches.to_string() };
            rows.push(vec![
                i.to_string(),
                attempt,
                b.failures.to_string(),
                (*state).to_owned(),
                when(complete_by),
            ]);
        }
        lines.extend(crate::text::columns(&rows, "  ").lines().map(str::to_owned));
    }
    let mut unlisted = Vec::new();
    let succeeded = view.count(Outcome::Succeeded)
        - usize::from(view.undoing.is_some_and(|i| {
            view.run.branches.get(i as usize).is_some_and(|b| b.outcome == Outcome::Succeeded)
        }));
    if succeeded > 0 {
        unlisted.push(format!("{succeeded} succeeded"));
    }
    if view.not_run() > 0 {
        unlisted.push(format!("{} not run yet", view.not_run()));
    }
    if listed.len() > shown.len() {
        unlisted.push(format!("{} more (--json lists them)", listed.len() - shown.len()));
    }
    if !unlisted.is_empty() {
        lines.push(format!("  not listed: {}", unlisted.join(", ")));
    }
    lines
}

/// The map as `show --json` gives it: its figures, and every item worth a look with its
/// own attempt (its dispatches), the task's counter its reply echoes (`task_attempt`), its
/// failures, outcome and complete-by.
pub fn map_json(view: &MapView, task: &TaskRecord, wf: Option<&Workflow>) -> Value {
    let listed: Vec<Value> = view
        .listed(wf)
        .into_iter()
        .map(|(i, state)| {
            let b = &view.run.branches[i as usize];
            let complete_by = if state == "undoing" { task.complete_by() } else { b.complete_by };
            json!({
                "index": i,
                "attempt": b.dispatches,
                "task_attempt": b.attempt,
                "failures": b.failures,
                "outcome": b.outcome,
                "state": state,
                "in_flight": b.in_flight() || state == "undoing",
                "complete_by": complete_by.map(iso),
            })
        })
        .collect();
    json!({
        "name": view.map.map(|m| m.name.clone()),
        "step": view.at,
        "step_name": step_name(wf, view.at),
        "items_path": view.map.map(|m| m.items.clone()),
        "items": view.items(),
        "max_concurrency": view.map.map(|m| m.max_concurrency),
        "tolerated_failures": view.map.map(|m| m.tolerated_failures),
        "started": !matches!(view.phase, MapPhase::NotStarted(_)),
        "succeeded": view.count(Outcome::Succeeded),
        "refused": view.count(Outcome::Refused),
        "in_flight": view.in_flight(),
        "undone": view.count(Outcome::Undone),
        "not_run": view.not_run(),
        "undoing": view.undoing,
        "listed": listed,
        "error": match &view.phase {
            MapPhase::NotStarted(Err(why)) => Some(why.clone()),
            _ => None,
        },
    })
}

/// The map as a listing's STEP cell says how far it is: "(map, 3 of 10 done)".
pub fn map_cell(view: &MapView) -> String {
    let n = view.items().map_or_else(|| "?".to_owned(), |n| n.to_string());
    let mut cell = match view.phase {
        MapPhase::NotStarted(_) => format!("map, 0 of {n} done, not started"),
        MapPhase::Undoing => format!("map, undoing, {} of {n} undone", view.count(Outcome::Undone)),
        _ => format!("map, {} of {n} done", view.count(Outcome::Succeeded)),
    };
    if view.going_forward() && view.count(Outcome::Refused) > 0 {
        cell.push_str(&format!(", {} refused", view.count(Outcome::Refused)));
    }
    format!("({cell})")
}

/// The map as a listed task's JSON gives it.
pub fn map_summary_json(view: &MapView) -> Value {
    json!({
        "name": view.name(),
        "items": view.items(),
        "succeeded": view.count(Outcome::Succeeded),
        "refused": view.count(Outcome::Refused),
        "in_flight": view.in_flight(),
        "undone": view.count(Outcome::Undone),
        "undoing": view.phase == MapPhase::Undoing,
    })
}

#[cfg(test)]
mod map_tests {
    use super::*;
    use crate::fixtures::{at_map as quoted, claimed, map_under_way as under_way, map_workflow as wf};
    use crate::tasks::render::summary::table;
    use crate::tasks::render::{show_json, show_text, task_summary_json};
    use sas::domain::{Policy, ReplyOutcome, Trigger};

    const T0: Timestamp = Timestamp(1_700_000_000_000);

    fn ok() -> ReplyOutcome {
        ReplyOutcome::Succeeded { output: None }
    }

    fn refused() -> ReplyOutcome {
        ReplyOutcome::Failed { reason: "422: no stock".into(), detail: None }
    }

    use crate::fixtures::answer as reply;

    #[test]
    fn show_says_how_far_the_map_is_and_lists_only_the_items_worth_a_look() {
        let (wf, t) = under_way();
        assert_eq!((t.state(), t.step), (ProcessState::Processing, 1));
        let text = show_text(&t, Some(&wf), T0.plus_ms(50), &[]);
        for want in [
            "  step          1 reserve-lines, a map step: reserve over each item of $.steps.quote.output.lines, attempt 1 of this step, 5 in all\n",
            "  failures      0 in all; each item's own below (its budget is its step's)\n",
            "  map           reserve-lines (step 1, 5 items, at most 2 at a time): 1 of 5 done, 1 refused (1 tolerated), 2 in flight\n",
            "                  ITEM  ATTEMPT  FAILURES  OUTCOME    COMPLETE BY\n",
            "                  1     1        0         refused    -\n",
            "                  2     1        0         in flight  2023-11-14T22:13:50.030Z\n",
            "                  3     1        0         in flight  2023-11-14T22:13:50.040Z\n",
            "                  not listed: 1 succeeded, 1 not run yet\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("  stage "), "a map is no stage:\n{text}");
        let v = show_json(&t, Some(&wf), T0.plus_ms(50), &[]);
        assert!(v.get("stage").is_none(), "{v}");
        let m = &v["map"];
        assert_eq!(
            (&m["name"], &m["step"], &m["items"], &m["max_concurrency"], &m["tolerated_failures"]),
            (&json!("reserve-lines"), &json!(1), &json!(5), &json!(2), &json!(1))
        );
        assert_eq!(
            (&m["succeeded"], &m["refused"], &m["in_flight"], &m["undone"], &m["not_run"]),
            (&json!(1), &json!(1), &json!(2), &json!(0), &json!(1))
        );
        assert_eq!(m["listed"].as_array().unwrap().len(), 3);
        assert_eq!(
            m["listed"][1],
            json!({"index": 2, "attempt": 1, "task_attempt": t.dispatch_of(1, Some(2)).0, "failures": 0,
                   "outcome": "open", "state": "in flight", "in_flight": true,
                   "complete_by": "2023-11-14T22:13:50.030Z"})
        );
        assert_eq!(m["listed"][0]["outcome"], "refused");
        // The listing: the map's name and how far it is.
        assert!(table(&[(&t, Some(&wf))]).contains("  1 reserve-lines (map, 1 of 5 done, 1 refused)  "));
        let listed = task_summary_json(&t, Some(&wf));
        assert_eq!(listed["map"]["items"], 5);
        assert_eq!((&listed["map"]["succeeded"], &listed["map"]["in_flight"]), (&json!(1), &json!(2)));
        assert!(listed.get("stage").is_none());
    }

    #[test]
    fn before_its_first_claim_the_map_says_how_many_items_it_will_read() {
        let wf = wf(2, 0);
        let t = quoted(&wf, 4);
        let text = show_text(&t, Some(&wf), T0.plus_ms(16), &[]);
        assert!(
            text.contains("  map           reserve-lines (step 1, 4 items, at most 2 at a time): not started: its first claim reads its 4 items from $.steps.quote.output.lines\n"),
            "{text}"
        );
        assert!(table(&[(&t, Some(&wf))]).contains("  1 reserve-lines (map, 0 of 4 done, not started)  "));
        assert_eq!(show_json(&t, Some(&wf), T0, &[])["map"]["started"], false);
    }

    #[test]
    fn a_thousand_items_are_never_a_thousand_rows() {
        // 40 items, 5 at a time, up to 40 refusals: 30 refused, the last 5 in flight.
        let wf = wf(5, 40);
        let mut t = claimed(&quoted(&wf, 40), &wf, 2, 20);
        for i in 0..35 {
            let outcome = if i < 30 { refused() } else { ok() };
            t = reply(&t, &wf, Some(i), outcome, 30 + u64::from(i));
        }
        let run = t.stage().unwrap();
        assert_eq!((run.refused(), run.in_flight()), (30, 5));
        let text = show_text(&t, Some(&wf), T0.plus_ms(100), &[]);
        let rows =
            text.lines().filter(|l| l.starts_with("                  ") && !l.contains("ITEM")).count();
        assert_eq!(rows, MAX_ROWS + 1, "{text}");
        assert!(text.contains("not listed: 5 succeeded, 15 more (--json lists them)\n"), "{text}");
        for i in 35..40 {
            assert!(
                text.contains(&format!("\n                  {i}    1        0         in flight")),
                "{text}"
            );
        }
        let v = show_json(&t, Some(&wf), T0.plus_ms(100), &[]);
        assert_eq!(v["map"]["listed"].as_array().unwrap().len(), 35);
    }

    #[test]
    fn undoing_a_finished_map_counts_its_items_undone_newest_first() {
        let (wf, t) = under_way();
        let t = reply(&t, &wf, Some(2), ok(), 50);
        let t = reply(&t, &wf, Some(3), ok(), 60);
        let t = reply(&t, &wf, Some(4), ok(), 70);
        assert_eq!((t.state(), t.step, t.refused_items.as_slice()), (ProcessState::Pending, 2, &[1][..]));
        // ship is refused: the map's items are undone, newest first, the refused one passed over.
        let t = reply(&claimed(&t, &wf, 3, 80), &wf, None, refused(), 90);
        assert_eq!((t.state(), t.step, t.stage()), (ProcessState::Compensating, 1, None));
        let text = show_text(&t, Some(&wf), T0.plus_ms(95), &[]);
        for want in [
            "  map           reserve-lines (step 1, 5 items, at most 2 at a time): 4 of 5 done, 1 refused (1 tolerated), 0 in flight, 0 undone; undoing them newest first, item 4 now\n",
            "                  1     1        0         refused       -\n",
            "                  4     1        0         next to undo  -\n",
            "                  not listed: 3 succeeded\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let undoing = claimed(&t, &wf, 4, 100);
        let text = show_text(&undoing, Some(&wf), T0.plus_ms(101), &[]);
        assert!(text.contains(", 1 in flight, 0 undone; undoing them newest first, item 4 now\n"), "{text}");
        assert!(
            text.contains("                  4     1        0         undoing  2023-11-14T22:13:50.100Z\n")
        );
        let t = reply(&undoing, &wf, Some(4), ok(), 110);
        let text = show_text(&t, Some(&wf), T0.plus_ms(111), &[]);
        assert!(text.contains("3 of 5 done, 1 refused (1 tolerated), 0 in flight, 1 undone; undoing them newest first, item 3 now\n"), "{text}");
        for want in [
            "                  ITEM  ATTEMPT  FAILURES  OUTCOME       COMPLETE BY\n",
            "                  1     1        0         refused       -\n",
            "                  3     1        0         next to undo  -\n",
            "                  4     1        0         undone        -\n",
            "                  not listed: 2 succeeded\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(table(&[(&t, Some(&wf))]).contains("  1 reserve-lines (map, undoing, 1 of 5 undone)  "));
        let v = show_json(&t, Some(&wf), T0.plus_ms(111), &[]);
        assert_eq!((&v["map"]["undone"], &v["map"]["undoing"]), (&json!(1), &json!(3)));
    }

    #[test]
    fn a_refusal_too_many_leaves_the_items_out_in_doubt_and_the_undo_waits_for_them() {
        let wf = wf(3, 0);
        let t = claimed(&quoted(&wf, 4), &wf, 2, 20);
        let t = reply(&t, &wf, Some(0), ok(), 30);
        let gave_up = reply(&t, &wf, Some(1), refused(), 40);
        assert_eq!((gave_up.state(), gave_up.step), (ProcessState::Compensating, 1));
        let text = show_text(&gave_up, Some(&wf), T0.plus_ms(41), &[]);
        for want in [
            "                  1     1        0         refused       -\n",
            "                  2     1        0         in doubt      -\n",
            "                  3     1        0         next to undo  -\n",
            "  hold until    2023-11-14T22:13:50.030Z (items of the map still out may run until then: the undo waits)\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // A lapse going forward: the items out are to be sent again.
        let t = claimed(&quoted(&wf, 4), &wf, 2, 20);
        let retried = t.lapse(t.deadline().unwrap(), &wf, &Policy::default(), 0).unwrap();
        assert_eq!(retried.trigger, Trigger::Retry);
        let text = show_text(&retried.next, Some(&wf), t.deadline().unwrap(), &[]);
        assert!(text.contains("                  2     1        1         to retry  -\n"), "{text}");
        assert!(text.contains("not listed: 1 not run yet\n"), "{text}");
    }
}
