//! Pumping one function's queue the way Lambda's SQS event source mapping does: each
//! received batch (gathered over the batching window, if any) is its own invocation,
//! up to `concurrency` at once; the messages a batch does not report as failed are
//! deleted in one batch request, the failed ones are left to come back
//! after the visibility timeout (and to the dead-letter queue after the maximum
//! receives, as the queue's redrive policy says). `sasctl dev` and `sasctl up` both
//! run their functions through it.

use std::sync::Arc;
use std::time::Duration;

use sas::handlers::{BatchOrder, BatchReport, DeadLetters, HandlerError, Inbound, run_batch_in};
use sas::ports::{Delivery, QueueConsumer, QueueError, QueueUrl};
use tokio::sync::watch;

/// How one queue is pumped.
#[derive(Debug, Clone, Copy)]
pub struct PumpSettings {
    /// Messages per receive (SQS allows 1 to 10).
    pub batch_size: usize,
    /// Batches (invocations) in flight at once.
    pub concurrency: usize,
    /// How long one receive waits for messages (SQS counts whole seconds).
    pub wait_ms: u64,
    /// MaximumBatchingWindowInSeconds, in ms: once a receive brings messages, receive
    /// more until the batch is full or this long has passed, then invoke. 0: invoke
    /// with what the first receive brought.
    pub window_ms: u64,
    /// How a batch's messages run (the scheduler's queue: by order).
    pub order: BatchOrder,
}

/// What the pump tells its owner besides doing the work.
pub trait PumpEvents: Send + Sync + 'static {
    /// A receive failed; the pump tries again after `retry_in`.
    fn receive_failed(&self, _queue: &QueueUrl, _error: &QueueError, _retry_in: Duration) {}
    /// A batch finished: what it reported, and the deletes that failed (those messages
    /// come back after the visibility timeout, which the handlers tolerate).
    fn batch_done(&self, _queue: &QueueUrl, _report: &BatchReport, _failed_deletes: usize) {}
}

/// Events nobody listens to.
pub struct Quiet;
impl PumpEvents for Quiet {}

/// Whether `stop` says stop (a dropped sender counts as stop).
fn stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Pumps `queue` until `stop` turns true, then returns once every batch in flight has
/// finished, its deletes included.
///
/// A receive already waiting when the stop comes is allowed to finish and its messages
/// are handled: cancelled half way, it could take messages off the queue that nobody
/// then handles (SQS, or moto's emulated long poll, completes it without us), and they
/// would be hidden for a whole visibility timeout. So stopping takes up to `wait_ms`
/// (plus the batching window, when a batch is being gathered).
pub async fn pump<F, Fut>(
    consumer: Arc<dyn QueueConsumer>,
    queue: QueueUrl,
    settings: PumpSettings,
    dead_letters: DeadLetters,
    mut stop: watch::Receiver<bool>,
    events: Arc<dyn PumpEvents>,
    handle: F,
) where
    F: Fn(Inbound) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(settings.concurrency));
    let mut in_flight = tokio::task::JoinSet::new();
    let mut failures = 0u32;
    while !stopping(&stop) {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = stopped(&mut stop) => break,
        };
        while in_flight.try_join_next().is_some() {}
        let batch: Vec<Delivery> = match consumer.receive(&queue, settings.batch_size, settings.wait_ms).await
        {
            Ok(b) if !b.is_empty() => {
                failures = 0;
                gather(consumer.as_ref(), &queue, settings, b).await
            }
            Ok(_) => {
                failures = 0;
                continue;
            }
            Err(e) => {
                // Back off while the endpoint is down, up to 5 s, so a stopped emulator
                // costs neither a busy loop nor a flood of lines.
                failures = failures.saturating_add(1);
                let retry_in = Duration::from_millis((50u64 << failures.min(7)).min(5_000));
                tracing::error!(queue = %queue, error = %e, "receive failed");
                events.receive_failed(&queue, &e, retry_in);
                tokio::select! {
                    () = tokio::time::sleep(retry_in) => {}
                    () = stopped(&mut stop) => {}
                }
                continue;
            }
        };
        let (consumer, queue, dead_letters, handle, events) =
            (consumer.clone(), queue.clone(), dead_letters.clone(), handle.clone(), events.clone());
        in_flight.spawn(async move {
            let (report, failed_deletes) =
                invoke(consumer.as_ref(), (&queue, settings.order), batch, &dead_letters, handle).await;
            events.batch_done(&queue, &report, failed_deletes);
            drop(slot);
        });
    }
    while in_flight.join_next().await.is_some() {}
}

/// The batching window: more receives after the first brought `batch`, each waiting
/// at most what is left of the window (in whole seconds, as SQS counts them: a window
/// can run up to a second long), until the batch is full or the window has passed.
/// A receive that fails ends the gathering; the batch so far is invoked.
async fn gather(
    consumer: &dyn QueueConsumer,
    queue: &QueueUrl,
    settings: PumpSettings,
    mut batch: Vec<Delivery>,
) -> Vec<Delivery> {
    if settings.window_ms == 0 {
        return batch;
    }
    let until = tokio::time::Instant::now() + Duration::from_millis(settings.window_ms);
    while batch.len() < settings.batch_size {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match consumer.receive(queue, settings.batch_size - batch.len(), left.as_millis() as u64).await {
            Ok(more) => batch.extend(more),
            Err(e) => {
                tracing::warn!(queue = %queue, error = %e, "receive failed while gathering a batch");
                break;
            }
        }
    }
    batch
}

/// One invocation: the batch through the batch driver, then the deletes of every
/// message it did not report as failed. Returns the report and how many deletes failed.
pub async fn invoke<F, Fut>(
    consumer: &dyn QueueConsumer,
    (queue, order): (&QueueUrl, BatchOrder),
    batch: Vec<Delivery>,
    dead_letters: &DeadLetters,
    handle: F,
) -> (BatchReport, usize)
where
    F: Fn(Inbound) -> Fut,
    Fut: std::future::Future<Output = Result<(), HandlerError>>,
{
    // Receipts stand in for message ids so two deliveries of one message stay distinct.
    let inbound: Vec<Inbound> = batch
        .iter()
        .map(|d| Inbound {
            message_id: d.receipt.clone(),
            body: d.body.clone(),
            receive_count: d.receive_count,
            sender: d.sender.clone(),
        })
        .collect();
    let report = run_batch_in(order, inbound, dead_letters, handle).await;
    let handled: Vec<String> =
        batch.iter().filter(|d| !report.failures.contains(&d.receipt)).map(|d| d.receipt.clone()).collect();
    let failed_deletes = if handled.is_empty() { 0 } else { consumer.delete_batch(queue, &handled).await };
    if failed_deletes > 0 {
        tracing::warn!(queue = %queue, failed = failed_deletes, "deletes failed; those messages will come back");
    }
    (report, failed_deletes)
}
