//! A parallel stage's branches as the record keeps them: from the stage's first claim
//! until the task goes past it, and after a give-up there until the task ends, because
//! undoing must know which branches may have taken effect.
//!
//! Each branch has what a lone step has in the record itself: the attempt its reply is
//! fenced on, its complete-by, its failure budget's use, and whether it was ever
//! dispatched (its effect may have happened) or answered for good.
//!
//! A map step's items are kept the same way, one branch per item of its one step
//! (`map: true`), each with its output; while the map is undone, each item undone is
//! marked so, and the next to undo is the newest that may still stand.

use serde::{Deserialize, Serialize};

use crate::domain::ids::Timestamp;
use crate::domain::output::StepOutput;
use crate::domain::workflow::Stage;

/// What a branch came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Not answered for good yet: never dispatched, in flight, or lapsed.
    #[default]
    Open,
    /// Its service answered success; its output is kept under its name.
    Succeeded,
    /// Its service refused it: it had no effect.
    Refused,
    /// A map item whose compensation succeeded: nothing of it stands.
    Undone,
}

impl Outcome {
    fn is_open(&self) -> bool {
        *self == Outcome::Open
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Branch {
    /// The task's attempt number of this branch's newest dispatch: its reply must echo it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// Dispatches of this branch: non-zero means its effect may have happened.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dispatches: u32,
    /// Its lapses: its own failure budget's use.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// The complete-by of its dispatch in flight; none when nothing of it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Outcome::is_open")]
    pub outcome: Outcome,
    /// A map item's output, from its success (a stage's branches keep theirs under
    /// their step's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<StepOutput>,
}

impl Branch {
    pub fn in_flight(&self) -> bool {
        self.complete_by.is_some()
    }
    /// Dispatched, and neither refused nor undone: undoing must cover it.
    pub fn may_have_taken_effect(&self) -> bool {
        self.dispatches > 0 && matches!(self.outcome, Outcome::Open | Outcome::Succeeded)
    }
    /// Answered for good going forward: it needs no more dispatches.
    pub fn settled(&self) -> bool {
        matches!(self.outcome, Outcome::Succeeded | Outcome::Refused)
    }
}

/// The branches of the stage whose first step is `at`, in step order; or, with `map`,
/// the items of the map step `at`, in item order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRun {
    pub at: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub map: bool,
    pub branches: Vec<Branch>,
}

impl StageRun {
    pub fn new(stage: &Stage) -> StageRun {
        StageRun { at: stage.start, map: false, branches: vec![Branch::default(); stage.len as usize] }
    }
    /// The items of the map step `at`, none dispatched yet.
    pub fn for_map(at: u32, items: usize) -> StageRun {
        StageRun { at, map: true, branches: vec![Branch::default(); items] }
    }
    /// The branch a reply or dispatch names: a stage's by its step, a map's by its item.
    pub fn slot(&self, step: u32, index: Option<u32>) -> Option<&Branch> {
        match (self.map, index) {
            (true, Some(i)) if step == self.at => self.branches.get(i as usize),
            (false, None) => self.branch(step),
            _ => None,
        }
    }
    pub fn slot_mut(&mut self, step: u32, index: Option<u32>) -> Option<&mut Branch> {
        match (self.map, index) {
            (true, Some(i)) if step == self.at => self.branches.get_mut(i as usize),
            (false, None) => self.branch_mut(step),
            _ => None,
        }
    }
    /// Items (or branches) in flight now.
    pub fn in_flight(&self) -> usize {
        self.branches.iter().filter(|b| b.in_flight()).count()
    }
    pub fn refused(&self) -> usize {
        self.branches.iter().filter(|b| b.outcome == Outcome::Refused).count()
    }
    /// Every item answered for good: succeeded or refused.
    pub fn all_settled(&self) -> bool {
        self.branches.iter().all(Branch::settled)
    }
    /// A map's next item to undo: the newest that may still stand.
    pub fn next_to_undo(&self) -> Option<u32> {
        if crate::mutations::undo_refused_items() {
            return self
                .branches
                .iter()
                .rposition(|b| b.dispatches > 0 && b.outcome != Outcome::Undone)
                .map(|i| i as u32);
        }
        self.branches.iter().rposition(Branch::may_have_taken_effect).map(|i| i as u32)
    }
    pub fn steps(&self) -> std::ops::Range<u32> {
        self.at..self.at + self.branches.len() as u32
    }
    pub fn contains(&self, step: u32) -> bool {
        self.steps().contains(&step)
    }
    pub fn branch(&self, step: u32) -> Option<&Branch> {
        step.checked_sub(self.at).and_then(|i| self.branches.get(i as usize))
    }
    pub fn branch_mut(&mut self, step: u32) -> Option<&mut Branch> {
        step.checked_sub(self.at).and_then(|i| self.branches.get_mut(i as usize))
    }
    /// The branches with their step numbers.
    pub fn each(&self) -> impl Iterator<Item = (u32, &Branch)> {
        self.steps().zip(&self.branches)
    }
    pub fn all_succeeded(&self) -> bool {
        self.branches.iter().all(|b| b.outcome == Outcome::Succeeded)
    }
    /// No branch is in flight any more: the lease that covered them ended.
    pub fn land_all(&mut self) {
        self.branches.iter_mut().for_each(|b| b.complete_by = None);
    }
    /// The latest complete-by of the branches in flight: the stage's own.
    pub fn latest_complete_by(&self) -> Option<Timestamp> {
        self.branches.iter().filter_map(|b| b.complete_by).max()
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_may_have_taken_effect_once_dispatched_unless_refused() {
        let stage = Stage { name: "s".into(), start: 2, len: 3 };
        let mut run = StageRun::new(&stage);
        assert_eq!(run.steps(), 2..5);
        assert!(run.branch(1).is_none() && run.branch(5).is_none());
        assert!(!run.branch(2).unwrap().may_have_taken_effect());
        let b = run.branch_mut(3).unwrap();
        b.dispatches = 1;
        assert!(b.may_have_taken_effect());
        b.outcome = Outcome::Refused;
        assert!(!b.may_have_taken_effect());
        b.outcome = Outcome::Succeeded;
        assert!(b.may_have_taken_effect());
        assert!(!run.all_succeeded());
    }

    #[test]
    fn an_idle_branch_is_written_as_an_empty_object() {
        let run = StageRun::new(&Stage { name: "s".into(), start: 0, len: 2 });
        assert_eq!(serde_json::to_string(&run).unwrap(), r#"{"at":0,"branches":[{},{}]}"#);
    }
}

/// The stage's decisions, end to end: claim, join, give-up and undo, lapse, operators.
#[cfg(test)]
mod decisions {
    use crate::domain::lifecycle::{ProcessState, Trigger};
    use crate::domain::messages::OrderStatus;
    use crate::domain::task::fixtures::*;
    use crate::domain::task::{Act, Effect, Refusal, StaleReason, TaskRecord};
    use crate::domain::workflow::{Action, Workflow};

    /// At the stage (steps 1 to 3), claimed at T0.
    fn at_stage(wf: &Workflow) -> TaskRecord {
        let checked_ok = reply(&claim(&new_task(wf), wf, 1, T0), wf, ok(), T0).next;
        assert_eq!(checked_ok.step, 1);
        claim(&checked_ok, wf, 2, T0)
    }

    fn answer(
        t: &TaskRecord,
        wf: &Workflow,
        step: u32,
        outcome: crate::domain::messages::ReplyOutcome,
    ) -> crate::domain::task::Decision {
        checked(t, t.apply_reply(&branch_reply(t, step, outcome), T0.plus_ms(10), wf, &policy()))
    }

    fn dispatched(d: &crate::domain::task::Decision) -> Vec<u32> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Dispatch { step, action: Action::Do, .. } => Some(*step),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_stages_claim_dispatches_every_branch_each_with_its_own_attempt() {
        let wf = parallel();
        let before = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, ok(), T0).next;
        let d = checked(&before, before.claim(lease(2), T0, &wf, &policy()));
        assert_eq!(dispatched(&d), [1, 2, 3]);
        let t = d.next;
        assert_eq!((t.state(), t.step, t.attempt, t.step_attempts), (ProcessState::Processing, 1, 4, 1));
        let run = t.stage().unwrap();
        assert_eq!(run.branches.iter().map(|b| b.attempt).collect::<Vec<_>>(), [2, 3, 4]);
        assert!(run.branches.iter().all(|b| b.dispatches == 1 && b.complete_by == t.complete_by()));
        assert_eq!(t.dispatch_of(2, None), (3, t.complete_by()));
    }

    #[test]
    fn the_stage_joins_when_every_branch_succeeded_and_later_steps_get_every_output() {
        let wf = parallel();
        let t = at_stage(&wf);
        let d = answer(&t, &wf, 2, output(r#"{"b":1}"#));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::BranchDone, ProcessState::Processing, 1)
        );
        assert_eq!(statuses(&d), [OrderStatus::StepCompleted]);
        assert!(d.effects.iter().all(|e| !matches!(e, Effect::Schedule { .. } | Effect::Dispatch { .. })));
        // Its duplicate changes nothing: the branch has no attempt in flight any more.
        let again = d.next.apply_reply(&branch_reply(&t, 2, ok()), T0.plus_ms(11), &wf, &policy());
        assert_eq!(again, Err(Refusal::StaleReply(StaleReason::BranchIdle { step: 2 })));
        let d = answer(&d.next, &wf, 1, output(r#"{"a":1}"#));
        assert_eq!(d.trigger, Trigger::BranchDone);
        let d = answer(&d.next, &wf, 3, ok());
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Advanced, ProcessState::Pending, 4));
        assert_eq!(d.next.stage(), None);
        assert_eq!(d.next.outputs.keys().collect::<Vec<_>>(), ["reserve-a", "reserve-b"]);
        assert_eq!(d.next.step_attempts, 0, "the step after the stage starts its own count");
    }

    #[test]
    fn a_reply_is_fenced_on_its_own_branchs_attempt_and_complete_by() {
        let wf = parallel();
        let t = at_stage(&wf);
        let mut other = branch_reply(&t, 1, ok());
        other.attempt = t.dispatch_of(2, None).0;
        assert_eq!(t.fence(&other, T0), Err(StaleReason::OtherAttempt { current: 2, reply: 3 }));
        let late = t.complete_by().unwrap().plus_ms(1);
        assert!(matches!(t.fence(&branch_reply(&t, 1, ok()), late), Err(StaleReason::PastCompleteBy { .. })));
        let outside = branch_reply(&t, 4, ok());
        assert!(matches!(t.fence(&outside, T0), Err(StaleReason::OtherStep { .. })));
    }

    #[test]
    fn a_refused_branch_stops_the_stage_and_undoes_exactly_the_branches_that_may_have_taken_effect() {
        let wf = parallel();
        let t = at_stage(&wf);
        // reserve-b succeeds, reserve-a is refused while notify is still out.
        let t = answer(&t, &wf, 2, ok()).next;
        let d = answer(&t, &wf, 1, failed("no stock"));
        assert_eq!((d.trigger, d.next.state()), (Trigger::Undo, ProcessState::Compensating));
        // reserve-b is undone; reserve-a had no effect; notify (read-only) needs nothing.
        assert_eq!(d.next.step, 2);
        // notify is still out: the undo waits until its complete-by and the grace.
        assert_eq!(d.next.hold_until(), t.complete_by());
        let delay = t.complete_by().unwrap().plus_ms(policy().reply_grace_ms).millis_since(T0.plus_ms(10));
        assert!(d.effects.contains(&Effect::Schedule { delay_ms: delay }), "{:?}", d.effects);
        // notify's late reply is fenced off: the lease is gone.
        let late = d.next.apply_reply(&branch_reply(&t, 3, ok()), T0.plus_ms(20), &wf, &policy());
        assert!(matches!(late, Err(Refusal::StaleReply(_))), "{late:?}");
        // The undo: release-b, then nothing below but the read: Compensated.
        let undo = claim(&d.next, &wf, 9, d.next.hold_until().unwrap().plus_ms(policy().reply_grace_ms));
        assert_eq!((undo.step, undo.action()), (2, Action::Undo));
        let d = reply(&undo, &wf, ok(), undo.complete_by().unwrap());
        assert_eq!(
            (d.trigger, d.next.state(), d.next.stage()),
            (Trigger::Undone, ProcessState::Compensated, None)
        );
    }

    #[test]
    fn a_lapse_counts_against_each_open_branch_and_the_retry_dispatches_only_those() {
        let wf = parallel();
        let t = at_stage(&wf);
        let t = answer(&t, &wf, 3, ok()).next;
        let d = lapse(&t, &wf, 0);
        assert_eq!((d.trigger, d.next.state()), (Trigger::Retry, ProcessState::Pending));
        let run = d.next.stage().unwrap();
        assert_eq!(run.branches.iter().map(|b| b.failures).collect::<Vec<_>>(), [1, 1, 0]);
        assert!(run.branches.iter().all(|b| !b.in_flight()));
        let again = checked(&d.next, d.next.claim(lease(7), d.next.deadline().unwrap(), &wf, &policy()));
        assert_eq!(dispatched(&again), [1, 2]);
        let run = again.next.stage().unwrap();
        assert_eq!(run.branches.iter().map(|b| b.dispatches).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn a_spent_branch_gives_up_with_every_dispatched_branch_in_doubt() {
        let wf = parallel();
        let mut t = at_stage(&wf);
        let d = loop {
            let d = lapse(&t, &wf, 0);
            if d.trigger != Trigger::Retry {
                break d;
            }
            t = claim(&d.next, &wf, 30 + u128::from(d.next.failure_count), d.next.deadline().unwrap());
        };
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Undo, ProcessState::Compensating, 2));
        assert!(
            d.next.last_error.as_deref().unwrap().contains("branch reserve-a"),
            "{:?}",
            d.next.last_error
        );
        let undo = claim(&d.next, &wf, 50, d.next.deadline().unwrap());
        let d = reply(&undo, &wf, ok(), undo.complete_by().unwrap());
        assert_eq!((d.trigger, d.next.step), (Trigger::UndoAdvanced, 1), "then reserve-a, in doubt too");
    }

    #[test]
    fn a_pivot_branch_that_may_have_taken_effect_leaves_the_task_in_error() {
        let mut wf = parallel();
        wf.steps[3] = crate::domain::workflow::Step::pivot("notify", "crm");
        let t = at_stage(&wf);
        let d = answer(&t, &wf, 1, failed("no"));
        assert_eq!((d.trigger, d.next.state()), (Trigger::ForwardOnly, ProcessState::Error));
        let alert = alerts(&d)[0].clone();
        assert!(alert.reason.contains("pivot step notify outcome unknown"), "{}", alert.reason);
        assert_eq!(alert.step_name, "reserve-a", "the alert names the branch that gave up");
        // Refused before it was: nothing of it stands, and the others are undone.
        let t = answer(&t, &wf, 3, failed("no")).next;
        assert_eq!((t.state(), t.step), (ProcessState::Compensating, 2));
    }

    #[test]
    fn a_cancel_mid_stage_undoes_the_dispatched_branches_after_their_complete_by() {
        let wf = parallel();
        let t = at_stage(&wf);
        let t = answer(&t, &wf, 1, ok()).next;
        let d = act(&t, &wf, Act::Cancel);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::Cancel, ProcessState::Compensating, 2)
        );
        assert_eq!(d.next.hold_until(), t.complete_by());
        // Before its claim, a stage did nothing: its cancel undoes nothing of it.
        let before = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, ok(), T0).next;
        let d = act(&before, &wf, Act::Cancel);
        assert_eq!((d.trigger, d.next.state()), (Trigger::CancelUndone, ProcessState::Compensated));
    }

    #[test]
    fn a_resubmit_at_the_stage_keeps_the_branches_that_succeeded() {
        let mut wf = parallel();
        wf.steps[3] = crate::domain::workflow::Step::pivot("notify", "crm");
        let t = at_stage(&wf);
        let t = answer(&t, &wf, 2, output(r#"{"b":2}"#)).next;
        let error = answer(&t, &wf, 1, failed("no")).next;
        assert_eq!(error.state(), ProcessState::Error);
        let d = act(&error, &wf, Act::Resubmit { from_step: None });
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Pending, 1));
        assert!(d.next.outputs.contains_key("reserve-b"));
        let again = checked(&d.next, d.next.claim(lease(8), T0.plus_ms(50_001), &wf, &policy()));
        assert_eq!(dispatched(&again), [1, 3]);
        let refused = error.act(Act::Resubmit { from_step: Some(2) }, OPS, T0, &wf, &policy());
        assert!(matches!(refused, Err(Refusal::NotAllowed { .. })), "{refused:?}");
    }

    /// A refusal is final (docs/REFERENCE.md, "What sas relies on from the remote service": a
    /// key's first outcome stands; a refusal means the step did not and will not take
    /// effect). A resubmit gives a refused branch another
    /// dispatch, but until then it stands for nothing, as a refused lone step resubmitted
    /// is not in doubt: a cancel must neither undo it nor, were it a pivot, refuse to undo.
    #[test]
    fn a_resubmit_at_the_stage_keeps_a_refused_branch_out_of_doubt() {
        let mut wf = parallel();
        wf.on_give_up = crate::domain::workflow::OnGiveUp::Fail;
        let t = at_stage(&wf);
        let t = answer(&t, &wf, 2, ok()).next;
        let error = answer(&t, &wf, 1, failed("no stock")).next;
        assert_eq!(error.state(), ProcessState::Error);
        let resubmitted = act(&error, &wf, Act::Resubmit { from_step: None }).next;
        let d = act(&resubmitted, &wf, Act::Cancel);
        assert_eq!((d.trigger, d.next.step), (Trigger::Cancel, 2), "release-b first");
        let undo = claim(&d.next, &wf, 9, T0.plus_ms(60_000));
        let d = reply(&undo, &wf, ok(), undo.complete_by().unwrap());
        assert_eq!(
            (d.trigger, d.next.state()),
            (Trigger::Undone, ProcessState::Compensated),
            "reserve-a was refused: nothing of it to undo"
        );

        // A refused pivot branch stands for nothing either: the cancel undoes the rest.
        wf.steps[1] = crate::domain::workflow::Step::pivot("reserve-a", "wh-a");
        let t = answer(&at_stage(&wf), &wf, 2, ok()).next;
        let error = answer(&t, &wf, 1, failed("no stock")).next;
        let resubmitted = act(&error, &wf, Act::Resubmit { from_step: None }).next;
        let d = act(&resubmitted, &wf, Act::Cancel);
        assert_eq!((d.trigger, d.next.step), (Trigger::Cancel, 2));
    }

    #[test]
    fn a_stage_round_trips_through_its_definition_text() {
        let wf = parallel();
        assert_eq!(
            wf.stages,
            [crate::domain::workflow::Stage { name: "reserve-all".into(), start: 1, len: 3 }]
        );
        let text = serde_json::to_string(&wf).unwrap();
        assert!(text.contains(r#"{"parallel":{"name":"reserve-all","steps":[{"name":"reserve-a""#), "{text}");
        assert_eq!(serde_json::from_str::<Workflow>(&text).unwrap(), wf);
        assert_eq!((wf.after(1), wf.after(3), wf.after(0), wf.together(2)), (4, 4, 1, 1..4));
    }

    /// A stage that stops in Error (nothing to undo with, or a pivot) with a branch still
    /// out keeps the hold: an operator's undo, or a resubmit and then a cancel, must not
    /// overtake the call that branch's agent may still be making.
    #[test]
    fn a_stage_stopped_in_error_holds_an_operators_undo_until_its_branches_are_over() {
        let mut wf = parallel();
        wf.on_give_up = crate::domain::workflow::OnGiveUp::Fail;
        let t = at_stage(&wf);
        let error = answer(&t, &wf, 1, failed("no stock")).next;
        assert_eq!(error.state(), ProcessState::Error);
        assert_eq!(error.hold_until(), t.complete_by(), "reserve-b and notify are still out");
        let now = T0.plus_ms(20);
        let ready = t.complete_by().unwrap().plus_ms(policy().reply_grace_ms);
        let op = |task: &TaskRecord, act: Act| checked(task, task.act(act, OPS, now, &wf, &policy()));

        let undo = op(&error, Act::Compensate);
        assert_eq!(
            (undo.next.state(), undo.next.step, undo.next.hold_until()),
            (ProcessState::Compensating, 2, t.complete_by())
        );
        assert!(
            undo.effects.contains(&Effect::Schedule { delay_ms: ready.millis_since(now) }),
            "{:?}",
            undo.effects
        );
        assert!(matches!(undo.next.claim(lease(5), now, &wf, &policy()), Err(Refusal::Held { .. })));
        claim(&undo.next, &wf, 5, ready);

        let again = op(&error, Act::Resubmit { from_step: None });
        assert_eq!((again.next.state(), again.next.hold_until()), (ProcessState::Pending, t.complete_by()));
        assert!(again.effects.contains(&Effect::Schedule { delay_ms: ready.millis_since(now) }));
        let cancel = op(&again.next, Act::Cancel);
        assert_eq!(
            (cancel.next.state(), cancel.next.hold_until()),
            (ProcessState::Compensating, t.complete_by())
        );
    }
}
