//! The four handlers on the embedded backend, one script per failure path of the flow in
//! docs/ARCHITECTURE.md ("Bird's eye view").
//! Time is a manual clock and every message moves only when a test pumps it.

mod common;

use common::*;
use sas::domain::{Action, Cause, MAX_BODY_BYTES, OrderStatus, ProcessState, SchedulerMessage, Timestamp};
use sas::handlers::{HandlerError, Inbound, REASON_ATTRIBUTE};
use sas::ports::{Metric, StateStore};

const SINGLE: &str = "single-step";
const THREE: &str = "three-step";

fn retry_error(results: &[Result<(), HandlerError>]) -> bool {
    results.len() == 1 && matches!(results[0], Err(HandlerError::Retry(_)))
}

/// Runs a task that sits Pending with a delayed Schedule (after a supervisor retry) on to
/// its next claim.
async fn reclaim(h: &Harness, id: &str) {
    let delay = h.retry_delay(id);
    assert!(delay > 0);
    assert!(h.pump_scheduler().await.is_empty(), "the retry's Schedule is delayed");
    h.advance(delay);
    all_ok(h.pump_scheduler().await, 1);
}

// ---- the happy paths ----

#[tokio::test]
async fn happy_path_single_step() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Pending);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);
    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);

    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Processed);
    assert_eq!((task.attempt, task.failure_count, task.deadline()), (1, 0, None));
    assert_eq!(h.status_kinds(), vec![OrderStatus::Received, OrderStatus::Processed]);
    let calls = h.remote.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].key.0, "o-1:0:do");
    assert_eq!((calls[0].agent.as_str(), calls[0].step_name.as_str()), ("orders", "process-order"));
    assert_eq!(h.count(Metric::Processed), 1);
    assert_eq!(h.metrics().samples[&Metric::OrderLatencyMs].len(), 1);
    assert!(h.alerts.all().is_empty());
    for q in [ORDERS, SCHEDULER, AGENT, ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ] {
        assert_eq!(h.depth(q), 0, "{q}");
    }
    h.finish();
}

#[tokio::test]
async fn happy_path_three_step() {
    let h = Harness::new();
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (1, Action::Do), (2, Action::Do)]);
    let names: Vec<_> = h.remote.calls().into_iter().map(|c| (c.agent, c.step_name)).collect();
    assert_eq!(
        names,
        [("inventory", "reserve-inventory"), ("payment", "charge-payment"), ("shipping", "ship-order")]
            .map(|(a, n)| (a.to_owned(), n.to_owned()))
    );
    let statuses = h.statuses();
    let kinds: Vec<_> = statuses.iter().map(|s| (s.status, s.step.as_deref())).collect();
    assert_eq!(
        kinds,
        vec![
            (OrderStatus::Received, None),
            (OrderStatus::StepCompleted, Some("reserve-inventory")),
            (OrderStatus::StepCompleted, Some("charge-payment")),
            (OrderStatus::Processed, Some("ship-order")),
        ]
    );
    assert!(statuses.iter().all(|s| s.order_id.as_ref().map(|o| o.as_str()) == Some("o-1")));
    assert_eq!(h.count(Metric::StepSucceeded), 3);
    assert_eq!(h.metrics().samples[&Metric::StepLatencyMs].len(), 3);
    h.finish();
}

// ---- agent timeout ----

#[tokio::test]
async fn agent_retries_transient_errors_within_its_attempt_with_the_same_key() {
    let h = Harness::new();
    h.remote.then([Script::Transient, Script::Transient, Script::Ok]);
    h.submit("o-1", SINGLE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.task("o-1").attempt, 1, "retries inside one attempt are the agent's business");
    let calls = h.remote.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.key.0 == "o-1:0:do"));
    assert!(calls.windows(2).all(|w| w[0].at < w[1].at), "the agent backs off between calls");
    assert_eq!(h.count(Metric::AgentRetry), 2);
    h.finish();
}

#[tokio::test]
async fn agent_timeout_replies_nothing_and_the_supervisor_retries() {
    let h = Harness::new();
    h.remote.then([Script::Hang]);
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    let claimed = h.task("o-1");
    let complete_by = claimed.complete_by().unwrap();

    // The remote call hangs past complete-by: the agent stops and says nothing.
    all_ok(h.pump_agent().await, 1);
    assert!(h.now() > complete_by);
    assert_eq!(h.depth(SCHEDULER), 0, "no reply");
    assert_eq!(h.count(Metric::AgentGaveUp), 1);

    // Within the reply grace the task is still the lease holder's.
    let early = h.sweep().await;
    assert_eq!((early.examined, early.retried), (0, 0));
    assert_eq!(h.task("o-1"), claimed);

    h.to_deadline("o-1");
    let sweep = h.sweep().await;
    assert_eq!((sweep.examined, sweep.retried, sweep.gave_up), (1, 1, 0));
    let retried = h.task("o-1");
    assert_eq!(retried.state(), ProcessState::Pending);
    assert_eq!((retried.failure_count, retried.locked_by()), (1, None));
    assert_eq!(h.count(Metric::Recovered), 1);

    reclaim(&h, "o-1").await;
    assert_eq!(h.task("o-1").attempt, 2);
    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);

    let done = h.task("o-1");
    assert_eq!((done.state(), done.failure_count, done.attempt), (ProcessState::Processed, 1, 2));
    let calls = h.remote.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].key, calls[1].key, "the same key on every attempt of the step");
    assert_eq!(h.status_kinds(), vec![OrderStatus::Received, OrderStatus::Processed]);
    h.finish();
}

/// `cargo lambda watch`'s runtime emulator gives every invocation the deadline
/// `Lambda-Runtime-Deadline-Ms: 600000`, 600 s after the epoch. A deadline already past when
/// the handling starts is not a real one: the agent must not give up on it, or no order
/// ever completes there. A real deadline, in the future, still bounds the attempt.
#[tokio::test]
async fn agent_ignores_an_invocation_deadline_already_past_but_honours_a_real_one() {
    use sas::domain::Timestamp;
    let h = Harness::new();
    for id in ["o-1", "o-2"] {
        h.submit(id, SINGLE).await;
    }
    all_ok(h.pump_orders().await, 2);
    all_ok(h.pump_scheduler().await, 2);
    let complete_by = h.task("o-1").complete_by().unwrap();

    // The emulator's deadline, and one that ends exactly now: both ignored, so each
    // request is called and answered within its complete-by.
    let emulator = Timestamp(600_000);
    let now = h.now();
    let deadlines = std::sync::Mutex::new(vec![emulator, now]);
    let results = h
        .pump_with(AGENT, |m| {
            let deadline = deadlines.lock().unwrap().pop();
            h.agent.handle_until(m, deadline)
        })
        .await;
    all_ok(results, 2);
    assert_eq!(h.remote.calls().len(), 2, "both requests were called");
    assert_eq!(h.count(Metric::AgentGaveUp), 0);
    all_ok(h.pump_scheduler().await, 2);
    for id in ["o-1", "o-2"] {
        assert_eq!(h.task(id).state(), ProcessState::Processed, "{id}");
    }
    assert!(h.now() < complete_by);

    // A real deadline 1.5 s ahead, inside the reply margin: complete-by is clamped to it,
    // so the agent calls nothing and replies nothing (the supervisor owns the task).
    h.submit("o-3", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    let real = Timestamp(h.now().0 + 1_500);
    all_ok(h.pump_with(AGENT, |m| h.agent.handle_until(m, Some(real))).await, 1);
    assert_eq!(h.remote.calls().len(), 2, "no call for o-3");
    assert_eq!(h.count(Metric::AgentGaveUp), 1);
    assert_eq!(h.depth(SCHEDULER), 0, "no reply");
    assert_eq!(h.task("o-3").state(), ProcessState::Processing);
    h.finish();
}

// ---- agent crash ----

#[tokio::test]
async fn agent_crash_before_handling_redelivers_the_same_request() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);

    // The agent receives the request and dies before doing anything.
    let lost = h.queues.receive(AGENT, 10).unwrap();
    assert_eq!(lost.len(), 1);
    assert!(h.queues.receive(AGENT, 10).unwrap().is_empty(), "invisible while in flight");

    // After the visibility timeout the same message comes back, lease still live.
    h.advance(AGENT_VISIBILITY_MS);
    let again = h.queues.receive(AGENT, 10).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message.message_id, lost[0].message.message_id);
    assert_eq!(again[0].message.body, lost[0].message.body);
    assert_eq!(again[0].message.receive_count, 2);
    assert!(h.now() < h.task("o-1").complete_by().unwrap());

    h.remote.then([Script::Transient, Script::Ok]);
    let m = &again[0].message;
    h.agent
        .handle(Inbound {
            message_id: m.message_id.clone(),
            body: m.body.clone(),
            receive_count: 2,
            sender: m.sender.clone(),
        })
        .await
        .unwrap();
    h.queues.delete(AGENT, &again[0].receipt);
    all_ok(h.pump_scheduler().await, 1);

    let task = h.task("o-1");
    assert_eq!((task.state(), task.attempt, task.failure_count), (ProcessState::Processed, 1, 0));
    let keys: Vec<_> = h.remote.calls().into_iter().map(|c| c.key.0).collect();
    assert_eq!(keys, vec!["o-1:0:do", "o-1:0:do"]);
    h.finish();
}

#[tokio::test]
async fn agent_crash_after_the_remote_call_keeps_the_key_across_redeliveries_and_attempts() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    let complete_by = h.task("o-1").complete_by().unwrap();

    // The remote call succeeds but the agent dies before its reply is out (twice).
    for _ in 0..2 {
        h.queues.fail_next_sends(SCHEDULER, 1);
        assert!(retry_error(&h.pump_agent().await));
        assert_eq!(h.depth(SCHEDULER), 0);
        h.advance(AGENT_VISIBILITY_MS);
    }
    assert_eq!(h.remote.calls().len(), 2);

    // The third delivery comes after complete-by: the agent does nothing at all.
    h.at(complete_by);
    all_ok(h.pump_agent().await, 1);
    assert_eq!(h.remote.calls().len(), 2);
    assert_eq!(h.depth(AGENT), 0);

    // The supervisor takes the task back and a new attempt finishes it.
    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);

    let task = h.task("o-1");
    assert_eq!((task.state(), task.attempt, task.failure_count), (ProcessState::Processed, 2, 1));
    let calls = h.remote.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.key == calls[0].key), "{calls:?}");
    assert_eq!(h.count(Metric::StaleReply), 0);
    h.finish();
}

// ---- permanent error ----

#[tokio::test]
async fn permanent_error_in_a_single_step_workflow_is_an_error_with_an_alert() {
    let h = Harness::new();
    h.remote.then([Script::Permanent("card declined")]);
    h.submit("o-1", SINGLE).await;
    h.run_until_quiet().await;

    let task = h.task("o-1");
    assert_eq!((task.state(), task.deadline()), (ProcessState::Error, None));
    assert_eq!(h.remote.calls().len(), 1, "a permanent error is not retried");
    let alerts = h.alerts.all();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].order_id.as_str(), "o-1");
    assert_eq!(alerts[0].state, ProcessState::Error);
    assert!(alerts[0].reason.contains("card declined"), "{}", alerts[0].reason);
    let statuses = h.statuses();
    assert_eq!(statuses.last().unwrap().status, OrderStatus::Failed);
    assert!(statuses.last().unwrap().reason.as_deref().unwrap().contains("card declined"));
    assert_eq!(h.count(Metric::Failed), 1);

    // Terminal: the supervisor never sees it again.
    h.advance(10 * 60_000);
    assert_eq!(h.sweep().await.examined, 0);
    assert_eq!(h.alerts.all().len(), 1);
    h.finish();
}

#[tokio::test]
async fn permanent_error_at_the_last_step_compensates_in_reverse_order() {
    let h = Harness::new();
    h.remote.then([Script::Ok, Script::Ok, Script::Permanent("address rejected")]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    assert_eq!(
        h.remote.steps(),
        vec![(0, Action::Do), (1, Action::Do), (2, Action::Do), (1, Action::Undo), (0, Action::Undo)]
    );
    let undo: Vec<_> = h.remote.calls()[3..].iter().map(|c| (c.step_name.clone(), c.key.0.clone())).collect();
    assert_eq!(
        undo,
        [("refund-payment", "o-1:1:undo"), ("release-inventory", "o-1:0:undo")]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let kinds: Vec<_> = h.statuses().into_iter().map(|s| (s.status, s.step)).collect();
    let step = |s: &str| Some(s.to_owned());
    assert_eq!(
        kinds,
        vec![
            (OrderStatus::Received, None),
            (OrderStatus::StepCompleted, step("reserve-inventory")),
            (OrderStatus::StepCompleted, step("charge-payment")),
            (OrderStatus::Compensating, step("ship-order")),
            (OrderStatus::StepUndone, step("refund-payment")),
            (OrderStatus::Compensated, step("release-inventory")),
        ]
    );
    // The write log agrees: each undone step exactly once, newest first.
    let undone: Vec<u32> = h
        .history("o-1")
        .iter()
        .filter_map(|t| match t.last_cause {
            Cause::Succeeded { step, action: Action::Undo } => Some(step),
            _ => None,
        })
        .collect();
    assert_eq!(undone, vec![1, 0]);
    assert!(h.alerts.all().is_empty(), "compensating is the planned outcome");
    assert_eq!(h.count(Metric::CompensationStarted), 1);
    assert_eq!(h.count(Metric::CompensationStep), 2);
    assert_eq!(h.count(Metric::Compensated), 1);
    h.finish();
}

#[tokio::test]
async fn permanent_error_at_the_middle_step_undoes_only_the_first() {
    let h = Harness::new();
    h.remote.then([Script::Ok, Script::Permanent("card declined")]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (1, Action::Do), (0, Action::Undo)]);
    h.finish();
}

#[tokio::test]
async fn permanent_error_at_the_first_step_has_nothing_to_undo() {
    let h = Harness::new();
    h.remote.then([Script::Permanent("out of stock")]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do)]);
    assert_eq!(h.status_kinds().last(), Some(&OrderStatus::Compensated));
    h.finish();
}

#[tokio::test]
async fn compensation_failure_is_an_error_with_an_alert() {
    let h = Harness::new();
    h.remote.then([
        Script::Ok,
        Script::Ok,
        Script::Permanent("address rejected"),
        Script::Permanent("refund refused"),
    ]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Error);
    assert_eq!(h.remote.steps().last(), Some(&(1, Action::Undo)), "release is never attempted");
    let alerts = h.alerts.all();
    assert_eq!(alerts.len(), 1);
    assert!(alerts[0].reason.contains("compensation refund-payment failed: refund refused"), "{alerts:?}");
    assert_eq!(alerts[0].subject(), "sas: order o-1 Error at step refund-payment");
    assert_eq!(h.status_kinds().last(), Some(&OrderStatus::Failed));
    h.finish();
}

// ---- duplicate messages ----

#[tokio::test]
async fn duplicate_order_delivery_makes_one_task() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 2);
    assert_eq!(h.store.tasks().len(), 1);
    assert_eq!(h.count(Metric::OrderAccepted), 1);
    assert_eq!(h.count(Metric::OrderDuplicate), 1);

    // The duplicate's spare Schedule loses its claim: one agent request only.
    all_ok(h.pump_scheduler().await, 2);
    assert_eq!(h.count(Metric::Claimed), 1);
    assert_eq!(h.count(Metric::ClaimLost), 1);
    assert_eq!(h.depth(AGENT), 1);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.remote.calls().len(), 1);

    // A late redelivery of the order changes nothing.
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    assert_eq!(h.depth(SCHEDULER), 0);
    assert_eq!(h.count(Metric::OrderDuplicate), 2);
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    // The duplicate that met the task still unclaimed acknowledged the resend; the late
    // one, after Processed, said nothing.
    assert_eq!(h.status_kinds(), vec![OrderStatus::Received, OrderStatus::Received, OrderStatus::Processed]);
    h.finish();
}

#[tokio::test]
async fn conflicting_payload_under_the_same_id_is_rejected_and_kept_with_its_reason() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    let conflicting = Harness::order_body("o-1", SINGLE).replace(r#""quantity":1"#, r#""quantity":2"#);
    h.send(ORDERS, conflicting.clone()).await;

    let report = h.batch(ORDERS, ORDERS_DLQ, |m| h.submission.handle(m)).await;
    assert!(report.failures.is_empty());
    assert_eq!(report.kept, 1);
    assert_eq!(h.depth(ORDERS), 0);

    let kept = h.drain(ORDERS_DLQ);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].body, conflicting);
    assert!(kept[0].attributes[REASON_ATTRIBUTE].contains("already exists with a different payload"));
    assert_eq!(kept[0].attributes["sas-source"], ORDERS);
    let stored = h.store.task(&Harness::id("o-1")).await;
    assert_eq!(stored.unwrap().unwrap().order.items[0].quantity, 1, "the first order stands");
    assert_eq!(h.store.tasks().len(), 1);
    let statuses = h.statuses();
    assert_eq!(statuses.last().unwrap().status, OrderStatus::Rejected);
    assert!(statuses.last().unwrap().reason.as_deref().unwrap().contains("different payload"));
    assert_eq!((h.count(Metric::OrderRejected), h.count(Metric::MessageKept)), (1, 1));
    h.finish();
}

#[tokio::test]
async fn duplicate_schedule_loses_the_claim() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    h.send(
        SCHEDULER,
        SchedulerMessage::Schedule { order_id: Harness::id("o-1"), turn: None, throttled: 0 }.to_body(),
    )
    .await;

    all_ok(h.pump_scheduler().await, 2);
    assert_eq!((h.count(Metric::Claimed), h.count(Metric::ClaimLost)), (1, 1));
    assert_eq!(h.depth(AGENT), 1, "only one agent request");
    assert_eq!(h.task("o-1").attempt, 1);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.remote.calls().len(), 1);
    h.finish();
}

// ---- late replies ----

#[tokio::test]
async fn late_reply_after_a_retry_started_is_dropped() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);
    // Attempt 1's reply is held up in transit.
    let late = h.intercept(SCHEDULER);
    assert_eq!(late.len(), 1);

    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    let reclaimed = h.task("o-1");
    assert_eq!((reclaimed.state(), reclaimed.attempt), (ProcessState::Processing, 2));

    // The old attempt's reply lands on the new attempt's lease: dropped, nothing changes.
    h.send(SCHEDULER, late[0].clone()).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::StaleReply), 1);
    assert_eq!(h.task("o-1"), reclaimed);

    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);

    // And once more after the end.
    let done = h.task("o-1");
    h.send(SCHEDULER, late[0].clone()).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::StaleReply), 2);
    assert_eq!(h.task("o-1"), done);
    assert_eq!(h.status_kinds(), vec![OrderStatus::Received, OrderStatus::Processed]);
    h.finish();
}

#[tokio::test]
async fn reply_handled_after_complete_by_is_dropped_and_the_supervisor_recovers() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);
    let claimed = h.task("o-1");

    // The reply was sent in time, but the scheduler gets to it after complete-by.
    h.at(claimed.complete_by().unwrap().plus_ms(1));
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::StaleReply), 1);
    assert_eq!(h.task("o-1"), claimed);

    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    h.finish();
}

// ---- a crash between a state write and the message that should follow it ----

#[tokio::test]
async fn crash_between_the_claim_write_and_the_dispatch() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);

    h.queues.fail_next_sends(AGENT, 1);
    assert!(retry_error(&h.pump_scheduler().await));
    let claimed = h.task("o-1");
    assert_eq!((claimed.state(), claimed.attempt), (ProcessState::Processing, 1), "the claim landed");
    assert_eq!(h.depth(AGENT), 0, "the request did not");

    // The Schedule comes back, but the task is claimed: nothing to do.
    h.advance(SCHEDULER_VISIBILITY_MS);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::ClaimLost), 1);
    assert_eq!(h.depth(SCHEDULER), 0);
    assert_eq!(h.depth(AGENT), 0);

    // The deadline written with the claim brings the supervisor.
    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!((task.state(), task.attempt, task.failure_count), (ProcessState::Processed, 2, 1));
    assert_eq!(h.remote.calls().len(), 1);
    h.finish();
}

#[tokio::test]
async fn crash_between_the_insert_and_the_first_schedule() {
    let h = Harness::new();
    h.queues.fail_next_sends(SCHEDULER, 1);
    h.submit("o-1", SINGLE).await;
    assert!(retry_error(&h.pump_orders().await));
    assert_eq!(h.task("o-1").state(), ProcessState::Pending);
    assert_eq!(h.depth(SCHEDULER), 0);

    // The order is redelivered: a duplicate of an unclaimed task schedules it.
    h.advance(ORDERS_VISIBILITY_MS);
    all_ok(h.pump_orders().await, 1);
    assert_eq!(h.count(Metric::OrderDuplicate), 1);
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!((task.state(), task.failure_count), (ProcessState::Processed, 0));
    // The crashed first delivery never said `received`; the redelivery did.
    assert_eq!(h.status_kinds(), vec![OrderStatus::Received, OrderStatus::Processed]);
    h.finish();
}

#[tokio::test]
async fn lost_first_schedule_is_recovered_at_the_pending_deadline() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    assert_eq!(h.intercept(SCHEDULER).len(), 1, "the Schedule is lost");

    h.advance(h.settings.policy.pending_timeout_ms - 1);
    assert_eq!(h.sweep().await.examined, 0);
    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!((task.state(), task.failure_count), (ProcessState::Processed, 1));
    h.finish();
}

#[tokio::test]
async fn crash_between_a_step_advance_and_the_next_schedule() {
    let h = Harness::new();
    h.submit("o-1", THREE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);

    h.queues.fail_next_sends(SCHEDULER, 1);
    assert!(retry_error(&h.pump_scheduler().await));
    let advanced = h.task("o-1");
    assert_eq!((advanced.state(), advanced.step), (ProcessState::Pending, 1), "the advance landed");

    // The redelivered reply is stale now: the step it answered is done.
    h.advance(SCHEDULER_VISIBILITY_MS);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.count(Metric::StaleReply), 1);
    assert_eq!(h.task("o-1"), advanced);

    h.to_deadline("o-1");
    assert_eq!(h.sweep().await.retried, 1);
    reclaim(&h, "o-1").await;
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (1, Action::Do), (2, Action::Do)]);
    h.finish();
}

// ---- threshold reached ----

#[tokio::test]
async fn repeated_timeouts_reach_the_threshold_then_error_with_one_alert() {
    let h = Harness::new();
    let threshold = h.settings.policy.failure_threshold;
    h.remote.by_default(Script::Hang);
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);

    let mut attempts = 0;
    loop {
        assert!(attempts < threshold, "still retrying after {attempts} attempts: a poison loop");
        all_ok(h.pump_scheduler().await, 1);
        all_ok(h.pump_agent().await, 1);
        attempts += 1;
        assert_eq!(h.depth(SCHEDULER), 0, "a hung agent never replies");
        h.to_deadline("o-1");
        let sweep = h.sweep().await;
        assert_eq!(sweep.examined, 1);
        if h.task("o-1").state().is_terminal() {
            assert_eq!(sweep.gave_up, 1);
            break;
        }
        assert_eq!(sweep.retried, 1);
        assert!(h.alerts.all().is_empty(), "no alert below the threshold");
        let delay = h.retry_delay("o-1");
        h.advance(delay);
    }

    let task = h.task("o-1");
    assert_eq!(attempts, threshold);
    assert_eq!((task.state(), task.failure_count, task.attempt), (ProcessState::Error, threshold, threshold));
    let alerts = h.alerts.all();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].failure_count, threshold);
    assert!(alerts[0].reason.contains("failure threshold reached"));
    assert_eq!(h.status_kinds().last(), Some(&OrderStatus::Failed));
    assert_eq!(h.count(Metric::Recovered), threshold as u64 - 1);
    assert_eq!(h.count(Metric::Failed), 1);
    let keys: Vec<_> = h.remote.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys.len(), threshold as usize);
    assert!(keys.iter().all(|k| k == &keys[0]));

    // FailureCount over the write log: never down, one up per lapse, ending at the threshold.
    let counts: Vec<u32> = h.store.writes().iter().map(|w| w.after.failure_count).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    let mut distinct = counts.clone();
    distinct.dedup();
    assert_eq!(distinct, (0..=threshold).collect::<Vec<_>>());

    // No poison loop: nothing more happens, however long we wait.
    h.advance(24 * 3_600_000);
    assert_eq!(h.sweep().await.examined, 0);
    h.run_until_quiet().await;
    assert_eq!(h.alerts.all().len(), 1);
    h.finish();
}

/// Lets the supervisor lapse `id`'s hung attempts until it gives up (the task leaves
/// Pending and does not come back), retrying in between; never more than `threshold` lapses.
async fn lapse_until_given_up(h: &Harness, id: &str, threshold: u32) {
    for round in 1.. {
        assert!(round <= threshold, "still retrying after {threshold} lapses: a poison loop");
        h.to_deadline(id);
        h.sweep().await;
        if h.task(id).state() != ProcessState::Pending {
            return;
        }
        h.advance(h.retry_delay(id));
        h.run_until_quiet().await;
    }
}

#[tokio::test]
async fn threshold_reached_mid_workflow_compensates_the_in_flight_step_too() {
    let h = Harness::new();
    let threshold = h.settings.policy.failure_threshold;
    h.remote.then([Script::Ok]);
    h.remote.then((0..threshold).map(|_| Script::Hang));
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;
    lapse_until_given_up(&h, "o-1", threshold).await;
    let gave_up = h.task("o-1");
    assert_eq!((gave_up.state(), gave_up.step), (ProcessState::Compensating, 1));
    assert_eq!(h.alerts.all().len(), 1);

    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    let mut want = vec![(0, Action::Do)];
    want.extend((0..threshold).map(|_| (1, Action::Do)));
    // The charge may have gone through before the hang: it is refunded too.
    want.extend([(1, Action::Undo), (0, Action::Undo)]);
    assert_eq!(h.remote.steps(), want);
    assert_eq!(h.alerts.all().len(), 1);
    h.finish();
}

/// The defect found from outside: `ship-order` took effect but kept answering after its
/// complete-by. Giving up must not refund and release (the goods left): Error, nothing
/// undone, and the alert and the status name the pivot and its idempotency key.
#[tokio::test]
async fn a_pivot_that_never_answers_in_time_ends_error_with_nothing_undone() {
    let h = Harness::new();
    let threshold = h.settings.policy.failure_threshold;
    h.remote.then([Script::Ok, Script::Ok]);
    h.remote.then((0..threshold).map(|_| Script::Hang));
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;
    lapse_until_given_up(&h, "o-1", threshold).await;
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!((task.state(), task.step, task.failure_count), (ProcessState::Error, 2, threshold));
    let mut want = vec![(0, Action::Do), (1, Action::Do)];
    want.extend((0..threshold).map(|_| (2, Action::Do)));
    assert_eq!(h.remote.steps(), want, "nothing undone");
    let alerts = h.alerts.all();
    assert_eq!(alerts.len(), 1);
    assert_eq!((alerts[0].step_name.as_str(), alerts[0].state), ("ship-order", ProcessState::Error));
    assert_eq!(alerts[0].idempotency_key.as_ref().map(|k| k.0.as_str()), Some("o-1:2:do"));
    assert!(alerts[0].reason.contains("outcome unknown"), "{}", alerts[0].reason);
    assert_eq!(h.status_kinds().last(), Some(&OrderStatus::Failed));
    assert_eq!(h.count(Metric::Failed), 1);
    assert_eq!(h.count(Metric::Compensated), 0);
    h.finish();
}

// ---- the operators' topic down when giving up (found by the simulation, sim/) ----

/// A topic that refuses every alert, as SNS does during an outage.
struct TopicDown;

#[async_trait::async_trait]
impl sas::ports::Alerts for TopicDown {
    async fn raise(&self, _: &sas::domain::OperatorAlert) -> Result<(), sas::ports::AlertError> {
        Err(sas::ports::AlertError("topic unreachable".into()))
    }
}

fn topic_down(h: &Harness) -> sas::handlers::Deps {
    sas::handlers::Deps { alerts: std::sync::Arc::new(TopicDown), ..h.deps.clone() }
}

/// Regression (sim seeds 2, 13): the reply that ends a task is redelivered when its alert
/// fails, but after the terminal write it no longer passed the fence, so the alert was lost.
#[tokio::test]
async fn a_failed_alert_on_a_permanent_error_leaves_the_reply_for_redelivery() {
    let h = Harness::new();
    h.remote.then([Script::Permanent("card declined")]);
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);

    let down = sas::handlers::Scheduler::new(topic_down(&h), h.settings.clone());
    let results = h.pump_with(SCHEDULER, |m| down.handle(m)).await;
    assert!(retry_error(&results), "{results:?}");
    assert_eq!(h.task("o-1").state(), ProcessState::Processing, "nothing written without the alert");
    assert!(h.alerts.all().is_empty());

    h.advance(SCHEDULER_VISIBILITY_MS);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Error);
    assert_eq!(h.alerts.all().len(), 1);
    h.finish();
}

/// Regression (sim seeds 2, 3): a supervisor that gave up while the topic was down wrote
/// Error and lost the alert; "the next run retries it" could not, the task was no longer due.
#[tokio::test]
async fn a_failed_alert_at_the_threshold_leaves_the_task_due_for_the_next_run() {
    let h = Harness::new();
    let threshold = h.settings.policy.failure_threshold;
    h.remote.by_default(Script::Hang);
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    for _ in 1..threshold {
        all_ok(h.pump_scheduler().await, 1);
        all_ok(h.pump_agent().await, 1);
        h.to_deadline("o-1");
        assert_eq!(h.sweep().await.retried, 1);
        h.advance(h.retry_delay("o-1"));
    }
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);
    h.to_deadline("o-1");

    let down = sas::handlers::Supervisor::new(topic_down(&h), h.settings.clone());
    let report = down.sweep().await.expect("sweep");
    assert_eq!((report.examined, report.errors, report.gave_up), (1, 1, 0));
    let task = h.task("o-1");
    assert_eq!((task.state(), task.failure_count), (ProcessState::Processing, threshold - 1));

    let report = h.sweep().await;
    assert_eq!(report.gave_up, 1, "the next run finds it due and gives up, alerting");
    assert_eq!(h.task("o-1").state(), ProcessState::Error);
    let alerts = h.alerts.all();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].failure_count, threshold);
    h.finish();
}

/// A due index that lags: every page starts with an entry for a task that is no longer
/// due (DynamoDB's GSI is eventually consistent; a concurrent claim looks the same).
struct LaggingIndex {
    inner: std::sync::Arc<sas::adapters::embedded::EmbeddedStore>,
    ghost: sas::domain::TaskRecord,
}

#[async_trait::async_trait]
impl StateStore for LaggingIndex {
    async fn insert(
        &self,
        task: &sas::domain::TaskRecord,
    ) -> Result<sas::ports::Inserted, sas::ports::StoreError> {
        self.inner.insert(task).await
    }
    async fn task(
        &self,
        id: &sas::domain::OrderId,
    ) -> Result<Option<sas::domain::TaskRecord>, sas::ports::StoreError> {
        self.inner.task(id).await
    }
    async fn replace(
        &self,
        next: &sas::domain::TaskRecord,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        self.inner.replace(next, expected_revision).await
    }
    async fn due(
        &self,
        now: sas::domain::Timestamp,
        limit: usize,
    ) -> Result<Vec<sas::domain::OrderId>, sas::ports::StoreError> {
        let mut page = vec![self.ghost.order_id.clone()];
        page.extend(self.inner.due(now, limit).await?);
        page.truncate(limit);
        Ok(page)
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, sas::ports::StoreError> {
        self.inner.gate(agent).await
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        self.inner.replace_gate(next, expected_revision).await
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &sas::domain::OrderId,
        now: sas::domain::Timestamp,
    ) -> Result<sas::ports::Noted, sas::ports::StoreError> {
        self.inner.put_waiter(agent, ticket, order_id, now).await
    }
    async fn waiter(
        &self,
        agent: &str,
        ticket: u64,
    ) -> Result<Option<sas::domain::OrderId>, sas::ports::StoreError> {
        self.inner.waiter(agent, ticket).await
    }
}

/// Regression (sim seed 1341): a page of nothing but skipped entries stopped the sweep,
/// leaving the tasks behind them due until the next run.
#[tokio::test]
async fn a_stale_index_entry_does_not_stop_the_sweep_before_the_due_tasks() {
    let h = Harness::new();
    h.submit("o-0", SINGLE).await;
    h.run_until_quiet().await;
    let ghost = h.history("o-0")[0].clone();
    assert_eq!(ghost.state(), ProcessState::Pending, "the index still shows o-0 waiting");
    for id in ["o-1", "o-2"] {
        h.submit(id, SINGLE).await;
    }
    all_ok(h.pump_orders().await, 2);
    assert_eq!(h.intercept(SCHEDULER).len(), 2, "their Schedule messages are lost");
    h.to_deadline("o-2");

    let deps = sas::handlers::Deps {
        store: std::sync::Arc::new(LaggingIndex { inner: h.store.clone(), ghost }),
        ..h.deps.clone()
    };
    let mut supervisor = sas::handlers::Supervisor::new(deps, h.settings.clone());
    supervisor.budget.page_size = 1;
    supervisor.budget.max_page_size = 1;
    let report = supervisor.sweep().await.expect("sweep");
    assert_eq!((report.skipped, report.retried, report.errors), (1, 2, 0), "{report:?}");
    assert_eq!(h.task("o-1").failure_count, 1);
    assert_eq!(h.task("o-2").failure_count, 1);
    h.finish();
}

// ---- bad input ----

#[tokio::test]
async fn malformed_messages_in_a_batch_are_kept_with_their_reasons() {
    let h = Harness::new();
    let valid = Harness::order_body("o-1", SINGLE);
    let not_json = "{\"order_id\": \"o-2\", ".to_owned();
    let oversized = format!(r#"{{"order_id":"o-3","pad":"{}"}}"#, "x".repeat(MAX_BODY_BYTES));
    let unknown_field =
        Harness::order_body("o-4", SINGLE).replace("\"customer_id\"", "\"colour\":\"red\",\"customer_id\"");
    for body in [&valid, &not_json, &oversized, &unknown_field] {
        h.send(ORDERS, body.clone()).await;
    }

    let report = h.batch(ORDERS, ORDERS_DLQ, |m| h.submission.handle(m)).await;
    assert!(report.failures.is_empty(), "bad input never fails the batch: {report:?}");
    assert_eq!(report.kept, 3);
    assert_eq!(h.depth(ORDERS), 0);

    let kept = h.drain(ORDERS_DLQ);
    let reason_of =
        |body: &str| kept.iter().find(|m| m.body == body).expect("kept").attributes[REASON_ATTRIBUTE].clone();
    assert_eq!(kept.len(), 3);
    assert!(reason_of(&not_json).contains("not a valid message"));
    assert!(reason_of(&oversized).contains("bytes; at most"));
    assert!(reason_of(&unknown_field).contains("unknown field `colour`"));
    assert_eq!(h.count(Metric::OrderRejected), 3);
    assert_eq!(h.count(Metric::MessageKept), 3);

    // The sender of the one with a readable reply_to hears why.
    let rejected: Vec<_> = h.statuses().into_iter().filter(|s| s.status == OrderStatus::Rejected).collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].order_id.as_ref().unwrap().as_str(), "o-4");

    // The valid order went through untouched.
    assert_eq!(h.store.tasks().len(), 1);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    h.finish();
}

#[tokio::test]
async fn malformed_scheduler_and_agent_messages_are_kept_with_their_reasons() {
    let h = Harness::new();
    h.submit("o-1", SINGLE).await;
    all_ok(h.pump_orders().await, 1);
    let ghost =
        SchedulerMessage::Schedule { order_id: Harness::id("ghost"), turn: None, throttled: 0 }.to_body();
    for body in ["garbage", r#"{"type":"launch","order_id":"o-1"}"#, &ghost] {
        h.send(SCHEDULER, body).await;
    }
    let report = h.batch(SCHEDULER, SCHEDULER_DLQ, |m| h.scheduler.handle(m)).await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.kept, 3);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing, "the good Schedule in the batch claimed");
    let kept = h.drain(SCHEDULER_DLQ);
    assert_eq!(kept.len(), 3);
    assert!(kept.iter().any(|m| m.attributes[REASON_ATTRIBUTE].contains("unknown order ghost")));
    assert!(kept.iter().any(|m| m.attributes[REASON_ATTRIBUTE].contains("unknown variant `launch`")));

    h.send(AGENT, r#"{"order_id":"o-1"}"#).await;
    let report = h.batch(AGENT, AGENT_DLQ, |m| h.agent.handle(m)).await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.kept, 1, "the malformed request; the real one was handled");
    assert_eq!(h.drain(AGENT_DLQ).len(), 1);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    h.finish();
}

#[tokio::test]
async fn a_handler_that_panics_fails_only_its_own_message() {
    let h = Harness::new();
    for id in ["o-1", "o-2", "o-3"] {
        h.submit(id, SINGLE).await;
    }
    let submission = &h.submission;
    let report = h
        .batch(ORDERS, ORDERS_DLQ, move |m: Inbound| async move {
            if m.body.contains("\"o-2\"") {
                panic!("boom");
            }
            submission.handle(m).await
        })
        .await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.kept, 1);
    let kept = h.drain(ORDERS_DLQ);
    assert_eq!(kept.len(), 1);
    assert!(kept[0].body.contains("\"o-2\""));
    assert!(kept[0].attributes[REASON_ATTRIBUTE].contains("handler panicked: boom"));
    let ids: Vec<_> = h.store.tasks().iter().map(|t| t.order_id.to_string()).collect();
    assert_eq!(ids, vec!["o-1", "o-3"]);
    h.finish();
}

#[tokio::test]
async fn a_handler_that_panics_before_returning_its_future_fails_only_its_own_message() {
    let h = Harness::new();
    for id in ["o-1", "o-2", "o-3"] {
        h.submit(id, SINGLE).await;
    }
    let report = h
        .batch(ORDERS, ORDERS_DLQ, |m: Inbound| {
            if m.body.contains("\"o-2\"") {
                panic!("boom before the future");
            }
            h.submission.handle(m)
        })
        .await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.kept, 1);
    let kept = h.drain(ORDERS_DLQ);
    assert!(kept[0].attributes[REASON_ATTRIBUTE].contains("handler panicked: boom before the future"));
    assert_eq!(h.store.tasks().len(), 2);
    h.finish();
}

// ---- supervisors ----

#[tokio::test]
async fn concurrent_supervisors_recover_a_task_once() {
    let h = Harness::new();
    h.remote.by_default(Script::Hang);
    h.submit("o-1", SINGLE).await;
    h.run_until_quiet().await;
    h.to_deadline("o-1");
    let other = sas::handlers::Supervisor::new(h.deps.clone(), h.settings.clone());
    let (a, b) = futures::join!(h.supervisor.sweep(), other.sweep());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.retried + b.retried, 1, "{a:?} {b:?}");
    assert_eq!(h.task("o-1").failure_count, 1);
    assert_eq!(h.depth(SCHEDULER), 1, "one retry Schedule");
    h.finish();
}

/// A step's answer is kept with the task and handed on: the charge gets the reservation's
/// output, the refund the charge's own, the release the reservation's.
#[tokio::test]
async fn step_outputs_reach_later_steps_and_compensations() {
    let h = Harness::new();
    h.remote.then([
        Script::Answer(r#"{"reservation": "r-1"}"#.into()),
        Script::Answer(r#" {"charge_id": "ch-9", "amount": 12} "#.into()),
        Script::Permanent("address rejected"),
        Script::Answer("ignored: a compensation's answer is not kept".into()),
        Script::Ok,
    ]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    let handed: Vec<(u32, Action, String)> =
        h.remote.calls().into_iter().map(|c| (c.step, c.action, c.outputs)).collect();
    let r = r#""reserve-inventory":{"reservation":"r-1"}"#;
    let c = r#""charge-payment":{"amount":12,"charge_id":"ch-9"}"#;
    assert_eq!(
        handed,
        vec![
            (0, Action::Do, "{}".into()),
            (1, Action::Do, format!("{{{r}}}")),
            (2, Action::Do, format!("{{{c},{r}}}")),
            (1, Action::Undo, format!("{{{c},{r}}}")),
            (0, Action::Undo, format!("{{{r}}}")),
        ]
    );
    assert_eq!(h.task("o-1").outputs.len(), 2);
}

/// A success whose output cannot be kept: the step took effect, later steps cannot have
/// its answer, so the task gives up at once with that step in doubt and undoes it too.
#[tokio::test]
async fn an_output_too_large_gives_up_with_the_step_in_doubt() {
    let h = Harness::new();
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(sas::domain::MAX_OUTPUT_BYTES));
    h.remote.then([Script::Ok, Script::Answer(big)]);
    h.submit("o-1", THREE).await;
    h.run_until_quiet().await;

    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Compensated);
    assert_eq!(
        h.remote.steps(),
        vec![(0, Action::Do), (1, Action::Do), (1, Action::Undo), (0, Action::Undo)],
        "no retry of the step (the same key answers the same), and the step itself undone"
    );
    assert!(task.last_error.unwrap().contains("output cannot be kept"));
    assert_eq!(h.alerts.all().len(), 1, "an operator hears of it");
    let failed = h.statuses().into_iter().find(|s| s.status == OrderStatus::Compensating).unwrap();
    assert!(failed.reason.unwrap().contains("at most 4096"), "the sender is told why");
}

/// An order may name the version it runs; one that names a version the definitions do
/// not hold is refused with the versions they do.
#[tokio::test]
async fn an_order_may_name_its_workflow_version() {
    let h = Harness::new();
    let body = Harness::order_body("o-1", THREE)
        .replace(r#""workflow":"three-step""#, r#""workflow":"three-step","workflow_version":1"#);
    assert!(body.contains("workflow_version"), "{body}");
    h.send(ORDERS, body).await;
    h.run_until_quiet().await;
    let bad = Harness::order_body("o-2", THREE)
        .replace(r#""workflow":"three-step""#, r#""workflow":"three-step","workflow_version":2"#);
    h.send(ORDERS, bad).await;
    let report = h.batch(ORDERS, ORDERS_DLQ, |m| h.submission.handle(m)).await;
    assert_eq!(report.kept, 1);
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.task("o-1").workflow_version, 1);
    let kept = h.drain(ORDERS_DLQ);
    assert_eq!(kept.len(), 1);
    let reason = &kept[0].attributes[REASON_ATTRIBUTE];
    assert!(reason.contains(r#"workflow "three-step" has no version 2; known: v1"#), "{reason}");
}

/// A `queue` agent: the scheduler puts the request on the worker's queue, and a worker
/// that knows only the documented JSON (docs/WORKERS.md) replies on the scheduler's
/// queue. A reply without the live lease is dropped; the fenced one moves the task on,
/// and its output reaches the next step.
#[tokio::test]
async fn a_queue_agents_worker_replies_with_the_fenced_contract() {
    const WORKER_QUEUE: &str = "payment-requests";
    let h = Harness::new();
    h.queues.create(WORKER_QUEUE, sas::adapters::embedded::QueueSettings::default());
    let mut settings = h.settings.clone();
    settings.topology.queue_agents.insert("payment".into(), sas::ports::QueueUrl(WORKER_QUEUE.into()));
    let scheduler = sas::handlers::Scheduler::new(h.deps.clone(), settings);
    let pump = || async {
        for _ in 0..20 {
            let moved = h.pump_orders().await.len()
                + h.pump_with(SCHEDULER, |m| scheduler.handle(m)).await.len()
                + h.pump_agent().await.len();
            if moved == 0 {
                return;
            }
        }
    };
    h.remote.then([Script::Answer(r#"{"reservation":"r-1"}"#.into())]);
    h.submit("o-1", THREE).await;
    pump().await;

    // The worker's side: plain JSON, no sas types.
    let requests = h.intercept(WORKER_QUEUE);
    assert_eq!(requests.len(), 1);
    let request: serde_json::Value = serde_json::from_str(&requests[0]).unwrap();
    assert_eq!(request["step_name"], "charge-payment");
    assert_eq!(request["idempotency_key"], "o-1:1:do");
    assert_eq!(request["reply_queue"], SCHEDULER);
    assert_eq!(request["outputs"]["reserve-inventory"]["reservation"], "r-1");
    let reply = |lease: &serde_json::Value| {
        serde_json::json!({
            "type": "reply",
            "order_id": request["order_id"],
            "step": request["step"],
            "action": request["action"],
            "attempt": request["attempt"],
            "lease": lease,
            "outcome": {"status": "succeeded", "output": {"charge_id": "ch-1"}},
        })
        .to_string()
    };
    h.send(SCHEDULER, reply(&"00000000-0000-0000-0000-000000000009".into())).await;
    pump().await;
    assert_eq!(
        h.task("o-1").state(),
        ProcessState::Processing,
        "a reply without the live lease changes nothing"
    );
    assert_eq!(h.count(Metric::StaleReply), 1);

    h.send(SCHEDULER, reply(&request["lease"])).await;
    pump().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    let ship = h.remote.calls().into_iter().find(|c| c.step == 2).unwrap();
    assert!(ship.outputs.contains(r#""charge-payment":{"charge_id":"ch-1"}"#), "{}", ship.outputs);
    assert_eq!(
        h.remote.steps(),
        vec![(0, Action::Do), (2, Action::Do)],
        "the agent function never called payment"
    );
}

/// Once a service's circuit is open, its requests fail fast: no call, no reply, no
/// waiting for the circuit to close (which would hold the invocation, and the other
/// agents' requests queued behind it, for a service known to be down). The supervisor
/// retries the task at its deadline.
#[tokio::test]
async fn an_open_circuit_fails_fast_without_holding_the_invocation() {
    let mut h = Harness::new();
    h.agent = sas::handlers::Agent::new(
        h.agent.deps.clone(),
        sas::handlers::AgentSettings {
            retry: sas::domain::retry::Backoff { base_ms: 10, cap_ms: 10 },
            breaker: sas::domain::breaker::BreakerPolicy { failure_threshold: 2, open_ms: 60_000 },
            ..Default::default()
        },
        h.settings.workflows.clone(),
    );
    h.remote.by_default(Script::Transient);
    h.submit("o-1", SINGLE).await;
    h.pump_orders().await;
    h.pump_scheduler().await;
    let before = h.now();
    h.pump_agent().await;
    // Two calls open the circuit; the attempt then stops at once, 10 ms of backoff later.
    assert_eq!(h.remote.calls().len(), 2);
    assert!(
        h.now().millis_since(before) < 100,
        "did not wait for the circuit: {} ms",
        h.now().millis_since(before)
    );
    assert_eq!(h.count(Metric::CircuitOpen), 1);
    assert_eq!(h.depth(SCHEDULER), 0, "no reply");

    // The next attempt of another order is refused without a call.
    h.submit("o-2", SINGLE).await;
    h.pump_orders().await;
    h.pump_scheduler().await;
    h.pump_agent().await;
    assert_eq!(h.remote.calls().len(), 2);
    assert_eq!(h.count(Metric::CircuitOpen), 2);
    assert_eq!(h.task("o-2").state(), ProcessState::Processing, "left for the supervisor");
}

/// A store whose every task read takes a second of the manual clock: a sweep's rounds take
/// time, as DynamoDB's round trips do.
struct SlowReads {
    inner: std::sync::Arc<sas::adapters::embedded::EmbeddedStore>,
    clock: std::sync::Arc<sas::adapters::embedded::ManualClock>,
}

#[async_trait::async_trait]
impl StateStore for SlowReads {
    async fn insert(
        &self,
        task: &sas::domain::TaskRecord,
    ) -> Result<sas::ports::Inserted, sas::ports::StoreError> {
        self.inner.insert(task).await
    }
    async fn task(
        &self,
        id: &sas::domain::OrderId,
    ) -> Result<Option<sas::domain::TaskRecord>, sas::ports::StoreError> {
        self.clock.advance(1_000);
        self.inner.task(id).await
    }
    async fn replace(
        &self,
        next: &sas::domain::TaskRecord,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        self.inner.replace(next, expected_revision).await
    }
    async fn due(
        &self,
        now: sas::domain::Timestamp,
        limit: usize,
    ) -> Result<Vec<sas::domain::OrderId>, sas::ports::StoreError> {
        self.inner.due(now, limit).await
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, sas::ports::StoreError> {
        self.inner.gate(agent).await
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        self.inner.replace_gate(next, expected_revision).await
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &sas::domain::OrderId,
        now: sas::domain::Timestamp,
    ) -> Result<sas::ports::Noted, sas::ports::StoreError> {
        self.inner.put_waiter(agent, ticket, order_id, now).await
    }
    async fn waiter(
        &self,
        agent: &str,
        ticket: u64,
    ) -> Result<Option<sas::domain::OrderId>, sas::ports::StoreError> {
        self.inner.waiter(agent, ticket).await
    }
}

/// A run stops starting pages once its longest round and the margin no longer fit before
/// its deadline, and the next run carries on where it stopped; a run with little due reads
/// one page, as before budgets grew.
#[tokio::test]
async fn a_sweep_stops_at_its_time_budget_and_the_next_run_carries_on() {
    let h = Harness::new();
    let ids: Vec<String> = (0..30).map(|i| format!("o-{i:02}")).collect();
    for id in &ids {
        h.submit(id, SINGLE).await;
    }
    for _ in 0..3 {
        all_ok(h.pump_orders().await, 10);
        assert_eq!(h.intercept(SCHEDULER).len(), 10, "their Schedule messages are lost");
    }
    h.to_deadline("o-29");
    let deps = sas::handlers::Deps {
        store: std::sync::Arc::new(SlowReads { inner: h.store.clone(), clock: h.clock.clone() }),
        ..h.deps.clone()
    };
    let mut supervisor = sas::handlers::Supervisor::new(deps, h.settings.clone());
    // Rounds of 5 reads, 5 s each: pages start at 0, 5 and 10 s; at 15 s, a 5 s round and
    // the 2 s margin would end past the 20 s deadline.
    supervisor.budget =
        sas::handlers::SweepBudget { page_size: 5, max_page_size: 5, run_ms: 20_000, margin_ms: 2_000 };
    let first = supervisor.sweep().await.expect("sweep");
    assert_eq!((first.pages, first.retried, first.cut_short), (3, 15, true), "{first:?}");
    let second = supervisor.sweep().await.expect("sweep");
    assert_eq!((second.pages, second.retried, second.cut_short), (3, 15, true), "{second:?}");
    assert!(ids.iter().all(|id| h.task(id).failure_count == 1), "each recovered once");
    let idle = supervisor.sweep().await.expect("sweep");
    assert_eq!((idle.pages, idle.examined, idle.cut_short), (1, 0, false), "{idle:?}");
    h.intercept(SCHEDULER);
    h.finish();
}

// ---- operator actions ----

const OPS: sas::domain::Actor<'static> = sas::domain::Actor {
    by: "arn:aws:iam::123456789012:user/ops",
    why: "payment service fixed",
    seen: None,
    origin: sas::domain::Origin::Operator,
};

async fn operate(h: &Harness, id: &str, act: sas::domain::Act) -> sas::handlers::Operated {
    sas::handlers::operate(&h.deps, &h.settings, &Harness::id(id), act, OPS).await.unwrap()
}

#[tokio::test]
async fn an_operator_resubmits_an_error_task_and_it_runs_to_processed() {
    use sas::domain::{Act, Trigger};
    use sas::handlers::Operated;
    let h = Harness::new();
    h.remote.then([Script::Permanent("card declined")]);
    h.submit("o-1", SINGLE).await;
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Error);

    let resubmit = Act::Resubmit { from_step: None };
    let Operated::Applied { before, trigger, task } = operate(&h, "o-1", resubmit).await else {
        panic!("resubmit refused")
    };
    assert_eq!(
        (before, trigger, task.state()),
        (ProcessState::Error, Trigger::Resubmit, ProcessState::Pending)
    );
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Processed);
    assert_eq!(h.remote.calls().len(), 2);
    let entry = task.timeline.iter().find(|e| e.by.is_some()).expect("the action is in the timeline");
    assert_eq!((entry.by.as_deref(), entry.note.as_deref()), (Some(OPS.by), Some(OPS.why)));
    assert_eq!(h.status_kinds().last(), Some(&OrderStatus::Processed));
    assert!(h.status_kinds().contains(&OrderStatus::Resubmitted));
    assert_eq!(h.count(Metric::OperatorAction), 1);

    // Processed now: a second resubmit is refused and changes nothing.
    let revision = h.task("o-1").revision;
    assert!(matches!(operate(&h, "o-1", resubmit).await, Operated::Refused(_)));
    assert_eq!(h.task("o-1").revision, revision);
    assert_eq!(operate(&h, "nope", resubmit).await, Operated::NoSuchTask);
    h.finish();
}

#[tokio::test]
async fn two_operators_compensating_at_once_undo_once() {
    use sas::domain::{Act, OnGiveUp, Workflow, Workflows};
    use sas::handlers::Operated;
    let mut h = Harness::new();
    // Three-step that stops in Error instead of undoing, so an operator decides.
    let failing =
        Workflow { name: "three-step-manual".into(), on_give_up: OnGiveUp::Fail, ..Workflow::three_step() };
    let mut all = h.settings.workflows.all().to_vec();
    all.push(failing);
    h.settings.workflows = Workflows::new(all);
    h.scheduler = sas::handlers::Scheduler::new(h.deps.clone(), h.settings.clone());
    h.submission = sas::handlers::Submission::new(h.deps.clone(), h.settings.clone());
    h.supervisor = sas::handlers::Supervisor::new(h.deps.clone(), h.settings.clone());
    h.agent = sas::handlers::Agent::new(
        h.agent.deps.clone(),
        sas::handlers::AgentSettings::default(),
        h.settings.workflows.clone(),
    );
    h.remote.then([Script::Ok, Script::Ok, Script::Permanent("address rejected")]);
    h.submit("o-1", "three-step-manual").await;
    h.run_until_quiet().await;
    assert_eq!((h.task("o-1").state(), h.task("o-1").step), (ProcessState::Error, 2));

    let (a, b) = tokio::join!(operate(&h, "o-1", Act::Compensate), operate(&h, "o-1", Act::Compensate));
    let applied = [&a, &b].iter().filter(|o| matches!(o, Operated::Applied { .. })).count();
    assert_eq!(applied, 1, "{a:?} {b:?}");
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Compensated);
    let undos: Vec<_> = h.remote.steps().into_iter().filter(|(_, a)| *a == Action::Undo).collect();
    assert_eq!(
        undos,
        vec![(1, Action::Undo), (0, Action::Undo)],
        "each completed step undone once, newest first"
    );
    h.finish();
}

#[tokio::test]
async fn cancel_fences_off_the_attempt_in_flight() {
    use sas::domain::{Act, Trigger};
    use sas::handlers::Operated;
    let h = Harness::new();
    h.submit("o-1", THREE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1); // reserve claimed and dispatched
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);

    let Operated::Applied { trigger, .. } = operate(&h, "o-1", Act::Cancel).await else { panic!("refused") };
    assert_eq!(trigger, Trigger::Cancel);
    // The agent still runs the reserve it was sent; its reply is stale. The undo that
    // releases what it may have reserved waits until that attempt's time is up.
    let hold =
        h.task("o-1").hold_until().expect("held for the attempt in flight").plus_ms(policy().reply_grace_ms);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Compensating);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do)], "no undo before the attempt is over");
    h.at(hold);
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Compensated);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (0, Action::Undo)]);
    assert_eq!(h.count(Metric::StaleReply), 1);
    assert!(h.status_kinds().contains(&OrderStatus::Cancelled));
    h.finish();
}

#[tokio::test]
async fn an_app_cancels_an_order_with_a_message_on_the_orders_queue() {
    let h = Harness::new();
    h.submit("o-1", THREE).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1); // reserve done, its reply waits for the scheduler
    h.send(ORDERS, r#"{"cancel":"o-1","reason":"customer changed their mind","requested_by":"crm"}"#).await;
    all_ok(h.pump_orders().await, 1);
    h.run_until_quiet().await;
    h.at(h
        .task("o-1")
        .hold_until()
        .expect("held for the attempt in flight")
        .plus_ms(policy().reply_grace_ms));
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Compensated);
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (0, Action::Undo)]);
    let entry = task.timeline.iter().find(|e| e.by.is_some()).unwrap();
    assert_eq!(entry.by.as_deref(), Some("app:crm"));
    assert_eq!(entry.note.as_deref(), Some("customer changed their mind"));
    let kinds = h.status_kinds();
    assert!(kinds.contains(&OrderStatus::Cancelled), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&OrderStatus::Compensated));

    // Too late now: the app hears why, and nothing changes.
    h.send(ORDERS, r#"{"cancel":"o-1","reason":"again"}"#).await;
    all_ok(h.pump_orders().await, 1);
    let refused = h.statuses().into_iter().last().unwrap();
    assert_eq!(refused.status, OrderStatus::CancelRefused);
    assert!(refused.reason.unwrap().contains("ended"));
    assert_eq!(h.task("o-1").revision, task.revision);
    h.finish();
}

#[tokio::test]
async fn a_cancel_for_an_order_that_never_comes_is_kept_with_its_reason() {
    let h = Harness::new();
    let body = r#"{"cancel":"o-404","reason":"typo"}"#;
    h.send(ORDERS, body).await;
    for _ in 1..sas::handlers::submission::CANCEL_WAITS_FOR_ORDER {
        let report = h.batch(ORDERS, ORDERS_DLQ, |m| h.submission.handle(m)).await;
        assert_eq!((report.failures.len(), report.kept), (1, 0), "waits for its order");
        h.advance(10 * 60_000);
    }
    let report = h.batch(ORDERS, ORDERS_DLQ, |m| h.submission.handle(m)).await;
    assert_eq!((report.failures.len(), report.kept), (0, 1));
    let kept = h.drain(ORDERS_DLQ);
    assert_eq!(kept[0].body, body);
    assert!(kept[0].attributes[REASON_ATTRIBUTE].contains("no order o-404 to cancel"));
    h.finish();
}

// ---- timer steps ----

/// Charge (undone by a refund), wait `wait_ms`, then ship.
fn cool_off(wait_ms: u64) -> Harness {
    use sas::domain::{Step, Wait, Workflow, Workflows};
    let wf = Workflow::new(
        "cool-off",
        vec![
            Step::compensable("charge", "payment", "refund"),
            Step::timer("cool-off", Wait::for_ms(wait_ms)),
            Step::pivot("ship", "shipping"),
        ],
    );
    Harness::with_workflows(policy(), Workflows::new(vec![wf]))
}

fn schedule_body(id: &str) -> String {
    SchedulerMessage::Schedule { order_id: Harness::id(id), turn: None, throttled: 0 }.to_body()
}

#[tokio::test]
async fn a_timer_waits_without_dispatching_and_its_delayed_schedule_wakes_it_on_time() {
    let h = cool_off(5_000);
    h.submit("o-1", "cool-off").await;
    h.run_until_quiet().await;
    let waiting = h.task("o-1");
    assert_eq!((waiting.state(), waiting.step), (ProcessState::Waiting, 1));
    assert_eq!(waiting.wake_at(), Some(h.now().plus_ms(5_000)));
    assert_eq!(waiting.deadline(), waiting.wake_at());
    assert_eq!(h.remote.calls().len(), 1, "the timer called nothing");
    assert_eq!(h.depth(AGENT), 0);
    assert_eq!(h.depth(SCHEDULER), 1, "its wake, delayed");

    // A duplicate Schedule a millisecond early: counted, nothing written, and sent again
    // for the timer's time.
    h.advance(4_999);
    assert!(h.pump_scheduler().await.is_empty(), "the wake is still delayed");
    h.send(SCHEDULER, schedule_body("o-1")).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!(h.task("o-1"), waiting);
    assert_eq!(h.count(Metric::TimerEarly), 1);
    assert_eq!(h.depth(SCHEDULER), 2, "the wake and the early one's, both for then");

    h.advance(1);
    h.run_until_quiet().await;
    let done = h.task("o-1");
    assert_eq!((done.state(), done.failure_count), (ProcessState::Processed, 0));
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (2, Action::Do)]);
    assert_eq!((h.count(Metric::TimerStarted), h.count(Metric::TimerWoke)), (1, 1));
    assert_eq!(h.metrics().samples[&Metric::TimerLatenessMs], vec![0], "on time");
    assert!(h.status_kinds().contains(&OrderStatus::StepCompleted));
    h.finish();
}

/// A timer whose own wake was lost, woken early by a copy of the Schedule that put it to
/// sleep: the copy comes back at the timer's time, so it wakes then, not at the sweep.
#[tokio::test]
async fn an_early_schedule_comes_back_when_the_timer_is_due() {
    let h = cool_off(5_000);
    h.submit("o-1", "cool-off").await;
    h.run_until_quiet().await;
    assert_eq!(h.drain(SCHEDULER).len(), 1, "its delayed wake, lost");
    h.advance(4_000);
    h.send(SCHEDULER, schedule_body("o-1")).await;
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!((h.count(Metric::TimerEarly), h.depth(SCHEDULER)), (1, 1));
    h.advance(999);
    assert!(h.pump_scheduler().await.is_empty(), "not before its time");
    h.advance(1);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.metrics().samples[&Metric::TimerLatenessMs], vec![0], "on time, with no sweep");
    h.finish();
}

#[tokio::test]
async fn a_timer_longer_than_sqss_delay_is_woken_by_the_sweep_without_a_lapse() {
    let h = cool_off(3_600_000);
    h.submit("o-1", "cool-off").await;
    h.run_until_quiet().await;
    let wake_at = h.task("o-1").wake_at().unwrap();
    assert_eq!(h.depth(SCHEDULER), 0, "no message waits an hour: the due index holds the task");
    h.at(Timestamp(wake_at.0 - 1));
    assert_eq!(h.sweep().await.examined, 0, "not due yet");
    h.at(wake_at.plus_ms(30_000));
    let report = h.sweep().await;
    assert_eq!((report.woke, report.retried, report.gave_up), (1, 0, 0));
    h.run_until_quiet().await;
    let done = h.task("o-1");
    assert_eq!((done.state(), done.failure_count), (ProcessState::Processed, 0));
    assert_eq!(h.metrics().samples[&Metric::TimerLatenessMs], vec![30_000]);
    assert_eq!(h.count(Metric::Recovered), 0, "a wake is not a recovery");
    h.finish();
}

#[tokio::test]
async fn a_cancel_during_a_wait_undoes_what_was_done_and_the_late_wake_finds_nothing() {
    let h = cool_off(5_000);
    h.submit("o-1", "cool-off").await;
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Waiting);
    h.send(ORDERS, r#"{"cancel":"o-1","reason":"changed my mind"}"#).await;
    h.run_until_quiet().await;
    let t = h.task("o-1");
    assert_eq!((t.state(), t.wake_at()), (ProcessState::Compensated, None));
    assert_eq!(h.remote.steps(), vec![(0, Action::Do), (0, Action::Undo)]);
    // The timer's own Schedule comes at its time and changes nothing.
    h.advance(5_000);
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1"), t);
    assert_eq!(h.remote.steps().len(), 2, "nothing shipped");
    h.finish();
}

/// A store on which another scheduler writes first, once: armed, the next task write is
/// landed as if a concurrent invocation had made the same decision a moment before, so
/// the writer's own write finds the revision moved.
struct RacedOnce {
    inner: std::sync::Arc<sas::adapters::embedded::EmbeddedStore>,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl StateStore for RacedOnce {
    async fn insert(
        &self,
        task: &sas::domain::TaskRecord,
    ) -> Result<sas::ports::Inserted, sas::ports::StoreError> {
        self.inner.insert(task).await
    }
    async fn task(
        &self,
        id: &sas::domain::OrderId,
    ) -> Result<Option<sas::domain::TaskRecord>, sas::ports::StoreError> {
        self.inner.task(id).await
    }
    async fn replace(
        &self,
        next: &sas::domain::TaskRecord,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.inner.replace(next, expected_revision).await?;
        }
        self.inner.replace(next, expected_revision).await
    }
    async fn due(
        &self,
        now: sas::domain::Timestamp,
        limit: usize,
    ) -> Result<Vec<sas::domain::OrderId>, sas::ports::StoreError> {
        self.inner.due(now, limit).await
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, sas::ports::StoreError> {
        self.inner.gate(agent).await
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<sas::ports::Written, sas::ports::StoreError> {
        self.inner.replace_gate(next, expected_revision).await
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &sas::domain::OrderId,
        now: sas::domain::Timestamp,
    ) -> Result<sas::ports::Noted, sas::ports::StoreError> {
        self.inner.put_waiter(agent, ticket, order_id, now).await
    }
    async fn waiter(
        &self,
        agent: &str,
        ticket: u64,
    ) -> Result<Option<sas::domain::OrderId>, sas::ports::StoreError> {
        self.inner.waiter(agent, ticket).await
    }
}

/// Regression (sim seed 666, issue 27): a Schedule that passed the gate by (the task's
/// timer was to wake, which needs no place) lost its write to a concurrent one that woke
/// the timer first; decided again on the task as it now stood, its write was the claim of
/// the next step, on an agent with `max_in_flight`, and dispatched it with no place held.
/// A claim is made only through the gate: the Schedule goes back through it.
#[tokio::test]
async fn a_claim_decided_again_after_a_concurrent_write_still_needs_its_place() {
    use sas::domain::gate::{Limits, call_holder};
    use sas::domain::{Step, Wait, Workflow, Workflows};
    let wf = Workflow::new("w", vec![Step::timer("t", Wait::for_ms(1_000)), Step::pivot("pay", "pay")]);
    let h = Harness::with_workflows(policy(), Workflows::new(vec![wf]));
    let mut settings = h.settings.clone();
    settings.topology.limits.insert(
        "pay".into(),
        Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None },
    );
    let raced = std::sync::Arc::new(RacedOnce { inner: h.store.clone(), armed: false.into() });
    let deps = sas::handlers::Deps { store: raced.clone(), ..h.deps.clone() };
    let scheduler = sas::handlers::Scheduler::new(deps, settings);
    h.submit("o-1", "w").await;
    h.pump_orders().await;
    for r in h.pump_with(common::SCHEDULER, |m| scheduler.handle(m)).await {
        r.unwrap();
    }
    assert_eq!(h.task("o-1").state(), ProcessState::Waiting, "the timer sleeps");
    h.advance(1_000);
    raced.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in h.pump_with(common::SCHEDULER, |m| scheduler.handle(m)).await {
        r.unwrap();
    }
    let task = h.task("o-1");
    let holder = task.locked_by().map(|lease| call_holder(&task.order_id, task.attempt, &lease));
    let held =
        h.store.peek_gate("pay").is_some_and(|g| g.holds.iter().any(|p| Some(&p.holder) == holder.as_ref()));
    assert!(
        task.state() != ProcessState::Processing || held,
        "step {} claimed (attempt {}) with no place in its agent's gate",
        task.step,
        task.attempt
    );
    assert_eq!(h.depth(common::AGENT), usize::from(held), "a request goes out only with a place");
    // The next Schedule (the waking writer's own, or the supervisor's at the deadline)
    // claims it through the gate.
    h.send(common::SCHEDULER, r#"{"type":"schedule","order_id":"o-1"}"#).await;
    for r in h.pump_with(common::SCHEDULER, |m| scheduler.handle(m)).await {
        r.unwrap();
    }
    let task = h.task("o-1");
    assert_eq!((task.state(), task.step), (ProcessState::Processing, 1));
    let holder = call_holder(&task.order_id, task.attempt, &task.locked_by().expect("claimed"));
    assert!(h.store.peek_gate("pay").is_some_and(|g| g.holds.iter().any(|p| p.holder == holder)));
    assert_eq!(h.depth(common::AGENT), 1);
}

/// A one-step workflow `w` whose agent `pay` takes one call at a time, with the
/// submission and scheduler handlers that know the limit.
fn one_place_at_pay() -> (Harness, sas::handlers::Submission, sas::handlers::Scheduler) {
    use sas::domain::gate::Limits;
    use sas::domain::{Step, Workflow, Workflows};
    let wf = Workflow::new("w", vec![Step::pivot("pay", "pay")]);
    let h = Harness::with_workflows(policy(), Workflows::new(vec![wf]));
    let mut settings = h.settings.clone();
    settings.topology.limits.insert(
        "pay".into(),
        Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None },
    );
    let submission = sas::handlers::Submission::new(h.deps.clone(), settings.clone());
    let scheduler = sas::handlers::Scheduler::new(h.deps.clone(), settings);
    (h, submission, scheduler)
}

/// A cancelled task that waited for a place hands its ticket back (issue 35): when the
/// place comes free, the next live waiter gets it at once, not after a reservation for
/// the cancelled one has lapsed.
#[tokio::test]
async fn a_cancelled_waiter_hands_its_ticket_back_and_the_next_gets_the_place_at_once() {
    let (h, submission, scheduler) = one_place_at_pay();
    for id in ["o-1", "o-2", "o-3"] {
        h.submit(id, "w").await;
    }
    all_ok(h.pump_with(ORDERS, |m| submission.handle(m)).await, 3);
    all_ok(h.pump_with(SCHEDULER, |m| scheduler.handle(m)).await, 3);
    assert_eq!(h.task("o-1").state(), ProcessState::Processing);
    let line: Vec<_> = ["o-2", "o-3"].iter().map(|id| h.task(id).queued().map(|q| q.ticket)).collect();
    assert_eq!(line, vec![Some(0), Some(1)]);

    h.send(ORDERS, r#"{"cancel":"o-2","reason":"changed my mind"}"#).await;
    all_ok(h.pump_with(ORDERS, |m| submission.handle(m)).await, 1);
    assert_eq!(h.task("o-2").queued(), None);
    assert_eq!(h.count(Metric::TicketHandedBack), 1);
    let gate = h.store.peek_gate("pay").expect("the gate");
    assert_eq!((gate.admitted, gate.waiting()), (1, 1), "ticket 0 skipped, ticket 1 still waits");

    // o-1's call ends: its place goes straight to o-3, with no time passing.
    all_ok(h.pump_agent().await, 1);
    for _ in 0..3 {
        for r in h.pump_with(SCHEDULER, |m| scheduler.handle(m)).await {
            r.unwrap();
        }
    }
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!(h.task("o-3").state(), ProcessState::Processing, "o-3 claimed the place o-1 gave back");
    let gate = h.store.peek_gate("pay").expect("the gate");
    assert!(!gate.holds.iter().any(|p| p.holder.starts_with('#')), "no place reserved for anybody: {gate:?}");
}

/// A thousand waiters cancelled in front of ten live ones (issue 36): more than the gate
/// marks withdrawn (`MAX_WITHDRAWN`), so most cancelled tickets are still let through. Each
/// wakes its task with the ticket (`Schedule::turn`), the cancelled task hands the turn on
/// at once, and the live ones are all served with no time passing: none waits for a place
/// reserved for a cancelled task to lapse.
#[tokio::test]
async fn a_thousand_cancelled_waiters_never_hold_up_the_live_ones() {
    use sas::domain::gate::MAX_WITHDRAWN;
    const CANCELLED: usize = 1_000;
    let (h, submission, scheduler) = one_place_at_pay();
    let drain = |queue: &'static str| {
        let (submission, scheduler) = (&submission, &scheduler);
        let h = &h;
        async move {
            loop {
                let results = match queue {
                    ORDERS => h.pump_with(ORDERS, |m| submission.handle(m)).await,
                    _ => h.pump_with(SCHEDULER, |m| scheduler.handle(m)).await,
                };
                if results.is_empty() {
                    break;
                }
                all_ok(results.clone(), results.len());
            }
        }
    };
    let cancelled: Vec<String> = (0..CANCELLED).map(|i| format!("gone-{i}")).collect();
    let live: Vec<String> = (0..10).map(|i| format!("live-{i}")).collect();
    h.submit("first", "w").await;
    drain(ORDERS).await;
    drain(SCHEDULER).await;
    for id in cancelled.iter().chain(&live) {
        h.submit(id, "w").await;
    }
    drain(ORDERS).await;
    drain(SCHEDULER).await;
    assert_eq!(h.task("first").state(), ProcessState::Processing);
    assert_eq!(h.task("live-9").queued().map(|q| q.ticket), Some(CANCELLED as u64 + 9));
    // Newest first: a ticket withdrawn at the head of the line is passed over at once, so
    // only those withdrawn behind others are marked, and the marks run out.
    for id in cancelled.iter().rev() {
        h.send(ORDERS, format!(r#"{{"cancel":"{id}","reason":"changed my mind"}}"#)).await;
    }
    drain(ORDERS).await;
    assert_eq!(h.count(Metric::TicketHandedBack), MAX_WITHDRAWN as u64, "marked, the others not yet");
    let gate = h.store.peek_gate("pay").expect("the gate");
    assert_eq!(
        gate.withdrawn.len(),
        MAX_WITHDRAWN,
        "the gate marks what it can; the rest are let through: {gate:?}"
    );

    // Each live one is served in turn; the clock never moves.
    let start = sas::ports::Clock::now(&*h.clock);
    let mut served = Vec::new();
    for _ in 0..live.len() + 1 {
        all_ok(h.pump_agent().await, 1);
        drain(SCHEDULER).await;
        served.extend(live.iter().filter(|id| h.task(id).state() == ProcessState::Processing).cloned());
    }
    assert_eq!(sas::ports::Clock::now(&*h.clock), start);
    assert_eq!(served, live, "every live one claimed, in its order, one at a time");
    assert!(live.iter().all(|id| h.task(id).state() == ProcessState::Processed));
    assert_eq!(h.count(Metric::TicketHandedBack), CANCELLED as u64, "every cancelled ticket handed back");
    let gate = h.store.peek_gate("pay").expect("the gate");
    assert!(gate.holds.is_empty() && gate.waiting() == 0, "nothing held or waiting: {gate:?}");
}
