//! `sasctl dlq redrive`: a DLQ's messages back to their source queue, by SQS's message
//! move task where the endpoint has it, else by receive, send and delete.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageAttributeValue, SendMessageBatchRequestEntry};
use sas::domain::messages::Intake;
use sas::handlers::batch::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};

use super::list::{peek, warn_unreleased};
use super::queue::{Source, Target, delete, receive, release, target};
use super::render::print_messages;
use super::{DlqError, MOVE_VISIBILITY_S, QueueArg, RedriveArgs};
use crate::deployment::{WorkQueue, aws_reason};

/// Why a message stays in the DLQ: a cancel, held back unless `--include-cancels`.
pub const CANCEL_HELD_BACK: &str = "a cancel, left in the DLQ: it may be stale (its order resubmitted or sent again since) and would stop the order; redrive it with --include-cancels once it should still apply";

/// Why the message with `body` stays in the DLQ, or `None` when it goes back.
pub fn held_back(body: &str, include_cancels: bool) -> Option<&'static str> {
    (!include_cancels && Intake::is_cancel(body)).then_some(CANCEL_HELD_BACK)
}

/// Whether the DLQ may hold apps' cancels: the orders DLQ, or one named by URL. The
/// scheduler, agent and callback queues take none (one sent there is rejected again,
/// whatever it says).
fn may_hold_cancels(queue: &QueueArg) -> bool {
    !matches!(queue, QueueArg::Work(WorkQueue::Scheduler | WorkQueue::Agent | WorkQueue::Callbacks))
}

/// How the messages went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// SQS's message move task.
    MoveTask,
    /// Receive, send to the source queue, delete from the DLQ (endpoints without move tasks).
    ReceiveSendDelete,
}

/// What a redrive did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Redriven {
    pub dlq: String,
    pub source: String,
    /// `None` when there was nothing to move.
    pub method: Option<Method>,
    pub moved: u64,
    /// Cancels left in the DLQ ([`CANCEL_HELD_BACK`]).
    pub held_back: u64,
    /// Sent to the source queue but not deleted from the DLQ: each will be there again
    /// (and be redriven again by the next redrive; handlers tolerate the duplicate).
    pub not_deleted: u64,
}

/// `sasctl dlq redrive`.
pub async fn redrive(args: &RedriveArgs) -> Result<ExitCode, DlqError> {
    let target = target(&args.queue, &args.deployment, true).await?;
    let source = target.source.clone().expect("asked for the source");
    if args.dry_run {
        let (kept, not_released) = peek(&target, args.limit).await?;
        let (stay, go): (Vec<_>, Vec<_>) =
            kept.into_iter().partition(|k| held_back(&k.body, args.include_cancels).is_some());
        print_messages(&go, args.json, Some(("would_move_to", source.url.clone().into())));
        print_messages(&stay, args.json, Some(("would_stay", CANCEL_HELD_BACK.into())));
        let summary = serde_json::json!({
            "dry_run": true, "dlq": target.dlq, "source": source.url, "rate": args.rate,
            "messages": target.visible, "in_flight": target.in_flight, "listed": go.len() + stay.len(),
            "listed_held_back": stay.len(),
        });
        if args.json {
            println!("{summary}");
        } else {
            let kept_ones = go.iter().filter(|k| k.reason.is_some()).count();
            if !stay.is_empty() {
                println!("{} listed would stay: {CANCEL_HELD_BACK}", stay.len());
            }
            println!(
                "dry run: would move about {} message(s) from {} to {}, at most {} a second{}",
                target.visible.saturating_sub(stay.len() as u64),
                target.dlq,
                source.url,
                args.rate,
                if kept_ones > 0 {
                    format!(
                        "; {kept_ones} listed carry a {REASON_ATTRIBUTE} (rejected input: they are rejected again unless its cause was fixed)"
                    )
                } else {
                    String::new()
                }
            );
        }
        warn_unreleased(not_released);
        return Ok(ExitCode::SUCCESS);
    }
    let redriven = if target.visible == 0 {
        Redriven {
            dlq: target.dlq.clone(),
            source: source.url.clone(),
            method: None,
            moved: 0,
            held_back: 0,
            not_deleted: 0,
        }
    } else {
        let bar = crate::text::progress_bar(target.visible, "moved");
        // A move task cannot look inside the messages: where cancels may be, by hand.
        let hold_back_cancels = !args.include_cancels && may_hold_cancels(&args.queue);
        let task =
            if hold_back_cancels { None } else { start_move_task(&target, &source, args.rate).await? };
        let result = match task {
            Some(handle) => follow_move_task(&target, &source, &handle, &bar).await,
            None => move_by_hand(&target, &source, args.rate, !hold_back_cancels, &bar).await,
        };
        bar.finish_and_clear();
        result?
    };
    if args.json {
        println!("{}", serde_json::to_value(&redriven).expect("a result serializes"));
    } else {
        match redriven.method {
            None => println!("nothing to move: {} has no visible message", redriven.dlq),
            Some(method) => {
                let how = match method {
                    Method::MoveTask => "SQS message move task",
                    Method::ReceiveSendDelete => "receive, send, delete",
                };
                println!(
                    "moved {} message(s) from {} to {} ({how})",
                    redriven.moved, redriven.dlq, redriven.source
                );
            }
        }
        if target.in_flight > 0 {
            println!(
                "{} more were in flight (being read): they are back in the DLQ when their visibility timeout ends",
                target.in_flight
            );
        }
        if redriven.held_back > 0 {
            println!("{} left in the DLQ: {CANCEL_HELD_BACK}", redriven.held_back);
        }
        if redriven.moved > 0 && may_hold_cancels(&args.queue) {
            println!(
                "note: redriven orders arrive under the identity that sent them again, not their app's:                  an order its app already sent is refused as taken (kept again, nobody told), and a new one                  can be cancelled only by that identity (docs/DEPLOY.md, \"Who may cancel an order\")"
            );
        }
        if redriven.not_deleted > 0 {
            println!(
                "{} were sent but could not be deleted from the DLQ: they will be there again (a duplicate, which the functions tolerate)",
                redriven.not_deleted
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts SQS's message move task from the DLQ to the source queue; `None` when the
/// endpoint has no such call (then the caller moves the messages itself).
async fn start_move_task(target: &Target, source: &Source, rate: u32) -> Result<Option<String>, DlqError> {
    // No retries: an endpoint without the call answers with a server error, which the
    // SDK would otherwise retry before the fallback could start.
    let no_retries =
        aws_sdk_sqs::config::Builder::default().retry_config(aws_config::retry::RetryConfig::disabled());
    let result = target
        .sqs
        .start_message_move_task()
        .source_arn(&target.dlq_arn)
        .destination_arn(&source.arn)
        .max_number_of_messages_per_second(rate as i32)
        .customize()
        .config_override(no_retries)
        .send()
        .await;
    match result {
        Ok(out) => Ok(Some(out.task_handle.unwrap_or_default())),
        Err(e) if move_tasks_unsupported(&e) => {
            tracing::info!(at = %target.at, reason = %aws_reason(&e), "no message move tasks: moving by hand");
            Ok(None)
        }
        Err(e) => Err(DlqError::Aws {
            doing: format!("starting a message move task from {} (SQS StartMessageMoveTask)", target.dlq),
            at: target.at.clone(),
            reason: aws_reason(&e),
        }),
    }
}

/// The endpoint does not know StartMessageMoveTask: it answered with something that is
/// not an AWS error (moto: a bare HTTP 500), or with an "unknown operation" code.
fn move_tasks_unsupported<E, R>(e: &aws_sdk_sqs::error::SdkError<E, R>) -> bool
where
    E: aws_sdk_sqs::error::ProvideErrorMetadata,
{
    const UNSUPPORTED: [&str; 4] =
        ["UnsupportedOperation", "InvalidAction", "NotImplemented", "UnknownOperationException"];
    match e.as_service_error() {
        Some(s) => match s.code() {
            None => true,
            Some(code) => UNSUPPORTED.iter().any(|u| code.ends_with(u)),
        },
        None => false,
    }
}

/// Polls the move task until it ends.
async fn follow_move_task(
    target: &Target,
    source: &Source,
    handle: &str,
    bar: &indicatif::ProgressBar,
) -> Result<Redriven, DlqError> {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let out = target
            .sqs
            .list_message_move_tasks()
            .source_arn(&target.dlq_arn)
            .max_results(10)
            .send()
            .await
            .map_err(|e| DlqError::Aws {
                doing: format!("following message move task {handle} (SQS ListMessageMoveTasks)"),
                at: target.at.clone(),
                reason: aws_reason(&e),
            })?;
        // SQS names a task's handle only while it runs; once it has ended, it is the
        // newest task of the DLQ (the list's first), as this one was just started.
        let results = out.results();
        let task = results
            .iter()
            .find(|t| t.task_handle() == Some(handle))
            .or_else(|| results.first().filter(|t| t.task_handle().is_none()));
        let Some(task) = task else { continue };
        let moved = task.approximate_number_of_messages_moved();
        if let Some(total) = task.approximate_number_of_messages_to_move() {
            bar.set_length(total.max(0) as u64);
        }
        bar.set_position(moved.max(0) as u64);
        match task.status().unwrap_or_default() {
            "COMPLETED" => {
                return Ok(Redriven {
                    dlq: target.dlq.clone(),
                    source: source.url.clone(),
                    method: Some(Method::MoveTask),
                    moved: moved.max(0) as u64,
                    held_back: 0,
                    not_deleted: 0,
                });
            }
            status @ ("FAILED" | "CANCELLED") => {
                return Err(DlqError::MoveTask {
                    handle: handle.to_owned(),
                    status: status.to_lowercase(),
                    reason: task.failure_reason().unwrap_or("no reason given").to_owned(),
                    moved,
                });
            }
            status => bar.set_message(status.to_lowercase()),
        }
    }
}

/// Receive, send to the source queue, delete from the DLQ, a batch at a time, for about
/// as many messages as the DLQ held at the start (what arrives later waits for the next
/// redrive, as with a move task), at most `rate` a second. Unless `include_cancels`, a
/// cancel is not sent: it stays hidden until the end, then is made visible in the DLQ again.
async fn move_by_hand(
    target: &Target,
    source: &Source,
    rate: u32,
    include_cancels: bool,
    bar: &indicatif::ProgressBar,
) -> Result<Redriven, DlqError> {
    // Held-back messages by id, with their latest receipt: one that comes back (a run
    // longer than MOVE_VISIBILITY_S) is counted once.
    let mut held: HashMap<String, String> = HashMap::new();
    let result = move_batches(target, source, rate, include_cancels, &mut held, bar).await;
    let not_released = release(target, held.values().cloned().collect()).await;
    if not_released > 0 {
        tracing::warn!(not_released, "held-back messages come back after their visibility timeout");
    }
    let (moved, not_deleted) = result?;
    Ok(Redriven {
        dlq: target.dlq.clone(),
        source: source.url.clone(),
        method: Some(Method::ReceiveSendDelete),
        moved,
        held_back: held.len() as u64,
        not_deleted,
    })
}

/// [`move_by_hand`]'s loop: how many were moved, and how many not deleted.
async fn move_batches(
    target: &Target,
    source: &Source,
    rate: u32,
    include_cancels: bool,
    held: &mut HashMap<String, String>,
    bar: &indicatif::ProgressBar,
) -> Result<(u64, u64), DlqError> {
    let started = Instant::now();
    let mut moved = 0u64;
    let mut not_deleted = 0u64;
    while moved + (held.len() as u64) < target.visible {
        // A batch no bigger than a second's worth, so a low rate is a trickle, not bursts.
        let per_batch = u64::from(rate).min(10);
        let wanted = (target.visible - moved - held.len() as u64).min(per_batch) as usize;
        let received = receive(target, wanted, MOVE_VISIBILITY_S).await?;
        if received.is_empty() {
            break;
        }
        let mut batch = Vec::new();
        let mut new_held = 0;
        for m in received {
            if held_back(m.body().unwrap_or_default(), include_cancels).is_some() {
                let id = m.message_id().unwrap_or_default().to_owned();
                let receipt = m.receipt_handle().unwrap_or_default().to_owned();
                if held.insert(id, receipt).is_none() {
                    new_held += 1;
                }
            } else {
                batch.push(m);
            }
        }
        // Only held-back messages seen before: what is left is what we hold.
        if batch.is_empty() && new_held == 0 {
            break;
        }
        let (sent, failed) = send_to_source(target, source, &batch).await;
        // Failed sends go straight back to the DLQ, not after MOVE_VISIBILITY_S.
        let failed_receipts: Vec<String> =
            failed.iter().filter_map(|(i, _)| batch[*i].receipt_handle().map(str::to_owned)).collect();
        let sent_receipts: Vec<&str> = sent.iter().filter_map(|i| batch[*i].receipt_handle()).collect();
        not_deleted += delete(target, &sent_receipts).await;
        moved += sent.len() as u64;
        bar.set_position(moved + held.len() as u64);
        bar.set_message(format!("moved, {} cancel(s) held back", held.len()));
        if let Some((_, reason)) = failed.first() {
            let _ = release(target, failed_receipts).await;
            return Err(DlqError::NotSent {
                failed: failed.len(),
                source_url: source.url.clone(),
                reason: reason.clone(),
                moved,
            });
        }
        // Paced between batches; none is owed after the last.
        let due = Duration::from_secs_f64(moved as f64 / f64::from(rate));
        if moved + (held.len() as u64) < target.visible
            && let Some(wait) = due.checked_sub(started.elapsed())
        {
            tokio::time::sleep(wait).await;
        }
    }
    Ok((moved, not_deleted))
}

/// The attributes a message goes back with: all of them but `sas-reason` and
/// `sas-source`. Those describe a past rejection; on the source queue they are stale: a
/// message rejected again is kept with a fresh reason, and one that instead failed its
/// five receives would reach the DLQ still carrying the old reason, and read as rejected
/// input rather than as a failure to investigate.
pub fn attributes_to_keep(m: &Message) -> BTreeMap<String, MessageAttributeValue> {
    m.message_attributes()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != REASON_ATTRIBUTE && k.as_str() != SOURCE_ATTRIBUTE)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sends the batch's messages to the source queue, in requests SQS accepts (at most ten
/// entries and 256 KiB each). Returns the indexes sent, and those not sent with why.
async fn send_to_source(
    target: &Target,
    source: &Source,
    batch: &[Message],
) -> (Vec<usize>, Vec<(usize, String)>) {
    let mut sent = Vec::new();
    let mut failed = Vec::new();
    let mut requests: Vec<Vec<(usize, SendMessageBatchRequestEntry)>> = Vec::new();
    let mut bytes = 0;
    for (i, m) in batch.iter().enumerate() {
        let attributes = attributes_to_keep(m);
        let size = m.body().unwrap_or_default().len()
            + attributes
                .iter()
                .map(|(k, v)| {
                    k.len()
                        + v.data_type().len()
                        + v.string_value().map_or(0, str::len)
                        + v.binary_value().map_or(0, |b| b.as_ref().len())
                })
                .sum::<usize>();
        let entry = SendMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .message_body(m.body().unwrap_or_default())
            .set_message_attributes((!attributes.is_empty()).then(|| attributes.into_iter().collect()))
            .build();
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                failed.push((i, e.to_string()));
                continue;
            }
        };
        match requests.last_mut() {
            Some(r) if bytes + size <= sas::adapters::aws::sqs::MAX_BATCH_BYTES => {
                bytes += size;
                r.push((i, entry));
            }
            _ => {
                bytes = size;
                requests.push(vec![(i, entry)]);
            }
        }
    }
    for request in requests {
        let ids: Vec<usize> = request.iter().map(|(i, _)| *i).collect();
        let entries = request.into_iter().map(|(_, e)| e).collect();
        match target.sqs.send_message_batch().queue_url(&source.url).set_entries(Some(entries)).send().await {
            Err(e) => failed.extend(ids.into_iter().map(|i| (i, aws_reason(&e)))),
            Ok(out) => {
                let ok: HashSet<usize> =
                    out.successful().iter().filter_map(|s| s.id().parse().ok()).collect();
                for i in ids {
                    if ok.contains(&i) {
                        sent.push(i);
                    } else {
                        let why = out
                            .failed()
                            .iter()
                            .find(|f| f.id() == i.to_string())
                            .map(|f| format!("{}: {}", f.code(), f.message().unwrap_or_default()))
                            .unwrap_or_else(|| "not acknowledged".into());
                        failed.push((i, why));
                    }
                }
            }
        }
    }
    (sent, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancels_are_held_back_unless_asked() {
        let cancel = r#"{"cancel":"o-1","reason":"customer left"}"#;
        assert_eq!(held_back(cancel, false), Some(CANCEL_HELD_BACK));
        assert_eq!(held_back(cancel, true), None);
        let order =
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1}],"workflow":"w"}"#;
        assert_eq!(held_back(order, false), None);
        assert_eq!(held_back("not json", false), None);
        assert!(may_hold_cancels(&QueueArg::Work(WorkQueue::Orders)));
        assert!(may_hold_cancels(&QueueArg::Url("https://sqs.us-east-1.amazonaws.com/1/x".into())));
        assert!(!may_hold_cancels(&QueueArg::Work(WorkQueue::Agent)));
        assert!(!may_hold_cancels(&QueueArg::Work(WorkQueue::Callbacks)));
    }

    #[test]
    fn the_reason_does_not_go_back() {
        let value =
            |s: &str| MessageAttributeValue::builder().data_type("String").string_value(s).build().unwrap();
        let m = Message::builder()
            .message_attributes(REASON_ATTRIBUTE, value("bad"))
            .message_attributes(SOURCE_ATTRIBUTE, value("q"))
            .message_attributes("trace", value("t-1"))
            .build();
        let kept = attributes_to_keep(&m);
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["trace"]);
    }
}
