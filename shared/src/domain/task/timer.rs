//! Timer steps: a Schedule for a timer step puts the task to sleep instead of claiming it,
//! with its wake time as its deadline (so the due index holds it and nothing runs until
//! then); the time wakes it, through a delayed Schedule or the supervisor's sweep,
//! whichever comes first, and never before the time.

use super::claim::Mint;
use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::record::Decision;
use super::recovery::GiveUpReason;
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::messages::{OrderStatus, cut_reason};
use crate::domain::output::StepOutput;
use crate::domain::wait::{MAX_DELAYED_WAKE_MS, Wait};
use crate::domain::workflow::{Action, Workflow};

impl Draft {
    /// Scheduler, on a Schedule message: wake a waiting timer whose time came, put a task
    /// at a timer step to sleep, or claim the task for its step.
    pub fn schedule(
        &self,
        mint: impl Into<Mint>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        if self.state == ProcessState::Waiting {
            return self.wake(now, wf, policy);
        }
        // Paused: not even a timer starts (its wait would run on while the task is held).
        if self.paused && !crate::mutations::claim_while_paused() {
            return Err(Refusal::Paused);
        }
        match wf.step(self.step).and_then(|s| s.wait.as_ref()) {
            Some(wait) if self.state == ProcessState::Pending => {
                self.logged(now, self.decide_sleep(wait, now, wf, policy), None)
            }
            _ => self.claim(mint, now, wf, policy),
        }
    }

    /// Supervisor: the deadline passed. A waiting timer wakes (waiting is no failure);
    /// anything else lapses.
    pub fn recover(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision<Draft>, Refusal> {
        // Parked: its deadline is the pause's, not a lapse (read only by a sweep more
        // than `PARKED_MS` after the pause).
        if self.parked() {
            return Err(Refusal::NotDue { deadline: self.deadline, now });
        }
        // Waiting for a place in a gate is no lapse: ask the gate again.
        if self.queued.is_some() && self.locked_by.is_none() {
            return match self.deadline {
                Some(deadline) if deadline <= now => self.requeue(now, policy),
                deadline => Err(Refusal::NotDue { deadline, now }),
            };
        }
        // A callback's wait lapses like an attempt (its timeout or heartbeat was missed).
        if self.state != ProcessState::Waiting || self.callback.is_some() {
            return self.lapse(now, wf, policy, jitter);
        }
        if crate::mutations::sweep_skips_timers() {
            return Err(Refusal::NotDue { deadline: self.deadline, now });
        }
        self.wake(now, wf, policy).map_err(|refusal| match refusal {
            Refusal::Asleep { now, .. } => Refusal::NotDue { deadline: self.deadline, now },
            other => other,
        })
    }

    /// A waiting timer's time came: on to the next step, or the end.
    pub fn wake(&self, now: Timestamp, wf: &Workflow, policy: &Policy) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_wake(now, wf, policy), None)
    }

    fn decide_sleep(
        &self,
        wait: &Wait,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        self.check_workflow(wf)?;
        let step = self.step;
        let name = self.step_name(wf, step, Action::Do);
        // The order as the path sees it: its JSON as accepted.
        let order = serde_json::to_value(&*self.order).unwrap_or_default();
        let wake_at = match wait.wake_at(now, &order, |s| self.outputs.get(s).map(StepOutput::to_value)) {
            // A time already past wakes at once, through the Schedule sent with no delay.
            Ok(at) => at.max(now),
            Err(e) => {
                // The time may come from a service's output: its words reach the operator,
                // not the submitter (as a refusal's do).
                let told = format!("timer step {name} has no time to wait until");
                let detail = cut_reason(e.to_string());
                let cause = Cause::Failed { step, action: Action::Do, reason: told.clone(), in_doubt: false };
                let reason = GiveUpReason { told: &told, detail: Some(&detail) };
                return self.give_up(now, wf, policy, cause, reason, false, false);
            }
        };
        let mut next = self.moved(Trigger::Slept, now, Cause::Slept { step, wake_at })?.unlocked();
        next.wake_at = Some(wake_at);
        next.deadline = Some(wake_at);
        let delay_ms = wake_at.millis_since(now);
        // Within SQS's longest delay, a delayed Schedule wakes it on time; past that, the
        // supervisor's sweep does (at most one period late), and the task costs nothing
        // until then.
        let mut effects =
            if delay_ms <= MAX_DELAYED_WAKE_MS { vec![Effect::Schedule { delay_ms }] } else { Vec::new() };
        effects.push(Effect::Status { status: OrderStatus::Waiting, step: Some(name), reason: None });
        Ok(Decision { trigger: Trigger::Slept, next, effects })
    }

    fn decide_wake(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let wake_at = match (self.state, self.wake_at) {
            (ProcessState::Waiting, Some(wake_at)) => wake_at,
            (state, _) => return Err(Refusal::ClaimLost { state, locked: self.locked_by.is_some() }),
        };
        if now < wake_at && !crate::mutations::wake_early() {
            return Err(Refusal::Asleep { wake_at, now });
        }
        self.check_workflow(wf)?;
        let step = self.step;
        let name = self.step_name(wf, step, Action::Do);
        let cause = Cause::Woke { step, late_ms: now.millis_since(wake_at) };
        self.clone().step_done(Trigger::Woke, now, cause, wf, policy, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::messages::OrderStatus;
    use crate::domain::task::Act;
    use crate::domain::task::fixtures::*;
    use crate::domain::task::{Effect, TaskRecord};
    use crate::domain::workflow::Step;

    /// T0 + 200 s, as the charge's service writes it.
    const RELEASE_AT: &str = r#"{"release_at":"1970-01-01T00:20:00Z"}"#;

    /// Charged (answering `answer`), then Pending at the cool-off.
    fn charged(wf: &Workflow, answer: &str) -> TaskRecord {
        let t = claim(&new_task(wf), wf, 1, T0);
        reply(&t, wf, output(answer), T0).next
    }

    #[test]
    fn a_timer_step_sleeps_instead_of_dispatching_with_its_wake_time_as_deadline() {
        let wf = timed();
        let pending = charged(&wf, RELEASE_AT);
        let now = T0.plus_ms(7);
        let d = checked(&pending, pending.schedule(lease(2), now, &wf, &policy()));
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Slept, ProcessState::Waiting, 1));
        assert_eq!(d.next.wake_at(), Some(now.plus_ms(5_000)));
        assert_eq!(d.next.deadline(), d.next.wake_at(), "the due index holds it until then");
        assert_eq!((d.next.locked_by(), d.next.complete_by()), (None, None));
        assert_eq!((d.next.attempt, d.next.failure_count), (pending.attempt, 0), "nothing dispatched");
        assert_eq!(d.next.last_cause, Cause::Slept { step: 1, wake_at: now.plus_ms(5_000) });
        // Within SQS's longest delay: a delayed Schedule wakes it on time.
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 5_000 });
        // The app hears that the order waits, and at which step.
        assert_eq!(
            d.effects[1..],
            [Effect::Status { status: OrderStatus::Waiting, step: Some("cool-off".into()), reason: None }]
        );
    }

    #[test]
    fn a_wake_past_sqss_longest_delay_is_the_supervisors_alone() {
        let wf = timer_first();
        let settling = pending_at(&wf, 2);
        let d = checked(&settling, settling.schedule(lease(3), T0, &wf, &policy()));
        assert_eq!(d.next.wake_at(), Some(T0.plus_ms(2_000_000)));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::Schedule { .. })), "{:?}", d.effects);
        // Exactly 15 minutes still goes as a delayed message.
        let quarter = Workflow::new("q", vec![Step::timer("t", Wait::for_ms(MAX_DELAYED_WAKE_MS))]);
        let t = new_task(&quarter);
        let d = checked(&t, t.schedule(lease(1), T0, &quarter, &policy()));
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: MAX_DELAYED_WAKE_MS });
    }

    #[test]
    fn a_wait_until_reads_an_earlier_steps_output_and_a_time_past_wakes_at_once() {
        let wf = timed();
        let cooled = |answer: &str| {
            let t = sleep(&charged(&wf, answer), &wf, T0);
            checked(&t, t.wake(t.wake_at().unwrap(), &wf, &policy())).next
        };
        let holding = cooled(RELEASE_AT);
        let d = checked(&holding, holding.schedule(lease(3), T0.plus_ms(5_000), &wf, &policy()));
        assert_eq!(d.next.wake_at(), Some(Timestamp(1_200_000)));
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 1_200_000 - 1_005_000 });

        let past = cooled(r#"{"release_at":"1970-01-01T00:00:01Z"}"#);
        let now = T0.plus_ms(5_000);
        let d = checked(&past, past.schedule(lease(3), now, &wf, &policy()));
        assert_eq!(d.next.wake_at(), Some(now), "a time past wakes at once");
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        let woke = checked(&d.next, d.next.schedule(lease(4), now, &wf, &policy()));
        assert_eq!((woke.trigger, woke.next.step), (Trigger::Woke, 3));
    }

    #[test]
    fn a_missing_or_bad_time_fails_the_step_as_a_refusal_would() {
        let wf = timed();
        for (answer, detail) in [
            (r#"{"other":1}"#, "there is no such value"),
            (r#"{"release_at":17}"#, "the value is not a string"),
            (r#"{"release_at":"soon, secret-internal-id"}"#, "is not an RFC 3339 time"),
            (r#"{"release_at":"2999-01-01T00:00:00Z"}"#, "more than 366 days away"),
        ] {
            let t = sleep(&charged(&wf, answer), &wf, T0);
            let holding = checked(&t, t.wake(t.wake_at().unwrap(), &wf, &policy())).next;
            let d = checked(&holding, holding.schedule(lease(3), T0.plus_ms(5_000), &wf, &policy()));
            // The charge before it is undone; nothing counts as a lapse.
            assert_eq!(
                (d.trigger, d.next.state(), d.next.step),
                (Trigger::Undo, ProcessState::Compensating, 0)
            );
            assert_eq!(d.next.failure_count, 0);
            assert!(matches!(d.next.last_cause, Cause::Failed { step: 2, in_doubt: false, .. }));
            assert!(d.next.last_error.as_deref().unwrap().contains(detail), "{:?}", d.next.last_error);
            // The service's words are the operator's: the submitter hears only which step.
            let told: Vec<_> = d
                .effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Status { reason, .. } => reason.clone(),
                    _ => None,
                })
                .collect();
            assert_eq!(told, ["timer step hold has no time to wait until"]);
        }
        // With nothing before it to undo, and with nothing to undo with at all.
        let bad = Workflow::new(
            "bad",
            vec![Step::timer("t", Wait::until("$.order.nope")), Step::compensable("c", "a", "undo-c")],
        );
        let d = checked(&new_task(&bad), new_task(&bad).schedule(lease(1), T0, &bad, &policy()));
        assert_eq!((d.trigger, d.next.state()), (Trigger::Undone, ProcessState::Compensated));
        let plain = Workflow::new("plain", vec![Step::timer("t", Wait::until("$.order.customer_id"))]);
        let d = checked(&new_task(&plain), new_task(&plain).schedule(lease(1), T0, &plain, &policy()));
        assert_eq!((d.trigger, d.next.state()), (Trigger::Fail, ProcessState::Error));
        assert_eq!(alerts(&d).len(), 1);
    }

    #[test]
    fn a_timer_never_wakes_before_its_time() {
        let wf = timed();
        let waiting = sleep(&charged(&wf, RELEASE_AT), &wf, T0);
        let wake_at = waiting.wake_at().unwrap();
        let early = Timestamp(wake_at.0 - 1);
        // A duplicate Schedule: nothing changes, and the scheduler drops it.
        assert_eq!(
            waiting.schedule(lease(5), early, &wf, &policy()),
            Err(Refusal::Asleep { wake_at, now: early })
        );
        // The supervisor: not due.
        assert_eq!(
            waiting.recover(early, &wf, &policy(), 0),
            Err(Refusal::NotDue { deadline: Some(wake_at), now: early })
        );
    }

    #[test]
    fn a_timer_wakes_on_to_the_next_step_with_no_failure_counted() {
        let wf = timed();
        let waiting = sleep(&charged(&wf, RELEASE_AT), &wf, T0);
        let wake_at = waiting.wake_at().unwrap();
        // By its delayed Schedule, on time...
        let d = checked(&waiting, waiting.schedule(lease(5), wake_at, &wf, &policy()));
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Woke, ProcessState::Pending, 2));
        assert_eq!((d.next.wake_at(), d.next.step_attempts, d.next.failure_count), (None, 0, 0));
        assert_eq!(d.next.last_cause, Cause::Woke { step: 1, late_ms: 0 });
        assert_eq!(
            d.effects,
            vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status {
                    status: OrderStatus::StepCompleted,
                    step: Some("cool-off".into()),
                    reason: None
                },
            ]
        );
        // ...or by the supervisor's sweep, late: a wake, not a lapse.
        let late = wake_at.plus_ms(60_000);
        let d = checked(&waiting, waiting.recover(late, &wf, &policy(), 9));
        assert_eq!(
            (d.trigger, d.next.step, d.next.failure_count, d.next.step_failures),
            (Trigger::Woke, 2, 0, 0)
        );
        assert_eq!(d.next.last_cause, Cause::Woke { step: 1, late_ms: 60_000 });
        // A lapse is no way out of waiting: the table has no such row.
        assert!(matches!(waiting.lapse(late, &wf, &policy(), 0), Err(Refusal::Corrupt { .. })));
    }

    #[test]
    fn a_timer_that_is_the_last_step_finishes_the_task() {
        let wf = timer_first();
        let waiting = sleep(&pending_at(&wf, 2), &wf, T0);
        let d = checked(&waiting, waiting.recover(waiting.deadline().unwrap(), &wf, &policy(), 0));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.deadline()),
            (Trigger::Finished, ProcessState::Processed, None)
        );
        assert_eq!(statuses(&d), vec![OrderStatus::Processed]);
    }

    #[test]
    fn a_cancel_while_waiting_undoes_what_was_done() {
        let wf = timed();
        let waiting = sleep(&charged(&wf, RELEASE_AT), &wf, T0);
        let d = act(&waiting, &wf, Act::Cancel);
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::Cancel, ProcessState::Compensating, 0)
        );
        assert_eq!((d.next.wake_at(), d.next.hold_until()), (None, None), "no attempt in flight to wait for");
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        // The timer's own Schedule, arriving after, finds nothing to wake.
        assert!(
            d.next
                .schedule(lease(7), waiting.wake_at().unwrap(), &wf, &policy())
                .is_ok_and(|c| c.trigger == Trigger::Claimed && c.next.action() == Action::Undo)
        );
        // Nothing done before the timer: nothing to undo.
        let first = timer_first();
        let waiting = sleep(&new_task(&first), &first, T0);
        let d = act(&waiting, &first, Act::Cancel);
        assert_eq!((d.trigger, d.next.state()), (Trigger::CancelUndone, ProcessState::Compensated));
    }

    #[test]
    fn a_timer_step_is_never_claimed_for_an_agent() {
        let wf = timer_first();
        let t = new_task(&wf);
        assert!(matches!(t.claim(lease(1), T0, &wf, &policy()), Err(Refusal::Corrupt { .. })));
    }

    #[test]
    fn an_early_schedule_is_sent_again_for_the_timers_time_if_a_message_can_wait_that_long() {
        let asleep = |left: u64| Refusal::Asleep { wake_at: T0.plus_ms(left), now: T0 };
        assert_eq!(asleep(4_000).rearm_ms(), Some(4_000));
        assert_eq!(asleep(0).rearm_ms(), Some(1), "never a zero delay");
        assert_eq!(asleep(MAX_DELAYED_WAKE_MS).rearm_ms(), Some(MAX_DELAYED_WAKE_MS));
        assert_eq!(asleep(MAX_DELAYED_WAKE_MS + 1).rearm_ms(), None, "the sweep wakes it");
        assert_eq!(Refusal::Paused.rearm_ms(), None);
    }
}
