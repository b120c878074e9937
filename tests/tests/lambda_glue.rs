//! The functions' Lambda glue (`sas::lambda`) under a real `lambda_runtime` loop: a
//! fake Runtime API on loopback hands out one event and takes the response, while
//! the handlers run on the AWS adapters against the test endpoint, wired exactly as
//! `functions/*/src/main.rs` wire them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use sas::adapters::aws::provision::{Layout, provision};
use sas::adapters::embedded::ManualClock;
use sas::domain::{OrderId, ProcessState};
use sas::handlers::{DEFAULT_MAX_HOLD, REASON_ATTRIBUTE, Submission, Supervisor};
use sas::lambda::Aws;
use sas::ports::{QueueConsumer, QueueUrl};
use serde_json::{Value, json};
use tokio::sync::mpsc;

#[derive(Clone)]
struct RuntimeApi {
    event: Arc<Mutex<Option<Value>>>,
    results: mpsc::UnboundedSender<Result<Value, String>>,
}

async fn next(State(api): State<RuntimeApi>) -> (HeaderMap, String) {
    let event = api.event.lock().unwrap_or_else(|p| p.into_inner()).take();
    let Some(event) = event else {
        // One invocation per test: later polls wait, as Lambda's do between events.
        std::future::pending::<()>().await;
        unreachable!()
    };
    let mut headers = HeaderMap::new();
    headers.insert("lambda-runtime-aws-request-id", HeaderValue::from_static("req-1"));
    headers.insert("lambda-runtime-deadline-ms", HeaderValue::from_static("4102444800000"));
    headers.insert(
        "lambda-runtime-invoked-function-arn",
        HeaderValue::from_static("arn:aws:lambda:us-east-1:123456789012:function:sas-test"),
    );
    (headers, event.to_string())
}

async fn response(State(api): State<RuntimeApi>, Path(_id): Path<String>, body: String) -> StatusCode {
    let _ = api.results.send(serde_json::from_str(&body).map_err(|e| format!("{e}: {body}")));
    StatusCode::ACCEPTED
}

async fn error(State(api): State<RuntimeApi>, Path(_id): Path<String>, body: String) -> StatusCode {
    let _ = api.results.send(Err(body));
    StatusCode::ACCEPTED
}

/// Serves one event on a fresh port and points the runtime at it.
async fn runtime_api(event: Value) -> mpsc::UnboundedReceiver<Result<Value, String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let api = RuntimeApi { event: Arc::new(Mutex::new(Some(event))), results: tx };
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route("/2018-06-01/runtime/invocation/{id}/response", post(response))
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    // SAFETY: this test binary has one test, and nothing else reads the environment
    // while it is set (the runtime reads it when `serve_*` starts, after this).
    unsafe {
        std::env::set_var("AWS_LAMBDA_RUNTIME_API", addr.to_string());
        std::env::set_var("AWS_LAMBDA_FUNCTION_NAME", "sas-test");
        std::env::set_var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128");
        std::env::set_var("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST");
    }
    rx
}

/// Runs `serve` until the fake API has its one response.
async fn invoke<F: std::future::Future<Output = Result<(), sas::lambda::Error>>>(
    serve: F,
    mut results: mpsc::UnboundedReceiver<Result<Value, String>>,
) -> Value {
    tokio::select! {
        ended = serve => panic!("the runtime loop ended: {ended:?}"),
        got = tokio::time::timeout(Duration::from_secs(30), results.recv()) => {
            got.expect("a response within 30 s").expect("channel open").expect("a function response, not an error")
        }
    }
}

fn record(id: &str, body: &str, receive_count: u32) -> Value {
    json!({
        "messageId": id, "receiptHandle": format!("rh-{id}"), "body": body,
        "attributes": {"ApproximateReceiveCount": receive_count.to_string(), "SentTimestamp": "1"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:sas-orders", "awsRegion": "us-east-1"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_and_schedule_events_run_through_the_handlers() {
    let Some(endpoint) = sas_tests::endpoint("sqs_and_schedule_events_run_through_the_handlers") else {
        return;
    };
    let sdk = sas_tests::sdk_config(&endpoint).await;
    let resources =
        provision(&sdk, &Layout::standard(&sas_tests::unique_prefix("glue"))).await.expect("resources");
    let aws = Aws { sdk };
    let orders = QueueUrl(resources.orders_queue.clone());
    let orders_dlq = QueueUrl(resources.orders_dlq.clone());
    let settings = sas::handlers::Settings::new(
        sas::domain::Policy::default(),
        sas::domain::Workflows::builtin(),
        sas::handlers::Topology::new(
            QueueUrl(resources.scheduler_queue.clone()),
            QueueUrl(resources.agent_queue.clone()),
        ),
        sas::adapters::embedded::queue_names::reply_to_rules(),
    );

    // submission: a valid order, its exact duplicate, a malformed body.
    let deps = aws.deps(&resources.tables, None, Aws::metrics("submission", "sas-test"), DEFAULT_MAX_HOLD);
    let dead_letters = Aws::dead_letters(&deps, &orders, &orders_dlq);
    let submission = Submission::new(deps, settings.clone());
    let order = r#"{"order_id":"glue-1","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#;
    let event = json!({"Records": [record("m1", order, 1), record("m2", order, 2), record("m3", "{", 1)]});
    let results = runtime_api(event).await;
    let answer = invoke(sas::lambda::serve_sqs(dead_letters, |m| submission.handle(m)), results).await;
    assert_eq!(answer, json!({"batchItemFailures": []}), "nothing to redeliver");

    let id = OrderId::parse("glue-1").expect("valid id");
    let task = submission.deps.store.task(&id).await.expect("readable").expect("stored");
    assert_eq!((task.state(), task.revision), (ProcessState::Pending, 1), "inserted once");
    let sqs = aws.sqs();
    let kept = sqs.receive(&orders_dlq, 10, 1_000).await.expect("receive");
    assert_eq!(kept.len(), 1, "only the malformed body is kept");
    assert_eq!(kept[0].body, "{");
    let reason = kept[0].attributes.get(REASON_ATTRIBUTE).expect("a reason");
    assert!(reason.contains("not a valid message"), "{reason}");

    // supervisor: a scheduled event after the task's deadline recovers it.
    let metrics = Aws::metrics("supervisor", "sas-test");
    let deployment = sas::config::Deployment::Stack("glue".into());
    let alerts = Some((resources.alert_topic_arn.as_str(), &deployment));
    let mut deps = aws.deps(&resources.tables, alerts, metrics, DEFAULT_MAX_HOLD);
    let deadline = task.deadline().expect("pending tasks have a deadline");
    deps.clock = Arc::new(ManualClock::at(deadline.0 + 1));
    let supervisor = Supervisor::new(deps, settings);
    let event = json!({
        "version": "0", "id": "e-1", "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-11-21T00:00:00Z", "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/sas-supervisor"], "detail": {}
    });
    let results = runtime_api(event).await;
    let report = invoke(sas::lambda::serve_schedule(supervisor.clone()), results).await;
    assert_eq!(report["examined"], 1, "{report}");
    assert_eq!(report["retried"], 1, "{report}");
    let task = supervisor.deps.store.task(&id).await.expect("readable").expect("stored");
    assert_eq!((task.state(), task.failure_count), (ProcessState::Pending, 1));
}
