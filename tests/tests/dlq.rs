//! The operator console's deployment discovery and `sasctl dlq` against the emulator:
//! a deployment found by its stack's outputs, by its prefix and by flags, with one line
//! for what is missing; DLQ messages listed and left in place; a dry run that moves
//! nothing; a redrive that moves every message back with its body intact.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use aws_sdk_sqs::types::MessageAttributeValue;
use sas::adapters::aws::provision::{self, Layout, Provisioned};
use sas_tests::{depth, endpoint, sdk_config, unique_prefix};
use sasctl::deployment::{DeploymentArgs, DeploymentError, Origin, WorkQueue};
use sasctl::dlq::{self, ListArgs, QueueArg, RedriveArgs};

async fn deployed(test: &str, endpoint: &str) -> (String, Provisioned) {
    let prefix = unique_prefix(test).to_lowercase();
    let sdk = sdk_config(endpoint).await;
    let made = provision::provision(&sdk, &Layout::standard(&prefix))
        .await
        .unwrap_or_else(|e| panic!("provisioning at {endpoint}: {e}"));
    (prefix, made)
}

fn at(endpoint: &str) -> DeploymentArgs {
    DeploymentArgs { endpoint_url: Some(endpoint.to_owned()), ..DeploymentArgs::default() }
}

/// A stack whose outputs are `outputs` (its one resource only makes it a stack).
async fn stack(endpoint: &str, name: &str, outputs: &[(&str, &str)]) {
    let outputs: serde_json::Map<String, serde_json::Value> =
        outputs.iter().map(|(k, v)| ((*k).to_owned(), serde_json::json!({ "Value": v }))).collect();
    let template = serde_json::json!({
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic", "Properties": {"TopicName": format!("{name}-t")}}},
        "Outputs": outputs,
    });
    let cfn = aws_sdk_cloudformation::Client::new(&sdk_config(endpoint).await);
    cfn.create_stack().stack_name(name).template_body(template.to_string()).send().await.unwrap_or_else(
        |e| panic!("creating stack {name}: {}", aws_sdk_cloudformation::error::DisplayErrorContext(e)),
    );
}

#[tokio::test]
async fn a_deployment_is_found_by_its_stack_its_prefix_or_flags() {
    let Some(endpoint) = endpoint("dlq_deployment") else { return };
    let (prefix, made) = deployed("dlq-deployment", &endpoint).await;

    let name = format!("{prefix}-stack");
    stack(
        &endpoint,
        &name,
        &[
            ("StateTableName", &made.tables.state),
            ("OrdersQueueUrl", &made.orders_queue),
            ("OrdersDlqUrl", &made.orders_dlq),
            ("SchedulerQueueUrl", &made.scheduler_queue),
            ("SchedulerDlqUrl", &made.scheduler_dlq),
            ("AgentQueueUrl", &made.agent_queue),
            ("AgentDlqUrl", &made.agent_dlq),
            ("CallbackQueueUrl", &made.callback_queue),
            ("CallbackDlqUrl", &made.callback_dlq),
            ("AlertTopicArn", &made.alert_topic_arn),
        ],
    )
    .await;
    let by_stack = DeploymentArgs { stack: Some(name.clone()), ..at(&endpoint) }.resolve().await.unwrap();
    let by_prefix = DeploymentArgs { prefix: Some(prefix.clone()), ..at(&endpoint) }.resolve().await.unwrap();
    assert_eq!(by_stack.origin(), &Origin::Stack(name.clone()));
    assert_eq!(by_prefix.origin(), &Origin::Prefix(prefix.clone()));
    for d in [&by_stack, &by_prefix] {
        assert_eq!(d.table(), Ok(made.tables.state.as_str()));
        assert_eq!(d.queue(WorkQueue::Orders), Ok(made.orders_queue.as_str()));
        assert_eq!(d.dlq(WorkQueue::Orders), Ok(made.orders_dlq.as_str()));
        assert_eq!(d.queue(WorkQueue::Scheduler), Ok(made.scheduler_queue.as_str()));
        assert_eq!(d.dlq(WorkQueue::Scheduler), Ok(made.scheduler_dlq.as_str()));
        assert_eq!(d.queue(WorkQueue::Agent), Ok(made.agent_queue.as_str()));
        assert_eq!(d.dlq(WorkQueue::Agent), Ok(made.agent_dlq.as_str()));
        assert_eq!(d.queue(WorkQueue::Callbacks), Ok(made.callback_queue.as_str()));
        assert_eq!(d.dlq(WorkQueue::Callbacks), Ok(made.callback_dlq.as_str()));
        assert_eq!(d.alert_topic_arn(), Ok(made.alert_topic_arn.as_str()));
    }
    assert_eq!(by_stack.caller_identity().await, Ok("arn:aws:sts::123456789012:user/moto".to_owned()));

    // A flag wins over the stack; a queue's DLQ comes from its redrive policy.
    let flags = DeploymentArgs {
        stack: Some(name.clone()),
        table: Some("other-state".into()),
        agent_queue: Some(made.orders_queue.clone()),
        ..at(&endpoint)
    };
    let d = flags.resolve().await.unwrap();
    assert_eq!(d.table(), Ok("other-state"));
    assert_eq!(d.dlq(WorkQueue::Agent), Ok(made.orders_dlq.as_str()));
    assert_eq!(d.dlq(WorkQueue::Scheduler), Ok(made.scheduler_dlq.as_str()));

    // --callback-queue: the callback DLQ from the queue's redrive policy.
    let flags = DeploymentArgs { callback_queue: Some(made.callback_queue.clone()), ..at(&endpoint) };
    assert_eq!(flags.resolve().await.unwrap().dlq(WorkQueue::Callbacks), Ok(made.callback_dlq.as_str()));

    // An older stack without some outputs: each missing one is named, with the fix.
    let old = format!("{prefix}-old");
    stack(&endpoint, &old, &[("OrdersQueueUrl", &made.orders_queue)]).await;
    let d = DeploymentArgs { stack: Some(old.clone()), ..at(&endpoint) }.resolve().await.unwrap();
    assert_eq!(d.queue(WorkQueue::Orders), Ok(made.orders_queue.as_str()));
    assert_eq!(
        d.dlq(WorkQueue::Callbacks).unwrap_err().to_string(),
        format!(
            "no callbacks DLQ: stack {old} has no output CallbackDlqUrl; deploy the current template.yaml (sam deploy), or give --callback-queue"
        )
    );
    assert_eq!(
        d.dlq(WorkQueue::Orders).unwrap_err().to_string(),
        format!(
            "no orders DLQ: stack {old} has no output OrdersDlqUrl; deploy the current template.yaml (sam deploy), or give --orders-queue"
        )
    );

    // No such stack: resolving fails, in one line naming the stack and the endpoint.
    let missing = DeploymentArgs { stack: Some(format!("{prefix}-none")), ..at(&endpoint) };
    let e = missing.resolve().await.unwrap_err();
    assert!(matches!(e, DeploymentError::NoSuchStack { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "stack {prefix}-none not found at {endpoint}: check --stack or SAS_STACK, and the region (AWS_REGION or the profile's)"
        )
    );

    // A prefix nothing was made under: each resource says which name it looked for.
    let d = DeploymentArgs { prefix: Some(format!("{prefix}-x")), ..at(&endpoint) }.resolve().await.unwrap();
    let e = d.queue(WorkQueue::Scheduler).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "no scheduler queue: queue {prefix}-x-scheduler does not exist at {endpoint}; check --prefix"
        )),
        "{e}"
    );
}

fn text(s: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder().data_type("String").string_value(s).build().unwrap()
}

#[tokio::test]
async fn dlq_messages_are_listed_in_place_and_redriven_with_their_bodies() {
    let Some(endpoint) = endpoint("dlq_redrive") else { return };
    let (prefix, made) = deployed("dlq-redrive", &endpoint).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk_config(&endpoint).await);
    // Three kept by a function (with a reason), two moved there by SQS (without).
    let mut bodies = BTreeSet::new();
    for i in 0..5 {
        let body = format!(r#"{{"order_id":"o-{i}","bad":true}}"#);
        let mut send = sqs.send_message().queue_url(&made.orders_dlq).message_body(&body);
        if i < 3 {
            send = send
                .message_attributes("sas-reason", text(&format!("not a valid message: {i}")))
                .message_attributes("sas-source", text(&made.orders_queue));
        }
        send.message_attributes("trace", text(&format!("t-{i}"))).send().await.unwrap();
        bodies.insert(body);
    }
    let deployment = DeploymentArgs { prefix: Some(prefix.clone()), ..at(&endpoint) };

    // Listed twice, by name and by URL: all five both times, so the first left them.
    for queue in [QueueArg::Work(WorkQueue::Orders), QueueArg::Url(made.orders_dlq.clone())] {
        let by_url = matches!(queue, QueueArg::Url(_));
        // A URL needs no deployment, only the endpoint.
        let deployment = if by_url { at(&endpoint) } else { deployment.clone() };
        let target = dlq::target(&queue, &deployment, false).await.unwrap();
        let (kept, not_released) = dlq::peek(&target, 50).await.unwrap();
        assert_eq!(not_released, 0);
        assert_eq!(kept.iter().map(|k| k.body.clone()).collect::<BTreeSet<_>>(), bodies);
        assert_eq!(kept.iter().filter(|k| k.reason.is_some()).count(), 3);
        assert!(kept.iter().all(|k| k.first_seen_ms.is_some_and(|t| t > 1_600_000_000_000)), "{kept:?}");
        let args = ListArgs { queue, limit: 50, json: true, deployment };
        assert_eq!(dlq::list(&args).await, Ok(ExitCode::SUCCESS));
    }
    // --limit stops early.
    let target = dlq::target(&QueueArg::Work(WorkQueue::Orders), &deployment, false).await.unwrap();
    assert_eq!(dlq::peek(&target, 2).await.unwrap().0.len(), 2);

    let redrive = |dry_run| RedriveArgs {
        queue: QueueArg::Work(WorkQueue::Orders),
        rate: 100,
        include_cancels: false,
        dry_run,
        limit: 50,
        json: true,
        deployment: deployment.clone(),
    };
    assert_eq!(dlq::redrive(&redrive(true)).await, Ok(ExitCode::SUCCESS));
    let target = dlq::target(&QueueArg::Work(WorkQueue::Orders), &deployment, true).await.unwrap();
    assert_eq!(target.visible, 5, "the dry run moved nothing");
    assert_eq!(depth(&sqs, &made.orders_queue).await, 0, "the dry run sent nothing");

    assert_eq!(dlq::redrive(&redrive(false)).await, Ok(ExitCode::SUCCESS));
    assert_eq!(depth(&sqs, &made.orders_dlq).await, 0, "the DLQ is empty");
    let mut back = BTreeMap::new();
    while back.len() < 5 {
        let out = sqs
            .receive_message()
            .queue_url(&made.orders_queue)
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        let messages = out.messages.unwrap_or_default();
        assert!(!messages.is_empty(), "only {} of 5 came back: {back:?}", back.len());
        for m in messages {
            let attributes: BTreeSet<String> = m.message_attributes.unwrap_or_default().into_keys().collect();
            back.insert(m.body.unwrap_or_default(), attributes);
        }
    }
    assert_eq!(back.keys().cloned().collect::<BTreeSet<_>>(), bodies, "bodies intact");
    for (body, attributes) in &back {
        // moto has no message move task: the fallback moved them and dropped the stale reason.
        assert_eq!(attributes, &BTreeSet::from(["trace".to_owned()]), "{body}");
    }

    // A DLQ that is empty: nothing to move, and still success.
    assert_eq!(dlq::redrive(&redrive(false)).await, Ok(ExitCode::SUCCESS));
    // A work queue is not a DLQ: reading it would count towards its redrive.
    let e = dlq::target(&QueueArg::Url(made.orders_queue.clone()), &at(&endpoint), false).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} is not a dead-letter queue (it has a redrive policy of its own): reading it would count towards moving its messages to its DLQ",
            made.orders_queue
        )
    );
}

/// The callback DLQ by its name: a refused completion is listed in place and redriven to
/// the callback queue with its body (and its token) whole.
#[tokio::test]
async fn a_refused_completion_is_listed_and_redriven_to_the_callback_queue() {
    let Some(endpoint) = endpoint("dlq_callbacks") else { return };
    let (prefix, made) = deployed("dlq-callbacks", &endpoint).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk_config(&endpoint).await);
    let body = format!(r#"{{"token":"sas1.o-1.0.1.{}","outcome":"success"}}"#, "ab".repeat(32));
    sqs.send_message()
        .queue_url(&made.callback_dlq)
        .message_body(&body)
        .message_attributes("sas-reason", text("callback refused: the step has ended"))
        .message_attributes("sas-source", text(&made.callback_queue))
        .send()
        .await
        .unwrap();
    let deployment = DeploymentArgs { prefix: Some(prefix), ..at(&endpoint) };
    let queue: QueueArg = "callbacks".parse().unwrap();
    let target = dlq::target(&queue, &deployment, true).await.unwrap();
    assert_eq!(target.source.as_ref().map(|s| s.url.as_str()), Some(made.callback_queue.as_str()));
    let (kept, _) = dlq::peek(&target, 10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0].body.as_str(), kept[0].reason.as_deref()),
        (body.as_str(), Some("callback refused: the step has ended"))
    );
    let redrive = RedriveArgs {
        queue,
        rate: 100,
        include_cancels: false,
        dry_run: false,
        limit: 50,
        json: true,
        deployment,
    };
    assert_eq!(dlq::redrive(&redrive).await, Ok(ExitCode::SUCCESS));
    assert_eq!(depth(&sqs, &made.callback_dlq).await, 0);
    let back =
        sqs.receive_message().queue_url(&made.callback_queue).wait_time_seconds(2).send().await.unwrap();
    assert_eq!(back.messages().iter().filter_map(|m| m.body()).collect::<Vec<_>>(), [body.as_str()]);
}
