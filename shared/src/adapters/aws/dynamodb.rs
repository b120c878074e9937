//! The state store on DynamoDB: one state table keyed by `order_id`, one item per
//! order holding the order and its task, and a sparse global secondary index over it
//! that holds exactly the non-terminal tasks, keyed by a shard and the deadline, with
//! keys only (`KEYS_ONLY`): a write that leaves the deadline alone costs the index
//! nothing, and the supervisor re-reads every task it acts on anyway.
//!
//! A second sparse index, the error index, holds exactly the tasks in Error, keyed by
//! one constant partition and `updated_at`, whole items (`ALL`): operators list them
//! newest first with no further reads, and since no happy-path item carries its key,
//! the happy path never writes it. One partition, not shards like the due index: it
//! takes about a thousand write units a second, hundreds of orders a second ending in
//! Error, far past what operators can act on (the orders-failed alarm fires long
//! before); and an unsharded newest-first query reads exactly the entries it returns.
//!
//! Finished tasks carry `expires_at` (epoch seconds), DynamoDB's TTL attribute: the
//! table keeps each for the configured retention after its last write, then deletes it
//! for free. A task that becomes live again loses the attribute with its next write,
//! since every write puts the whole item.
//!
//! Accepting an order is one PutItem conditional on the id being new. Every later
//! write puts the domain's whole next record, conditional on the revision the
//! decision was made on. One condition on one attribute is what makes claims
//! exclusive, replies fenced and recoveries happen once; the adapter adds no logic of
//! its own on top.
//!
//! A limited agent's gate is written the same way, on its revision, and a waiter note
//! (`gate#<agent>#<ticket>`) only where the ticket has none or one naming the same
//! order; a limited agent's call mark (`call#...`, the agent's one write) only where it
//! is new: no write of the adapter is unconditional.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use crate::domain::gate::{CallMark, CallStart, Gate};
use crate::domain::{OrderId, ProcessState, TaskRecord, Timestamp};
pub use crate::ports::TableNames;
use crate::ports::{
    CallStarts, Inserted, Listing, NOT_INDEXED, Noted, StateStore, StoreError, TaskListing, Written,
};

/// Attribute names the adapter adds to or reads from items, beside the records' own.
pub const KEY: &str = "order_id";
pub const DUE_SHARD: &str = "due_shard";
pub const DEADLINE: &str = "deadline";
pub const REVISION: &str = "revision";
pub const ERROR_SHARD: &str = "error_shard";
/// The finished index's partition key: the due shard of the order, on Processed and
/// Compensated records of a deployment that lists them (`TableNames::list_finished`).
pub const FINISHED_SHARD: &str = "finished_shard";
pub const UPDATED_AT: &str = "updated_at";
/// The table's TTL attribute, in epoch seconds as DynamoDB requires.
pub const EXPIRES_AT: &str = "expires_at";
/// The error index's one partition. A string, like `due_shard`, so the index could be
/// sharded later without changing the attribute's type.
pub const ERROR_PARTITION: &str = "0";
/// Keys per BatchGetItem request, DynamoDB's maximum.
const BATCH_GET_MAX: usize = 100;

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

/// The error codes DynamoDB throttles with (after the SDK's own retries): a hot item or
/// partition, the table's provisioned or on-demand ceiling, the account's request rate.
const THROTTLING_CODES: [&str; 3] =
    ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"];

fn unavailable<E, R>(what: &str, err: SdkError<E, R>) -> StoreError
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let throttled =
        err.as_service_error().and_then(|e| e.code()).is_some_and(|c| THROTTLING_CODES.contains(&c));
    let why = format!("{what}: {}", DisplayErrorContext(err));
    if throttled { StoreError::Throttled(why) } else { StoreError::Unavailable(why) }
}

/// A PutItem refused on its condition: an outcome of the write (`Written`, `Noted`) that
/// the caller decides on, never an outage.
fn condition_failed<R>(err: &SdkError<PutItemError, R>) -> bool {
    err.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception())
}

/// When a finished task's record expires, in epoch seconds: `retention_days` after its
/// last write. `None` while the task is live, or when records are kept forever (0).
pub fn expires_at(task: &TaskRecord, retention_days: u32) -> Option<u64> {
    (task.state().is_terminal() && retention_days > 0)
        .then(|| task.updated_at.0 / 1_000 + u64::from(retention_days) * 24 * 3_600)
}

/// The state table's item for a task: the record's own attributes, minus absent
/// optionals, plus `due_shard` while the task is non-terminal, `error_shard` while it
/// is in Error, and `expires_at` once it is finished (and retention is not forever).
///
/// Absent must mean absent, not NULL: DynamoDB rejects a NULL in an index key
/// attribute, and only an item lacking `deadline` and `due_shard` stays out of the
/// sparse index. The domain sets `deadline` to `None` exactly when a task ends.
pub fn task_item(task: &TaskRecord, tables: &TableNames) -> Result<Item, StoreError> {
    let mut item: Item = serde_dynamo::aws_sdk_dynamodb_1::to_item(task)
        .map_err(|e| corrupt(task.order_id.as_str(), format!("cannot encode task: {e}")))?;
    item.retain(|_, value| !matches!(value, AttributeValue::Null(_)));
    if task.deadline().is_some() {
        item.insert(
            DUE_SHARD.to_owned(),
            AttributeValue::S(due_shard(&task.order_id, tables.due_shards).to_string()),
        );
    }
    if task.state() == ProcessState::Error {
        item.insert(ERROR_SHARD.to_owned(), AttributeValue::S(ERROR_PARTITION.to_owned()));
    }
    if tables.list_finished && matches!(task.state(), ProcessState::Processed | ProcessState::Compensated) {
        item.insert(
            FINISHED_SHARD.to_owned(),
            AttributeValue::S(due_shard(&task.order_id, tables.due_shards).to_string()),
        );
    }
    if let Some(at) = expires_at(task, tables.retention_days) {
        item.insert(EXPIRES_AT.to_owned(), AttributeValue::N(at.to_string()));
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

/// What `list` has read so far, for benchmarks: the figures DynamoDB itself returned
/// (`Count`, `ScannedCount`) beside the items this adapter handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListingReads {
    /// Query requests made.
    pub queries: u64,
    /// Index entries this adapter received from the queries.
    pub index_items: u64,
    /// The same as DynamoDB reported it: the sum of the responses' `Count`.
    pub index_count: u64,
    /// Index entries DynamoDB examined: the sum of the responses' `ScannedCount`, what
    /// the query was billed on (it has no filter, so equal to `index_count` unless
    /// DynamoDB read entries it did not return).
    pub index_scanned: u64,
    /// Task items read from the table after a keys-only index (BatchGetItem).
    pub task_reads: u64,
    /// BatchGetItem requests made, retries of unprocessed keys included.
    pub batch_gets: u64,
}

#[derive(Default)]
struct ListingCounters {
    queries: AtomicU64,
    index_items: AtomicU64,
    index_count: AtomicU64,
    index_scanned: AtomicU64,
    task_reads: AtomicU64,
    batch_gets: AtomicU64,
}

/// `StateStore` over DynamoDB.
pub struct DynamoStore {
    client: Client,
    tables: TableNames,
    due_items_read: AtomicU64,
    listing: ListingCounters,
}

impl DynamoStore {
    pub fn new(client: Client, tables: TableNames) -> DynamoStore {
        DynamoStore { client, tables, due_items_read: AtomicU64::new(0), listing: ListingCounters::default() }
    }

    /// What `list` has read so far: its cost, for benchmarks.
    pub fn listing_reads(&self) -> ListingReads {
        let c = &self.listing;
        ListingReads {
            queries: c.queries.load(Ordering::Relaxed),
            index_items: c.index_items.load(Ordering::Relaxed),
            index_count: c.index_count.load(Ordering::Relaxed),
            index_scanned: c.index_scanned.load(Ordering::Relaxed),
            task_reads: c.task_reads.load(Ordering::Relaxed),
            batch_gets: c.batch_gets.load(Ordering::Relaxed),
        }
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

    /// Up to `limit` items of one index partition, in `forward` order of its range key,
    /// following pages until `limit` or the end. `range` is an optional lower bound on
    /// the range key.
    async fn query_partition(
        &self,
        index: &str,
        (hash, value): (&str, &str),
        range: Option<(&str, u64)>,
        forward: bool,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        let condition = if range.is_some() { "#h = :h AND #r >= :r" } else { "#h = :h" };
        while items.len() < limit {
            let mut query = self
                .client
                .query()
                .table_name(&self.tables.state)
                .index_name(index)
                .key_condition_expression(condition)
                .expression_attribute_names("#h", hash)
                .expression_attribute_values(":h", AttributeValue::S(value.to_owned()))
                .scan_index_forward(forward)
                .limit(i32::try_from(limit - items.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take());
            if let Some((name, bound)) = range {
                query = query
                    .expression_attribute_names("#r", name)
                    .expression_attribute_values(":r", AttributeValue::N(bound.to_string()));
            }
            let page = query.send().await.map_err(|e| {
                // An index the table lacks: DynamoDB answers ValidationException ("does
                // not have the specified index"), moto ResourceNotFoundException
                // ("Invalid index"); both name the index.
                // Only the finished index may be missing (it is opt-in); one being built
                // ("backfilling") is there, and is an outage for now.
                let missing = index == self.tables.finished_index
                    && e.as_service_error().is_some_and(|s| {
                        matches!(s.code(), Some("ValidationException" | "ResourceNotFoundException"))
                            && s.message().is_some_and(|m| m.contains(index) && !m.contains("backfill"))
                    });
                if missing {
                    StoreError::NotIndexed(format!("table {} has no index {index}", self.tables.state))
                } else {
                    unavailable(&format!("querying {index}"), e)
                }
            })?;
            let c = &self.listing;
            c.queries.fetch_add(1, Ordering::Relaxed);
            c.index_items.fetch_add(page.items().len() as u64, Ordering::Relaxed);
            c.index_count.fetch_add(u64::try_from(page.count()).unwrap_or(0), Ordering::Relaxed);
            c.index_scanned.fetch_add(u64::try_from(page.scanned_count()).unwrap_or(0), Ordering::Relaxed);
            items.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(next) => start = Some(next.clone()),
                None => break,
            }
        }
        items.truncate(limit);
        Ok(items)
    }

    /// The tasks in Error, newest first, from the error index (whole items: no reads).
    async fn list_errors(
        &self,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let items = self
            .query_partition(
                &self.tables.error_index,
                (ERROR_SHARD, ERROR_PARTITION),
                since.map(|s| (UPDATED_AT, s.0)),
                false,
                limit,
            )
            .await?;
        // An entry is the whole item as it was when it entered the index, which may lag
        // the table by a moment (a task just resubmitted can still show as in Error).
        items.into_iter().map(task_from_item).collect()
    }

    /// The finished tasks newest first: their keys from every shard of the finished
    /// index, merged, then the tasks themselves (finished records never change).
    async fn list_finished(
        &self,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let index = self.tables.finished_index.as_str();
        let pages = futures::future::try_join_all((0..self.tables.due_shards.max(1)).map(|shard| {
            let shard = shard.to_string();
            let range = since.map(|s| (UPDATED_AT, s.0));
            async move { self.query_partition(index, (FINISHED_SHARD, &shard), range, false, limit).await }
        }))
        .await?;
        let mut entries: Vec<(u64, OrderId)> = pages
            .into_iter()
            .flatten()
            .map(|item| {
                let id = key_of(&item);
                match (item.get(UPDATED_AT), OrderId::parse(&id)) {
                    (Some(AttributeValue::N(n)), Ok(order_id)) if n.parse::<u64>().is_ok() => {
                        Ok((n.parse::<u64>().unwrap_or(0), order_id))
                    }
                    _ => Err(corrupt(
                        &id,
                        "finished-index entry without a numeric updated_at or a valid order id",
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        entries.sort_by(|a, b| b.cmp(a));
        entries.truncate(limit);
        let ids: Vec<OrderId> = entries.into_iter().map(|(_, id)| id).collect();
        let mut tasks = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(BATCH_GET_MAX) {
            tasks.extend(self.batch_get(chunk).await?);
        }
        tasks.sort_by(|a, b| (b.updated_at, &b.order_id).cmp(&(a.updated_at, &a.order_id)));
        Ok(tasks)
    }

    /// The live tasks, oldest deadline first: their keys from every due-index shard,
    /// then the tasks themselves, read consistently; those finished since are dropped.
    async fn list_live(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        let shards = self.tables.due_shards.max(1);
        let index = self.tables.due_index.as_str();
        let pages = futures::future::try_join_all((0..shards).map(|shard| {
            let shard = shard.to_string();
            async move { self.query_partition(index, (DUE_SHARD, &shard), None, true, limit).await }
        }))
        .await?;
        let mut entries = pages.into_iter().flatten().map(due_entry).collect::<Result<Vec<_>, _>>()?;
        entries.sort();
        entries.truncate(limit);
        let ids: Vec<OrderId> = entries.into_iter().map(|(_, id)| id).collect();
        let mut tasks = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(BATCH_GET_MAX) {
            tasks.extend(self.batch_get(chunk).await?);
        }
        tasks.retain(|t| !t.state().is_terminal());
        tasks.sort_by(|a, b| (a.deadline(), &a.order_id).cmp(&(b.deadline(), &b.order_id)));
        Ok(tasks)
    }

    /// Consistent reads of up to 100 tasks, retrying the keys DynamoDB leaves
    /// unprocessed (it may under load); a task deleted meanwhile is simply absent.
    async fn batch_get(&self, ids: &[OrderId]) -> Result<Vec<TaskRecord>, StoreError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let keys = KeysAndAttributes::builder()
            .set_keys(Some(ids.iter().map(key).collect()))
            .consistent_read(true)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("building a batch read: {e}")))?;
        let mut pending = Some(HashMap::from([(self.tables.state.clone(), keys)]));
        let mut tasks = Vec::with_capacity(ids.len());
        let mut backoff_ms = 10;
        while let Some(request) = pending.take().filter(|r| !r.is_empty()) {
            let out = self
                .client
                .batch_get_item()
                .set_request_items(Some(request))
                .send()
                .await
                .map_err(|e| unavailable("reading tasks", e))?;
            self.listing.batch_gets.fetch_add(1, Ordering::Relaxed);
            if let Some(items) = out.responses().and_then(|r| r.get(&self.tables.state)) {
                self.listing.task_reads.fetch_add(items.len() as u64, Ordering::Relaxed);
                for item in items {
                    tasks.push(task_from_item(item.clone())?);
                }
            }
            pending = out.unprocessed_keys().cloned().filter(|u| !u.is_empty());
            if pending.is_some() {
                if backoff_ms > 5_000 {
                    return Err(StoreError::Unavailable("reading tasks: keys left unprocessed".into()));
                }
                tokio::time::sleep(std::time::Duration::from_millis(backoff_ms)).await;
                backoff_ms *= 2;
            }
        }
        Ok(tasks)
    }
}

#[async_trait]
impl StateStore for DynamoStore {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.state)
            .set_item(Some(task_item(task, &self.tables)?))
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
            .set_item(Some(task_item(next, &self.tables)?))
            .condition_expression("#r = :expected")
            .expression_attribute_names("#r", REVISION)
            .expression_attribute_values(":expected", AttributeValue::N(expected_revision.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Written::Applied),
            // Also the answer when the row is gone: there is no revision to match.
            Err(e) if condition_failed(&e) => Ok(Written::RevisionMoved),
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

    async fn gate(&self, agent: &str) -> Result<Option<Gate>, StoreError> {
        self.gate_item(agent).await
    }

    async fn replace_gate(&self, next: &Gate, expected_revision: u64) -> Result<Written, StoreError> {
        self.write_gate(next, expected_revision).await
    }

    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError> {
        let order = AttributeValue::S(order_id.as_str().to_owned());
        let mut item = waiter_key(agent, ticket);
        item.insert(WAITER_ORDER.to_owned(), order.clone());
        item.insert(EXPIRES_AT.to_owned(), AttributeValue::N((now.0 / 1_000 + WAITER_TTL_SECS).to_string()));
        // The same order's note again (a retried Schedule, or one whose response was
        // lost) lands and only moves its expiry on; another order's note is never lost.
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.state)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#k) OR #w = :order")
            .expression_attribute_names("#k", KEY)
            .expression_attribute_names("#w", WAITER_ORDER)
            .expression_attribute_values(":order", order)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Noted::Applied),
            Err(e) if condition_failed(&e) => Ok(Noted::HeldByAnother),
            Err(e) => Err(unavailable("noting a waiter", e)),
        }
    }

    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.state)
            .set_key(Some(waiter_key(agent, ticket)))
            .consistent_read(true)
            .projection_expression("#w")
            .expression_attribute_names("#w", WAITER_ORDER)
            .send()
            .await
            .map_err(|e| unavailable("reading a waiter", e))?;
        match out.item.as_ref().and_then(|i| i.get(WAITER_ORDER)) {
            None => Ok(None),
            Some(AttributeValue::S(id)) => {
                OrderId::parse(id).map(Some).map_err(|e| corrupt(&format!("gate#{agent}#{ticket}"), e))
            }
            Some(_) => Err(corrupt(&format!("gate#{agent}#{ticket}"), "waiter_order is not a string")),
        }
    }
}

/// A gate's item key: `gate#<agent>`. Order ids never hold `#`, so no task can take it.
fn gate_key(agent: &str) -> Item {
    HashMap::from([(KEY.to_owned(), AttributeValue::S(format!("gate#{agent}")))])
}

fn waiter_key(agent: &str, ticket: u64) -> Item {
    HashMap::from([(KEY.to_owned(), AttributeValue::S(format!("gate#{agent}#{ticket}")))])
}

/// The attribute of a waiter item that names the waiting order.
const WAITER_ORDER: &str = "waiter_order";
/// How long a waiter item is kept: far longer than any wait, and then TTL deletes it.
const WAITER_TTL_SECS: u64 = 7 * 24 * 3_600;

impl DynamoStore {
    async fn gate_item(&self, agent: &str) -> Result<Option<Gate>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.state)
            .set_key(Some(gate_key(agent)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable("reading gate", e))?;
        out.item
            .map(|mut item| {
                item.remove(KEY);
                serde_dynamo::aws_sdk_dynamodb_1::from_item(item)
                    .map_err(|e| corrupt(&format!("gate#{agent}"), e))
            })
            .transpose()
    }

    async fn write_gate(&self, next: &Gate, expected_revision: u64) -> Result<Written, StoreError> {
        let mut item: Item = serde_dynamo::aws_sdk_dynamodb_1::to_item(next)
            .map_err(|e| corrupt(&format!("gate#{}", next.agent), format!("cannot encode gate: {e}")))?;
        item.retain(|_, value| !matches!(value, AttributeValue::Null(_)));
        item.extend(gate_key(&next.agent));
        let put = self.client.put_item().table_name(&self.tables.state).set_item(Some(item));
        let put = match expected_revision {
            0 => put.condition_expression("attribute_not_exists(#k)").expression_attribute_names("#k", KEY),
            n => put
                .condition_expression("#r = :expected")
                .expression_attribute_names("#r", REVISION)
                .expression_attribute_values(":expected", AttributeValue::N(n.to_string())),
        };
        match put.send().await {
            Ok(_) => Ok(Written::Applied),
            Err(e) if condition_failed(&e) => Ok(Written::RevisionMoved),
            Err(e) => Err(unavailable("writing gate", e)),
        }
    }
}

/// A call mark's item: its key, and the table's TTL attribute at its `until` (whole
/// seconds, rounded up: never before it). Nothing else, so it stays one write unit.
pub fn call_mark_item(mark: &CallMark) -> Item {
    HashMap::from([
        (KEY.to_owned(), AttributeValue::S(mark.key.clone())),
        (EXPIRES_AT.to_owned(), AttributeValue::N(mark.until.0.div_ceil(1_000).to_string())),
    ])
}

/// The agent's call marks: a PutItem of the key and its expiry only, conditional on the
/// key being new (the agent's IAM policy allows exactly this, on `call#` keys).
#[async_trait]
impl CallStarts for DynamoStore {
    async fn start_call(&self, mark: &CallMark) -> Result<CallStart, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.state)
            .set_item(Some(call_mark_item(mark)))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .send()
            .await;
        match result {
            Ok(_) => Ok(CallStart::Started),
            Err(e) if condition_failed(&e) => Ok(CallStart::AlreadyStarted),
            Err(e) => Err(unavailable("marking a call started", e)),
        }
    }
}

#[async_trait]
impl TaskListing for DynamoStore {
    async fn list(&self, listing: &Listing, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        match listing {
            Listing::Errors { since } => self.list_errors(*since, limit).await,
            Listing::Live => self.list_live(limit).await,
            Listing::Finished { since } => self.list_finished(*since, limit).await.map_err(|e| match e {
                StoreError::NotIndexed(_) => StoreError::NotIndexed(NOT_INDEXED.to_owned()),
                e => e,
            }),
        }
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
    use crate::domain::{Lease, Order, Phase, Policy, ProcessState, WaitingFor};

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

    fn tables(retention_days: u32) -> TableNames {
        TableNames::new("t").with_retention_days(retention_days)
    }

    #[test]
    fn live_tasks_carry_index_keys_and_finished_ones_do_not() {
        let live = task("o-1");
        let item = task_item(&live, &tables(30)).unwrap();
        assert_eq!(item.get(DEADLINE), Some(&AttributeValue::N("61000".into())));
        assert!(matches!(item.get(DUE_SHARD), Some(AttributeValue::S(_))));
        assert!(item.values().all(|v| !matches!(v, AttributeValue::Null(_))), "{item:?}");
        assert_eq!(task_from_item(item).unwrap(), live);

        let done = live.clone().with_phase(Phase::Processed);
        let item = task_item(&done, &tables(30)).unwrap();
        assert!(!item.contains_key(DEADLINE) && !item.contains_key(DUE_SHARD));
        assert!(!item.contains_key(FINISHED_SHARD), "no finished index unless the deployment keeps one");
        assert_eq!(task_from_item(item).unwrap(), done);
    }

    /// A deployment that lists finished tasks puts Processed and Compensated ones, and
    /// only those, into the finished index.
    #[test]
    fn finished_tasks_carry_the_finished_index_key_where_it_is_kept() {
        let listing = tables(30).with_list_finished(true);
        for state in ProcessState::ALL {
            let t = if state.is_terminal() {
                finished(state, 5_000)
            } else {
                task("o-3").with_phase(live_phase(state))
            };
            let item = task_item(&t, &listing).unwrap();
            let expected = matches!(state, ProcessState::Processed | ProcessState::Compensated);
            assert_eq!(item.contains_key(FINISHED_SHARD), expected, "{state:?}");
            assert_eq!(task_from_item(item).unwrap(), t);
        }
    }

    /// A live phase of `state`, holding what it must (a lease while Processing).
    fn live_phase(state: ProcessState) -> Phase {
        let lease = Lease {
            token: crate::domain::LeaseToken(uuid::Uuid::from_u128(1)),
            complete_by: Timestamp(9_000),
        };
        match state {
            ProcessState::Pending => Phase::pending(Timestamp(10_000)),
            ProcessState::Processing => Phase::processing(lease, Timestamp(10_000)),
            ProcessState::Waiting => Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(10_000) }),
            ProcessState::Compensating => Phase::compensating(None, Timestamp(10_000)),
            ended => Phase::ended(ended).unwrap(),
        }
    }

    fn finished(state: ProcessState, updated_ms: u64) -> TaskRecord {
        let mut t = task("o-3").with_phase(Phase::ended(state).unwrap());
        t.updated_at = Timestamp(updated_ms);
        t
    }

    /// A timer's task is found by the sweep at its wake time: the wake time is its
    /// deadline, in the due index, and comes back as written.
    #[test]
    fn a_waiting_task_keeps_its_wake_time_and_stays_in_the_due_index() {
        let waiting =
            task("o-6").with_phase(Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(90_000) }));
        let item = task_item(&waiting, &tables(30)).unwrap();
        let Some(AttributeValue::M(held)) = item.get("phase") else { panic!("no phase map: {item:?}") };
        assert_eq!(held.get("wake_at"), Some(&AttributeValue::N("90000".into())));
        assert_eq!(item.get(DEADLINE), Some(&AttributeValue::N("90000".into())));
        assert!(item.contains_key(DUE_SHARD));
        assert!(!item.contains_key(EXPIRES_AT) && !item.contains_key(ERROR_SHARD));
        assert_eq!(task_from_item(item).unwrap(), waiting);
        // Every other record has no attribute for it: workflows without timers write
        // exactly what they wrote before.
        assert!(!task_item(&task("o-7"), &tables(30)).unwrap().contains_key("wake_at"));
    }

    #[test]
    fn only_tasks_in_error_carry_the_error_index_key() {
        let error = task_item(&finished(ProcessState::Error, 5_000), &tables(30)).unwrap();
        assert_eq!(error.get(ERROR_SHARD), Some(&AttributeValue::S(ERROR_PARTITION.into())));
        // The index's range key is the record's own attribute, a number.
        assert_eq!(error.get(UPDATED_AT), Some(&AttributeValue::N("5000".into())));
        for state in [ProcessState::Processed, ProcessState::Compensated] {
            assert!(!task_item(&finished(state, 5_000), &tables(30)).unwrap().contains_key(ERROR_SHARD));
        }
        for state in [
            ProcessState::Pending,
            ProcessState::Processing,
            ProcessState::Waiting,
            ProcessState::Compensating,
        ] {
            let live = task("o-4").with_phase(live_phase(state));
            assert!(!task_item(&live, &tables(30)).unwrap().contains_key(ERROR_SHARD), "{state:?}");
        }
    }

    #[test]
    fn finished_tasks_expire_after_the_retention_and_live_ones_never() {
        let day = 24 * 3_600;
        // 1_700_000_000_123 ms: the seconds are truncated, then 30 days added.
        for state in [ProcessState::Processed, ProcessState::Error, ProcessState::Compensated] {
            let item = task_item(&finished(state, 1_700_000_000_123), &tables(30)).unwrap();
            let want = (1_700_000_000 + 30 * day).to_string();
            assert_eq!(item.get(EXPIRES_AT), Some(&AttributeValue::N(want)), "{state:?}");
            assert_eq!(task_from_item(item).unwrap().state(), state, "the record reads back");
        }
        let one_day = task_item(&finished(ProcessState::Processed, 2_000), &tables(1)).unwrap();
        assert_eq!(one_day.get(EXPIRES_AT), Some(&AttributeValue::N((2 + day).to_string())));
        // 0 keeps records forever.
        let kept = task_item(&finished(ProcessState::Error, 5_000), &tables(0)).unwrap();
        assert!(!kept.contains_key(EXPIRES_AT));
        // A live task has none: a resubmitted Error task, written whole, loses it.
        for state in [
            ProcessState::Pending,
            ProcessState::Processing,
            ProcessState::Waiting,
            ProcessState::Compensating,
        ] {
            let live = task("o-5").with_phase(live_phase(state));
            assert!(!task_item(&live, &tables(30)).unwrap().contains_key(EXPIRES_AT), "{state:?}");
        }
    }

    #[test]
    fn a_call_mark_is_its_key_and_its_expiry() {
        let lease = crate::domain::LeaseToken(uuid::Uuid::from_u128(0x1234_5678 << 96));
        let mark = CallMark::new(&OrderId::parse("o-9").unwrap(), 0, 1, &lease, Timestamp(1_700_000_000_001));
        let item = call_mark_item(&mark);
        assert_eq!(item.len(), 2, "{item:?}");
        assert_eq!(item.get(KEY), Some(&AttributeValue::S("call#o-9#1.12345678#0".into())));
        // An hour past complete-by, in whole seconds, rounded up.
        assert_eq!(item.get(EXPIRES_AT), Some(&AttributeValue::N("1700003601".into())));
        assert!(mark.key.starts_with("call#"), "the agent's IAM policy allows only call# keys");
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
        let mut item = task_item(&task("o-2"), &tables(30)).unwrap();
        item.insert("state".into(), AttributeValue::S("Exploded".into()));
        match task_from_item(item) {
            Err(StoreError::Corrupt { order_id, .. }) => assert_eq!(order_id, "o-2"),
            other => panic!("{other:?}"),
        }
    }

    /// Items written before orders kept their submitter have no `submitter`: they read
    /// as records with none (any app's cancel applies, as before), and a record with one
    /// keeps it through the item.
    #[test]
    fn the_submitter_is_kept_and_items_without_one_stay_readable() {
        let sender = crate::domain::Sender::from_sender_id("AROASHOP:session-1");
        let owned = task("o-6").submitted_by(sender.clone());
        let item = task_item(&owned, &tables(30)).unwrap();
        assert_eq!(item.get("submitter"), Some(&AttributeValue::S("AROASHOP".into())));
        assert_eq!(task_from_item(item).unwrap().submitter, sender);
        let mut old = task_item(&task("o-7"), &tables(30)).unwrap();
        assert!(!old.contains_key("submitter"), "absent, not NULL");
        old.remove("submitter");
        assert_eq!(task_from_item(old).unwrap().submitter, None);
    }
}

#[cfg(test)]
mod throttling {
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;

    use super::*;

    fn refused(code: &str) -> StoreError {
        let meta = ErrorMetadata::builder().code(code).message("slow down").build();
        // The raw response is only shown, never read: a unit stands in for it.
        unavailable("reading task", SdkError::service_error(GetItemError::generic(meta), ()))
    }

    /// DynamoDB's throttling codes are `Throttled` (a Schedule met by one is sent again
    /// after a backoff); any other refusal is `Unavailable`, left to redelivery.
    #[test]
    fn throttling_codes_are_throttled_and_the_rest_unavailable() {
        for code in THROTTLING_CODES {
            assert!(matches!(refused(code), StoreError::Throttled(ref why) if why.contains(code)), "{code}");
        }
        assert!(matches!(refused("InternalServerError"), StoreError::Unavailable(_)));
    }
}
