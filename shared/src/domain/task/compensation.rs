//! Undoing: what forbids it (a pivot's effect that stands or may stand, a task re-running
//! steps that took effect before), and moving from one compensation to the next.

use super::branches::Outcome;
use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::record::Decision;
use crate::domain::ids::{IdempotencyKey, Timestamp};
use crate::domain::lifecycle::Trigger;
use crate::domain::map::item_key;
use crate::domain::messages::OrderStatus;
use crate::domain::workflow::{Action, Workflow, idempotency_key};

impl Draft {
    /// Why giving up must not undo anything, if it must not: undoing would leave a
    /// pivot's effect standing under a `Compensated` that says nothing stands.
    /// `in_doubt`: the current step was dispatched without a definitive answer.
    pub(super) fn forward_only(
        &self,
        wf: &Workflow,
        reason: &str,
        in_doubt: bool,
    ) -> Option<(String, Option<IdempotencyKey>)> {
        if crate::mutations::compensate_past_pivot() {
            return None;
        }
        // At a stage the branches name their own keys (below); the stage's first step alone
        // is not what is in doubt.
        let at_map = wf.map_at(self.step).is_some() && self.action() == Action::Do;
        let at_stage = self.stage_run(wf).is_some() || at_map;
        let key = (in_doubt && !at_stage).then(|| idempotency_key(&self.order_id, self.step, Action::Do));
        if let Some(why) = self.redoing() {
            return Some((format!("{reason}; nothing undone: {why}"), key));
        }
        let current = wf.step(self.step)?;
        if let Some(pivot) = wf.pivot_before(self.step) {
            let pivot = &wf.step(pivot)?.name;
            let unknown = match &key {
                Some(key) => format!("; {} outcome unknown (idempotency key {key})", current.name),
                None => String::new(),
            };
            return Some((
                format!(
                    "{reason}; nothing undone: pivot step {pivot} took effect, so the task only goes forward{unknown}"
                ),
                key,
            ));
        }
        if at_map && current.is_pivot() {
            // A pivot map: an item that succeeded stands, one dispatched without a
            // definitive answer may stand.
            let run = self.map_run_for_undo(wf, self.step);
            let (i, item) = (0u32..).zip(&run.branches).find(|(_, b)| b.may_have_taken_effect())?;
            let key = item_key(&self.order_id, self.step, i, false);
            return Some(match item.outcome {
                Outcome::Succeeded => (
                    format!("{reason}; nothing undone: pivot step {} item {i} took effect", current.name),
                    None,
                ),
                _ => (
                    format!(
                        "{reason}; nothing undone: pivot step {} item {i} outcome unknown (idempotency key {key})",
                        current.name
                    ),
                    Some(key),
                ),
            });
        }
        if let Some(run) = self.stage_run(wf) {
            // A pivot among the branches: one that succeeded stands, one dispatched without
            // a definitive answer may stand.
            return run.each().find_map(|(i, b)| {
                let pivot = wf.step(i).filter(|s| s.is_pivot() && b.may_have_taken_effect())?;
                Some(match b.outcome {
                    Outcome::Succeeded => (
                        format!("{reason}; nothing undone: pivot step {} took effect", pivot.name),
                        None,
                    ),
                    _ => {
                        let key = idempotency_key(&self.order_id, i, Action::Do);
                        (
                            format!(
                                "{reason}; nothing undone: pivot step {} outcome unknown (idempotency key {key})",
                                pivot.name
                            ),
                            Some(key),
                        )
                    }
                })
            });
        }
        match key {
            Some(key) if current.is_pivot() => Some((
                format!(
                    "{reason}; nothing undone: pivot step {} outcome unknown (idempotency key {key})",
                    current.name
                ),
                Some(key),
            )),
            _ => None,
        }
    }

    /// The newest step to undo: the current one if it may have taken effect (`in_doubt`),
    /// else the one before it, down to the first that has a compensation.
    /// At a stage, the newest of its branches that may have taken effect (or the steps
    /// before the stage when none did).
    pub(in crate::domain) fn first_to_undo(&self, wf: &Workflow, in_doubt: bool) -> Option<u32> {
        let top = match self.stage_run(wf) {
            Some(run) => run.steps().end.checked_sub(1),
            // A map's items say for themselves whether they may have taken effect.
            None if in_doubt || wf.map_at(self.step).is_some() => Some(self.step),
            None => self.step.checked_sub(1),
        };
        self.compensable_below(wf, top, in_doubt)
    }

    /// The highest step at or below `from` that has a compensation and may have taken
    /// effect: a stage's branches that never ran, or were refused, are passed over.
    fn compensable_below(&self, wf: &Workflow, from: Option<u32>, in_doubt: bool) -> Option<u32> {
        let mut from = from;
        while let Some(candidate) = wf.compensable_at_or_below(from) {
            if wf.map_at(candidate).is_some() {
                if self.map_run_for_undo(wf, candidate).next_to_undo().is_some() {
                    return Some(candidate);
                }
            } else if self.may_have_taken_effect(candidate, in_doubt) || crate::mutations::undo_every_branch()
            {
                return Some(candidate);
            }
            from = candidate.checked_sub(1);
        }
        None
    }

    /// Why the task only goes forward while it re-runs steps that took effect already.
    pub(in crate::domain) fn redoing(&self) -> Option<String> {
        self.redo_until.filter(|u| self.step <= *u).map(|u| {
            format!(
                "it was resubmitted from an earlier step, and steps up to {u} took effect (or may have) before, so it only goes forward until it is past step {u}"
            )
        })
    }

    /// A compensation succeeded: on to the next step below that has one, or Compensated
    /// when none is left.
    pub(super) fn compensation_succeeded(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        name: String,
    ) -> Result<Decision<Draft>, Refusal> {
        let (step, action) = (self.step, Action::Undo);
        let cause = Cause::Succeeded { step, action };
        let mut done = self.clone();
        if wf.map_at(step).is_some() {
            // One item undone: the map's next, if any may still stand, before the steps below.
            let mut run = self.map_run_for_undo(wf, step);
            if let Some(i) = run.next_to_undo() {
                run.branches[i as usize].outcome = Outcome::Undone;
            }
            let more = run.next_to_undo().is_some();
            done.stage = Some(run);
            if more {
                let next = done
                    .moved(Trigger::UndoAdvanced, now, cause)?
                    .waiting(now, 0, policy)
                    .starting_step(step);
                return Ok(Decision {
                    trigger: Trigger::UndoAdvanced,
                    next,
                    effects: vec![Effect::Schedule { delay_ms: 0 }],
                });
            }
            done.stage = None;
        }
        let this = &done;
        match this.compensable_below(wf, step.checked_sub(1), false) {
            Some(below) => {
                let next = this
                    .moved(Trigger::UndoAdvanced, now, cause)?
                    .waiting(now, 0, policy)
                    .starting_step(below);
                Ok(Decision {
                    trigger: Trigger::UndoAdvanced,
                    next,
                    effects: vec![
                        Effect::Schedule { delay_ms: 0 },
                        Effect::Status { status: OrderStatus::StepUndone, step: Some(name), reason: None },
                    ],
                })
            }
            None => {
                let next = this.moved(Trigger::Undone, now, cause)?.unlocked();
                Ok(Decision {
                    trigger: Trigger::Undone,
                    next,
                    effects: vec![Effect::Status {
                        status: OrderStatus::Compensated,
                        step: Some(name),
                        reason: None,
                    }],
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::ProcessState;
    use crate::domain::task::fixtures::*;

    #[test]
    fn permanent_failure_compensates_completed_steps_in_reverse_order() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 2), &wf, 1, T0);
        let d = reply(&task, &wf, failed("address rejected"), T0);
        assert_eq!(d.trigger, Trigger::Undo);
        let mut task = d.next;
        // Step 2 (ship-order) refused, so it had no effect and has no compensation:
        // undoing starts at step 1.
        assert_eq!((task.state(), task.step, task.step_attempts), (ProcessState::Compensating, 1, 0));
        assert_eq!(task.step_failures, 0);
        assert_eq!(task.locked_by(), None);
        assert_eq!(
            d.effects,
            vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status {
                    status: OrderStatus::Compensating,
                    step: Some("ship-order".into()),
                    reason: Some("address rejected".into())
                },
            ]
        );

        let mut undone = Vec::new();
        loop {
            let claimed = checked(&task, task.claim(lease(50 + undone.len() as u128), T0, &wf, &policy()));
            assert_eq!(
                claimed.effects,
                vec![Effect::Dispatch { step: task.step, action: Action::Undo, callback: None, item: None }]
            );
            let d = reply(&claimed.next, &wf, ok(), T0);
            undone.push(task.step);
            task = d.next;
            match d.trigger {
                Trigger::UndoAdvanced => {
                    assert_eq!(task.state(), ProcessState::Compensating);
                    assert_eq!(
                        d.effects,
                        vec![
                            Effect::Schedule { delay_ms: 0 },
                            Effect::Status {
                                status: OrderStatus::StepUndone,
                                step: Some("refund-payment".into()),
                                reason: None
                            },
                        ]
                    );
                }
                Trigger::Undone => {
                    assert_eq!(task.state(), ProcessState::Compensated);
                    assert_eq!(
                        d.effects,
                        vec![Effect::Status {
                            status: OrderStatus::Compensated,
                            step: Some("release-inventory".into()),
                            reason: None
                        }]
                    );
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(undone, vec![1, 0]);
        assert_eq!(task.deadline(), None);
    }

    #[test]
    fn compensation_failure_is_an_error_with_an_alert() {
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&pending_at(&wf, 2), &wf, 1, T0), &wf, failed("no"), T0).next;
        let undoing = claim(&compensating, &wf, 2, T0);
        let d = reply(&undoing, &wf, failed("refund refused"), T0);
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state(), ProcessState::Error);
        assert_eq!(d.next.deadline(), None);
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert!(
            alerts[0].reason.contains("compensation refund-payment failed: refund refused"),
            "{alerts:?}"
        );
        // The operator is told what failed: the refund, not the charge it undoes.
        assert_eq!((alerts[0].step, alerts[0].step_name.as_str()), (1, "refund-payment"));
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);
    }

    #[test]
    fn compensation_has_its_own_failure_budget() {
        let wf = Workflow::three_step();
        let gave_up = lapse_to_threshold(pending_at(&wf, 1), &wf, true).next;
        assert_eq!((gave_up.state(), gave_up.step), (ProcessState::Compensating, 1));
        assert_eq!((gave_up.failure_count, gave_up.step_failures), (3, 0));

        // The first compensation lapse is the phase's first failure: a retry with the
        // first backoff, not an instant Error because the forward phase used the budget.
        let claimed = claim(&gave_up, &wf, 77, gave_up.deadline().unwrap());
        let d = lapse(&claimed, &wf, 5);
        assert_eq!(d.trigger, Trigger::Retry);
        assert_eq!(d.next.state(), ProcessState::Compensating);
        assert_eq!(d.next.locked_by(), None);
        assert_eq!(d.next.failure_count, 4);
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: policy().retry_backoff.delay_ms(0, 5) }]);

        let d = lapse_to_threshold(d.next, &wf, true);
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state(), ProcessState::Error);
        assert_eq!(d.next.failure_count, 6, "three forward failures, then three compensation failures");
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].step_name, "refund-payment", "the compensation is what timed out");
    }

    #[test]
    fn a_pivot_in_doubt_at_the_threshold_is_an_error_with_nothing_undone() {
        // The defect this guards: ship-order took effect but kept answering late; giving
        // up refunded and released, ended Compensated, and the goods had shipped.
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(pending_at(&wf, 2), &wf, true);
        assert_eq!(d.trigger, Trigger::ForwardOnly);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Error, 2));
        assert_eq!((d.next.deadline(), d.next.locked_by()), (None, None));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::Schedule { .. } | Effect::Dispatch { .. })));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!((alerts[0].step, alerts[0].step_name.as_str()), (2, "ship-order"), "names the pivot");
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(alerts[0].idempotency_key, Some(IdempotencyKey("o-1:2:do".into())));
        assert!(
            alerts[0].reason.contains("pivot step ship-order outcome unknown (idempotency key o-1:2:do)")
        );
        let status = d.effects.iter().find_map(|e| match e {
            Effect::Status { status, step, reason } => Some((*status, step.clone(), reason.clone().unwrap())),
            _ => None,
        });
        let (status, step, reason) = status.expect("a status");
        assert_eq!((status, step.as_deref()), (OrderStatus::Failed, Some("ship-order")));
        assert!(reason.contains("outcome unknown") && reason.contains("o-1:2:do"), "{reason}");
    }

    #[test]
    fn a_pivot_refused_for_good_compensates_the_steps_before_it() {
        let wf = Workflow::three_step();
        let d = reply(&claim(&pending_at(&wf, 2), &wf, 1, T0), &wf, failed("422 address rejected"), T0);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn a_pivot_never_dispatched_compensates_the_steps_before_it() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(pending_at(&wf, 2), &wf, false);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn after_a_pivot_took_effect_every_give_up_is_an_error() {
        let wf = mixed();
        // a, r, b (pivot) done; c refused for good: b stands, so nothing is undone.
        let task = claim(&pending_at(&wf, 3), &wf, 1, T0);
        let d = reply(&task, &wf, failed("422 no"), T0);
        assert_eq!((d.trigger, d.next.state()), (Trigger::ForwardOnly, ProcessState::Error));
        let alerts = alerts(&d);
        assert_eq!((alerts[0].step_name.as_str(), alerts[0].idempotency_key.clone()), ("c", None));
        assert!(alerts[0].reason.contains("pivot step b took effect"), "{}", alerts[0].reason);

        // c lapses past its own budget of one: in doubt as well, and still forward only.
        let d = lapse(&task, &wf, 0);
        assert_eq!((d.trigger, d.next.state()), (Trigger::ForwardOnly, ProcessState::Error));
        let alerts = self::alerts(&d);
        assert_eq!(alerts[0].idempotency_key, Some(IdempotencyKey("o-1:3:do".into())));
        assert!(alerts[0].reason.contains("c outcome unknown"), "{}", alerts[0].reason);
    }

    #[test]
    fn a_read_only_step_in_doubt_is_not_a_pivot() {
        let wf = mixed();
        // r only reads: giving up on it undoes a and ends Compensated in the end.
        let d = lapse_to_threshold(pending_at(&wf, 1), &wf, true);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Compensating, 0));
    }
}
