//! `sasctl dev --endpoint-url URL`: the `dev` run with the real adapters (DynamoDB,
//! SQS, SNS through the AWS SDK) against an AWS endpoint such as moto or LocalStack.
//! The handlers, the pumps, the simulated remote service and the invariant checker
//! are the embedded run's; only the backend differs.
//!
//! Each run creates its own state table, queues and topic under a fresh `dev-xxxxxxxx`
//! prefix, so runs never see each other's messages. Meant for emulators: pointed at
//! real AWS it would create (and leave) real resources.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_config::SdkConfig;
use sas::adapters::aws::provision::{self, Layout, Provisioned};
use sas::adapters::aws::{Clients, DynamoStore, SnsAlerts, SqsQueues};
use sas::adapters::embedded::{RecordingAlerts, StoredMessage, WriteRecord};
use sas::adapters::system::SystemClock;
use sas::domain::messages::MAX_BODY_BYTES;
use sas::domain::{OperatorAlert, OrderId, ProcessState, TaskRecord, Timestamp};
use sas::ports::{
    AlertError, Alerts, Delivery, Inserted, Outgoing, QueueConsumer, QueueError, QueueUrl, Queues,
    StateStore, StoreError, Written,
};

use crate::dev::{
    self, AGENT, AGENT_DLQ, Backend, DevError, DevOptions, DevOutcome, ORDERS, ORDERS_DLQ, Progress,
    SCHEDULER, SCHEDULER_DLQ, STATUS,
};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Provision(#[from] provision::ProvisionError),
    #[error(transparent)]
    Run(#[from] DevError),
}

/// SDK configuration for `endpoint`. Region and credentials come from the usual
/// environment; an emulator accepts any, so where none are set, fixed dummy ones are
/// used rather than failing on the first request.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    let mut loader = sas::adapters::aws::config_loader().endpoint_url(endpoint);
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        loader = loader.region(aws_config::Region::new("us-east-1"));
    }
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() && std::env::var_os("AWS_PROFILE").is_none() {
        loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "sasctl-dev",
        ));
    }
    loader.load().await
}

/// Queues addressed by the dev run's short names (`orders`, `status`, ...), sent to
/// the real queues' URLs. Handlers, pumps and `reply_to` keep using names, exactly as
/// in the embedded run.
pub struct NamedQueues {
    sqs: SqsQueues,
    urls: HashMap<String, QueueUrl>,
}

impl NamedQueues {
    pub fn new(sqs: SqsQueues, provisioned: &Provisioned) -> NamedQueues {
        let urls = [
            (ORDERS, &provisioned.orders_queue),
            (ORDERS_DLQ, &provisioned.orders_dlq),
            (SCHEDULER, &provisioned.scheduler_queue),
            (SCHEDULER_DLQ, &provisioned.scheduler_dlq),
            (AGENT, &provisioned.agent_queue),
            (AGENT_DLQ, &provisioned.agent_dlq),
            (STATUS, &provisioned.status_queue),
        ]
        .into_iter()
        .map(|(name, url)| (name.to_owned(), QueueUrl(url.clone())))
        .collect();
        NamedQueues { sqs, urls }
    }

    /// The URL behind a name; anything else (a full URL) passes through.
    pub fn url(&self, queue: &QueueUrl) -> QueueUrl {
        self.urls.get(&queue.0).cloned().unwrap_or_else(|| queue.clone())
    }

    /// Messages visible, delayed or in flight, as SQS approximates them (exact on moto).
    pub async fn depth(&self, name: &str) -> Result<usize, QueueError> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let url = self.url(&QueueUrl(name.to_owned()));
        let out = self
            .sqs
            .client()
            .get_queue_attributes()
            .queue_url(&url.0)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(A::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable {
                queue: url.0.clone(),
                reason: aws_sdk_sqs::error::DisplayErrorContext(e).to_string(),
            })?;
        Ok(out.attributes().into_iter().flatten().filter_map(|(_, v)| v.parse::<usize>().ok()).sum())
    }

    /// Every message in a queue, removed: for reading status and dead-letter queues
    /// once the run is over. Stops after two empty receives in a row.
    pub async fn drain(&self, name: &str) -> Result<Vec<StoredMessage>, QueueError> {
        let queue = QueueUrl(name.to_owned());
        let mut out = Vec::new();
        let mut empty = 0;
        while empty < 2 {
            let batch = self.receive(&queue, 10, 0).await?;
            if batch.is_empty() {
                empty += 1;
                continue;
            }
            empty = 0;
            for d in batch {
                self.delete(&queue, &d.receipt).await?;
                out.push(StoredMessage {
                    message_id: d.message_id,
                    body: d.body,
                    attributes: d.attributes,
                    receive_count: d.receive_count,
                    sent_at: Timestamp::default(),
                });
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Queues for NamedQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        self.sqs.send_batch(&self.url(queue), messages).await
    }
    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Vec<Result<(), QueueError>> {
        self.sqs.send_each(&self.url(queue), messages).await
    }
}

#[async_trait]
impl QueueConsumer for NamedQueues {
    async fn receive(&self, queue: &QueueUrl, max: usize, wait_ms: u64) -> Result<Vec<Delivery>, QueueError> {
        self.sqs.receive(&self.url(queue), max, wait_ms).await
    }
    async fn delete(&self, queue: &QueueUrl, receipt: &str) -> Result<(), QueueError> {
        self.sqs.delete(&self.url(queue), receipt).await
    }
}

/// A state store that keeps a log of its landed task writes, for the invariant
/// checker. Exact as long as every writer goes through it (all four handlers run in
/// this process): then the record a conditional write replaced is the last one
/// written for that order.
pub struct RecordingStore<S> {
    inner: S,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    writes: Vec<WriteRecord>,
    latest: HashMap<OrderId, TaskRecord>,
}

impl<S> RecordingStore<S> {
    pub fn new(inner: S) -> RecordingStore<S> {
        RecordingStore { inner, log: Mutex::default() }
    }
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn landed(&self, after: &TaskRecord) {
        let mut log = self.log();
        let before = log.latest.insert(after.order_id.clone(), after.clone());
        log.writes.push(WriteRecord { before, after: after.clone() });
    }
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.log().writes.clone()
    }
    pub fn state_counts(&self) -> BTreeMap<ProcessState, usize> {
        let mut counts = BTreeMap::new();
        for t in self.log().latest.values() {
            *counts.entry(t.state).or_default() += 1;
        }
        counts
    }
    pub fn ids(&self) -> Vec<OrderId> {
        let mut ids: Vec<_> = self.log().latest.keys().cloned().collect();
        ids.sort();
        ids
    }
}

#[async_trait]
impl<S: StateStore> StateStore for RecordingStore<S> {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let inserted = self.inner.insert(task).await?;
        if inserted == Inserted::New {
            self.landed(task);
        }
        Ok(inserted)
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        self.inner.task(id).await
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        let written = self.inner.replace(next, expected_revision).await?;
        if written == Written::Applied {
            self.landed(next);
        }
        Ok(written)
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        self.inner.due(now, limit).await
    }
}

/// Alerts published to the SNS topic and kept for the checker.
struct TeeAlerts {
    sns: SnsAlerts,
    kept: Arc<RecordingAlerts>,
}

#[async_trait]
impl Alerts for TeeAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.sns.raise(alert).await?;
        self.kept.raise(alert).await
    }
}

/// The resources of one run: the standard layout under `prefix`, with visibility
/// timeouts scaled to the run's step timeout (SQS counts them in whole seconds).
pub fn layout(prefix: &str, options: &DevOptions) -> Layout {
    let mut layout = Layout::standard(prefix);
    layout.orders.visibility_timeout_s = 5;
    layout.scheduler.visibility_timeout_s = 5;
    layout.agent.visibility_timeout_s = (options.step_timeout_ms * 6).div_ceil(1_000).max(1) as u32;
    layout
}

/// The real adapters behind the dev run's queue names, with the logs the checker reads.
struct Aws {
    store: Arc<RecordingStore<DynamoStore>>,
    queues: Arc<NamedQueues>,
    alerts: Arc<TeeAlerts>,
}

#[async_trait]
impl Backend for Aws {
    fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }
    fn queues(&self) -> Arc<dyn Queues> {
        self.queues.clone()
    }
    fn consumer(&self) -> Arc<dyn QueueConsumer> {
        self.queues.clone()
    }
    fn alerts(&self) -> Arc<dyn Alerts> {
        self.alerts.clone()
    }
    fn state_counts(&self) -> BTreeMap<ProcessState, usize> {
        self.store.state_counts()
    }
    fn writes(&self) -> Vec<WriteRecord> {
        self.store.writes()
    }
    fn raised_alerts(&self) -> Vec<OperatorAlert> {
        self.alerts.kept.all()
    }
    async fn depth(&self, queue: &str) -> Result<usize, DevError> {
        Ok(self.queues.depth(queue).await?)
    }
    async fn drain(&self, queue: &str) -> Result<Vec<StoredMessage>, DevError> {
        Ok(self.queues.drain(queue).await?)
    }
    /// The final records as DynamoDB holds them (not as the log remembers them).
    async fn final_tasks(&self) -> Result<Vec<TaskRecord>, DevError> {
        let mut tasks = Vec::new();
        for id in self.store.ids() {
            tasks.extend(self.store.task(&id).await?);
        }
        Ok(tasks)
    }
    /// SQS refuses a body over its size limit (the reason attribute counts too), so such
    /// a message cannot reach the submission function through the queue.
    fn can_carry(&self, body: &str) -> bool {
        body.len() <= MAX_BODY_BYTES - 2_048
    }
}

/// Runs the pipeline against `endpoint` until every accepted order is terminal (or
/// `max_runtime` passes). `queue_duplicate_rate` does not apply: SQS's own
/// at-least-once delivery is what there is.
pub async fn run(
    options: DevOptions,
    endpoint: &str,
    on_progress: impl Fn(&Progress),
) -> Result<DevOutcome, EndpointError> {
    let sdk = sdk_config(endpoint).await;
    let clients = Clients::new(&sdk);
    let prefix = format!("dev-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resources = provision::provision(&sdk, &layout(&prefix, &options)).await?;
    tracing::info!(endpoint, prefix, "resources created");
    let backend = Aws {
        store: Arc::new(RecordingStore::new(DynamoStore::new(
            clients.dynamodb.clone(),
            resources.tables.clone(),
        ))),
        queues: Arc::new(NamedQueues::new(SqsQueues::new(clients.sqs.clone()), &resources)),
        alerts: Arc::new(TeeAlerts {
            sns: SnsAlerts::new(clients.sns.clone(), resources.alert_topic_arn.clone()),
            kept: Arc::new(RecordingAlerts::default()),
        }),
    };
    Ok(dev::run_on(&backend, Arc::new(SystemClock), options, 200, on_progress).await?)
}
