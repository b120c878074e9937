//! The DLQ a command names, found and checked, and the SQS calls on it: receive, make
//! visible again, delete.

use std::collections::BTreeMap;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName, QueueAttributeName,
};

use super::{DlqError, QueueArg};
use crate::deployment::{DeploymentArgs, aws_reason};

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

/// One receive from the DLQ, waiting a second: a long poll asks every SQS server, so an
/// empty answer means empty (a short poll may miss messages that are there).
pub(super) async fn receive(
    target: &Target,
    max: usize,
    visibility_s: i32,
) -> Result<Vec<Message>, DlqError> {
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
pub(super) async fn release(target: &Target, receipts: Vec<String>) -> usize {
    let receipts: Vec<&str> = receipts.iter().map(String::as_str).collect();
    let entry = |id: String, receipt: &str| {
        ChangeMessageVisibilityBatchRequestEntry::builder()
            .id(id)
            .receipt_handle(receipt)
            .visibility_timeout(0)
            .build()
            .ok()
    };
    let send = |entries| async move {
        let request = target.sqs.change_message_visibility_batch().queue_url(&target.dlq);
        request.set_entries(Some(entries)).send().await.ok().map(|out| out.failed().len())
    };
    ten_at_a_time(&receipts, entry, send).await
}

/// Deletes from the DLQ; returns how many could not be deleted.
pub(super) async fn delete(target: &Target, receipts: &[&str]) -> u64 {
    let entry = |id: String, receipt: &str| {
        DeleteMessageBatchRequestEntry::builder().id(id).receipt_handle(receipt).build().ok()
    };
    let send = |entries| async move {
        let request = target.sqs.delete_message_batch().queue_url(&target.dlq);
        request.set_entries(Some(entries)).send().await.ok().map(|out| out.failed().len())
    };
    ten_at_a_time(receipts, entry, send).await as u64
}

/// One batch request per ten receipts (SQS's limit), each entry built by `entry` from
/// its id in the request and its receipt; `send` answers how many of a request's entries
/// failed, `None` when the whole request did. Returns how many receipts were not acted on.
async fn ten_at_a_time<E, Fut>(
    receipts: &[&str],
    entry: impl Fn(String, &str) -> Option<E>,
    send: impl Fn(Vec<E>) -> Fut,
) -> usize
where
    Fut: std::future::Future<Output = Option<usize>>,
{
    let mut failed = 0;
    for chunk in receipts.chunks(10) {
        let entries: Vec<E> = chunk.iter().enumerate().filter_map(|(i, r)| entry(i.to_string(), r)).collect();
        let built = entries.len();
        failed += chunk.len() - built;
        failed += send(entries).await.unwrap_or(built);
    }
    failed
}
