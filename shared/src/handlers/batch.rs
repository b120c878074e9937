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

/// How the messages of one batch run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BatchOrder {
    /// Every message at once.
    #[default]
    Concurrent,
    /// One order's messages one after another, in the batch's order, and orders at once.
    /// The scheduler's: replies of one order (a stage's branches) would otherwise read
    /// the same revision of its record, and all but one lose the conditional write, a
    /// billed write and a read again each.
    ByOrder,
}

impl BatchOrder {
    /// The batch as the runs it is handled in: one message each, or an order's together.
    fn runs(self, messages: Vec<Inbound>) -> Vec<Vec<Inbound>> {
        match self {
            BatchOrder::Concurrent => messages.into_iter().map(|m| vec![m]).collect(),
            BatchOrder::ByOrder => {
                let mut runs: Vec<(Option<String>, Vec<Inbound>)> = Vec::with_capacity(messages.len());
                for message in messages {
                    // A message of no order (a look at a gate, a body that does not
                    // parse) runs alone.
                    let order = order_of(&message.body);
                    match runs.iter_mut().find(|(o, _)| o.is_some() && *o == order) {
                        Some((_, run)) => run.push(message),
                        None => runs.push((order, vec![message])),
                    }
                }
                runs.into_iter().map(|(_, run)| run).collect()
            }
        }
    }
}

/// The order a scheduler message (a schedule, a reply) is for, read without the rest of
/// it; `None` for a look at a gate and for a body that does not parse (its handler says
/// why).
fn order_of(body: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct OrderOf<'a> {
        #[serde(borrow)]
        order_id: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_str::<OrderOf>(body).ok()?.order_id.map(std::borrow::Cow::into_owned)
}

/// Runs `handle` on every message at once; a panic in one is that message's failure only.
/// The messages are one round of sends (`coalesce`): a `SendCoalescer` among the ports
/// sends what the handlers send together.
pub async fn run_batch<F, Fut>(messages: Vec<Inbound>, dead_letters: &DeadLetters, handle: F) -> BatchReport
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    run_batch_in(BatchOrder::Concurrent, messages, dead_letters, handle).await
}

/// [`run_batch`], with the messages run as `order` says: a run of one order's messages
/// is one handler of the round, so its parked send is what the round waits for.
pub async fn run_batch_in<F, Fut>(
    order: BatchOrder,
    messages: Vec<Inbound>,
    dead_letters: &DeadLetters,
    handle: F,
) -> BatchReport
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let handle = &handle;
    let outcomes = join_round(order.runs(messages).into_iter().map(|run| async move {
        let mut outcomes = Vec::with_capacity(run.len());
        for message in run {
            outcomes.push(handled(message, dead_letters, handle).await);
        }
        outcomes
    }))
    .await;

    let mut report = BatchReport::default();
    for (message_id, outcome) in outcomes.into_iter().flatten() {
        match outcome {
            Outcome::Done => {}
            Outcome::DeadLettered => report.kept += 1,
            Outcome::Redeliver => report.failures.push(message_id),
        }
    }
    dead_letters.metrics.flush();
    report
}

/// One message through `handle`: a panic is its failure, bad input is kept with its
/// reason (within the round, so the kept copy goes out with the other handlers' sends).
async fn handled<F, Fut>(message: Inbound, dead_letters: &DeadLetters, handle: &F) -> (String, Outcome)
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    // `handle` is called inside the guarded future, so a panic before it returns its own
    // future is caught as well, not only one while it runs.
    let input = message.clone();
    let result = match AssertUnwindSafe(async move { handle(input).await }).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(HandlerError::Reject(format!("handler panicked: {}", panic_text(&*panic)))),
    };
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

enum Outcome {
    Done,
    /// Kept in the dead-letter queue with its reason: bad input.
    DeadLettered,
    Redeliver,
}

#[cfg(test)]
mod tests {
    use super::order_of;
    use crate::domain::SchedulerMessage;

    /// The grouping reads the order the scheduler's own parse reads, and none where that
    /// parse reads none.
    #[test]
    fn order_of_reads_the_order_the_scheduler_reads() {
        let lease = r#""lease":"67e55044-10b1-426f-9247-bb680e5fe0c8""#;
        let reply = format!(
            r#"{{"type":"reply","order_id":"o-2","step":2,"action":"do","attempt":3,{lease},"outcome":{{"status":"succeeded","output":{{"order_id":"x"}}}}}}"#
        );
        let bodies = [
            r#"{"type":"schedule","order_id":"o-1"}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","turn":{"agent":"pay","ticket":7}}"#.to_owned(),
            reply,
            r#"{"type":"gate","agent":"pay"}"#.to_owned(),
        ];
        for body in &bodies {
            let order = match SchedulerMessage::parse(body).expect("a scheduler message") {
                SchedulerMessage::Schedule { order_id, .. } => Some(order_id.to_string()),
                SchedulerMessage::Reply(reply) => Some(reply.order_id.to_string()),
                SchedulerMessage::Gate { .. } => None,
            };
            assert_eq!(order_of(body), order, "{body}");
        }
        assert_eq!(order_of("not json"), None);
        assert_eq!(order_of(r#"{"order_id":7}"#), None);
    }
}
