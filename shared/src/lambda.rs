//! What every function binary shares: JSON logs, the one-time AWS setup, and the
//! translation between Lambda's events and the handlers' types. It keeps each
//! `functions/*/src/main.rs` down to wiring.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::{LambdaEvent, service_fn};

use crate::adapters::aws::{AwsSecrets, DynamoStore, SnsAlerts, SqsQueues};
use crate::adapters::emf::EmfMetrics;
use crate::adapters::system::{SystemClock, SystemRandom};
use crate::config::{AlertConfig, ConfigError, Deployment, FunctionName, StateConfig, TableNames};
use crate::domain::{OperatorAlert, QueueId, Timestamp};
use crate::handlers::{
    BatchOrder, BatchReport, DeadLetters, Deps, HandlerError, Inbound, SendCoalescer, Supervisor, run_batch,
    run_batch_in,
};
use crate::ports::{AlertError, Alerts, CallStarts, Metrics, QueueUrl, Queues};

pub use lambda_runtime::Error;

/// The attribute Lambda's SQS event carries the delivery count in.
pub const RECEIVE_COUNT_ATTRIBUTE: &str = "ApproximateReceiveCount";
/// The attribute Lambda's SQS event carries the sender's identity in (set by SQS).
pub const SENDER_ID_ATTRIBUTE: &str = "SenderId";

/// JSON logs on stdout. Each line carries the fields of the span it was logged in
/// (the handlers open one per message with order id, step and attempt) and the
/// runtime's per-invocation span (request id). The level comes from Lambda's
/// `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`, else info.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = ["AWS_LAMBDA_LOG_LEVEL", "RUST_LOG"]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        // Lambda's levels are TRACE..FATAL; tracing has no FATAL, ERROR is the nearest.
        .map(|v| if v.eq_ignore_ascii_case("fatal") { "error".to_owned() } else { v.to_lowercase() })
        .find_map(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    // An error means a subscriber is already set (tests): keep that one.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .with_span_list(true)
        .with_target(false)
        .try_init();
}

/// A bad configuration ends the cold start here, logged, so the function's first
/// invocation fails with the list of what to fix.
pub fn require<T>(config: Result<T, ConfigError>) -> Result<T, Error> {
    config.map_err(|e| {
        tracing::error!(error = %e, "cannot start");
        e.into()
    })
}

/// One message of Lambda's SQS event as the handlers see it.
pub fn inbound(message: SqsMessage) -> Inbound {
    let receive_count =
        message.attributes.get(RECEIVE_COUNT_ATTRIBUTE).and_then(|c| c.parse().ok()).unwrap_or(1);
    let sender = message.attributes.get(SENDER_ID_ATTRIBUTE).cloned();
    Inbound {
        // Lambda always sends both; a message without a body is handled (and
        // rejected with a reason) like any other bad body.
        message_id: message.message_id.unwrap_or_default(),
        body: message.body.unwrap_or_default(),
        receive_count,
        sender,
    }
}

pub fn inbound_batch(event: SqsEvent) -> Vec<Inbound> {
    event.records.into_iter().map(inbound).collect()
}

/// Only the messages to redeliver; the function must have `ReportBatchItemFailures`
/// on its event source mapping, or Lambda ignores this and redelivers the whole batch.
pub fn batch_response(report: &BatchReport) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    response.set_failures(report.failures.iter().cloned());
    response
}

/// Runs an SQS-triggered function: each event through the batch driver, so bad
/// messages are kept in `dead_letters` with their reason and only retryable failures
/// go back to the queue.
pub async fn serve_sqs<F, Fut>(dead_letters: DeadLetters, handle: F) -> Result<(), Error>
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    serve_sqs_until(dead_letters, move |message, _deadline| handle(message)).await
}

/// [`serve_sqs`] for a handler that needs the invocation's deadline (the agent, which
/// must stop before Lambda ends the invocation).
pub async fn serve_sqs_until<F, Fut>(dead_letters: DeadLetters, handle: F) -> Result<(), Error>
where
    F: Fn(Inbound, Timestamp) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let (dead_letters, handle) = (&dead_letters, &handle);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let deadline = Timestamp(event.context.deadline);
        let report = run_batch(inbound_batch(event.payload), dead_letters, |m| handle(m, deadline)).await;
        Ok::<_, Error>(batch_response(&report))
    }))
    .await
}

/// One SQS event source of a function: the queue it polls (`dead_letters.source`), where
/// that queue's bad messages are kept (`dead_letters.dead_letter_queue`), and its handler.
pub struct SqsSource<F> {
    pub dead_letters: DeadLetters,
    pub handle: F,
    /// How a batch's messages run: the scheduler's queue by order.
    pub order: BatchOrder,
}

/// Whether `record` came from `queue`: its `eventSourceARN` names the queue's account and
/// name. A queue's URL and its ARN name it the same way whatever the endpoint, and an
/// event source mapping polls a queue of its function's own region, so the region is not
/// compared. A record without an ARN (one invoked by hand) comes from no named queue.
pub fn is_from(record: &SqsMessage, queue: &QueueUrl) -> bool {
    let Some(arn) = record.event_source_arn.as_deref().and_then(QueueId::from_arn) else { return false };
    QueueId::account_and_name(&queue.0)
        .is_some_and(|(account, name)| arn.account == account && arn.name == name)
}

/// An event's messages by where they came from: those of `queue`, then all the others.
pub fn split_by_source(event: SqsEvent, queue: &QueueUrl) -> (Vec<Inbound>, Vec<Inbound>) {
    let (from, others): (Vec<SqsMessage>, Vec<SqsMessage>) =
        event.records.into_iter().partition(|record| is_from(record, queue));
    (from.into_iter().map(inbound).collect(), others.into_iter().map(inbound).collect())
}

/// One batch of a function with two event sources: the messages of `second`'s queue go to
/// its handler and dead letters, every other message to `first`'s, the two parts at once.
/// Lambda hands a function one event source's records at a time; a mixed batch (a hand
/// invocation) is split the same way. One report: both parts' failures and kept counts.
pub async fn run_routed<F, Fut, G, Gut>(
    event: SqsEvent,
    first: &SqsSource<F>,
    second: &SqsSource<G>,
) -> BatchReport
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
    G: Fn(Inbound) -> Gut,
    Gut: Future<Output = Result<(), HandlerError>>,
{
    let (theirs, others) = split_by_source(event, &second.dead_letters.source);
    let (a, b) = futures::join!(run_part(others, first), run_part(theirs, second));
    BatchReport { failures: [a.failures, b.failures].concat(), kept: a.kept + b.kept }
}

async fn run_part<F, Fut>(messages: Vec<Inbound>, source: &SqsSource<F>) -> BatchReport
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    if messages.is_empty() {
        return BatchReport::default();
    }
    run_batch_in(source.order, messages, &source.dead_letters, |m| (source.handle)(m)).await
}

/// Runs an SQS-triggered function fed by two event source mappings (the scheduler: its
/// own queue, and the callback queue): each event through [`run_routed`].
pub async fn serve_sqs_routed<F, Fut, G, Gut>(first: SqsSource<F>, second: SqsSource<G>) -> Result<(), Error>
where
    F: Fn(Inbound) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
    G: Fn(Inbound) -> Gut,
    Gut: Future<Output = Result<(), HandlerError>>,
{
    let (first, second) = (&first, &second);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let report = run_routed(event.payload, first, second).await;
        Ok::<_, Error>(batch_response(&report))
    }))
    .await
}

/// Runs the supervisor on its EventBridge schedule. A sweep that cannot read the
/// index fails the invocation, which the function-errors alarm watches.
pub async fn serve_schedule(supervisor: Supervisor) -> Result<(), Error> {
    let supervisor = &supervisor;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<serde_json::Value>>| async move {
            // The run's budget is the invocation's own time: Lambda's deadline, in ms since the epoch.
            let report = supervisor.sweep_until(crate::domain::Timestamp(event.context.deadline)).await?;
            Ok::<_, Error>(serde_json::json!({
                "examined": report.examined,
                "retried": report.retried,
                "woke": report.woke,
                "gave_up": report.gave_up,
                "skipped": report.skipped,
                "errors": report.errors,
                "pages": report.pages,
                "cut_short": report.cut_short,
            }))
        },
    ))
    .await
}

/// The AWS side of a function, set up once per cold start. Each service's client is built
/// by the port that needs it, so a function links only the SDK clients it uses (the agent:
/// SQS alone; that keeps its zip under 4 MB, docs/BENCHMARKS.md "Package sizes").
pub struct Aws {
    pub sdk: aws_config::SdkConfig,
}

impl Aws {
    /// Region, credentials and endpoint (`AWS_ENDPOINT_URL`) from the environment.
    pub async fn load() -> Aws {
        Aws { sdk: crate::adapters::aws::config_loader().load().await }
    }

    pub fn sqs(&self) -> SqsQueues {
        SqsQueues::new(aws_sdk_sqs::Client::new(&self.sdk))
    }

    /// SQS, with each invocation's sends coalesced into one SendMessageBatch request per
    /// queue, none held longer than `send_max_hold` (`handlers::coalesce`).
    pub fn queues(&self, send_max_hold: Duration) -> Arc<dyn Queues> {
        Arc::new(SendCoalescer::new(Arc::new(self.sqs()), send_max_hold))
    }

    /// Parameter Store and Secrets Manager, for agents' auth headers (the agent only). No
    /// client is built until the first read.
    pub fn secrets(&self) -> Arc<AwsSecrets> {
        Arc::new(AwsSecrets::new(&self.sdk))
    }

    /// The agent's call marks in the state table (`AgentConfig::state_table`): `None`
    /// where no agent has limits, and then no client is built.
    pub fn call_starts(&self, state_table: Option<&str>) -> Option<Arc<dyn CallStarts>> {
        state_table.map(|table| {
            let client = aws_sdk_dynamodb::Client::new(&self.sdk);
            Arc::new(DynamoStore::new(client, TableNames::new(table))) as Arc<dyn CallStarts>
        })
    }

    pub fn metrics(function: &str, namespace: &str) -> Arc<EmfMetrics> {
        Arc::new(EmfMetrics::new(namespace, function))
    }

    /// The handlers' ports on AWS. `alert_topic` (with the deployment each alert's
    /// `show` command names) is `None` for a function that never raises alerts
    /// (submission); an alert there would be a bug, so it fails loudly.
    pub fn deps(
        &self,
        tables: &TableNames,
        alert_topic: Option<(&str, &Deployment)>,
        metrics: Arc<dyn Metrics>,
        send_max_hold: Duration,
    ) -> Deps {
        let alerts: Arc<dyn Alerts> = match alert_topic {
            Some((arn, deployment)) => {
                Arc::new(SnsAlerts::new(aws_sdk_sns::Client::new(&self.sdk), arn, deployment.clone()))
            }
            None => Arc::new(NoAlertTopic),
        };
        Deps {
            store: Arc::new(DynamoStore::new(aws_sdk_dynamodb::Client::new(&self.sdk), tables.clone())),
            queues: self.queues(send_max_hold),
            alerts,
            clock: Arc::new(SystemClock),
            random: Arc::new(SystemRandom::new()),
            metrics,
        }
    }

    /// [`deps`](Self::deps) for a function that writes the state table (submission,
    /// scheduler, supervisor), from its configuration; `alerts` is `None` for submission.
    pub fn state_deps(
        &self,
        function: FunctionName,
        state: &StateConfig,
        alerts: Option<&AlertConfig>,
    ) -> Deps {
        let metrics = Aws::metrics(function.as_str(), &state.metrics_namespace);
        let alert_topic = alerts.map(|a| (a.topic_arn.as_str(), &a.deployment));
        self.deps(&state.tables, alert_topic, metrics, Duration::from_millis(state.send_max_hold_ms))
    }

    pub fn dead_letters(deps: &Deps, source: &QueueUrl, dead_letter_queue: &QueueUrl) -> DeadLetters {
        DeadLetters {
            queues: deps.queues.clone(),
            source: source.clone(),
            dead_letter_queue: dead_letter_queue.clone(),
            metrics: deps.metrics.clone(),
        }
    }
}

/// The alert port of a function configured without a topic.
struct NoAlertTopic;

#[async_trait]
impl Alerts for NoAlertTopic {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        Err(AlertError(format!("no ALERT_TOPIC_ARN in this function; alert for {} not sent", alert.order_id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqs_events_become_inbound_messages() {
        let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [
            {"messageId": "m1", "body": "{}", "messageAttributes": {}, "attributes": {
                "ApproximateReceiveCount": "3", "SenderId": "AROAEXAMPLEROLE:app-session-1"}},
            {"messageId": "m2", "attributes": {}, "messageAttributes": {}},
        ]}))
        .unwrap();
        let got = inbound_batch(event);
        let sender = Some("AROAEXAMPLEROLE:app-session-1".to_owned());
        assert_eq!(got[0], Inbound { message_id: "m1".into(), body: "{}".into(), receive_count: 3, sender });
        let none = Inbound { message_id: "m2".into(), body: String::new(), receive_count: 1, sender: None };
        assert_eq!(got[1], none);
    }

    const SCHEDULER: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-scheduler";
    const CALLBACKS: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-callbacks";

    fn record(id: &str, arn: Option<&str>) -> serde_json::Value {
        serde_json::json!({"messageId": id, "body": id, "attributes": {}, "messageAttributes": {},
                           "eventSource": "aws:sqs", "eventSourceARN": arn})
    }

    #[test]
    fn records_are_told_apart_by_the_queue_they_came_from() {
        let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [
            record("s1", Some("arn:aws:sqs:us-east-1:123456789012:sas-scheduler")),
            record("c1", Some("arn:aws:sqs:us-east-1:123456789012:sas-callbacks")),
            record("x1", None),
            // Same name, another account: not the callback queue.
            record("o1", Some("arn:aws:sqs:us-east-1:210987654321:sas-callbacks")),
            // Another region in the ARN: the region is not compared.
            record("c2", Some("arn:aws:sqs:eu-west-1:123456789012:sas-callbacks")),
        ]}))
        .unwrap();
        let ids = |v: Vec<Inbound>| v.into_iter().map(|m| m.message_id).collect::<Vec<_>>();
        let (callbacks, others) = split_by_source(event.clone(), &QueueUrl(CALLBACKS.into()));
        assert_eq!(
            (ids(callbacks), ids(others)),
            (vec!["c1".into(), "c2".into()], vec!["s1".into(), "x1".into(), "o1".into()])
        );
        let local = QueueUrl("http://127.0.0.1:5000/123456789012/sas-callbacks".into());
        assert_eq!(split_by_source(event, &local).0.len(), 2);
    }

    /// A mixed batch: each part runs under its own handler and DLQ, and the report holds
    /// both parts' failures and kept messages.
    #[tokio::test]
    async fn a_mixed_batch_runs_each_part_under_its_own_handler_and_dlq() {
        use crate::adapters::embedded::{CountingMetrics, EmbeddedQueues, ManualClock, QueueSettings};
        use crate::handlers::batch::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};
        use std::sync::Mutex;

        let queues = Arc::new(EmbeddedQueues::new(Arc::new(ManualClock::at(1_000)), 1));
        let (scheduler_dlq, callbacks_dlq) = (format!("{SCHEDULER}-dlq"), format!("{CALLBACKS}-dlq"));
        for q in [&scheduler_dlq, &callbacks_dlq] {
            queues.create(q, QueueSettings::default());
        }
        let metrics = Arc::new(CountingMetrics::default());
        let dead_letters = |source: &str, dlq: &str| DeadLetters {
            queues: queues.clone(),
            source: QueueUrl(source.into()),
            dead_letter_queue: QueueUrl(dlq.into()),
            metrics: metrics.clone(),
        };
        let seen: Arc<Mutex<Vec<(&str, String)>>> = Arc::default();
        let handler = |name: &'static str| {
            let seen = seen.clone();
            move |m: Inbound| {
                seen.lock().unwrap().push((name, m.message_id.clone()));
                async move {
                    match m.message_id.as_str() {
                        "s2" | "c3" => Err(HandlerError::Retry("try again".into())),
                        "s3" | "c2" => Err(HandlerError::Reject(format!("bad {}", m.message_id))),
                        _ => Ok(()),
                    }
                }
            }
        };
        let scheduler = SqsSource {
            dead_letters: dead_letters(SCHEDULER, &scheduler_dlq),
            handle: handler("scheduler"),
            order: BatchOrder::ByOrder,
        };
        let callbacks = SqsSource {
            dead_letters: dead_letters(CALLBACKS, &callbacks_dlq),
            handle: handler("callbacks"),
            order: BatchOrder::Concurrent,
        };
        let scheduler_arn = Some("arn:aws:sqs:us-east-1:123456789012:sas-scheduler");
        let callbacks_arn = Some("arn:aws:sqs:us-east-1:123456789012:sas-callbacks");
        let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [
            record("s1", scheduler_arn), record("c1", callbacks_arn), record("s2", scheduler_arn),
            record("c2", callbacks_arn), record("s3", scheduler_arn), record("c3", callbacks_arn),
        ]}))
        .unwrap();

        let mut report = run_routed(event, &scheduler, &callbacks).await;
        report.failures.sort();
        assert_eq!(report, BatchReport { failures: vec!["c3".into(), "s2".into()], kept: 2 });
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let want: Vec<(&str, String)> = [
            ("callbacks", "c1"),
            ("callbacks", "c2"),
            ("callbacks", "c3"),
            ("scheduler", "s1"),
            ("scheduler", "s2"),
            ("scheduler", "s3"),
        ]
        .into_iter()
        .map(|(h, m)| (h, m.to_owned()))
        .collect();
        assert_eq!(seen, want);
        for (dlq, source, body) in [(&callbacks_dlq, CALLBACKS, "c2"), (&scheduler_dlq, SCHEDULER, "s3")] {
            let kept = queues.drain(dlq);
            assert_eq!(kept.len(), 1, "{dlq}");
            assert_eq!(kept[0].body, body);
            assert_eq!(
                kept[0].attributes.get(REASON_ATTRIBUTE).map(String::as_str),
                Some(format!("bad {body}").as_str())
            );
            assert_eq!(kept[0].attributes.get(SOURCE_ATTRIBUTE).map(String::as_str), Some(source));
        }
        // Only one source in the event: the other part is not run at all.
        let only: SqsEvent =
            serde_json::from_value(serde_json::json!({"Records": [record("c1", callbacks_arn)]})).unwrap();
        assert_eq!(run_routed(only, &scheduler, &callbacks).await, BatchReport::default());
    }

    #[test]
    fn only_retryable_failures_are_reported() {
        let report = BatchReport { failures: vec!["m2".into(), "m5".into()], kept: 3 };
        let json = serde_json::to_value(batch_response(&report)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": "m2"}, {"itemIdentifier": "m5"}]})
        );
    }
}
