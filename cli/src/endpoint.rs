//! `sasctl dev --endpoint-url URL`: the `dev` run with the real adapters (DynamoDB,
//! SQS, SNS through the AWS SDK) against an AWS endpoint such as moto or LocalStack.
//! The handlers, the pumps, the simulated remote service and the invariant checker
//! are the embedded run's; only the backend differs.
//!
//! Each run creates its own state table, queues and topic under a fresh `dev-xxxxxxxx`
//! prefix, so runs never see each other's messages, and removes them at the end
//! (unless kept), only those it made (`resources`). Meant for emulators: pointed at
//! real AWS it would create real resources for the length of the run.

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
    Alerts, CallStarts, Delivery, Outgoing, QueueConsumer, QueueError, QueueUrl, Queues, StateStore,
};

use crate::dev::{
    self, AGENT, AGENT_DLQ, Backend, DevError, DevOptions, DevOutcome, ORDERS, ORDERS_DLQ, Progress,
    SCHEDULER, SCHEDULER_DLQ, STATUS,
};
use crate::tap::{Landed, Tap, TapStore, TeeAlerts};

/// What to do when no endpoint answers.
pub const START_ONE: &str = "start moto (infra/moto.sh start) or LocalStack, or check the URL";

/// Why a run against an endpoint did not give a report. Each displays as one line that
/// names the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("--endpoint-url {url:?} is not an http(s) URL such as http://127.0.0.1:4566")]
    NotAUrl { url: String },
    #[error("cannot reach the AWS endpoint {url} ({cause}): {START_ONE}")]
    Unreachable { url: String, cause: String },
    #[error("{url} did not answer as an AWS endpoint ({cause}): is it moto or LocalStack? {START_ONE}")]
    NotAws { url: String, cause: String },
    #[error("{url} refused SQS ListQueues ({cause}): check the URL, region and credentials")]
    Refused { url: String, cause: String },
    #[error("dev run against {url} failed: {reason}")]
    Failed { url: String, reason: String },
    #[error("dev run against {url} interrupted")]
    Interrupted { url: String },
}

impl EndpointError {
    fn failed(url: &str, err: impl std::fmt::Display) -> EndpointError {
        EndpointError::Failed { url: url.to_owned(), reason: one_line(&err.to_string()) }
    }
}

/// An adapter's error text in one short line: the SDK's context display ends with a
/// debug dump of the error (`(DispatchFailure(DispatchFailure { ... }))`), which says
/// nothing more to a reader of a terminal.
pub fn one_line(text: &str) -> String {
    const DUMPS: [&str; 5] = [
        " (DispatchFailure(",
        " (ServiceError(",
        " (ResponseError(",
        " (TimeoutError(",
        " (ConstructionFailure(",
    ];
    let cut = DUMPS.iter().filter_map(|d| text.find(d)).min().unwrap_or(text.len());
    crate::text::one_line(&text[..cut], 300)
}

/// `url` if it is an http(s) URL with a host: the SDK's own error for anything else
/// is a dump of the request it could not send.
pub fn check_url(url: &str) -> Result<(), EndpointError> {
    let not = || EndpointError::NotAUrl { url: url.to_owned() };
    let uri: axum::http::Uri = url.parse().map_err(|_| not())?;
    let http = matches!(uri.scheme_str(), Some("http" | "https"));
    if !http || uri.host().is_none_or(str::is_empty) {
        return Err(not());
    }
    Ok(())
}

/// One cheap request (SQS ListQueues) with no retries, to tell "nothing listens there"
/// and "something answers, but not as AWS does" from a real failure later.
pub async fn probe(sdk: &SdkConfig, url: &str) -> Result<(), EndpointError> {
    use aws_config::retry::RetryConfig;
    use aws_config::timeout::TimeoutConfig;
    use aws_sdk_sqs::error::SdkError;
    let config = aws_sdk_sqs::config::Builder::from(sdk)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(std::time::Duration::from_secs(3))
                .operation_timeout(std::time::Duration::from_secs(10))
                .build(),
        )
        .build();
    let client = aws_sdk_sqs::Client::from_conf(config);
    let Err(e) = client.list_queues().queue_name_prefix("sasctl-probe-").send().await else {
        return Ok(());
    };
    let url = url.to_owned();
    Err(match &e {
        SdkError::DispatchFailure(d) if d.is_timeout() => {
            EndpointError::Unreachable { url, cause: "no connection within 3 s".into() }
        }
        SdkError::TimeoutError(_) => {
            EndpointError::Unreachable { url, cause: "no answer within 10 s".into() }
        }
        SdkError::DispatchFailure(_) => {
            EndpointError::Unreachable { url, cause: crate::resources::innermost(&e) }
        }
        SdkError::ResponseError(_) => {
            EndpointError::NotAws { url, cause: "its answer is not an SQS response".into() }
        }
        SdkError::ServiceError(_) => EndpointError::Refused { url, cause: crate::resources::sdk_reason(&e) },
        _ => EndpointError::Unreachable { url, cause: crate::resources::innermost(&e) },
    })
}

/// Which credentials sign the requests to an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signing {
    /// Fixed throwaway credentials ([`THROWAWAY_KEY_ID`]), which emulators accept as they
    /// accept any.
    Throwaway,
    /// The SDK's credential chain (environment, profile, SSO, instance role).
    Chain,
}

/// The access key id of the throwaway credentials.
pub const THROWAWAY_KEY_ID: &str = "testing";

/// The credentials for `endpoint`: throwaway ones over plain http, where every request
/// travels in clear (the access key id, a replayable signature and any session token
/// among its headers), so the caller's real credentials never do; the chain over https,
/// unless none is configured (`configured`: `AWS_ACCESS_KEY_ID` or `AWS_PROFILE` set),
/// when an emulator behind TLS gets the throwaway ones rather than a failed first request.
pub fn signing(endpoint: &str, configured: bool) -> Signing {
    if is_plain_http(endpoint) || !configured { Signing::Throwaway } else { Signing::Chain }
}

/// `http://...`, in any case: no TLS.
pub fn is_plain_http(url: &str) -> bool {
    url.trim_start().get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://"))
}

/// SDK configuration for `endpoint`. The region comes from the usual environment
/// (us-east-1 where none is set); the credentials as [`signing`] decides.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    let mut loader = sas::adapters::aws::config_loader().endpoint_url(endpoint);
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        loader = loader.region(aws_config::Region::new("us-east-1"));
    }
    let configured =
        std::env::var_os("AWS_ACCESS_KEY_ID").is_some() || std::env::var_os("AWS_PROFILE").is_some();
    if signing(endpoint, configured) == Signing::Throwaway {
        loader = throwaway(loader);
    }
    loader.load().await
}

/// SDK configuration when no `--endpoint-url` is given: the SDK's defaults, except that
/// an `AWS_ENDPOINT_URL` over plain http is signed as [`sdk_config`] signs it, and so is
/// every client when any per-service `AWS_ENDPOINT_URL_<SERVICE>` is plain http (the SDK
/// sends that service's requests there).
pub async fn default_sdk_config() -> SdkConfig {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    match plain_http_endpoint(&vars) {
        Some(PlainHttp::Global(url)) => sdk_config(url.trim()).await,
        Some(PlainHttp::Service) => throwaway(sas::adapters::aws::config_loader()).load().await,
        None => sas::adapters::aws::config_loader().load().await,
    }
}

/// Which of the environment's endpoints travel in clear.
#[derive(Debug, PartialEq, Eq)]
enum PlainHttp {
    /// `AWS_ENDPOINT_URL`, for every service.
    Global(String),
    /// An `AWS_ENDPOINT_URL_<SERVICE>`.
    Service,
}

fn plain_http_endpoint(vars: &[(String, String)]) -> Option<PlainHttp> {
    if let Some((_, url)) = vars.iter().find(|(k, v)| k == "AWS_ENDPOINT_URL" && is_plain_http(v)) {
        return Some(PlainHttp::Global(url.clone()));
    }
    vars.iter()
        .any(|(k, v)| k.starts_with("AWS_ENDPOINT_URL_") && is_plain_http(v))
        .then_some(PlainHttp::Service)
}

fn throwaway(loader: aws_config::ConfigLoader) -> aws_config::ConfigLoader {
    loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
        THROWAWAY_KEY_ID,
        "testing",
        None,
        None,
        "sasctl-throwaway",
    ))
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
                    sender: d.sender,
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
    async fn delete_batch(&self, queue: &QueueUrl, receipts: &[String]) -> usize {
        self.sqs.delete_batch(&self.url(queue), receipts).await
    }
}

/// A log of the landed task writes, for the invariant checker (through a [`TapStore`]).
#[derive(Default)]
pub struct WriteLog(Mutex<Log>);

/// A state store that keeps a log of its landed task writes.
pub type RecordingStore<S> = TapStore<S, WriteLog>;

#[derive(Default)]
struct Log {
    writes: Vec<WriteRecord>,
    latest: HashMap<OrderId, Arc<TaskRecord>>,
}

impl WriteLog {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.log().writes.clone()
    }
    pub fn state_counts(&self) -> BTreeMap<ProcessState, usize> {
        let mut counts = BTreeMap::new();
        for t in self.log().latest.values() {
            *counts.entry(t.state()).or_default() += 1;
        }
        counts
    }
    pub fn ids(&self) -> Vec<OrderId> {
        let mut ids: Vec<_> = self.log().latest.keys().cloned().collect();
        ids.sort();
        ids
    }
}

impl Tap for WriteLog {
    fn landed(&self, after: &TaskRecord, _: Landed) {
        let mut log = self.log();
        let after = Arc::new(after.clone());
        let before = log.latest.insert(after.order_id.clone(), after.clone());
        log.writes.push(WriteRecord { before, after });
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
    kept_alerts: Arc<RecordingAlerts>,
}

#[async_trait]
impl Backend for Aws {
    fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }
    fn call_starts(&self) -> Arc<dyn CallStarts> {
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
        self.store.tap().state_counts()
    }
    fn writes(&self) -> Vec<WriteRecord> {
        self.store.tap().writes()
    }
    fn raised_alerts(&self) -> Vec<OperatorAlert> {
        self.kept_alerts.all()
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
        for id in self.store.tap().ids() {
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

/// What became of the resources a run made.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Left in place (`--keep`).
    Kept,
    /// Removed at the end of the run (or found already gone).
    Removed,
    /// Some could not be removed: these, each with why.
    NotRemoved(Vec<(String, String)>),
    /// Which were made could not be told (the endpoint stopped answering): nothing was
    /// removed; everything the run made is named `{prefix}-...`.
    Unknown(String),
}

/// The resources of one run at an endpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Resources {
    pub endpoint: String,
    /// Every name starts with it: `{prefix}-state`, `{prefix}-orders`, ...
    pub prefix: String,
    /// What this run created (not what was there before it).
    pub made: Vec<crate::resources::Resource>,
    pub fate: Fate,
}

/// A run against an endpoint: its outcome, and its resources once any were made.
pub struct EndpointRun {
    pub outcome: Result<DevOutcome, EndpointError>,
    pub resources: Option<Resources>,
}

/// Runs the pipeline against `endpoint` until every accepted order is terminal (or
/// `max_runtime` passes), then removes the resources it made (unless `keep`).
/// `queue_duplicate_rate` does not apply: SQS's own at-least-once delivery is what
/// there is. Ctrl-C stops the run and still removes them; a second Ctrl-C leaves at once.
pub async fn run_and_clean_up(
    options: DevOptions,
    endpoint: &str,
    keep: bool,
    on_progress: impl Fn(&Progress),
) -> EndpointRun {
    if let Err(e) = check_url(endpoint) {
        return EndpointRun { outcome: Err(e), resources: None };
    }
    let sdk = sdk_config(endpoint).await;
    if let Err(e) = probe(&sdk, endpoint).await {
        return EndpointRun { outcome: Err(e), resources: None };
    }
    let clients = Clients::new(&sdk);
    let prefix = format!("dev-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let layout = layout(&prefix, &options);
    let before = match crate::resources::existing(&clients, &layout).await {
        Ok(before) => before,
        Err(e) => return EndpointRun { outcome: Err(EndpointError::failed(endpoint, e)), resources: None },
    };
    let run = run_in(&sdk, &clients, &layout, options, endpoint, on_progress);
    let outcome = tokio::select! {
        outcome = run => outcome,
        _ = tokio::signal::ctrl_c() => {
            eprintln!(
                "sasctl: interrupted; removing the resources this run made at {endpoint} \
                 (Ctrl-C again to leave them)"
            );
            tokio::spawn(async {
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            });
            Err(EndpointError::Interrupted { url: endpoint.to_owned() })
        }
    };
    let (made, fate) = match crate::resources::existing(&clients, &layout).await {
        Err(e) => (Vec::new(), Fate::Unknown(one_line(&e))),
        Ok(now) => {
            let made = crate::resources::made(&before, now);
            let fate = if keep {
                Fate::Kept
            } else {
                let failed = crate::resources::remove(&clients, &made).await;
                if failed.is_empty() {
                    Fate::Removed
                } else {
                    Fate::NotRemoved(failed.into_iter().map(|(r, why)| (r.name, one_line(&why))).collect())
                }
            };
            (made, fate)
        }
    };
    EndpointRun { outcome, resources: Some(Resources { endpoint: endpoint.to_owned(), prefix, made, fate }) }
}

/// [`run_and_clean_up`], the resources removed, for callers that only want the outcome.
pub async fn run(
    options: DevOptions,
    endpoint: &str,
    on_progress: impl Fn(&Progress),
) -> Result<DevOutcome, EndpointError> {
    let run = run_and_clean_up(options, endpoint, false, on_progress).await;
    if let Some(Resources { fate: fate @ (Fate::NotRemoved(_) | Fate::Unknown(_)), .. }) = &run.resources {
        tracing::warn!(endpoint, ?fate, "resources of the dev run left in place");
    }
    run.outcome
}

/// Provisions `layout` and runs the pipeline on it.
async fn run_in(
    sdk: &SdkConfig,
    clients: &Clients,
    layout: &Layout,
    options: DevOptions,
    endpoint: &str,
    on_progress: impl Fn(&Progress),
) -> Result<DevOutcome, EndpointError> {
    let resources =
        provision::provision(sdk, layout).await.map_err(|e| EndpointError::failed(endpoint, e))?;
    tracing::info!(endpoint, prefix = %layout.orders.name, "resources created");
    let kept_alerts = Arc::new(RecordingAlerts::default());
    let backend = Aws {
        store: Arc::new(RecordingStore::new(
            DynamoStore::new(clients.dynamodb.clone(), resources.tables.clone()),
            WriteLog::default(),
        )),
        queues: Arc::new(NamedQueues::new(SqsQueues::new(clients.sqs.clone()), &resources)),
        alerts: Arc::new(TeeAlerts {
            first: Arc::new(SnsAlerts::new(
                clients.sns.clone(),
                resources.alert_topic_arn.clone(),
                sas::adapters::aws::sns::Deployment::infer(None, &resources.tables.state),
            )),
            then: kept_alerts.clone(),
        }),
        kept_alerts,
    };
    dev::run_on(&backend, Arc::new(SystemClock), options, 200, on_progress)
        .await
        .map_err(|e| EndpointError::failed(endpoint, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_with_a_host_are_endpoints() {
        for good in ["http://127.0.0.1:4566", "https://localhost.localstack.cloud:4566/", "http://moto:5000"]
        {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in
            ["notaurl", "localhost:4566", "http://", "ftp://127.0.0.1", "127.0.0.1:5000", "", "http:// x"]
        {
            let e = check_url(bad).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn real_credentials_sign_only_over_tls() {
        for plain in ["http://127.0.0.1:5000", "HTTP://moto:5000", "http://localstack.internal:4566/"] {
            assert_eq!(signing(plain, true), Signing::Throwaway, "{plain}");
            assert_eq!(signing(plain, false), Signing::Throwaway, "{plain}");
        }
        let tls = "https://localhost.localstack.cloud:4566";
        assert_eq!(signing(tls, true), Signing::Chain);
        assert_eq!(signing(tls, false), Signing::Throwaway, "nothing configured: an emulator's dummies");
        assert!(!is_plain_http("https://sqs.us-east-1.amazonaws.com"));
        assert!(!is_plain_http("http"));
    }

    #[test]
    fn a_per_service_endpoint_over_plain_http_gets_the_throwaway_credentials_too() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(plain_http_endpoint(&env(&[])), None);
        assert_eq!(plain_http_endpoint(&env(&[("AWS_ENDPOINT_URL", "https://x.example")])), None);
        assert_eq!(
            plain_http_endpoint(&env(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")])),
            Some(PlainHttp::Global("http://127.0.0.1:5000".into()))
        );
        for service in ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_STS"] {
            let vars = env(&[("AWS_ENDPOINT_URL", "https://x.example"), (service, "http://10.0.0.5:4566")]);
            assert_eq!(plain_http_endpoint(&vars), Some(PlainHttp::Service), "{service}");
        }
        assert_eq!(plain_http_endpoint(&env(&[("AWS_ENDPOINT_URL_SQS", "https://sqs.example")])), None);
    }

    #[test]
    fn an_sdk_error_text_loses_its_debug_dump_and_newlines() {
        let text = "provisioning dev-1-state: dispatch failure: io error: client error (Connect): \
                    tcp connect error: Connection refused (os error 111) (DispatchFailure(DispatchFailure { \
                    source: ConnectorError { kind: Io } }))";
        assert_eq!(
            one_line(text),
            "provisioning dev-1-state: dispatch failure: io error: client error (Connect): \
             tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(one_line("two\nlines"), "two lines");
        let long = one_line(&"x".repeat(1_000));
        assert_eq!(long.len(), 303);
        assert!(long.ends_with("..."));
    }
}
