//! Flow control on the task's side: a step whose agent has no room waits its turn in
//! the agent's gate (`domain::gate`), and a remote that says "too many requests" puts the
//! step back to wait. Waiting is no failure: nothing here counts one.

use super::draft::Draft;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::record::Decision;
use crate::domain::gate::{Ticket, agent_of_gate};
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::retry::THROTTLED_SCHEDULE;

/// The longest a waiting task goes without the supervisor asking its gate again.
pub const MAX_RECHECK_MS: u64 = 15 * 60 * 1_000;

impl Draft {
    /// Scheduler: the step's agent had no room and handed out `ticket`. The task waits
    /// with no lease; its deadline is when the supervisor asks the gate again should no
    /// wake come (`requeue`).
    pub fn queue(
        &self,
        agent: &str,
        ticket: u64,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_queue(agent, ticket, now, policy), None)
    }

    fn decide_queue(
        &self,
        agent: &str,
        ticket: u64,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        if self.locked_by.is_some()
            || !matches!(self.state, ProcessState::Pending | ProcessState::Compensating)
        {
            return Err(Refusal::ClaimLost { state: self.state, locked: self.locked_by.is_some() });
        }
        if self.paused {
            return Err(Refusal::Paused);
        }
        // The wait is measured from the first arrival at this step's gate, across tickets
        // (and from its key gate's to the agent's: `gate::key_gate_of`).
        let same_agent = |q: &Ticket| agent_of_gate(&q.agent) == agent_of_gate(agent);
        let since = match &self.queued {
            Some(q) if same_agent(q) && self.last_cause.step() == Some(self.step) => q.since,
            _ => now,
        };
        let mut next = self.moved(Trigger::Queued, now, Cause::Queued { step: self.step, ticket })?;
        next.queued = Some(Ticket { agent: agent.to_owned(), ticket, since });
        // The supervisor's ask is the safety net (wakes and looks at the gate move the
        // line): the longer a task has waited, the less often it is asked about.
        let recheck = now.millis_since(since).clamp(policy.pending_timeout_ms, MAX_RECHECK_MS);
        next.deadline = Some(now.plus_ms(recheck));
        Ok(Decision { trigger: Trigger::Queued, next, effects: Vec::new() })
    }

    /// Scheduler: the state store throttled the claim's way through the gate (the gate is
    /// one hot item), and the Schedule is sent again after a backoff of up to
    /// `THROTTLED_SCHEDULE`'s cap. A task not yet in line would pass its deadline while it
    /// waits, and the supervisor would count that lapse against the step: store pressure
    /// spending an order's failure budget. So its deadline moves out past the longest
    /// backoff (twice, so a run of throttles writes about once a minute at most), no
    /// failure counted. Refused when the deadline is far enough off already (the longest
    /// backoff and a pending timeout away), and for a task in line (its lapse asks the
    /// gate again and counts nothing) or paused.
    pub fn defer(&self, now: Timestamp, policy: &Policy) -> Result<Decision<Draft>, Refusal> {
        self.logged(now, self.decide_defer(now, policy), None)
    }

    fn decide_defer(&self, now: Timestamp, policy: &Policy) -> Result<Decision<Draft>, Refusal> {
        if self.locked_by.is_some()
            || !matches!(self.state, ProcessState::Pending | ProcessState::Compensating)
        {
            return Err(Refusal::ClaimLost { state: self.state, locked: self.locked_by.is_some() });
        }
        if self.paused {
            return Err(Refusal::Paused);
        }
        // The longest backoff, and the pending timeout's room for the queue and the claim.
        let far_enough = now.plus_ms(THROTTLED_SCHEDULE.cap_ms + policy.pending_timeout_ms);
        if self.queued.is_some() || self.deadline.is_some_and(|d| d >= far_enough) {
            return Err(Refusal::NotDue { deadline: self.deadline, now });
        }
        let cause = Cause::StoreThrottled { step: self.step, action: self.action() };
        let mut next = self.moved(Trigger::Throttled, now, cause)?;
        let past_backoff =
            if crate::mutations::store_wait_short() { 0 } else { 2 * THROTTLED_SCHEDULE.cap_ms };
        let deadline = now.plus_ms(past_backoff + policy.pending_timeout_ms);
        next.deadline = Some(deadline);
        next.last_error = Some(format!(
            "the state store throttled the claim; tried again after a backoff, no failure counted before {}",
            deadline.to_rfc3339()
        ));
        Ok(Decision { trigger: Trigger::Throttled, next, effects: Vec::new() })
    }

    /// Supervisor: a task waiting for a place is due (its wake never came, or the line is
    /// long): it keeps its ticket, and a Schedule asks the gate again. A gate whose places
    /// were all held by containers that died moves on at that ask.
    pub(in crate::domain) fn requeue(
        &self,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let Some(queued) = self.queued.clone() else {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: "not waiting for a place".into(),
            });
        };
        let decision = self.decide_queue(&queued.agent, queued.ticket, now, policy).map(|mut d| {
            d.next.queued = Some(queued);
            d.effects.push(Effect::Schedule { delay_ms: 0 });
            d
        });
        self.logged(now, decision, None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::outcome::Act;
    use super::*;
    use crate::domain::ReplyOutcome;
    use crate::domain::gate::MAX_PAUSE_MS;
    use crate::domain::workflow::Workflow;

    #[test]
    fn a_task_over_its_agents_limit_waits_with_a_ticket_and_no_failure() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let task = new_task(&wf);
        let d = checked(&task, task.queue("pay", 7, T0.plus_ms(10), &policy));
        assert_eq!(d.trigger, Trigger::Queued);
        assert_eq!(d.next.state(), ProcessState::Pending);
        assert_eq!(d.next.queued(), Some(&Ticket { agent: "pay".into(), ticket: 7, since: T0.plus_ms(10) }));
        assert_eq!((d.next.failure_count, d.next.step_failures), (0, 0));
        assert_eq!(d.next.deadline(), Some(T0.plus_ms(10 + policy.pending_timeout_ms)));
        assert!(d.effects.is_empty());
        // Asked again with a new ticket, the wait still counts from the first arrival.
        let again = checked(&d.next, d.next.queue("pay", 9, T0.plus_ms(50), &policy));
        assert_eq!(again.next.queued().map(|q| (q.ticket, q.since)), Some((9, T0.plus_ms(10))));
        // The claim ends the wait.
        let claim = checked(&again.next, again.next.claim(lease(1), T0.plus_ms(60), &wf, &policy));
        assert_eq!(claim.next.queued(), None);
    }

    #[test]
    fn a_paused_or_claimed_task_does_not_queue() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let task = new_task(&wf);
        let claimed = task.claim(lease(1), T0.plus_ms(1), &wf, &policy).unwrap().next;
        assert!(matches!(claimed.queue("pay", 0, T0.plus_ms(2), &policy), Err(Refusal::ClaimLost { .. })));
        let mut paused = task.draft();
        paused.paused = true;
        let paused = paused.build().unwrap();
        assert_eq!(paused.queue("pay", 0, T0.plus_ms(2), &policy).unwrap_err(), Refusal::Paused);
    }

    /// The store's throttle moves a task's deadline past the longest backoff its Schedule
    /// waits, no failure counted; once it is far enough off, a throttle writes nothing.
    #[test]
    fn a_claim_the_store_throttles_moves_the_deadline_past_the_backoff_and_counts_nothing() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let task = new_task(&wf);
        let d = checked(&task, task.defer(T0.plus_ms(5), &policy));
        assert_eq!((d.trigger, d.next.state()), (Trigger::Throttled, ProcessState::Pending));
        assert_eq!(d.next.last_cause, Cause::StoreThrottled { step: 0, action: crate::domain::Action::Do });
        let far = T0.plus_ms(5 + 2 * THROTTLED_SCHEDULE.cap_ms + policy.pending_timeout_ms);
        assert_eq!(d.next.deadline(), Some(far));
        assert_eq!((d.next.failure_count, d.next.step_failures), (0, 0));
        assert!(d.effects.is_empty(), "the scheduler sends the Schedule again itself");
        // Throttled again within the backoff's cap: the deadline is far enough off.
        let later = T0.plus_ms(5 + THROTTLED_SCHEDULE.cap_ms);
        assert!(matches!(d.next.defer(later, &policy), Err(Refusal::NotDue { .. })));
        // Past it, moved again.
        let again = checked(&d.next, d.next.defer(later.plus_ms(THROTTLED_SCHEDULE.cap_ms), &policy));
        assert!(again.next.deadline() > d.next.deadline());
        // A task in line lapses into asking its gate again, counting nothing: left alone.
        let queued = task.queue("pay", 3, T0, &policy).unwrap().next;
        assert!(matches!(queued.defer(T0.plus_ms(5), &policy), Err(Refusal::NotDue { .. })));
        // Claimed or paused: nothing to defer.
        let claimed = task.claim(lease(1), T0.plus_ms(1), &wf, &policy).unwrap().next;
        assert!(matches!(claimed.defer(T0.plus_ms(5), &policy), Err(Refusal::ClaimLost { .. })));
        let mut paused = task.draft();
        paused.paused = true;
        assert_eq!(paused.build().unwrap().defer(T0.plus_ms(5), &policy).unwrap_err(), Refusal::Paused);
    }

    #[test]
    fn the_supervisor_asks_the_gate_again_for_a_due_waiting_task_keeping_its_ticket() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let task = new_task(&wf);
        let queued = task.queue("pay", 3, T0.plus_ms(10), &policy).unwrap().next;
        let due = queued.deadline().unwrap();
        let d = checked(&queued, queued.recover(due, &wf, &policy, 0));
        assert_eq!(d.trigger, Trigger::Queued);
        assert_eq!(d.next.queued().map(|q| (q.ticket, q.since)), Some((3, T0.plus_ms(10))));
        assert_eq!(d.next.failure_count, 0);
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: 0 }]);
        assert!(d.next.deadline().unwrap() > due);
    }

    fn hand_backs(d: &Decision) -> Vec<&Ticket> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::HandBack(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn leaving_the_line_without_taking_the_turn_hands_the_ticket_back() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let queued = new_task(&wf).queue("pay", 4, T0.plus_ms(10), &policy).unwrap().next;
        let ticket = queued.queued().unwrap().clone();
        // A cancel leaves the line: the ticket goes back.
        let cancelled = act(&queued, &wf, Act::Cancel);
        assert_eq!(cancelled.next.queued(), None);
        assert_eq!(hand_backs(&cancelled), vec![&ticket]);
        // A new ticket in place of a lapsed one hands the old one back.
        let again = checked(&queued, queued.queue("pay", 9, T0.plus_ms(20), &policy));
        assert_eq!(hand_backs(&again), vec![&ticket]);
        // Staying in line hands nothing back: a pause keeps the ticket for the resume, and
        // the supervisor asks the gate again with it.
        let paused = act(&queued, &wf, Act::Pause);
        assert_eq!((paused.next.queued(), hand_backs(&paused).len()), (Some(&ticket), 0));
        let resumed = act(&paused.next, &wf, Act::Resume);
        assert_eq!((resumed.next.queued(), hand_backs(&resumed).len()), (Some(&ticket), 0));
        let due = queued.recover(queued.deadline().unwrap(), &wf, &policy, 0).unwrap();
        assert!(hand_backs(&due).is_empty());
        // The claim takes its turn with the ticket: its place is the call's now.
        let claim = checked(&queued, queued.claim(lease(1), T0.plus_ms(30), &wf, &policy));
        assert!(hand_backs(&claim).is_empty());
    }

    #[test]
    fn a_throttled_reply_hands_the_lease_back_and_tries_again_after_the_pause() {
        let (wf, policy) = (Workflow::three_step(), policy());
        let task = new_task(&wf);
        let claimed = task.claim(lease(1), T0.plus_ms(1), &wf, &policy).unwrap().next;
        let reply = reply_for(&claimed, ReplyOutcome::Throttled { retry_after_ms: 2_000 });
        let d = checked(&claimed, claimed.apply_reply(&reply, T0.plus_ms(5), &wf, &policy));
        assert_eq!(d.trigger, Trigger::Throttled);
        assert_eq!(
            (d.next.state(), d.next.locked_by(), d.next.failure_count),
            (ProcessState::Pending, None, 0)
        );
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: 2_000 }]);
        // No tight loop: a worker's `retry_after_ms: 0` waits the floor, and so does its gate.
        let now = reply_for(&claimed, ReplyOutcome::Throttled { retry_after_ms: 0 });
        let d0 = checked(&claimed, claimed.apply_reply(&now, T0.plus_ms(5), &wf, &policy));
        assert_eq!(d0.effects, vec![Effect::Schedule { delay_ms: crate::domain::gate::MIN_PAUSE_MS }]);
        let limits = [(
            wf.steps[0].agent.clone(),
            crate::domain::gate::Limits {
                max_in_flight: Some(1),
                max_per_second: None,
                places_per_gate: None,
                per_key: None,
            },
        )];
        let freed =
            crate::domain::task::freed_by(&now, &wf, &claimed.order, &limits.into_iter().collect()).unwrap();
        assert_eq!(freed.pause_ms, Some(crate::domain::gate::MIN_PAUSE_MS));
        // A late copy of the same reply is fenced off.
        assert!(matches!(
            d.next.apply_reply(&reply, T0.plus_ms(6), &wf, &policy),
            Err(Refusal::StaleReply(_))
        ));
    }

    /// Throttled again and again, a step gives up once the remote has asked it to wait
    /// longer in all than its budget, as for a spent failure budget: an alert, and the
    /// undo of what may have taken effect: the step itself too (a copy of its request may
    /// have reached the service), and not before its attempt's complete-by.
    #[test]
    fn a_step_throttled_past_its_budget_gives_up_and_tells_an_operator() {
        use crate::domain::workflow::Step;
        let policy = policy();
        let wf = Workflow::new(
            "w",
            vec![
                Step::compensable("reserve", "inventory", "release").with_max_throttled_ms(5_000),
                Step::pivot("pay", "pay"),
            ],
        );
        let throttled = |task: &crate::domain::TaskRecord, now: Timestamp| {
            let claimed = checked(task, task.claim(lease(u128::from(now.0)), now, &wf, &policy)).next;
            let reply = reply_for(&claimed, ReplyOutcome::Throttled { retry_after_ms: 2_000 });
            checked(&claimed, claimed.apply_reply(&reply, now.plus_ms(1), &wf, &policy))
        };
        let first = throttled(&new_task(&wf), T0);
        assert_eq!((first.trigger, first.next.step_throttled_ms), (Trigger::Throttled, 2_000));
        let second = throttled(&first.next, T0.plus_ms(3_000));
        assert_eq!((second.trigger, second.next.step_throttled_ms), (Trigger::Throttled, 4_000));
        // A third pause would make 6 s of the 5 allowed.
        let third = throttled(&second.next, T0.plus_ms(6_000));
        assert_eq!(
            (third.trigger, third.next.state(), third.next.step),
            (Trigger::Undo, ProcessState::Compensating, 0)
        );
        let complete_by = T0.plus_ms(6_000 + policy.step_timeout_ms);
        assert_eq!(third.next.hold_until(), Some(complete_by), "held for the attempt's complete-by");
        assert!(matches!(
            third.next.claim(lease(7), T0.plus_ms(6_002), &wf, &policy),
            Err(Refusal::Held { .. })
        ));
        assert_eq!(alerts(&third).len(), 1, "an operator is told");
        assert!(third.next.last_error.as_deref().is_some_and(|e| e.contains("throttle budget spent")));
        // Nothing counts against the next step: it starts with its whole budget.
        let claimed = checked(&first.next, first.next.claim(lease(9), T0.plus_ms(3_000), &wf, &policy)).next;
        let done = reply(&claimed, &wf, ok(), T0.plus_ms(3_001)).next;
        assert_eq!((done.step, done.step_throttled_ms), (1, 0));
    }

    /// A compensation throttled past its budget stops in Error, as one out of failures does.
    #[test]
    fn an_undo_throttled_past_its_budget_stops_in_error() {
        let policy = policy();
        let wf = three_step_failing();
        let failed = error_at_ship(&wf);
        let undoing = checked(&failed, failed.act(Act::Compensate, OPS, T0, &wf, &policy)).next;
        assert_eq!(undoing.state(), ProcessState::Compensating);
        let mut task = undoing;
        let mut now = T0;
        loop {
            now = now.plus_ms(60_000);
            let claimed = checked(&task, task.claim(lease(u128::from(now.0)), now, &wf, &policy)).next;
            let reply = reply_for(&claimed, ReplyOutcome::Throttled { retry_after_ms: MAX_PAUSE_MS });
            let d = checked(&claimed, claimed.apply_reply(&reply, now.plus_ms(1), &wf, &policy));
            if d.trigger != Trigger::Throttled {
                assert_eq!((d.trigger, d.next.state()), (Trigger::Fail, ProcessState::Error));
                assert!(task.step_throttled_ms + MAX_PAUSE_MS > wf.max_throttled_ms(task.step));
                break;
            }
            assert!(d.next.step_throttled_ms <= wf.max_throttled_ms(d.next.step));
            task = d.next;
        }
    }
}
