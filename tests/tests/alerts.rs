//! The SNS alert adapter against the test endpoint: an alert published to the topic
//! reaches a subscribed queue with its JSON body (the alert and the `sasctl` command
//! that shows its task), a valid subject, and the order id, step and failure count as
//! message attributes operators can filter on.

use aws_sdk_sqs::types::QueueAttributeName;
use sas::adapters::aws::SnsAlerts;
use sas::adapters::aws::provision::{QueueSpec, create_queue, create_topic};
use sas::adapters::aws::sns::Deployment;
use sas::domain::{OperatorAlert, OrderId, ProcessState, Timestamp};
use sas::ports::{Alerts, QueueConsumer, QueueUrl};

#[tokio::test]
async fn alerts_arrive_with_body_and_attributes() {
    let Some(endpoint) = sas_tests::endpoint("alerts_arrive_with_body_and_attributes") else { return };
    let sdk = sas_tests::sdk_config(&endpoint).await;
    let prefix = sas_tests::unique_prefix("alerts");
    let sns = aws_sdk_sns::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let topic = create_topic(&sns, &format!("{prefix}-alerts")).await.expect("topic");
    let spec = QueueSpec { name: format!("{prefix}-ops"), visibility_timeout_s: 30, max_receives: None };
    let (queue, _) = create_queue(&sqs, &spec).await.expect("queue");
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("attributes")
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("queue ARN");
    // Raw delivery: the SQS message is the SNS message itself, attributes included.
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .expect("subscribe");

    let alert = OperatorAlert {
        order_id: OrderId::parse("o-alert-1").expect("valid"),
        workflow: "three-step".into(),
        step: 2,
        step_name: "ship-order".into(),
        state: ProcessState::Error,
        failure_count: 5,
        reason: "failure threshold reached; nothing undone: pivot step ship-order outcome unknown (idempotency key o-alert-1:2:do)".into(),
        idempotency_key: Some(sas::domain::IdempotencyKey("o-alert-1:2:do".into())),
        at: Timestamp(1_700_000_000_000),
    };
    let stack = Deployment::Stack("shop-prod".into());
    SnsAlerts::new(sns.clone(), topic.clone(), stack.clone()).raise(&alert).await.expect("published");

    let consumer = sas::adapters::aws::SqsQueues::new(sqs);
    let got = consumer.receive(&QueueUrl(queue), 10, 2_000).await.expect("receive");
    assert_eq!(got.len(), 1, "one alert delivered");
    let body: OperatorAlert = serde_json::from_str(&got[0].body).expect("the alert as JSON");
    assert_eq!(body, alert);
    let json: serde_json::Value = serde_json::from_str(&got[0].body).expect("JSON");
    assert_eq!(json["show"], "sasctl tasks show o-alert-1 --stack shop-prod", "{json}");
    let attr = |k: &str| got[0].attributes.get(k).map(String::as_str);
    assert_eq!(
        (attr("order_id"), attr("step"), attr("failure_count")),
        (Some("o-alert-1"), Some("2"), Some("5"))
    );

    let missing = SnsAlerts::new(sns, format!("{topic}-missing"), stack).raise(&alert).await;
    assert!(missing.is_err(), "publishing to a topic that does not exist is an error");
}
