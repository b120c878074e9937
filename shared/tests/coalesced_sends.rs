//! The handlers under `run_batch` with a `SendCoalescer` on the embedded backend, as the
//! Lambda functions run: one invocation's sends reach the queue service as one request
//! per destination queue, and each handler still sees its own sends' results.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use sas::adapters::embedded::queue_names::{self, *};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::FastRandom;
use sas::domain::{Policy, ProcessState, Workflows};
use sas::handlers::{
    BatchReport, DEFAULT_MAX_HOLD, DeadLetters, Deps, Scheduler, SendCoalescer, Settings, Submission,
    Supervisor, run_batch,
};
use sas::ports::{Outgoing, QueueError, QueueUrl, Queues, StateStore};
use tokio::time::Instant;

/// The queue service's side: every request, by queue, with its message count.
struct Requests {
    inner: Arc<EmbeddedQueues>,
    log: Mutex<Vec<(String, usize)>>,
}

#[async_trait]
impl Queues for Requests {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        assert!(messages.len() <= 10, "one request carries at most 10 messages");
        self.log.lock().unwrap().push((queue.0.clone(), messages.len()));
        self.inner.send_batch(queue, messages).await
    }
}

struct World {
    clock: Arc<ManualClock>,
    store: Arc<EmbeddedStore>,
    queues: Arc<EmbeddedQueues>,
    requests: Arc<Requests>,
    metrics: Arc<CountingMetrics>,
    submission: Submission,
    scheduler: Scheduler,
    supervisor: Supervisor,
    started: Instant,
}

impl World {
    fn new() -> World {
        let clock = Arc::new(ManualClock::at(1_700_000_000_000));
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 1));
        for q in [ORDERS, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ, AGENT, AGENT_DLQ, STATUS] {
            queues.create(q, QueueSettings::default());
        }
        let requests = Arc::new(Requests { inner: queues.clone(), log: Mutex::default() });
        let store = Arc::new(EmbeddedStore::new());
        let metrics = Arc::new(CountingMetrics::default());
        let deps = Deps {
            store: store.clone(),
            queues: Arc::new(SendCoalescer::new(requests.clone(), DEFAULT_MAX_HOLD)),
            alerts: Arc::new(RecordingAlerts::default()),
            clock: clock.clone(),
            random: Arc::new(FastRandom::seeded(3)),
            metrics: metrics.clone(),
        };
        let settings = Settings::new(
            Policy::default(),
            Workflows::builtin(),
            queue_names::topology(),
            queue_names::reply_to_rules(),
        );
        World {
            submission: Submission::new(deps.clone(), settings.clone()),
            scheduler: Scheduler::new(deps.clone(), settings.clone()),
            supervisor: Supervisor::new(deps, settings),
            clock,
            store,
            queues,
            requests,
            metrics,
            started: Instant::now(),
        }
    }

    fn dead_letters(&self, source: &str, dlq: &str) -> DeadLetters {
        DeadLetters {
            // The functions keep rejected messages through the same coalesced queues.
            queues: self.submission.deps.queues.clone(),
            source: QueueUrl(source.into()),
            dead_letter_queue: QueueUrl(dlq.into()),
            metrics: self.metrics.clone(),
        }
    }

    /// One invocation on everything visible in `queue` (at most 10), as Lambda makes it.
    async fn invoke(&self, queue: &str, dlq: &str) -> BatchReport {
        let received = self.queues.receive(queue, 10).unwrap();
        let messages = received.iter().map(|r| r.message.inbound()).collect();
        let dead_letters = self.dead_letters(queue, dlq);
        let report = match queue {
            ORDERS => run_batch(messages, &dead_letters, |m| self.submission.handle(m)).await,
            SCHEDULER => run_batch(messages, &dead_letters, |m| self.scheduler.handle(m)).await,
            _ => unreachable!("the tests invoke the submission and the scheduler"),
        };
        for r in received {
            if !report.failures.contains(&r.message.message_id) {
                self.queues.delete(queue, &r.receipt);
            }
        }
        report
    }

    /// Requests since the last call: queue -> message count of each request.
    fn take_requests(&self) -> BTreeMap<String, Vec<usize>> {
        let mut by_queue: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (queue, n) in std::mem::take(&mut *self.requests.log.lock().unwrap()) {
            by_queue.entry(queue).or_default().push(n);
        }
        by_queue
    }

    async fn send_orders(&self, valid: usize, invalid: usize) {
        let mut bodies: Vec<String> = (0..valid)
            .map(|i| {
                format!(
                    r#"{{"order_id":"o-{i}","customer_id":"c","items":[{{"sku":"A","quantity":1}}],"reply_to":"{STATUS}"}}"#
                )
            })
            .collect();
        for i in 0..invalid {
            bodies.push(format!(
                r#"{{"order_id":"bad-{i}","customer_id":"c","items":[],"reply_to":"{STATUS}"}}"#
            ));
        }
        let url = QueueUrl(ORDERS.into());
        self.queues.send_batch(&url, bodies.into_iter().map(Outgoing::new).collect()).await.unwrap();
    }

    fn no_hold_waited(&self) {
        assert_eq!(self.started.elapsed(), std::time::Duration::ZERO, "a send waited for the max hold");
    }
}

fn requests(pairs: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
    pairs.iter().map(|(q, ns)| ((*q).to_owned(), ns.to_vec())).collect()
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_ten_orders_makes_one_request_per_destination_queue() {
    let w = World::new();
    w.send_orders(10, 0).await;
    let report = w.invoke(ORDERS, ORDERS_DLQ).await;
    assert_eq!(report, BatchReport::default());
    // Ten Schedules, then ten `received` updates: 2 requests where there were 20.
    assert_eq!(w.take_requests(), requests(&[(SCHEDULER, &[10]), (STATUS, &[10])]));
    assert_eq!((w.queues.depth(SCHEDULER), w.queues.depth(STATUS)), (10, 10));

    // The scheduler claims all ten: one request for their agent requests.
    let report = w.invoke(SCHEDULER, SCHEDULER_DLQ).await;
    assert_eq!(report, BatchReport::default());
    assert_eq!(w.take_requests(), requests(&[(AGENT, &[10])]));
    assert_eq!(w.queues.depth(AGENT), 10);
    w.no_hold_waited();
}

#[tokio::test(start_paused = true)]
async fn sends_go_out_in_rounds_as_the_handlers_reach_them() {
    let w = World::new();
    w.send_orders(9, 1).await;
    let report = w.invoke(ORDERS, ORDERS_DLQ).await;
    assert_eq!((report.failures.len(), report.kept), (0, 1), "{report:?}");
    // First round: nine Schedules and the bad order's `rejected`. Second: nine `received`
    // and the bad order kept in the dead-letter queue.
    assert_eq!(w.take_requests(), requests(&[(SCHEDULER, &[9]), (STATUS, &[1, 9]), (ORDERS_DLQ, &[1])]));
    assert_eq!((w.queues.depth(SCHEDULER), w.queues.depth(STATUS), w.queues.depth(ORDERS_DLQ)), (9, 10, 1));
    w.no_hold_waited();
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_fails_only_the_sends_in_it_with_their_handlers_semantics() {
    let w = World::new();
    w.send_orders(10, 0).await;
    // The status request fails: status is a courtesy, so every order still goes on.
    w.queues.fail_next_sends(STATUS, 1);
    let report = w.invoke(ORDERS, ORDERS_DLQ).await;
    assert_eq!(report, BatchReport::default());
    assert_eq!(w.take_requests(), requests(&[(SCHEDULER, &[10]), (STATUS, &[10])]));
    assert_eq!((w.queues.depth(SCHEDULER), w.queues.depth(STATUS)), (10, 0));

    // The Schedules' request fails: a required send, so each message is left for
    // redelivery (and its handler stops before its status update).
    w.send_orders(10, 0).await; // duplicates of orders not yet claimed: scheduled again
    let ids: Vec<String> = (0..10).map(|i| format!("o-{i}")).collect();
    for id in &ids {
        let task = w.store.task(&sas::domain::OrderId::parse(id).unwrap()).await.unwrap().unwrap();
        assert_eq!(task.state(), ProcessState::Pending);
    }
    w.queues.fail_next_sends(SCHEDULER, 1);
    let report = w.invoke(ORDERS, ORDERS_DLQ).await;
    assert_eq!((report.failures.len(), report.kept), (10, 0), "{report:?}");
    assert_eq!(w.take_requests(), requests(&[(SCHEDULER, &[10])]));
    w.no_hold_waited();
}

#[tokio::test(start_paused = true)]
async fn a_supervisor_page_sends_its_recoveries_in_one_request() {
    let w = World::new();
    w.send_orders(10, 0).await;
    w.invoke(ORDERS, ORDERS_DLQ).await;
    // The Schedules are lost: the tasks sit Pending until their deadline.
    w.queues.drain(SCHEDULER);
    w.take_requests();
    w.clock.advance(Policy::default().pending_timeout_ms + 1);
    let sweep = w.supervisor.sweep().await.unwrap();
    assert_eq!((sweep.examined, sweep.retried), (10, 10));
    let sent = w.take_requests();
    assert_eq!(sent.get(SCHEDULER), Some(&vec![10]), "{sent:?}");
    assert!(sent.values().all(|ns| ns.len() == 1), "one request per queue: {sent:?}");
    w.no_hold_waited();
}
