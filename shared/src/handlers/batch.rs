//! The batch driver every SQS-facing handler runs under: messages are handled
//! concurrently and independently; bad input is kept with its reason and counted as
//! handled; only retryable failures are reported back, so SQS redelivers just those.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use super::HandlerError;
use super::coalesce::join_round;
use crate::ports::{Inbound, Metric, Metrics, Outgoing, QueueUrl, Queues};

/// The message attribute that carries a kept message's reason.
pub const REASON_ATTRIBUTE: &str = "sas-reason";
/// The message attribute naming the queue a kept message came from.
pub const SOURCE_ATTRIBUTE: &str = "sas-source";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Message ids to leave on the queue for redelivery.
    pub failures: Vec<String>,
    /// Messages kept in the dead-letter queue with a reason.
    pub kept: usize,
}

/// Where a handler keeps messages it cannot process.
#[derive(Clone)]
pub struct DeadLetters {
    pub queues: Arc<dyn Queues>,
    pub source: QueueUrl,
    pub dead_letter_queue: QueueUrl,
    pub metrics: Arc<dyn Metrics>,
}

impl DeadLetters {
    async fn keep(&self, message: &Inbound, reason: &str) -> bool {
        let attributes = BTreeMap::from([
            (REASON_ATTRIBUTE.to_owned(), truncate(reason, 1_000)),
            (SOURCE_ATTRIBUTE.to_owned(), self.source.0.clone()),
        ]);
        let kept = Outgoing { body: message.body.clone(), delay_ms: 0, attributes };
        match self.queues.send(&self.dead_letter_queue, kept).await {
            Ok(()) => {
                self.metrics.record(Metric::MessageKept, 1);
                true
            }
            Err(e) => {
                tracing::error!(message_id = %message.message_id, error = %e, "could not keep rejected message; leaving it for redelivery");
                false
            }
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Runs `handle` on every message at once; a panic in one is that message's failure only.
/// The messages are one round of sends (`coalesce`): a `SendCoalescer` among the ports
/// sends what the handlers send together.
pub async fn run_batch<F, Fut>(messages: Vec<Inbound>, dead_letters: &DeadLetters, handle: F) -> BatchReport
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let handle = &handle;
    let outcomes = join_round(messages.into_iter().map(|message| {
        // `handle` is called inside the guarded future, so a panic before it returns
        // its own future is caught as well, not only one while it runs.
        let input = message.clone();
        let run = AssertUnwindSafe(async move { handle(input).await }).catch_unwind();
        async move {
            let result = match run.await {
                Ok(result) => result,
                Err(panic) => Err(HandlerError::Reject(format!("handler panicked: {}", panic_text(&*panic)))),
            };
            // Kept within the round, so the kept copies go out with the other handlers' sends.
            let outcome = match result {
                Ok(()) => Outcome::Done,
                Err(HandlerError::Retry(reason) | HandlerError::Throttled(reason)) => {
                    tracing::warn!(message_id = %message.message_id, %reason, "message left for redelivery");
                    Outcome::Redeliver
                }
                Err(HandlerError::Reject(reason)) => {
                    tracing::warn!(message_id = %message.message_id, %reason, "message rejected and kept");
                    if dead_letters.keep(&message, &reason).await {
                        Outcome::DeadLettered
                    } else {
                        Outcome::Redeliver
                    }
                }
            };
            (message.message_id, outcome)
        }
    }))
    .await;

    let mut report = BatchReport::default();
    for (message_id, outcome) in outcomes {
        match outcome {
            Outcome::Done => {}
            Outcome::DeadLettered => report.kept += 1,
            Outcome::Redeliver => report.failures.push(message_id),
        }
    }
    dead_letters.metrics.flush();
    report
}

enum Outcome {
    Done,
    /// Kept in the dead-letter queue with its reason: bad input.
    DeadLettered,
    Redeliver,
}
