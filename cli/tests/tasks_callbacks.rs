//! `sasctl tasks complete|fail|heartbeat` as an operator (or a webhook's relay) runs them:
//! the built binary against moto (infra/with-moto.sh sets SAS_TEST_ENDPOINT; without it
//! the moto tests print a loud SKIPPED line and pass, except under CI=true), with a task
//! waiting at a callback step written to the deployment's table through the domain, as
//! the scheduler would have left it. The input checks need no emulator.

use std::io::Write;
use std::process::{Command, Stdio};

use sas::adapters::aws::DynamoStore;
use sas::adapters::aws::provision::{Layout, provision};
use sas::domain::{CallbackSecret, CallbackToken, OrderId};
use sas::ports::StateStore;

mod support;
#[path = "support/waiting.rs"]
mod waiting;
use waiting::{DEFINITIONS, waiting_task};

fn unique(what: &str) -> String {
    format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// `sasctl ARGS` with `stdin`: exit code, stdout, stderr.
fn sasctl_with(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(args)
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("SAS_WORKFLOWS")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sasctl runs");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sasctl(args: &[&str]) -> (i32, String, String) {
    sasctl_with(args, "")
}

#[tokio::test]
async fn a_token_completes_its_step_once_and_a_forged_one_changes_nothing() {
    let Some(endpoint) =
        support::endpoint("a_token_completes_its_step_once_and_a_forged_one_changes_nothing")
    else {
        return;
    };
    let prefix = unique("cb");
    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let provisioned = provision(&sdk, &Layout::standard(&prefix)).await.expect("provisioned");
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), provisioned.tables.clone());
    let dir = std::env::temp_dir().join(unique("sasctl-callbacks"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("definitions.json");
    std::fs::write(&file, DEFINITIONS).unwrap();
    let file = file.to_str().unwrap();
    let (task, token) = waiting_task("appr-1", 7);
    store.insert(&task).await.unwrap();
    let (other, other_token) = waiting_task("appr-2", 9);
    store.insert(&other).await.unwrap();
    let on = ["--prefix", &prefix, "--endpoint-url", &endpoint, "--workflows", file];
    let run = |args: &[&str], stdin: &str| sasctl_with(&[args, &on[..]].concat(), stdin);
    let secret = &token.expose()[token.expose().len() - 60..];

    // show says what it waits for, never the digest.
    let (code, out, err) = run(&["tasks", "show", "appr-1"], "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("  waits for     a callback on step 0 approve, attempt 1: the token sas1.appr-1.0.1.… completes it\n"), "{out}");
    assert!(out.contains("\n  sasctl tasks complete TOKEN --output JSON --prefix "), "{out}");
    assert!(out.contains("  heartbeat     every 10m, none yet\n"), "{out}");
    let (code, out, _) = run(&["tasks", "show", "appr-1", "--json"], "");
    assert_eq!(code, 0);
    let shown: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (shown["waits_for"].as_str(), shown["callback"]["attempt"].as_u64()),
        (Some("callback"), Some(1))
    );
    assert!(!out.contains(&task.callback().unwrap().digest), "the digest is shown: {out}");
    let (code, out, _) = run(&["tasks", "list", "--state", "waiting"], "");
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.starts_with("appr-1") && l.contains("Waiting for callback, due ")),
        "{out}"
    );

    // Forged: the right order, step and attempt, another secret. One line, exit 1.
    let forged = CallbackToken::mint(&task.order_id, 0, 1, &CallbackSecret([8; 32]));
    let (code, out, err) = run(&["tasks", "complete", forged.expose()], "");
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim_end(),
        "sasctl: sas1.appr-1.0.1.0808…: refused: the token does not match the one issued for step 0 attempt 1"
    );
    // Another task's token does not fit this one either, whatever it names.
    let (code, _, err) = run(&["tasks", "heartbeat", &other_token.expose().replace("appr-2", "appr-1")], "");
    assert_eq!(code, 1, "{err}");

    // A heartbeat from stdin: the token stays out of the command line and the output.
    let (code, out, err) = run(&["tasks", "heartbeat", "-"], &format!("{}\n", token.expose()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("appr-1: step 0 approve, attempt 1: Waiting -> Waiting (Heartbeat); next heartbeat or completion due by "),
        "{out}"
    );
    // Another at once, within the floor: acknowledged (exit 0), not written.
    let written = store.task(&task.order_id).await.unwrap().unwrap().revision;
    let (code, out, err) = run(&["tasks", "heartbeat", token.expose()], "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("appr-1: step 0: heartbeat noted (the one written at "), "{out}");
    assert_eq!(store.task(&task.order_id).await.unwrap().unwrap().revision, written);
    // The completion, with its output: the task goes on to ship.
    let (code, out, err) =
        run(&["tasks", "complete", "-", "--output", r#"{"approved_by":"ana"}"#, "--json"], token.expose());
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["from"].as_str(), v["to"].as_str(), v["trigger"].as_str()),
        (Some("Waiting"), Some("Pending"), Some("Advanced"))
    );
    let after = store.task(&task.order_id).await.unwrap().unwrap();
    assert_eq!(
        (after.step, after.outputs.get("approve").unwrap().to_value()["approved_by"].as_str()),
        (1, Some("ana"))
    );
    // Again: the step has ended; nothing changes.
    let (code, out, err) = run(&["tasks", "complete", token.expose()], "");
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.trim_end().ends_with("refused: the token is for step 0 attempt 1, which has ended"), "{err}");
    assert_eq!(store.task(&task.order_id).await.unwrap().unwrap().revision, after.revision);

    // The other task fails by its own token: nothing before it to undo.
    let (code, out, err) = run(&["tasks", "fail", other_token.expose(), "--reason", "declined by ana"], "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("appr-2: step 0 approve, attempt 1: Waiting -> "), "{out}");
    for shown in [&out, &err] {
        assert!(!shown.contains(secret), "a token was shown whole: {shown}");
    }

    // By hand, as an operator without the token: a dry run first changes nothing.
    let (third, third_token) = waiting_task("appr-3", 11);
    store.insert(&third).await.unwrap();
    let by_hand =
        ["tasks", "complete", "--order", "appr-3", "--step", "approve", "--reason", "approved by phone"];
    let (code, out, err) = run(&[&by_hand[..], &["--dry-run"]].concat(), "");
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.trim_end(),
        "appr-3: step approve would be completed by hand: Waiting -> Pending (Advanced); dry run, nothing changed"
    );
    assert_eq!(store.task(&third.order_id).await.unwrap().unwrap().revision, third.revision);
    // Not the step it waits on, or no such step: refused (exit 1), or bad input (exit 2).
    let (code, out, err) =
        run(&["tasks", "fail", "--order", "appr-3", "--step", "ship", "--reason", "no"], "");
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert_eq!(
        err.trim_end(),
        "sasctl: appr-3: step ship: refused: cannot fail a task that is Waiting: it waits on the callback of step approve, not ship"
    );
    let (code, _, err) =
        run(&["tasks", "complete", "--order", "appr-3", "--step", "aprove", "--reason", "x"], "");
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim_end(),
        "sasctl: --step aprove: workflow approve-first v1 has no such step (its callback steps: approve)"
    );
    let (code, out, err) = run(&[&by_hand[..], &["--json"]].concat(), "");
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["outcome"].as_str(), v["to"].as_str()), (Some("applied"), Some("Pending")), "{v}");
    let done = store.task(&third.order_id).await.unwrap().unwrap();
    let entry = done.timeline.last().unwrap();
    assert_eq!(entry.note.as_deref(), Some("approved by phone"));
    assert!(entry.by.as_deref().is_some_and(|by| by.starts_with("arn:aws:")), "{entry:?}");
    // The step no longer waits: its token, and doing it again by hand, change nothing.
    let (code, _, err) = run(&["tasks", "complete", third_token.expose()], "");
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = run(&by_hand, "");
    assert_eq!(code, 1, "{err}");
    assert_eq!(store.task(&third.order_id).await.unwrap().unwrap().revision, done.revision);

    let clients = sas::adapters::aws::Clients::new(&sdk);
    let all = sasctl::resources::existing(&clients, &Layout::standard(&prefix)).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What is wrong with the input is said before any deployment is looked for: one line,
/// exit 2, and never the token.
#[test]
fn bad_input_is_one_line_and_exit_2() {
    let token = CallbackToken::mint(&OrderId::parse("o-1").unwrap(), 1, 2, &CallbackSecret([5; 32]));
    let cases: [(&[&str], &str, &str); 6] = [
        (&["tasks", "complete"], "", "sasctl: missing <TOKEN> (see --help)"),
        (&["tasks", "fail", token.expose()], "", "sasctl: missing --reason <TEXT> (see --help)"),
        (
            &["tasks", "heartbeat", "sas1.o-1.1.2.0505"],
            "",
            "sasctl: TOKEN: a callback token is sas1.<order id>.<step>.<attempt>.<64 hex digits>; this one does not end in 64 lower-case hex digits",
        ),
        (&["tasks", "heartbeat", "-"], "\n", "sasctl: TOKEN -: stdin had no token (give it on one line)"),
        (
            &["tasks", "complete", token.expose(), "--output", "{approved: yes}"],
            "",
            "sasctl: --output is not JSON: key must be a string at line 1 column 2",
        ),
        (
            &["tasks", "complete", "-", "--output", "1", "--output-file", "x.json"],
            token.expose(),
            "sasctl: --output <JSON> cannot be used with --output-file <PATH> (see --help)",
        ),
    ];
    for (args, stdin, want) in cases {
        let (code, out, err) = sasctl_with(&[args, &["--prefix", "p"][..]].concat(), stdin);
        assert_eq!((code, out.as_str()), (2, ""), "sasctl {args:?}: {err}");
        assert_eq!(err.trim_end(), want, "sasctl {args:?}");
        assert!(!err.contains(&token.expose()[30..]), "the token was shown: {err}");
    }
    // An output no step could keep would give the step up: refused before it is sent.
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(5_000));
    let (code, _, err) = sasctl(&["tasks", "complete", token.expose(), "--output", &big, "--prefix", "p"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("sasctl: --output cannot be the step's output: "), "{err}");
}

/// A deployment that cannot be reached is exit 3 (run it again), not 1 (refused) or 2.
#[test]
fn an_unreachable_deployment_is_exit_3() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let token = CallbackToken::mint(&OrderId::parse("o-1").unwrap(), 1, 2, &CallbackSecret([5; 32]));
    let (code, out, err) =
        sasctl(&["tasks", "complete", token.expose(), "--prefix", "p", "--endpoint-url", &url]);
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sasctl: sas1.o-1.1.2.0505…: not applied: ") && err.contains("could not be reached"),
        "{err}"
    );
}
