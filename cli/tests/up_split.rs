//! `sasctl up` with DynamoDB at an endpoint of its own (`--dynamodb-endpoint-url`), as it
//! runs on LocalStack with DynamoDB Local: under infra/with-localstack.sh the endpoints are
//! SAS_TEST_ENDPOINT_SQS (LocalStack) and SAS_TEST_ENDPOINT_DYNAMODB (DynamoDB Local); under
//! infra/with-moto.sh both are moto's SAS_TEST_ENDPOINT. The built binary runs as a child
//! process with the built-in workflows and a loopback remote service; one order is sent
//! with the plain SDK to the SQS endpoint and read back from the DynamoDB one, then SIGINT.
//! Without an endpoint the test prints a loud SKIPPED line and passes, except under CI=true.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use sasctl::remote_sim::{LoopbackRemote, RemoteFaults};

mod support;
#[allow(dead_code)]
#[path = "support/up.rs"]
mod up;
use up::Up;

const TEST: &str = "an_order_runs_with_dynamodb_at_its_own_endpoint";

/// (every other service's endpoint, DynamoDB's).
fn endpoints() -> Option<(String, String)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let (Some(sqs), Some(dynamodb)) = (var("SAS_TEST_ENDPOINT_SQS"), var("SAS_TEST_ENDPOINT_DYNAMODB")) {
        return Some((sqs, dynamodb));
    }
    let one = support::endpoint(TEST)?;
    Some((one.clone(), one))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_runs_with_dynamodb_at_its_own_endpoint() {
    let Some((endpoint, dynamodb_endpoint)) = endpoints() else { return };
    let remote = LoopbackRemote::start(RemoteFaults::default(), BTreeMap::new(), 5).await.expect("remote");
    let prefix = format!("t-split-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let remote_url = remote.base_url();
    let args = ["--dynamodb-endpoint-url", &dynamodb_endpoint, "--remote-service-url", &remote_url];
    let up = Up::start_args(&endpoint, &prefix, &args, &[]).await;
    let startup = up.stdout();
    assert!(
        startup.contains(&format!(
            "against {endpoint} (DynamoDB at {dynamodb_endpoint}), prefix {prefix} (all 11 created)"
        )),
        "{startup}"
    );
    assert!(
        startup.contains(&format!("aws --endpoint-url {endpoint} sqs send-message --queue-url ")),
        "{startup}"
    );

    // Each client at its own service's endpoint, as an application's would be.
    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(&dynamodb_endpoint).build(),
    );
    let orders = sqs.get_queue_url().queue_name(format!("{prefix}-orders")).send().await.unwrap();
    let body = serde_json::json!({
        "order_id": "split-1", "customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 1}],
        "workflow": "single-step",
    });
    sqs.send_message()
        .queue_url(orders.queue_url().unwrap())
        .message_body(body.to_string())
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let item = dynamodb
            .get_item()
            .table_name(format!("{prefix}-state"))
            .key("order_id", AttributeValue::S("split-1".into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item;
        let state = item.and_then(|i| i.get("state").and_then(|s| s.as_s().ok()).cloned());
        if state.as_deref() == Some("Processed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "split-1 is {state:?} after 90 s\nstdout:\n{}\nstderr:\n{}",
            up.stdout(),
            up.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    up.interrupt();
    let (status, stdout, stderr) = up.finish(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(stdout.contains("stopped: 1 accepted, 1 processed"), "{stdout}");
    assert!(
        stdout.contains(&format!("--dynamodb-endpoint-url {dynamodb_endpoint} --prefix {prefix}")),
        "{stdout}"
    );

    let clients = sas::adapters::aws::Clients { dynamodb, sqs, sns: aws_sdk_sns::Client::new(&sdk) };
    let layout = sas::adapters::aws::provision::Layout::standard(&prefix);
    let all = sasctl::resources::existing(&clients, &layout).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
}
