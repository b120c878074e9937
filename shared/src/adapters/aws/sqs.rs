//! Queues on SQS: batched sends with per-message delay and string attributes, and the
//! consuming side (receive with the receive count, delete) that Lambda's event source
//! mapping does for the deployed functions and `sasctl dev` and the tests do themselves.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, SendMessageBatchRequestEntry};

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
}

#[async_trait]
impl Queues for SqsQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        for batch in batches(messages) {
            let entries = batch
                .into_iter()
                .enumerate()
                .map(|(i, m)| entry(i, m, queue))
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .send_message_batch()
                .queue_url(&queue.0)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| unavailable(queue, "sending", e))?;
            // The callers resend the whole message list on error (by redelivery of what
            // they were handling); the entries that did go through become duplicates,
            // which every consumer tolerates.
            if let Some(failed) = out.failed().first() {
                return Err(QueueError::Unavailable {
                    queue: queue.0.clone(),
                    reason: format!(
                        "{} of {} messages not sent; first: {} {}",
                        out.failed().len(),
                        out.failed().len() + out.successful().len(),
                        failed.code(),
                        failed.message().unwrap_or_default()
                    ),
                });
            }
        }
        Ok(())
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
}

fn delivery(m: aws_sdk_sqs::types::Message) -> Delivery {
    let receive_count = m
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
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
