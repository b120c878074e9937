//! Ports that count the AWS requests and billed units a real deployment would pay for,
//! wrapped around the embedded backend (the `cost` benchmark's meter).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Serialize;

use sas::adapters::embedded::{EmbeddedQueues, EmbeddedStore, RecordingAlerts};
use sas::domain::{OperatorAlert, OrderId, ProcessState, TaskRecord, Timestamp};
use sas::ports::{
    AlertError, Alerts, CallStarts, Inserted, Noted, Outgoing, QueueError, QueueUrl, Queues, StateStore,
    StoreError, Written,
};

/// AWS requests and billed units, counted around the ports (see `cost`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct AwsUsage {
    pub ddb_gets: u64,
    pub ddb_puts: u64,
    pub ddb_queries: u64,
    /// Write request units, including the due and error indexes' writes.
    pub wru: f64,
    /// Read request units: strongly consistent gets, eventually consistent index queries.
    pub rru: f64,
    /// SendMessage / SendMessageBatch requests (one per 10 messages of one call).
    pub sqs_sends: u64,
    pub sqs_messages_sent: u64,
    /// ReceiveMessage requests the event source mapping makes that return messages.
    pub sqs_receives: u64,
    /// DeleteMessageBatch requests for the successfully handled messages.
    pub sqs_deletes: u64,
    pub sns_publishes: u64,
    /// Function invocations, by function.
    pub invocations: BTreeMap<String, u64>,
    /// The largest task item written (inserted or replaced), by the size billed.
    pub largest_item_bytes: usize,
    /// Of the DynamoDB figures above, flow control's: gate reads and conditional writes
    /// (a failed condition bills too), their units, the waiters' puts and gets
    /// (`StateStore::put_waiter`, `waiter`), and the agents' call marks (`CallStarts`).
    pub gate: GateUsage,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GateUsage {
    pub gate_reads: u64,
    pub gate_writes: u64,
    pub waiter_writes: u64,
    pub waiter_reads: u64,
    /// Limited agents' call marks: one conditional PutItem of a small item per call.
    pub call_marks: u64,
    pub wru: f64,
    pub rru: f64,
}

/// Size of a record as DynamoDB would bill it, approximated by its JSON length (attribute
/// names plus values; JSON's quotes and braces make it a slight over-estimate).
fn item_bytes<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

/// The size of a task's item as DynamoDB counts it against its 400 KB limit and bills
/// it: the item the DynamoDB adapter writes (`task_item`: the record's attributes, its
/// index keys and TTL), by DynamoDB's documented rules (a name's and a string's UTF-8
/// bytes, a number's significant digits two to a byte plus one, 3 bytes per list or map
/// and 1 per element). Smaller than the record's JSON length (`item_bytes`), which the
/// cost model bills on as an over-estimate.
pub fn dynamodb_item_bytes(task: &TaskRecord) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue as V;
    fn value(v: &V) -> usize {
        match v {
            V::S(s) => s.len(),
            V::N(n) => {
                let digits: String = n.chars().filter(char::is_ascii_digit).collect();
                let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
                significant.div_ceil(2) + 1
            }
            V::B(b) => b.as_ref().len(),
            V::Bool(_) | V::Null(_) => 1,
            V::L(items) => 3 + items.iter().map(|i| 1 + value(i)).sum::<usize>(),
            V::M(fields) => 3 + fields.iter().map(|(k, v)| 1 + k.len() + value(v)).sum::<usize>(),
            V::Ss(all) => all.iter().map(String::len).sum(),
            V::Ns(all) => all.iter().map(|n| value(&V::N(n.clone()))).sum(),
            V::Bs(all) => all.iter().map(|b| b.as_ref().len()).sum(),
            _ => 0,
        }
    }
    let tables = sas::config::TableNames::new("state");
    let item = sas::adapters::aws::dynamodb::task_item(task, &tables).expect("a record encodes");
    item.iter().map(|(name, v)| name.len() + value(v)).sum()
}

/// The record's JSON length: what the cost model bills a write on (`record_bytes`).
pub fn json_item_bytes(task: &TaskRecord) -> usize {
    record_bytes(task)
}

/// What a finished task's item adds for its TTL: `"expires_at":` and ten digits of epoch
/// seconds (the DynamoDB adapter's `task_item`).
const EXPIRES_AT_BYTES: usize = 23;

/// Size of a task's item: the record, plus `expires_at` once it is finished.
fn record_bytes(task: &TaskRecord) -> usize {
    item_bytes(task) + if task.state().is_terminal() { EXPIRES_AT_BYTES } else { 0 }
}

fn kb_units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

/// A request's way to DynamoDB, or its answer's back: the other handlers of the
/// invocation run meanwhile, as they do while a real call is on the network. Without it
/// the embedded store answers at once, and two handlers of one batch that write one
/// record (a parallel stage's branch replies) would never meet: on DynamoDB they read the
/// same revision, and all but one of their conditional writes fail and are billed.
async fn round_trip() {
    tokio::task::yield_now().await;
}

/// The embedded store with each call a round trip (`round_trip` before and after), and
/// nothing counted: `bench contention`'s store.
pub struct RoundTrips(pub Arc<EmbeddedStore>);

#[async_trait]
impl StateStore for RoundTrips {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        round_trip().await;
        let r = self.0.insert(task).await;
        round_trip().await;
        r
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        round_trip().await;
        let r = self.0.task(id).await;
        round_trip().await;
        r
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        round_trip().await;
        let r = self.0.replace(next, expected_revision).await;
        round_trip().await;
        r
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
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

pub struct CountingStore {
    pub(super) inner: Arc<EmbeddedStore>,
    pub(super) usage: Arc<Mutex<AwsUsage>>,
    /// Queries per `due` call (the DynamoDB adapter queries each due shard).
    pub(super) due_shards: u32,
}

impl CountingStore {
    fn with(&self, f: impl FnOnce(&mut AwsUsage)) {
        f(&mut self.usage.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// The due index's key of a record: it has an index entry exactly while it has a deadline.
fn index_key(task: Option<&TaskRecord>) -> Option<Timestamp> {
    task.and_then(|t| t.deadline())
}

/// Writes a table write costs the KEYS_ONLY due index: an entry put when the key appears,
/// deleted when it goes, both when it changes; a write that keeps it costs nothing.
fn index_writes(before: Option<Timestamp>, after: Option<Timestamp>) -> f64 {
    match (before, after) {
        (Some(a), Some(b)) if a == b => 0.0,
        (Some(_), Some(_)) => 2.0,
        (None, Some(_)) | (Some(_), None) => 1.0,
        (None, None) => 0.0,
    }
}

/// The error index's key of a record: it has an entry exactly while it is in Error.
fn error_key(task: Option<&TaskRecord>) -> Option<Timestamp> {
    task.filter(|t| t.state() == ProcessState::Error).map(|t| t.updated_at)
}

/// Write units a table write costs the error index, which projects whole items (ALL):
/// an entry put or deleted costs the item's size in 1 KB units, a moved key both, and
/// an entry whose item changes is rewritten. No happy-path record is in Error, so the
/// happy path's writes cost it nothing.
fn error_index_units(before: Option<&TaskRecord>, after: Option<&TaskRecord>) -> f64 {
    let units = |t: Option<&TaskRecord>| t.map_or(0.0, |t| kb_units(record_bytes(t), 1024));
    match (error_key(before), error_key(after)) {
        (None, None) => 0.0,
        (Some(_), None) => units(before),
        (None, Some(_)) => units(after),
        (Some(a), Some(b)) if a == b => units(before).max(units(after)),
        (Some(_), Some(_)) => units(before) + units(after),
    }
}

#[async_trait]
impl StateStore for CountingStore {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let inserted = self.inner.insert(task).await?;
        // A conditional PutItem; a failed condition (duplicate) bills the write too.
        let size = match &inserted {
            Inserted::New => record_bytes(task),
            Inserted::Exists(existing) => record_bytes(task).max(record_bytes(existing)),
        };
        let index = if inserted == Inserted::New {
            index_writes(None, index_key(Some(task))) + error_index_units(None, Some(task))
        } else {
            0.0
        };
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += kb_units(size, 1024) + index;
            u.largest_item_bytes = u.largest_item_bytes.max(size);
        });
        Ok(inserted)
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        round_trip().await;
        let r = self.inner.task(id).await?;
        round_trip().await;
        let bytes = r.as_ref().map_or(0, record_bytes);
        self.with(|u| {
            u.ddb_gets += 1;
            u.rru += kb_units(bytes, 4096);
        });
        Ok(r)
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        // Billed on the larger of the old and new item; a failed condition bills too.
        let before = self.inner.task(&next.order_id).await?;
        let size = record_bytes(next).max(before.as_ref().map_or(0, record_bytes));
        round_trip().await;
        let written = self.inner.replace(next, expected_revision).await?;
        round_trip().await;
        let index = match written {
            Written::RevisionMoved => 0.0,
            Written::Applied => {
                index_writes(index_key(before.as_ref()), index_key(Some(next)))
                    + error_index_units(before.as_ref(), Some(next))
            }
        };
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += kb_units(size, 1024) + index;
            u.largest_item_bytes = u.largest_item_bytes.max(size);
        });
        Ok(written)
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        let r = self.inner.due(now, limit).await?;
        // A KEYS_ONLY entry: shard, deadline and the table key, well under 100 bytes.
        let bytes: usize = r.iter().map(|id| id.as_str().len() + 40).sum();
        let shards = self.due_shards.max(1) as f64;
        self.with(|u| {
            u.ddb_queries += self.due_shards.max(1) as u64;
            // Eventually consistent: half a unit per 4 KB, at least half a unit per query.
            u.rru += (0.5 * bytes.div_ceil(4096) as f64).max(0.5 * shards);
        });
        Ok(r)
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, StoreError> {
        round_trip().await;
        let r = self.inner.gate(agent).await?;
        round_trip().await;
        let bytes = r.as_ref().map_or(0, gate_bytes);
        self.with(|u| {
            u.ddb_gets += 1;
            u.rru += kb_units(bytes, 4096);
            u.gate.gate_reads += 1;
            u.gate.rru += kb_units(bytes, 4096);
        });
        Ok(r)
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<Written, StoreError> {
        let before = self.inner.gate(&next.agent).await?;
        let size = gate_bytes(next).max(before.as_ref().map_or(0, gate_bytes));
        round_trip().await;
        let written = self.inner.replace_gate(next, expected_revision).await?;
        round_trip().await;
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += kb_units(size, 1024);
            u.gate.gate_writes += 1;
            u.gate.wru += kb_units(size, 1024);
        });
        Ok(written)
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError> {
        let noted = self.inner.put_waiter(agent, ticket, order_id, now).await?;
        // A conditional PutItem; a failed condition bills the write too.
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += 1.0;
            u.gate.waiter_writes += 1;
            u.gate.wru += 1.0;
        });
        Ok(noted)
    }
    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        let r = self.inner.waiter(agent, ticket).await?;
        self.with(|u| {
            u.ddb_gets += 1;
            u.rru += 1.0;
            u.gate.waiter_reads += 1;
            u.gate.rru += 1.0;
        });
        Ok(r)
    }
}

#[async_trait]
impl CallStarts for CountingStore {
    async fn start_call(
        &self,
        mark: &sas::domain::gate::CallMark,
    ) -> Result<sas::domain::gate::CallStart, StoreError> {
        round_trip().await;
        let started = self.inner.start_call(mark).await?;
        round_trip().await;
        // A conditional PutItem of a key and a TTL, under 1 KB; a failed condition bills too.
        self.with(|u| {
            u.ddb_puts += 1;
            u.wru += 1.0;
            u.gate.call_marks += 1;
            u.gate.wru += 1.0;
        });
        Ok(started)
    }
}

/// A gate item's size as DynamoDB bills it, near enough: its attributes as JSON.
fn gate_bytes(gate: &sas::domain::gate::Gate) -> usize {
    serde_json::to_vec(gate).map_or(0, |v| v.len()) + 16
}

pub struct CountingQueues {
    pub(super) inner: Arc<EmbeddedQueues>,
    pub(super) usage: Arc<Mutex<AwsUsage>>,
}

#[async_trait]
impl Queues for CountingQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        let n = messages.len() as u64;
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sqs_sends += n.div_ceil(10).max(1);
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sqs_messages_sent += n;
        self.inner.send_batch(queue, messages).await
    }
}

pub struct CountingAlerts {
    pub(super) inner: RecordingAlerts,
    pub(super) usage: Arc<Mutex<AwsUsage>>,
}

#[async_trait]
impl Alerts for CountingAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).sns_publishes += 1;
        self.inner.raise(alert).await
    }
}
