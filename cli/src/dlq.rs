//! `sasctl dlq`: read a dead-letter queue without consuming it, and move its messages back
//! to the work queue they came from.
//!
//! Reading SQS means receiving: `list` receives with a short visibility timeout and makes
//! every message it saw visible again at once, so other consumers miss them for a few
//! seconds at most, and each message's receive count goes up by one (harmless on a DLQ,
//! which has no redrive policy of its own; `list` refuses a queue that has one).
//!
//! `redrive` uses SQS's own message move task (StartMessageMoveTask, followed with
//! ListMessageMoveTasks) where the endpoint offers it. Where it does not (moto has no
//! message move tasks), it receives, sends to the source queue and deletes from the DLQ,
//! ten at a time, deleting a message only after its send succeeded: a failure leaves it in
//! the DLQ, at worst also in the source queue (a duplicate, which every handler tolerates),
//! never in neither.

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use sas::handlers::batch::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};

use crate::args::whole;
use crate::deployment::{DeploymentArgs, DeploymentError, WorkQueue, aws_reason};

/// How long `list` hides what it receives: long enough to page through `--limit`
/// messages without seeing one twice, and it is cut short as soon as the listing ends.
pub const PEEK_VISIBILITY_S: i32 = 20;
/// How long the fallback redrive hides a batch while sending it to the source queue: if
/// sasctl dies mid-batch, the batch is back in the DLQ after this.
pub const MOVE_VISIBILITY_S: i32 = 60;
/// SQS's limit on a move task's rate, used for the fallback's `--rate` too.
pub const MAX_RATE: u32 = 500;

/// QUEUE: a work queue whose DLQ is meant, or a DLQ's URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueArg {
    Work(WorkQueue),
    Url(String),
}

impl FromStr for QueueArg {
    type Err = String;
    fn from_str(s: &str) -> Result<QueueArg, String> {
        if let Some(q) = WorkQueue::parse(s) {
            return Ok(QueueArg::Work(q));
        }
        if crate::endpoint::check_url(s).is_ok() {
            return Ok(QueueArg::Url(s.to_owned()));
        }
        Err(format!("must be orders, scheduler, agent or a DLQ's URL (got {s:?})"))
    }
}

/// `sasctl dlq list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// orders, scheduler or agent (the work queue whose DLQ to read), or a DLQ's URL.
    #[arg(value_name = "QUEUE")]
    pub queue: QueueArg,
    /// Messages to show at most (1 to 1000).
    #[arg(long, default_value_t = 50, value_parser = whole::<usize>("--limit", 1, 1_000))]
    pub limit: usize,
    /// One JSON object per message (its whole body included).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// `sasctl dlq redrive`.
#[derive(Debug, Clone, clap::Args)]
pub struct RedriveArgs {
    /// orders, scheduler or agent (the work queue whose DLQ to redrive), or a DLQ's URL
    /// (its source queue is the one queue whose redrive policy names it).
    #[arg(value_name = "QUEUE")]
    pub queue: QueueArg,
    /// Messages moved per second at most (1 to 500; default: as fast as SQS goes).
    #[arg(long, value_name = "N", value_parser = whole::<u32>("--rate", 1, MAX_RATE.into()))]
    pub rate: Option<u32>,
    /// Move nothing: say where the messages would go and list them (as `list` does,
    /// hiding them for a few seconds).
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: messages to list at most (1 to 1000).
    #[arg(long, default_value_t = 50, requires = "dry_run",
          value_parser = whole::<usize>("--limit", 1, 1_000))]
    pub limit: usize,
    /// One JSON object for the result (with --dry-run, one per message first).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// Why a `dlq` command stopped. Each displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DlqError {
    #[error(transparent)]
    Deployment(#[from] DeploymentError),
    #[error("queue {url} does not exist at {at}: check the URL (aws sqs list-queues)")]
    NoSuchQueue { url: String, at: String },
    #[error(
        "{url} is not a dead-letter queue (it has a redrive policy of its own): reading it would count towards moving its messages to its DLQ"
    )]
    NotADlq { url: String },
    #[error(
        "{why}: name the work queue (orders, scheduler, agent) with --stack or --prefix instead of the URL"
    )]
    NoSource { why: String },
    #[error("{doing} at {at} failed: {reason}")]
    Aws { doing: String, at: String, reason: String },
    /// The message move task ended without moving everything.
    #[error("the message move task {handle} ended {status}: {reason} ({moved} moved)")]
    MoveTask { handle: String, status: String, reason: String, moved: i64 },
    /// The fallback redrive stopped: these were not sent and stay in the DLQ.
    #[error(
        "{failed} message(s) could not be sent to {source_url} ({reason}); they stay in the DLQ ({moved} moved)"
    )]
    NotSent { failed: usize, source_url: String, reason: String, moved: u64 },
}

/// A DLQ and, for a redrive, the queue its messages go back to.
#[derive(Debug, Clone)]
pub struct Target {
    pub sqs: Client,
    /// The endpoint, as messages name it.
    pub at: String,
    pub dlq: String,
    pub dlq_arn: String,
    /// Messages visible in the DLQ, as SQS approximates it.
    pub visible: u64,
    /// Received by someone and not yet deleted or made visible again.
    pub in_flight: u64,
    pub source: Option<Source>,
}

#[derive(Debug, Clone)]
pub struct Source {
    pub url: String,
    pub arn: String,
}

/// Finds the DLQ that `queue` names (and, with `with_source`, its source queue) and
/// checks it is a DLQ. A URL needs no deployment: `deployment` then only gives the endpoint.
pub async fn target(
    queue: &QueueArg,
    deployment: &DeploymentArgs,
    with_source: bool,
) -> Result<Target, DlqError> {
    let (sqs, at, dlq, source) = match queue {
        QueueArg::Work(q) => {
            let d = deployment.resolve().await?;
            let dlq = d.dlq(*q)?.to_owned();
            let source = if with_source { Some(d.queue(*q)?.to_owned()) } else { None };
            (Client::new(d.sdk_config()), d.at().to_owned(), dlq, source)
        }
        QueueArg::Url(url) => {
            let (sdk, at) = deployment.sdk_config().await?;
            let sqs = Client::new(&sdk);
            let source = if with_source { Some(source_of(&sqs, &at, url).await?) } else { None };
            (sqs, at, url.clone(), source)
        }
    };
    let attributes = attributes(
        &sqs,
        &at,
        &dlq,
        &[
            QueueAttributeName::QueueArn,
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::RedrivePolicy,
        ],
    )
    .await?;
    if attributes.get(&QueueAttributeName::RedrivePolicy).is_some_and(|p| !p.trim().is_empty()) {
        return Err(DlqError::NotADlq { url: dlq });
    }
    let count = |a| attributes.get(&a).and_then(|v| v.parse().ok()).unwrap_or(0);
    let source = match source {
        None => None,
        Some(url) => {
            if url == dlq {
                return Err(DlqError::NoSource { why: format!("{dlq} is its own source queue") });
            }
            let arn = attributes_of_source(&sqs, &at, &url).await?;
            Some(Source { url, arn })
        }
    };
    Ok(Target {
        dlq_arn: attributes.get(&QueueAttributeName::QueueArn).cloned().unwrap_or_default(),
        visible: count(QueueAttributeName::ApproximateNumberOfMessages),
        in_flight: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        sqs,
        at,
        dlq,
        source,
    })
}

async fn attributes_of_source(sqs: &Client, at: &str, url: &str) -> Result<String, DlqError> {
    let a = attributes(sqs, at, url, &[QueueAttributeName::QueueArn]).await?;
    a.get(&QueueAttributeName::QueueArn).cloned().ok_or_else(|| DlqError::Aws {
        doing: format!("reading the ARN of {url}"),
        at: at.to_owned(),
        reason: "no QueueArn in the answer".into(),
    })
}

async fn attributes(
    sqs: &Client,
    at: &str,
    url: &str,
    names: &[QueueAttributeName],
) -> Result<BTreeMap<QueueAttributeName, String>, DlqError> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .set_attribute_names(Some(names.to_vec()))
        .send()
        .await
        .map_err(|e| sqs_error(&e, url, at, || format!("reading {url} (SQS GetQueueAttributes)")))?;
    Ok(out.attributes.unwrap_or_default().into_iter().collect())
}

/// An SQS call on the queue at `url` failed: "no such queue" said so, anything else in one
/// line naming what was being done.
fn sqs_error<E, R>(
    e: &aws_sdk_sqs::error::SdkError<E, R>,
    url: &str,
    at: &str,
    doing: impl FnOnce() -> String,
) -> DlqError
where
    E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match e.as_service_error() {
        Some(s) if crate::deployment::queue_missing(s) => {
            DlqError::NoSuchQueue { url: url.to_owned(), at: at.to_owned() }
        }
        _ => DlqError::Aws { doing: doing(), at: at.to_owned(), reason: aws_reason(e) },
    }
}

/// The one queue whose redrive policy names the DLQ at `url`.
async fn source_of(sqs: &Client, at: &str, url: &str) -> Result<String, DlqError> {
    let out = sqs.list_dead_letter_source_queues().queue_url(url).send().await.map_err(|e| {
        sqs_error(&e, url, at, || {
            format!("finding the source queue of {url} (SQS ListDeadLetterSourceQueues)")
        })
    })?;
    match out.queue_urls() {
        [one] => Ok(one.clone()),
        [] => Err(DlqError::NoSource { why: format!("no queue's redrive policy names {url}") }),
        many => Err(DlqError::NoSource {
            why: format!("{} queues redrive to {url} ({})", many.len(), many.join(", ")),
        }),
    }
}

/// One message kept in a DLQ, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Kept {
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

impl Kept {
    fn of(m: &Message) -> Kept {
        let system = |name: MessageSystemAttributeName| {
            m.attributes().and_then(|a| a.get(&name)).and_then(|v| v.parse::<i64>().ok())
        };
        let attribute = |name: &str| {
            m.message_attributes().and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned)
        };
        Kept {
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

    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a kept message serializes");
        v["first_seen"] = self.first_seen_ms.map(time).into();
        v
    }
}

/// RFC 3339, UTC, to the millisecond.
fn time(ms: i64) -> String {
    aws_sdk_sqs::primitives::DateTime::from_millis(ms)
        .fmt(aws_sdk_sqs::primitives::DateTimeFormat::DateTime)
        .unwrap_or_else(|_| ms.to_string())
}

/// `text` on one line, at most `max` characters (control characters shown as spaces).
fn preview(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
    }
}

/// Up to `limit` messages of the DLQ, left in it: each is received (hidden for at most
/// [`PEEK_VISIBILITY_S`]) and made visible again as soon as the listing ends, also when
/// it ends in an error. Returns them in the order received, each once, and how many could
/// not be made visible again (they come back when their visibility timeout ends).
pub async fn peek(target: &Target, limit: usize) -> Result<(Vec<Kept>, usize), DlqError> {
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
                    kept.push(Kept::of(m));
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

/// One receive from the DLQ, waiting a second: a long poll asks every SQS server, so an
/// empty answer means empty (a short poll may miss messages that are there).
async fn receive(target: &Target, max: usize, visibility_s: i32) -> Result<Vec<Message>, DlqError> {
    let out = target
        .sqs
        .receive_message()
        .queue_url(&target.dlq)
        .max_number_of_messages(max as i32)
        .visibility_timeout(visibility_s)
        .wait_time_seconds(1)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .map_err(|e| DlqError::Aws {
            doing: format!("receiving from {}", target.dlq),
            at: target.at.clone(),
            reason: aws_reason(&e),
        })?;
    Ok(out.messages.unwrap_or_default())
}

/// Makes the messages behind `receipts` visible again; returns how many could not be.
async fn release(target: &Target, receipts: Vec<String>) -> usize {
    let mut failed = 0;
    for chunk in receipts.chunks(10) {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .visibility_timeout(0)
                    .build()
                    .ok()
            })
            .collect();
        let sent = entries.len();
        failed += chunk.len() - sent;
        match target
            .sqs
            .change_message_visibility_batch()
            .queue_url(&target.dlq)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => failed += out.failed().len(),
            Err(_) => failed += sent,
        }
    }
    failed
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

fn warn_unreleased(n: usize) {
    if n > 0 {
        eprintln!(
            "sasctl: {n} message(s) could not be made visible again; they come back within {PEEK_VISIBILITY_S} s"
        );
    }
}

fn print_messages(kept: &[Kept], json: bool, extra: Option<(&str, serde_json::Value)>) {
    if json {
        for k in kept {
            let mut v = k.json();
            if let Some((key, value)) = &extra {
                v[*key] = value.clone();
            }
            println!("{v}");
        }
        return;
    }
    if kept.is_empty() {
        return;
    }
    println!("{:<36}  {:<24}  {:>8}  {:<40}  BODY", "MESSAGE ID", "FIRST SEEN", "RECEIVES", "REASON");
    for k in kept {
        println!(
            "{:<36}  {:<24}  {:>8}  {:<40}  {}",
            k.message_id,
            k.first_seen_ms.map(time).unwrap_or_else(|| "-".into()),
            k.receive_count,
            k.reason.as_deref().map(|r| preview(r, 40)).unwrap_or_else(|| "-".into()),
            preview(&k.body, 60)
        );
    }
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
        print_messages(&kept, args.json, Some(("would_move_to", source.url.clone().into())));
        let summary = serde_json::json!({
            "dry_run": true, "dlq": target.dlq, "source": source.url,
            "messages": target.visible, "in_flight": target.in_flight, "listed": kept.len(),
        });
        if args.json {
            println!("{summary}");
        } else {
            let kept_ones = kept.iter().filter(|k| k.reason.is_some()).count();
            println!(
                "dry run: would move about {} message(s) from {} to {}{}",
                target.visible,
                target.dlq,
                source.url,
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
            not_deleted: 0,
        }
    } else {
        let bar = progress_bar(target.visible);
        let result = match start_move_task(&target, &source, args.rate).await? {
            Some(handle) => follow_move_task(&target, &source, &handle, &bar).await,
            None => move_by_hand(&target, &source, args.rate, &bar).await,
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
        if redriven.not_deleted > 0 {
            println!(
                "{} were sent but could not be deleted from the DLQ: they will be there again (a duplicate, which the functions tolerate)",
                redriven.not_deleted
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} moved  {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Starts SQS's message move task from the DLQ to the source queue; `None` when the
/// endpoint has no such call (then the caller moves the messages itself).
async fn start_move_task(
    target: &Target,
    source: &Source,
    rate: Option<u32>,
) -> Result<Option<String>, DlqError> {
    // No retries: an endpoint without the call answers with a server error, which the
    // SDK would otherwise retry before the fallback could start.
    let no_retries =
        aws_sdk_sqs::config::Builder::default().retry_config(aws_config::retry::RetryConfig::disabled());
    let result = target
        .sqs
        .start_message_move_task()
        .source_arn(&target.dlq_arn)
        .destination_arn(&source.arn)
        .set_max_number_of_messages_per_second(rate.map(|r| r as i32))
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
/// redrive, as with a move task).
async fn move_by_hand(
    target: &Target,
    source: &Source,
    rate: Option<u32>,
    bar: &indicatif::ProgressBar,
) -> Result<Redriven, DlqError> {
    let started = Instant::now();
    let mut moved = 0u64;
    let mut not_deleted = 0u64;
    while moved < target.visible {
        // A batch no bigger than a second's worth, so a low rate is a trickle, not bursts.
        let per_batch = rate.map_or(10, |r| u64::from(r).min(10));
        let wanted = (target.visible - moved).min(per_batch) as usize;
        let batch = receive(target, wanted, MOVE_VISIBILITY_S).await?;
        if batch.is_empty() {
            break;
        }
        let (sent, failed) = send_to_source(target, source, &batch).await;
        // Failed sends go straight back to the DLQ, not after MOVE_VISIBILITY_S.
        let failed_receipts: Vec<String> =
            failed.iter().filter_map(|(i, _)| batch[*i].receipt_handle().map(str::to_owned)).collect();
        let sent_receipts: Vec<&str> = sent.iter().filter_map(|i| batch[*i].receipt_handle()).collect();
        not_deleted += delete(target, &sent_receipts).await;
        moved += sent.len() as u64;
        bar.set_position(moved);
        if let Some((_, reason)) = failed.first() {
            let _ = release(target, failed_receipts).await;
            return Err(DlqError::NotSent {
                failed: failed.len(),
                source_url: source.url.clone(),
                reason: reason.clone(),
                moved,
            });
        }
        if let Some(rate) = rate {
            let due = Duration::from_secs_f64(moved as f64 / f64::from(rate));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
    Ok(Redriven {
        dlq: target.dlq.clone(),
        source: source.url.clone(),
        method: Some(Method::ReceiveSendDelete),
        moved,
        not_deleted,
    })
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

/// Deletes from the DLQ; returns how many could not be deleted.
async fn delete(target: &Target, receipts: &[&str]) -> u64 {
    let mut failed = 0;
    for chunk in receipts.chunks(10) {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(*r).build().ok()
            })
            .collect();
        failed += (chunk.len() - entries.len()) as u64;
        let n = entries.len() as u64;
        match target.sqs.delete_message_batch().queue_url(&target.dlq).set_entries(Some(entries)).send().await
        {
            Ok(out) => failed += out.failed().len() as u64,
            Err(_) => failed += n,
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_and_urls() {
        assert_eq!("orders".parse(), Ok(QueueArg::Work(WorkQueue::Orders)));
        assert_eq!("agent".parse(), Ok(QueueArg::Work(WorkQueue::Agent)));
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders-dlq";
        assert_eq!(url.parse(), Ok(QueueArg::Url(url.into())));
        assert_eq!(
            "status".parse::<QueueArg>(),
            Err("must be orders, scheduler, agent or a DLQ's URL (got \"status\")".into())
        );
    }

    #[test]
    fn previews_are_one_short_line() {
        assert_eq!(preview("a\nb\tc", 10), "a b c");
        assert_eq!(preview("abcdef", 3), "abc...");
        assert_eq!(preview("ééé", 2), "éé...");
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

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
