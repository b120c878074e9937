//! `sasctl dlq list`: a DLQ's messages, left in it.

use std::collections::HashSet;
use std::process::ExitCode;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use sas::handlers::batch::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};

use super::queue::{Target, receive, release, target};
use super::render::print_messages;
use super::{DlqError, ListArgs, PEEK_VISIBILITY_S};

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

/// Up to `limit` messages of the DLQ, left in it: each is received (hidden for at most
/// [`PEEK_VISIBILITY_S`]) and made visible again as soon as the listing ends, also when
/// it ends in an error. Returns them in the order received, each once, and how many could
/// not be made visible again (they come back when their visibility timeout ends).
pub async fn peek(target: &Target, limit: usize) -> Result<(Vec<DlqMessage>, usize), DlqError> {
    let mut seen = HashSet::new();
    let mut kept = Vec::new();
    let mut receipts = Vec::new();
    let result = async {
        while kept.len() < limit {
            let batch = receive(target, (limit - kept.len()).min(10), PEEK_VISIBILITY_S).await?;
            let before = kept.len();
            for m in &batch {
                receipts.extend(m.receipt_handle().map(str::to_owned));
                if seen.insert(m.message_id().unwrap_or_default().to_owned()) {
                    kept.push(DlqMessage::of(m));
                }
            }
            // Nothing new: the queue is empty, or what is left is what we hold.
            if kept.len() == before {
                break;
            }
        }
        Ok::<(), DlqError>(())
    }
    .await;
    let not_released = release(target, receipts).await;
    result.map(|()| (kept, not_released))
}

/// `sasctl dlq list`: prints the messages (a table, or one JSON object each) and, in a
/// table, how many the queue holds.
pub async fn list(args: &ListArgs) -> Result<ExitCode, DlqError> {
    let target = target(&args.queue, &args.deployment, false).await?;
    let (kept, not_released) = peek(&target, args.limit).await?;
    print_messages(&kept, args.json, None);
    if !args.json {
        println!(
            "{} shown; {} holds about {} ({} in flight)",
            kept.len(),
            target.dlq,
            target.visible + target.in_flight,
            target.in_flight
        );
    }
    warn_unreleased(not_released);
    Ok(ExitCode::SUCCESS)
}

pub(super) fn warn_unreleased(n: usize) {
    if n > 0 {
        eprintln!(
            "sasctl: {n} message(s) could not be made visible again; they come back within {PEEK_VISIBILITY_S} s"
        );
    }
}
