//! Queues on SQS: batched sends with per-message delay and string attributes, and the
//! consuming side (receive with the receive count, delete) that Lambda's event source
//! mapping does for the deployed functions and `sasctl dev` and the tests do themselves.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    SendMessageBatchRequestEntry,
};

use crate::ports::{Delivery, Outgoing, QueueConsumer, QueueError, QueueUrl, Queues};

/// SQS's limits on one SendMessageBatch call.
pub const MAX_BATCH_ENTRIES: usize = 10;
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// SQS's longest per-message delay.
pub const MAX_DELAY_SECONDS: u64 = 900;
/// SQS's longest long poll.
pub const MAX_WAIT_SECONDS: u64 = 20;

/// SQS delays in whole seconds: round up, so a retry never comes earlier than the
/// backoff asked for, and cap at SQS's 15 minutes. A longer backoff comes early, which
/// is safe: the claim it leads to is conditional, and the task's deadline still holds.
pub fn delay_seconds(delay_ms: u64) -> i32 {
    delay_ms.div_ceil(1_000).min(MAX_DELAY_SECONDS) as i32
}

/// Long polls are whole seconds too; rounding up keeps a short wait a real (long)
/// poll rather than a short poll, which on SQS may miss messages that are there.
pub fn wait_seconds(wait_ms: u64) -> i32 {
    wait_ms.div_ceil(1_000).min(MAX_WAIT_SECONDS) as i32
}

/// What SQS counts against the batch size: body plus attribute names and values.
fn message_size(m: &Outgoing) -> usize {
    m.body.len() + m.attributes.iter().map(|(k, v)| k.len() + v.len() + "String".len()).sum::<usize>()
}

/// Splits messages into batches SQS accepts: at most 10 entries and 256 KiB each.
pub fn batches(messages: Vec<Outgoing>) -> Vec<Vec<Outgoing>> {
    let mut out: Vec<Vec<Outgoing>> = Vec::new();
    let mut bytes = 0;
    for m in messages {
        let size = message_size(&m);
        match out.last_mut() {
            Some(batch) if batch.len() < MAX_BATCH_ENTRIES && bytes + size <= MAX_BATCH_BYTES => {
                bytes += size;
                batch.push(m);
            }
            _ => {
                bytes = size;
                out.push(vec![m]);
            }
        }
    }
    out
}

fn unavailable<E, R>(queue: &QueueUrl, what: &str, err: SdkError<E, R>) -> QueueError
where
    E: std::error::Error + aws_sdk_sqs::error::ProvideErrorMetadata + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    // The JSON protocol names it QueueDoesNotExist; services and emulators still on
    // the query protocol's names send AWS.SimpleQueueService.NonExistentQueue.
    let code = err.as_service_error().and_then(|e| e.code());
    if matches!(code, Some("QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue")) {
        return QueueError::NoSuchQueue(queue.0.clone());
    }
    QueueError::Unavailable {
        queue: queue.0.clone(),
        reason: format!("{what}: {}", DisplayErrorContext(err)),
    }
}

fn entry(index: usize, m: Outgoing, queue: &QueueUrl) -> Result<SendMessageBatchRequestEntry, QueueError> {
    let invalid = |e: aws_sdk_sqs::error::BuildError| QueueError::Unavailable {
        queue: queue.0.clone(),
        reason: e.to_string(),
    };
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .message_body(m.body)
        .delay_seconds(delay_seconds(m.delay_ms));
    for (name, value) in m.attributes {
        // SQS refuses an empty attribute value outright; an empty value carries
        // nothing a reader could not infer from the attribute being absent.
        if value.is_empty() {
            continue;
        }
        let value = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .map_err(invalid)?;
        builder = builder.message_attributes(name, value);
    }
    builder.build().map_err(invalid)
}

/// `Queues` and `QueueConsumer` over SQS. Queue URLs are the ports' `QueueUrl`s as they are.
#[derive(Debug, Clone)]
pub struct SqsQueues {
    client: Client,
}

impl SqsQueues {
    pub fn new(client: Client) -> SqsQueues {
        SqsQueues { client }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// One SendMessageBatch request (at most 10 entries, 256 KiB), with each entry's result.
    async fn send_request(&self, queue: &QueueUrl, batch: Vec<Outgoing>) -> Vec<Result<(), QueueError>> {
        let mut results = Vec::with_capacity(batch.len());
        let mut entries = Vec::with_capacity(batch.len());
        for (i, m) in batch.into_iter().enumerate() {
            match entry(i, m, queue) {
                Ok(e) => {
                    entries.push(e);
                    // Settled below by the response; an entry it does not mention stays failed.
                    results.push(Err(QueueError::Unavailable {
                        queue: queue.0.clone(),
                        reason: "not acknowledged by SendMessageBatch".into(),
                    }));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if entries.is_empty() {
            return results;
        }
        let sent: Vec<usize> = entries.iter().filter_map(|e| e.id().parse().ok()).collect();
        match self.client.send_message_batch().queue_url(&queue.0).set_entries(Some(entries)).send().await {
            Err(e) => {
                let e = unavailable(queue, "sending", e);
                for i in sent {
                    results[i] = Err(e.clone());
                }
            }
            Ok(out) => settle(
                &mut results,
                queue,
                out.successful().iter().map(|e| e.id()),
                out.failed().iter().map(|e| (e.id(), e.code(), e.message().unwrap_or_default())),
            ),
        }
        results
    }
}

/// Puts a SendMessageBatch response's per-entry outcomes in the slots their ids (the
/// entries' indexes) name; a slot the response does not mention keeps its failure.
fn settle<'a>(
    results: &mut [Result<(), QueueError>],
    queue: &QueueUrl,
    successful: impl Iterator<Item = &'a str>,
    failed: impl Iterator<Item = (&'a str, &'a str, &'a str)>,
) {
    fn slot<'r>(
        results: &'r mut [Result<(), QueueError>],
        id: &str,
    ) -> Option<&'r mut Result<(), QueueError>> {
        id.parse::<usize>().ok().and_then(|i| results.get_mut(i))
    }
    for id in successful {
        if let Some(s) = slot(results, id) {
            *s = Ok(());
        }
    }
    for (id, code, message) in failed {
        if let Some(s) = slot(results, id) {
            let reason = format!("{code} {message}");
            *s = Err(QueueError::Unavailable { queue: queue.0.clone(), reason });
        }
    }
}

#[async_trait]
impl Queues for SqsQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        let results = self.send_each(queue, messages).await;
        let failed: Vec<&QueueError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        // The callers resend the whole message list on error (by redelivery of what they
        // were handling); the entries that did go through become duplicates, which every
        // consumer tolerates.
        match failed.first() {
            None => Ok(()),
            // The whole call failed one way (no such queue, unreachable): that error as it is.
            Some(&first) if failed.len() == results.len() && failed.iter().all(|e| *e == first) => {
                Err(first.clone())
            }
            Some(first) => Err(QueueError::Unavailable {
                queue: queue.0.clone(),
                reason: format!("{} of {} messages not sent; first: {first}", failed.len(), results.len()),
            }),
        }
    }

    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Vec<Result<(), QueueError>> {
        let mut results = Vec::with_capacity(messages.len());
        for batch in batches(messages) {
            results.extend(self.send_request(queue, batch).await);
        }
        results
    }
}

#[async_trait]
impl QueueConsumer for SqsQueues {
    async fn receive(&self, queue: &QueueUrl, max: usize, wait_ms: u64) -> Result<Vec<Delivery>, QueueError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&queue.0)
            .max_number_of_messages(max.clamp(1, MAX_BATCH_ENTRIES) as i32)
            .wait_time_seconds(wait_seconds(wait_ms))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            // Who sent it, as SQS saw the sender's credentials: the orders queue binds
            // an order to it (`handlers/submission.rs`).
            .message_system_attribute_names(MessageSystemAttributeName::SenderId)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| unavailable(queue, "receiving", e))?;
        Ok(out.messages.unwrap_or_default().into_iter().map(delivery).collect())
    }

    async fn delete(&self, queue: &QueueUrl, receipt: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(&queue.0)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| unavailable(queue, "deleting", e))?;
        Ok(())
    }

    async fn delete_batch(&self, queue: &QueueUrl, receipts: &[String]) -> usize {
        let mut failed = 0;
        for chunk in receipts.chunks(MAX_BATCH_ENTRIES) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(r).build().ok()
                })
                .collect();
            let built = entries.len();
            failed += chunk.len() - built;
            match self
                .client
                .delete_message_batch()
                .queue_url(&queue.0)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) => {
                    // An entry the response neither confirms nor fails is counted as failed.
                    failed += built.saturating_sub(out.successful().len());
                    for f in out.failed() {
                        tracing::warn!(queue = %queue, code = f.code(), "delete failed; the message will come back");
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %queue, error = %unavailable(queue, "deleting", e), "delete failed; the messages will come back");
                    failed += built;
                }
            }
        }
        failed
    }
}

fn delivery(m: aws_sdk_sqs::types::Message) -> Delivery {
    let receive_count = m
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let sender = m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::SenderId)).cloned();
    let attributes: BTreeMap<String, String> = m
        .message_attributes()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.string_value().map(|s| (k.clone(), s.to_owned())))
        .collect();
    Delivery {
        message_id: m.message_id.unwrap_or_default(),
        body: m.body.unwrap_or_default(),
        attributes,
        receive_count,
        receipt: m.receipt_handle.unwrap_or_default(),
        sender,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_and_cap() {
        assert_eq!(delay_seconds(0), 0);
        assert_eq!(delay_seconds(1), 1);
        assert_eq!(delay_seconds(1_000), 1);
        assert_eq!(delay_seconds(1_001), 2);
        assert_eq!(delay_seconds(10_000_000), 900);
        assert_eq!(wait_seconds(0), 0);
        assert_eq!(wait_seconds(250), 1);
        assert_eq!(wait_seconds(60_000), 20);
    }

    #[test]
    fn each_entry_gets_its_own_outcome() {
        let queue = QueueUrl("q".into());
        let unacknowledged = Err(QueueError::Unavailable { queue: "q".into(), reason: "none".into() });
        let mut results = vec![unacknowledged.clone(); 4];
        settle(
            &mut results,
            &queue,
            ["0", "3", "9", "x"].into_iter(),
            [("2", "InvalidMessageContents", "bad character")].into_iter(),
        );
        assert_eq!(results[0], Ok(()));
        assert_eq!(results[1], unacknowledged, "not in the response: still failed");
        assert_eq!(
            results[2],
            Err(QueueError::Unavailable {
                queue: "q".into(),
                reason: "InvalidMessageContents bad character".into()
            })
        );
        assert_eq!(results[3], Ok(()));
    }

    #[test]
    fn batches_respect_count_and_bytes() {
        let small: Vec<_> = (0..23).map(|i| Outgoing::new(format!("m{i}"))).collect();
        let sizes: Vec<_> = batches(small).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 10, 3]);

        let big: Vec<_> = (0..3).map(|_| Outgoing::new("x".repeat(100 * 1024))).collect();
        let sizes: Vec<_> = batches(big).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 1]);
        assert!(batches(Vec::new()).is_empty());
    }
}
