//! What an operator (or an app's cancel message) may do to a task, as decisions of the
//! same kind as the pipeline's: a pure function of the record as read, written only if
//! the row still has that revision. Two operators acting at once, or an operator and a
//! late reply, therefore land at most one change between them; the loser re-reads and
//! is refused by the state it finds.
//!
//! - resubmit: an Error task goes forward again from its failed step (or an earlier one),
//!   keeping what is done, with a fresh failure budget for the step.
//! - compensate: undo the completed steps of an Error task, newest first, or resume an
//!   undo whose compensation failed.
//! - cancel: stop a live task and undo what it may have done; the attempt in flight loses
//!   its lease, so its reply is stale.
//!
//! None of them undoes past a pivot (a step with no compensation that took effect or
//! may have): such a task only goes forward, as the pipeline's own give-ups decide.

use super::ids::Timestamp;
use super::lifecycle::{ProcessState, Trigger};
use super::messages::OrderStatus;
use super::task::{Act, Cause, Decision, Effect, Policy, Refusal, TaskRecord};
use super::workflow::{Action, Workflow};

/// Who acts and why: both go into the task's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor<'a> {
    /// The caller's identity (an IAM ARN for `sasctl`; the orders queue for an app).
    pub by: &'a str,
    pub why: &'a str,
    /// The revision the action was decided on, when the caller looked first (a bulk
    /// action acts on what its listing showed): refused if the task moved since. The
    /// same request sent twice then lands once, even if the task comes back to the same
    /// state in between (a resubmit that failed again).
    pub seen: Option<u64>,
}

impl TaskRecord {
    /// The operator's `act` on this task as read, or why it does not apply.
    pub fn act(
        &self,
        act: Act,
        actor: Actor<'_>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
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
            Act::Cancel => self.cancel(now, wf, policy),
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
        match wf.step(self.step) {
            Some(current) if in_doubt && current.is_pivot() => Some(format!(
                "pivot step {} may have taken effect and has no compensation, so the task only goes forward",
                current.name
            )),
            _ => None,
        }
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
    ) -> Result<Decision, Refusal> {
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
        let mut next = self.moved(Trigger::Resubmit, now, self.operator_cause(act))?.waiting(now, 0, policy);
        next.step = from;
        next.step_attempts = if may_have_taken_effect { self.step_attempts.max(1) } else { 0 };
        next.step_failures = 0;
        if from < self.step {
            next.redo_until = Some(self.redo_until.unwrap_or(0).max(self.step));
        }
        next.last_error = None;
        // The steps that run again answer again: later steps must be handed only the
        // outputs of the steps before them.
        for s in from..wf.len() {
            if let Some(step) = wf.step(s) {
                next.outputs.remove(&step.name);
            }
        }
        let step = Some(self.step_name(wf, from, Action::Do));
        Ok(Decision {
            trigger: Trigger::Resubmit,
            next,
            effects: vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status { status: OrderStatus::Resubmitted, step, reason: None },
            ],
        })
    }

    fn operator_undo(&self, now: Timestamp, wf: &Workflow, policy: &Policy) -> Result<Decision, Refusal> {
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
            let undo_from = if in_doubt { Some(self.step) } else { self.step.checked_sub(1) };
            wf.compensable_at_or_below(undo_from).ok_or_else(|| {
                self.refused(act, "nothing to undo: no step that may have taken effect has a compensation")
            })?
        };
        let mut next =
            self.moved(Trigger::OperatorUndo, now, self.operator_cause(act))?.waiting(now, 0, policy);
        next.step = first;
        next.step_attempts = 0;
        next.step_failures = 0;
        let step = Some(self.step_name(wf, first, Action::Undo));
        Ok(Decision {
            trigger: Trigger::OperatorUndo,
            next,
            effects: vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status { status: OrderStatus::Compensating, step, reason: None },
            ],
        })
    }

    fn cancel(&self, now: Timestamp, wf: &Workflow, policy: &Policy) -> Result<Decision, Refusal> {
        let act = Act::Cancel;
        match self.state {
            ProcessState::Pending | ProcessState::Processing => {}
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
        let undo_from = if in_doubt { Some(self.step) } else { self.step.checked_sub(1) };
        let cause = self.operator_cause(act);
        let cancelled = Effect::Status { status: OrderStatus::Cancelled, step: None, reason: None };
        match wf.compensable_at_or_below(undo_from) {
            Some(first) => {
                // An attempt in flight may still reach its service until its complete-by:
                // the undo waits for it, as a retry of a lapsed attempt does.
                // Kept whatever this clock says: the scheduler that claims the undo judges
                // the hold by its own clock and grace.
                let hold = match self.state {
                    ProcessState::Processing => self.complete_by,
                    _ => None,
                };
                let delay_ms = hold.map_or(0, |h| h.plus_ms(policy.reply_grace_ms).millis_since(now));
                let mut next = self.moved(Trigger::Cancel, now, cause)?.waiting(now, delay_ms, policy);
                next.step = first;
                next.step_attempts = 0;
                next.step_failures = 0;
                next.hold_until = hold;
                Ok(Decision {
                    trigger: Trigger::Cancel,
                    next,
                    effects: vec![Effect::Schedule { delay_ms }, cancelled],
                })
            }
            None => {
                let next = self.moved(Trigger::CancelUndone, now, cause)?.unlocked();
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
