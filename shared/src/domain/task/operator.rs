//! What an operator (or an app's cancel message) may do to a task, as decisions of the
//! same kind as the pipeline's: a pure function of the record as read, written only if
//! the row still has that revision. Two operators acting at once, or an operator and a
//! late reply, therefore land at most one change between them; the loser re-reads and
//! is refused by the state it finds.
//!
//! - resubmit: an Error task goes forward again from its failed step (or an earlier one),
//!   keeping what is done, with a fresh failure budget for the step. Its `last_error` is
//!   cleared: the error no longer holds.
//! - compensate: undo the completed steps of an Error task, newest first, or resume an
//!   undo whose compensation failed. Its `last_error` stays: the failure that stopped the
//!   task is still why it is undone.
//! - cancel: stop a live task and undo what it may have done; the attempt in flight loses
//!   its lease, so its reply is stale. Its `last_error` becomes who cancelled and why.
//!
//! - pause: hold a live task: nothing new is dispatched (no claim, forward or undo); an
//!   attempt in flight finishes and its reply applies, and a timer's wake or a callback's
//!   completion still lands. A task that comes to wait for a claim is parked, off the
//!   supervisor's sweep, so no failure is counted while paused.
//! - resume: lift the pause; a parked task is scheduled at once.
//!
//! An app acts only on the orders its sender submitted: before any other rule, an app's
//! action from a sender other than the record's submitter is refused
//! (`TaskRecord::check_sender`). An operator (`sasctl tasks`) may act on every task.
//!
//! None of them undoes past a pivot (a step with no compensation that took effect or
//! may have): such a task only goes forward, as the pipeline's own give-ups decide.

use std::sync::Arc;

use super::branches::Outcome;
use super::draft::Draft;
use super::outcome::{Act, Cause, Effect, Policy, Refusal};
use super::record::Decision;
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::messages::OrderStatus;
use crate::domain::workflow::{Action, Workflow};

// Who acts: with the decisions' shared vocabulary (`outcome.rs`), so every decision can
// name its actor; kept here under its old path too.
pub use super::outcome::{Actor, Origin};

impl Draft {
    /// The operator's `act` on this task as read, or why it does not apply.
    pub(in crate::domain) fn act(
        &self,
        act: Act,
        actor: Actor<'_>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        if let Some(seen) = actor.seen
            && seen != self.revision
        {
            return Err(self.refused(
                act,
                format!(
                    "it changed since it was looked at (revision {seen}, now {}): look again",
                    self.revision
                ),
            ));
        }
        let decided = match act {
            Act::Resubmit { from_step } => self.resubmit(from_step, now, wf, policy),
            Act::Compensate => self.operator_undo(now, wf, policy),
            Act::Cancel => self.cancel(now, wf, policy, actor),
            Act::Pause => self.pause(now, wf),
            Act::Resume => self.resume(now, wf, policy),
        };
        self.logged(now, decided, Some((actor.by, actor.why)))
    }

    fn refused(&self, act: Act, why: impl Into<String>) -> Refusal {
        Refusal::NotAllowed { act: act.as_str(), state: self.state.as_str(), why: why.into() }
    }

    /// The task stopped while undoing: a compensation failed or ran out of attempts.
    fn stopped_undoing(&self) -> bool {
        matches!(
            self.last_cause,
            Cause::Failed { action: Action::Undo, .. }
                | Cause::DeadlinePassed { state: ProcessState::Compensating, .. }
        )
    }

    /// The current step may have taken effect: it was dispatched and no definitive
    /// refusal of it is on record.
    fn current_in_doubt(&self) -> bool {
        let refused = matches!(
            &self.last_cause,
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. } if *step == self.step
        );
        self.step_attempts > 0 && !refused
    }

    /// Why undoing is impossible: a pivot before the current step took effect, or the
    /// current step is a pivot that may have.
    fn pivot_stands(&self, wf: &Workflow, in_doubt: bool) -> Option<String> {
        if let Some(why) = self.redoing() {
            return Some(why);
        }
        if let Some(pivot) = wf.pivot_before(self.step).and_then(|p| wf.step(p)) {
            return Some(format!(
                "pivot step {} took effect and has no compensation, so the task only goes forward",
                pivot.name
            ));
        }
        if let Some(map) = wf.map_at(self.step).filter(|_| self.action() == Action::Do)
            && wf.step(self.step).is_some_and(|s| s.is_pivot())
        {
            let run = self.map_run_for_undo(wf, self.step);
            return run.next_to_undo().map(|i| {
                format!(
                    "item {i} of pivot map {} may have taken effect and has no compensation, so the task only goes forward",
                    map.name
                )
            });
        }
        if let Some(run) = self.stage_run(wf) {
            return run.each().find_map(|(i, b)| {
                let pivot = wf.step(i).filter(|s| s.is_pivot() && b.may_have_taken_effect())?;
                Some(format!(
                    "pivot step {} of stage {} may have taken effect and has no compensation, so the task only goes forward",
                    pivot.name,
                    wf.stage_of(i).map_or("", |s| s.name.as_str())
                ))
            });
        }
        match wf.step(self.step) {
            Some(current) if in_doubt && current.is_pivot() => Some(format!(
                "pivot step {} may have taken effect and has no compensation, so the task only goes forward",
                current.name
            )),
            _ => None,
        }
    }

    fn pause(&self, now: Timestamp, wf: &Workflow) -> Result<Decision<Draft>, Refusal> {
        let act = Act::Pause;
        if self.state.is_terminal() {
            return Err(self.refused(act, "it has ended"));
        }
        if self.paused {
            return Err(self.refused(act, "it is paused already"));
        }
        self.check_workflow(wf)?;
        let mut next = self.moved(Trigger::Pause, now, self.operator_cause(act))?;
        next.paused = true;
        // `logged` parks it if it waits for a claim; anything running or waiting goes on.
        Ok(Decision { trigger: Trigger::Pause, next, effects: Vec::new() })
    }

    fn resume(&self, now: Timestamp, wf: &Workflow, policy: &Policy) -> Result<Decision<Draft>, Refusal> {
        let act = Act::Resume;
        if !self.paused {
            return Err(self.refused(act, "it is not paused"));
        }
        self.check_workflow(wf)?;
        let mut next = self.moved(Trigger::Resume, now, self.operator_cause(act))?;
        next.paused = false;
        let mut effects = Vec::new();
        // A map held mid-run dispatches its next items now, up to its cap: its items in
        // flight may all have answered while it was paused.
        if self.state == ProcessState::Processing
            && let Some(map) = wf.map_at(self.step).filter(|_| next.stage.as_ref().is_some_and(|r| r.map))
        {
            effects = next.dispatch_items(map, now, wf, policy);
        }
        if self.parked() {
            // It waited for a claim: claim it now, due as any task that waits for one; or,
            // cancelled while paused with an attempt in flight, once that attempt is over
            // (as the cancel itself would have: its delayed Schedule was never sent).
            let delay_ms = self.held_for_ms(now, policy);
            next = next.waiting(now, delay_ms, policy);
            effects.push(Effect::Schedule { delay_ms });
        }
        Ok(Decision { trigger: Trigger::Resume, next, effects })
    }

    fn operator_cause(&self, act: Act) -> Cause {
        Cause::Operator { step: self.step, act }
    }

    fn resubmit(
        &self,
        from_step: Option<u32>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let act = Act::Resubmit { from_step };
        if self.state != ProcessState::Error {
            return Err(self.refused(act, "only a task in Error can be resubmitted"));
        }
        self.check_workflow(wf)?;
        if self.stopped_undoing() && !crate::mutations::resubmit_after_undo() {
            let name = self.step_name(wf, self.step, Action::Undo);
            return Err(self.refused(
                act,
                format!(
                    "it stopped while undoing (compensation {name} failed); `compensate` retries the undo"
                ),
            ));
        }
        let from = from_step.unwrap_or(self.step);
        if let Some(stage) = wf.stage_of(from).filter(|s| s.start != from) {
            return Err(self.refused(
                act,
                format!(
                    "step {from} is a branch of parallel stage {}: resubmit from its first step, {}",
                    stage.name, stage.start
                ),
            ));
        }
        if from > self.step {
            return Err(self.refused(
                act,
                format!("step {from} comes after the failed step {}; a task never skips a step", self.step),
            ));
        }
        // Whether the step it starts at may have taken effect already must survive the
        // fresh budget: a later give-up or cancel decides on it (a pivot in doubt is
        // never undone). An earlier step succeeded; the failed one may be in doubt.
        let may_have_taken_effect = from < self.step || self.current_in_doubt();
        // Branches of the stage that stopped may still be out: their re-dispatch waits.
        let delay_ms = self.held_for_ms(now, policy);
        let mut next = self
            .moved(Trigger::Resubmit, now, self.operator_cause(act))?
            .waiting(now, delay_ms, policy)
            .starting_step(from);
        if may_have_taken_effect {
            next.step_attempts = self.step_attempts.max(1);
        }
        if from < self.step {
            next.redo_until = Some(self.redo_until.unwrap_or(0).max(self.step));
        }
        next.last_error = None;
        // At the stage it failed in, the branches that succeeded stand and keep their
        // outputs; the others run again with a fresh budget (each still in doubt if it
        // was dispatched, except one refused: a refusal is final, so it had no effect, as
        // a refused lone step resubmitted is not in doubt). From an earlier step, the whole
        // stage runs again.
        // A map's items are its branches: those that succeeded stand, a refused one runs
        // again out of doubt, and its tolerated refusals are forgotten.
        let mut kept = Vec::new();
        match next.stage.as_mut().filter(|run| run.at == from) {
            Some(run) => {
                for (i, b) in run.steps().zip(run.branches.iter_mut()) {
                    match b.outcome {
                        Outcome::Succeeded if !run.map => kept.push(i),
                        Outcome::Succeeded | Outcome::Open => {}
                        Outcome::Refused | Outcome::Undone => {
                            b.dispatches = 0;
                        }
                    }
                    if b.outcome != Outcome::Succeeded {
                        b.outcome = Outcome::Open;
                        b.failures = 0;
                    }
                }
            }
            None => next.stage = None,
        }
        if wf.maps.iter().any(|m| m.at >= from) {
            next.refused_items.clear();
        }
        // The steps that run again answer again: later steps must be handed only the
        // outputs of the steps before them.
        for s in (from..wf.len()).filter(|s| !kept.contains(s)) {
            if let Some(step) = wf.step(s) {
                Arc::make_mut(&mut next.outputs).remove(&step.name);
            }
            if let Some(map) = wf.map_at(s) {
                Arc::make_mut(&mut next.outputs).remove(&map.name);
            }
        }
        let step = Some(self.step_name(wf, from, Action::Do));
        Ok(Decision {
            trigger: Trigger::Resubmit,
            next,
            effects: vec![
                Effect::Schedule { delay_ms },
                Effect::Status { status: OrderStatus::Resubmitted, step, reason: None },
            ],
        })
    }

    fn operator_undo(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let act = Act::Compensate;
        if self.state != ProcessState::Error {
            return Err(self.refused(act, "only a task in Error can be compensated"));
        }
        self.check_workflow(wf)?;
        let first = if self.stopped_undoing() {
            // Resume where the undo stopped: that compensation gets a fresh budget.
            self.step
        } else {
            let in_doubt = self.current_in_doubt();
            if let Some(why) = self.pivot_stands(wf, in_doubt) {
                return Err(self.refused(act, format!("{why}; resubmit it instead")));
            }
            self.first_to_undo(wf, in_doubt).ok_or_else(|| {
                self.refused(act, "nothing to undo: no step that may have taken effect has a compensation")
            })?
        };
        // Branches of a stage that stopped may still be out: the undo waits for them.
        let delay_ms = self.held_for_ms(now, policy);
        let next = self
            .moved(Trigger::OperatorUndo, now, self.operator_cause(act))?
            .waiting(now, delay_ms, policy)
            .starting_step(first);
        let step = Some(self.step_name(wf, first, Action::Undo));
        Ok(Decision {
            trigger: Trigger::OperatorUndo,
            next,
            effects: vec![
                Effect::Schedule { delay_ms },
                Effect::Status { status: OrderStatus::Compensating, step, reason: None },
            ],
        })
    }

    fn cancel(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        actor: Actor<'_>,
    ) -> Result<Decision<Draft>, Refusal> {
        let act = Act::Cancel;
        match self.state {
            ProcessState::Pending | ProcessState::Processing | ProcessState::Waiting => {}
            ProcessState::Compensating => {
                return Err(self.refused(act, "it is undoing its steps already"));
            }
            ProcessState::Error => {
                return Err(self.refused(act, "it has ended; `compensate` undoes an Error task"));
            }
            ProcessState::Processed | ProcessState::Compensated => {
                return Err(self.refused(act, "it has ended"));
            }
        }
        self.check_workflow(wf)?;
        let in_doubt = self.current_in_doubt();
        if let Some(why) = self.pivot_stands(wf, in_doubt) {
            return Err(self.refused(act, why));
        }
        let cause = self.operator_cause(act);
        let cancelled = Effect::Status { status: OrderStatus::Cancelled, step: None, reason: None };
        // The cancel is now why the task is undone: an earlier retry's error would read as
        // the cause of a Compensated that no failure brought about.
        let cancelled_by = Some(format!("cancelled by {}: {}", actor.by, actor.why));
        match self.first_to_undo(wf, in_doubt) {
            Some(first) => {
                // An attempt in flight may still reach its service until its complete-by:
                // the undo waits for it, as a retry of a lapsed attempt does. The hold is
                // recorded even when this clock says that time has passed: the scheduler
                // that claims the undo judges it by its own clock and grace.
                let hold = match self.state {
                    ProcessState::Processing => self.complete_by.max(self.hold_until),
                    _ => self.hold_until,
                };
                let delay_ms = hold.map_or(0, |h| h.plus_ms(policy.reply_grace_ms).millis_since(now));
                let mut next = self
                    .moved(Trigger::Cancel, now, cause)?
                    .waiting(now, delay_ms, policy)
                    .starting_step(first);
                next.hold_until = hold;
                next.last_error = cancelled_by;
                Ok(Decision {
                    trigger: Trigger::Cancel,
                    next,
                    effects: vec![Effect::Schedule { delay_ms }, cancelled],
                })
            }
            None => {
                let mut next = self.moved(Trigger::CancelUndone, now, cause)?.unlocked();
                next.last_error = cancelled_by;
                let name = self.step_name(wf, self.step, Action::Do);
                Ok(Decision {
                    trigger: Trigger::CancelUndone,
                    next,
                    effects: vec![
                        cancelled,
                        Effect::Status { status: OrderStatus::Compensated, step: Some(name), reason: None },
                    ],
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::Sender;
    use crate::domain::task::Phase;
    use crate::domain::task::fixtures::*;
    use crate::domain::timeline::Happened;

    #[test]
    fn resubmit_runs_an_error_task_again_from_its_failed_step_with_a_fresh_budget() {
        let wf = Workflow::single_step();
        let mut task = claim(&new_task(&wf), &wf, 1, T0);
        task.step_failures = 2;
        let error = reply(&task, &wf, failed("card declined"), T0).next;
        let d = act(&error, &wf, Act::Resubmit { from_step: None });
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Resubmit, ProcessState::Pending, 0));
        assert_eq!((d.next.step_attempts, d.next.step_failures), (0, 0));
        assert_eq!(d.next.failure_count, error.failure_count, "the count only grows");
        assert_eq!(d.next.last_error, None);
        assert_eq!(d.next.last_cause, Cause::Operator { step: 0, act: Act::Resubmit { from_step: None } });
        assert!(d.next.deadline().is_some());
        assert_eq!(
            d.effects,
            vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status {
                    status: OrderStatus::Resubmitted,
                    step: Some("process-order".into()),
                    reason: None
                },
            ]
        );
        let entry = d.next.timeline.last().unwrap();
        assert_eq!(entry.what, Happened::Moved(Trigger::Resubmit));
        assert_eq!((entry.note.as_deref(), entry.by.as_deref()), (Some(OPS.why), Some(OPS.by)));
        // It runs as any task does, to the end.
        let again = claim(&d.next, &wf, 2, T0.plus_ms(50_000));
        let done = reply(&again, &wf, ok(), T0.plus_ms(50_000)).next;
        assert_eq!(done.state(), ProcessState::Processed);
    }

    /// Found by the simulation: a resubmitted pivot whose first attempt may have taken
    /// effect must stay in doubt, or a cancel (or a later give-up) would undo around it.
    #[test]
    fn a_resubmitted_step_that_may_have_taken_effect_stays_in_doubt() {
        let single = Workflow::single_step();
        let error = lapse_to_threshold(claim(&new_task(&single), &single, 1, T0), &single, true).next;
        let again = act(&error, &single, Act::Resubmit { from_step: None }).next;
        assert!(again.step_attempts > 0);
        assert!(refused(&again, &single, Act::Cancel).contains("may have taken effect"));
        let wf = three_step_failing();
        let from_charge = act(&error_at_ship(&wf), &wf, Act::Resubmit { from_step: Some(1) }).next;
        assert!(from_charge.step_attempts > 0, "charge succeeded before: its effect stands");
    }

    /// Also found by the simulation: resubmitted from an earlier step, the task re-runs
    /// steps whose effects (a pivot's among them) stand from the first way through, so
    /// until it is past the step it failed at, it only goes forward.
    #[test]
    fn a_task_resubmitted_from_an_earlier_step_only_goes_forward_until_past_where_it_failed() {
        let wf = three_step_failing();
        let again = act(&error_at_ship(&wf), &wf, Act::Resubmit { from_step: Some(0) }).next;
        assert_eq!((again.step, again.redo_until), (0, Some(2)));
        assert!(refused(&again, &wf, Act::Cancel).contains("resubmitted from an earlier step"));
        let d = lapse_to_threshold(again.clone(), &wf, true);
        assert_eq!((d.trigger, d.next.state()), (Trigger::ForwardOnly, ProcessState::Error));
        assert!(refused(&d.next, &wf, Act::Compensate).contains("resubmitted from an earlier step"));
        // Through every step again: past the one it failed at, the mark is gone.
        let mut t = again;
        for (n, step) in (0..3u32).enumerate() {
            assert_eq!(t.step, step);
            t = claim(&t, &wf, 40 + n as u128, T0);
            t = reply(&t, &wf, ok(), T0).next;
        }
        assert_eq!((t.state(), t.redo_until), (ProcessState::Processed, None));
    }

    /// Found by the simulation (1M seeds): the same resubmit sent twice, the second late,
    /// landed again after the task had failed once more. Decided on the revision seen, it
    /// lands once.
    #[test]
    fn an_action_decided_on_a_revision_is_refused_once_the_task_moved() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        let seen = Actor { seen: Some(error.revision), ..OPS };
        let d = checked(&error, error.act(Act::Resubmit { from_step: None }, seen, T0, &wf, &policy()));
        let again = d.next.clone().with_phase(Phase::ended(ProcessState::Error).unwrap());
        let why = match again.act(Act::Resubmit { from_step: None }, seen, T0, &wf, &policy()) {
            Err(r) => r.to_string(),
            Ok(d) => panic!("landed twice: {:?}", d.trigger),
        };
        assert!(why.contains("changed since it was looked at"), "{why}");
    }

    #[test]
    fn resubmit_from_an_earlier_step_keeps_only_the_outputs_before_it() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        assert_eq!(error.outputs.len(), 2);
        let from_ship = act(&error, &wf, Act::Resubmit { from_step: None }).next;
        assert_eq!((from_ship.step, from_ship.outputs.len()), (2, 2));
        let from_charge = act(&error, &wf, Act::Resubmit { from_step: Some(1) }).next;
        assert_eq!(from_charge.step, 1);
        assert_eq!(from_charge.outputs.keys().collect::<Vec<_>>(), vec!["reserve-inventory"]);
    }

    #[test]
    fn resubmit_is_refused_unless_the_task_is_in_error_going_forward() {
        let wf = Workflow::three_step();
        for task in [new_task(&wf), claim(&new_task(&wf), &wf, 1, T0)] {
            assert!(refused(&task, &wf, Act::Resubmit { from_step: None }).contains("only a task in Error"));
        }
        let failing = three_step_failing();
        let why = refused(&error_at_ship(&failing), &failing, Act::Resubmit { from_step: Some(3) });
        assert!(why.contains("never skips a step"), "{why}");
        let why = refused(&error_while_undoing(), &wf, Act::Resubmit { from_step: None });
        assert!(why.contains("stopped while undoing"), "{why}");
    }

    #[test]
    fn compensate_undoes_the_completed_steps_of_an_error_task_newest_first() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        let d = act(&error, &wf, Act::Compensate);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::OperatorUndo, ProcessState::Compensating, 1),
            "ship was refused, so undoing starts at charge"
        );
        assert_eq!(d.next.locked_by(), None);
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        // Then the pipeline undoes charge, then reserve, and ends Compensated.
        let t = claim(&d.next, &wf, 7, T0);
        let t = reply(&t, &wf, ok(), T0).next;
        assert_eq!((t.state(), t.step), (ProcessState::Compensating, 0));
        let t = claim(&t, &wf, 8, T0);
        assert_eq!(reply(&t, &wf, ok(), T0).next.state(), ProcessState::Compensated);
        // Twice, from two terminals: the second decides on what the first wrote.
        assert!(refused(&d.next, &wf, Act::Compensate).contains("only a task in Error"));
    }

    #[test]
    fn compensate_resumes_an_undo_whose_compensation_failed() {
        let wf = Workflow::three_step();
        let error = error_while_undoing();
        let d = act(&error, &wf, Act::Compensate);
        assert_eq!((d.next.state(), d.next.step, d.next.step_failures), (ProcessState::Compensating, 1, 0));
        let d = checked(&d.next, d.next.claim(lease(9), T0, &wf, &policy()));
        assert_eq!(
            d.effects,
            vec![Effect::Dispatch { step: 1, action: Action::Undo, callback: None, item: None }]
        );
    }

    #[test]
    fn compensate_is_refused_past_a_pivot_and_with_nothing_to_undo() {
        let mixed = mixed();
        // b (a pivot) succeeded, c refused: only forward is left.
        let error = reply(&claim(&pending_at(&mixed, 3), &mixed, 1, T0), &mixed, failed("no"), T0).next;
        assert_eq!(error.state(), ProcessState::Error);
        let why = refused(&error, &mixed, Act::Compensate);
        assert!(why.contains("pivot step b took effect"), "{why}");
        // Single-step: its one step was refused and has no compensation.
        let single = Workflow::single_step();
        let error = reply(&claim(&new_task(&single), &single, 1, T0), &single, failed("no"), T0).next;
        assert!(refused(&error, &single, Act::Compensate).contains("nothing to undo"));
        // Or the pivot may have taken effect: it answered nothing, attempt after attempt.
        let error = lapse_to_threshold(claim(&new_task(&single), &single, 1, T0), &single, true).next;
        assert_eq!(error.state(), ProcessState::Error);
        assert!(refused(&error, &single, Act::Compensate).contains("may have taken effect"));
    }

    /// An operator reading `sasctl tasks show` after a cancel must see the cancel as the
    /// reason the task is undone, not the retry it was waiting on.
    #[test]
    fn a_cancel_says_who_cancelled_and_why_in_place_of_an_earlier_error() {
        let wf = Workflow::three_step();
        let retrying = lapse(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, 0).next;
        assert!(retrying.last_error.as_deref().unwrap().contains("passed its deadline"));
        let undoing = act(&retrying, &wf, Act::Cancel);
        assert_eq!(undoing.trigger, Trigger::Cancel);
        let never_claimed = lapse(&new_task(&wf), &wf, 0).next;
        assert!(never_claimed.last_error.as_deref().unwrap().contains("without being claimed"));
        let undone = act(&never_claimed, &wf, Act::Cancel);
        assert_eq!(undone.trigger, Trigger::CancelUndone);
        let app = Actor {
            by: "app:shop",
            why: "the customer changed their mind",
            seen: None,
            origin: Origin::App { sender: None },
        };
        let by_app = checked(&retrying, retrying.act(Act::Cancel, app, T0.plus_ms(50_000), &wf, &policy()));
        for (d, want) in [
            (&undoing, "cancelled by arn:aws:iam::123456789012:user/ops: remote fixed"),
            (&undone, "cancelled by arn:aws:iam::123456789012:user/ops: remote fixed"),
            (&by_app, "cancelled by app:shop: the customer changed their mind"),
        ] {
            assert_eq!(d.next.last_error.as_deref(), Some(want), "{:?}", d.trigger);
        }
    }

    #[test]
    fn cancel_of_a_task_that_did_nothing_yet_is_compensated_at_once() {
        let wf = Workflow::three_step();
        let d = act(&new_task(&wf), &wf, Act::Cancel);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.deadline()),
            (Trigger::CancelUndone, ProcessState::Compensated, None)
        );
        assert_eq!(statuses(&d), vec![OrderStatus::Cancelled, OrderStatus::Compensated]);
        assert!(alerts(&d).is_empty());
    }

    #[test]
    fn cancel_fences_off_the_attempt_in_flight_and_undoes_it_too() {
        let wf = Workflow::three_step();
        let charging = claim(&pending_at(&wf, 1), &wf, 5, T0);
        let d = act(&charging, &wf, Act::Cancel);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::Cancel, ProcessState::Compensating, 1)
        );
        assert_eq!((d.next.locked_by(), d.next.complete_by()), (None, None), "the lease is gone");
        assert_eq!(statuses(&d), vec![OrderStatus::Cancelled]);
        // The charge's own reply, however good, no longer lands.
        let late = reply_for(&charging, ok());
        assert!(matches!(d.next.apply_reply(&late, T0, &wf, &policy()), Err(Refusal::StaleReply(_))));
        // Its agent may call the service until complete-by: the undo waits for that.
        let hold = charging.complete_by().unwrap().plus_ms(policy().reply_grace_ms);
        // Held even when the canceller's clock says that time is up already (an operator's
        // laptop may run ahead): the claiming scheduler judges it on its own clock.
        assert_eq!(d.next.hold_until(), charging.complete_by());
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        let cancelled_at = T0.plus_ms(100);
        let early = checked(&charging, charging.act(Act::Cancel, OPS, cancelled_at, &wf, &policy()));
        assert_eq!(early.effects[0], Effect::Schedule { delay_ms: hold.millis_since(cancelled_at) });
        assert!(early.next.deadline().unwrap() > hold);
        assert_eq!(
            early.next.claim(lease(6), Timestamp(hold.0 - 1), &wf, &policy()),
            Err(Refusal::Held { until: hold })
        );
        let undoing = claim(&early.next, &wf, 6, hold);
        assert_eq!(undoing.hold_until(), None);
        assert!(matches!(undoing.apply_reply(&late, T0, &wf, &policy()), Err(Refusal::StaleReply(_))));
        // A task waiting for its next step undoes the ones before it.
        let d = act(&pending_at(&wf, 2), &wf, Act::Cancel);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn cancel_is_refused_where_it_cannot_undo_or_the_task_is_not_live() {
        let single = Workflow::single_step();
        let in_flight = claim(&new_task(&single), &single, 1, T0);
        assert!(refused(&in_flight, &single, Act::Cancel).contains("pivot step process-order may have"));
        let mixed = mixed();
        assert!(refused(&pending_at(&mixed, 3), &mixed, Act::Cancel).contains("pivot step b took effect"));
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        assert!(refused(&compensating, &wf, Act::Cancel).contains("undoing its steps already"));
        assert!(refused(&error_while_undoing(), &wf, Act::Cancel).contains("`compensate`"));
        let processed = reply(&claim(&new_task(&single), &single, 1, T0), &single, ok(), T0).next;
        assert!(refused(&processed, &single, Act::Cancel).contains("ended"));
        for act in [Act::Compensate, Act::Resubmit { from_step: None }] {
            refused(&processed, &single, act);
        }
    }

    fn sender(sender_id: &str) -> Sender {
        Sender::from_sender_id(sender_id).unwrap()
    }

    fn app(sender: Option<&Sender>) -> Actor<'_> {
        Actor { by: "app", why: "changed my mind", seen: None, origin: Origin::App { sender } }
    }

    /// Issue 24, finding 2: anyone who may write to the orders queue could cancel any
    /// order. Each row of the sender rule: an app's cancel applies only when it comes
    /// from the order's submitter, whatever session it runs under.
    #[test]
    fn an_apps_cancel_applies_only_from_the_orders_submitter() {
        let wf = Workflow::three_step();
        let shop = sender("AROASHOP:container-1");
        let task = pending_at(&wf, 1).submitted_by(Some(shop.clone()));
        // The submitter, from another container (another session name): applied.
        let same = sender("AROASHOP:container-2");
        let d = checked(&task, task.act(Act::Cancel, app(Some(&same)), T0, &wf, &policy()));
        assert_eq!((d.trigger, d.next.state()), (Trigger::Cancel, ProcessState::Compensating));
        assert_eq!(d.next.submitter, Some(shop.clone()), "a decision keeps the submitter");
        // Another sender: refused, naming the cancel's own sender and never the submitter.
        let intruder = sender("AROAINTRUDER:x");
        let why = match task.act(Act::Cancel, app(Some(&intruder)), T0, &wf, &policy()) {
            Err(r @ Refusal::OtherSender { .. }) => r.to_string(),
            other => panic!("a cancel from another sender was not refused: {other:?}"),
        };
        assert_eq!(why, "order o-1 was submitted by another sender (this message came from AROAINTRUDER)");
        assert!(!why.contains("AROASHOP"), "{why}");
        // No sender at all, on an order that has one: refused.
        let why = match task.act(Act::Cancel, app(None), T0, &wf, &policy()) {
            Err(r @ Refusal::OtherSender { .. }) => r.to_string(),
            other => panic!("a cancel without a sender was not refused: {other:?}"),
        };
        assert_eq!(why, "order o-1 was submitted by another sender (this message carries no sender)");
        // Before any other rule: another sender learns nothing of the order's state.
        let single = Workflow::single_step();
        let running = claim(&new_task(&single).submitted_by(Some(shop.clone())), &single, 1, T0);
        let processed = reply(&running, &single, ok(), T0).next;
        assert!(matches!(
            processed.act(Act::Cancel, app(Some(&intruder)), T0, &single, &policy()),
            Err(Refusal::OtherSender { .. })
        ));
        // An operator (`sasctl tasks`) is no app: it cancels whoever submitted the order.
        let d = checked(&task, task.act(Act::Cancel, OPS, T0, &wf, &policy()));
        assert_eq!(d.trigger, Trigger::Cancel);
    }

    /// A record from before submitters were kept (or from a run without sender ids)
    /// keeps the old rule: any app's cancel applies to it.
    #[test]
    fn an_order_with_no_known_submitter_is_cancelled_by_any_app() {
        let wf = Workflow::three_step();
        let old = pending_at(&wf, 1);
        assert_eq!(old.submitter, None);
        let anyone = sender("AIDAANYONE");
        for actor in [app(Some(&anyone)), app(None)] {
            let d = checked(&old, old.act(Act::Cancel, actor, T0, &wf, &policy()));
            assert_eq!(d.trigger, Trigger::Cancel, "{actor:?}");
        }
    }

    /// When the operator acts in these tests (`fixtures::act`).
    const AT: Timestamp = Timestamp(T0.0 + 50_000);

    #[test]
    fn a_paused_task_waiting_for_a_claim_is_parked_off_the_sweep_and_resumes_at_once() {
        let wf = Workflow::three_step();
        let pending = pending_at(&wf, 1);
        let d = act(&pending, &wf, Act::Pause);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.paused()),
            (Trigger::Pause, ProcessState::Pending, true)
        );
        assert!(d.effects.is_empty(), "nothing is scheduled while paused");
        assert_eq!(d.next.deadline(), Some(AT.plus_ms(crate::domain::task::PARKED_MS)), "off the sweep");
        let paused = d.next;
        assert_eq!(paused.schedule(lease(5), AT, &wf, &policy()), Err(Refusal::Paused));
        assert!(matches!(
            paused.recover(AT.plus_ms(3_600_000), &wf, &policy(), 0),
            Err(Refusal::NotDue { .. })
        ));
        assert!(refused(&paused, &wf, Act::Pause).contains("paused already"));
        let r = act(&paused, &wf, Act::Resume);
        assert_eq!((r.trigger, r.next.paused()), (Trigger::Resume, false));
        assert_eq!(r.effects, vec![Effect::Schedule { delay_ms: 0 }]);
        assert_eq!(r.next.deadline(), Some(AT.plus_ms(policy().pending_timeout_ms)));
        assert!(r.next.claim(lease(6), AT, &wf, &policy()).is_ok(), "goes on from where it stopped");
        assert!(refused(&r.next, &wf, Act::Resume).contains("not paused"));
    }

    #[test]
    fn a_step_running_when_paused_finishes_and_its_reply_applies_but_nothing_new_is_dispatched() {
        let wf = Workflow::three_step();
        let running = claim(&pending_at(&wf, 1), &wf, 3, T0);
        let paused = act(&running, &wf, Act::Pause).next;
        assert_eq!((paused.state(), paused.locked_by().is_some()), (ProcessState::Processing, true));
        let d =
            checked(&paused, paused.apply_reply(&reply_for(&paused, ok()), T0.plus_ms(10), &wf, &policy()));
        assert_eq!((d.next.state(), d.next.step, d.next.paused()), (ProcessState::Pending, 2, true));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::Schedule { .. })), "{:?}", d.effects);
        assert!(d.next.parked());
    }

    #[test]
    fn timers_and_callbacks_are_not_lost_while_paused() {
        let wf = timed();
        let sleeping = sleep(&pending_at(&wf, 1), &wf, T0);
        let paused = act(&sleeping, &wf, Act::Pause).next;
        assert_eq!(paused.deadline(), sleeping.deadline(), "the timer keeps its wake time");
        let woke = checked(&paused, paused.recover(paused.wake_at().unwrap(), &wf, &policy(), 0));
        assert_eq!(
            (woke.trigger, woke.next.state(), woke.next.step),
            (Trigger::Woke, ProcessState::Pending, 2)
        );
        assert!(woke.next.parked(), "woken, then held");
        // A callback's completion lands while paused, and the task is held after it.
        let approval = approval();
        let (waiting, token) = started_callback(&approval, 1);
        let paused = act(&waiting, &approval, Act::Pause).next;
        let done = crate::domain::callback::Completion::Success { output: None };
        let d = checked(
            &paused,
            paused.complete(&token, &claims_of(&token), &done, T0.plus_ms(20), &approval, &policy()),
        );
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Pending, 2));
        assert!(d.next.parked());
    }

    /// Cancelled while paused with an attempt in flight, then resumed before that attempt's
    /// complete-by: the undo is scheduled for when the attempt is over, as the cancel's own
    /// Schedule would have been, so it is neither refused as held nor left to lapse.
    #[test]
    fn a_resume_inside_a_cancels_hold_waits_for_the_attempt() {
        let wf = Workflow::three_step();
        let running = claim(&pending_at(&wf, 1), &wf, 3, AT);
        let paused = checked(&running, running.act(Act::Pause, OPS, AT, &wf, &policy())).next;
        let cancelled = checked(&paused, paused.act(Act::Cancel, OPS, AT, &wf, &policy())).next;
        assert!(cancelled.parked() && cancelled.hold_until().is_some());
        let resumed = checked(&cancelled, cancelled.act(Act::Resume, OPS, AT.plus_ms(10), &wf, &policy()));
        let ready = cancelled.hold_until().unwrap().plus_ms(policy().reply_grace_ms);
        assert_eq!(resumed.effects, vec![Effect::Schedule { delay_ms: ready.millis_since(AT.plus_ms(10)) }]);
        assert!(resumed.next.deadline().unwrap() > ready, "due only after the held Schedule");
        assert!(resumed.next.claim(lease(8), ready, &wf, &policy()).is_ok());
    }

    #[test]
    fn a_cancelled_paused_task_undoes_once_resumed() {
        let wf = Workflow::three_step();
        let paused = act(&pending_at(&wf, 2), &wf, Act::Pause).next;
        let d = act(&paused, &wf, Act::Cancel);
        assert_eq!((d.next.state(), d.next.paused()), (ProcessState::Compensating, true));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::Schedule { .. })));
        assert_eq!(d.next.claim(lease(7), AT, &wf, &policy()), Err(Refusal::Paused));
        let r = act(&d.next, &wf, Act::Resume);
        assert!(r.next.claim(lease(7), AT, &wf, &policy()).is_ok());
        // Ended tasks are neither paused nor resumed.
        let ended = reply(
            &claim(&new_task(&Workflow::single_step()), &Workflow::single_step(), 1, T0),
            &Workflow::single_step(),
            ok(),
            T0,
        )
        .next;
        assert!(refused(&ended, &Workflow::single_step(), Act::Pause).contains("ended"));
    }
}
