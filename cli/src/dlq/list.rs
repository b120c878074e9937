//! `sasctl dlq list`: a DLQ's messages, left in it.

use std::collections::HashSet;
use std::process::ExitCode;

use super::message::DlqMessage;
use super::queue::{Target, receive, release, target};
use super::render::print_messages;
use super::{DlqError, ListArgs, PEEK_VISIBILITY_S};

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
