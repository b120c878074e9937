//! The cold-start bench's events and its verdict on a run (structure only: no binary is
//! launched and nothing is timed here).

use std::path::Path;

use aws_lambda_events::event::sqs::SqsEvent;
use sas::domain::{AgentRequest, OrderRequest, SchedulerMessage, Workflows};
use sasctl::aws_stub::StubCall;
use sasctl::bench::{ColdStartCase, cold_start_case, judge};

fn body(case: &ColdStartCase) -> String {
    let event: SqsEvent = serde_json::from_str(&case.event).unwrap();
    assert_eq!(event.records.len(), 1);
    event.records[0].body.clone().unwrap()
}

#[test]
fn each_function_gets_a_valid_message_of_its_own() {
    let submission = cold_start_case(Path::new("target/lambda/submission"));
    assert_eq!(submission.function, Some("submission"));
    OrderRequest::parse(&body(&submission)).unwrap().validate(&Workflows::builtin()).unwrap();

    let scheduler = cold_start_case(Path::new("scheduler"));
    assert!(matches!(SchedulerMessage::parse(&body(&scheduler)).unwrap(), SchedulerMessage::Schedule { .. }));

    let agent = cold_start_case(Path::new("/x/agent"));
    let request = AgentRequest::parse(&body(&agent)).unwrap();
    let workflow = Workflows::builtin();
    // The agent refuses (keeps in its DLQ) any request the scheduler could not have sent.
    assert_eq!(request.check(&workflow), Ok(()));
    let step = &workflow.get(&request.workflow).unwrap().steps[request.step as usize];
    assert!(agent.required.iter().flatten().any(|c| c.ends_with(&format!("/{}/{}", step.agent, step.name))));

    let supervisor = cold_start_case(Path::new("supervisor"));
    let event: serde_json::Value = serde_json::from_str(&supervisor.event).unwrap();
    assert_eq!(event["detail-type"], "Scheduled Event");

    let other = cold_start_case(Path::new("something-else"));
    assert_eq!((other.function, other.required.len()), (None, 0));
}

fn call(label: &str, status: u16) -> StubCall {
    StubCall { call: label.into(), status }
}

#[test]
fn a_run_is_ok_only_with_a_success_and_every_required_call() {
    let case = cold_start_case(Path::new("scheduler"));
    let ok = (
        "/2018-06-01/runtime/invocation/req-1/response".to_owned(),
        r#"{"batchItemFailures":[]}"#.to_owned(),
    );
    let calls =
        [call("dynamodb GetItem bench-state", 200), call("sqs SendMessageBatch bench-scheduler-dlq x1", 200)];
    assert_eq!(judge(&case, Some(&ok), &calls), "ok");

    // A send to the scheduler's queue does not stand in for one to its DLQ.
    let wrong_queue =
        [call("dynamodb GetItem bench-state", 200), call("sqs SendMessageBatch bench-scheduler x1", 200)];
    assert!(judge(&case, Some(&ok), &wrong_queue).starts_with("missing call"));
    assert!(judge(&case, Some(&ok), &calls[..1]).starts_with("missing call"));

    let refused = [calls[0].clone(), call("unexpected AmazonSQS.Foo", 400)];
    assert!(judge(&case, Some(&ok), &refused).starts_with("refused"));

    let failed = (ok.0.clone(), r#"{"batchItemFailures":[{"itemIdentifier":"m"}]}"#.to_owned());
    assert_eq!(judge(&case, Some(&failed), &calls), "1 failed batch item(s)");

    let error = ("/2018-06-01/runtime/invocation/req-1/error".to_owned(), "boom".to_owned());
    assert!(judge(&case, Some(&error), &calls).starts_with("error response"));
    let init = ("/2018-06-01/runtime/init/error".to_owned(), "bad config".to_owned());
    assert!(judge(&case, Some(&init), &calls).starts_with("init error"));
    assert_eq!(judge(&case, None, &calls), "no response");

    let supervisor = cold_start_case(Path::new("supervisor"));
    let swept = (ok.0.clone(), r#"{"examined":0,"errors":1}"#.to_owned());
    assert!(judge(&supervisor, Some(&swept), &[call("dynamodb Query s/due", 200)]).contains("1 error"));
}
