//! The operator commands' safety rules (issue 24, finding 6), as an operator meets them:
//! the built binary against moto (infra/with-moto.sh sets SAS_TEST_ENDPOINT; without it a
//! test prints a loud SKIPPED line and passes, except under CI=true), resources made and
//! read with the plain SDK.

use std::process::Command;

use sas::adapters::aws::DynamoStore;
use sas::adapters::aws::provision::{Layout, Provisioned, provision};
use sas::domain::{LineItem, Order, OrderId, Policy, TaskRecord, Timestamp};
use sas::ports::StateStore;

mod support;

fn unique(what: &str) -> String {
    format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// `sasctl ARGS` as an operator runs it: exit code, stdout, stderr.
fn sasctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(args)
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("SAS_WORKFLOWS")
        .env_remove("REPLY_TO_EXTRA_QUEUE_ARNS")
        .output()
        .expect("sasctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn deployment(endpoint: &str, prefix: &str) -> (aws_config::SdkConfig, Provisioned) {
    let sdk = sasctl::endpoint::sdk_config(endpoint).await;
    let provisioned = provision(&sdk, &Layout::standard(prefix)).await.expect("provisioned");
    (sdk, provisioned)
}

async fn remove_resources(sdk: &aws_config::SdkConfig, prefix: &str, extra_queues: &[&str]) {
    let clients = sas::adapters::aws::Clients::new(sdk);
    let all = sasctl::resources::existing(&clients, &Layout::standard(prefix)).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
    for url in extra_queues {
        clients.sqs.delete_queue().queue_url(*url).send().await.expect("queue deleted");
    }
}

/// A task of the built-in `single-step` workflow, Pending, nothing done yet.
fn pending_task(id: &str, reply_to: &str) -> TaskRecord {
    let order = Order {
        order_id: OrderId::parse(id).unwrap(),
        customer_id: "c-1".into(),
        items: vec![LineItem { sku: "A-1".into(), quantity: 1 }],
        workflow: "single-step".into(),
        workflow_version: None,
    };
    TaskRecord::new(&order, Some(reply_to.to_owned()), Timestamp(1_700_000_000_000), &Policy::default())
}

async fn bodies(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = sqs.receive_message().queue_url(url).max_number_of_messages(10).wait_time_seconds(1);
        let got = got.send().await.expect("received").messages.unwrap_or_default();
        if got.is_empty() {
            return out;
        }
        for m in got {
            out.extend(m.body);
            let receipt = m.receipt_handle.unwrap_or_default();
            sqs.delete_message().queue_url(url).receipt_handle(receipt).send().await.expect("deleted");
        }
    }
}

/// An order accepted while its reply_to queue was on the allow-list, and the queue taken off
/// it since: the functions tell it nothing more (every send is checked), and an operator's
/// action must not either. Before the fix, `tasks` allowed each order's own stored reply_to.
#[tokio::test]
async fn an_operator_action_tells_only_a_reply_to_the_deployment_allows() {
    let Some(endpoint) = support::endpoint("an_operator_action_tells_only_a_reply_to_the_deployment_allows")
    else {
        return;
    };
    let prefix = unique("rt");
    let (sdk, provisioned) = deployment(&endpoint, &prefix).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let app = sqs.create_queue().queue_name(format!("{prefix}-app")).send().await.unwrap().queue_url.unwrap();
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), provisioned.tables.clone());
    store.insert(&pending_task("allowed-1", &provisioned.status_queue)).await.unwrap();
    store.insert(&pending_task("dropped-1", &app)).await.unwrap();

    for id in ["allowed-1", "dropped-1"] {
        let (code, out, err) = sasctl(&[
            "tasks",
            "cancel",
            id,
            "--reason",
            "customer left",
            "--json",
            "--prefix",
            &prefix,
            "--endpoint-url",
            &endpoint,
        ]);
        assert_eq!(code, 0, "{id}: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        assert_eq!(v["outcome"], "applied", "{v}");
        if id == "dropped-1" {
            assert_eq!(
                v["status_not_sent"],
                "reply_to names a queue that is not on this deployment's reply_to allow-list",
                "{v}"
            );
        } else {
            assert!(v.get("status_not_sent").is_none(), "{v}");
        }
    }
    let told = bodies(&sqs, &provisioned.status_queue).await;
    assert!(!told.is_empty() && told.iter().all(|b| b.contains("allowed-1")), "status queue: {told:?}");
    let leaked = bodies(&sqs, &app).await;
    assert!(leaked.is_empty(), "a queue off the allow-list was told: {leaked:?}");
    remove_resources(&sdk, &prefix, &[&app]).await;
}

/// A plain-http endpoint that records the head of every request and answers 400 (which
/// no SDK retries).
fn recording_endpoint() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            seen.lock().unwrap().push(String::from_utf8_lossy(&buf).to_lowercase());
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, heads)
}

/// `dev`, `up` and the operator commands (`tasks`, `dlq`) sign requests to a plain-http endpoint
/// with throwaway credentials: the caller's own (here in the environment, with a session
/// token) never travel in clear. Before the fix the access key id was in every request's
/// Authorization header and the session token in X-Amz-Security-Token.
#[test]
fn real_credentials_never_go_to_a_plain_http_endpoint() {
    const KEY_ID: &str = "AKIAREALKEYSHOULDNOT";
    const TOKEN: &str = "real-session-token-never-in-clear";
    let (url, heads) = recording_endpoint();
    let runs: [(&[&str], bool); 4] = [
        (&["tasks", "list", "--prefix", "p", "--endpoint-url", &url], false),
        (&["dlq", "list", "orders", "--prefix", "p"], true),
        (&["dev", "--orders", "1", "--endpoint-url", &url], false),
        (
            &["up", "--endpoint-url", &url, "--prefix", "p", "--remote-service-url", "http://127.0.0.1:1"],
            false,
        ),
    ];
    for (args, from_env) in runs {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sasctl"));
        command
            .args(args)
            .env_remove("SAS_STACK")
            .env_remove("SAS_PREFIX")
            .env_remove("AWS_PROFILE")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", "real-secret")
            .env("AWS_SESSION_TOKEN", TOKEN)
            .env("AWS_EC2_METADATA_DISABLED", "true");
        if from_env {
            command.env("AWS_ENDPOINT_URL", &url);
        } else {
            command.env_remove("AWS_ENDPOINT_URL");
        }
        let before = heads.lock().unwrap().len();
        let out = command.output().expect("sasctl runs");
        assert_ne!(out.status.code(), Some(0), "{args:?}: the endpoint answers nothing useful");
        let heads = heads.lock().unwrap();
        assert!(heads.len() > before, "{args:?}: no request reached the endpoint");
        for head in &heads[before..] {
            assert!(head.contains("authorization: aws4-hmac-sha256 credential=testing/"), "{args:?}: {head}");
            assert!(
                !head.contains(&KEY_ID.to_lowercase()),
                "{args:?}: the real key id went in clear: {head}"
            );
            assert!(!head.contains(TOKEN), "{args:?}: the session token went in clear: {head}");
        }
    }
}

/// `dlq redrive` of the orders DLQ holding two orders and an app's cancel: the orders go
/// back at most --rate a second, the cancel stays (it may be stale: its order resubmitted
/// since) unless --include-cancels; --dry-run says which would stay. Before the fix every
/// message went back at once, the cancel with them.
#[tokio::test]
async fn a_redrive_is_paced_and_leaves_cancels_in_the_dlq_unless_asked() {
    let Some(endpoint) = support::endpoint("a_redrive_is_paced_and_leaves_cancels_in_the_dlq_unless_asked")
    else {
        return;
    };
    let prefix = unique("rd");
    let (sdk, provisioned) = deployment(&endpoint, &prefix).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let cancel = r#"{"cancel":"o-1","reason":"customer left"}"#;
    let orders: Vec<String> = (1..=4)
        .map(|i| format!(r#"{{"order_id":"o-{i}","customer_id":"c","items":[{{"sku":"A","quantity":1}}],"workflow":"single-step"}}"#))
        .collect();
    for body in orders.iter().map(String::as_str).chain([cancel]) {
        sqs.send_message().queue_url(&provisioned.orders_dlq).message_body(body).send().await.unwrap();
    }
    let redrive = |extra: &[&str]| {
        let mut args =
            vec!["dlq", "redrive", "orders", "--json", "--prefix", &prefix, "--endpoint-url", &endpoint];
        args.extend_from_slice(extra);
        let (code, out, err) = sasctl(&args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON lines"))
            .collect::<Vec<_>>()
    };

    let preview = redrive(&["--dry-run"]);
    let stays: Vec<_> = preview.iter().filter(|v| v.get("would_stay").is_some()).collect();
    assert_eq!(stays.len(), 1, "{preview:?}");
    assert_eq!(stays[0]["body"], cancel);
    assert_eq!(preview.iter().filter(|v| v.get("would_move_to").is_some()).count(), 4, "{preview:?}");

    let started = std::time::Instant::now();
    let done = redrive(&["--rate", "2"]);
    let elapsed = started.elapsed();
    assert_eq!((done[0]["moved"].as_u64(), done[0]["held_back"].as_u64()), (Some(4), Some(1)), "{done:?}");
    // Four at two a second: the last pair is not sent before a second has passed.
    assert!(elapsed >= std::time::Duration::from_millis(1_500), "4 messages at --rate 2 took {elapsed:?}");
    let mut back = bodies(&sqs, &provisioned.orders_queue).await;
    back.sort();
    assert_eq!(back, orders, "the orders went back");
    assert_eq!(bodies(&sqs, &provisioned.orders_dlq).await, [cancel], "the cancel stayed");

    sqs.send_message().queue_url(&provisioned.orders_dlq).message_body(cancel).send().await.unwrap();
    let done = redrive(&["--include-cancels"]);
    assert_eq!((done[0]["moved"].as_u64(), done[0]["held_back"].as_u64()), (Some(1), Some(0)), "{done:?}");
    assert_eq!(bodies(&sqs, &provisioned.orders_queue).await, [cancel], "asked for, the cancel went back");
    remove_resources(&sdk, &prefix, &[]).await;
}
