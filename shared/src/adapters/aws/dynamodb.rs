//! The state store on DynamoDB: one state table keyed by `order_id`, one item per
//! order holding the order and its task, and a sparse global secondary index over it
//! that holds exactly the non-terminal tasks, keyed by a shard and the deadline, with
//! keys only (`KEYS_ONLY`): a write that leaves the deadline alone costs the index
//! nothing, and the supervisor re-reads every task it acts on anyway.
//!
//! Accepting an order is one PutItem conditional on the id being new. Every later
//! write puts the domain's whole next record, conditional on the revision the
//! decision was made on. One condition on one attribute is what makes claims
//! exclusive, replies fenced and recoveries happen once; the adapter adds no logic of
//! its own on top.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

pub use crate::config::TableNames;
use crate::domain::{OrderId, TaskRecord, Timestamp};
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
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.state)
            .set_item(Some(task_item(task, self.tables.due_shards)?))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Inserted::New),
            Err(err) => err,
        };
        let existing = match err.as_service_error() {
            Some(PutItemError::ConditionalCheckFailedException(e)) => e.item().cloned(),
            _ => return Err(unavailable("inserting task", err)),
        };
        // The failed condition hands back the item it found; an endpoint that does not
        // honour ReturnValuesOnConditionCheckFailure costs one more read.
        let existing = match existing {
            Some(item) => Some(task_from_item(item)?),
            None => self.task(&task.order_id).await?,
        };
        match existing {
            Some(existing) => Ok(Inserted::Exists(Box::new(existing))),
            // Deleted between the failed condition and the read: only by hand.
            None => {
                Err(StoreError::Unavailable(format!("task {} vanished while being inserted", task.order_id)))
            }
        }
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

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let shards = self.tables.due_shards.max(1);
        let pages =
            futures::future::try_join_all((0..shards).map(|shard| self.due_in_shard(shard, now, limit)))
                .await?;
        let mut due = pages.into_iter().flatten().map(due_entry).collect::<Result<Vec<_>, _>>()?;
        due.sort();
        due.truncate(limit);
        Ok(due.into_iter().map(|(_, id)| id).collect())
    }
}

/// A due-index entry: its deadline and the task's key, which is all a KEYS_ONLY index
/// projects besides the shard.
fn due_entry(item: Item) -> Result<(u64, OrderId), StoreError> {
    let id = key_of(&item);
    let deadline = match item.get(DEADLINE) {
        Some(AttributeValue::N(n)) => n.parse::<u64>().ok(),
        _ => None,
    };
    match (deadline, OrderId::parse(&id)) {
        (Some(deadline), Ok(order_id)) => Ok((deadline, order_id)),
        _ => Err(corrupt(&id, "due-index entry without a numeric deadline or a valid order id")),
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
            workflow_version: None,
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
