//! `sasctl console` as an operator's browser meets it, with a plain HTTP client: the built
//! binary against moto (infra/with-moto.sh sets SAS_TEST_ENDPOINT; without it the test
//! prints a loud SKIPPED line and passes, except under CI=true) over a deployment with a
//! task waiting at a callback step (support/waiting.rs). The token, the pages, the dry run
//! (nothing changes) and the completion by hand (recorded with who and why).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use sas::adapters::aws::DynamoStore;
use sas::adapters::aws::provision::{Layout, provision};
use sas::domain::ProcessState;
use sas::ports::StateStore;

mod support;
#[path = "support/waiting.rs"]
mod waiting;
use waiting::{DEFINITIONS, waiting_task};

/// The console, killed when dropped.
struct Console(Child);

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sasctl console --json ARGS` and reads the URL it prints.
fn console(args: &[&str]) -> (Console, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args([&["console", "--json"][..], args].concat())
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("SAS_WORKFLOWS")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::piped())
        .spawn()
        .expect("sasctl console runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (Console(child), v["url"].as_str().expect("a url").to_owned())
}

/// Writes `lines` as events of a new stream in `group` (made if need be), as a function's
/// logs would be, through CloudWatch Logs' JSON API at the configuration's endpoint.
async fn put_log_lines(sdk: &aws_config::SdkConfig, group: &str, lines: &[&str]) {
    let url = format!("{}/", sdk.endpoint_url().expect("the test endpoint").trim_end_matches('/'));
    let region = sdk.region().expect("a region").as_ref().to_owned();
    let http = sas::adapters::http_remote::client_builder().build().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let events: Vec<serde_json::Value> =
        lines.iter().map(|l| serde_json::json!({"timestamp": now, "message": l})).collect();
    for (target, body) in [
        ("CreateLogGroup", serde_json::json!({"logGroupName": group})),
        ("CreateLogStream", serde_json::json!({"logGroupName": group, "logStreamName": "s"})),
        (
            "PutLogEvents",
            serde_json::json!({"logGroupName": group, "logStreamName": "s", "logEvents": events}),
        ),
    ] {
        let (target, body) = (format!("Logs_20140328.{target}"), body.to_string());
        let headers =
            sas::adapters::aws::secrets::signed_json_headers(sdk, "logs", &region, &url, &target, &body)
                .await
                .unwrap();
        let mut request = http.post(&url).body(body);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{target}: {}", response.text().await.unwrap());
    }
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

#[tokio::test]
async fn the_console_shows_a_waiting_task_and_completes_its_callback_by_hand() {
    let Some(endpoint) =
        support::endpoint("the_console_shows_a_waiting_task_and_completes_its_callback_by_hand")
    else {
        return;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let prefix = format!("con-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let provisioned = provision(&sdk, &Layout::standard(&prefix)).await.expect("provisioned");
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), provisioned.tables.clone());
    let dir = std::env::temp_dir().join(format!("sasctl-console-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("definitions.json");
    std::fs::write(&file, DEFINITIONS).unwrap();
    let (task, _token) = waiting_task("web-1", 7);
    store.insert(&task).await.unwrap();
    // A local run's history file (`sasctl up` writes it), with a line of web-1's.
    let line = r#"{"timestamp":"2026-11-28T03:00:00Z","level":"INFO","fields":{"message":"claimed","step":0},"span":{"order_id":"web-1","name":"scheduler"},"spans":[{"order_id":"web-1","name":"scheduler"}]}"#;
    std::fs::write(sasctl::history::path(&prefix), format!("{line}\n")).unwrap();

    let (_console, url) =
        console(&["--prefix", &prefix, "--endpoint-url", &endpoint, "--workflows", file.to_str().unwrap()]);
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("/?token="), "{url}");
    let (base, token) = url.split_once("/?token=").unwrap();
    assert_eq!(token.len(), 64, "{token}");
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let get = |path: &str| http.get(format!("{base}{path}")).send();
    let post = |path: &str, body: String| {
        http.post(format!("{base}{path}"))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };

    // Without the token (or with another), nothing: 403, the store never read.
    for path in ["/", "/tasks", "/tasks/web-1", "/assets/console.js", "/tasks?token=0000"] {
        assert_eq!(get(path).await.unwrap().status(), StatusCode::FORBIDDEN, "{path}");
    }
    let act = [("action", "complete"), ("step", "approve"), ("reason", "approved by phone")];
    let r = post("/tasks/web-1/act", form(&act)).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // The URL printed is the task list itself (no redirect that would lose the token).
    let r = get(&format!("/?token={token}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("<nav class=\"tabs\">"));
    // The token in the query sets the cookie; the cookie alone then serves a GET.
    let r = get(&format!("/tasks?state=waiting&token={token}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let cookie = r.headers().get(SET_COOKIE).expect("a cookie").to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let page = r.text().await.unwrap();
    assert!(page.contains("<a href=\"/tasks/web-1\">web-1</a>"), "{page}");
    assert!(page.contains("Read: a Query of the due index per shard"), "{page}");
    let pair = cookie.split(';').next().unwrap().to_owned();
    let r = http.get(format!("{base}/tasks/web-1")).header(COOKIE, &pair).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page = r.text().await.unwrap();
    assert!(page.contains("<svg class=\"graph\""), "{page}");
    for shown in ["data-step=\"approve\"", "data-step=\"ship\"", "☎ approve", "↺ withdraw", "now: Waiting"]
    {
        assert!(page.contains(shown), "{shown}: {page}");
    }
    assert!(page.contains("<svg class=\"gantt\""), "{page}");
    assert!(page.contains("<a href=\"/tasks/web-1/history\">Whole history</a>"), "{page}");
    let r = http.get(format!("{base}/tasks/web-1/history")).header(COOKIE, &pair).send().await.unwrap();
    let history = r.text().await.unwrap();
    assert!(history.contains("<h2>Whole history</h2>") && history.contains("claimed (step=0)"), "{history}");
    // A deployed stack's: from its functions' log groups in CloudWatch Logs, only the
    // order's own lines (web-10's is found by the filter's term, and left out).
    std::fs::remove_file(sasctl::history::path(&prefix)).unwrap();
    let other = line.replace("\"web-1\"", "\"web-10\"").replace("claimed", "not mine");
    put_log_lines(&sdk, &format!("/aws/lambda/{prefix}-scheduler"), &[line, &other]).await;
    let r = http.get(format!("{base}/tasks/web-1/history")).header(COOKIE, &pair).send().await.unwrap();
    let history = r.text().await.unwrap();
    assert!(history.contains("from CloudWatch Logs") && history.contains("claimed (step=0)"), "{history}");
    assert!(!history.contains("not mine"), "{history}");
    assert!(page.contains("entries kept, 0 older ones dropped (timeline_dropped)"), "{page}");
    assert!(
        page.contains("name=\"step\" id=\"step\" value=\"approve\""),
        "the waiting step is offered: {page}"
    );
    for path in ["/waiting", "/agents", "/dlq", "/dlq?queue=callbacks"] {
        let r = http.get(format!("{base}{path}")).header(COOKIE, &pair).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    // A finished order is listed from the finished index (`Layout::standard` keeps one).
    let (done, _) = waiting_task("web-done", 8);
    let done = done.with_phase(sas::domain::Phase::ended(sas::domain::ProcessState::Processed).unwrap());
    store.insert(&done).await.unwrap();
    let r = http.get(format!("{base}/tasks?state=finished")).header(COOKIE, &pair).send().await.unwrap();
    let page = r.text().await.unwrap();
    assert!(page.contains("<a href=\"/tasks/web-done\">web-done</a>"), "{page}");
    assert!(page.contains("Read: a Query of the finished index per shard"), "{page}");
    assert!(!page.contains("<a href=\"/tasks/web-1\">"), "a live task is not finished: {page}");
    let waiting = http.get(format!("{base}/waiting")).header(COOKIE, &pair).send().await.unwrap();
    assert!(waiting.text().await.unwrap().contains("every 10m"), "the heartbeat is shown");

    // Bad input: a clear page and a 4xx.
    let with = |path: &str| format!("{path}{}token={token}", if path.contains('?') { "&" } else { "?" });
    for (path, status) in [
        ("/tasks/no%20such", StatusCode::BAD_REQUEST),
        ("/tasks/nobody", StatusCode::NOT_FOUND),
        ("/tasks?state=done", StatusCode::BAD_REQUEST),
        ("/tasks?limit=0", StatusCode::BAD_REQUEST),
        ("/dlq?queue=status", StatusCode::BAD_REQUEST),
        ("/nowhere", StatusCode::NOT_FOUND),
    ] {
        let r = get(&with(path)).await.unwrap();
        assert_eq!(r.status(), status, "{path}");
        assert!(r.text().await.unwrap().contains("id=\"problem\""), "{path}");
    }
    // An action's POST carries the token in its form: the cookie is not enough.
    let r = http
        .post(format!("{base}/tasks/web-1/preview"))
        .header(COOKIE, &pair)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&act))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let with_token = |fields: &[(&str, &str)]| form(&[fields, &[("token", token)]].concat());
    let r = post("/tasks/web-1/preview", with_token(&act[..2])).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "a reason is required");

    // The dry run says what it would do and changes nothing.
    let r = post("/tasks/web-1/preview", with_token(&act)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page = r.text().await.unwrap();
    assert!(
        page.contains("web-1: step approve would be completed by hand: Waiting -&gt; Pending (Advanced); dry run, nothing changed"),
        "{page}"
    );
    assert!(page.contains("id=\"confirm\""), "{page}");
    assert_eq!(store.task(&task.order_id).await.unwrap().unwrap().revision, task.revision);

    assert!(page.contains(&format!("name=\"seen\" value=\"{}\"", task.revision)), "{page}");
    // Confirmed on a revision the task has moved from: refused, nothing changed.
    let stale = (task.revision + 1).to_string();
    let r = post("/tasks/web-1/act", with_token(&[&act[..], &[("seen", stale.as_str())]].concat()))
        .await
        .unwrap();
    let page = r.text().await.unwrap();
    assert!(page.contains("it changed since it was looked at"), "{page}");
    assert_eq!(store.task(&task.order_id).await.unwrap().unwrap().revision, task.revision);

    // Confirmed: the task moves on, recorded with who and why.
    let r = post("/tasks/web-1/act", with_token(&act)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page = r.text().await.unwrap();
    assert!(
        page.contains("web-1: step approve completed by hand: Waiting -&gt; Pending (Advanced), by arn:aws:"),
        "{page}"
    );
    let done = store.task(&task.order_id).await.unwrap().unwrap();
    assert_eq!(done.state(), ProcessState::Pending);
    let entry = done.timeline.last().unwrap();
    assert_eq!(entry.note.as_deref(), Some("approved by phone"));
    assert!(entry.by.as_deref().is_some_and(|by| by.starts_with("arn:aws:")), "{entry:?}");
    // Again: refused (409), nothing changes.
    let r = post("/tasks/web-1/act", with_token(&act)).await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(store.task(&task.order_id).await.unwrap().unwrap().revision, done.revision);
    // An act's dry run goes through `tasks`' preview: a live task can be paused.
    let pause = [("action", "pause"), ("reason", "look first"), ("token", token)];
    let page = post("/tasks/web-1/preview", form(&pause)).await.unwrap().text().await.unwrap();
    assert!(page.contains("would pause: web-1: Pending -&gt; Pending (Pause)"), "{page}");

    let clients = sas::adapters::aws::Clients::new(&sdk);
    let all = sasctl::resources::existing(&clients, &Layout::standard(&prefix)).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
    std::fs::remove_dir_all(&dir).unwrap();
}
