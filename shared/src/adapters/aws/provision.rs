//! Creates the resources the functions expect, against any endpoint (moto, LocalStack,
//! AWS): the one definition behind `infra/bootstrap.sh` and the tests' per-test
//! resources. Names and settings match `template.yaml`; change both together.
//!
//! Every step is idempotent, so a bootstrap can be re-run over a partial one.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_sqs::types::QueueAttributeName;

use super::dynamodb::{
    DEADLINE, DUE_SHARD, ERROR_SHARD, EXPIRES_AT, FINISHED_SHARD, KEY, TableNames, UPDATED_AT,
};

#[derive(Debug, thiserror::Error)]
#[error("provisioning {resource}: {reason}")]
pub struct ProvisionError {
    pub resource: String,
    pub reason: String,
}

fn failed(resource: &str, reason: impl std::fmt::Display) -> ProvisionError {
    ProvisionError { resource: resource.to_owned(), reason: reason.to_string() }
}

/// An SDK error with its whole source chain: the top level alone says "service error".
fn sdk_failed(resource: &str, err: impl std::error::Error) -> ProvisionError {
    failed(resource, DisplayErrorContext(err))
}

/// One work queue and, when `max_receives` is set, its dead-letter queue `{name}-dlq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    pub visibility_timeout_s: u32,
    /// Receives before SQS moves a message to the dead-letter queue.
    pub max_receives: Option<u32>,
}

/// Kept messages wait here for an operator: SQS's longest retention.
pub const DLQ_RETENTION_S: u32 = 14 * 24 * 3600;
pub const MAX_RECEIVES: u32 = 5;
/// Work and status queues keep a message four days, as SQS does by default.
pub const QUEUE_RETENTION_S: u32 = 4 * 24 * 3600;

/// Everything one deployment uses, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub tables: TableNames,
    pub orders: QueueSpec,
    pub scheduler: QueueSpec,
    pub agent: QueueSpec,
    /// The outside's completions of callback steps, which the scheduler consumes.
    pub callbacks: QueueSpec,
    /// Where example clients ask for status (`reply_to`); no function reads it.
    pub status: QueueSpec,
    pub alert_topic: String,
}

impl Layout {
    /// The standard names: `{prefix}-state` (table), `{prefix}-orders` (queue), ...
    /// Visibility timeouts are six times the functions' timeouts in template.yaml plus
    /// each queue's default batching window (5 s on orders, 0 on the others), as the
    /// template's `VisibilityTimeout` mapping has them (AWS's advice for SQS event
    /// sources): a message comes back only once the invocation handling it has certainly
    /// stopped.
    pub fn standard(prefix: &str) -> Layout {
        let queue = |name: &str, visibility_timeout_s, dlq: bool| QueueSpec {
            name: format!("{prefix}-{name}"),
            visibility_timeout_s,
            max_receives: dlq.then_some(MAX_RECEIVES),
        };
        Layout {
            // Local runs list their finished orders: the index write costs nothing here.
            tables: TableNames::new(format!("{prefix}-state")).with_list_finished(true),
            orders: queue("orders", 65, true),
            scheduler: queue("scheduler", 90, true),
            agent: queue("agent", 360, true),
            // Consumed by the scheduler (15 s) through an event source without a window.
            callbacks: queue("callbacks", 90, true),
            status: queue("status", 30, false),
            alert_topic: format!("{prefix}-alerts"),
        }
    }

    /// Sets every work queue's visibility timeout: short ones make redelivery quick
    /// in local runs and tests.
    pub fn with_visibility_timeout(mut self, seconds: u32) -> Layout {
        for q in
            [&mut self.orders, &mut self.scheduler, &mut self.agent, &mut self.callbacks, &mut self.status]
        {
            q.visibility_timeout_s = seconds;
        }
        self
    }
}

/// What a bootstrap made: the addresses the functions' configuration names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    pub tables: TableNames,
    pub orders_queue: String,
    pub orders_dlq: String,
    pub scheduler_queue: String,
    pub scheduler_dlq: String,
    pub agent_queue: String,
    pub agent_dlq: String,
    pub callback_queue: String,
    pub callback_dlq: String,
    pub status_queue: String,
    /// The status queue's ARN as the endpoint gives it (GetQueueAttributes): the
    /// `reply_to` allow-list names queues by ARN.
    pub status_queue_arn: String,
    pub alert_topic_arn: String,
}

impl Provisioned {
    /// The functions' environment variables (`config/variables.rs` lists them) for these
    /// resources, plus `STATUS_QUEUE_URL` for clients: every variable a function requires
    /// except `REMOTE_SERVICE_URL` (the agent's), which no resource here names.
    pub fn env(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("STATE_TABLE", self.tables.state.clone()),
            ("DUE_INDEX", self.tables.due_index.clone()),
            ("DUE_SHARDS", self.tables.due_shards.to_string()),
            ("RETENTION_DAYS", self.tables.retention_days.to_string()),
            ("LIST_FINISHED", self.tables.list_finished.to_string()),
            ("ORDERS_QUEUE_URL", self.orders_queue.clone()),
            ("ORDERS_DLQ_URL", self.orders_dlq.clone()),
            ("SCHEDULER_QUEUE_URL", self.scheduler_queue.clone()),
            ("SCHEDULER_DLQ_URL", self.scheduler_dlq.clone()),
            ("AGENT_QUEUE_URL", self.agent_queue.clone()),
            ("AGENT_DLQ_URL", self.agent_dlq.clone()),
            ("CALLBACK_QUEUE_URL", self.callback_queue.clone()),
            ("CALLBACK_DLQ_URL", self.callback_dlq.clone()),
            ("ALERT_TOPIC_ARN", self.alert_topic_arn.clone()),
            ("STATUS_QUEUE_ARN", self.status_queue_arn.clone()),
            ("STATUS_QUEUE_URL", self.status_queue.clone()),
        ])
    }
}

/// Creates (or finds) everything in `layout`.
pub async fn provision(sdk: &SdkConfig, layout: &Layout) -> Result<Provisioned, ProvisionError> {
    provision_with(&super::Clients::new(sdk), layout).await
}

/// [`provision`] through the caller's clients, which may each have an endpoint of their
/// own (DynamoDB Local for the table beside LocalStack for the queues and topic).
pub async fn provision_with(
    clients: &super::Clients,
    layout: &Layout,
) -> Result<Provisioned, ProvisionError> {
    let (dynamodb, sqs, sns) = (&clients.dynamodb, &clients.sqs, &clients.sns);
    create_tables(dynamodb, &layout.tables).await?;
    let (orders_queue, orders_dlq) = create_queue(sqs, &layout.orders).await?;
    let (scheduler_queue, scheduler_dlq) = create_queue(sqs, &layout.scheduler).await?;
    let (agent_queue, agent_dlq) = create_queue(sqs, &layout.agent).await?;
    let (callback_queue, callback_dlq) = create_queue(sqs, &layout.callbacks).await?;
    let (status_queue, _) = create_queue(sqs, &layout.status).await?;
    let status_queue_arn = queue_arn(sqs, &status_queue, &layout.status.name).await?;
    let alert_topic_arn = create_topic(sns, &layout.alert_topic).await?;
    let missing =
        |dlq: Option<String>, name: &str| dlq.ok_or_else(|| failed(name, "has no dead-letter queue"));
    Ok(Provisioned {
        tables: layout.tables.clone(),
        orders_dlq: missing(orders_dlq, &layout.orders.name)?,
        scheduler_dlq: missing(scheduler_dlq, &layout.scheduler.name)?,
        agent_dlq: missing(agent_dlq, &layout.agent.name)?,
        callback_dlq: missing(callback_dlq, &layout.callbacks.name)?,
        orders_queue,
        scheduler_queue,
        agent_queue,
        callback_queue,
        status_queue,
        status_queue_arn,
        alert_topic_arn,
    })
}

fn key_schema(name: &str, key_type: KeyType) -> Result<KeySchemaElement, ProvisionError> {
    KeySchemaElement::builder().attribute_name(name).key_type(key_type).build().map_err(|e| failed(name, e))
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, ProvisionError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| failed(name, e))
}

/// The state table (key `order_id`) with its two sparse indexes, and TTL on
/// `expires_at`. The due index, on `due_shard` + `deadline`, keys only: the supervisor
/// re-reads each due task anyway, and a write that does not move the deadline then
/// costs the index nothing. The error index, on `error_shard` + `updated_at`, whole
/// items: operators list Error tasks with no further reads, and only items in Error
/// carry its key, so the happy path never writes it. The finished index, when the
/// tables list finished orders, on `finished_shard` + `updated_at`, keys only: each
/// finished order is written into it once, and a listing reads the tasks it shows.
pub async fn create_tables(
    client: &aws_sdk_dynamodb::Client,
    tables: &TableNames,
) -> Result<(), ProvisionError> {
    let index = |name: &str, hash: &str, range: &str, projection: ProjectionType| {
        GlobalSecondaryIndex::builder()
            .index_name(name)
            .key_schema(key_schema(hash, KeyType::Hash)?)
            .key_schema(key_schema(range, KeyType::Range)?)
            .projection(Projection::builder().projection_type(projection).build())
            .build()
            .map_err(|e| failed(name, e))
    };
    let due = index(&tables.due_index, DUE_SHARD, DEADLINE, ProjectionType::KeysOnly)?;
    let errors = index(&tables.error_index, ERROR_SHARD, UPDATED_AT, ProjectionType::All)?;
    let mut indexes = vec![due, errors];
    let finished = match tables.list_finished {
        true => Some(index(&tables.finished_index, FINISHED_SHARD, UPDATED_AT, ProjectionType::KeysOnly)?),
        false => None,
    };
    indexes.extend(finished.clone());
    create_table(client, &tables.state, indexes, tables.list_finished).await?;
    if let Some(finished) = finished {
        add_index(client, &tables.state, finished).await?;
    }
    enable_ttl(client, &tables.state).await
}

async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    name: &str,
    indexes: Vec<GlobalSecondaryIndex>,
    finished: bool,
) -> Result<(), ProvisionError> {
    let mut request = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key_schema(KEY, KeyType::Hash)?)
        .attribute_definitions(attribute(KEY, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(DUE_SHARD, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(DEADLINE, ScalarAttributeType::N)?)
        .attribute_definitions(attribute(ERROR_SHARD, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(UPDATED_AT, ScalarAttributeType::N)?)
        .set_global_secondary_indexes(Some(indexes));
    if finished {
        request = request.attribute_definitions(attribute(FINISHED_SHARD, ScalarAttributeType::S)?);
    }
    match request.send().await {
        Ok(_) => {}
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => return Err(sdk_failed(name, e)),
    }
    active(client, name).await
}

/// Waits until the table is there and active.
async fn active(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<(), ProvisionError> {
    client
        .wait_until_table_exists()
        .table_name(table)
        .wait(Duration::from_secs(120))
        .await
        .map_err(|e| sdk_failed(table, e))?;
    Ok(())
}

/// Adds `index` to a table made without it (by an `up` from before the finished index):
/// DynamoDB creates it from the items that carry its keys, and the table is used once it
/// is active again.
async fn add_index(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    index: GlobalSecondaryIndex,
) -> Result<(), ProvisionError> {
    use aws_sdk_dynamodb::types::{CreateGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate};
    let described =
        client.describe_table().table_name(table).send().await.map_err(|e| sdk_failed(table, e))?;
    let has = described
        .table()
        .map(|t| t.global_secondary_indexes())
        .is_some_and(|gsis| gsis.iter().any(|g| g.index_name() == Some(index.index_name())));
    if has {
        return Ok(());
    }
    let create = CreateGlobalSecondaryIndexAction::builder()
        .index_name(index.index_name())
        .set_key_schema(Some(index.key_schema().to_vec()))
        .set_projection(index.projection().cloned())
        .build()
        .map_err(|e| failed(table, e))?;
    client
        .update_table()
        .table_name(table)
        .attribute_definitions(attribute(FINISHED_SHARD, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(UPDATED_AT, ScalarAttributeType::N)?)
        .global_secondary_index_updates(GlobalSecondaryIndexUpdate::builder().create(create).build())
        .send()
        .await
        .map_err(|e| sdk_failed(table, e))?;
    active(client, table).await
}

/// Turns on TTL on `expires_at`, once: DynamoDB refuses to enable it twice.
async fn enable_ttl(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<(), ProvisionError> {
    let current =
        client.describe_time_to_live().table_name(table).send().await.map_err(|e| sdk_failed(table, e))?;
    let ttl = current.time_to_live_description();
    let status = ttl.and_then(|d| d.time_to_live_status());
    if matches!(status, Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)) {
        return match ttl.and_then(|d| d.attribute_name()) {
            Some(EXPIRES_AT) | None => Ok(()),
            Some(other) => Err(failed(table, format!("TTL is on attribute {other}, not {EXPIRES_AT}"))),
        };
    }
    let spec = TimeToLiveSpecification::builder()
        .attribute_name(EXPIRES_AT)
        .enabled(true)
        .build()
        .map_err(|e| failed(table, e))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(spec)
        .send()
        .await
        .map_err(|e| sdk_failed(table, e))?;
    Ok(())
}

/// Creates the queue (and its dead-letter queue); returns their URLs.
pub async fn create_queue(
    client: &aws_sdk_sqs::Client,
    spec: &QueueSpec,
) -> Result<(String, Option<String>), ProvisionError> {
    let mut request = client
        .create_queue()
        .queue_name(&spec.name)
        .attributes(QueueAttributeName::VisibilityTimeout, spec.visibility_timeout_s.to_string())
        .attributes(QueueAttributeName::MessageRetentionPeriod, QUEUE_RETENTION_S.to_string());
    let mut dlq_url = None;
    if let Some(max_receives) = spec.max_receives {
        let dlq_name = format!("{}-dlq", spec.name);
        let url = client
            .create_queue()
            .queue_name(&dlq_name)
            .attributes(QueueAttributeName::MessageRetentionPeriod, DLQ_RETENTION_S.to_string())
            .send()
            .await
            .map_err(|e| sdk_failed(&dlq_name, e))?
            .queue_url
            .ok_or_else(|| failed(&dlq_name, "no queue URL returned"))?;
        let arn = queue_arn(client, &url, &dlq_name).await?;
        let policy =
            serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": max_receives.to_string() });
        request = request.attributes(QueueAttributeName::RedrivePolicy, policy.to_string());
        dlq_url = Some(url);
    }
    let url = request
        .send()
        .await
        .map_err(|e| sdk_failed(&spec.name, e))?
        .queue_url
        .ok_or_else(|| failed(&spec.name, "no queue URL returned"))?;
    Ok((url, dlq_url))
}

/// The ARN of the queue at `url` (named `name` in errors), as the endpoint reports it.
pub async fn queue_arn(
    client: &aws_sdk_sqs::Client,
    url: &str,
    name: &str,
) -> Result<String, ProvisionError> {
    client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| sdk_failed(name, e))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or_else(|| failed(name, "no queue ARN returned"))
}

pub async fn create_topic(client: &aws_sdk_sns::Client, name: &str) -> Result<String, ProvisionError> {
    client
        .create_topic()
        .name(name)
        .send()
        .await
        .map_err(|e| sdk_failed(name, e))?
        .topic_arn
        .ok_or_else(|| failed(name, "no topic ARN returned"))
}
