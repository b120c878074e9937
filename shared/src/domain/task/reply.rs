//! An agent's reply: the fence it must pass (the live lease of this very attempt, in
//! time), then the step's success, refusal or unusable output.

use std::sync::Arc;

use super::branches::Outcome;
use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal, StaleReason};
use super::record::Decision;
use super::recovery::GiveUpReason;
use crate::domain::gate::pause_ms;
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::map::MAX_MAP_OUTPUT_BYTES;
use crate::domain::messages::{AgentReply, OrderStatus, ReplyOutcome, cut_reason};
use crate::domain::output::StepOutput;
use crate::domain::workflow::{Action, Workflow};

impl Draft {
    /// The fence: the reply belongs to the live lease of this very attempt, in time.
    pub fn fence(&self, reply: &AgentReply, now: Timestamp) -> Result<(), StaleReason> {
        if crate::mutations::fencing_disabled() {
            return Ok(());
        }
        let lease = match (self.state, self.locked_by) {
            (ProcessState::Processing | ProcessState::Compensating, Some(lease)) => lease,
            (state, _) => return Err(StaleReason::NoLease(state)),
        };
        if lease != reply.lease {
            return Err(StaleReason::OtherLease);
        }
        if let Some(run) = self.stage.as_ref().filter(|r| r.at == self.step && self.action() == Action::Do) {
            // A branch's (or a map item's) reply: fenced on its own attempt and complete-by.
            let branch = run.slot(reply.step, reply.index).filter(|_| reply.action == Action::Do).ok_or(
                StaleReason::OtherStep { current: self.step, reply: reply.step, reply_action: reply.action },
            )?;
            if branch.attempt != reply.attempt {
                return Err(StaleReason::OtherAttempt { current: branch.attempt, reply: reply.attempt });
            }
            return match branch.complete_by {
                Some(complete_by) if now <= complete_by => Ok(()),
                Some(complete_by) => Err(StaleReason::PastCompleteBy { complete_by, now }),
                None => Err(StaleReason::BranchIdle { step: reply.step }),
            };
        }
        if self.attempt != reply.attempt {
            return Err(StaleReason::OtherAttempt { current: self.attempt, reply: reply.attempt });
        }
        // An item's undo names the item being undone: the newest that may still stand.
        let undoing = self
            .stage
            .as_ref()
            .filter(|r| r.map && r.at == self.step && self.action() == Action::Undo)
            .and_then(|r| r.next_to_undo());
        if self.step != reply.step || self.action() != reply.action || reply.index != undoing {
            return Err(StaleReason::OtherStep {
                current: self.step,
                reply: reply.step,
                reply_action: reply.action,
            });
        }
        match self.complete_by {
            Some(complete_by) if now <= complete_by => Ok(()),
            complete_by => {
                Err(StaleReason::PastCompleteBy { complete_by: complete_by.unwrap_or_default(), now })
            }
        }
    }

    /// Scheduler: apply an agent's reply, if it passes the fence.
    pub fn apply_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_reply(reply, now, wf, policy), None)
    }

    fn decide_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        self.fence(reply, now).map_err(Refusal::StaleReply)?;
        self.check_workflow(wf)?;
        let at_stage = self.stage.as_ref().is_some_and(|r| r.at == self.step) && reply.action == Action::Do;
        if let ReplyOutcome::Throttled { retry_after_ms } = reply.outcome {
            // A stage's branches (a map's items) share one lease: one cannot hand it back alone.
            if at_stage {
                let what = match wf.map_at(reply.step) {
                    Some(_) => "an item of a map",
                    None => "a branch of a parallel stage",
                };
                return Err(Refusal::Corrupt {
                    workflow: self.workflow.clone(),
                    why: format!("step {} is {what}: it cannot be throttled back", reply.step),
                });
            }
            return self.throttled(reply.action, retry_after_ms, now, wf, policy);
        }
        if at_stage && wf.map_at(self.step).is_some() {
            return self.item_reply(reply, now, wf, policy);
        }
        if at_stage {
            return self.branch_reply(reply, now, wf, policy);
        }
        let (step, action) = (self.step, reply.action);
        let name = self.step_name(wf, step, action);
        match (&reply.outcome, action) {
            (ReplyOutcome::Succeeded { output }, Action::Do) => {
                let step_output = match output.as_ref().map(StepOutput::from_value).transpose() {
                    Ok(step_output) => step_output,
                    Err(e) => {
                        let reason = format!("step {name} succeeded, but its output cannot be kept: {e}");
                        return self.bad_output(now, wf, policy, &reason, None);
                    }
                };
                let cause = Cause::Succeeded { step, action };
                let mut done = self.clone();
                if let Some(step_output) = step_output {
                    Arc::make_mut(&mut done.outputs).insert(name.clone(), step_output);
                }
                // A callback step's agent only started the work: the outside ends it.
                if wf.step(step).is_some_and(|s| s.is_callback()) {
                    return done.started(now, name);
                }
                done.step_done(Trigger::Advanced, now, cause, wf, policy, name)
            }
            // A compensation's answer is not kept: nothing runs after it that could use it.
            (ReplyOutcome::Succeeded { .. } | ReplyOutcome::BadOutput { .. }, Action::Undo) => {
                self.compensation_succeeded(now, wf, policy, name)
            }
            (ReplyOutcome::Failed { reason, detail }, Action::Do) => {
                // A queue worker's words are bounded here as the agent's are at the source.
                let (reason, detail) = (&cut_reason(reason.clone()), &detail.clone().map(cut_reason));
                let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt: false };
                // A refusal is definitive: this step had no effect, so only the ones
                // before it can stand.
                let gave_up = GiveUpReason { told: reason, detail: detail.as_deref() };
                self.give_up(now, wf, policy, cause, gave_up, false, false)
            }
            (ReplyOutcome::BadOutput { reason, detail }, Action::Do) => {
                let reason =
                    cut_reason(format!("step {name} succeeded, but its output cannot be kept: {reason}"));
                self.bad_output(now, wf, policy, &reason, detail.clone().map(cut_reason).as_deref())
            }
            // Decided before the stage's replies, above.
            (ReplyOutcome::Throttled { .. }, _) => Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: "a throttled reply reached the step's outcomes".into(),
            }),
            (ReplyOutcome::Failed { reason, detail }, Action::Undo) => {
                let (reason, detail) = (&cut_reason(reason.clone()), &detail.clone().map(cut_reason));
                let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt: false };
                let told = format!("compensation {name} failed: {reason}");
                self.fail(now, wf, cause, GiveUpReason { told: &told, detail: detail.as_deref() })
            }
        }
    }

    /// A branch's reply, past the fence. Its success is kept and, when it is the last
    /// branch to succeed, ends the stage as a lone step's success ends the step. Its
    /// refusal or unusable output gives up at once: the lease is dropped, so the replies
    /// of the branches still out are fenced off (their dispatches count as may have taken
    /// effect, and the undo waits until their complete-by).
    fn branch_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let step = reply.step;
        let action = Action::Do;
        let name = self.step_name(wf, step, action);
        let mut next = self.clone();
        // The fence let only a branch of this stage through; a record that says otherwise
        // is refused, not trusted (a planted bug that disables the fence comes this way).
        let corrupt = || Refusal::Corrupt {
            workflow: self.workflow.clone(),
            why: format!("reply for step {step} is for no branch of the stage at step {}", self.step),
        };
        let run = next.stage.as_mut().ok_or_else(corrupt)?;
        let branch = run.branch_mut(step).ok_or_else(corrupt)?;
        branch.complete_by = None;
        let (reason, detail, in_doubt) = match &reply.outcome {
            ReplyOutcome::Succeeded { output } => match output
                .as_ref()
                .map(StepOutput::from_value)
                .transpose()
            {
                Ok(step_output) => {
                    branch.outcome = Outcome::Succeeded;
                    let all = run.all_succeeded()
                        || (crate::mutations::join_early()
                            && run.branches.iter().filter(|b| b.outcome != Outcome::Succeeded).count() == 1);
                    if let Some(step_output) = step_output {
                        Arc::make_mut(&mut next.outputs).insert(name.clone(), step_output);
                    }
                    let cause = Cause::Succeeded { step, action };
                    if all {
                        return next.step_done(Trigger::Advanced, now, cause, wf, policy, name);
                    }
                    return Ok(Decision {
                        trigger: Trigger::BranchDone,
                        next: next.moved(Trigger::BranchDone, now, cause)?,
                        effects: vec![Effect::Status {
                            status: OrderStatus::StepCompleted,
                            step: Some(name),
                            reason: None,
                        }],
                    });
                }
                Err(e) => (format!("step {name} succeeded, but its output cannot be kept: {e}"), None, true),
            },
            ReplyOutcome::BadOutput { reason, detail } => (
                format!("step {name} succeeded, but its output cannot be kept: {reason}"),
                detail.clone(),
                true,
            ),
            ReplyOutcome::Throttled { .. } => return Err(corrupt()),
            ReplyOutcome::Failed { reason, detail } => {
                branch.outcome = Outcome::Refused;
                (reason.clone(), detail.clone(), false)
            }
        };
        let (reason, detail) = (cut_reason(reason), detail.map(cut_reason));
        let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt };
        next.hold_for_branches_out();
        let gave_up = GiveUpReason { told: &reason, detail: detail.as_deref() };
        next.give_up(now, wf, policy, cause, gave_up, in_doubt, in_doubt)
    }

    /// A map item's reply, past the fence. A success keeps its output with the item; a
    /// refusal is tolerated up to the map's `tolerated_failures`. While items remain, the
    /// next ones are dispatched under the same lease up to the cap (none while paused);
    /// when every item has answered, the map is done. One refusal too many, or an
    /// output that cannot be kept, gives up as a stage's branch does: the items still out
    /// hold the undo until their complete-by, and every item that may have taken effect
    /// is undone.
    fn item_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let (step, action) = (reply.step, Action::Do);
        let corrupt = || Refusal::Corrupt {
            workflow: self.workflow.clone(),
            why: format!(
                "reply for step {step} item {:?} is for no item of the map at {}",
                reply.index, self.step
            ),
        };
        let map = wf.map_at(self.step).ok_or_else(corrupt)?;
        let name = self.step_name(wf, step, action);
        let mut next = self.clone();
        let run = next.stage.as_mut().filter(|r| r.map).ok_or_else(corrupt)?;
        let item = run.slot_mut(step, reply.index).ok_or_else(corrupt)?;
        item.complete_by = None;
        let index = reply.index.unwrap_or_default();
        // The array as kept: each output, or `null`, a comma between, the brackets.
        let kept_bytes = |run: &super::branches::StageRun| {
            let items: usize =
                run.branches.iter().map(|b| b.output.as_ref().map_or(4, |o| o.as_str().len())).sum();
            items + run.branches.len().saturating_sub(1) + 2
        };
        let (reason, detail, in_doubt) = match &reply.outcome {
            ReplyOutcome::Succeeded { output } => {
                match output.as_ref().map(StepOutput::from_value).transpose() {
                    Ok(kept) => {
                        item.outcome = Outcome::Succeeded;
                        item.output = kept;
                        match kept_bytes(run) {
                            bytes if bytes > MAX_MAP_OUTPUT_BYTES => {
                                // Not kept: the record holds at most the bound.
                                if let Some(item) = run.slot_mut(step, reply.index) {
                                    item.output = None;
                                }
                                (
                                    format!(
                                        "step {name} item {index} succeeded, but the map's outputs together would be {bytes} bytes; at most {MAX_MAP_OUTPUT_BYTES} are kept"
                                    ),
                                    None,
                                    true,
                                )
                            }
                            _ => {
                                return next.item_settled(
                                    map,
                                    Cause::Succeeded { step, action },
                                    now,
                                    wf,
                                    policy,
                                );
                            }
                        }
                    }
                    Err(e) => (
                        format!("step {name} item {index} succeeded, but its output cannot be kept: {e}"),
                        None,
                        true,
                    ),
                }
            }
            ReplyOutcome::BadOutput { reason, detail } => (
                format!("step {name} item {index} succeeded, but its output cannot be kept: {reason}"),
                detail.clone(),
                true,
            ),
            ReplyOutcome::Throttled { .. } => return Err(corrupt()),
            ReplyOutcome::Failed { reason, detail } => {
                item.outcome = Outcome::Refused;
                let reason = cut_reason(format!("item {index}: {reason}"));
                if run.refused() <= map.tolerated_failures as usize {
                    let cause = Cause::Failed { step, action, reason, in_doubt: false };
                    return next.item_settled(map, cause, now, wf, policy);
                }
                (reason, detail.clone(), false)
            }
        };
        let (reason, detail) = (cut_reason(reason), detail.map(cut_reason));
        let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt };
        next.hold_for_branches_out();
        let gave_up = GiveUpReason { told: &reason, detail: detail.as_deref() };
        next.give_up(now, wf, policy, cause, gave_up, in_doubt, in_doubt)
    }

    /// An item answered for good, and the map goes on: done when every item has, else
    /// the next items dispatched (none while paused) and the lease stretched to cover them.
    /// A gated map's next item needs a place of its own in the agent's gate, which only a
    /// claim takes: the lease goes back, and a Schedule claims the next item.
    fn item_settled(
        self,
        map: &crate::domain::map::MapStep,
        cause: Cause,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        if self.stage.as_ref().is_some_and(|r| r.all_settled()) {
            // The map as a whole succeeded, whatever its last item's answer was.
            let done = Cause::Succeeded { step: self.step, action: Action::Do };
            return self.map_done(map, now, done, wf, policy);
        }
        if map.gated && !crate::mutations::items_around_gate() {
            let next = self.moved(Trigger::NextItem, now, cause)?.waiting(now, 0, policy);
            return Ok(Decision {
                trigger: Trigger::NextItem,
                next,
                effects: vec![Effect::Schedule { delay_ms: 0 }],
            });
        }
        let mut next = self.moved(Trigger::BranchDone, now, cause)?;
        let effects = if next.paused { Vec::new() } else { next.dispatch_items(map, now, wf, policy) };
        Ok(Decision { trigger: Trigger::BranchDone, next, effects })
    }

    /// The step answered success with an output later steps cannot have: it took effect,
    /// and asking again returns the same answer (the key is the same), so the task gives
    /// up at once with the step in doubt: its compensation runs if it has one, and a
    /// pivot leaves the task in Error naming its key.
    fn bad_output(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        reason: &str,
        detail: Option<&str>,
    ) -> Result<Decision<Draft>, Refusal> {
        let cause =
            Cause::Failed { step: self.step, action: Action::Do, reason: reason.to_owned(), in_doubt: true };
        self.give_up(now, wf, policy, cause, GiveUpReason { told: reason, detail }, true, true)
    }

    /// Scheduler: the step's remote answered 429 or 503 with Retry-After (the fence has
    /// passed the reply). The lease ends with no failure counted, and the step comes back
    /// to its gate after the pause, behind whoever waits; unless the pause would take the
    /// step's throttled wait past its budget (`Step::max_throttled_ms`): then the task
    /// gives up as for a spent failure budget, and an operator is told.
    fn throttled(
        &self,
        action: Action,
        retry_after_ms: u64,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let pause = pause_ms(retry_after_ms);
        let waited = self.step_throttled_ms.saturating_add(pause);
        let budget = wf.max_throttled_ms(self.step);
        if waited > budget && !crate::mutations::throttled_forever() {
            let reason = format!(
                "throttle budget spent: the remote asked this step to wait {waited} ms in all (budget {budget} ms)"
            );
            // This call did nothing, but the step stays in doubt: a copy of its request (an
            // earlier attempt's, or this one's in another container) may have reached the
            // service and may still until this attempt's complete-by. So the give-up undoes
            // the step too, and no undo is claimed before that complete-by, as after a cancel.
            let mut held = self.clone();
            held.hold_until = self.complete_by.max(self.hold_until);
            let cause = Cause::Failed { step: self.step, action, reason: reason.clone(), in_doubt: true };
            return match action {
                Action::Do => held.give_up(now, wf, policy, cause, GiveUpReason::plain(&reason), true, true),
                Action::Undo => held.fail(now, wf, cause, GiveUpReason::plain(&reason)),
            };
        }
        let cause = Cause::Throttled { step: self.step, action, retry_after_ms: pause };
        let mut next = self.moved(Trigger::Throttled, now, cause)?.unlocked();
        next.step_throttled_ms = waited;
        next.deadline = Some(now.plus_ms(pause + policy.pending_timeout_ms));
        next.last_error = Some(format!("the remote asked to wait {pause} ms (429 or 503 with Retry-After)"));
        Ok(Decision {
            trigger: Trigger::Throttled,
            next,
            effects: vec![Effect::Schedule { delay_ms: pause }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::messages::OrderStatus;
    use crate::domain::task::Effect;
    use crate::domain::task::fixtures::*;

    #[test]
    fn fence_refuses_every_reply_but_the_live_attempts_in_time() {
        let wf = Workflow::three_step();
        let pending = new_task(&wf);
        let task = claim(&pending, &wf, 1, T0);
        let good = reply_for(&task, ok());
        let complete_by = task.complete_by().unwrap();
        let stale = |r: &AgentReply, now: Timestamp, why: StaleReason| {
            assert_eq!(task.fence(r, now), Err(why.clone()));
            assert_eq!(task.apply_reply(r, now, &wf, &policy()), Err(Refusal::StaleReply(why)));
        };

        assert_eq!(task.fence(&good, T0), Ok(()));
        assert_eq!(task.fence(&good, complete_by), Ok(()), "complete-by itself is still in time");

        // No lease: the task waits (for instance after the supervisor took it back).
        assert_eq!(pending.fence(&good, T0), Err(StaleReason::NoLease(ProcessState::Pending)));
        assert_eq!(
            pending.apply_reply(&good, T0, &wf, &policy()),
            Err(Refusal::StaleReply(StaleReason::NoLease(ProcessState::Pending)))
        );
        let done = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("no"), T0).next;
        assert_eq!(done.fence(&good, T0), Err(StaleReason::NoLease(ProcessState::Compensated)));

        stale(&AgentReply { lease: lease(2), ..good.clone() }, T0, StaleReason::OtherLease);
        stale(
            &AgentReply { attempt: 2, ..good.clone() },
            T0,
            StaleReason::OtherAttempt { current: 1, reply: 2 },
        );
        stale(
            &AgentReply { attempt: 0, ..good.clone() },
            T0,
            StaleReason::OtherAttempt { current: 1, reply: 0 },
        );
        stale(
            &AgentReply { step: 1, ..good.clone() },
            T0,
            StaleReason::OtherStep { current: 0, reply: 1, reply_action: Action::Do },
        );
        stale(
            &AgentReply { action: Action::Undo, ..good.clone() },
            T0,
            StaleReason::OtherStep { current: 0, reply: 0, reply_action: Action::Undo },
        );
        let late = complete_by.plus_ms(1);
        stale(&good, late, StaleReason::PastCompleteBy { complete_by, now: late });
    }

    #[test]
    fn fence_in_compensation_refuses_a_forward_reply_for_the_same_step() {
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        let task = claim(&compensating, &wf, 2, T0);
        let undo = reply_for(&task, ok());
        assert_eq!(undo.action, Action::Undo);
        assert_eq!(task.fence(&undo, T0), Ok(()));
        let forward = AgentReply { action: Action::Do, ..undo };
        assert_eq!(
            task.fence(&forward, T0),
            Err(StaleReason::OtherStep { current: 0, reply: 0, reply_action: Action::Do })
        );
    }

    #[test]
    fn success_advances_step_by_step_then_finishes() {
        let wf = Workflow::three_step();
        let mut task = new_task(&wf);
        let names = ["reserve-inventory", "charge-payment", "ship-order"];
        for (step, name) in names.iter().enumerate() {
            task = claim(&task, &wf, step as u128, T0.plus_ms(step as u64));
            let now = task.complete_by().unwrap();
            let d = reply(&task, &wf, ok(), now);
            assert_eq!(d.next.last_cause, Cause::Succeeded { step: step as u32, action: Action::Do });
            assert_eq!(d.next.locked_by(), None);
            if step + 1 < names.len() {
                assert_eq!(d.trigger, Trigger::Advanced);
                assert_eq!(d.next.state(), ProcessState::Pending);
                assert_eq!((d.next.step, d.next.step_attempts), (step as u32 + 1, 0));
                assert_eq!(d.next.deadline(), Some(now.plus_ms(2_000)));
                assert_eq!(
                    d.effects,
                    vec![
                        Effect::Schedule { delay_ms: 0 },
                        Effect::Status {
                            status: OrderStatus::StepCompleted,
                            step: Some(name.to_string()),
                            reason: None
                        },
                    ]
                );
            } else {
                assert_eq!(d.trigger, Trigger::Finished);
                assert_eq!(d.next.state(), ProcessState::Processed);
                assert_eq!(d.next.deadline(), None);
                assert_eq!(
                    d.effects,
                    vec![Effect::Status {
                        status: OrderStatus::Processed,
                        step: Some("ship-order".into()),
                        reason: None
                    }]
                );
            }
            task = d.next;
        }
        assert_eq!(task.failure_count, 0);
    }

    #[test]
    fn single_step_success_finishes_at_once() {
        let wf = Workflow::single_step();
        let d = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, ok(), T0);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.deadline()),
            (Trigger::Finished, ProcessState::Processed, None)
        );
    }

    #[test]
    fn permanent_failure_without_compensation_is_an_error_with_an_alert() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let d = reply(&task, &wf, failed("card declined"), T0.plus_ms(5));
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state(), ProcessState::Error);
        assert_eq!((d.next.deadline(), d.next.locked_by()), (None, None));
        assert_eq!(d.next.failure_count, 0, "a refusal is an answer, not a lapse");
        assert!(d.next.last_error.as_deref().unwrap().contains("card declined"));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].order_id, task.order_id);
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(alerts[0].step_name, "process-order");
        assert!(alerts[0].reason.contains("card declined"));
        assert_eq!(alerts[0].at, T0.plus_ms(5));
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);
    }

    #[test]
    fn the_remote_services_own_words_reach_the_operator_not_the_submitter() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let outcome = ReplyOutcome::Failed {
            reason: "the remote service refused (HTTP 4xx)".into(),
            detail: Some("https://pay.internal/orders/process-order answered 403: no".into()),
        };
        let d = reply(&task, &wf, outcome, T0);
        let told = d.effects.iter().find_map(|e| match e {
            Effect::Status { reason, .. } => reason.clone(),
            _ => None,
        });
        assert_eq!(told.as_deref(), Some("the remote service refused (HTTP 4xx)"));
        let alerts = alerts(&d);
        assert!(alerts[0].reason.contains("answered 403"), "{}", alerts[0].reason);
        assert!(d.next.last_error.as_deref().unwrap().contains("answered 403"));
        assert_eq!(
            d.next.last_cause,
            Cause::Failed {
                step: 0,
                action: Action::Do,
                reason: "the remote service refused (HTTP 4xx)".into(),
                in_doubt: false
            }
        );
    }

    #[test]
    fn permanent_failure_at_the_first_step_has_nothing_to_undo() {
        let wf = Workflow::three_step();
        let d = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("out of stock"), T0);
        assert_eq!(d.trigger, Trigger::Undone);
        assert_eq!(d.next.state(), ProcessState::Compensated);
        assert_eq!(d.next.deadline(), None);
        assert!(alerts(&d).is_empty(), "undoing is the planned outcome, not an operator's problem");
        assert_eq!(statuses(&d), vec![OrderStatus::Compensated]);
    }

    /// A queue worker's reply did not come through an agent that bounds its words: a
    /// reason of any length is cut before it reaches the record, the alert or reply_to.
    #[test]
    fn a_long_reason_from_a_reply_is_cut() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 1), &wf, 1, T0);
        let long = "x".repeat(200_000);
        let outcome = ReplyOutcome::Failed { reason: long.clone(), detail: Some(long.clone()) };
        let d = reply(&task, &wf, outcome, T0);
        let last_error = d.next.last_error.clone().unwrap();
        assert!(last_error.len() <= 3 * crate::domain::MAX_REASON_BYTES, "{} bytes", last_error.len());
        assert!(
            matches!(&d.next.last_cause, Cause::Failed { reason, .. } if reason.len() <= crate::domain::MAX_REASON_BYTES)
        );
        let bad = ReplyOutcome::BadOutput { reason: long.clone(), detail: None };
        let d = reply(&task, &wf, bad, T0);
        assert!(d.next.last_error.unwrap().len() <= 2 * crate::domain::MAX_REASON_BYTES);
    }
}
