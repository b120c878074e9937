//! The supervisor's recovery of a task whose deadline passed (a retry below the step's
//! failure budget), and the give-up rule every stop goes through: forward only past a
//! pivot, else undo what may have taken effect, else Error with an alert.

use super::branches::{Outcome, StageRun};
use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::record::Decision;
use crate::domain::ids::{IdempotencyKey, Timestamp};
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::messages::{OperatorAlert, OrderStatus};
use crate::domain::workflow::{Action, Workflow};

impl Draft {
    /// Supervisor: the deadline passed with nothing else moving the task.
    pub fn lapse(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_lapse(now, wf, policy, jitter), None)
    }

    fn decide_lapse(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision<Draft>, Refusal> {
        match self.deadline {
            Some(deadline) if deadline <= now => {}
            deadline => return Err(Refusal::NotDue { deadline, now }),
        }
        self.check_workflow(wf)?;
        // A timer cannot fail: its time wakes it (`recover`), it never lapses.
        if self.wake_at.is_some() {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("step {} is a timer: it wakes, it does not lapse", self.step),
            });
        }
        if let Some(run) = self.stage_run(wf).filter(|_| self.state != ProcessState::Waiting) {
            return self.lapse_stage(run, now, wf, policy, jitter);
        }
        if self.action() == Action::Do
            && wf.map_at(self.step).is_some()
            && let Some(run) = self.stage.as_ref().filter(|r| r.map && r.at == self.step && r.in_flight() > 0)
        {
            return self.lapse_items(run.clone(), now, wf, policy, jitter);
        }
        if self.paused
            && self.state == ProcessState::Processing
            && self.stage.as_ref().is_some_and(|r| r.map && r.at == self.step)
        {
            // A paused map whose last items in flight answered: the pause stopped it, not a
            // lost reply, so no failure is counted; it waits for its resume, parked.
            // FailureCount counts every lapse; no budget is spent.
            let cause = Cause::DeadlinePassed { step: self.step, state: self.state };
            let mut next = self.moved(Trigger::Retry, now, cause)?.waiting(now, 0, policy);
            next.failure_count += 1;
            return Ok(Decision { trigger: Trigger::Retry, next, effects: Vec::new() });
        }
        let cause = Cause::DeadlinePassed { step: self.step, state: self.state };
        let mut counted = self.clone();
        counted.failure_count += 1;
        counted.step_failures += 1;
        let step_failures = counted.step_failures;
        let budget = wf.max_failures(self.step, policy.failure_threshold);
        counted.last_error = Some(match self.state {
            ProcessState::Processing | ProcessState::Compensating if self.locked_by.is_some() => {
                format!("attempt {} passed its deadline without a reply", self.step_attempts)
            }
            ProcessState::Waiting => match &self.callback {
                Some(cb) if cb.due() < cb.timeout_at => {
                    format!(
                        "attempt {} missed a heartbeat: none came by {}",
                        self.step_attempts,
                        cb.due().to_rfc3339()
                    )
                }
                _ => format!("attempt {} was not completed by its callback timeout", self.step_attempts),
            },
            _ => "waited past its deadline without being claimed".to_owned(),
        });
        if step_failures < budget {
            let delay_ms = policy.retry_backoff.delay_ms(step_failures - 1, jitter);
            let next = counted.moved(Trigger::Retry, now, cause)?.waiting(now, delay_ms, policy);
            return Ok(Decision {
                trigger: Trigger::Retry,
                next,
                effects: vec![Effect::Schedule { delay_ms }],
            });
        }
        let reason =
            format!("failure threshold reached: {step_failures} failures of this step (threshold {budget})");
        match self.action() {
            // Dispatched at least once and never answered for good: it may have taken effect.
            Action::Do => counted.give_up(
                now,
                wf,
                policy,
                cause,
                GiveUpReason::plain(&reason),
                self.step_attempts > 0,
                true,
            ),
            Action::Undo => counted.fail(now, wf, cause, GiveUpReason::plain(&reason)),
        }
    }

    /// A stage's deadline passed: every branch still to do counts a lapse against its own
    /// budget (those in flight never answered; none was claimed at all if the stage
    /// waited). While every budget lasts the stage is retried, and its claim dispatches
    /// only the branches not yet succeeded; the first branch out of budget gives up, with
    /// every branch dispatched and not refused in doubt.
    fn lapse_stage(
        &self,
        mut run: StageRun,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision<Draft>, Refusal> {
        let mut counted = self.clone();
        counted.failure_count += 1;
        let mut spent = None;
        for (step, branch) in run.steps().zip(run.branches.iter_mut()) {
            if branch.outcome == Outcome::Succeeded {
                continue;
            }
            branch.failures += 1;
            branch.complete_by = None;
            if spent.is_none() && branch.failures >= wf.max_failures(step, policy.failure_threshold) {
                spent = Some((step, branch.failures));
            }
        }
        counted.step_failures = run.branches.iter().map(|b| b.failures).max().unwrap_or(0);
        counted.stage = Some(run);
        let cause = Cause::DeadlinePassed { step: self.step, state: self.state };
        counted.last_error = Some(match self.locked_by {
            Some(_) => format!(
                "stage attempt {} passed its deadline without every branch's reply",
                self.step_attempts
            ),
            None => "waited past its deadline without being claimed".to_owned(),
        });
        let Some((step, failures)) = spent else {
            let delay_ms = policy.retry_backoff.delay_ms(counted.step_failures - 1, jitter);
            let next = counted.moved(Trigger::Retry, now, cause)?.waiting(now, delay_ms, policy);
            return Ok(Decision {
                trigger: Trigger::Retry,
                next,
                effects: vec![Effect::Schedule { delay_ms }],
            });
        };
        let budget = wf.max_failures(step, policy.failure_threshold);
        let name = self.step_name(wf, step, Action::Do);
        let reason =
            format!("failure threshold reached: {failures} failures of branch {name} (threshold {budget})");
        let cause = Cause::DeadlinePassed { step, state: self.state };
        counted.give_up(now, wf, policy, cause, GiveUpReason::plain(&reason), self.step_attempts > 0, true)
    }

    /// A map's deadline passed with items in flight: each of them counts a lapse against
    /// its own budget, and the map is retried (its claim dispatches them again, under
    /// the same keys) while every budget lasts; an item out of budget gives up, with
    /// every item dispatched and not refused in doubt.
    fn lapse_items(
        &self,
        mut run: StageRun,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision<Draft>, Refusal> {
        let budget = wf.max_failures(self.step, policy.failure_threshold);
        let mut counted = self.clone();
        counted.failure_count += 1;
        let mut spent = None;
        for (i, item) in (0u32..).zip(run.branches.iter_mut()) {
            if !item.in_flight() {
                continue;
            }
            item.failures += 1;
            item.complete_by = None;
            if spent.is_none() && item.failures >= budget {
                spent = Some((i, item.failures));
            }
        }
        counted.step_failures = run.branches.iter().map(|b| b.failures).max().unwrap_or(0);
        counted.stage = Some(run);
        let cause = Cause::DeadlinePassed { step: self.step, state: self.state };
        counted.last_error = Some(format!(
            "map attempt {} passed its deadline without every item's reply",
            self.step_attempts
        ));
        let Some((i, failures)) = spent else {
            let delay_ms = policy.retry_backoff.delay_ms(counted.step_failures.saturating_sub(1), jitter);
            let next = counted.moved(Trigger::Retry, now, cause)?.waiting(now, delay_ms, policy);
            return Ok(Decision {
                trigger: Trigger::Retry,
                next,
                effects: vec![Effect::Schedule { delay_ms }],
            });
        };
        let name = self.step_name(wf, self.step, Action::Do);
        let reason = format!(
            "failure threshold reached: {failures} failures of step {name} item {i} (threshold {budget})"
        );
        counted.give_up(now, wf, policy, cause, GiveUpReason::plain(&reason), true, true)
    }

    pub(super) fn fail(
        &self,
        now: Timestamp,
        wf: &Workflow,
        cause: Cause,
        reason: GiveUpReason,
    ) -> Result<Decision<Draft>, Refusal> {
        self.stop(Trigger::Fail, now, wf, cause, reason, None)
    }

    /// Error with an alert and a `failed` status; `in_doubt` is the key of a step whose
    /// outcome is unknown, for the operator to look up at the remote side.
    fn stop(
        &self,
        trigger: Trigger,
        now: Timestamp,
        wf: &Workflow,
        cause: Cause,
        reason: GiveUpReason,
        in_doubt: Option<IdempotencyKey>,
    ) -> Result<Decision<Draft>, Refusal> {
        // At a stage, the branch that gave up (a lone step's cause names the step itself).
        let named = cause.step().unwrap_or(self.step);
        let mut next = self.moved(trigger, now, cause)?.unlocked();
        let operator = reason.for_operator();
        next.last_error = Some(operator.clone());
        let step = Some(self.step_name(wf, named, self.action()));
        Ok(Decision {
            trigger,
            effects: vec![
                next.alert(wf, named, self.action(), now, &operator, in_doubt),
                Effect::Status { status: OrderStatus::Failed, step, reason: Some(reason.told.to_owned()) },
            ],
            next,
        })
    }

    /// Stop going forward. A pivot that took effect, or may have (`in_doubt`: the current
    /// step was dispatched without a definitive answer), leaves the task in Error with
    /// nothing undone. Otherwise undo what may have taken effect, newest first, if the
    /// workflow compensates at all, else Error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn give_up(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        cause: Cause,
        reason: GiveUpReason,
        in_doubt: bool,
        alert: bool,
    ) -> Result<Decision<Draft>, Refusal> {
        if let Some((told, key)) = self.forward_only(wf, reason.told, in_doubt) {
            return self.stop(
                Trigger::ForwardOnly,
                now,
                wf,
                cause,
                GiveUpReason { told: &told, ..reason },
                key,
            );
        }
        if !wf.compensates() {
            return self.fail(now, wf, cause, reason);
        }
        let step = Some(self.step_name(wf, cause.step().unwrap_or(self.step), Action::Do));
        // Branches of a stage still out hold the undo until their complete-by is over.
        let delay_ms = self.held_for_ms(now, policy);
        let (trigger, mut next, status) = match self.first_to_undo(wf, in_doubt) {
            Some(first) => {
                let next = self
                    .moved(Trigger::Undo, now, cause)?
                    .waiting(now, delay_ms, policy)
                    .starting_step(first);
                (Trigger::Undo, next, OrderStatus::Compensating)
            }
            None => (
                Trigger::Undone,
                self.moved(Trigger::Undone, now, cause)?.unlocked(),
                OrderStatus::Compensated,
            ),
        };
        let operator = reason.for_operator();
        next.last_error = Some(operator.clone());
        let mut effects = Vec::new();
        if trigger == Trigger::Undo {
            effects.push(Effect::Schedule { delay_ms });
        }
        effects.push(Effect::Status { status, step, reason: Some(reason.told.to_owned()) });
        if alert {
            effects.push(next.alert(wf, next.step, next.action(), now, &operator, None));
        }
        Ok(Decision { trigger, next, effects })
    }

    /// `action` names what gave up, which the record after the move may no longer show
    /// (a failed compensation leaves the task in Error, a forward state).
    fn alert(
        &self,
        wf: &Workflow,
        step: u32,
        action: Action,
        now: Timestamp,
        reason: &str,
        in_doubt: Option<IdempotencyKey>,
    ) -> Effect {
        Effect::Alert(OperatorAlert {
            order_id: self.order_id.clone(),
            workflow: self.workflow.clone(),
            step,
            step_name: self.step_name(wf, step, action),
            state: self.state,
            failure_count: self.failure_count,
            reason: reason.to_owned(),
            idempotency_key: in_doubt,
            at: now,
        })
    }
}

/// Why a task gives up, in two registers: what the order's submitter is told (`reply_to`),
/// and what the operator and the record get, which adds the remote service's own words
/// when it gave any (they may name its internals, so they never reach the submitter).
#[derive(Debug, Clone, Copy)]
pub(super) struct GiveUpReason<'a> {
    pub(super) told: &'a str,
    pub(super) detail: Option<&'a str>,
}

impl<'a> GiveUpReason<'a> {
    pub(super) fn plain(told: &'a str) -> GiveUpReason<'a> {
        GiveUpReason { told, detail: None }
    }
    fn for_operator(&self) -> String {
        match self.detail {
            Some(detail) => format!("{} ({detail})", self.told),
            None => self.told.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::fixtures::*;

    #[test]
    fn lapse_below_threshold_retries_with_backoff() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let now = task.deadline().unwrap();
        let d = checked(&task, task.lapse(now, &wf, &policy(), 7));
        let delay = policy().retry_backoff.delay_ms(0, 7);
        assert!(delay > 0);
        assert_eq!(d.trigger, Trigger::Retry);
        assert_eq!(d.next.state(), ProcessState::Pending);
        assert_eq!((d.next.locked_by(), d.next.complete_by()), (None, None));
        assert_eq!(d.next.failure_count, 1);
        assert_eq!(d.next.deadline(), Some(now.plus_ms(delay + 2_000)), "the deadline moves past the delay");
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: delay }]);
        assert_eq!(d.next.last_cause, Cause::DeadlinePassed { step: 0, state: ProcessState::Processing });
        assert!(d.next.last_error.as_deref().unwrap().contains("attempt 1"));

        // The second retry backs off further.
        let again = claim(&d.next, &wf, 2, d.next.deadline().unwrap());
        let d2 = lapse(&again, &wf, 7);
        assert_eq!(d2.next.failure_count, 2);
        assert_eq!(d2.effects, vec![Effect::Schedule { delay_ms: policy().retry_backoff.delay_ms(1, 7) }]);
    }

    #[test]
    fn lapse_of_an_unclaimed_task_retries_it() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        let d = lapse(&task, &wf, 0);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.failure_count),
            (Trigger::Retry, ProcessState::Pending, 1)
        );
        assert!(d.next.last_error.as_deref().unwrap().contains("without being claimed"));
    }

    #[test]
    fn lapse_is_refused_when_not_due() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let deadline = task.deadline().unwrap();
        let early = Timestamp(deadline.0 - 1);
        assert_eq!(
            task.lapse(early, &wf, &policy(), 0),
            Err(Refusal::NotDue { deadline: Some(deadline), now: early })
        );
        // Past complete-by but within the reply grace: still not the supervisor's.
        assert!(task.lapse(task.complete_by().unwrap().plus_ms(1), &wf, &policy(), 0).is_err());
        let done = reply(&task, &wf, ok(), T0).next;
        let far = Timestamp(u64::MAX);
        assert_eq!(done.lapse(far, &wf, &policy(), 0), Err(Refusal::NotDue { deadline: None, now: far }));
    }

    #[test]
    fn lapse_at_threshold_single_step_is_an_error_with_one_alert() {
        let wf = Workflow::single_step();
        let d = lapse_to_threshold(new_task(&wf), &wf, true);
        // process-order is a pivot dispatched three times without an answer.
        assert_eq!(d.trigger, Trigger::ForwardOnly);
        assert_eq!(d.next.state(), ProcessState::Error);
        assert_eq!(d.next.failure_count, 3);
        assert_eq!(d.next.attempt, 3);
        assert_eq!((d.next.deadline(), d.next.locked_by()), (None, None));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].failure_count, 3);
        assert!(alerts[0].reason.contains("failure threshold reached"));
        assert!(alerts[0].reason.contains("process-order outcome unknown (idempotency key o-1:0:do)"));
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);

        // Never dispatched: nothing can stand, and with nothing to undo it is a plain Error.
        let d = lapse_to_threshold(new_task(&wf), &wf, false);
        assert_eq!((d.trigger, d.next.state()), (Trigger::Fail, ProcessState::Error));
        assert_eq!(self::alerts(&d).len(), 1);
        assert_eq!(self::alerts(&d)[0].idempotency_key, None);
    }

    #[test]
    fn lapse_at_threshold_compensates_the_in_flight_step_too() {
        let wf = Workflow::three_step();
        // Step 1 (charge-payment) was dispatched, so the charge may have happened.
        let d = lapse_to_threshold(pending_at(&wf, 1), &wf, true);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 1));
        assert_eq!((d.next.failure_count, d.next.step_failures), (3, 0), "undoing starts a fresh budget");
        assert_eq!(d.next.step_attempts, 0);
        assert_eq!(alerts(&d).len(), 1);
        assert!(d.effects.contains(&Effect::Schedule { delay_ms: 0 }));
        assert_eq!(statuses(&d), vec![OrderStatus::Compensating]);
    }

    #[test]
    fn lapse_at_threshold_of_an_undispatched_step_undoes_only_the_ones_before() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(pending_at(&wf, 1), &wf, false);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 0));
    }

    #[test]
    fn lapse_at_threshold_with_nothing_to_undo_is_compensated_directly() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(new_task(&wf), &wf, false);
        assert_eq!(d.trigger, Trigger::Undone);
        assert_eq!(d.next.state(), ProcessState::Compensated);
        assert_eq!(d.next.deadline(), None);
        assert_eq!(alerts(&d).len(), 1, "the operator still hears the order gave up");
        assert_eq!(statuses(&d), vec![OrderStatus::Compensated]);
    }

    #[test]
    fn the_failure_budget_is_per_step() {
        let wf = Workflow::three_step();
        // Two lapses (threshold 3) on step 0, then it succeeds.
        let mut task = claim(&new_task(&wf), &wf, 1, T0);
        for n in 0..2 {
            task = lapse(&task, &wf, 0).next;
            assert_eq!(task.step_failures, n + 1);
            task = claim(&task, &wf, 10 + n as u128, task.deadline().unwrap());
        }
        let now = task.complete_by().unwrap();
        task = reply(&task, &wf, ok(), now).next;
        assert_eq!((task.step, task.failure_count, task.step_failures), (1, 2, 0));
        // Step 1 gets its own three: two lapses retry, the third gives up.
        for n in 0..2 {
            task = claim(&task, &wf, 20 + n, task.deadline().unwrap());
            let d = lapse(&task, &wf, 0);
            assert_eq!(d.trigger, Trigger::Retry, "lapse {} of step 1", n + 1);
            task = d.next;
        }
        task = claim(&task, &wf, 30, task.deadline().unwrap());
        let d = lapse(&task, &wf, 0);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!(d.next.failure_count, 5, "FailureCount still counts every lapse");

        // A step's own max_failures overrides the deployment's threshold: c gives up at once.
        let wf = mixed();
        let c = claim(&pending_at(&wf, 3), &wf, 1, T0);
        assert_ne!(lapse(&c, &wf, 0).trigger, Trigger::Retry);
        let a = claim(&new_task(&wf), &wf, 1, T0);
        let d = lapse_to_threshold(a, &wf, true);
        assert_eq!(d.next.failure_count, 5, "a has a budget of five");
    }
}
