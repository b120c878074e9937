//! `sasctl tasks` on bad input, as an operator meets it: one line on stderr naming what
//! was wrong, a non-zero exit, nothing on stdout, no SDK dump and no usage block. None of
//! these needs an emulator.

use std::process::{Command, Output};

fn sasctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(args)
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("SAS_WORKFLOWS")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_PROFILE")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("sasctl runs")
}

fn one_line(args: &[&str], code: i32) -> String {
    let out = sasctl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "sasctl {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "sasctl {args:?} printed to stdout: {:?}", out.stdout);
    assert_eq!(stderr.lines().count(), 1, "sasctl {args:?}: not one line: {stderr}");
    for noise in ["SdkError", "DispatchFailure", "ConnectorError", "Request {", "Usage:", "panicked"] {
        assert!(!stderr.contains(noise), "sasctl {args:?}: {noise:?} in {stderr}");
    }
    stderr.trim_end().to_owned()
}

fn free_port_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}")
}

#[test]
fn an_action_needs_a_reason_that_says_something() {
    for verb in ["resubmit", "compensate", "cancel"] {
        assert_eq!(
            one_line(&["tasks", verb, "o-1", "--prefix", "p"], 2),
            "sasctl: missing --reason <TEXT> (see --help)"
        );
        assert_eq!(
            one_line(&["tasks", verb, "o-1", "--reason", "  ", "--prefix", "p"], 2),
            "sasctl: --reason must not be empty"
        );
    }
}

#[test]
fn an_id_or_a_state_but_not_both() {
    assert_eq!(
        one_line(&["tasks", "resubmit", "o-1", "--state", "error", "--reason", "x"], 2),
        "sasctl: [ID] cannot be used with --state <STATE> (see --help)"
    );
    let line = one_line(&["tasks", "cancel", "--reason", "x"], 2);
    assert!(line.starts_with("sasctl: missing ") && line.contains("<ID|--state <STATE>>"), "{line}");
    // One task's preview is taken: it goes on to read the task (here from an endpoint
    // where nothing listens).
    let url = free_port_url();
    let line = one_line(
        &[
            "tasks",
            "compensate",
            "o-1",
            "--reason",
            "x",
            "--dry-run",
            "--prefix",
            "p",
            "--endpoint-url",
            &url,
        ],
        2,
    );
    assert!(line.contains(&url) && line.contains("could not be reached"), "{line}");
    assert_eq!(
        one_line(&["tasks", "compensate", "--state", "stuck", "--reason", "x"], 2),
        "sasctl: compensate applies to tasks in Error only: --state error (not stuck)"
    );
}

#[test]
fn bad_values_are_named() {
    assert_eq!(
        one_line(&["tasks", "list", "--since", "2 hours"], 2),
        "sasctl: --since must be a whole number and a unit s, m, h or d, e.g. 90s, 15m, 2h, 3d (got \"2 hours\")"
    );
    assert_eq!(one_line(&["tasks", "list", "--limit", "0"], 2), "sasctl: --limit must be at least 1 (got 0)");
    assert_eq!(
        one_line(&["tasks", "show", "not an id", "--prefix", "p"], 2),
        "sasctl: ID \"not an id\": order_id contains ' '; only ASCII letters, digits, '-' and '_' are allowed"
    );
}

#[test]
fn bad_or_unreachable_endpoints_and_unknown_deployments_are_one_line() {
    assert_eq!(
        one_line(&["tasks", "list", "--prefix", "p", "--endpoint-url", "notaurl"], 2),
        "sasctl: --endpoint-url \"notaurl\" is not an http(s) URL such as http://127.0.0.1:4566"
    );
    let url = free_port_url();
    let line = one_line(&["tasks", "show", "o-1", "--stack", "sas", "--endpoint-url", &url], 2);
    assert!(
        line.starts_with(&format!("sasctl: reading stack sas (CloudFormation DescribeStacks) at {url} failed: it could not be reached (")),
        "{line}"
    );
    // On AWS itself nothing is assumed; on an emulator's endpoint, `sasctl up`'s prefix.
    assert_eq!(
        one_line(&["tasks", "list"], 2),
        "sasctl: no state table: no deployment named; give --table, or name the deployment with --stack NAME or --prefix P (or SAS_STACK / SAS_PREFIX)"
    );
    let line = one_line(&["tasks", "list", "--endpoint-url", &url], 2);
    assert!(
        line.starts_with(&format!(
            "sasctl: looking up queue sas-local-orders (SQS GetQueueUrl) at {url} failed"
        )),
        "{line}"
    );
}

/// A variable set but empty (`export SAS_WORKFLOWS=`) is unset, as SAS_STACK and SAS_PREFIX
/// are: not a value the user never typed.
#[test]
fn an_empty_variable_is_unset() {
    for var in ["SAS_WORKFLOWS", "SAS_DUE_SHARDS"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .args(["tasks", "show", "not an id", "--prefix", "p"])
            .env(var, "")
            .output()
            .expect("sasctl runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim_end(),
            "sasctl: ID \"not an id\": order_id contains ' '; only ASCII letters, digits, '-' and '_' are allowed",
            "{var}="
        );
    }
}

#[test]
fn a_definition_file_that_cannot_be_read_is_one_line() {
    let line = one_line(&["tasks", "list", "--prefix", "p", "--workflows", "/nonexistent/flows.json"], 2);
    assert!(line.starts_with("sasctl: cannot read /nonexistent/flows.json: "), "{line}");
}
