//! One message kept in a DLQ, as `list` and `redrive` show it: its id, when it was first
//! seen, its receives, and why a function kept it (the `sas-reason` and `sas-source`
//! attributes). Printing it: `render.rs`.

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use sas::handlers::batch::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};

/// One message kept in a DLQ, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DlqMessage {
    pub message_id: String,
    /// When it was first sent, in ms since the epoch (SentTimestamp; else the first receive).
    pub first_seen_ms: Option<i64>,
    /// Receives so far, this listing's included.
    pub receive_count: u32,
    /// The `sas-reason` attribute: why a function kept it. Absent on a message SQS moved
    /// after too many failed receives.
    pub reason: Option<String>,
    /// The `sas-source` attribute: the queue a function kept it from.
    pub kept_from: Option<String>,
    pub body: String,
}

impl DlqMessage {
    pub(super) fn of(m: &Message) -> DlqMessage {
        let system = |name: MessageSystemAttributeName| {
            m.attributes().and_then(|a| a.get(&name)).and_then(|v| v.parse::<i64>().ok())
        };
        let attribute = |name: &str| {
            m.message_attributes().and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned)
        };
        DlqMessage {
            message_id: m.message_id().unwrap_or_default().to_owned(),
            first_seen_ms: system(MessageSystemAttributeName::SentTimestamp)
                .or_else(|| system(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)),
            receive_count: system(MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(1),
            reason: attribute(REASON_ATTRIBUTE),
            kept_from: attribute(SOURCE_ATTRIBUTE),
            body: m.body().unwrap_or_default().to_owned(),
        }
    }
}
