//! The AWS resources of one `sasctl dev --endpoint-url` run: which of a layout's
//! resources exist, and removing the ones the run made.
//!
//! What a run made is told by looking, not assumed: the layout's resources that exist
//! after provisioning and did not exist before it. So a resource that was there already
//! (another run's, or one of the same name made by hand) is never removed, and a
//! provisioning that failed half way still has its half removed.

use aws_sdk_sqs::error::ProvideErrorMetadata;
use sas::adapters::aws::Clients;
use sas::adapters::aws::provision::Layout;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Table,
    Queue,
    Topic,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::Queue => "queue",
            Kind::Topic => "topic",
        }
    }
}

/// One resource: its kind, its name, and the address its API calls take (the table's
/// name, the queue's URL, the topic's ARN).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Resource {
    pub kind: Kind,
    pub name: String,
    #[serde(skip)]
    pub address: String,
}

/// Every resource name of `layout`: the state table, each queue and dead-letter queue,
/// the alerts topic.
pub fn names(layout: &Layout) -> Vec<(Kind, String)> {
    let mut out = vec![(Kind::Table, layout.tables.state.clone())];
    for q in [&layout.orders, &layout.scheduler, &layout.agent, &layout.callbacks, &layout.status] {
        out.push((Kind::Queue, q.name.clone()));
        if q.max_receives.is_some() {
            out.push((Kind::Queue, format!("{}-dlq", q.name)));
        }
    }
    out.push((Kind::Topic, layout.alert_topic.clone()));
    out
}

/// An SDK error in one line: its message, or its code, or the innermost cause (never
/// the SDK's debug dump of the request).
pub fn sdk_reason<E>(err: &aws_sdk_sqs::error::SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if let Some(service) = err.as_service_error() {
        let code = service.code().unwrap_or("error");
        return match service.message() {
            Some(m) => format!("{code}: {m}"),
            None => code.to_owned(),
        };
    }
    innermost(err)
}

/// The last error in `err`'s source chain, as it displays.
pub fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &dyn std::error::Error = err;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// The resources of `layout` that exist at the endpoint now.
pub async fn existing(clients: &Clients, layout: &Layout) -> Result<Vec<Resource>, String> {
    let mut found = Vec::new();
    for (kind, name) in names(layout) {
        let address = match kind {
            Kind::Table => match clients.dynamodb.describe_table().table_name(&name).send().await {
                Ok(_) => Some(name.clone()),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => None,
                Err(e) => return Err(format!("looking for table {name}: {}", sdk_reason(&e))),
            },
            Kind::Queue => match clients.sqs.get_queue_url().queue_name(&name).send().await {
                Ok(out) => out.queue_url,
                Err(e) if e.as_service_error().is_some_and(queue_missing) => None,
                Err(e) => return Err(format!("looking for queue {name}: {}", sdk_reason(&e))),
            },
            Kind::Topic => topic_arn(clients, &name).await?,
        };
        if let Some(address) = address {
            found.push(Resource { kind, name, address });
        }
    }
    Ok(found)
}

/// SQS's "no such queue", under either of the codes emulators and AWS answer with.
fn queue_missing(e: &(impl ProvideErrorMetadata + std::fmt::Debug)) -> bool {
    e.code().is_some_and(|c| c.contains("NonExistentQueue") || c.contains("QueueDoesNotExist"))
}

/// The topic named `name`, if there is one (SNS has no lookup by name: its list is read).
async fn topic_arn(clients: &Clients, name: &str) -> Result<Option<String>, String> {
    let suffix = format!(":{name}");
    let mut next: Option<String> = None;
    loop {
        let page = clients
            .sns
            .list_topics()
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| format!("looking for topic {name}: {}", sdk_reason(&e)))?;
        if let Some(arn) = page.topics().iter().filter_map(|t| t.topic_arn()).find(|a| a.ends_with(&suffix)) {
            return Ok(Some(arn.to_owned()));
        }
        match page.next_token {
            Some(token) if !token.is_empty() => next = Some(token),
            _ => return Ok(None),
        }
    }
}

/// Those of `now` that are not in `before`.
pub fn made(before: &[Resource], now: Vec<Resource>) -> Vec<Resource> {
    now.into_iter().filter(|r| !before.iter().any(|b| b.kind == r.kind && b.name == r.name)).collect()
}

/// Removes each resource; one already gone counts as removed. Returns the ones that
/// could not be removed, each with why.
pub async fn remove(clients: &Clients, resources: &[Resource]) -> Vec<(Resource, String)> {
    let mut failed = Vec::new();
    for r in resources {
        let result = match r.kind {
            Kind::Table => match clients.dynamodb.delete_table().table_name(&r.address).send().await {
                Ok(_) => Ok(()),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => Ok(()),
                Err(e) => Err(sdk_reason(&e)),
            },
            Kind::Queue => match clients.sqs.delete_queue().queue_url(&r.address).send().await {
                Ok(_) => Ok(()),
                Err(e) if e.as_service_error().is_some_and(queue_missing) => Ok(()),
                Err(e) => Err(sdk_reason(&e)),
            },
            Kind::Topic => match clients.sns.delete_topic().topic_arn(&r.address).send().await {
                Ok(_) => Ok(()),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found_exception()) => Ok(()),
                Err(e) => Err(sdk_reason(&e)),
            },
        };
        if let Err(why) = result {
            failed.push((r.clone(), why));
        }
    }
    failed
}
