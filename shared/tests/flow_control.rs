//! Flow control through the handlers on the embedded backend: a limited agent's gate lets
//! calls in up to its limit, the rest wait their turn with no failure counted and are
//! woken in arrival order as replies give places back, a place lapses when its holder
//! dies, and a remote's Retry-After pauses the agent.

mod common;

use common::*;
use sas::domain::gate::{CallMark, CallStart, Limits};
use sas::domain::{ProcessState, Timestamp};
use sas::handlers::{Agent, AgentSettings, Scheduler, Submission, Supervisor};
use sas::ports::{CallStarts, Metric, StateStore};

/// The built-in workflows, with the `orders` agent (single-step's) limited so.
fn limited(limits: Limits) -> Harness {
    let mut h = Harness::new();
    h.settings.topology.limits.insert("orders".into(), limits);
    h.scheduler = Scheduler::new(h.deps.clone(), h.settings.clone());
    h.supervisor = Supervisor::new(h.deps.clone(), h.settings.clone());
    // A cancel's hand-back of a ticket goes through the submission function.
    h.submission = Submission::new(h.deps.clone(), h.settings.clone());
    h.agent = Agent::new(
        h.agent.deps.clone(),
        AgentSettings {
            limited: true,
            one_call: limits.max_per_second.is_some(),
            ..AgentSettings::default()
        },
        h.settings.workflows.clone(),
    );
    h
}

/// `h` on a store that bills and throttles each item as DynamoDB does (`capacity`).
fn with_capacity(mut h: Harness) -> Harness {
    h.store = std::sync::Arc::new(sas::adapters::embedded::EmbeddedStore::with_capacity(h.clock.clone()));
    h.deps.store = h.store.clone();
    h.submission = Submission::new(h.deps.clone(), h.settings.clone());
    h.scheduler = Scheduler::new(h.deps.clone(), h.settings.clone());
    h.supervisor = Supervisor::new(h.deps.clone(), h.settings.clone());
    h
}

const TWO: Limits =
    Limits { max_in_flight: Some(2), max_per_second: None, places_per_gate: None, per_key: None };

async fn submit_all(h: &Harness, n: usize) {
    for i in 0..n {
        h.submit(&format!("o-{i}"), "single-step").await;
    }
    all_ok(h.pump_orders().await, n);
}

fn states(h: &Harness, n: usize) -> Vec<ProcessState> {
    (0..n).map(|i| h.task(&format!("o-{i}")).state()).collect()
}

#[tokio::test]
async fn a_burst_is_let_in_up_to_the_limit_and_the_rest_wait_their_turn_in_order() {
    let h = limited(TWO);
    submit_all(&h, 5).await;
    all_ok(h.pump_scheduler().await, 5);
    use ProcessState::*;
    assert_eq!(states(&h, 5), [Processing, Processing, Pending, Pending, Pending]);
    let tickets: Vec<_> = (2..5).map(|i| h.task(&format!("o-{i}")).queued().map(|q| q.ticket)).collect();
    assert_eq!(tickets, [Some(0), Some(1), Some(2)], "tickets in arrival order");
    assert_eq!(h.count(Metric::CapacityQueued), 3);
    assert_eq!(h.depth(AGENT), 2, "only the two let in were dispatched");
    // Nothing waiting counts a failure, and each waits with a deadline.
    for i in 2..5 {
        let t = h.task(&format!("o-{i}"));
        assert_eq!((t.failure_count, t.step_failures, t.attempt), (0, 0, 0));
        assert!(t.deadline().is_some());
    }
    // The calls answer; each reply gives its place back and the same invocation claims
    // the next in line and dispatches its request: no Schedule message between.
    all_ok(h.pump_agent().await, 2);
    all_ok(h.pump_scheduler().await, 2);
    assert_eq!(states(&h, 5), [Processed, Processed, Processing, Processing, Pending], "o-2 and o-3 first");
    assert_eq!(h.count(Metric::HandedOver), 2);
    let bodies = h.queues.bodies(SCHEDULER);
    // Only the gate's planned looks wait there (`Gate::poke_at`).
    assert!(
        bodies.iter().all(|b| b.contains(r#""type":"gate""#)),
        "nobody woken through the queue: {bodies:?}"
    );
    assert_eq!(h.depth(AGENT), 2, "the next two requests are out");
    h.run_until_quiet().await;
    assert_eq!(states(&h, 5), [Processed; 5]);
    let waits = h.metrics().samples.get(&Metric::CapacityWaitMs).map_or(0, Vec::len);
    assert_eq!(waits, 3, "one wait sample per task that waited");
    let gate = h.store.peek_gate("orders").expect("written");
    assert!(gate.holds.is_empty(), "every place given back: {gate:?}");
    assert_eq!((gate.issued, gate.admitted), (3, 3));
}

#[tokio::test]
async fn the_remote_never_sees_more_than_the_limit_at_once() {
    // The agent pump handles every request it finds: only requests of calls that hold a
    // place are ever on the agent's queue, so the calls a pump makes are calls at once.
    let h = limited(TWO);
    submit_all(&h, 7).await;
    let mut most = 0;
    for _ in 0..20 {
        h.pump_scheduler().await;
        most = most.max(h.depth(AGENT));
        h.pump_agent().await;
    }
    assert_eq!(most, 2);
    assert_eq!(states(&h, 7), [ProcessState::Processed; 7]);
}

#[tokio::test]
async fn a_place_whose_holder_died_lapses_and_the_supervisor_moves_the_line_on() {
    let h = limited(Limits {
        max_in_flight: Some(1),
        max_per_second: None,
        places_per_gate: None,
        per_key: None,
    });
    submit_all(&h, 2).await;
    all_ok(h.pump_scheduler().await, 2);
    assert_eq!(states(&h, 2), [ProcessState::Processing, ProcessState::Pending]);
    // The agent dies with the request: no reply ever gives the place back.
    h.drain(AGENT);
    // The holder's attempt lapses and the waiter's deadline comes: the supervisor asks the
    // gate again for the waiter (no failure counted) and retries the lapsed one.
    h.to_deadline("o-1");
    h.advance(1);
    h.sweep().await;
    let waiter = h.task("o-1");
    assert_eq!(waiter.failure_count, 0, "waiting is no failure");
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed, "the waiter got the lapsed place");
    // The lapsed holder's retry comes after its backoff.
    h.advance(h.retry_delay("o-0"));
    h.run_until_quiet().await;
    assert_eq!(states(&h, 2), [ProcessState::Processed; 2]);
    assert_eq!(h.task("o-1").failure_count, 0);
    assert_eq!(h.task("o-0").failure_count, 1, "the dead holder's attempt lapsed once");
}

#[tokio::test]
async fn a_retry_after_hands_the_step_back_and_pauses_the_agent_with_no_failure() {
    let h = limited(TWO);
    submit_all(&h, 1).await;
    h.remote.then([Script::Busy(3_000)]);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    let t = h.task("o-0");
    assert_eq!((t.state(), t.locked_by(), t.failure_count), (ProcessState::Pending, None, 0));
    assert_eq!(h.count(Metric::Throttled), 1);
    assert_eq!(h.remote.calls().len(), 1, "no retry in place");
    let gate = h.store.peek_gate("orders").expect("written");
    assert!(gate.holds.is_empty());
    assert_eq!(gate.paused_until, Some(Timestamp(h.now().0 + 3_000)));
    // The step comes back after the pause and succeeds.
    h.run_until_quiet().await;
    assert_eq!(h.task("o-0").state(), ProcessState::Pending, "not before the pause is over");
    h.advance(3_000);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-0").state(), ProcessState::Processed);
    assert_eq!(h.remote.calls().len(), 2);
    assert!(h.remote.calls()[1].at.0 >= h.remote.calls()[0].at.0 + 3_000, "not before the pause ended");
}

#[tokio::test]
async fn an_agent_without_limits_honours_retry_after_in_place() {
    let h = Harness::new();
    submit_all(&h, 1).await;
    h.remote.then([Script::Busy(1_500)]);
    h.run_until_quiet().await;
    let calls = h.remote.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].at.0 >= calls[0].at.0 + 1_500, "waited the Retry-After, not the shorter backoff");
    assert_eq!(h.task("o-0").state(), ProcessState::Processed);
    assert_eq!(h.count(Metric::Throttled), 0);
    assert!(h.store.peek_gate("orders").is_none(), "no gate for an agent without limits");
}

#[tokio::test]
async fn agents_without_limits_touch_no_gate_even_where_others_have_one() {
    // The three-step workflow's agents are not limited; only `orders` is.
    let h = limited(TWO);
    h.submit("t-1", "three-step").await;
    all_ok(h.pump_orders().await, 1);
    h.run_until_quiet().await;
    assert_eq!(h.task("t-1").state(), ProcessState::Processed);
    for agent in ["inventory", "payment", "shipping", "orders"] {
        assert!(h.store.peek_gate(agent).is_none(), "{agent}");
    }
    assert_eq!(h.count(Metric::CapacityQueued), 0);
}

#[tokio::test]
async fn under_a_rate_limit_calls_spread_over_windows_and_time_alone_lets_the_next_through() {
    let h = limited(Limits {
        max_in_flight: None,
        max_per_second: Some(2),
        places_per_gate: None,
        per_key: None,
    });
    submit_all(&h, 5).await;
    for _ in 0..10 {
        h.run_until_quiet().await;
        // Only time makes room now: the planned look at the gate is a delayed message.
        h.advance(500);
    }
    assert_eq!(states(&h, 5), [ProcessState::Processed; 5]);
    let starts: Vec<u64> = h.remote.calls().iter().map(|c| c.at.0).collect();
    assert_eq!(starts.len(), 5);
    for (i, first) in starts.iter().enumerate() {
        let within = starts[i..].iter().filter(|t| **t < first + 1_000).count();
        assert!(within <= 2, "{within} calls in the second from {first}: {starts:?}");
    }
    assert!(starts[4] - starts[0] < 4_000, "no minute-long stall waiting for the supervisor: {starts:?}");
}

#[tokio::test]
async fn places_spread_over_gates_are_each_held_to_their_share_and_given_back_to_their_own_gate() {
    // 5 places over gates of 2: three gates, holding 2, 2 and 1.
    let spread =
        Limits { max_in_flight: Some(5), max_per_second: None, places_per_gate: Some(2), per_key: None };
    assert_eq!(spread.gates(), 3);
    let h = limited(spread);
    submit_all(&h, 10).await;
    let mut most = 0;
    for _ in 0..60 {
        h.pump_scheduler().await;
        most = most.max(h.depth(AGENT));
        for (k, share) in [(0, 2), (1, 2), (2, 1)] {
            let held = h.store.peek_gate(&format!("orders@{k}")).map_or(0, |g| g.holds.len());
            assert!(held <= share, "gate {k} holds {held} of its {share}");
        }
        h.pump_agent().await;
    }
    assert!(most <= 5, "{most} calls out at once against 5 places");
    assert!(h.count(Metric::CapacityQueued) > 0, "10 orders waited at 5 places");
    h.run_until_quiet().await;
    assert_eq!(states(&h, 10), [ProcessState::Processed; 10]);
    assert!(h.store.peek_gate("orders").is_none(), "the agent's own name holds no gate once spread");
    for k in 0..3 {
        let gate = h.store.peek_gate(&format!("orders@{k}")).expect("each gate was used");
        assert!(gate.holds.is_empty(), "every place given back to its own gate: {gate:?}");
        assert_eq!(gate.issued, gate.admitted, "every ticket of gate {k} had its turn");
    }
}

/// One customer's flood and another's two orders under `max_in_flight: 4` and one call
/// per customer: the flood waits in its own line, the other customer's orders are called
/// while it waits, and the flood never has more than one call at once.
#[tokio::test]
async fn a_keys_flood_waits_in_its_own_line_and_never_holds_more_than_its_share() {
    use sas::domain::gate::{OrderKey, PerKey};
    let per_key = Some(PerKey { key: OrderKey::CustomerId, limit: 1 });
    let h = limited(Limits { max_in_flight: Some(4), per_key, ..Limits::default() });
    let body = |id: &str, customer: &str| {
        Harness::order_body(id, "single-step")
            .replace(r#""customer_id":"c-1""#, &format!(r#""customer_id":"{customer}""#))
    };
    for i in 0..8 {
        h.send(ORDERS, body(&format!("a-{i}"), "A")).await;
    }
    for i in 0..2 {
        h.send(ORDERS, body(&format!("b-{i}"), "B")).await;
    }
    all_ok(h.pump_orders().await, 10);
    let calls = |prefix: &str| {
        h.queues.bodies(AGENT).iter().filter(|b| b.contains(&format!(r#""order_id":"{prefix}"#))).count()
    };
    h.pump_scheduler().await;
    assert_eq!((calls("a-"), calls("b-")), (1, 1), "one call per customer at once");
    let waiting_a = (0..8).filter(|i| h.task(&format!("a-{i}")).queued().is_some()).count();
    assert_eq!(waiting_a, 7, "A's flood waits in its own line");
    let mut b_done_while_a_waits = false;
    for _ in 0..40 {
        assert!(calls("a-") <= 1, "never more than one of A's calls at once");
        h.pump_agent().await;
        h.pump_scheduler().await;
        let a_left = (0..8).filter(|i| h.task(&format!("a-{i}")).state() != ProcessState::Processed).count();
        let b_done = (0..2).all(|i| h.task(&format!("b-{i}")).state() == ProcessState::Processed);
        b_done_while_a_waits |= b_done && a_left >= 5;
    }
    assert!(b_done_while_a_waits, "B's orders are not held behind A's");
    h.run_until_quiet().await;
    for id in (0..8).map(|i| format!("a-{i}")).chain((0..2).map(|i| format!("b-{i}"))) {
        assert_eq!(h.task(&id).state(), ProcessState::Processed, "{id}");
    }
    // Every place given back, in the key gates and the agent's.
    let gate = h.store.peek_gate("orders").expect("written");
    assert!(gate.holds.is_empty(), "{gate:?}");
}

/// A task waiting at its key's gate and cancelled hands its key ticket back: the key's
/// place goes to the next of that key when the call in flight ends, not to nobody.
#[tokio::test]
async fn a_cancel_in_a_keys_line_hands_the_key_ticket_back() {
    use sas::domain::gate::{OrderKey, PerKey};
    let per_key = Some(PerKey { key: OrderKey::CustomerId, limit: 1 });
    let h = limited(Limits { max_in_flight: Some(4), per_key, ..Limits::default() });
    submit_all(&h, 3).await;
    all_ok(h.pump_scheduler().await, 3);
    use ProcessState::*;
    assert_eq!(states(&h, 3), [Processing, Pending, Pending]);
    let key_gate = h.task("o-1").queued().expect("o-1 waits").agent.clone();
    assert!(key_gate.starts_with("orders%"), "in its key's line: {key_gate}");
    h.send(ORDERS, r#"{"cancel":"o-1","reason":"changed my mind"}"#).await;
    all_ok(h.pump_orders().await, 1);
    assert_eq!(h.count(Metric::TicketHandedBack), 1);
    let gate = h.store.peek_gate(&key_gate).expect("the key's gate");
    assert_eq!((gate.admitted, gate.waiting()), (1, 1), "o-1's ticket skipped, o-2's waits");
    h.run_until_quiet().await;
    assert_eq!(h.task("o-2").state(), Processed, "o-2 got the key's place");
    let gate = h.store.peek_gate(&key_gate).expect("the key's gate");
    assert!(gate.holds.is_empty(), "every key place given back: {gate:?}");
}

fn replies(h: &Harness) -> usize {
    h.queues.bodies(SCHEDULER).iter().filter(|b| b.contains(r#""type":"reply""#)).count()
}

/// SQS delivers a request at least once. A copy of a limited agent's request, in the
/// container that took it or in another, is not called and sends no reply: the one call
/// under the place replies and moves the task on. An agent without limits writes no mark.
#[tokio::test]
async fn a_copy_of_a_request_is_never_called_in_this_container_or_another() {
    let h = limited(TWO);
    submit_all(&h, 1).await;
    all_ok(h.pump_scheduler().await, 1);
    let request = h.intercept(AGENT);
    assert_eq!(request.len(), 1);
    // Twice to this container (the copy is dropped here without a write), once to another.
    for _ in 0..2 {
        h.send(AGENT, request[0].clone()).await;
    }
    all_ok(h.pump_agent().await, 2);
    let other = Agent::new(h.agent.deps.clone(), h.agent.agent_settings, h.settings.workflows.clone());
    h.send(AGENT, request[0].clone()).await;
    all_ok(h.pump_with(AGENT, |m| other.handle(m)).await, 1);
    assert_eq!(h.remote.calls().len(), 1, "one call for the one place");
    assert_eq!(replies(&h), 1, "only the call's own request replies");
    assert_eq!(h.store.call_marks().len(), 1);
    assert!(h.store.call_marks()[0].starts_with("call#o-0#1."), "{:?}", h.store.call_marks());
    h.run_until_quiet().await;
    assert_eq!(h.task("o-0").state(), ProcessState::Processed);
    assert_eq!(h.task("o-0").failure_count, 0);

    let free = Harness::new();
    free.submit("o-1", "single-step").await;
    all_ok(free.pump_orders().await, 1);
    free.run_until_quiet().await;
    assert_eq!(free.task("o-1").state(), ProcessState::Processed);
    assert!(free.store.call_marks().is_empty(), "an agent without limits writes no mark");
}

/// A request whose container marked the call and died before calling: its redelivery
/// finds the mark and does not call (the place is held either way). The attempt lapses
/// at its complete-by and the supervisor retries it, under a new mark.
#[tokio::test]
async fn a_request_redelivered_after_its_mark_does_not_call_and_the_supervisor_retries_it() {
    let h = limited(TWO);
    submit_all(&h, 1).await;
    all_ok(h.pump_scheduler().await, 1);
    let task = h.task("o-0");
    let lease = task.locked_by().expect("claimed");
    let complete_by = task.lease().expect("claimed").complete_by;
    let mark = CallMark::new(&task.order_id, task.step, task.attempt, &lease, complete_by);
    assert_eq!(h.store.start_call(&mark).await.unwrap(), CallStart::Started);
    all_ok(h.pump_agent().await, 1);
    assert!(h.remote.calls().is_empty(), "the redelivery does not call");
    assert_eq!(replies(&h), 0);
    h.to_deadline("o-0");
    h.advance(1);
    h.sweep().await;
    h.advance(h.retry_delay("o-0"));
    h.run_until_quiet().await;
    assert_eq!(h.task("o-0").state(), ProcessState::Processed);
    assert_eq!(h.task("o-0").failure_count, 1, "the unused attempt lapsed once");
    assert_eq!(h.remote.calls().len(), 1);
    assert_eq!(h.store.call_marks().len(), 2, "the retry's call under its own mark");
}

/// The state store throttling a Schedule's handling (a hot item in a burst) sends the
/// Schedule again after a backoff instead of leaving it to redelivery, which counts toward
/// the queue's receives and would end in the DLQ; past `MAX_THROTTLED_RESENDS` the queue's
/// redelivery takes over.
#[tokio::test]
async fn a_throttled_schedule_is_sent_again_after_a_backoff_not_redelivered() {
    use sas::domain::SchedulerMessage;
    use sas::domain::retry::MAX_THROTTLED_RESENDS;
    let h = with_capacity(Harness::new());
    h.submit("o-1", "single-step").await;
    all_ok(h.pump_orders().await, 1);
    // Use up the task item's reads for this second: 3,000 read units, 1 a strong read.
    let id = Harness::id("o-1");
    while h.store.task(&id).await.is_ok() {}
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::ScheduleThrottled), 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Pending);
    let again = h.drain(SCHEDULER);
    assert_eq!(again.len(), 1, "the Schedule, sent again");
    assert_eq!(again[0].receive_count, 0, "a new message, not a redelivery");
    let Ok(SchedulerMessage::Schedule { throttled: 1, .. }) = SchedulerMessage::parse(&again[0].body) else {
        panic!("sent again once: {}", again[0].body)
    };
    // Sent again too often: left for redelivery, whose receives the queue counts.
    let spent =
        SchedulerMessage::Schedule { order_id: id.clone(), turn: None, throttled: MAX_THROTTLED_RESENDS };
    h.send(SCHEDULER, spent.to_body()).await;
    let results = h.pump_scheduler().await;
    assert!(matches!(results[..], [Err(sas::handlers::HandlerError::Throttled(_))]), "{results:?}");
    assert_eq!(h.count(Metric::ScheduleThrottled), 1);
    // Once the item's second has passed, the Schedule sent again claims the task.
    h.advance(1_000);
    h.send(SCHEDULER, again[0].body.clone()).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);
}

/// A Schedule the store throttles at its agent's gate (one hot item in a burst) moves the
/// task's deadline out past the backoff its resend waits, so the supervisor counts no
/// failure for a wait that was the store's; the Schedule sent again then claims.
#[tokio::test]
async fn a_schedule_throttled_at_the_gate_moves_its_deadline_past_the_backoff() {
    use sas::domain::Cause;
    use sas::domain::gate::Gate;
    let h = with_capacity(limited(TWO));
    h.submit("o-1", "single-step").await;
    all_ok(h.pump_orders().await, 1);
    let first_deadline = h.task("o-1").deadline().expect("a deadline");
    // Use up the gate item's writes for this second; the task item's are left.
    let mut gate = Gate::new("orders");
    loop {
        let next = Gate { revision: gate.revision + 1, ..gate.clone() };
        if h.store.replace_gate(&next, gate.revision).await.is_err() {
            break;
        }
        gate = next;
    }
    h.advance(100);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::ScheduleThrottled), 1);
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Pending);
    assert!(matches!(task.last_cause, Cause::StoreThrottled { step: 0, .. }), "{:?}", task.last_cause);
    assert!(task.deadline().expect("a deadline") > first_deadline.plus_ms(60_000), "moved past the backoff");
    let again = h.drain(SCHEDULER);
    assert_eq!(again.len(), 1, "sent again");
    // The first deadline passes while the Schedule waits: nothing is due.
    h.at(first_deadline.plus_ms(1));
    h.sweep().await;
    assert_eq!(h.task("o-1").failure_count, 0, "no lapse counted");
    assert!(h.drain(SCHEDULER).is_empty(), "the supervisor sent nothing");
    h.send(SCHEDULER, again[0].body.clone()).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);
    assert_eq!(h.task("o-1").failure_count, 0);
}

/// A claim whose write the store throttles gives its place back at once (the record, read
/// again, shows it did not land) instead of holding it until it lapses, and its Schedule
/// is sent again after a backoff; once the item's second has passed, it claims.
#[tokio::test]
async fn a_throttled_claim_write_gives_its_place_back() {
    let one = Limits { max_in_flight: Some(1), ..TWO };
    let h = with_capacity(limited(one));
    h.submit("o-1", "single-step").await;
    all_ok(h.pump_orders().await, 1);
    // Use up the task item's writes for this second (a write refused on its condition is
    // billed as one that lands); its reads are left.
    let task = h.task("o-1");
    while h.store.replace(&task, task.revision + 7).await.is_ok() {}
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::ScheduleThrottled), 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Pending);
    let gate = h.store.peek_gate("orders").expect("the gate");
    assert!(gate.holds.is_empty(), "the place went back: {:?}", gate.holds);
    let again = h.drain(SCHEDULER);
    assert_eq!(again.len(), 1, "sent again");
    h.advance(1_000);
    h.send(SCHEDULER, again[0].body.clone()).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);
}
