//! Bad input, kind by kind, through the real handlers on the embedded backend: what each
//! parser says, and what the handler does with the message (kept in its queue's DLQ with
//! a `sas-reason`, or dropped as harmless), without failing the rest of its batch.
//! Every row of docs/BAD_INPUTS.md is one test here; `bad_input_table` prints the table.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use async_trait::async_trait;
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
    StoredMessage,
};
use sas::adapters::system::FastRandom;
use sas::domain::{MAX_BODY_BYTES, ProcessState, Workflows};
use sas::handlers::{
    Agent, AgentDeps, AgentSettings, BatchReport, DeadLetters, Deps, Inbound, REASON_ATTRIBUTE, Scheduler,
    Settings, Submission, Topology, run_batch,
};
use sas::ports::{Metric, Outgoing, QueueUrl, Queues, RemoteCall, RemoteError, RemoteService, StateStore};

/// Drives a future whose ports never wait (the embedded backend) to its end.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// A remote service that answers every call 2xx with the body a row sets (empty unless
/// set).
#[derive(Default)]
struct Answers(std::sync::Mutex<Vec<u8>>);

#[async_trait]
impl RemoteService for Answers {
    async fn call(&self, _: &RemoteCall<'_>, _: u64) -> Result<Vec<u8>, RemoteError> {
        Ok(self.0.lock().unwrap().clone())
    }
}

/// JSON nested `levels` deep: `{"a":{"a":...1...}}`.
fn nested(levels: usize) -> String {
    format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels))
}

struct World {
    /// The `SenderId` the row's bad message arrives with (none unless the row sets one).
    bad_sender: std::cell::RefCell<Option<&'static str>>,
    queues: Arc<EmbeddedQueues>,
    store: Arc<EmbeddedStore>,
    metrics: Arc<CountingMetrics>,
    submission: Submission,
    scheduler: Scheduler,
    agent: Agent,
    remote: Arc<Answers>,
}

const LEASE: &str = "3f2a6c1e-9b7d-4e2a-8c5f-1d2e3f4a5b6c";

fn order(id: &str) -> String {
    format!(
        r#"{{"order_id":"{id}","customer_id":"c-1","items":[{{"sku":"A-1","quantity":1}}],"reply_to":"status"}}"#
    )
}

fn agent_request(order_id: &str, complete_by: u64) -> String {
    format!(
        r#"{{"order_id":"{order_id}","workflow":"single-step","step":0,"step_name":"process-order","agent":"orders","action":"do","attempt":1,"lease":"{LEASE}","complete_by":{complete_by},"idempotency_key":"{order_id}:0:do","order":{{"order_id":"{order_id}","customer_id":"c-1","items":[{{"sku":"A-1","quantity":1}}],"workflow":"single-step"}}}}"#
    )
}

fn reply(order_id: &str, lease: &str, outcome: &str) -> String {
    format!(
        r#"{{"type":"reply","order_id":"{order_id}","step":0,"action":"do","attempt":1,"lease":"{lease}","outcome":{outcome}}}"#
    )
}

impl World {
    fn new() -> World {
        let clock = Arc::new(ManualClock::at(1_700_000_000_000));
        let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 1));
        for q in ["orders", "orders-dlq", "scheduler", "scheduler-dlq", "agent", "agent-dlq", "status"] {
            queues.create(q, QueueSettings::default());
        }
        let store = Arc::new(EmbeddedStore::new());
        let metrics = Arc::new(CountingMetrics::default());
        let remote = Arc::new(Answers::default());
        let deps = Deps {
            store: store.clone(),
            queues: queues.clone(),
            alerts: Arc::new(RecordingAlerts::default()),
            clock: clock.clone(),
            random: Arc::new(FastRandom::seeded(1)),
            metrics: metrics.clone(),
        };
        let settings = Settings::new(
            sas::domain::Policy::default(),
            Workflows::builtin(),
            Topology::new(QueueUrl("scheduler".into()), QueueUrl("agent".into())),
            sas::adapters::embedded::queue_names::reply_to_rules(),
        );
        let agent = Agent::new(
            AgentDeps {
                queues: queues.clone(),
                clock,
                random: Arc::new(FastRandom::seeded(2)),
                metrics: metrics.clone(),
                remote: remote.clone(),
                scheduler_queue: QueueUrl("scheduler".into()),
                call_starts: Some(store.clone()),
            },
            AgentSettings::default(),
            settings.workflows.clone(),
        );
        World {
            bad_sender: Default::default(),
            submission: Submission::new(deps.clone(), settings.clone()),
            scheduler: Scheduler::new(deps, settings),
            agent,
            queues,
            store,
            metrics,
            remote,
        }
    }

    /// One batch of `bodies` through `queue`'s handler, as Lambda's event source mapping runs it.
    fn batch(&self, queue: &str, bodies: &[String]) -> BatchReport {
        let sent: Vec<(String, Option<&str>)> = bodies.iter().map(|b| (b.clone(), None)).collect();
        self.batch_from(queue, &sent)
    }

    /// [`World::batch`] of messages each with its SQS `SenderId`.
    fn batch_from(&self, queue: &str, sent: &[(String, Option<&str>)]) -> BatchReport {
        let messages: Vec<Inbound> = sent
            .iter()
            .enumerate()
            .map(|(i, (b, sender))| Inbound {
                message_id: format!("m-{i}"),
                body: b.clone(),
                receive_count: 1,
                sender: sender.map(str::to_owned),
            })
            .collect();
        let dead_letters = DeadLetters {
            queues: self.queues.clone(),
            source: QueueUrl(queue.into()),
            dead_letter_queue: QueueUrl(format!("{queue}-dlq")),
            metrics: self.metrics.clone(),
        };
        block_on(async {
            match queue {
                "orders" => run_batch(messages, &dead_letters, |m| self.submission.handle(m)).await,
                "scheduler" => run_batch(messages, &dead_letters, |m| self.scheduler.handle(m)).await,
                "agent" => run_batch(messages, &dead_letters, |m| self.agent.handle(m)).await,
                _ => unreachable!(),
            }
        })
    }

    /// An accepted, claimed order `id` with its agent request waiting.
    fn claimed(&self, id: &str) {
        self.claimed_from(id, None);
    }

    /// [`World::claimed`], the order sent by `sender` (an SQS `SenderId`).
    fn claimed_from(&self, id: &str, sender: Option<&str>) {
        let report = self.batch_from("orders", &[(order(id), sender)]);
        assert_eq!(report, BatchReport::default());
        let schedule = self.drain("scheduler");
        let report = self.batch("scheduler", &[schedule[0].body.clone()]);
        assert_eq!(report, BatchReport::default());
        self.drain("agent");
        self.drain("status");
    }

    /// The lease of `id`'s live attempt.
    fn lease(&self, id: &str) -> String {
        let task = self.store.tasks().into_iter().find(|t| t.order_id.as_str() == id).unwrap();
        task.locked_by().expect("claimed").to_string()
    }

    fn drain(&self, queue: &str) -> Vec<StoredMessage> {
        self.queues.drain(queue)
    }
}

/// What a bad input must get.
#[derive(Debug, Clone, Copy)]
enum Gets {
    /// Kept in the queue's DLQ with a reason containing this, the rest of its batch handled.
    Kept(&'static str),
    /// Handled and dropped, changing nothing: counted as this metric.
    Dropped(Metric),
    /// Handled: order o-1 gives up its step in doubt, its `failed` status giving a
    /// reason containing this.
    GivesUp(&'static str),
    /// Handled: the agent replies `bad_output` for o-1 with a reason containing this.
    RepliesBadOutput(&'static str),
}

struct Row {
    kind: &'static str,
    queue: &'static str,
    /// Prepares the world and returns the body.
    body: fn(&World) -> String,
    gets: Gets,
}

fn items(n: usize) -> String {
    vec![r#"{"sku":"A","quantity":1}"#; n].join(",")
}

const ROWS: &[Row] = &[
    Row {
        kind: "malformed JSON (truncated)",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"#.into(),
        gets: Gets::Kept("not a valid message"),
    },
    Row {
        kind: "empty body",
        queue: "orders",
        body: |_| String::new(),
        gets: Gets::Kept("not a valid message"),
    },
    Row {
        kind: "JSON that is not an object (a string)",
        queue: "orders",
        body: |_| r#""o-1""#.into(),
        gets: Gets::Kept("invalid type: string \"o-1\", expected struct OrderRequest"),
    },
    Row {
        kind: "JSON array with the wrong shape",
        queue: "orders",
        body: |_| "[1,2,3]".into(),
        gets: Gets::Kept("invalid type: integer `1`, expected a string"),
    },
    Row {
        kind: "an order in positional form (an array of its fields)",
        queue: "orders",
        body: |_| r#"["o-9","c",[["A",1]]]"#.into(),
        gets: Gets::Kept("must be a JSON object, not an array"),
    },
    Row {
        kind: "items in positional form",
        queue: "orders",
        body: |_| r#"{"order_id":"o-9","customer_id":"c","items":[["A",1]]}"#.into(),
        gets: Gets::Kept("items must be JSON objects"),
    },
    Row {
        kind: "missing field",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","items":[{"sku":"A","quantity":1}]}"#.into(),
        gets: Gets::Kept("missing field `customer_id`"),
    },
    Row {
        kind: "extra (unknown) field",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1}],"colour":"red"}"#.into()
        },
        gets: Gets::Kept("unknown field `colour`"),
    },
    Row {
        kind: "misspelt optional field (`reply-to`)",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1}],"reply-to":"q"}"#.into()
        },
        gets: Gets::Kept("unknown field `reply-to`"),
    },
    Row {
        kind: "duplicate key",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","order_id":"o-2","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#
                .into()
        },
        gets: Gets::Kept("duplicate field `order_id`"),
    },
    Row {
        kind: "wrong type (quantity as a string)",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":"2"}]}"#.into(),
        gets: Gets::Kept("invalid type: string"),
    },
    Row {
        kind: "null for a required field",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":null,"items":[{"sku":"A","quantity":1}]}"#.into(),
        gets: Gets::Kept("invalid type: null"),
    },
    Row {
        kind: "negative quantity",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":-1}]}"#.into(),
        gets: Gets::Kept("invalid value: integer `-1`"),
    },
    Row {
        kind: "fractional quantity",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1.5}]}"#.into(),
        gets: Gets::Kept("invalid type: floating point"),
    },
    Row {
        kind: "quantity past u32",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":4294967296}]}"#.into()
        },
        gets: Gets::Kept("invalid value: integer `4294967296`"),
    },
    Row {
        kind: "zero quantity",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":0}]}"#.into(),
        gets: Gets::Kept("quantity is 0"),
    },
    Row {
        kind: "quantity over the limit",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":10001}]}"#.into(),
        gets: Gets::Kept("it must be 1 to 10000"),
    },
    Row {
        kind: "no items",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[]}"#.into(),
        gets: Gets::Kept("items is empty"),
    },
    Row {
        kind: "too many items (101)",
        queue: "orders",
        body: |_| format!(r#"{{"order_id":"o-1","customer_id":"c","items":[{}]}}"#, items(101)),
        gets: Gets::Kept("at most 100 are allowed"),
    },
    Row {
        kind: "invalid order id (characters)",
        queue: "orders",
        body: |_| r#"{"order_id":"o/1 x","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#.into(),
        gets: Gets::Kept("only ASCII letters"),
    },
    Row {
        kind: "empty order id",
        queue: "orders",
        body: |_| r#"{"order_id":"","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#.into(),
        gets: Gets::Kept("order_id is empty"),
    },
    Row {
        kind: "order id too long (65)",
        queue: "orders",
        body: |_| {
            format!(
                r#"{{"order_id":"{}","customer_id":"c","items":[{{"sku":"A","quantity":1}}]}}"#,
                "a".repeat(65)
            )
        },
        gets: Gets::Kept("at most 64 are allowed"),
    },
    Row {
        kind: "blank customer id",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"   ","items":[{"sku":"A","quantity":1}]}"#.into(),
        gets: Gets::Kept("customer_id is empty"),
    },
    Row {
        kind: "text field too long (65 characters)",
        queue: "orders",
        body: |_| {
            format!(
                r#"{{"order_id":"o-1","customer_id":"{}","items":[{{"sku":"A","quantity":1}}]}}"#,
                "é".repeat(65)
            )
        },
        gets: Gets::Kept("longer than 64 characters"),
    },
    Row {
        kind: "control characters in a field",
        queue: "orders",
        body: |_| r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A\u0000B","quantity":1}]}"#.into(),
        gets: Gets::Kept("contains control characters"),
    },
    Row {
        kind: "unknown workflow",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1}],"workflow":"four-step"}"#.into()
        },
        gets: Gets::Kept("unknown workflow \"four-step\""),
    },
    Row {
        kind: "empty reply_to",
        queue: "orders",
        body: |_| {
            r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":1}],"reply_to":" "}"#.into()
        },
        gets: Gets::Kept("reply_to must be a queue URL"),
    },
    Row {
        kind: "oversized body (over 256 KiB)",
        queue: "orders",
        body: |_| {
            format!(
                r#"{{"order_id":"o-1","customer_id":"c","items":[{{"sku":"A","quantity":1}}],"pad":"{}"}}"#,
                "x".repeat(MAX_BODY_BYTES)
            )
        },
        gets: Gets::Kept("at most 262144 are accepted"),
    },
    Row {
        kind: "deeply nested JSON (100 000 levels)",
        queue: "orders",
        body: |_| format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        gets: Gets::Kept("invalid type: sequence"),
    },
    Row {
        kind: "a different payload under an existing order id",
        queue: "orders",
        body: |w| {
            w.claimed("o-1");
            r#"{"order_id":"o-1","customer_id":"someone-else","items":[{"sku":"A","quantity":9}]}"#.into()
        },
        gets: Gets::Kept("already exists with a different payload"),
    },
    Row {
        kind: "unknown message type",
        queue: "scheduler",
        body: |_| r#"{"type":"launch","order_id":"o-1"}"#.into(),
        gets: Gets::Kept("unknown variant `launch`"),
    },
    Row {
        kind: "message without its type tag",
        queue: "scheduler",
        body: |_| r#"{"order_id":"o-1"}"#.into(),
        gets: Gets::Kept("missing field `type`"),
    },
    Row {
        kind: "schedule for an unknown order",
        queue: "scheduler",
        body: |_| r#"{"type":"schedule","order_id":"o-404"}"#.into(),
        gets: Gets::Kept("schedule for unknown order o-404"),
    },
    Row {
        kind: "reply for an unknown order",
        queue: "scheduler",
        body: |_| reply("o-404", LEASE, r#"{"status":"succeeded"}"#),
        gets: Gets::Kept("reply for unknown order o-404"),
    },
    Row {
        kind: "reply with a lease that is not a UUID",
        queue: "scheduler",
        body: |_| reply("o-1", "not-a-uuid", r#"{"status":"succeeded"}"#),
        gets: Gets::Kept("UUID parsing failed"),
    },
    Row {
        kind: "reply with an unknown outcome",
        queue: "scheduler",
        body: |_| reply("o-1", LEASE, r#"{"status":"maybe"}"#),
        gets: Gets::Kept("unknown variant `maybe`"),
    },
    Row {
        kind: "reply with a negative attempt",
        queue: "scheduler",
        body: |_| {
            reply("o-1", LEASE, r#"{"status":"succeeded"}"#).replace(r#""attempt":1"#, r#""attempt":-1"#)
        },
        gets: Gets::Kept("invalid value: integer `-1`"),
    },
    Row {
        kind: "stale reply (another lease) for a live order",
        queue: "scheduler",
        body: |w| {
            w.claimed("o-1");
            reply("o-1", LEASE, r#"{"status":"succeeded"}"#)
        },
        gets: Gets::Dropped(Metric::StaleReply),
    },
    Row {
        kind: "agent request with missing fields",
        queue: "agent",
        body: |_| r#"{"order_id":"o-1","step":0}"#.into(),
        gets: Gets::Kept("missing field `workflow`"),
    },
    Row {
        kind: "agent request with an unknown action",
        queue: "agent",
        body: |_| agent_request("o-1", 1_700_000_030_000).replace(r#""action":"do""#, r#""action":"redo""#),
        gets: Gets::Kept("unknown variant `redo`"),
    },
    Row {
        kind: "agent request past its complete-by",
        queue: "agent",
        body: |_| agent_request("o-1", 1_000),
        gets: Gets::Dropped(Metric::AgentGaveUp),
    },
    Row {
        kind: "`reply_to` over 2,048 characters",
        queue: "orders",
        body: |_| {
            let long = format!("status{}", "x".repeat(2_048));
            format!(
                r#"{{"order_id":"o-1","customer_id":"c","items":[{{"sku":"A","quantity":1}}],"reply_to":"{long}"}}"#
            )
        },
        gets: Gets::Kept("reply_to must be a queue URL"),
    },
    Row {
        kind: "forged `schedule` for an order whose step is running",
        queue: "scheduler",
        body: |w| {
            w.claimed("o-1");
            r#"{"type":"schedule","order_id":"o-1"}"#.into()
        },
        gets: Gets::Dropped(Metric::ClaimLost),
    },
    Row {
        kind: "a queue worker's fenced reply whose output nests 40 levels",
        queue: "scheduler",
        body: |w| {
            w.claimed("o-1");
            let outcome = format!(r#"{{"status":"succeeded","output":{}}}"#, nested(40));
            reply("o-1", &w.lease("o-1"), &outcome)
        },
        gets: Gets::GivesUp("the output nests 40 levels deep; at most 32 are kept"),
    },
    Row {
        kind: "a queue worker's fenced reply whose output is over 4 KiB",
        queue: "scheduler",
        body: |w| {
            w.claimed("o-1");
            let outcome = format!(r#"{{"status":"succeeded","output":"{}"}}"#, "x".repeat(5_000));
            reply("o-1", &w.lease("o-1"), &outcome)
        },
        gets: Gets::GivesUp("at most 4096 are kept"),
    },
    Row {
        kind: "a remote's 2xx body that is not JSON",
        queue: "agent",
        body: |w| {
            *w.remote.0.lock().unwrap() = b"<html>OK</html>".to_vec();
            agent_request("o-1", u64::MAX)
        },
        gets: Gets::RepliesBadOutput("the answer is not JSON"),
    },
    Row {
        kind: "a remote's 2xx body nested 127 levels",
        queue: "agent",
        body: |w| {
            *w.remote.0.lock().unwrap() = nested(127).into_bytes();
            agent_request("o-1", u64::MAX)
        },
        gets: Gets::RepliesBadOutput("nests 127 levels deep; at most 32 are kept"),
    },
    Row {
        kind: "an app's cancel from a sender other than the order's submitter",
        queue: "orders",
        body: |w| {
            w.claimed_from("o-1", Some(SHOP));
            *w.bad_sender.borrow_mut() = Some(INTRUDER);
            cancel("o-1")
        },
        gets: Gets::Kept("order o-1 was submitted by another sender (this message came from AROAINTRUDER)"),
    },
    Row {
        kind: "an app's cancel without a sender, of an order that has one",
        queue: "orders",
        body: |w| {
            w.claimed_from("o-1", Some(SHOP));
            cancel("o-1")
        },
        gets: Gets::Kept("order o-1 was submitted by another sender (this message carries no sender)"),
    },
    Row {
        kind: "an order id taken by another sender's order (the same payload: squatting)",
        queue: "orders",
        body: |w| {
            w.claimed_from("o-1", Some(INTRUDER));
            *w.bad_sender.borrow_mut() = Some(SHOP);
            order("o-1")
        },
        gets: Gets::Kept(
            "order o-1 was submitted by another sender (this message came from AROASHOP); this id is taken",
        ),
    },
];

/// Apps' `SenderId`s as SQS sets them for assumed roles: the role's id and a session name.
const SHOP: &str = "AROASHOP:shop-container-1";
const INTRUDER: &str = "AROAINTRUDER:session";

fn cancel(id: &str) -> String {
    format!(r#"{{"cancel":"{id}","reason":"changed my mind"}}"#)
}

/// Runs one row in a batch between two good messages, and checks what it got.
fn run_row(row: &Row) -> String {
    let w = World::new();
    let bad = (row.body)(&w);
    let (good_before, good_after) = match row.queue {
        "orders" => (order("good-1"), order("good-2")),
        "scheduler" => {
            w.batch("orders", &[order("good-1"), order("good-2")]);
            let schedules: Vec<String> = w.drain("scheduler").into_iter().map(|m| m.body).collect();
            (schedules[0].clone(), schedules[1].clone())
        }
        _ => (agent_request("good-1", u64::MAX), agent_request("good-2", u64::MAX)),
    };
    let before_rows = w.store.tasks();
    let bad_sender = *w.bad_sender.borrow();
    let report =
        w.batch_from(row.queue, &[(good_before, None), (bad.clone(), bad_sender), (good_after, None)]);
    assert!(report.failures.is_empty(), "{}: the batch reported failures {:?}", row.kind, report.failures);
    // The rest of the batch was handled.
    let replies = if row.queue == "agent" { w.drain("scheduler") } else { Vec::new() };
    let handled = match row.queue {
        "orders" => {
            ["good-1", "good-2"].iter().all(|id| w.store.tasks().iter().any(|t| t.order_id.as_str() == *id))
        }
        "scheduler" => w.store.tasks().iter().filter(|t| t.state() == ProcessState::Processing).count() >= 2,
        _ => replies.len() >= 2,
    };
    assert!(handled, "{}: the good messages of its batch were not handled", row.kind);
    let kept = w.drain(&format!("{}-dlq", row.queue));
    match row.gets {
        Gets::Kept(reason) => {
            assert_eq!(report.kept, 1, "{}: {report:?}", row.kind);
            assert_eq!(kept.len(), 1, "{}", row.kind);
            assert_eq!(kept[0].body, bad, "{}: kept as sent", row.kind);
            let got = kept[0].attributes.get(REASON_ATTRIBUTE).cloned().unwrap_or_default();
            assert!(got.contains(reason), "{}: reason {got:?} lacks {reason:?}", row.kind);
            format!("kept in `{}-dlq`, `sas-reason`: {}", row.queue, got.replace('|', "\\|"))
        }
        Gets::Dropped(metric) => {
            assert!(kept.is_empty() && report.kept == 0, "{}: {kept:?}", row.kind);
            assert_eq!(w.metrics.snapshot().count(metric), 1, "{}", row.kind);
            if row.queue == "scheduler" {
                let o1 = |tasks: &[sas::domain::TaskRecord]| {
                    tasks.iter().find(|t| t.order_id.as_str() == "o-1").cloned()
                };
                assert_eq!(o1(&w.store.tasks()), o1(&before_rows), "{}: the task changed", row.kind);
            }
            format!("handled and dropped, nothing changes; counted as `{}`", metric.name())
        }
        Gets::GivesUp(reason) => {
            assert!(kept.is_empty() && report.kept == 0, "{}: {kept:?}", row.kind);
            let task = w.store.tasks().into_iter().find(|t| t.order_id.as_str() == "o-1").unwrap();
            assert!(task.state().is_terminal(), "{}: o-1 is {:?}", row.kind, task.state());
            let statuses = w.drain("status");
            let failed = statuses
                .iter()
                .filter_map(|m| serde_json::from_str::<sas::domain::StatusUpdate>(&m.body).ok())
                .find(|u| u.order_id.as_ref().is_some_and(|o| o.as_str() == "o-1") && u.reason.is_some())
                .unwrap_or_else(|| panic!("{}: no status with a reason for o-1: {statuses:?}", row.kind));
            let got = failed.reason.unwrap();
            assert!(got.contains(reason), "{}: reason {got:?} lacks {reason:?}", row.kind);
            format!(
                "handled: the step is given up in doubt, order ends `{:?}`: {}",
                task.state(),
                got.replace('|', "\\|")
            )
        }
        Gets::RepliesBadOutput(reason) => {
            assert!(kept.is_empty() && report.kept == 0, "{}: {kept:?}", row.kind);
            let got = replies
                .iter()
                .filter_map(|m| match sas::domain::SchedulerMessage::parse(&m.body) {
                    Ok(sas::domain::SchedulerMessage::Reply(r)) if r.order_id.as_str() == "o-1" => {
                        Some(r.outcome)
                    }
                    _ => None,
                })
                .next()
                .unwrap_or_else(|| panic!("{}: no reply for o-1", row.kind));
            let sas::domain::ReplyOutcome::BadOutput { reason: got, .. } = got else {
                panic!("{}: replied {got:?}", row.kind)
            };
            assert!(got.contains(reason), "{}: reason {got:?} lacks {reason:?}", row.kind);
            format!("the agent replies `bad_output`: {got}")
        }
    }
}

macro_rules! rows {
    ($($name:ident = $i:expr;)*) => {
        $(
            #[test]
            fn $name() {
                run_row(&ROWS[$i]);
            }
        )*
        #[test]
        fn every_row_has_its_test() {
            assert_eq!([$($i),*].len(), ROWS.len());
        }
    };
}

rows! {
    malformed_json = 0;
    empty_body = 1;
    not_an_object = 2;
    wrong_shape_array = 3;
    positional_order = 4;
    positional_items = 5;
    missing_field = 6;
    unknown_field = 7;
    misspelt_field = 8;
    duplicate_key = 9;
    wrong_type = 10;
    null_field = 11;
    negative_quantity = 12;
    fractional_quantity = 13;
    quantity_past_u32 = 14;
    zero_quantity = 15;
    quantity_over_limit = 16;
    no_items = 17;
    too_many_items = 18;
    invalid_order_id = 19;
    empty_order_id = 20;
    order_id_too_long = 21;
    blank_customer = 22;
    field_too_long = 23;
    control_characters = 24;
    unknown_workflow = 25;
    empty_reply_to = 26;
    oversized_body = 27;
    deeply_nested = 28;
    conflicting_payload = 29;
    unknown_message_type = 30;
    missing_type_tag = 31;
    schedule_unknown_order = 32;
    reply_unknown_order = 33;
    reply_bad_lease = 34;
    reply_unknown_outcome = 35;
    reply_negative_attempt = 36;
    stale_reply = 37;
    agent_missing_fields = 38;
    agent_unknown_action = 39;
    agent_past_complete_by = 40;
    reply_to_too_long = 41;
    forged_schedule = 42;
    worker_output_too_deep = 43;
    worker_output_too_large = 44;
    remote_body_not_json = 45;
    remote_body_too_deep = 46;
    cancel_from_another_sender = 47;
    cancel_without_a_sender = 48;
    order_id_squatted = 49;
}

/// Prints docs/BAD_INPUTS.md's table from the rows (each checked as it is printed), and
/// holds the doc to it: every row's input and outcome is a row of the doc, word for word,
/// so a changed message (serde's, or ours) cannot leave the doc quoting the old one.
#[test]
fn bad_input_table() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BAD_INPUTS.md")).unwrap();
    let doc_rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| ")).collect();
    println!("| # | queue | bad input | what it gets |\n|---:|---|---|---|");
    let mut stale = Vec::new();
    for (i, row) in ROWS.iter().enumerate() {
        let got = run_row(row);
        let got = if got.len() > 200 { format!("{}…", &got[..got.floor_char_boundary(200)]) } else { got };
        let cells = format!("| {} | {} | {} |", row.queue, row.kind, got);
        // The number is the doc's: rows of other tables sit between these.
        match doc_rows
            .iter()
            .find_map(|l| l.split_once(" | ").filter(|(_, rest)| format!("| {rest}") == cells))
        {
            Some((number, _)) => println!("{number} {cells}"),
            None => {
                println!("| ({} in ROWS, not in the doc) {cells}", i + 1);
                stale.push(cells);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "docs/BAD_INPUTS.md lacks these rows, or quotes them differently:\n{}",
        stale.join("\n")
    );
}

/// A rejected order with a `reply_to` also tells its sender why.
#[test]
fn a_rejected_order_tells_its_reply_to() {
    let w = World::new();
    let body = r#"{"order_id":"o-1","customer_id":"c","items":[],"reply_to":"status"}"#.to_owned();
    w.batch("orders", &[body]);
    let status = w.drain("status");
    assert_eq!(status.len(), 1);
    let update: sas::domain::StatusUpdate = serde_json::from_str(&status[0].body).unwrap();
    assert_eq!(update.status, sas::domain::OrderStatus::Rejected);
    assert_eq!(update.order_id.map(|o| o.as_str().to_owned()).as_deref(), Some("o-1"));
    assert!(update.reason.unwrap().contains("items is empty"));
    let _ = block_on(w.queues.send(&QueueUrl("status".into()), Outgoing::new(String::new())));
    let _ = block_on(w.store.task(&sas::domain::OrderId::parse("o-1").unwrap()));
}

/// Issue 24, finding 2, through the handler: a cancel from another sender changes nothing
/// and tells the order's reply_to nothing; the submitter's own cancel, from another
/// session of the same role, applies; a squatted id is no duplicate delivery.
#[test]
fn an_apps_cancel_binds_to_the_orders_submitter() {
    let w = World::new();
    let o1 = || w.store.tasks().into_iter().find(|t| t.order_id.as_str() == "o-1").unwrap();
    // Accepted, waiting for its first step: a cancel from its submitter would apply.
    assert_eq!(w.batch_from("orders", &[(order("o-1"), Some(SHOP))]), BatchReport::default());
    w.drain("scheduler");
    w.drain("status");
    assert_eq!(o1().submitter.as_ref().map(|s| s.as_str()), Some("AROASHOP"));
    let before = o1();
    for sender in [Some(INTRUDER), None] {
        let report = w.batch_from("orders", &[(cancel("o-1"), sender)]);
        assert_eq!((report.kept, report.failures.len()), (1, 0), "{sender:?}");
        assert_eq!(o1(), before, "{sender:?}: the task changed");
        assert!(w.drain("status").is_empty(), "{sender:?}: the submitter's reply_to was told");
    }
    // The same order sent again by another sender: kept, and nothing told: neither
    // `received` nor a `rejected` that would read as the live order's.
    let report = w.batch_from("orders", &[(order("o-1"), Some(INTRUDER))]);
    assert_eq!(report.kept, 1);
    assert_eq!((o1(), w.drain("scheduler").len()), (before, 0));
    assert!(w.drain("status").is_empty(), "the squatter's reply_to was told about o-1");
    // The submitter's own duplicate delivery, from another container, is still one.
    let report = w.batch_from("orders", &[(order("o-1"), Some("AROASHOP:shop-container-2"))]);
    assert_eq!(report, BatchReport::default());
    let report = w.batch_from("orders", &[(cancel("o-1"), Some("AROASHOP:shop-container-3"))]);
    assert_eq!(report, BatchReport::default());
    assert_eq!(o1().state(), ProcessState::Compensated, "the submitter's cancel applies");
    let told: Vec<String> = w.drain("status").into_iter().map(|m| m.body).collect();
    assert!(told.iter().any(|b| b.contains(r#""status":"cancelled""#)), "{told:?}");
    // An order accepted without a sender (a record from before senders were kept):
    // any app's cancel applies, as before.
    assert_eq!(w.batch("orders", &[order("o-2")]), BatchReport::default());
    let report = w.batch_from("orders", &[(cancel("o-2"), Some(INTRUDER))]);
    assert_eq!(report, BatchReport::default());
    let o2 = w.store.tasks().into_iter().find(|t| t.order_id.as_str() == "o-2").unwrap();
    assert_eq!(o2.state(), ProcessState::Compensated);
}
