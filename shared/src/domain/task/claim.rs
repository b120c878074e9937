//! A scheduler takes the task for its current step: a lease until complete-by, and the
//! dispatch of the step's action.

use super::branches::{Outcome, StageRun};
use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::record::Decision;
use super::recovery::GiveUpReason;
use crate::domain::callback::{Awaiting, CallbackSecret, CallbackToken};
use crate::domain::ids::{LeaseToken, Timestamp};
use crate::domain::lifecycle::{self, ProcessState, Trigger};
use crate::domain::map::MapStep;
use crate::domain::workflow::{Action, Workflow};

/// What a scheduler brings to a claim: a fresh lease and, for a callback step, the
/// secret of the token it mints (both from the `Random` port). A bare lease claims any
/// step but a callback step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mint {
    pub lease: LeaseToken,
    pub secret: Option<CallbackSecret>,
}

impl From<LeaseToken> for Mint {
    fn from(lease: LeaseToken) -> Mint {
        Mint { lease, secret: None }
    }
}

impl Draft {
    /// Scheduler: take the task for its current step (Pending, or Compensating and unlocked).
    pub fn claim(
        &self,
        mint: impl Into<Mint>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_claim(mint.into(), now, wf, policy), None)
    }

    fn decide_claim(
        &self,
        Mint { lease, secret }: Mint,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let unconditional = crate::mutations::claim_unconditional();
        if !unconditional
            && (self.locked_by.is_some()
                || !matches!(self.state, ProcessState::Pending | ProcessState::Compensating))
        {
            return Err(Refusal::ClaimLost { state: self.state, locked: self.locked_by.is_some() });
        }
        if self.paused && !unconditional && !crate::mutations::claim_while_paused() {
            return Err(Refusal::Paused);
        }
        if let Some(until) = self.hold_until.map(|h| h.plus_ms(policy.reply_grace_ms))
            && now < until
            && !unconditional
        {
            return Err(Refusal::Held { until });
        }
        self.check_workflow(wf)?;
        let action = self.action();
        // A timer step is never claimed: `schedule` (`timer.rs`) puts it to sleep instead.
        if action == Action::Do && wf.step(self.step).is_some_and(|s| s.is_timer()) && !unconditional {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("step {} is a timer: it sleeps, it is not claimed", self.step),
            });
        }
        if let Some(map) = wf.map_at(self.step) {
            return match action {
                Action::Do => self.claim_map(map, lease, now, wf, policy),
                Action::Undo => self.claim_item_undo(lease, now, wf, policy),
            };
        }
        if let Some(run) = self.stage_run(wf) {
            return self.claim_stage(run, lease, now, wf, policy);
        }
        let cause = Cause::Claimed { step: self.step, action };
        let mut next = if unconditional && lifecycle::next(self.state, Trigger::Claimed).is_none() {
            self.overwritten_by_claim(now, cause)
        } else {
            self.moved(Trigger::Claimed, now, cause)?
        };
        let complete_by = now.plus_ms(wf.timeout_ms(self.step, policy.step_timeout_ms));
        next.lease(lease, complete_by, policy);
        next.attempt += 1;
        next.step_attempts += 1;
        let callback = match wf.step(self.step).and_then(|s| s.callback) {
            Some(cb) if action == Action::Do => {
                let secret = secret.ok_or_else(|| Refusal::Corrupt {
                    workflow: self.workflow.clone(),
                    why: format!("step {} waits for a callback: its claim needs a token's secret", self.step),
                })?;
                let token = CallbackToken::mint(&self.order_id, self.step, next.attempt, &secret);
                next.callback = Some(Awaiting {
                    step: self.step,
                    attempt: next.attempt,
                    digest: token.digest(),
                    timeout_at: now.plus_ms(cb.timeout_ms),
                    heartbeat_ms: cb.heartbeat_ms,
                    last_heartbeat: None,
                    started_at: None,
                    since: now,
                });
                Some(token)
            }
            _ => None,
        };
        Ok(Decision {
            trigger: Trigger::Claimed,
            next,
            effects: vec![Effect::Dispatch { step: self.step, action, callback, item: None }],
        })
    }

    /// The claim of a parallel stage: every branch not yet succeeded is dispatched at
    /// once under the one lease, each with an attempt of its own (the task's counter,
    /// bumped per branch) and its own complete-by; the stage's complete-by is the latest.
    fn claim_stage(
        &self,
        mut run: StageRun,
        lease: LeaseToken,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let cause = Cause::Claimed { step: self.step, action: Action::Do };
        let mut next = self.moved(Trigger::Claimed, now, cause)?;
        let mut effects = Vec::new();
        for step in run.steps() {
            let branch = run.branch_mut(step).expect("a step of the run");
            if branch.outcome == Outcome::Succeeded {
                continue;
            }
            next.attempt += 1;
            branch.attempt = next.attempt;
            branch.dispatches += 1;
            branch.complete_by = Some(now.plus_ms(wf.timeout_ms(step, policy.step_timeout_ms)));
            effects.push(Effect::Dispatch { step, action: Action::Do, callback: None, item: None });
        }
        let Some(complete_by) = run.latest_complete_by() else {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("stage at step {} has nothing left to dispatch", self.step),
            });
        };
        next.lease(lease, complete_by, policy);
        next.step_attempts += 1;
        next.stage = Some(run);
        Ok(Decision { trigger: Trigger::Claimed, next, effects })
    }

    /// The claim of a map step: its items are read at its first claim (an empty list
    /// finishes the step at once, an unreadable one gives up: nothing was dispatched), and
    /// each claim dispatches the items still to do, up to `max_concurrency` of them, each
    /// with an attempt and complete-by of its own. Each reply dispatches the next
    /// (`reply.rs`); the lease's complete-by follows the latest.
    fn claim_map(
        &self,
        map: &MapStep,
        lease: LeaseToken,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let cause = Cause::Claimed { step: self.step, action: Action::Do };
        let run = match self.stage.as_ref().filter(|r| r.map && r.at == self.step) {
            Some(run) => run.clone(),
            None => {
                let read = map.items_path().map_err(|e| e.to_string()).and_then(|path| {
                    path.resolve(
                        || serde_json::to_value(&self.order.items).unwrap_or_default(),
                        &self.outputs,
                    )
                    .map_err(|e| e.to_string())
                });
                match read {
                    Ok(items) if items.is_empty() => {
                        let mut done = self.clone();
                        done.stage = Some(StageRun::for_map(self.step, 0));
                        return done.map_done(map, now, Cause::NoItems { step: self.step }, wf, policy);
                    }
                    Ok(items) => StageRun::for_map(self.step, items.len()),
                    Err(why) => {
                        let reason = format!("map {} cannot read its items: {why}", map.name);
                        let cause =
                            Cause::Failed { step: self.step, action: Action::Do, reason, in_doubt: false };
                        let told = match &cause {
                            Cause::Failed { reason, .. } => reason.clone(),
                            _ => unreachable!(),
                        };
                        return self.give_up(now, wf, policy, cause, GiveUpReason::plain(&told), false, true);
                    }
                }
            }
        };
        let mut next = self.moved(Trigger::Claimed, now, cause)?;
        next.stage = Some(run);
        let effects = next.dispatch_items(map, now, wf, policy);
        let Some(complete_by) = next.stage.as_ref().and_then(StageRun::latest_complete_by) else {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("map at step {} has nothing left to dispatch", self.step),
            });
        };
        next.lease(lease, complete_by, policy);
        next.step_attempts += 1;
        Ok(Decision { trigger: Trigger::Claimed, next, effects })
    }

    /// Dispatches the map's items not yet answered and not in flight, in item order,
    /// until `max_concurrency` are in flight (one, for a gated map: its claim holds one
    /// place); each takes the task's next attempt.
    pub(super) fn dispatch_items(
        &mut self,
        map: &MapStep,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Vec<Effect> {
        let step = self.step;
        let complete_by = now.plus_ms(wf.timeout_ms(step, policy.step_timeout_ms));
        let cap = if map.gated { 1 } else { map.max_concurrency as usize }
            + usize::from(crate::mutations::map_over_cap());
        let mut attempt = self.attempt;
        let mut effects = Vec::new();
        if let Some(run) = self.stage.as_mut() {
            let mut in_flight = run.in_flight();
            for (i, b) in (0u32..).zip(run.branches.iter_mut()) {
                if in_flight >= cap {
                    break;
                }
                if b.outcome != Outcome::Open || b.in_flight() {
                    continue;
                }
                attempt += 1;
                b.attempt = attempt;
                b.dispatches += 1;
                b.complete_by = Some(complete_by);
                in_flight += 1;
                effects.push(Effect::Dispatch { step, action: Action::Do, callback: None, item: Some(i) });
            }
        }
        self.attempt = attempt;
        // The lease covers every item in flight: its complete-by follows the latest.
        if let Some(latest) = self.stage.as_ref().and_then(StageRun::latest_complete_by)
            && self.locked_by.is_some()
        {
            if self.complete_by.is_none_or(|c| c < latest) {
                self.complete_by = Some(latest);
            }
            let needed = latest.plus_ms(policy.reply_grace_ms);
            if self.deadline.is_none_or(|d| d < needed) {
                self.deadline = Some(needed);
            }
        }
        effects
    }

    /// The undo of a map's items, one at a time, newest first: each claim undoes the
    /// newest item that may still stand (`branches.rs`), under the task's own attempt.
    fn claim_item_undo(
        &self,
        lease: LeaseToken,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let run = self.map_run_for_undo(wf, self.step);
        let Some(index) = run.next_to_undo() else {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("map at step {} has no item left to undo", self.step),
            });
        };
        let mut next =
            self.moved(Trigger::Claimed, now, Cause::Claimed { step: self.step, action: Action::Undo })?;
        next.stage = Some(run);
        let complete_by = now.plus_ms(wf.timeout_ms(self.step, policy.step_timeout_ms));
        next.lease(lease, complete_by, policy);
        next.attempt += 1;
        next.step_attempts += 1;
        let effects = vec![Effect::Dispatch {
            step: self.step,
            action: Action::Undo,
            callback: None,
            item: Some(index),
        }];
        Ok(Decision { trigger: Trigger::Claimed, next, effects })
    }

    /// Takes `lease` until `complete_by`; a claim ends any hold.
    fn lease(&mut self, lease: LeaseToken, complete_by: Timestamp, policy: &Policy) {
        self.locked_by = Some(lease);
        self.complete_by = Some(complete_by);
        self.hold_until = None;
        // The deadline is the due index's key: moving it costs the index a delete and a
        // put. A waiting task's deadline usually covers the attempt already (the claim
        // comes milliseconds after the wait began, and the pending timeout is longer
        // than step timeout + grace), so it stays; it only moves when it would come
        // before the reply window closes. The fence uses complete-by, not the deadline.
        let needed = complete_by.plus_ms(policy.reply_grace_ms);
        if self.deadline.is_none_or(|d| d < needed) {
            self.deadline = Some(needed);
        }
    }

    /// The planted bug of `Mutation::UnconditionalClaim`: a claim written as a plain
    /// overwrite (`SET state = Processing, LockedBy = :new`), ignoring the table.
    fn overwritten_by_claim(&self, now: Timestamp, cause: Cause) -> Draft {
        let mut next = self.clone();
        if self.state != ProcessState::Compensating {
            next.state = ProcessState::Processing;
        }
        next.revision += 1;
        next.updated_at = now;
        next.last_cause = cause;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::fixtures::*;
    use crate::domain::workflow::Step;

    #[test]
    fn claim_from_pending_takes_a_lease_until_complete_by() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        let now = T0.plus_ms(10);
        let d = checked(&task, task.claim(lease(1), now, &wf, &policy()));
        assert_eq!(d.trigger, Trigger::Claimed);
        assert_eq!(d.next.state(), ProcessState::Processing);
        assert_eq!(d.next.locked_by(), Some(lease(1)));
        assert_eq!(d.next.complete_by(), Some(now.plus_ms(1_000)));
        // The pending deadline (T0 + 2000) covers complete-by + grace (T0 + 1510): kept.
        assert_eq!(d.next.deadline(), task.deadline());
        assert_eq!((d.next.attempt, d.next.step_attempts, d.next.step), (1, 1, 0));
        assert_eq!(d.next.last_cause, Cause::Claimed { step: 0, action: Action::Do });
        assert_eq!(d.next.updated_at, now);
        assert_eq!(
            d.effects,
            vec![Effect::Dispatch { step: 0, action: Action::Do, callback: None, item: None }]
        );
    }

    #[test]
    fn a_late_claim_moves_the_deadline_to_cover_its_reply_window() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        for (after_ms, deadline) in
            [(0, T0.plus_ms(2_000)), (500, T0.plus_ms(2_000)), (501, T0.plus_ms(2_001))]
        {
            let now = T0.plus_ms(after_ms);
            let d = checked(&task, task.claim(lease(1), now, &wf, &policy()));
            assert_eq!(d.next.deadline(), Some(deadline), "claimed {after_ms} ms after submission");
            assert!(d.next.deadline() >= d.next.complete_by().map(|c| c.plus_ms(500)));
        }
    }

    #[test]
    fn claim_from_unlocked_compensating_dispatches_the_undo() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 1), &wf, 1, T0);
        let compensating = reply(&task, &wf, failed("declined"), T0).next;
        assert_eq!((compensating.state(), compensating.step), (ProcessState::Compensating, 0));
        assert_eq!(compensating.locked_by(), None);
        let d = checked(&compensating, compensating.claim(lease(2), T0, &wf, &policy()));
        assert_eq!(d.trigger, Trigger::Claimed);
        assert_eq!(d.next.state(), ProcessState::Compensating);
        assert_eq!(d.next.locked_by(), Some(lease(2)));
        assert_eq!(d.next.step_attempts, 1);
        assert_eq!(d.next.attempt, compensating.attempt + 1);
        assert_eq!(
            d.effects,
            vec![Effect::Dispatch { step: 0, action: Action::Undo, callback: None, item: None }]
        );
    }

    #[test]
    fn claim_is_refused_when_locked_or_terminal() {
        let wf = Workflow::three_step();
        let processing = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!(
            processing.claim(lease(2), T0, &wf, &policy()),
            Err(Refusal::ClaimLost { state: ProcessState::Processing, locked: true })
        );
        // A lease that lapsed in time is still a lease until the supervisor takes it away.
        assert!(matches!(
            processing.claim(lease(2), T0.plus_ms(1_000_000), &wf, &policy()),
            Err(Refusal::ClaimLost { locked: true, .. })
        ));

        let compensating = reply(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        let locked = claim(&compensating, &wf, 2, T0);
        assert_eq!(
            locked.claim(lease(3), T0, &wf, &policy()),
            Err(Refusal::ClaimLost { state: ProcessState::Compensating, locked: true })
        );

        let processed = {
            let single = Workflow::single_step();
            let t = claim(&new_task(&single), &single, 1, T0);
            reply(&t, &single, ok(), T0).next
        };
        let error = {
            let single = Workflow::single_step();
            let t = claim(&new_task(&single), &single, 1, T0);
            reply(&t, &single, failed("no"), T0).next
        };
        let compensated = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("no"), T0).next;
        for (terminal, want) in [
            (processed, ProcessState::Processed),
            (error, ProcessState::Error),
            (compensated, ProcessState::Compensated),
        ] {
            assert_eq!(terminal.state(), want);
            let wf = if want == ProcessState::Compensated {
                Workflow::three_step()
            } else {
                Workflow::single_step()
            };
            assert_eq!(
                terminal.claim(lease(9), T0, &wf, &policy()),
                Err(Refusal::ClaimLost { state: want, locked: false })
            );
        }
    }

    #[test]
    fn attempts_count_claims_of_the_task_and_of_the_step() {
        let wf = Workflow::three_step();
        let t = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!((t.attempt, t.step_attempts), (1, 1));
        let t = lapse(&t, &wf, 0).next;
        assert_eq!((t.attempt, t.step_attempts), (1, 1), "a retry keeps the counts");
        let t = claim(&t, &wf, 2, t.deadline().unwrap());
        assert_eq!((t.attempt, t.step_attempts), (2, 2));
        let now = t.complete_by().unwrap();
        let t = reply(&t, &wf, ok(), now).next;
        assert_eq!((t.step, t.attempt, t.step_attempts), (1, 2, 0), "a new step starts its own count");
        let t = claim(&t, &wf, 3, now);
        assert_eq!((t.step, t.attempt, t.step_attempts), (1, 3, 1));
    }

    #[test]
    fn claim_refuses_a_record_that_does_not_fit_its_workflow() {
        let task = new_task(&Workflow::three_step());
        assert!(matches!(
            task.claim(lease(1), T0, &Workflow::single_step(), &policy()),
            Err(Refusal::Corrupt { .. })
        ));
        let mut beyond = pending_at(&Workflow::three_step(), 2);
        beyond.step = 7;
        assert!(matches!(
            beyond.claim(lease(1), T0, &Workflow::three_step(), &policy()),
            Err(Refusal::Corrupt { .. })
        ));
    }

    #[test]
    fn a_step_with_its_own_timeout_gets_that_complete_by_and_a_deadline_to_match() {
        let slow = Step { timeout_ms: Some(7_000), ..Step::pivot("slow", "a") };
        let wf = Workflow::new("timed", vec![Step::pivot("fast", "a"), slow]);
        let first = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!(first.complete_by(), Some(T0.plus_ms(policy().step_timeout_ms)));
        let waiting = reply(&first, &wf, ok(), T0).next;
        let second = claim(&waiting, &wf, 2, T0);
        assert_eq!(second.complete_by(), Some(T0.plus_ms(7_000)));
        assert_eq!(second.deadline(), Some(T0.plus_ms(7_000 + policy().reply_grace_ms)));
    }
}
