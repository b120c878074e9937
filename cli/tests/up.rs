//! `sasctl up` against moto (infra/with-moto.sh sets SAS_TEST_ENDPOINT), as a user runs
//! it: the built binary as a child process, a definition file whose one agent calls a
//! small HTTP service run by the test, orders sent with the plain SDK, the state table
//! read with the plain SDK, then SIGINT. Without an endpoint the test prints a loud
//! SKIPPED line and passes, except under CI=true (`support::endpoint`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

mod support;
#[path = "support/up.rs"]
mod up;
use up::Up;

/// The order ids the test's service refuses (HTTP 422) start with this.
const REFUSED: &str = "refuse-";
/// Refused like [`REFUSED`] while the service's `refusing` switch is on: the remote the
/// operator fixes before resubmitting.
const FIXABLE: &str = "fix-";
/// The service answers these orders' forward steps only after its agent gave up
/// waiting (so their tasks stay live), and undoes them at once.
const SLOW: &str = "slow-";

/// What the test's service was asked: step name, order id and idempotency key.
type Calls = Arc<Mutex<Vec<(String, String, String)>>>;

/// The test's remote service: what it was asked, and the switch that makes it refuse
/// the [`FIXABLE`] orders.
#[derive(Clone)]
struct Remote {
    base: String,
    calls: Calls,
    refusing: Arc<AtomicBool>,
}

/// The remote service of the test's one agent: it refuses orders whose id starts with
/// [`REFUSED`] (and [`FIXABLE`] while `refusing`), is slower than the agent waits for on
/// [`SLOW`] ones, and does every other step, answering a small JSON output.
async fn serve_remote() -> Remote {
    async fn step(
        State(remote): State<Remote>,
        UrlPath(step): UrlPath<String>,
        headers: HeaderMap,
        body: axum::Json<serde_json::Value>,
    ) -> (StatusCode, String) {
        let order_id = body["order_id"].as_str().unwrap_or_default().to_owned();
        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        remote.calls.lock().unwrap().push((step.clone(), order_id.clone(), key));
        let fixable = order_id.starts_with(FIXABLE) && remote.refusing.load(Ordering::SeqCst);
        if order_id.starts_with(REFUSED) || fixable {
            (StatusCode::UNPROCESSABLE_ENTITY, r#"{"error":"no such customer"}"#.into())
        } else if order_id.starts_with(SLOW) && step != "release" {
            tokio::time::sleep(Duration::from_secs(3)).await;
            (StatusCode::SERVICE_UNAVAILABLE, "busy".into())
        } else {
            (StatusCode::OK, r#"{"done":true}"#.into())
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let remote = Remote {
        base: format!("http://{}/svc", listener.local_addr().unwrap()),
        calls: Calls::default(),
        refusing: Arc::new(AtomicBool::new(true)),
    };
    let app = Router::new().route("/svc/{step}", post(step)).with_state(remote.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    remote
}

/// A definition file in a fresh directory: workflow `one`, one step on agent `svc` at
/// `url`, nothing to undo with (a refusal ends the task Error); and workflow `undoable`,
/// one step `hold` undone by `release`.
fn definitions_file(url: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sasctl-up-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("workflows.json");
    let text = serde_json::json!({
        "agents": {"svc": {"url": url, "timeout_ms": 2000}},
        "workflows": [
            {"name": "one", "steps": [{"name": "do-it", "agent": "svc"}]},
            {"name": "undoable", "steps": [{"name": "hold", "agent": "svc", "compensation": "release"}]},
        ],
    });
    std::fs::write(&path, text.to_string()).unwrap();
    path
}

/// The plain SDK's view of the test's resources.
struct Aws {
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    orders_queue: String,
    table: String,
}

impl Aws {
    async fn new(endpoint: &str, prefix: &str) -> Aws {
        let sdk = sasctl::endpoint::sdk_config(endpoint).await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let orders_queue = sqs
            .get_queue_url()
            .queue_name(format!("{prefix}-orders"))
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        Aws {
            dynamodb: aws_sdk_dynamodb::Client::new(&sdk),
            sqs,
            orders_queue,
            table: format!("{prefix}-state"),
        }
    }

    async fn send_order(&self, order_id: &str) {
        self.send_order_of(order_id, "one").await;
    }

    async fn send_order_of(&self, order_id: &str, workflow: &str) {
        let body = serde_json::json!({
            "order_id": order_id, "customer_id": "c-1",
            "items": [{"sku": "A-1", "quantity": 2}], "workflow": workflow,
        });
        self.send(&body.to_string()).await;
    }

    /// An app's cancel of `order_id`, from app `shop`.
    async fn send_cancel(&self, order_id: &str, reason: &str) {
        let body = serde_json::json!({"cancel": order_id, "reason": reason, "requested_by": "shop"});
        self.send(&body.to_string()).await;
    }

    async fn send(&self, body: &str) {
        self.sqs.send_message().queue_url(&self.orders_queue).message_body(body).send().await.unwrap();
    }

    /// The task's state as the table holds it, if there is a task.
    async fn state(&self, order_id: &str) -> Option<String> {
        self.state_and_revision(order_id).await.map(|(state, _)| state)
    }

    /// The task's state and revision as the table holds them, if there is a task.
    async fn state_and_revision(&self, order_id: &str) -> Option<(String, String)> {
        let item = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("order_id", AttributeValue::S(order_id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item?;
        let state = item.get("state").and_then(|s| s.as_s().ok()).cloned()?;
        let revision = item.get("revision").and_then(|s| s.as_n().ok()).cloned()?;
        Some((state, revision))
    }

    /// Waits (bounded) until every order has ended; their final states.
    async fn wait_until_ended(&self, order_ids: &[&str], within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let mut states = Vec::new();
            for id in order_ids {
                states.push(self.state(id).await.unwrap_or_else(|| "(none)".into()));
            }
            if states.iter().all(|s| ["Processed", "Error", "Compensated"].contains(&s.as_str())) {
                return states;
            }
            assert!(Instant::now() < deadline, "not all ended within {within:?}: {order_ids:?} {states:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn remove_resources(endpoint: &str, prefix: &str) {
    let clients = sas::adapters::aws::Clients::new(&sasctl::endpoint::sdk_config(endpoint).await);
    let layout = sas::adapters::aws::provision::Layout::standard(prefix);
    let all = sasctl::resources::existing(&clients, &layout).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_run_to_their_end_and_ctrl_c_stops_cleanly_and_a_second_up_carries_on() {
    let test = "orders_run_to_their_end_and_ctrl_c_stops_cleanly_and_a_second_up_carries_on";
    let Some(endpoint) = support::endpoint(test) else { return };
    let remote = serve_remote().await;
    let (url, calls) = (remote.base.clone(), remote.calls.clone());
    let workflows = definitions_file(&url);
    let prefix = format!("t-up-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);

    let up = Up::start(&endpoint, &prefix, &workflows).await;
    let startup = up.stdout();
    assert!(startup.contains(&format!("prefix {prefix} (all 11 created)")), "{startup}");
    assert!(startup.contains(&format!("svc: POST {url}/<step>")), "{startup}");
    assert!(
        startup.contains(&format!("aws --endpoint-url {endpoint} sqs send-message --queue-url ")),
        "{startup}"
    );

    let aws = Aws::new(&endpoint, &prefix).await;
    let orders = ["ok-1", "ok-2", "ok-3", "refuse-1"];
    for id in orders {
        aws.send_order(id).await;
    }
    let states = aws.wait_until_ended(&orders, Duration::from_secs(90)).await;
    assert_eq!(states, ["Processed", "Processed", "Processed", "Error"]);
    // The exports `up` prints are all a later `sasctl tasks` needs: no flag.
    let export = startup.lines().find_map(|l| l.trim().strip_prefix("export ")).expect("an export line");
    let vars: Vec<(&str, &str)> = export.split(' ').filter_map(|kv| kv.split_once('=')).collect();
    assert!(vars.contains(&("SAS_PREFIX", prefix.as_str())), "{export}");
    assert!(vars.contains(&("AWS_ENDPOINT_URL", endpoint.as_str())), "{export}");
    let list = |state: &'static str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .args(["tasks", "list", "--state", state, "--json"])
            .env_remove("SAS_STACK")
            .envs(vars.iter().copied())
            .output()
    };
    let listed = list("error").await.expect("sasctl runs");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && text.contains("refuse-1"),
        "{text}\n{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    // Each order's whole history: the functions' log lines, in the file `up` names.
    let history = sasctl::history::path(&prefix);
    assert!(startup.contains(&history.display().to_string()), "{startup}");
    let lines = sasctl::history::lines_of(&history, "ok-1").expect("the history file");
    let said: Vec<String> = lines.iter().map(|l| sasctl::history::describe(l).2).collect();
    assert!(said.iter().any(|w| w.starts_with("claimed")), "{said:?}");
    assert!(said.iter().any(|w| w.starts_with("reply applied") && w.contains("Finished")), "{said:?}");
    // `up` keeps the finished index: the Processed orders are listed, newest first.
    let finished = list("finished").await.expect("sasctl runs");
    let text = String::from_utf8_lossy(&finished.stdout);
    let listed: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let mut ids: Vec<&str> = listed.iter().filter_map(|t| t["id"].as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["ok-1", "ok-2", "ok-3"], "{text}\n{}", String::from_utf8_lossy(&finished.stderr));
    // The last event lines may trail the table by a moment.
    up.wait_for_line(|l| l.contains("Error") && l.contains("refuse-1"), Duration::from_secs(10)).await;

    up.interrupt();
    let (status, stdout, stderr) = up.finish(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains(
            "stopped: 4 accepted, 3 processed, 1 error, 0 compensated, 0 in flight; 0 rejected, 0 callbacks refused, 1 alerts"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("the resources stay at {endpoint} under the prefix {prefix}")),
        "{stdout}"
    );
    let seen: Vec<(String, String, String)> = calls.lock().unwrap().clone();
    for id in orders {
        assert!(
            seen.iter()
                .any(|(step, order, key)| step == "do-it" && order == id && *key == format!("{id}:0:do")),
            "{id} not called as expected: {seen:?}"
        );
    }

    // Sent while nothing runs: the next `up` on the same prefix finds the resources and
    // the order waiting in them.
    aws.send_order("ok-4").await;
    let up = Up::start(&endpoint, &prefix, &workflows).await;
    assert!(up.stdout().contains("(all 11 found and reused)"), "{}", up.stdout());
    assert_eq!(aws.wait_until_ended(&["ok-4"], Duration::from_secs(90)).await, ["Processed"]);
    up.wait_for_line(|l| l.contains("Processed") && l.contains("ok-4"), Duration::from_secs(10)).await;
    up.interrupt();
    let (status, stdout, stderr) = up.finish(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("stopped: 1 accepted, 1 processed, 0 error"), "{stdout}");

    remove_resources(&endpoint, &prefix).await;
    let _ = std::fs::remove_dir_all(workflows.parent().unwrap());
}

/// What moto's STS answers GetCallerIdentity with.
const MOTO_ARN: &str = "arn:aws:sts::123456789012:user/moto";

/// `sasctl tasks ARGS` against `up`'s resources, as an operator runs it: exit code,
/// stdout, stderr.
async fn tasks(up: &Up, workflows: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .arg("tasks")
        .args(args)
        .args(["--prefix", &up.prefix, "--endpoint-url", &up.endpoint])
        .arg("--workflows")
        .arg(workflows)
        // The functions' reply grace, as `up` runs them: a cancel's undo waits this long
        // after the attempt in flight.
        .env("REPLY_GRACE_MS", "1000")
        .output()
        .await
        .expect("sasctl runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn ids(objects: &[serde_json::Value]) -> BTreeSet<String> {
    objects.iter().filter_map(|o| o["id"].as_str()).map(str::to_owned).collect()
}

impl Aws {
    /// Waits (bounded) until the task is in `state`.
    async fn wait_for_state(&self, order_id: &str, state: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.state(order_id).await;
            if now.as_deref() == Some(state) {
                return;
            }
            assert!(Instant::now() < deadline, "{order_id} not {state} within {within:?}: {now:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The operator's console over a running deployment: tasks that failed because the
/// remote refused them are listed, the remote is fixed, one is resubmitted by id and the
/// rest in bulk (after a dry run that changes nothing), and all end Processed; the
/// timeline names who resubmitted and why; an action that does not apply is refused and
/// changes nothing; a live task is cancelled and ends Compensated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_failed_tasks_resubmits_them_once_fixed_and_cancels_a_live_one() {
    let test = "an_operator_lists_failed_tasks_resubmits_them_once_fixed_and_cancels_a_live_one";
    let Some(endpoint) = support::endpoint(test) else { return };
    let remote = serve_remote().await;
    let workflows = definitions_file(&remote.base);
    let prefix = format!("t-ops-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // Short steps and grace, so a cancelled attempt's undo waits seconds, not a minute.
    let up = Up::start_with(
        &endpoint,
        &prefix,
        &workflows,
        &[("STEP_TIMEOUT_MS", "4000"), ("REPLY_GRACE_MS", "1000")],
    )
    .await;
    let aws = Aws::new(&endpoint, &prefix).await;
    let failing = ["fix-1", "fix-2", "fix-3"];
    for id in failing {
        aws.send_order(id).await;
    }
    aws.send_order("ok-1").await;
    let states = aws.wait_until_ended(&["fix-1", "fix-2", "fix-3", "ok-1"], Duration::from_secs(90)).await;
    assert_eq!(states, ["Error", "Error", "Error", "Processed"]);

    // Listed from the error index.
    let (code, out, err) = tasks(&up, &workflows, &["list", "--state", "error", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let listed = json_lines(&out);
    assert_eq!(ids(&listed), failing.iter().map(|s| s.to_string()).collect(), "{out}");
    for task in &listed {
        assert_eq!(
            (task["state"].as_str(), task["workflow"].as_str()),
            (Some("Error"), Some("one")),
            "{task}"
        );
        assert_eq!(task["step_name"], "do-it", "{task}");
        assert!(task["last_error"].as_str().is_some_and(|e| e.contains("422")), "{task}");
    }

    remote.refusing.store(false, Ordering::SeqCst);

    // One previewed by its id, which changes nothing.
    let was = aws.state_and_revision("fix-1").await;
    let preview = ["resubmit", "fix-1", "--reason", "remote fixed", "--dry-run"];
    let (code, out, err) = tasks(&up, &workflows, &preview).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "would resubmit: fix-1: Error -> Pending (Resubmit)\ndry run: nothing changed\n");
    assert_eq!(aws.state_and_revision("fix-1").await, was);

    // One by its id.
    let (code, out, err) = tasks(&up, &workflows, &["resubmit", "fix-1", "--reason", "remote fixed"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim_end(),
        format!("fix-1: Error -> Pending (Resubmit), by {MOTO_ARN}, why remote fixed")
    );
    let (code, out, err) = tasks(&up, &workflows, &["show", "fix-1", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let shown: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let timeline = shown["timeline"].as_array().expect("a timeline");
    let resubmit = timeline.iter().find(|e| e["what"] == "Resubmit").unwrap_or_else(|| panic!("{shown}"));
    assert_eq!((resubmit["by"].as_str(), resubmit["note"].as_str()), (Some(MOTO_ARN), Some("remote fixed")));
    assert_eq!(resubmit["step_name"], "do-it");

    // The rest in bulk: a dry run first, which changes nothing.
    let rest = ["fix-2", "fix-3"];
    let mut before = Vec::new();
    for id in rest {
        before.push(aws.state_and_revision(id).await);
    }
    let bulk = ["resubmit", "--state", "error", "--reason", "remote fixed", "--json"];
    let (code, out, err) = tasks(&up, &workflows, &[&bulk[..], &["--dry-run"]].concat()).await;
    assert_eq!(code, 0, "{err}");
    let mut lines = json_lines(&out);
    let summary = lines.pop().unwrap();
    assert_eq!((summary["selected"].as_u64(), summary["would_apply"].as_u64()), (Some(2), Some(2)), "{out}");
    assert_eq!(ids(&lines), rest.iter().map(|s| s.to_string()).collect(), "{out}");
    assert!(lines.iter().all(|l| l["outcome"] == "would_apply" && l["to"] == "Pending"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, was) in rest.iter().zip(&before) {
        assert_eq!(&aws.state_and_revision(id).await, was, "{id} changed by a dry run");
    }
    let (code, out, err) = tasks(&up, &workflows, &bulk).await;
    assert_eq!(code, 0, "{out}{err}");
    let summary = json_lines(&out).pop().unwrap();
    assert_eq!((summary["applied"].as_u64(), summary["refused"].as_u64()), (Some(2), Some(0)), "{out}");
    let states = aws.wait_until_ended(&failing, Duration::from_secs(90)).await;
    assert_eq!(states, ["Processed", "Processed", "Processed"]);

    // What does not apply is refused and changes nothing; a preview says so, exit 1 too.
    let was = aws.state_and_revision("ok-1").await;
    let (code, out, err) =
        tasks(&up, &workflows, &["compensate", "ok-1", "--reason", "oops", "--dry-run"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("would refuse: ok-1: cannot compensate a task that is Processed"), "{out}");
    let (code, out, err) = tasks(&up, &workflows, &["compensate", "ok-1", "--reason", "oops"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        err.trim_end(),
        "sasctl: ok-1: refused: cannot compensate a task that is Processed: only a task in Error can be compensated"
    );
    assert_eq!(aws.state_and_revision("ok-1").await, was);
    let (code, _, err) = tasks(&up, &workflows, &["show", "nope-1"]).await;
    assert_eq!(
        (code, err.trim_end()),
        (1, format!("sasctl: no task nope-1 in table {prefix}-state").as_str())
    );

    // A live task, cancelled while its attempt is in flight: undone once that attempt is over.
    aws.send_order_of("slow-1", "undoable").await;
    aws.wait_for_state("slow-1", "Processing", Duration::from_secs(30)).await;
    let (code, out, err) = tasks(&up, &workflows, &["cancel", "slow-1", "--reason", "customer asked"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("-> Compensating (Cancel), by "), "{out}");
    assert_eq!(aws.wait_until_ended(&["slow-1"], Duration::from_secs(60)).await, ["Compensated"]);
    let seen = remote.calls.lock().unwrap().clone();
    assert!(seen.iter().any(|(step, id, _)| step == "release" && id == "slow-1"), "{seen:?}");

    // An app's cancel: each is told as it arrives, and then as it lands or is refused.
    aws.send_order_of("slow-2", "undoable").await;
    aws.wait_for_state("slow-2", "Processing", Duration::from_secs(30)).await;
    aws.send_cancel("slow-2", "too slow").await;
    up.wait_for_line(
        |l| l.contains("] cancel ") && l.contains("slow-2 asked by app:shop: too slow"),
        Duration::from_secs(30),
    )
    .await;
    up.wait_for_line(
        |l| {
            l.contains("] cancelled ")
                && l.contains("slow-2 (undoable v1): Processing -> Compensating, by app:shop: too slow")
        },
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(aws.wait_until_ended(&["slow-2"], Duration::from_secs(60)).await, ["Compensated"]);
    aws.send_cancel("ok-1", "changed mind").await;
    let refused = up.wait_for_line(|l| l.contains("] cancel_refused "), Duration::from_secs(30)).await;
    assert!(refused.contains("ok-1: cannot cancel a task that is Processed"), "{refused}");
    // A rejection names the order its body names.
    aws.send(r#"{"order_id":"bad-1","customer_id":"c-1","items":[]}"#).await;
    let rejected = up.wait_for_line(|l| l.contains("] rejected "), Duration::from_secs(30)).await;
    assert!(rejected.contains(&format!("bad-1 kept in {prefix}-orders-dlq: ")), "{rejected}");

    up.interrupt();
    let (status, stdout, stderr) = up.finish(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Each order once, in the state it ended in: the three resubmitted after failing are
    // processed, not also errors.
    assert!(
        stdout.contains("stopped: 6 accepted, 4 processed, 0 error, 2 compensated, 0 in flight; 1 rejected"),
        "{stdout}"
    );
    remove_resources(&endpoint, &prefix).await;
    let _ = std::fs::remove_dir_all(workflows.parent().unwrap());
}

/// Without --remote-service-url, `up` runs the simulated service: the agents' calls are
/// answered with no service of the user's, a callback step's token is printed with the
/// command that completes it, and that command (with only the printed exports) finishes
/// the order.
#[tokio::test]
async fn the_simulated_service_answers_and_a_callback_is_completed_by_the_printed_command() {
    let test = "the_simulated_service_answers_and_a_callback_is_completed_by_the_printed_command";
    let Some(endpoint) = support::endpoint(test) else { return };
    let dir = std::env::temp_dir().join(format!("sasctl-up-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let workflows = dir.join("approval.json");
    let text = serde_json::json!({
        "agents": {"payment": {}, "approvals": {}},
        "workflows": [{"name": "approval", "steps": [
            {"name": "charge", "agent": "payment", "compensation": "refund"},
            {"name": "approve", "agent": "approvals",
             "callback": {"timeout_ms": 120_000, "heartbeat_ms": 5_000}},
        ]}],
    });
    std::fs::write(&workflows, text.to_string()).unwrap();
    let prefix = format!("t-up-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let up = Up::start(&endpoint, &prefix, &workflows).await;
    let startup = up.stdout();
    assert!(startup.contains("(the simulated service)"), "{startup}");
    let aws = Aws::new(&endpoint, &prefix).await;
    aws.send_order_of("wait-1", "approval").await;
    let line =
        up.wait_for_line(|l| l.contains("callback") && l.contains("wait-1"), Duration::from_secs(60)).await;
    let token = line
        .split_whitespace()
        .skip_while(|w| *w != "complete")
        .nth(1)
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .to_owned();
    let export = startup.lines().find_map(|l| l.trim().strip_prefix("export ")).expect("an export line");
    let vars: Vec<(&str, &str)> = export.split(' ').filter_map(|kv| kv.split_once('=')).collect();
    let done = tokio::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["tasks", "complete", &token])
        .env_remove("SAS_STACK")
        .envs(vars.iter().copied())
        .output()
        .await
        .expect("sasctl runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let states = aws.wait_until_ended(&["wait-1"], Duration::from_secs(60)).await;
    assert_eq!(states, ["Processed"]);
    up.interrupt();
    let (status, stdout, _) = up.finish(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{stdout}");
    remove_resources(&endpoint, &prefix).await;
}
