//! The state store on DynamoDB: an orders table and a state table, both keyed by
//! `order_id`, and a sparse global secondary index over the state table that holds
//! exactly the non-terminal tasks, keyed by a shard and the deadline.
//!
//! Every task write puts the domain's whole next record, conditional on the revision
//! the decision was made on. One condition on one attribute is what makes claims
//! exclusive, replies fenced and recoveries happen once; the adapter adds no logic of
//! its own on top.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

pub use crate::config::TableNames;
use crate::domain::{OrderId, OrderRecord, TaskRecord, Timestamp};
use crate::ports::{Inserted, StateStore, StoreError, Written};

/// Attribute names the adapter adds to or reads from items, beside the records' own.
pub const KEY: &str = "order_id";
pub const DUE_SHARD: &str = "due_shard";
pub const DEADLINE: &str = "deadline";
pub const REVISION: &str = "revision";

type Item = HashMap<String, AttributeValue>;

/// The due-index shard of a task: FNV-1a of the order id, which (unlike std's
/// hasher) is the same in every build, so writers and the supervisor always agree.
pub fn due_shard(order_id: &OrderId, shards: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in order_id.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(shards.max(1))) as u32
}

fn corrupt(order_id: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { order_id: order_id.to_owned(), reason: reason.to_string() }
}

fn unavailable<E, R>(what: &str, err: SdkError<E, R>) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    StoreError::Unavailable(format!("{what}: {}", DisplayErrorContext(err)))
}

/// The state table's item for a task: the record's own attributes, minus absent
/// optionals, plus `due_shard` while the task is non-terminal.
///
/// Absent must mean absent, not NULL: DynamoDB rejects a NULL in an index key
/// attribute, and only an item lacking `deadline` and `due_shard` stays out of the
/// sparse index. The domain sets `deadline` to `None` exactly when a task ends.
pub fn task_item(task: &TaskRecord, due_shards: u32) -> Result<Item, StoreError> {
    let mut item: Item = serde_dynamo::aws_sdk_dynamodb_1::to_item(task)
        .map_err(|e| corrupt(task.order_id.as_str(), format!("cannot encode task: {e}")))?;
    item.retain(|_, value| !matches!(value, AttributeValue::Null(_)));
    if task.deadline.is_some() {
        item.insert(
            DUE_SHARD.to_owned(),
            AttributeValue::S(due_shard(&task.order_id, due_shards).to_string()),
        );
    }
    Ok(item)
}

pub fn task_from_item(item: Item) -> Result<TaskRecord, StoreError> {
    let id = key_of(&item);
    serde_dynamo::aws_sdk_dynamodb_1::from_item(item).map_err(|e| corrupt(&id, e))
}

/// The orders table's item: the record plus its key lifted to the top level.
pub fn order_item(order: &OrderRecord) -> Result<Item, StoreError> {
    let mut item: Item = serde_dynamo::aws_sdk_dynamodb_1::to_item(order)
        .map_err(|e| corrupt(order.order.order_id.as_str(), format!("cannot encode order: {e}")))?;
    item.insert(KEY.to_owned(), AttributeValue::S(order.order.order_id.as_str().to_owned()));
    Ok(item)
}

pub fn order_from_item(item: Item) -> Result<OrderRecord, StoreError> {
    let id = key_of(&item);
    serde_dynamo::aws_sdk_dynamodb_1::from_item(item).map_err(|e| corrupt(&id, e))
}

fn key_of(item: &Item) -> String {
    match item.get(KEY) {
        Some(AttributeValue::S(s)) => s.clone(),
        _ => "<no order_id>".to_owned(),
    }
}

fn key(id: &OrderId) -> Item {
    HashMap::from([(KEY.to_owned(), AttributeValue::S(id.as_str().to_owned()))])
}

/// `StateStore` over DynamoDB.
pub struct DynamoStore {
    client: Client,
    tables: TableNames,
    due_items_read: AtomicU64,
}

impl DynamoStore {
    pub fn new(client: Client, tables: TableNames) -> DynamoStore {
        DynamoStore { client, tables, due_items_read: AtomicU64::new(0) }
    }

    pub fn tables(&self) -> &TableNames {
        &self.tables
    }

    /// Index entries read by `due` so far: the sweep's cost, for benchmarks.
    pub fn due_items_read(&self) -> u64 {
        self.due_items_read.load(Ordering::Relaxed)
    }

    fn put(table: &str, item: Item) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("building transaction: {e}")))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// Up to `limit` due entries of one shard, oldest deadline first.
    async fn due_in_shard(&self, shard: u32, now: Timestamp, limit: usize) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let remaining = limit - items.len();
            let page = self
                .client
                .query()
                .table_name(&self.tables.state)
                .index_name(&self.tables.due_index)
                .key_condition_expression("#s = :s AND #d <= :now")
                .expression_attribute_names("#s", DUE_SHARD)
                .expression_attribute_names("#d", DEADLINE)
                .expression_attribute_values(":s", AttributeValue::S(shard.to_string()))
                .expression_attribute_values(":now", AttributeValue::N(now.0.to_string()))
                .scan_index_forward(true)
                .limit(i32::try_from(remaining).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| unavailable("querying the due index", e))?;
            self.due_items_read.fetch_add(page.items().len() as u64, Ordering::Relaxed);
            items.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(next) if items.len() < limit => start = Some(next.clone()),
                _ => return Ok(items),
            }
        }
    }
}

#[async_trait]
impl StateStore for DynamoStore {
    async fn insert(&self, order: &OrderRecord, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let result = self
            .client
            .transact_write_items()
            .transact_items(Self::put(&self.tables.orders, order_item(order)?)?)
            .transact_items(Self::put(&self.tables.state, task_item(task, self.tables.due_shards)?)?)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Inserted::New),
            Err(err) => err,
        };
        let id_exists = err
            .as_service_error()
            .and_then(|e| match e {
                aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(t) => Some(t),
                _ => None,
            })
            .is_some_and(|t| t.cancellation_reasons().iter().any(|r| r.code() == Some("ConditionalCheckFailed")));
        if !id_exists {
            // Anything else, a TransactionConflict with a concurrent duplicate included,
            // is worth retrying: the retry will see the order one way or the other.
            return Err(unavailable("inserting order and task", err));
        }
        match self.order(&order.order.order_id).await? {
            Some(existing) => Ok(Inserted::Exists(existing)),
            // Only the task row existed: a half-written pair the transaction rules out,
            // unless someone wrote the tables by hand.
            None => Err(corrupt(order.order.order_id.as_str(), "a task exists without its order record")),
        }
    }

    async fn order(&self, id: &OrderId) -> Result<Option<OrderRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.orders)
            .set_key(Some(key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable("reading order", e))?;
        out.item.map(order_from_item).transpose()
    }

    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.state)
            .set_key(Some(key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable("reading task", e))?;
        out.item.map(task_from_item).transpose()
    }

    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.state)
            .set_item(Some(task_item(next, self.tables.due_shards)?))
            .condition_expression("#r = :expected")
            .expression_attribute_names("#r", REVISION)
            .expression_attribute_values(":expected", AttributeValue::N(expected_revision.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Written::Applied),
            // Also the answer when the row is gone: there is no revision to match.
            Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {
                Ok(Written::RevisionMoved)
            }
            Err(e) => Err(unavailable("writing task", e)),
        }
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let shards = self.tables.due_shards.max(1);
        let pages =
            futures::future::try_join_all((0..shards).map(|shard| self.due_in_shard(shard, now, limit)))
                .await?;
        let mut due = pages.into_iter().flatten().map(task_from_item).collect::<Result<Vec<_>, _>>()?;
        due.sort_by(|a, b| (a.deadline, &a.order_id).cmp(&(b.deadline, &b.order_id)));
        due.truncate(limit);
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Order, Policy, ProcessState};

    fn task(id: &str) -> TaskRecord {
        let order = Order {
            order_id: OrderId::parse(id).unwrap(),
            customer_id: "c".into(),
            items: vec![crate::domain::LineItem { sku: "A".into(), quantity: 1 }],
            workflow: "single-step".into(),
        };
        TaskRecord::new(&order, None, Timestamp(1_000), &Policy::default())
    }

    #[test]
    fn live_tasks_carry_index_keys_and_finished_ones_do_not() {
        let live = task("o-1");
        let item = task_item(&live, 4).unwrap();
        assert_eq!(item.get(DEADLINE), Some(&AttributeValue::N("61000".into())));
        assert!(matches!(item.get(DUE_SHARD), Some(AttributeValue::S(_))));
        assert!(item.values().all(|v| !matches!(v, AttributeValue::Null(_))), "{item:?}");
        assert_eq!(task_from_item(item).unwrap(), live);

        let mut done = live.clone();
        done.state = ProcessState::Processed;
        done.deadline = None;
        let item = task_item(&done, 4).unwrap();
        assert!(!item.contains_key(DEADLINE) && !item.contains_key(DUE_SHARD));
        assert_eq!(task_from_item(item).unwrap(), done);
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        // Pinned (FNV-1a 64): a change here would strand every live task in a shard
        // the supervisor no longer looks in.
        let shard = |id: &str, n| due_shard(&OrderId::parse(id).unwrap(), n);
        assert_eq!((shard("o-1", 4), shard("o-2", 4), shard("abc", 4)), (0, 1, 3));
        assert_eq!((shard("o-1", 7), shard("o-2", 7), shard("abc", 7)), (3, 5, 5));
        assert_eq!(shard("abc", 1), 0);
        let spread: std::collections::BTreeSet<u32> =
            (0..100).map(|i| due_shard(&OrderId::parse(&format!("o-{i}")).unwrap(), 4)).collect();
        assert_eq!(spread, (0..4).collect());
    }

    #[test]
    fn undecodable_items_are_corrupt_not_unavailable() {
        let mut item = task_item(&task("o-2"), 4).unwrap();
        item.insert("state".into(), AttributeValue::S("Exploded".into()));
        match task_from_item(item) {
            Err(StoreError::Corrupt { order_id, .. }) => assert_eq!(order_id, "o-2"),
            other => panic!("{other:?}"),
        }
    }
}
