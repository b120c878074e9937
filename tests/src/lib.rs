//! Test support for the conformance suite and the end-to-end tests: the two backends
//! behind the same ports, and the rules for finding an AWS endpoint.
//!
//! Tests that need an endpoint read it from `SAS_TEST_ENDPOINT` (set by
//! `infra/with-moto.sh`: one endpoint for every service). The conformance suite and the
//! `cargo lambda watch` test also take one endpoint per service,
//! `SAS_TEST_ENDPOINT_DYNAMODB`, `_SQS` and `_SNS` (set by `infra/with-localstack.sh`:
//! DynamoDB Local for DynamoDB, LocalStack for the rest), each falling back to
//! `SAS_TEST_ENDPOINT`. Without an endpoint a test prints a loud SKIPPED line and passes,
//! unless `CI=true`, where a missing emulator is a failure: CI must never go green by
//! skipping.

pub mod callbacks;
pub mod conformance;

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use sas::adapters::aws::provision::{self, QueueSpec};
use sas::adapters::aws::{DynamoStore, SqsQueues, TableNames};
use sas::adapters::embedded::{EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings};
use sas::ports::{CallStarts, QueueConsumer, QueueUrl, Queues, StateStore, TaskListing};

pub const ENDPOINT_VAR: &str = "SAS_TEST_ENDPOINT";

/// The endpoint to test against, or `None` after printing why the test is skipped.
/// Panics under `CI=true` when there is none.
pub fn endpoint(test: &str) -> Option<String> {
    if let Some(e) = std::env::var(ENDPOINT_VAR).ok().filter(|e| !e.trim().is_empty()) {
        return Some(e);
    }
    skip_or_fail(test, ENDPOINT_VAR);
    None
}

fn skip_or_fail(test: &str, needs: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(
        !ci,
        "{test}: CI=true but {needs} is not set. Emulator-backed tests must run in CI: \
         run them under infra/with-moto.sh (it installs and starts moto and sets {ENDPOINT_VAR})."
    );
    // Straight to stderr, past libtest's capture (which swallows a passing test's
    // eprintln!): a skip must be seen.
    let line = format!("*** SKIPPED: no emulator: {test} needs {needs} (run under infra/with-moto.sh) ***\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// Where an emulator-backed test sends each service's requests: one URL for all (moto),
/// or DynamoDB Local for DynamoDB and LocalStack for SQS and SNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub dynamodb: String,
    pub sqs: String,
    pub sns: String,
}

impl Endpoints {
    /// `SAS_TEST_ENDPOINT_<SERVICE>`, each falling back to `SAS_TEST_ENDPOINT`; `None`
    /// unless every service has one.
    pub fn from_env() -> Option<Endpoints> {
        let var = |name: &str| std::env::var(name).ok().filter(|e| !e.trim().is_empty());
        let service = |name: &str| var(&format!("{ENDPOINT_VAR}_{name}")).or_else(|| var(ENDPOINT_VAR));
        Some(Endpoints { dynamodb: service("DYNAMODB")?, sqs: service("SQS")?, sns: service("SNS")? })
    }

    /// The variables that point the AWS SDK (a function, `sas-bootstrap`) at these
    /// endpoints: `AWS_ENDPOINT_URL` when one serves every service, else one
    /// `AWS_ENDPOINT_URL_<SERVICE>` each.
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        if self.dynamodb == self.sqs && self.sqs == self.sns {
            return vec![("AWS_ENDPOINT_URL", self.sqs.clone())];
        }
        vec![
            ("AWS_ENDPOINT_URL_DYNAMODB", self.dynamodb.clone()),
            ("AWS_ENDPOINT_URL_SQS", self.sqs.clone()),
            ("AWS_ENDPOINT_URL_SNS", self.sns.clone()),
        ]
    }

    /// A client per service, each at its endpoint, from the tests' configuration
    /// ([`sdk_config_per_service`]).
    pub fn clients(&self, sdk: &SdkConfig) -> sas::adapters::aws::Clients {
        sas::adapters::aws::Clients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(sdk).endpoint_url(&self.dynamodb).build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(sdk).endpoint_url(&self.sqs).build(),
            ),
            sns: aws_sdk_sns::Client::from_conf(
                aws_sdk_sns::config::Builder::from(sdk).endpoint_url(&self.sns).build(),
            ),
        }
    }
}

/// The endpoints to test against, or `None` after printing why the test is skipped.
/// Panics under `CI=true` when there are none.
pub fn endpoints(test: &str) -> Option<Endpoints> {
    if let Some(e) = Endpoints::from_env() {
        return Some(e);
    }
    skip_or_fail(test, &format!("{ENDPOINT_VAR} (or {ENDPOINT_VAR}_DYNAMODB, _SQS and _SNS)"));
    None
}

/// The loader every test configuration starts from: fixed dummy credentials and region,
/// so the tests do not depend on (or touch) whatever AWS profile the machine has.
fn test_loader() -> aws_config::ConfigLoader {
    let credentials =
        aws_sdk_dynamodb::config::Credentials::new("testing", "testing", None, None, "sas-tests");
    sas::adapters::aws::config_loader()
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(credentials)
}

/// The tests' credentials and region and no endpoint: each client sets its own
/// ([`Endpoints::clients`]).
pub async fn sdk_config_per_service() -> SdkConfig {
    test_loader().load().await
}

/// SDK configuration for one test endpoint serving every service.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    test_loader().endpoint_url(endpoint).load().await
}

/// A name prefix no other test (or earlier run against the same server) uses.
pub fn unique_prefix(test: &str) -> String {
    let short: String = test.chars().filter(|c| c.is_ascii_alphanumeric()).take(24).collect();
    format!("t-{short}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// How a backend lets time pass: the embedded one moves its manual clock, the AWS
/// one has to wait for real.
pub enum Time {
    Manual(Arc<ManualClock>),
    Real,
}

/// One backend's ports, with a work queue (short visibility timeout, redrive to a
/// dead-letter queue after `max_receives`) for the queue tests.
pub struct Backend {
    pub name: &'static str,
    pub store: Arc<dyn StateStore>,
    /// The same store's operator listing.
    pub lister: Arc<dyn TaskListing>,
    /// The same store's call marks (the agent's one write).
    pub call_starts: Arc<dyn CallStarts>,
    pub queues: Arc<dyn Queues>,
    /// Sends as an app's would: the embedded queues record `APP_SENDER_ID` as the sender;
    /// on the endpoint it is the same client, and the service sets the sender.
    pub app_queues: Arc<dyn Queues>,
    pub consumer: Arc<dyn QueueConsumer>,
    pub time: Time,
    pub work_queue: QueueUrl,
    pub dead_letter_queue: QueueUrl,
    pub visibility_ms: u64,
    pub max_receives: u32,
    /// The AWS store, for checks that only it supports (items read by `due`).
    pub dynamo: Option<Arc<DynamoStore>>,
}

pub const MAX_RECEIVES: u32 = 2;

/// The `SenderId` the embedded backend's app sends under (an assumed role's form).
pub const APP_SENDER_ID: &str = "AROACONFORMANCE:session-1";

impl Backend {
    pub fn embedded() -> Backend {
        Backend::embedded_with(false)
    }

    /// The embedded backend, its store keeping the finished index or not (as a deployment
    /// with `LIST_FINISHED=true` does).
    pub fn embedded_with(list_finished: bool) -> Backend {
        let clock = Arc::new(ManualClock::at(1_700_000_000_000));
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 7));
        let visibility_ms = 1_000;
        queues.create("work-dlq", QueueSettings::default());
        queues.create(
            "work",
            QueueSettings {
                visibility_timeout_ms: visibility_ms,
                max_receives: MAX_RECEIVES,
                dead_letter: Some("work-dlq".into()),
                duplicate_rate: 0.0,
            },
        );
        let store = Arc::new(if list_finished {
            EmbeddedStore::new().with_finished_index()
        } else {
            EmbeddedStore::new()
        });
        Backend {
            name: "embedded",
            store: store.clone(),
            lister: store.clone(),
            call_starts: store,
            queues: queues.clone(),
            app_queues: Arc::new(queues.sending_as(APP_SENDER_ID)),
            consumer: queues,
            time: Time::Manual(clock),
            work_queue: QueueUrl("work".into()),
            dead_letter_queue: QueueUrl("work-dlq".into()),
            visibility_ms,
            max_receives: MAX_RECEIVES,
            dynamo: None,
        }
    }

    /// A fresh state table and queues on the test endpoint, or `None` when there is none.
    pub async fn aws(test: &str) -> Option<Backend> {
        Backend::aws_with(test, false).await
    }

    /// As `aws`, with the table's finished index and its writes, or without (the
    /// template's default).
    pub async fn aws_with(test: &str, list_finished: bool) -> Option<Backend> {
        let endpoints = endpoints(test)?;
        let sdk = sdk_config_per_service().await;
        let prefix = unique_prefix(test);
        let tables = TableNames::new(format!("{prefix}-state")).with_list_finished(list_finished);
        let clients = endpoints.clients(&sdk);
        let (dynamodb, sqs) = (clients.dynamodb, clients.sqs);
        provision::create_tables(&dynamodb, &tables)
            .await
            .unwrap_or_else(|e| panic!("creating tables at {}: {e}", endpoints.dynamodb));
        // SQS counts visibility in whole seconds; one is the shortest that is not zero.
        let spec = QueueSpec {
            name: format!("{prefix}-work"),
            visibility_timeout_s: 1,
            max_receives: Some(MAX_RECEIVES),
        };
        let (work, dlq) = provision::create_queue(&sqs, &spec)
            .await
            .unwrap_or_else(|e| panic!("creating queues at {}: {e}", endpoints.sqs));
        let store = Arc::new(DynamoStore::new(dynamodb, tables));
        let queues = Arc::new(SqsQueues::new(sqs));
        Some(Backend {
            name: "aws",
            store: store.clone(),
            lister: store.clone(),
            call_starts: store.clone(),
            queues: queues.clone(),
            app_queues: queues.clone(),
            consumer: queues,
            time: Time::Real,
            work_queue: QueueUrl(work),
            dead_letter_queue: QueueUrl(dlq.expect("the spec asks for a dead-letter queue")),
            visibility_ms: 1_000,
            max_receives: MAX_RECEIVES,
            dynamo: Some(store),
        })
    }

    /// Lets `ms` pass for the queues' visibility timeouts and delays.
    pub async fn pass(&self, ms: u64) {
        match &self.time {
            Time::Manual(clock) => {
                clock.advance(ms);
            }
            // A little over: the emulator's clock and ours tick separately.
            Time::Real => tokio::time::sleep(Duration::from_millis(ms + 150)).await,
        }
    }

    /// A receive that waits a little on a real queue and not at all on the embedded
    /// one (whose clock only moves when told).
    pub fn wait_ms(&self) -> u64 {
        match self.time {
            Time::Manual(_) => 0,
            Time::Real => 1_000,
        }
    }
}

/// Messages of the queue at `url`, visible and in flight.
pub async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes");
    out.attributes().into_iter().flatten().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
}

/// Log output captured in memory: a `tracing_subscriber` writer the log tests read back.
#[derive(Clone, Default)]
pub struct Lines(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
