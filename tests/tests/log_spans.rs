//! Every log line of a handler carries the order it is about. The batch driver runs a
//! batch's messages concurrently in one task, so a handler that suspends (every real
//! adapter call does) interleaves with the others: the span fields on each line must
//! still be its own order's, or the functions' JSON logs point operators at the wrong
//! order.

use sas_tests::Lines;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::FastRandom;
use sas::domain::{OrderId, Policy, TaskRecord, Timestamp, Workflows};
use sas::handlers::{DeadLetters, Deps, Inbound, Settings, Submission, Topology, run_batch};
use sas::ports::{Inserted, Noted, QueueUrl, StateStore, StoreError, Written};

/// The embedded store, but every call suspends once first, as a network call does.
struct Suspending(EmbeddedStore);

#[async_trait]
impl StateStore for Suspending {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        tokio::task::yield_now().await;
        self.0.insert(task).await
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        tokio::task::yield_now().await;
        self.0.task(id).await
    }
    async fn replace(&self, next: &TaskRecord, expected: u64) -> Result<Written, StoreError> {
        tokio::task::yield_now().await;
        self.0.replace(next, expected).await
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        tokio::task::yield_now().await;
        self.0.due(now, limit).await
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, StoreError> {
        self.0.gate(agent).await
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<Written, StoreError> {
        self.0.replace_gate(next, expected_revision).await
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError> {
        self.0.put_waiter(agent, ticket, order_id, now).await
    }
    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        self.0.waiter(agent, ticket).await
    }
}

#[tokio::test]
async fn each_line_names_its_own_order_when_a_batch_interleaves() {
    let lines = Lines::default();
    let writer = lines.clone();
    // The functions' format (sas::lambda::init_tracing), into a buffer.
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let clock = Arc::new(ManualClock::at(1_000));
    let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 1));
    for q in ["orders", "orders-dlq", "scheduler", "agent"] {
        queues.create(q, QueueSettings::default());
    }
    let metrics = Arc::new(CountingMetrics::default());
    let deps = Deps {
        store: Arc::new(Suspending(EmbeddedStore::new())),
        queues: queues.clone(),
        alerts: Arc::new(RecordingAlerts::default()),
        clock,
        random: Arc::new(FastRandom::seeded(1)),
        metrics: metrics.clone(),
    };
    let settings = Settings::new(
        Policy::default(),
        Workflows::builtin(),
        Topology::new(QueueUrl("scheduler".into()), QueueUrl("agent".into())),
        sas::adapters::embedded::queue_names::reply_to_rules(),
    );
    let submission = Submission::new(deps, settings);
    let dead_letters = DeadLetters {
        queues,
        source: QueueUrl("orders".into()),
        dead_letter_queue: QueueUrl("orders-dlq".into()),
        metrics,
    };
    let ids: Vec<String> = (0..10).map(|i| format!("o-{i}")).collect();
    let batch = ids
        .iter()
        .map(|id| Inbound {
            message_id: id.clone(),
            body: format!(r#"{{"order_id":"{id}","customer_id":"c","items":[{{"sku":"A","quantity":1}}]}}"#),
            receive_count: 1,
            sender: None,
        })
        .collect();
    let report = run_batch(batch, &dead_letters, |m| submission.handle(m)).await;
    assert!(report.failures.is_empty() && report.kept == 0, "{report:?}");

    let text = String::from_utf8(lines.0.lock().unwrap_or_else(|p| p.into_inner()).clone()).expect("utf-8");
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let spans = v["spans"].as_array().cloned().unwrap_or_default();
        assert!(spans.len() <= 1, "a line inside another order's span: {line}");
        if v["fields"]["message"] == "order accepted" {
            let id = v["span"]["order_id"].as_str().unwrap_or_else(|| panic!("no order id: {line}"));
            *accepted.entry(id.to_owned()).or_default() += 1;
        }
    }
    let want: BTreeMap<String, usize> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(accepted, want, "each order's acceptance logged once, under its own id");
}
