//! A parallel stage as `show` and the listing give it: the stage and its branches side by
//! side, as text (a table, a row per branch) and as JSON.

use sas::domain::workflow::Stage;
use sas::domain::{Action, Outcome, StageRun, StepKind, TaskRecord, Timestamp, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, step_name};

/// A parallel stage as a task's record shows it: the stage (when the workflow is known)
/// and its branches, as the record keeps them, or fresh before the stage's first claim.
pub struct StageView<'a> {
    pub stage: Option<&'a Stage>,
    pub run: StageRun,
    /// Whether the record keeps the branches (false: the task waits for the stage's
    /// first claim, and nothing of it ran yet).
    pub kept: bool,
}

impl StageView<'_> {
    /// The stage's name, or where it starts when the workflow is unknown.
    pub fn name(&self) -> String {
        self.stage.map_or_else(|| format!("at step {}", self.run.at), |s| s.name.clone())
    }
    pub(super) fn count(&self, outcome: Outcome) -> usize {
        self.run.branches.iter().filter(|b| b.outcome == outcome).count()
    }
    /// The task is at the stage going forward (not undoing its branches).
    pub(super) fn going_forward(&self, task: &TaskRecord) -> bool {
        task.action() == Action::Do && task.step == self.run.at
    }
    pub(super) fn steps(&self) -> String {
        let last = self.run.at + self.run.branches.len().saturating_sub(1) as u32;
        format!("steps {}-{last}", self.run.at)
    }
}

/// The parallel stage of the task: the branches its record keeps (from the stage's first
/// claim until the task goes past it; in Error, and while undoing after a give-up there),
/// or the stage it waits to claim. A map step's items are no stage's (`map.rs`).
pub fn stage_view<'a>(task: &TaskRecord, wf: Option<&'a Workflow>) -> Option<StageView<'a>> {
    if let Some(run) = task.stage() {
        if run.map {
            return None;
        }
        let stage = wf.and_then(|w| w.stage_at(run.at));
        return Some(StageView { stage, run: run.clone(), kept: true });
    }
    let fresh = task.action() == Action::Do && !task.state().is_terminal();
    let stage = wf.filter(|_| fresh).and_then(|w| w.stage_at(task.step))?;
    Some(StageView { stage: Some(stage), run: StageRun::new(stage), kept: false })
}

/// The stage's branches as `show` prints them: a line saying how far the stage is, then
/// a table of the branches side by side, one a row.
pub(super) fn stage_lines(
    view: &StageView,
    forward: bool,
    wf: Option<&Workflow>,
    now: Timestamp,
) -> Vec<String> {
    let n = view.run.branches.len();
    let in_flight = view.run.branches.iter().filter(|b| b.in_flight()).count();
    let mut summary = format!(
        "{} ({}, {n} branches): {} succeeded",
        view.name(),
        view.steps(),
        view.count(Outcome::Succeeded)
    );
    if in_flight > 0 {
        summary.push_str(&format!(", {in_flight} in flight"));
    }
    if view.count(Outcome::Refused) > 0 {
        summary.push_str(&format!(", {} refused", view.count(Outcome::Refused)));
    }
    if !view.kept {
        summary.push_str("; not claimed yet: its claim dispatches every branch at once");
    }
    let mut rows = vec![[
        "BRANCH".to_owned(),
        "ATTEMPT".to_owned(),
        "FAILURES".to_owned(),
        "OUTCOME".to_owned(),
        "COMPLETE BY".to_owned(),
    ]];
    for (step, b) in view.run.each() {
        let name = match step_name(wf, step) {
            Some(name) => format!("{step} {name}"),
            None => step.to_string(),
        };
        let outcome = match b.outcome {
            Outcome::Open if b.in_flight() => "in flight",
            Outcome::Open if b.dispatches == 0 => "not run",
            // Dispatched and unanswered: the stage's next claim sends it again; after a
            // give-up it may have taken effect, and is undone as such.
            Outcome::Open if forward => "to retry",
            // A read has nothing to undo, whatever became of it.
            Outcome::Open
                if wf.and_then(|w| w.step(step)).is_some_and(|s| s.kind() == StepKind::ReadOnly) =>
            {
                "unanswered"
            }
            Outcome::Open => "in doubt",
            Outcome::Succeeded => "succeeded",
            Outcome::Refused => "refused",
            Outcome::Undone => "undone",
        };
        let complete_by = match b.complete_by {
            Some(t) if t <= now => format!("{} (passed)", iso(t)),
            Some(t) => iso(t),
            None => "-".to_owned(),
        };
        // The branch's own attempt: its dispatches (`attempt` is the task's counter).
        let attempt = if b.dispatches == 0 { "-".to_owned() } else { b.dispatches.to_string() };
        rows.push([name, attempt, b.failures.to_string(), outcome.to_owned(), complete_by]);
    }
    let mut lines = vec![summary];
    lines.extend(columns(&rows).into_iter().map(|l| format!("  {l}")));
    lines
}

/// Rows of cells as lines, each column padded to its widest cell, the last unpadded.
fn columns<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  "));
                }
            }
            line.trim_end().to_owned()
        })
        .collect()
}

/// The stage's branches as `show --json` gives them: each with its step and name, its own
/// attempt (its dispatches) and the task's counter its reply echoes (`task_attempt`),
/// times in ISO-8601.
pub fn stage_json(view: &StageView, wf: Option<&Workflow>) -> Value {
    let branches: Vec<Value> = view
        .run
        .each()
        .map(|(step, b)| {
            json!({
                "step": step,
                "step_name": step_name(wf, step),
                "attempt": b.dispatches,
                "task_attempt": b.attempt,
                "failures": b.failures,
                "outcome": b.outcome,
                "in_flight": b.in_flight(),
                "complete_by": b.complete_by.map(iso),
            })
        })
        .collect();
    json!({
        "name": view.stage.map(|s| s.name.clone()),
        "at": view.run.at,
        "claimed": view.kept,
        "branches": branches,
    })
}

#[cfg(test)]
mod stage_tests {
    use super::*;
    use crate::tasks::render::summary::table;
    use crate::tasks::render::timeline::{Lane, lanes};
    use crate::tasks::render::{show_json, show_text, task_summary_json};
    use sas::domain::workflow::{Entry as Text, StageText};
    use sas::domain::{AgentReply, LeaseToken, Policy, ProcessState, ReplyOutcome, Step, Trigger};

    const T0: Timestamp = Timestamp(1_700_000_000_000);

    /// charge, then reserve-all (reserve-east, reserve-west, screen) at once, then ship.
    fn wf() -> Workflow {
        Workflow::of_entries(
            "w",
            vec![
                Text::Step(Step::compensable("charge", "payment", "refund")),
                Text::Parallel {
                    parallel: StageText {
                        name: "reserve-all".into(),
                        steps: vec![
                            Step::compensable("reserve-east", "warehouse-east", "release-east"),
                            Step::compensable("reserve-west", "warehouse-west", "release-west"),
                            Step::read_only("screen", "fraud"),
                        ],
                    },
                },
                Text::Step(Step::pivot("ship", "shipping")),
            ],
        )
    }

    fn lease(n: u128) -> LeaseToken {
        LeaseToken(uuid::Uuid::from_u128(n))
    }

    fn reply(t: &TaskRecord, step: u32, outcome: ReplyOutcome, at: u64) -> TaskRecord {
        let (attempt, _) = t.dispatch_of(step, None);
        let r = AgentReply {
            order_id: t.order_id.clone(),
            step,
            action: t.action(),
            attempt,
            lease: t.locked_by().expect("a live lease"),
            index: None,
            outcome,
        };
        t.apply_reply(&r, T0.plus_ms(at), &wf(), &Policy::default()).expect("applied").next
    }

    fn ok() -> ReplyOutcome {
        ReplyOutcome::Succeeded { output: None }
    }

    /// Charged, then the stage claimed at T0 + 20 ms: every branch in flight.
    fn at_stage() -> TaskRecord {
        let (wf, policy) = (wf(), Policy::default());
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        let t = t.claim(lease(1), T0.plus_ms(10), &wf, &policy).unwrap().next;
        let t = reply(&t, 0, ok(), 15);
        assert_eq!((t.state(), t.step), (ProcessState::Pending, 1));
        t.claim(lease(2), T0.plus_ms(20), &wf, &policy).unwrap().next
    }

    /// reserve-west and screen answered; reserve-east still out.
    fn two_done() -> TaskRecord {
        let t = reply(&at_stage(), 2, ok(), 30);
        reply(&t, 3, ok(), 40)
    }

    #[test]
    fn show_sets_a_stages_branches_side_by_side() {
        let t = two_done();
        assert_eq!((t.state(), t.step), (ProcessState::Processing, 1));
        let now = T0.plus_ms(50);
        let text = show_text(&t, Some(&wf()), now, &[]);
        for want in [
            "  step          1 reserve-all, a parallel stage of steps 1-3 (3 at once), attempt 1 of this stage, 4 in all\n",
            "  failures      0 in all; each branch's own below (its budget is its step's)\n",
            "  stage         reserve-all (steps 1-3, 3 branches): 2 succeeded, 1 in flight\n",
            "                  BRANCH          ATTEMPT  FAILURES  OUTCOME    COMPLETE BY\n",
            "                  1 reserve-east  1        0         in flight  2023-11-14T22:13:50.020Z\n",
            "                  2 reserve-west  1        0         succeeded  -\n",
            "                  3 screen        1        0         succeeded  -\n",
            // The claim is the stage's; each success sits in its branch's lane.
            "  2023-11-14T22:13:20.020Z  Claimed       * * *  stage reserve-all (steps 1-3)  attempt 1\n",
            "  2023-11-14T22:13:20.030Z  BranchDone    | * |  step 2 reserve-west\n",
            "  2023-11-14T22:13:20.040Z  BranchDone    | | *  step 3 screen\n",
            // Before the stage, a lone step's lines as ever.
            "  2023-11-14T22:13:20.015Z  Advanced      step 0 charge  attempt 1\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Past its complete-by, the branch says so.
        let late = show_text(&t, Some(&wf()), T0.plus_ms(60_000), &[]);
        assert!(late.contains("in flight  2023-11-14T22:13:50.020Z (passed)\n"), "{late}");
    }

    #[test]
    fn show_json_gives_the_stage_and_each_entrys_branch() {
        let t = two_done();
        let v = show_json(&t, Some(&wf()), T0.plus_ms(50), &[]);
        assert_eq!(v["stage"]["name"], "reserve-all");
        assert_eq!(v["stage"]["at"], 1);
        assert_eq!(v["stage"]["claimed"], true);
        assert_eq!(
            v["stage"]["branches"][0],
            json!({"step": 1, "step_name": "reserve-east", "attempt": 1, "task_attempt": 2, "failures": 0,
                   "outcome": "open", "in_flight": true, "complete_by": "2023-11-14T22:13:50.020Z"})
        );
        assert_eq!(v["stage"]["branches"][1]["outcome"], "succeeded");
        assert_eq!(v["stage"]["branches"][1]["complete_by"], Value::Null);
        let timeline = v["timeline"].as_array().unwrap();
        let claim = timeline.iter().find(|e| e["what"] == "Claimed" && e["step"] == 1).unwrap();
        assert_eq!((&claim["stage"], &claim["branch"]), (&json!("reserve-all"), &Value::Null));
        assert_eq!(claim["branches"], json!(["reserve-east", "reserve-west", "screen"]));
        let west = timeline.iter().find(|e| e["what"] == "BranchDone" && e["step"] == 2).unwrap();
        assert_eq!((&west["stage"], &west["branch"]), (&json!("reserve-all"), &json!("reserve-west")));
        // A lone step's entry has neither.
        assert!(timeline[0].get("stage").is_none() && timeline[0].get("branch").is_none());
        // Without the stage's workflow, the branches still show, by step.
        let bare = show_json(&t, None, T0.plus_ms(50), &[]);
        assert_eq!(
            (&bare["stage"]["name"], &bare["stage"]["branches"][2]["step"]),
            (&Value::Null, &json!(3))
        );
    }

    #[test]
    fn the_listing_names_the_stage_and_how_far_it_is() {
        let t = two_done();
        let listed = table(&[(&t, Some(&wf()))]);
        assert!(listed.contains("  1 reserve-all (stage, 2 of 3 done)  "), "{listed}");
        let v = task_summary_json(&t, Some(&wf()));
        assert_eq!(v["stage"], json!({"name": "reserve-all", "branches": 3, "succeeded": 2, "in_flight": 1}));
        // Waiting for the stage's first claim: named too, nothing run yet.
        let charged = {
            let t = crate::fixtures::task("o-2", ProcessState::Pending);
            let t = t.claim(lease(1), T0.plus_ms(10), &wf(), &Policy::default()).unwrap().next;
            reply(&t, 0, ok(), 15)
        };
        assert!(table(&[(&charged, Some(&wf()))]).contains("  1 reserve-all (stage, 0 of 3 done)  "));
        let text = show_text(&charged, Some(&wf()), T0.plus_ms(16), &[]);
        assert!(
            text.contains("0 succeeded; not claimed yet: its claim dispatches every branch at once\n"),
            "{text}"
        );
        assert!(text.contains("  1 reserve-east  -        0         not run  -\n"), "{text}");
        // A task at a lone step has no stage.
        let lone = crate::fixtures::task("o-3", ProcessState::Pending);
        assert!(task_summary_json(&lone, Some(&wf())).get("stage").is_none());
        assert!(show_json(&lone, Some(&wf()), T0, &[]).get("stage").is_none());
    }

    #[test]
    fn a_refused_branch_undoes_the_others_each_in_its_lane() {
        let refused = ReplyOutcome::Failed { reason: "422: no stock".into(), detail: None };
        let t = reply(&two_done(), 1, refused, 45);
        assert_eq!((t.state(), t.step), (ProcessState::Compensating, 2));
        let text = show_text(&t, Some(&wf()), T0.plus_ms(50), &[]);
        for want in [
            "  2023-11-14T22:13:20.045Z  Undo          * | |  step 1 reserve-east  422: no stock\n",
            "  stage         reserve-all (steps 1-3, 3 branches): 2 succeeded, 1 refused\n",
            "                  1 reserve-east  1        0         refused    -\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Refused while the others are still out: they may have taken effect, and the
        // undo waits for them.
        let early = reply(&at_stage(), 1, ReplyOutcome::Failed { reason: "422".into(), detail: None }, 25);
        let text_early = show_text(&early, Some(&wf()), T0.plus_ms(26), &[]);
        for want in [
            "                  2 reserve-west  1        0         in doubt    -\n",
            "                  3 screen        1        0         unanswered  -\n",
            "  hold until    2023-11-14T22:13:50.020Z (branches of the stage still out may run until then: the undo waits)\n",
        ] {
            assert!(text_early.contains(want), "missing {want:?} in\n{text_early}");
        }
        // Undoing, the step is the branch being undone; the listing names it as such.
        assert!(
            text.contains("  step          2 reserve-west, attempt 0 of this step, 4 in all\n"),
            "{text}"
        );
        assert!(table(&[(&t, Some(&wf()))]).contains("  2 reserve-west  "));
        // The undo's claim of reserve-west is its branch's, not the stage's.
        let policy = Policy::default();
        let undoing = t.claim(lease(3), T0.plus_ms(50), &wf(), &policy).unwrap().next;
        assert_eq!(
            (undoing.state(), undoing.step, undoing.action()),
            (ProcessState::Compensating, 2, Action::Undo)
        );
        let wf = wf();
        let lanes = lanes(&undoing.timeline, Some(&wf));
        assert_eq!(lanes.last(), Some(&Lane::Branch(&wf.stages[0], 1)));
    }

    #[test]
    fn a_stages_retry_is_the_stages_and_a_spent_branchs_give_up_its_own() {
        let (wf, policy) = (wf(), Policy::default());
        let t = reply(&at_stage(), 2, ok(), 30);
        let deadline = t.deadline().unwrap();
        let retried = t.lapse(deadline, &wf, &policy, 0).unwrap().next;
        assert_eq!(retried.state(), ProcessState::Pending);
        let text = show_text(&retried, Some(&wf), deadline, &[]);
        // reserve-west succeeded: the retry (and the claim after it) is the others'.
        assert!(text.contains("  Retry         * | *  stage reserve-all (steps 1-3)  attempt 1"), "{text}");
        assert!(
            text.contains("                  1 reserve-east  1        1         to retry   -\n"),
            "{text}"
        );
        let lanes_of = |t: &TaskRecord| lanes(&t.timeline, Some(&wf)).last().copied();
        assert_eq!(lanes_of(&retried), Some(Lane::Stage(&wf.stages[0], 0b101)));
        // Retried until reserve-east's budget is spent: the give-up names that branch.
        let mut t = retried;
        let gave_up = loop {
            let at = t.deadline().unwrap();
            let claimed = t.claim(lease(u128::from(t.attempt) + 10), at, &wf, &policy).unwrap().next;
            let d = claimed.lapse(claimed.deadline().unwrap(), &wf, &policy, 0).unwrap();
            if d.trigger != Trigger::Retry {
                break d.next;
            }
            t = d.next;
        };
        assert_eq!(gave_up.state(), ProcessState::Compensating);
        assert_eq!(lanes_of(&gave_up), Some(Lane::Branch(&wf.stages[0], 0)));
        let text = show_text(&gave_up, Some(&wf), gave_up.updated_at, &[]);
        assert!(
            text.contains("  Undo          * | |  step 1 reserve-east  failure threshold reached"),
            "{text}"
        );
    }

    /// A workflow may begin with its stage: the task's submission is the stage's entry,
    /// not its first branch's.
    #[test]
    fn a_workflow_that_begins_with_a_stage_is_submitted_to_the_stage() {
        let wf = Workflow::of_entries(
            "w",
            vec![Text::Parallel {
                parallel: StageText {
                    name: "both".into(),
                    steps: vec![Step::pivot("a", "a"), Step::pivot("b", "b")],
                },
            }],
        );
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        assert_eq!(lanes(&t.timeline, Some(&wf)), [Lane::Stage(&wf.stages[0], 0b11)]);
        let text = show_text(&t, Some(&wf), T0, &[]);
        assert!(text.contains("  Submitted     * *  stage both (steps 0-1)  attempt 0\n"), "{text}");
    }
}
