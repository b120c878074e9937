//! Flow control through the handlers on the embedded backend: a limited agent's gate lets
//! calls in up to its limit, the rest wait their turn with no failure counted and are
//! woken in arrival order as replies give places back, a place lapses when its holder
//! dies, and a remote's Retry-After pauses the agent.

mod common;

use common::*;
use sas::domain::gate::{CallMark, CallStart, Limits};
use sas::domain::{ProcessState, Timestamp};
use sas::handlers::{Agent, AgentSettings, Scheduler, Supervisor};
use sas::ports::{CallStarts, Metric};

/// The built-in workflows, with the `orders` agent (single-step's) limited so.
fn limited(limits: Limits) -> Harness {
    let mut h = Harness::new();
    h.settings.topology.limits.insert("orders".into(), limits);
    h.scheduler = Scheduler::new(h.deps.clone(), h.settings.clone());
    h.supervisor = Supervisor::new(h.deps.clone(), h.settings.clone());
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

const TWO: Limits = Limits { max_in_flight: Some(2), max_per_second: None };

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
    let h = limited(Limits { max_in_flight: Some(1), max_per_second: None });
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
    let h = limited(Limits { max_in_flight: None, max_per_second: Some(2) });
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
