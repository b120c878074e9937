//! The conformance suite: one body per property, written against the ports only, run
//! on every backend (`tests/tests/conformance.rs` instantiates each for the embedded
//! backend and for the AWS adapters on moto). If the embedded backend drifts from
//! DynamoDB and SQS semantics, one of these fails on one side.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sas::domain::{
    Action, AgentReply, Cause, Lease, LeaseToken, LineItem, Order, OrderId, Phase, Policy, ProcessState,
    Refusal, ReplyOutcome, StaleReason, TaskRecord, Timestamp, Workflow,
};
use sas::ports::{Delivery, Inserted, Noted, Outgoing, QueueUrl, Written};

use crate::Backend;

/// A fixed "now" for the store tests: the store never reads a clock, so both backends
/// see the same times.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

fn order(id: &str, customer: &str) -> Order {
    Order {
        order_id: OrderId::parse(id).expect("test ids are valid"),
        customer_id: customer.into(),
        items: vec![LineItem { sku: "sku-1".into(), quantity: 2 }],
        workflow: "single-step".into(),
        workflow_version: None,
    }
}

fn new_task(id: &str, at: Timestamp) -> TaskRecord {
    TaskRecord::new(&order(id, "c-1"), Some("status-queue".into()), at, &Policy::default())
}

fn lease(n: u128) -> LeaseToken {
    LeaseToken(uuid::Uuid::from_u128(n))
}

async fn insert(b: &Backend, id: &str, at: Timestamp) -> TaskRecord {
    let task = new_task(id, at);
    assert_eq!(b.store.insert(&task).await.unwrap(), Inserted::New, "{}: insert {id}", b.name);
    task
}

async fn read(b: &Backend, id: &OrderId) -> TaskRecord {
    b.store.task(id).await.unwrap().unwrap_or_else(|| panic!("{}: task {id} missing", b.name))
}

/// Writes `next` over `current` and insists it lands.
async fn write(b: &Backend, next: &TaskRecord, current: &TaskRecord) {
    assert_eq!(b.store.replace(next, current.revision).await.unwrap(), Written::Applied, "{}", b.name);
}

/// Insert is one conditional write, idempotent on the order id: a different payload
/// under an existing id gets the stored task (and its order) back, and nothing is
/// overwritten.
pub async fn insert_is_idempotent_and_keeps_the_first(b: &Backend) {
    let first = insert(b, "ins-1", T0).await;
    let mut other = new_task("ins-1", T0.plus_ms(5));
    std::sync::Arc::make_mut(&mut other.order).customer_id = "someone-else".into();
    other.reply_to = None;
    match b.store.insert(&other).await.unwrap() {
        Inserted::Exists(existing) => {
            assert_eq!(*existing, first, "{}: the stored task comes back whole", b.name);
            assert_eq!(existing.order.customer_id, "c-1", "{}", b.name);
            assert_eq!(existing.created_at, T0, "{}", b.name);
        }
        Inserted::New => panic!("{}: second insert under one id succeeded", b.name),
    }
    let stored = read(b, &first.order_id).await;
    assert_eq!(stored, first, "{}: task overwritten", b.name);
    assert_eq!(*stored.order, order("ins-1", "c-1"), "{}", b.name);
    assert_eq!(b.store.task(&OrderId::parse("nobody").unwrap()).await.unwrap(), None);
}

/// Every field survives a write and a consistent read, and writes are conditional on
/// the revision (a missing row has none to match).
pub async fn replace_is_conditional_and_faithful(b: &Backend) {
    let task = insert(b, "rep-1", T0).await;
    let mut next = task.clone();
    let held = Lease { token: lease(42), complete_by: T0.plus_ms(30_000) };
    next = next.with_phase(Phase::compensating(Some(held), T0.plus_ms(40_000)));
    next.step = 1;
    next.step_attempts = 2;
    next.attempt = 7;
    next.failure_count = 3;
    next.step_failures = 2;
    next.last_cause = Cause::Failed {
        step: 1,
        action: Action::Undo,
        reason: "remote said \"no\" ✗".into(),
        in_doubt: false,
    };
    next.last_error = Some("multi\nline".into());
    next.revision = task.revision + 1;
    next.updated_at = T0.plus_ms(1);

    assert_eq!(
        b.store.replace(&next, task.revision + 5).await.unwrap(),
        Written::RevisionMoved,
        "{}",
        b.name
    );
    write(b, &next, &task).await;
    assert_eq!(read(b, &task.order_id).await, next, "{}: round trip", b.name);
    assert_eq!(b.store.replace(&next, task.revision).await.unwrap(), Written::RevisionMoved, "{}", b.name);

    let ghost = new_task("rep-ghost", T0);
    assert_eq!(b.store.replace(&ghost, ghost.revision).await.unwrap(), Written::RevisionMoved, "{}", b.name);
    assert_eq!(b.store.task(&ghost.order_id).await.unwrap(), None, "{}: replace created a row", b.name);
}

/// Many schedulers read the same Pending task and all try to claim it: exactly one
/// conditional write lands, and the stored lease is the winner's.
pub async fn concurrent_claimers_exactly_one_wins(b: &Backend, rounds: usize, claimers: usize) {
    let policy = Policy::default();
    for round in 0..rounds {
        let task = insert(b, &format!("claim-{round}"), T0).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(claimers));
        let attempts = (0..claimers).map(|i| {
            let (store, barrier, id) = (b.store.clone(), barrier.clone(), task.order_id.clone());
            tokio::spawn(async move {
                let read = store.task(&id).await.unwrap().expect("inserted");
                // Everyone decides on the same revision before anyone writes.
                barrier.wait().await;
                let mine = lease(i as u128 + 1);
                let decision = read.claim(mine, T0.plus_ms(10), &Workflow::single_step(), &policy).unwrap();
                (mine, store.replace(&decision.next, read.revision).await.unwrap())
            })
        });
        let results: Vec<_> = futures::future::join_all(attempts)
            .await
            .into_iter()
            .map(|r| r.expect("claimer panicked"))
            .collect();
        let winners: Vec<LeaseToken> =
            results.iter().filter(|(_, w)| *w == Written::Applied).map(|(l, _)| *l).collect();
        assert_eq!(
            winners.len(),
            1,
            "{}: round {round}: {} of {claimers} claimers won",
            b.name,
            winners.len()
        );
        let stored = read(b, &task.order_id).await;
        assert_eq!(stored.locked_by(), Some(winners[0]), "{}: round {round}", b.name);
        assert_eq!(
            (stored.state(), stored.attempt, stored.revision),
            (ProcessState::Processing, 1, 2),
            "{}",
            b.name
        );
    }
}

/// The branch replies of a parallel stage come back together and race on the task's one
/// record. Each writer does what `handlers::transition` does: read, decide, write
/// conditional on the revision read, and on a lost race read and decide again. Every
/// reply lands (none is dropped or needs a scan), and the last one joins the stage.
pub async fn branch_replies_racing_on_one_record_all_land(b: &Backend, branches: usize) {
    use sas::domain::workflow::{Entry, StageText, Step};
    let policy = Policy::default();
    let steps =
        (0..branches).map(|i| Step::compensable(&format!("b{i}"), "a", &format!("undo-b{i}"))).collect();
    let wf = Workflow::of_entries(
        "fan-out",
        vec![
            Entry::Parallel { parallel: StageText { name: "all".into(), steps } },
            Entry::Step(Step::pivot("after", "a")),
        ],
    );
    let mut o = order("stage-1", "c-1");
    o.workflow = wf.name.clone();
    let task = TaskRecord::new(&o, None, T0, &policy);
    assert_eq!(b.store.insert(&task).await.unwrap(), Inserted::New, "{}", b.name);
    let claimed = task.claim(lease(1), T0.plus_ms(1), &wf, &policy).unwrap().next;
    write(b, &claimed, &task).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(branches));
    let writers = (0..branches as u32).map(|step| {
        let (store, barrier, wf, id) =
            (b.store.clone(), barrier.clone(), wf.clone(), claimed.order_id.clone());
        let (attempt, _) = claimed.dispatch_of(step, None);
        let reply = AgentReply {
            order_id: id.clone(),
            step,
            action: Action::Do,
            attempt,
            lease: lease(1),
            index: None,
            outcome: ReplyOutcome::Succeeded { output: Some(serde_json::json!({ "branch": step })) },
        };
        tokio::spawn(async move {
            barrier.wait().await;
            let mut conflicts = 0;
            loop {
                let read = store.task(&id).await.unwrap().expect("inserted");
                let decision =
                    read.apply_reply(&reply, T0.plus_ms(10), &wf, &policy).expect("in time and fenced");
                match store.replace(&decision.next, read.revision).await.unwrap() {
                    Written::Applied => return (decision.trigger, conflicts),
                    Written::RevisionMoved => conflicts += 1,
                }
            }
        })
    });
    let results: Vec<_> =
        futures::future::join_all(writers).await.into_iter().map(|r| r.expect("writer panicked")).collect();
    let joined = results.iter().filter(|(t, _)| *t == sas::domain::Trigger::Advanced).count();
    assert_eq!(joined, 1, "{}: one reply joins the stage: {results:?}", b.name);
    let stored = read(b, &claimed.order_id).await;
    assert_eq!(
        (stored.state(), stored.step, stored.stage()),
        (ProcessState::Pending, branches as u32, None),
        "{}",
        b.name
    );
    assert_eq!(stored.outputs.len(), branches, "{}: every branch's output is kept", b.name);
    assert_eq!(stored.revision, claimed.revision + branches as u64, "{}: one write per reply", b.name);
}

/// A reply after complete-by is refused by the fence; a reply decided in time but
/// landing after the supervisor took the task back is refused by the store.
pub async fn fenced_reply_after_expiry_is_rejected(b: &Backend) {
    let policy = Policy::default();
    let wf = Workflow::single_step();
    let task = insert(b, "fence-1", T0).await;
    let claim = task.claim(lease(1), T0.plus_ms(100), &wf, &policy).unwrap();
    write(b, &claim.next, &task).await;
    let claimed = read(b, &task.order_id).await;
    let complete_by = claimed.complete_by().expect("claimed");
    let reply = AgentReply {
        order_id: claimed.order_id.clone(),
        step: 0,
        action: Action::Do,
        attempt: claimed.attempt,
        lease: lease(1),
        index: None,
        outcome: ReplyOutcome::DONE,
    };

    let late = complete_by.plus_ms(1);
    assert_eq!(
        claimed.apply_reply(&reply, late, &wf, &policy),
        Err(Refusal::StaleReply(StaleReason::PastCompleteBy { complete_by, now: late })),
        "{}",
        b.name
    );

    let in_time = claimed.apply_reply(&reply, complete_by, &wf, &policy).expect("in time");
    let deadline = claimed.deadline().expect("claimed tasks have a deadline");
    let lapsed = claimed.lapse(deadline, &wf, &policy, 0).expect("due");
    write(b, &lapsed.next, &claimed).await;
    assert_eq!(
        b.store.replace(&in_time.next, claimed.revision).await.unwrap(),
        Written::RevisionMoved,
        "{}: a reply decided on the pre-expiry read landed after recovery",
        b.name
    );
    let now = read(b, &task.order_id).await;
    assert_eq!((now.state(), now.failure_count), (ProcessState::Pending, 1), "{}", b.name);
    assert_eq!(
        now.fence(&reply, complete_by),
        Err(StaleReason::NoLease(ProcessState::Pending)),
        "{}",
        b.name
    );

    // The next claim has a new lease and attempt: the old reply matches neither.
    let reclaim = now.claim(lease(2), deadline.plus_ms(1), &wf, &policy).unwrap();
    write(b, &reclaim.next, &now).await;
    let again = read(b, &task.order_id).await;
    assert_eq!(again.fence(&reply, deadline.plus_ms(2)), Err(StaleReason::OtherLease), "{}", b.name);
}

/// The due query returns exactly the non-terminal tasks whose deadline has passed,
/// oldest first, honours its limit, and follows writes that move or clear deadlines.
pub async fn due_returns_exactly_the_due_tasks(b: &Backend) {
    let policy = Policy::default();
    let wf = Workflow::single_step();
    let mut ids = Vec::new();
    for i in 0..12u64 {
        ids.push(insert(b, &format!("due-{i:02}"), T0.plus_ms(i * 1_000)).await.order_id);
    }
    // Finished tasks leave the index.
    for i in [2, 7] {
        let t = read(b, &ids[i]).await;
        let claim = t.claim(lease(100 + i as u128), T0.plus_ms(20_000), &wf, &policy).unwrap();
        write(b, &claim.next, &t).await;
        let c = read(b, &ids[i]).await;
        let reply = AgentReply {
            order_id: c.order_id.clone(),
            step: 0,
            action: Action::Do,
            attempt: c.attempt,
            lease: lease(100 + i as u128),
            index: None,
            outcome: ReplyOutcome::DONE,
        };
        let done = c.apply_reply(&reply, T0.plus_ms(20_001), &wf, &policy).unwrap();
        assert_eq!(done.next.state(), ProcessState::Processed);
        write(b, &done.next, &c).await;
    }
    // A write may move a deadline earlier ...
    let t = read(b, &ids[9]).await;
    let mut earlier = t.clone();
    earlier = earlier.with_phase(Phase::pending(T0.plus_ms(45_000)));
    earlier.revision += 1;
    write(b, &earlier, &t).await;
    // ... a late claim moves one later, a prompt claim keeps it, a recovery moves it later.
    let t = read(b, &ids[1]).await;
    let claim = t.claim(lease(1), T0.plus_ms(30_000), &wf, &policy).unwrap();
    assert_eq!(claim.next.deadline(), Some(T0.plus_ms(70_000)));
    write(b, &claim.next, &t).await;
    let t = read(b, &ids[3]).await;
    let claim = t.claim(lease(3), T0.plus_ms(5_000), &wf, &policy).unwrap();
    assert_eq!(claim.next.deadline(), t.deadline());
    write(b, &claim.next, &t).await;
    let t = read(b, &ids[0]).await;
    let lapse = t.lapse(t.deadline().unwrap(), &wf, &policy, 0).unwrap();
    write(b, &lapse.next, &t).await;

    let now = T0.plus_ms(66_000);
    let mut stored = Vec::new();
    for id in &ids {
        stored.push(read(b, id).await);
    }
    let mut expected: Vec<&TaskRecord> =
        stored.iter().filter(|t| t.deadline().is_some_and(|d| d <= now)).collect();
    expected.sort_by(|a, b| (a.deadline(), &a.order_id).cmp(&(b.deadline(), &b.order_id)));
    let expected_ids: Vec<&str> = expected.iter().map(|t| t.order_id.as_str()).collect();
    // Guard the test itself: some due, some not yet, some finished.
    assert_eq!(expected_ids, ["due-09", "due-03", "due-04", "due-05", "due-06"], "{}", b.name);

    let before = b.dynamo.as_ref().map(|d| d.due_items_read());
    let due = b.store.due(now, 100).await.unwrap();
    let due_ids: Vec<&str> = due.iter().map(|id| id.as_str()).collect();
    assert_eq!(due_ids, expected_ids, "{}", b.name);
    if let (Some(dynamo), Some(before)) = (&b.dynamo, before) {
        // Only due entries are read: a scan, or a query without the deadline bound,
        // would read the others too.
        assert_eq!(dynamo.due_items_read() - before, expected.len() as u64, "{}", b.name);
    }

    let first3: Vec<String> = b.store.due(now, 3).await.unwrap().iter().map(|id| id.to_string()).collect();
    assert_eq!(first3, expected_ids[..3], "{}: limit", b.name);
    assert!(b.store.due(T0, 100).await.unwrap().is_empty(), "{}: nothing is due at T0", b.name);
    assert!(b.store.due(now, 0).await.unwrap().is_empty(), "{}", b.name);
    let everything = b.store.due(T0.plus_ms(10_000_000), 100).await.unwrap();
    assert_eq!(everything.len(), 10, "{}: all non-terminal tasks, no terminal one", b.name);
    for id in &everything {
        assert!(!read(b, id).await.state().is_terminal(), "{}: {id} is terminal", b.name);
    }
}

/// Receives until `n` messages came or `timeout` passed.
async fn receive_n(b: &Backend, queue: &QueueUrl, n: usize, timeout: Duration) -> Vec<Delivery> {
    let started = Instant::now();
    let mut got = Vec::new();
    while got.len() < n && started.elapsed() < timeout {
        let batch = b.consumer.receive(queue, 10, b.wait_ms()).await.unwrap();
        if batch.is_empty() && b.wait_ms() == 0 {
            break;
        }
        got.extend(batch);
    }
    got
}

fn body(test: &str) -> String {
    format!("{test}-{}", uuid::Uuid::new_v4())
}

/// An undeleted message comes back after the visibility timeout with its receive
/// count raised and its attributes intact; a deleted one never does.
pub async fn redelivery_after_visibility_timeout(b: &Backend) {
    let attributes = BTreeMap::from([("sas-reason".to_owned(), "bad \"input\": ✗".to_owned())]);
    let sent = Outgoing { body: body("redeliver"), delay_ms: 0, attributes: attributes.clone() };
    b.queues.send(&b.work_queue, sent.clone()).await.unwrap();

    let first = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1, "{}", b.name);
    assert_eq!((&first[0].body, &first[0].attributes, first[0].receive_count), (&sent.body, &attributes, 1));
    assert!(
        b.consumer.receive(&b.work_queue, 10, 0).await.unwrap().is_empty(),
        "{}: visible while in flight",
        b.name
    );

    b.pass(b.visibility_ms).await;
    let second = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
    assert_eq!(second.len(), 1, "{}: not redelivered", b.name);
    assert_eq!((&second[0].body, second[0].receive_count), (&sent.body, 2), "{}", b.name);
    assert_eq!(second[0].message_id, first[0].message_id, "{}", b.name);

    b.consumer.delete(&b.work_queue, &second[0].receipt).await.unwrap();
    b.pass(b.visibility_ms).await;
    assert!(
        b.consumer.receive(&b.work_queue, 10, 0).await.unwrap().is_empty(),
        "{}: deleted message came back",
        b.name
    );
}

/// A received message names its sender as SQS's `SenderId` does (set by the service
/// from the sender's credentials), and the same sender every time it is received: the
/// orders queue binds each order to it.
pub async fn a_delivery_names_its_sender(b: &Backend) {
    let sent = Outgoing::new(body("sender"));
    b.app_queues.send(&b.work_queue, sent.clone()).await.unwrap();
    let first = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1, "{}", b.name);
    let sender_id = first[0].sender.clone().unwrap_or_else(|| panic!("{}: no SenderId", b.name));
    assert!(sas::domain::Sender::from_sender_id(&sender_id).is_some(), "{}: {sender_id:?}", b.name);
    if b.name == "embedded" {
        assert_eq!(sender_id, crate::APP_SENDER_ID);
    }
    b.pass(b.visibility_ms).await;
    let again = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
    assert_eq!(again.len(), 1, "{}: not redelivered", b.name);
    assert_eq!(again[0].sender.as_ref(), Some(&sender_id), "{}", b.name);
    b.consumer.delete(&b.work_queue, &again[0].receipt).await.unwrap();
}

/// A message received `max_receives` times and never deleted moves to the
/// dead-letter queue, body and attributes intact.
pub async fn dead_letter_after_max_receives(b: &Backend) {
    let attributes = BTreeMap::from([("origin".to_owned(), "conformance".to_owned())]);
    let sent = Outgoing { body: body("poison"), delay_ms: 0, attributes: attributes.clone() };
    b.queues.send(&b.work_queue, sent.clone()).await.unwrap();
    for n in 1..=b.max_receives {
        let got = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
        assert_eq!(got.len(), 1, "{}: receive {n}", b.name);
        assert_eq!(got[0].receive_count, n, "{}", b.name);
        b.pass(b.visibility_ms).await;
    }
    // SQS moves the message on a receive from the source queue once its last visibility
    // timeout has ended, and when that is comes from the service's clock (LocalStack
    // returns in-flight messages to the queue on a timer, about once a second): so keep
    // receiving from the source, as a consumer does, until the dead-letter queue has it.
    // None of those receives may deliver it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let dead = loop {
        let again = b.consumer.receive(&b.work_queue, 10, b.wait_ms()).await.unwrap();
        assert!(again.is_empty(), "{}: delivered past max receives", b.name);
        let dead = b.consumer.receive(&b.dead_letter_queue, 1, 0).await.unwrap();
        if !dead.is_empty() || Instant::now() > deadline {
            break dead;
        }
    };
    assert_eq!(dead.len(), 1, "{}: not in the dead-letter queue", b.name);
    assert_eq!((&dead[0].body, &dead[0].attributes), (&sent.body, &attributes), "{}", b.name);
}

/// A batch larger than the service's batch size arrives whole; a delayed message
/// stays invisible until its delay passes.
pub async fn batches_arrive_whole_and_delays_hold(b: &Backend) {
    let delayed = Outgoing::delayed(body("later"), 1_500);
    b.queues.send(&b.work_queue, delayed.clone()).await.unwrap();
    let bodies: BTreeSet<String> = (0..23).map(|i| body(&format!("batch-{i}"))).collect();
    b.queues.send_batch(&b.work_queue, bodies.iter().cloned().map(Outgoing::new).collect()).await.unwrap();

    let got = receive_n(b, &b.work_queue, bodies.len(), Duration::from_secs(10)).await;
    let got_bodies: BTreeSet<String> = got.iter().map(|d| d.body.clone()).collect();
    assert_eq!(got_bodies, bodies, "{}", b.name);
    for d in &got {
        b.consumer.delete(&b.work_queue, &d.receipt).await.unwrap();
    }
    b.pass(2_000).await;
    let later = receive_n(b, &b.work_queue, 1, Duration::from_secs(5)).await;
    assert_eq!(later.iter().map(|d| &d.body).collect::<Vec<_>>(), [&delayed.body], "{}", b.name);
}

/// A send to a queue that does not exist fails as `NoSuchQueue`, not as a retryable
/// outage: a misconfigured queue URL must not look like throttling.
pub async fn unknown_queue_is_named(b: &Backend) {
    let url = &b.work_queue.0;
    let missing = QueueUrl(format!("{}-missing-{}", url, uuid::Uuid::new_v4().simple()));
    match b.queues.send(&missing, Outgoing::new("x".into())).await {
        Err(sas::ports::QueueError::NoSuchQueue(q)) => assert_eq!(q, missing.0, "{}", b.name),
        other => panic!("{}: {other:?}", b.name),
    }
}

/// `send_each` answers for every message, in order, beyond one request's 10 entries;
/// against a queue that does not exist each answer is `NoSuchQueue`.
pub async fn send_each_answers_for_every_message(b: &Backend) {
    let bodies: BTreeSet<String> = (0..13).map(|i| body(&format!("each-{i}"))).collect();
    let results =
        b.queues.send_each(&b.work_queue, bodies.iter().cloned().map(Outgoing::new).collect()).await;
    assert_eq!(results.len(), bodies.len(), "{}", b.name);
    assert!(results.iter().all(Result::is_ok), "{}: {results:?}", b.name);
    let got = receive_n(b, &b.work_queue, bodies.len(), Duration::from_secs(10)).await;
    let got_bodies: BTreeSet<String> = got.iter().map(|d| d.body.clone()).collect();
    assert_eq!(got_bodies, bodies, "{}", b.name);

    let missing = QueueUrl(format!("{}-missing-{}", b.work_queue.0, uuid::Uuid::new_v4().simple()));
    let results =
        b.queues.send_each(&missing, vec![Outgoing::new("x".into()), Outgoing::new("y".into())]).await;
    assert_eq!(results, vec![Err(sas::ports::QueueError::NoSuchQueue(missing.0.clone())); 2], "{}", b.name);
}

/// Writes `task` as finished in `state` at `at`, as the domain leaves a finished task:
/// no deadline, no lease.
async fn finish(b: &Backend, task: &TaskRecord, state: ProcessState, at: Timestamp) -> TaskRecord {
    let mut next = task.clone();
    next = next.with_phase(Phase::ended(state).expect("an ended state"));
    next.revision += 1;
    next.updated_at = at;
    write(b, &next, task).await;
    next
}

fn ids(tasks: &[TaskRecord]) -> Vec<&str> {
    tasks.iter().map(|t| t.order_id.as_str()).collect()
}

/// Listing reads the indexes, never the whole table: Error tasks newest first, from
/// `since` on, whole; live tasks oldest deadline first; a finished task is never live,
/// and one that leaves Error leaves the error listing. Every listing honours its limit.
pub async fn listing_reads_the_indexes(b: &Backend) {
    use sas::ports::Listing;
    let mut errors = Vec::new();
    for i in 0..5u64 {
        let t = insert(b, &format!("lst-err-{i}"), T0).await;
        errors.push(finish(b, &t, ProcessState::Error, T0.plus_ms(10_000 + i * 1_000)).await);
    }
    for (i, state) in
        [ProcessState::Processed, ProcessState::Compensated, ProcessState::Processed].iter().enumerate()
    {
        let t = insert(b, &format!("lst-done-{i}"), T0).await;
        finish(b, &t, *state, T0.plus_ms(20_000 + i as u64)).await;
    }
    let mut live = Vec::new();
    for i in 0..4u64 {
        live.push(insert(b, &format!("lst-live-{i}"), T0.plus_ms(i * 1_000)).await);
    }
    // In Error, then live again (as an operator's resubmission leaves it): it leaves the
    // error listing and joins the live one.
    let t = insert(b, "lst-back", T0).await;
    let failed = finish(b, &t, ProcessState::Error, T0.plus_ms(30_000)).await;
    let mut back = failed.clone();
    back = back.with_phase(Phase::pending(T0.plus_ms(500)));
    back.revision += 1;
    back.updated_at = T0.plus_ms(31_000);
    write(b, &back, &failed).await;

    let all_errors = b.lister.list(&Listing::Errors { since: None }, 100).await.unwrap();
    assert_eq!(
        ids(&all_errors),
        ["lst-err-4", "lst-err-3", "lst-err-2", "lst-err-1", "lst-err-0"],
        "{}: Error tasks, newest first",
        b.name
    );
    for (listed, stored) in all_errors.iter().zip(errors.iter().rev()) {
        assert_eq!(listed, stored, "{}: listed whole, as stored", b.name);
    }

    let before = b.dynamo.as_ref().map(|d| d.listing_reads());
    let since = b.lister.list(&Listing::Errors { since: Some(T0.plus_ms(12_000)) }, 100).await.unwrap();
    assert_eq!(ids(&since), ["lst-err-4", "lst-err-3", "lst-err-2"], "{}: since is inclusive", b.name);
    if let (Some(dynamo), Some(before)) = (&b.dynamo, before) {
        // Only the listed entries are read, and no task item besides: the index holds
        // them whole.
        let after = dynamo.listing_reads();
        assert_eq!(after.index_items - before.index_items, 3, "{}", b.name);
        assert_eq!(after.index_count - before.index_count, 3, "{}", b.name);
        assert_eq!(after.index_scanned - before.index_scanned, 3, "{}", b.name);
        assert_eq!(after.task_reads, before.task_reads, "{}", b.name);
    }
    let newest2 = b.lister.list(&Listing::Errors { since: None }, 2).await.unwrap();
    assert_eq!(ids(&newest2), ["lst-err-4", "lst-err-3"], "{}: limit", b.name);
    let none = b.lister.list(&Listing::Errors { since: Some(T0.plus_ms(99_000)) }, 100).await.unwrap();
    assert!(none.is_empty(), "{}: nothing since", b.name);

    let listed = b.lister.list(&Listing::Live, 100).await.unwrap();
    let mut expected: Vec<TaskRecord> = live.clone();
    expected.push(back.clone());
    expected.sort_by(|a, b| (a.deadline(), &a.order_id).cmp(&(b.deadline(), &b.order_id)));
    assert_eq!(listed, expected, "{}: the live tasks, oldest deadline first, as stored", b.name);
    assert_eq!(ids(&listed)[0], "lst-back", "{}", b.name);
    assert!(listed.iter().all(|t| !t.state().is_terminal()), "{}", b.name);

    let first2 = b.lister.list(&Listing::Live, 2).await.unwrap();
    assert_eq!(first2, expected[..2], "{}: limit", b.name);
    assert!(b.lister.list(&Listing::Live, 0).await.unwrap().is_empty(), "{}", b.name);
    assert!(b.lister.list(&Listing::Errors { since: None }, 0).await.unwrap().is_empty(), "{}", b.name);

    // A live task that finishes leaves the live listing, whichever way it ends.
    let ended = finish(b, &live[0], ProcessState::Processed, T0.plus_ms(40_000)).await;
    let listed = b.lister.list(&Listing::Live, 100).await.unwrap();
    assert!(!ids(&listed).contains(&ended.order_id.as_str()), "{}: a finished task is listed live", b.name);
    assert_eq!(listed.len(), 4, "{}", b.name);
}

/// Finished tasks (Processed, Compensated) are listed newest first from their own sparse
/// index, by a deployment that keeps it (`with`): whole, from `since` on, within the limit,
/// reading only the entries listed and their tasks; never an Error or live task. A
/// deployment without it (`without`, the template's default) refuses the listing with
/// `NotIndexed`, not an outage.
pub async fn finished_listing_reads_its_own_index(with: &Backend, without: &Backend) {
    use sas::ports::{Listing, StoreError};
    let b = with;
    let mut done = Vec::new();
    for (i, state) in
        [ProcessState::Processed, ProcessState::Compensated, ProcessState::Processed, ProcessState::Processed]
            .iter()
            .enumerate()
    {
        let t = insert(b, &format!("fin-{i}"), T0).await;
        done.push(finish(b, &t, *state, T0.plus_ms(20_000 + i as u64 * 1_000)).await);
    }
    let t = insert(b, "fin-error", T0).await;
    finish(b, &t, ProcessState::Error, T0.plus_ms(90_000)).await;
    insert(b, "fin-live", T0).await;

    let all = b.lister.list(&Listing::Finished { since: None }, 100).await.unwrap();
    assert_eq!(ids(&all), ["fin-3", "fin-2", "fin-1", "fin-0"], "{}: finished tasks, newest first", b.name);
    for (listed, stored) in all.iter().zip(done.iter().rev()) {
        assert_eq!(listed, stored, "{}: listed whole, as stored", b.name);
    }
    let before = b.dynamo.as_ref().map(|d| d.listing_reads());
    let since = b.lister.list(&Listing::Finished { since: Some(T0.plus_ms(21_000)) }, 2).await.unwrap();
    assert_eq!(ids(&since), ["fin-3", "fin-2"], "{}: since is inclusive, and the limit holds", b.name);
    if let (Some(dynamo), Some(before)) = (&b.dynamo, before) {
        // Only the entries since are read from the index (bench_smoke checks that each
        // shard's query stops at the limit), and only the tasks listed from the table.
        let after = dynamo.listing_reads();
        assert_eq!(after.index_items - before.index_items, 3, "{}: {after:?}", b.name);
        assert_eq!(after.task_reads - before.task_reads, 2, "{}", b.name);
    }
    assert!(b.lister.list(&Listing::Finished { since: None }, 0).await.unwrap().is_empty(), "{}", b.name);

    let refused = without.lister.list(&Listing::Finished { since: None }, 10).await;
    assert!(matches!(refused, Err(StoreError::NotIndexed(_))), "{}: {refused:?}", without.name);
}

/// An agent's gate (flow control) is one item beside the tasks: written only on the
/// revision read (0: never written), read back exactly as written, and never seen by the
/// due index or the listings. A waiter note names the order of a ticket, and is written
/// only where the ticket has none or one naming that same order.
pub async fn gate_writes_are_conditional_and_faithful(b: &Backend) {
    use sas::domain::gate::{Admission, Gate, Limits};
    let limits =
        Limits { max_in_flight: Some(1), max_per_second: Some(5), places_per_gate: None, per_key: None };
    assert_eq!(b.store.gate("pay").await.unwrap(), None, "{}: no gate before its first write", b.name);
    let first = Gate::new("pay").arrive(T0, &limits, "o-1#1", T0.plus_ms(60_000), None);
    assert_eq!(first.outcome, Admission::Admitted);
    assert_eq!(b.store.replace_gate(&first.next, 0).await.unwrap(), Written::Applied, "{}", b.name);
    // A second writer that also read "no gate" loses.
    let rival = Gate::new("pay").arrive(T0, &limits, "o-2#1", T0.plus_ms(60_000), None);
    assert_eq!(b.store.replace_gate(&rival.next, 0).await.unwrap(), Written::RevisionMoved, "{}", b.name);
    let stored = b.store.gate("pay").await.unwrap().expect("written");
    assert_eq!(stored, first.next, "{}: read back as written", b.name);
    let queued = stored.arrive(T0.plus_ms(1), &limits, "o-2#1", T0.plus_ms(60_000), None);
    assert_eq!(queued.outcome, Admission::Queued { ticket: 0 });
    assert_eq!(
        b.store.replace_gate(&queued.next, stored.revision - 1).await.unwrap(),
        Written::RevisionMoved
    );
    assert_eq!(b.store.replace_gate(&queued.next, stored.revision).await.unwrap(), Written::Applied);
    let released = queued.next.release(T0.plus_ms(2), &limits, "o-1#1");
    assert_eq!(released.wake, vec![0]);
    assert_eq!(b.store.replace_gate(&released.next, queued.next.revision).await.unwrap(), Written::Applied);
    let stored = b.store.gate("pay").await.unwrap().expect("written");
    assert_eq!(stored, released.next, "{}: tails and reserved places kept", b.name);
    assert_eq!(stored.tails.len(), 1, "{}", b.name);
    // Two more wait (tickets 1 and 2); ticket 2's task leaves the line: it is kept as
    // withdrawn, behind ticket 1, and read back so.
    let one = stored.arrive(T0.plus_ms(3), &limits, "o-3#1", T0.plus_ms(60_000), None).next;
    let two = one.arrive(T0.plus_ms(3), &limits, "o-4#1", T0.plus_ms(60_000), None).next;
    let withdrawn = two.withdraw(T0.plus_ms(4), &limits, 2);
    assert_eq!(withdrawn.next.withdrawn, vec![2], "{}", b.name);
    assert_eq!(b.store.replace_gate(&withdrawn.next, stored.revision).await.unwrap(), Written::Applied);
    let stored = b.store.gate("pay").await.unwrap().expect("written");
    assert_eq!(stored, withdrawn.next, "{}: withdrawn tickets kept", b.name);
    // Waiter notes. The same order noting its ticket again (a retried Schedule) is
    // answered as written; another order's note for that ticket is refused, and the
    // first one stands.
    let id = OrderId::parse("o-2").unwrap();
    assert_eq!(b.store.waiter("pay", 0).await.unwrap(), None, "{}", b.name);
    assert_eq!(b.store.put_waiter("pay", 0, &id, T0).await.unwrap(), Noted::Applied, "{}", b.name);
    assert_eq!(b.store.put_waiter("pay", 0, &id, T0.plus_ms(5)).await.unwrap(), Noted::Applied, "{}", b.name);
    assert_eq!(b.store.waiter("pay", 0).await.unwrap(), Some(id.clone()), "{}", b.name);
    let other = OrderId::parse("o-3").unwrap();
    assert_eq!(
        b.store.put_waiter("pay", 0, &other, T0.plus_ms(6)).await.unwrap(),
        Noted::HeldByAnother,
        "{}",
        b.name
    );
    assert_eq!(
        b.store.waiter("pay", 0).await.unwrap(),
        Some(id.clone()),
        "{}: the first note stands",
        b.name
    );
    assert_eq!(b.store.waiter("pay", 1).await.unwrap(), None, "{}", b.name);
    // The refusal is per ticket: the other order notes its own.
    assert_eq!(
        b.store.put_waiter("pay", 1, &other, T0.plus_ms(6)).await.unwrap(),
        Noted::Applied,
        "{}",
        b.name
    );
    assert_eq!(b.store.waiter("pay", 1).await.unwrap(), Some(other), "{}", b.name);
    assert_eq!(b.store.waiter("pay", 0).await.unwrap(), Some(id), "{}", b.name);
    // Neither gates nor notes are tasks: the due index and the listings never see them.
    assert!(b.store.due(Timestamp(u64::MAX / 2), 100).await.unwrap().is_empty(), "{}", b.name);
    let live = b.lister.list(&sas::ports::Listing::Live, 100).await.unwrap();
    assert!(live.is_empty(), "{}: {live:?}", b.name);
}

/// A limited agent's call mark (the agent's one write): of two requests for one call
/// racing to mark it, and of a later copy, exactly one is told it started the call; another
/// call (step, attempt or lease) is marked apart. Marks are no tasks: the due index and
/// the listings never see them.
pub async fn one_call_mark_wins(b: &Backend) {
    use sas::domain::gate::{CallMark, CallStart};
    let order = OrderId::parse("o-call").unwrap();
    let mark = CallMark::new(&order, 1, 2, &lease(7 << 96), T0.plus_ms(30_000));
    let (first, second) = tokio::join!(b.call_starts.start_call(&mark), b.call_starts.start_call(&mark));
    let mut outcomes = vec![first.unwrap(), second.unwrap()];
    outcomes.sort_by_key(|o| *o == CallStart::AlreadyStarted);
    assert_eq!(outcomes, [CallStart::Started, CallStart::AlreadyStarted], "{}", b.name);
    assert_eq!(b.call_starts.start_call(&mark).await.unwrap(), CallStart::AlreadyStarted, "{}", b.name);
    for other in [
        CallMark::new(&order, 0, 2, &lease(7 << 96), T0.plus_ms(30_000)),
        CallMark::new(&order, 1, 3, &lease(7 << 96), T0.plus_ms(30_000)),
        // The key keeps the lease's first 8 hex digits (`gate::call_holder`).
        CallMark::new(&order, 1, 2, &lease(8 << 96), T0.plus_ms(30_000)),
    ] {
        assert_eq!(
            b.call_starts.start_call(&other).await.unwrap(),
            CallStart::Started,
            "{}: {other:?}",
            b.name
        );
    }
    assert!(b.store.due(Timestamp(u64::MAX / 2), 100).await.unwrap().is_empty(), "{}", b.name);
    assert_eq!(b.store.task(&order).await.unwrap(), None, "{}", b.name);
    let live = b.lister.list(&sas::ports::Listing::Live, 100).await.unwrap();
    assert!(live.is_empty(), "{}: {live:?}", b.name);
}

/// Claims racing for the places of one gate: each arrival does what `handlers::gate`
/// does (read, decide, write conditional on the revision read, read again on a lost
/// race). Exactly `max_in_flight` are let in; the rest hold distinct tickets in order.
pub async fn concurrent_arrivals_never_overfill_a_gate(b: &Backend, arrivals: usize, places: u32) {
    use sas::domain::gate::{Admission, Gate, Limits};
    let limits =
        Limits { max_in_flight: Some(places), max_per_second: None, places_per_gate: None, per_key: None };
    let barrier = Arc::new(tokio::sync::Barrier::new(arrivals));
    let racers = (0..arrivals).map(|i| {
        let (store, barrier) = (b.store.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            loop {
                let gate = store.gate("ship").await.unwrap().unwrap_or_else(|| Gate::new("ship"));
                let passage = gate.arrive(T0, &limits, &format!("o-{i}#1"), T0.plus_ms(60_000), None);
                match store.replace_gate(&passage.next, gate.revision).await.unwrap() {
                    Written::Applied => return passage.outcome,
                    Written::RevisionMoved => continue,
                }
            }
        })
    });
    let outcomes: Vec<Admission> =
        futures::future::join_all(racers).await.into_iter().map(|r| r.expect("racer panicked")).collect();
    let admitted = outcomes.iter().filter(|o| **o == Admission::Admitted).count();
    assert_eq!(admitted, places as usize, "{}: {outcomes:?}", b.name);
    let mut tickets: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Admission::Queued { ticket } => Some(*ticket),
            _ => None,
        })
        .collect();
    tickets.sort_unstable();
    assert_eq!(tickets, (0..(arrivals - places as usize) as u64).collect::<Vec<_>>(), "{}", b.name);
    let stored = b.store.gate("ship").await.unwrap().expect("written");
    assert_eq!(
        (stored.holds.len(), stored.waiting()),
        (places as usize, (arrivals - places as usize) as u64)
    );
}
