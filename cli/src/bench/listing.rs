//! `bench listing`: what listing tasks reads on DynamoDB (an endpoint: moto, LocalStack
//! or AWS) from a table of N finished tasks, M in Error and a few live ones. The sparse
//! indexes keep each listing to the tasks it lists, whatever N: the figures come from
//! the adapter's counters and from DynamoDB's own `Count` and `ScannedCount`.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use futures::{StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use sas::adapters::aws::dynamodb::{ListingReads, task_item};
use sas::adapters::aws::provision;
use sas::adapters::aws::{DynamoStore, TableNames};
use sas::domain::{LineItem, Order, OrderId, Phase, Policy, ProcessState, TaskRecord, Timestamp};
use sas::ports::{Listing, TaskListing};

/// BatchWriteItem's limit.
const BATCH: usize = 25;
/// Requests in flight while filling: enough to keep a one-request-at-a-time moto busy.
const IN_FLIGHT: usize = 4;
const T0: Timestamp = Timestamp(1_700_000_000_000);

#[derive(Debug, Clone)]
pub struct ListingOptions {
    pub endpoint: String,
    pub finished: usize,
    pub errors: usize,
    pub live: usize,
    /// Show a progress bar while filling the table.
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListingRow {
    /// What was listed, as `sasctl` would ask for it.
    pub listing: String,
    pub limit: usize,
    pub returned: usize,
    pub queries: u64,
    /// Index entries the adapter received.
    pub index_items: u64,
    /// DynamoDB's own figures, summed over the query responses.
    pub count: u64,
    pub scanned_count: u64,
    /// Task items read after a keys-only index (the live listing's consistent reads).
    pub task_reads: u64,
    pub ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListingReport {
    pub endpoint: String,
    pub table: String,
    pub finished: usize,
    pub errors: usize,
    pub live: usize,
    pub fill_seconds: f64,
    pub rows: Vec<ListingRow>,
}

/// A bench order: one item of the built-in single-step workflow.
pub(super) fn order(id: &str) -> Order {
    Order {
        order_id: OrderId::parse(id).expect("bench ids are valid"),
        customer_id: "cust-1".into(),
        items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
        workflow: "single-step".into(),
        workflow_version: None,
    }
}

/// Task `i` of the table: the first `errors` in Error (updated 1 ms apart, so newest
/// first is well defined), then `finished` Processed or Compensated, then `live` Pending.
fn task(i: usize, o: &ListingOptions, policy: &Policy) -> TaskRecord {
    let (id, state) = if i < o.errors {
        (format!("err-{i:08}"), ProcessState::Error)
    } else if i < o.errors + o.finished {
        let state = if i.is_multiple_of(2) { ProcessState::Processed } else { ProcessState::Compensated };
        (format!("done-{i:08}"), state)
    } else {
        (format!("live-{i:08}"), ProcessState::Pending)
    };
    let mut task = TaskRecord::new(&order(&id), None, T0, policy);
    if state != ProcessState::Pending {
        task = task.with_phase(Phase::ended(state).expect("an ended state"));
        task.revision = 2;
        task.updated_at = T0.plus_ms(1_000 + i as u64);
    }
    task
}

/// One BatchWriteItem of up to 25 items, resending what DynamoDB leaves unprocessed.
async fn write_batch(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    items: Vec<HashMap<String, AttributeValue>>,
) -> Result<usize, String> {
    let n = items.len();
    let mut requests = items
        .into_iter()
        .map(|item| {
            let put = PutRequest::builder().set_item(Some(item)).build().map_err(|e| e.to_string())?;
            Ok(WriteRequest::builder().put_request(put).build())
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut backoff = Duration::from_millis(20);
    while !requests.is_empty() {
        let out =
            client.batch_write_item().request_items(table, requests).send().await.map_err(|e| {
                format!("BatchWriteItem: {}", aws_sdk_dynamodb::error::DisplayErrorContext(e))
            })?;
        requests = out.unprocessed_items().and_then(|u| u.get(table)).cloned().unwrap_or_default();
        if !requests.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
    Ok(n)
}

async fn fill(
    client: &aws_sdk_dynamodb::Client,
    tables: &TableNames,
    o: &ListingOptions,
) -> Result<(), String> {
    let total = o.errors + o.finished + o.live;
    let bar = if o.progress { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("filling {bar:40} {pos}/{len} items, {per_sec}, {eta} left")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let policy = Policy::default();
    let starts: Vec<usize> = (0..total).step_by(BATCH).collect();
    futures::stream::iter(starts)
        .map(|start| {
            let items: Result<Vec<_>, String> = (start..(start + BATCH).min(total))
                .map(|i| task_item(&task(i, o, &policy), tables).map_err(|e| e.to_string()))
                .collect();
            async move { write_batch(client, &tables.state, items?).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_for_each(|n| {
            bar.inc(n as u64);
            futures::future::ready(Ok(()))
        })
        .await?;
    bar.finish_and_clear();
    Ok(())
}

async fn measure(
    store: &DynamoStore,
    name: String,
    listing: Listing,
    limit: usize,
) -> Result<ListingRow, String> {
    let before: ListingReads = store.listing_reads();
    let started = Instant::now();
    let tasks = store.list(&listing, limit).await.map_err(|e| format!("listing {name}: {e}"))?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let after = store.listing_reads();
    Ok(ListingRow {
        listing: name,
        limit,
        returned: tasks.len(),
        queries: after.queries - before.queries,
        index_items: after.index_items - before.index_items,
        count: after.index_count - before.index_count,
        scanned_count: after.index_scanned - before.index_scanned,
        task_reads: after.task_reads - before.task_reads,
        ms,
    })
}

/// Fills a fresh table, lists it four ways, deletes the table (also on failure).
pub async fn listing(o: &ListingOptions) -> Result<ListingReport, String> {
    crate::endpoint::check_url(&o.endpoint).map_err(|e| e.to_string())?;
    let sdk = crate::endpoint::sdk_config(&o.endpoint).await;
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let prefix = format!("bench-listing-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let tables = TableNames::new(format!("{prefix}-state")).with_list_finished(true);
    provision::create_tables(&client, &tables).await.map_err(|e| e.to_string())?;
    let result = fill_and_list(&client, &tables, o).await;
    let dropped = client.delete_table().table_name(&tables.state).send().await;
    let report = result?;
    dropped.map_err(|e| {
        format!("deleting {}: {}", tables.state, aws_sdk_dynamodb::error::DisplayErrorContext(e))
    })?;
    Ok(report)
}

async fn fill_and_list(
    client: &aws_sdk_dynamodb::Client,
    tables: &TableNames,
    o: &ListingOptions,
) -> Result<ListingReport, String> {
    let started = Instant::now();
    fill(client, tables, o).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let store = DynamoStore::new(client.clone(), tables.clone());
    // The ten newest errors: `since` the tenth newest's updated_at.
    let tenth_newest = T0.plus_ms(1_000 + o.errors.saturating_sub(10) as u64);
    let rows = vec![
        measure(&store, "errors".into(), Listing::Errors { since: None }, o.errors.max(1)).await?,
        measure(&store, "errors, newest 50".into(), Listing::Errors { since: None }, 50).await?,
        measure(
            &store,
            format!("errors since {}", tenth_newest.0),
            Listing::Errors { since: Some(tenth_newest) },
            1_000,
        )
        .await?,
        measure(&store, "live".into(), Listing::Live, o.live.max(1)).await?,
        measure(&store, "finished, newest 50".into(), Listing::Finished { since: None }, 50).await?,
    ];
    Ok(ListingReport {
        endpoint: o.endpoint.clone(),
        table: tables.state.clone(),
        finished: o.finished,
        errors: o.errors,
        live: o.live,
        fill_seconds,
        rows,
    })
}

impl fmt::Display for ListingReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} at {}: {} finished, {} in Error, {} live ({} items, written in {:.1} s)",
            self.table,
            self.endpoint,
            self.finished,
            self.errors,
            self.live,
            self.finished + self.errors + self.live,
            self.fill_seconds
        )?;
        writeln!(
            f,
            "listing                    limit  returned  queries  entries read  Count  ScannedCount  task reads       ms"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<24} {:>7}  {:>8}  {:>7}  {:>12}  {:>5}  {:>12}  {:>10}  {:>7.1}",
                r.listing,
                r.limit,
                r.returned,
                r.queries,
                r.index_items,
                r.count,
                r.scanned_count,
                r.task_reads,
                r.ms
            )?;
        }
        write!(
            f,
            "entries read: index entries the adapter received; Count and ScannedCount: DynamoDB's own figures, \
             summed over the query responses; task reads: items read after the keys-only due index"
        )
    }
}
