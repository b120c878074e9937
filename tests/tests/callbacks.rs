//! A callback step end to end over the test endpoint (moto under infra/with-moto.sh): the
//! four functions run as `sasctl up` runs them (real adapters, every queue pumped as its
//! Lambda event source does, the callback queue into the scheduler's callback handler
//! with the callback DLQ). The step's agent is a loopback service that answers "started"
//! and keeps the token it was sent; the order waits; the outside's messages arrive on the
//! callback queue through a plain SQS SendMessage, as an outside system sends them. A
//! forged token (right order, step and attempt, wrong secret) and malformed messages are
//! kept in the callback DLQ with their reason and change nothing; the real completion
//! ends the task Processed with the completion's output; sent again, it is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sas::adapters::aws::DynamoStore;
use sas::domain::{CallbackToken, OrderId, ProcessState, TaskRecord};
use sas::ports::StateStore;
use sas_tests::callbacks::{Approvals, forged, take};
use sas_tests::depth;
use sasctl::up::{self, EventLog, UpOptions, Windows};
use tokio::sync::watch;

const TEST: &str = "a_callback_step_waits_and_is_completed_through_the_callback_queue";

/// Polls `check` every 200 ms until it gives something, for at most `within`.
async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_step_waits_and_is_completed_through_the_callback_queue() {
    let Some(endpoint) = sas_tests::endpoint(TEST) else { return };
    let approvals = Approvals::serve().await;
    let dir = std::env::temp_dir().join(format!("sas-callbacks-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let workflows = dir.join("workflows.json");
    let definitions = serde_json::json!({
        "agents": {"approvals": approvals.agent()},
        "workflows": [sas_tests::callbacks::workflow()],
    });
    std::fs::write(&workflows, definitions.to_string()).unwrap();

    let options = UpOptions {
        endpoint: endpoint.clone(),
        dynamodb_endpoint: None,
        prefix: sas_tests::unique_prefix("callbacks"),
        workflows: Some(workflows),
        remote_service_url: None,
        simulated: None,
        supervisor_period: Duration::from_secs(1),
        concurrency: 2,
        windows: Windows::default(),
        receive_wait_ms: 500,
        json: false,
        console: false,
    };
    let ready = up::prepare(&options).await.unwrap_or_else(|e| panic!("up at {endpoint}: {e}"));
    let (stop, stopped) = watch::channel(false);
    let workers = up::start(&ready, &options, Arc::new(EventLog::quiet()), stopped);
    let p = ready.provisioned.clone();
    let sqs = aws_sdk_sqs::Client::new(&ready.sdk);
    let store = DynamoStore::new(ready.clients.dynamodb.clone(), p.tables.clone());
    let send = |queue: String, body: String| {
        let sqs = sqs.clone();
        async move { sqs.send_message().queue_url(queue).message_body(body).send().await.expect("sent") }
    };

    // The order reaches Waiting: its agent started the work and was handed the token.
    let id = format!("cb-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let order = serde_json::json!({"order_id": id, "customer_id": "c-1",
                                   "items": [{"sku": "A-1", "quantity": 1}], "workflow": "approve"});
    send(p.orders_queue.clone(), order.to_string()).await;
    let order_id = OrderId::parse(&id).unwrap();
    let (store, order_id) = (&store, &order_id);
    let task = || async move { store.task(order_id).await.expect("state table read") };
    let waiting: TaskRecord = wait_for("the task waits", Duration::from_secs(60), || async {
        task().await.filter(|t| t.state() == ProcessState::Waiting)
    })
    .await;
    let token = approvals.token(&id, Duration::from_secs(5)).await;
    let (parsed, claims) = CallbackToken::parse(&token).expect("a well-formed token");
    assert_eq!((claims.order_id.as_str(), claims.step), (id.as_str(), 0));
    let awaiting = waiting.callback().expect("the record waits on the token").clone();
    assert_eq!(awaiting.digest, parsed.digest(), "the record keeps the token's digest");
    assert!(!format!("{waiting:?}").contains(&token), "never the token itself");

    // Forged (its order, step and attempt, another secret) and malformed: each kept in the
    // callback DLQ with its reason, and the task not written.
    let head = token.rsplit_once('.').unwrap().0;
    let forged = serde_json::json!({"token": forged(&token), "outcome": "success"}).to_string();
    let not_json = "approved!".to_owned();
    let bad_token = serde_json::json!({"token": format!("{head}.xyz"), "outcome": "success"}).to_string();
    let no_reason = serde_json::json!({"token": token, "outcome": "failure"}).to_string();
    for body in [&forged, &not_json, &bad_token, &no_reason] {
        send(p.callback_queue.clone(), body.clone()).await;
    }
    let kept = take(&sqs, &p.callback_dlq, 4).await;
    let reason =
        |body: &str| kept.get(body).cloned().flatten().unwrap_or_else(|| panic!("{body} kept: {kept:?}"));
    assert_eq!(
        reason(&forged),
        format!(
            "callback refused: the token does not match the one issued for step 0 attempt {}",
            claims.attempt
        )
    );
    assert!(reason(&not_json).starts_with("not a callback message: "), "{kept:?}");
    assert!(reason(&bad_token).starts_with("callback refused: a callback token is sas1."), "{kept:?}");
    assert_eq!(reason(&no_reason), "not a callback message: a failure needs a reason");
    let now = task().await.unwrap();
    assert_eq!((now.state(), now.revision), (ProcessState::Waiting, waiting.revision), "nothing changed");

    // The real completion: the step ends with its output and the task with it.
    let done = serde_json::json!({"token": token, "outcome": "success", "output": {"approved_by": "ops"}});
    send(p.callback_queue.clone(), done.to_string()).await;
    let processed = wait_for("the task ends", Duration::from_secs(60), || async {
        task().await.filter(|t| t.state().is_terminal())
    })
    .await;
    assert_eq!(processed.state(), ProcessState::Processed, "{processed:?}");
    assert_eq!(
        processed.outputs.get("approve").map(|o| o.to_value()),
        Some(serde_json::json!({"approved_by": "ops"}))
    );
    assert_eq!(processed.callback(), None, "the token died with its step");

    // The same completion again: refused (the step has ended), kept, nothing written.
    send(p.callback_queue.clone(), done.to_string()).await;
    let kept = take(&sqs, &p.callback_dlq, 1).await;
    let why = kept.get(&done.to_string()).cloned().flatten().expect("kept with a reason");
    assert!(why.starts_with("callback refused: the token is for step 0 attempt"), "{why}");
    assert!(why.contains("which has ended"), "{why}");
    assert_eq!(task().await.unwrap().revision, processed.revision);

    // Nothing went anywhere else: the scheduler's and the orders' DLQs are empty.
    assert_eq!(depth(&sqs, &p.scheduler_dlq).await, 0, "nothing misrouted to the scheduler DLQ");
    assert_eq!(depth(&sqs, &p.orders_dlq).await, 0);

    let _ = stop.send(true);
    for worker in workers {
        let _ = worker.await;
    }
    let left = sasctl::resources::remove(&ready.clients, &ready.created).await;
    assert!(left.is_empty(), "tidied up: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
