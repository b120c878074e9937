//! The refusals of docs/BAD_INPUTS.md's "Security" table, each run through the real
//! handler in a batch between two good messages, with the rules a deployed function reads
//! from its configuration (SQS queue URLs, the status queue plus the extra ARNs, never
//! one of the deployment's own queues). The embedded queues are named by those URLs.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::FastRandom;
use sas::config::SubmissionConfig;
use sas::domain::{
    OrderId, OrderStatus, Policy, ReplyOutcome, SchedulerMessage, StatusUpdate, TaskRecord, Timestamp,
    Workflows,
};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchReport, DeadLetters, Deps, Inbound, REASON_ATTRIBUTE, Scheduler,
    Submission, run_batch,
};
use sas::ports::{Clock, Metric, QueueUrl, RemoteCall, RemoteError, RemoteService, StateStore};

const ACCOUNT: &str = "123456789012";
const START: u64 = 1_700_000_000_000;

fn url(name: &str) -> String {
    format!("https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/{name}")
}

/// A remote service that counts its calls and always succeeds.
#[derive(Default)]
struct CountingRemote(Mutex<u32>);

#[async_trait]
impl RemoteService for CountingRemote {
    async fn call(&self, _: &RemoteCall<'_>, _: u64) -> Result<Vec<u8>, RemoteError> {
        *self.0.lock().unwrap() += 1;
        Ok(Vec::new())
    }
}

struct World {
    clock: Arc<ManualClock>,
    queues: Arc<EmbeddedQueues>,
    store: Arc<EmbeddedStore>,
    metrics: Arc<CountingMetrics>,
    remote: Arc<CountingRemote>,
    submission: Submission,
    scheduler: Scheduler,
    agent: Agent,
}

impl World {
    fn new() -> World {
        let config = SubmissionConfig::from_lookup(&|name| {
            Some(match name {
                "STATE_TABLE" => "sas-state".to_owned(),
                "ORDERS_QUEUE_URL" => url("sas-orders"),
                "ORDERS_DLQ_URL" => url("sas-orders-dlq"),
                "SCHEDULER_QUEUE_URL" => url("sas-scheduler"),
                "SCHEDULER_DLQ_URL" => url("sas-scheduler-dlq"),
                "AGENT_QUEUE_URL" => url("sas-agent"),
                "AGENT_DLQ_URL" => url("sas-agent-dlq"),
                "STATUS_QUEUE_ARN" => format!("arn:aws:sqs:us-east-1:{ACCOUNT}:sas-status"),
                "REPLY_TO_EXTRA_QUEUE_ARNS" => "arn:aws:sqs:us-east-1:210987654321:app-status".to_owned(),
                "AWS_REGION" => "us-east-1".to_owned(),
                _ => return None,
            })
        })
        .expect("a valid configuration");
        let clock = Arc::new(ManualClock::at(START));
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 1));
        for q in [
            "sas-orders",
            "sas-orders-dlq",
            "sas-scheduler",
            "sas-scheduler-dlq",
            "sas-agent",
            "sas-agent-dlq",
        ] {
            queues.create(&url(q), QueueSettings::default());
        }
        for q in [url("sas-status"), "https://sqs.us-east-1.amazonaws.com/210987654321/app-status".to_owned()]
        {
            queues.create(&q, QueueSettings::default());
        }
        let store = Arc::new(EmbeddedStore::new());
        let metrics = Arc::new(CountingMetrics::default());
        let deps = Deps {
            store: store.clone(),
            queues: queues.clone(),
            alerts: Arc::new(RecordingAlerts::default()),
            clock: clock.clone(),
            random: Arc::new(FastRandom::seeded(1)),
            metrics: metrics.clone(),
        };
        let settings = sas::handlers::Settings::from_config(&config.state);
        let remote = Arc::new(CountingRemote::default());
        let agent = Agent::new(
            AgentDeps {
                queues: queues.clone(),
                clock: clock.clone(),
                random: Arc::new(FastRandom::seeded(2)),
                metrics: metrics.clone(),
                remote: remote.clone(),
                scheduler_queue: QueueUrl(url("sas-scheduler")),
                call_starts: Some(store.clone()),
            },
            AgentSettings::default(),
            Workflows::builtin(),
        );
        World {
            submission: Submission::new(deps.clone(), settings.clone()),
            scheduler: Scheduler::new(deps, settings),
            agent,
            clock,
            queues,
            store,
            metrics,
            remote,
        }
    }

    async fn batch<F, Fut>(&self, queue: &str, bodies: &[String], handle: F) -> BatchReport
    where
        F: Fn(Inbound) -> Fut,
        Fut: std::future::Future<Output = Result<(), sas::handlers::HandlerError>>,
    {
        let messages = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| Inbound {
                message_id: format!("m-{i}"),
                body: b.clone(),
                receive_count: 1,
                sender: None,
            })
            .collect();
        let dead_letters = DeadLetters {
            queues: self.queues.clone(),
            source: QueueUrl(url(queue)),
            dead_letter_queue: QueueUrl(url(&format!("{queue}-dlq"))),
            metrics: self.metrics.clone(),
        };
        run_batch(messages, &dead_letters, handle).await
    }

    fn kept(&self, queue: &str) -> Vec<String> {
        self.queues
            .drain(&url(&format!("{queue}-dlq")))
            .into_iter()
            .map(|m| m.attributes.get(REASON_ATTRIBUTE).cloned().unwrap_or_default())
            .collect()
    }

    fn statuses(&self, queue: &str) -> Vec<StatusUpdate> {
        self.queues.drain(queue).iter().map(|m| serde_json::from_str(&m.body).unwrap()).collect()
    }
}

fn order(id: &str, reply_to: &str) -> String {
    let reply_to = serde_json::to_string(reply_to).unwrap();
    format!(
        r#"{{"order_id":"{id}","customer_id":"c-1","items":[{{"sku":"A-1","quantity":1}}],"reply_to":{reply_to}}}"#
    )
}

/// One row of the table: a reply_to, and the reason its order is kept with.
struct ReplyToRow {
    kind: &'static str,
    reply_to: String,
    reason: &'static str,
}

fn reply_to_rows() -> Vec<ReplyToRow> {
    let row = |kind, reply_to: String, reason| ReplyToRow { kind, reply_to, reason };
    vec![
        row("reply_to that is not a URL", "not a queue url".into(), "reply_to is not an SQS queue URL"),
        row(
            "reply_to given as a queue ARN",
            format!("arn:aws:sqs:us-east-1:{ACCOUNT}:sas-status"),
            "reply_to is a queue ARN; give the queue's URL instead",
        ),
        row(
            "reply_to on a host that is not SQS",
            format!("https://sqs.us-east-1.amazonaws.com.evil.example/{ACCOUNT}/sas-status"),
            "reply_to is not an SQS queue URL",
        ),
        row(
            "reply_to over plain http",
            format!("http://sqs.us-east-1.amazonaws.com/{ACCOUNT}/sas-status"),
            "reply_to is not an SQS queue URL",
        ),
        row(
            "reply_to with userinfo or a query",
            format!("https://key:secret@sqs.us-east-1.amazonaws.com/{ACCOUNT}/sas-status?x=1"),
            "reply_to is not an SQS queue URL",
        ),
        row(
            "reply_to naming the scheduler queue",
            url("sas-scheduler"),
            "reply_to names one of this deployment's own queues",
        ),
        row(
            "reply_to naming the agent queue",
            url("sas-agent"),
            "reply_to names one of this deployment's own queues",
        ),
        row(
            "reply_to naming a DLQ (legacy URL form)",
            format!("https://us-east-1.queue.amazonaws.com/{ACCOUNT}/sas-orders-dlq"),
            "reply_to names one of this deployment's own queues",
        ),
        row(
            "reply_to naming a queue off the allow-list",
            url("someone-elses-queue"),
            "reply_to names a queue that is not on this deployment's reply_to allow-list",
        ),
    ]
}

#[tokio::test]
async fn a_refused_reply_to_keeps_the_order_with_its_reason_and_sends_nothing_there() {
    for row in reply_to_rows() {
        let w = World::new();
        let bodies = [
            order("good-1", &url("sas-status")),
            order("bad", &row.reply_to),
            order("good-2", &url("sas-status")),
        ];
        let report = w.batch("sas-orders", &bodies, |m| w.submission.handle(m)).await;
        assert_eq!(report.kept, 1, "{}", row.kind);
        assert!(report.failures.is_empty(), "{}", row.kind);
        let kept = w.kept("sas-orders");
        assert_eq!(kept.len(), 1, "{}", row.kind);
        assert!(kept[0].starts_with(&format!("invalid order: {}", row.reason)), "{}: {kept:?}", row.kind);
        assert!(w.store.task(&OrderId::parse("bad").unwrap()).await.unwrap().is_none(), "{}", row.kind);
        // Both good orders were accepted and heard `received`; the refused reply_to got
        // nothing, and no queue of the deployment got a status update.
        let statuses = w.statuses(&url("sas-status"));
        assert_eq!(
            statuses.iter().map(|s| s.status).collect::<Vec<_>>(),
            [OrderStatus::Received; 2],
            "{}",
            row.kind
        );
        assert_eq!(w.queues.depth(&url("sas-scheduler")), 2, "{}: two schedules, no status", row.kind);
        assert_eq!(w.queues.depth(&url("sas-agent")), 0, "{}", row.kind);
        assert_eq!(w.metrics.snapshot().count(Metric::OrderRejected), 1, "{}", row.kind);
    }
}

#[tokio::test]
async fn an_allowed_reply_to_hears_why_its_order_was_rejected() {
    let w = World::new();
    let extra = "https://sqs.us-east-1.amazonaws.com/210987654321/app-status";
    let bad = r#"{"order_id":"o-1","customer_id":"c","items":[],"reply_to":"REPLY"}"#.replace("REPLY", extra);
    let report = w.batch("sas-orders", &[bad], |m| w.submission.handle(m)).await;
    assert_eq!(report.kept, 1);
    let statuses = w.statuses(extra);
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].status, OrderStatus::Rejected);
    assert_eq!(statuses[0].reason.as_deref(), Some("invalid order: items is empty"));
}

#[tokio::test]
async fn every_send_checks_reply_to_again() {
    // A record accepted under other rules (or written by hand) names the scheduler queue:
    // the scheduler's status updates for it are not sent there.
    let w = World::new();
    let order = sas::domain::OrderRequest::parse(&order("o-1", &url("sas-status")))
        .unwrap()
        .validate(&Workflows::builtin())
        .unwrap()
        .0;
    let task = TaskRecord::new(&order, Some(url("sas-scheduler")), Timestamp(START), &Policy::default());
    w.store.insert(&task).await.unwrap();
    let schedule = r#"{"type":"schedule","order_id":"o-1"}"#.to_owned();
    w.batch("sas-scheduler", &[schedule], |m| w.scheduler.handle(m)).await;
    let requests = w.queues.drain(&url("sas-agent"));
    assert_eq!(requests.len(), 1, "the task was claimed and dispatched");
    let report = w.batch("sas-agent", &[requests[0].body.clone()], |m| w.agent.handle(m)).await;
    assert_eq!(report, BatchReport::default());
    let replies = w.queues.drain(&url("sas-scheduler"));
    w.batch("sas-scheduler", &[replies[0].body.clone()], |m| w.scheduler.handle(m)).await;
    assert_eq!(
        w.store.task(&OrderId::parse("o-1").unwrap()).await.unwrap().unwrap().state().as_str(),
        "Processed"
    );
    assert_eq!(
        w.queues.depth(&url("sas-scheduler")),
        0,
        "no `processed` status landed in the scheduler queue"
    );
    assert_eq!(w.queues.depth(&url("sas-scheduler-dlq")), 0);
}

fn agent_request(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v = serde_json::json!({
        "order_id": "o-1", "workflow": "three-step", "step": 1, "step_name": "charge-payment",
        "agent": "payment", "action": "do", "attempt": 1, "lease": "3f2a6c1e-9b7d-4e2a-8c5f-1d2e3f4a5b6c",
        "complete_by": START + 30_000, "idempotency_key": "o-1:1:do",
        "order": {"order_id": "o-1", "customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 1}], "workflow": "three-step"}
    });
    edit(&mut v);
    v.to_string()
}

#[tokio::test]
async fn agent_requests_that_do_not_match_their_workflow_are_kept_uncalled() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let rows: Vec<(&str, Edit, &str)> = vec![
        (
            "unknown workflow",
            Box::new(|v| v["workflow"] = "four-step".into()),
            "agent request names unknown workflow \"four-step\"",
        ),
        (
            "step past the workflow's end",
            Box::new(|v| v["step"] = 7.into()),
            "agent request names step 7, which workflow three-step does not have",
        ),
        (
            "another agent",
            Box::new(|v| v["agent"] = "admin".into()),
            "names agent \"admin\"; the workflow has \"payment\"",
        ),
        (
            "a step name with a path",
            Box::new(|v| v["step_name"] = "../admin/delete".into()),
            "names step_name \"../admin/delete\"",
        ),
        (
            "an undo under the forward name",
            Box::new(|v| {
                v["action"] = "undo".into();
                v["idempotency_key"] = "o-1:1:undo".into();
            }),
            "names step_name \"charge-payment\"; the workflow has \"refund-payment\"",
        ),
        (
            "an undo of a pivot, which has no compensation",
            Box::new(|v| {
                v["step"] = 2.into();
                v["agent"] = "shipping".into();
                v["step_name"] = "ship-order".into();
                v["action"] = "undo".into();
                v["idempotency_key"] = "o-1:2:undo".into();
            }),
            "agent request undoes step 2 of three-step, which has no compensation",
        ),
        (
            "a forged idempotency key",
            Box::new(|v| v["idempotency_key"] = "o-2:1:do".into()),
            "agent request's idempotency_key does not match",
        ),
        (
            "an order that is not its own",
            Box::new(|v| v["order"]["order_id"] = "o-2".into()),
            "agent request's order does not match",
        ),
    ];
    for (kind, edit, reason) in rows {
        let w = World::new();
        let bodies = [agent_request(|_| {}), agent_request(edit), agent_request(|_| {})];
        let report = w.batch("sas-agent", &bodies, |m| w.agent.handle(m)).await;
        assert_eq!((report.kept, report.failures.len()), (1, 0), "{kind}");
        let kept = w.kept("sas-agent");
        assert!(kept[0].contains(reason), "{kind}: {kept:?}");
        assert_eq!(*w.remote.0.lock().unwrap(), 2, "{kind}: only the good requests were called");
    }
}

#[tokio::test]
async fn complete_by_is_clamped_to_the_invocations_deadline() {
    let w = World::new();
    // The request claims 30 s, the invocation has 1.5 s left: less than the reply margin,
    // so the agent calls nothing and replies nothing (the supervisor owns the task).
    let deadline = Timestamp(START + 1_500);
    let message =
        Inbound { message_id: "m".into(), body: agent_request(|_| {}), receive_count: 1, sender: None };
    w.agent.handle_until(message.clone(), Some(deadline)).await.unwrap();
    assert_eq!(*w.remote.0.lock().unwrap(), 0);
    assert_eq!(w.queues.depth(&url("sas-scheduler")), 0);
    assert_eq!(w.metrics.snapshot().count(Metric::AgentGaveUp), 1);
    // With time left before the deadline, it calls and replies.
    w.agent.handle_until(message, Some(Timestamp(START + 10_000))).await.unwrap();
    assert_eq!(*w.remote.0.lock().unwrap(), 1);
    assert_eq!(w.queues.depth(&url("sas-scheduler")), 1);
}

// ---------------------------------------------------------------- agents' auth (issue 24, finding 3)

/// A secret store holding one value, which a test rotates; counts its reads.
#[derive(Default)]
struct OneSecret {
    value: Mutex<String>,
    reads: Mutex<u32>,
}

#[async_trait]
impl sas::ports::Secrets for OneSecret {
    async fn get(
        &self,
        _: &sas::domain::SecretSource,
    ) -> Result<sas::domain::SecretValue, sas::ports::SecretError> {
        *self.reads.lock().unwrap() += 1;
        Ok(sas::domain::SecretValue::new(self.value.lock().unwrap().clone()))
    }
}

/// A loopback service: `/payment/...` answers 200 to `Authorization: Bearer <accepted>`
/// and 401 to anything else, `/shipping/...` always 401 (it asks for no auth: a refusal of
/// the step), the rest 200. Returns its base URL and the paths called.
async fn serve_auth(accepted: Arc<Mutex<String>>) -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let called = Arc::new(Mutex::new(Vec::new()));
    let kept = called.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (kept, accepted) = (kept.clone(), accepted.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request).to_ascii_lowercase();
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let token = format!("\r\nauthorization: bearer {}\r\n", accepted.lock().unwrap());
                let ok = match path.split('/').nth(1) {
                    Some("payment") => head.contains(&token),
                    Some("shipping") => false,
                    _ => true,
                };
                kept.lock().unwrap().push(path);
                let answer: &[u8] = if ok {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                };
                let _ = socket.write_all(answer).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, called)
}

/// The world's agent, calling `base` over HTTP with payment's auth from `secrets`, aged by
/// the world's clock. Auth to a loopback http service is refused by `Definitions::parse`
/// (a secret goes only over https): parsed unchecked, to run the handler against a local
/// service.
fn agent_with_auth(w: &World, base: &str, secrets: Arc<OneSecret>) -> Agent {
    let text = format!(
        r#"{{"agents": {{"payment": {{"url": "{base}/payment", "auth": {{"header": "Authorization", "secret": "ssm:/sas/pay", "prefix": "Bearer "}}}},
            "inventory": {{"url": "{base}/inventory"}}, "shipping": {{"url": "{base}/shipping"}}}},
          "workflows": []}}"#
    );
    let agents = sas::domain::definitions::DefinitionFile::parse(&text).unwrap().agents;
    let remote = sas::adapters::http_remote::HttpRemote::new(base)
        .with_agents(&agents)
        .with_secrets(secrets)
        .with_clock(w.clock.clone());
    Agent::new(
        AgentDeps {
            queues: w.queues.clone(),
            clock: w.clock.clone(),
            random: Arc::new(FastRandom::seeded(2)),
            metrics: w.metrics.clone(),
            remote: Arc::new(remote),
            scheduler_queue: QueueUrl(url("sas-scheduler")),
            call_starts: None,
        },
        AgentSettings::default(),
        Workflows::builtin(),
    )
}

/// Step `step` of three-step for order `id`, due 30 s from the world's now.
fn step_request(w: &World, id: &str, step: u32) -> String {
    let (agent, name) =
        [("inventory", "reserve-inventory"), ("payment", "charge-payment"), ("shipping", "ship-order")]
            [step as usize];
    let complete_by = w.clock.now().plus_ms(30_000).0;
    agent_request(|v| {
        v["order_id"] = id.into();
        v["order"]["order_id"] = id.into();
        v["step"] = step.into();
        v["agent"] = agent.into();
        v["step_name"] = name.into();
        v["idempotency_key"] = format!("{id}:{step}:do").into();
        v["complete_by"] = complete_by.into();
    })
}

/// Runs payment's request for `id` between two inventory requests that succeed, and
/// returns the outcome each sent back, by order id.
async fn auth_batch(w: &World, agent: &Agent, id: &str) -> std::collections::BTreeMap<String, ReplyOutcome> {
    let bodies = [step_request(w, "o-good-1", 0), step_request(w, id, 1), step_request(w, "o-good-2", 0)];
    let report = w.batch("sas-agent", &bodies, |m| agent.handle(m)).await;
    assert_eq!((report.kept, report.failures.len()), (0, 0));
    w.queues
        .drain(&url("sas-scheduler"))
        .iter()
        .map(|m| match SchedulerMessage::parse(&m.body).unwrap() {
            SchedulerMessage::Reply(r) => (r.order_id.as_str().to_owned(), r.outcome),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_rotated_secret_is_read_again_and_the_call_retried_once() {
    let w = World::new();
    let accepted = Arc::new(Mutex::new("v1".to_owned()));
    let (base, called) = serve_auth(accepted.clone()).await;
    let secrets = Arc::new(OneSecret { value: Mutex::new("v1".into()), ..OneSecret::default() });
    let agent = agent_with_auth(&w, &base, secrets.clone());
    let succeeded = ReplyOutcome::Succeeded { output: None };
    let count = |m| w.metrics.snapshot().count(m);

    let replies = auth_batch(&w, &agent, "o-1").await;
    assert!(replies.len() == 3 && replies.values().all(|o| *o == succeeded), "{replies:?}");

    // Rotated in the store and at the service while the value is still fresh: the first
    // call is refused, the value read afresh, and the one retry succeeds.
    *secrets.value.lock().unwrap() = "v2".into();
    *accepted.lock().unwrap() = "v2".into();
    let replies = auth_batch(&w, &agent, "o-2").await;
    assert!(replies.len() == 3 && replies.values().all(|o| *o == succeeded), "{replies:?}");
    assert_eq!((count(Metric::AuthRetry), count(Metric::AuthRefused)), (1, 0));
    assert_eq!(*secrets.reads.lock().unwrap(), 2);
    let payment_calls = || called.lock().unwrap().iter().filter(|p| p.starts_with("/payment/")).count();
    assert_eq!(payment_calls(), 3, "one call, then one refused and its retry");

    // Rotated again, and the TTL passes before the next call: read again without a refusal.
    *secrets.value.lock().unwrap() = "v3".into();
    *accepted.lock().unwrap() = "v3".into();
    w.clock.advance(sas::domain::SECRET_TTL_MS);
    let replies = auth_batch(&w, &agent, "o-3").await;
    assert!(replies.values().all(|o| *o == succeeded), "{replies:?}");
    assert_eq!((count(Metric::AuthRetry), count(Metric::AuthRefused)), (1, 0), "no refusal this time");
    assert_eq!((*secrets.reads.lock().unwrap(), payment_calls()), (3, 4));
}

#[tokio::test]
async fn credentials_refused_again_after_a_fresh_read_are_a_refusal_and_raise_the_alarm() {
    let w = World::new();
    let (base, called) = serve_auth(Arc::new(Mutex::new("right".to_owned()))).await;
    let secrets = Arc::new(OneSecret { value: Mutex::new("wrong".into()), ..OneSecret::default() });
    let agent = agent_with_auth(&w, &base, secrets.clone());

    let replies = auth_batch(&w, &agent, "o-1").await;
    assert_eq!(
        replies["o-1"],
        ReplyOutcome::Failed {
            reason: "the remote service refused the agent's credentials (HTTP 4xx)".into(),
            detail: Some(format!(
                "{base}/payment/charge-payment answered 401 Unauthorized to the agent's credentials"
            )),
        }
    );
    assert_eq!(replies["o-good-1"], ReplyOutcome::Succeeded { output: None });
    assert_eq!(replies["o-good-2"], ReplyOutcome::Succeeded { output: None });
    let m = w.metrics.snapshot();
    assert_eq!((m.count(Metric::AuthRetry), m.count(Metric::AuthRefused)), (1, 1));
    assert_eq!(*secrets.reads.lock().unwrap(), 2, "read, refused, read afresh, refused: no more");
    assert_eq!(called.lock().unwrap().iter().filter(|p| p.starts_with("/payment/")).count(), 2);

    // An agent that sends no auth: its 401 is the service refusing the step, at once.
    let body = step_request(&w, "o-9", 2);
    agent.handle(Inbound { message_id: "m".into(), body, receive_count: 1, sender: None }).await.unwrap();
    let reply = w.queues.drain(&url("sas-scheduler")).pop().unwrap();
    let SchedulerMessage::Reply(reply) = SchedulerMessage::parse(&reply.body).unwrap() else { panic!() };
    assert!(
        matches!(&reply.outcome, ReplyOutcome::Failed { reason, .. } if reason == "the remote service refused (HTTP 4xx)"),
        "{reply:?}"
    );
    assert_eq!(called.lock().unwrap().iter().filter(|p| p.starts_with("/shipping/")).count(), 1);
    assert_eq!(w.metrics.snapshot().count(Metric::AuthRetry), 1, "no retry without auth");
}
