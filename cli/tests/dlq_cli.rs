//! `sasctl dlq` on bad input, as an operator meets it: one line on stderr naming what was
//! wrong and how to fix it, exit status 2, nothing on stdout. None of these needs an
//! emulator.

use std::process::{Command, Output};

fn sasctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(args)
        // Whatever the machine has: no deployment named, a region (so no instance
        // metadata lookup), no credentials needed.
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_PROFILE")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("sasctl runs")
}

fn one_line_and_exit_2(args: &[&str]) -> String {
    let out = sasctl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "sasctl {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "sasctl {args:?} printed to stdout: {:?}", out.stdout);
    assert_eq!(stderr.lines().count(), 1, "sasctl {args:?}: not one line: {stderr}");
    for noise in ["SdkError", "DispatchFailure", "ConnectorError", "Usage:", "panicked"] {
        assert!(!stderr.contains(noise), "sasctl {args:?}: {noise:?} in {stderr}");
    }
    stderr.trim_end().to_owned()
}

#[test]
fn a_queue_that_is_neither_a_work_queue_nor_a_url_is_one_line() {
    for verb in ["list", "redrive"] {
        assert_eq!(
            one_line_and_exit_2(&["dlq", verb, "status"]),
            "sasctl: <QUEUE>: must be orders, scheduler, agent, callbacks or a DLQ's URL (got \"status\")"
        );
    }
}

/// On AWS itself (no endpoint), nothing is assumed.
#[test]
fn no_deployment_named_says_how_to_name_one() {
    assert_eq!(
        one_line_and_exit_2(&["dlq", "list", "orders"]),
        "sasctl: no orders DLQ: no deployment named; give --orders-queue, or name the deployment with --stack NAME or --prefix P (or SAS_STACK / SAS_PREFIX)"
    );
}

/// On an emulator's endpoint with nothing named: `sasctl up`'s default prefix, sas-local.
#[test]
fn on_an_emulator_nothing_named_is_sasctl_ups_prefix() {
    let line = one_line_and_exit_2(&["dlq", "list", "orders", "--endpoint-url", "http://127.0.0.1:1"]);
    assert!(
        line.starts_with(
            "sasctl: looking up queue sas-local-orders (SQS GetQueueUrl) at http://127.0.0.1:1 failed"
        ),
        "{line}"
    );
}

#[test]
fn bad_or_unreachable_endpoints_are_one_line() {
    assert_eq!(
        one_line_and_exit_2(&["dlq", "list", "orders", "--stack", "sas", "--endpoint-url", "notaurl"]),
        "sasctl: --endpoint-url \"notaurl\" is not an http(s) URL such as http://127.0.0.1:4566"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let line = one_line_and_exit_2(&["dlq", "redrive", "agent", "--stack", "sas", "--endpoint-url", &url]);
    assert!(line.starts_with(&format!("sasctl: reading stack sas (CloudFormation DescribeStacks) at {url} failed: it could not be reached (")), "{line}");
    assert!(line.contains("infra/moto.sh start"), "{line}");

    // An endpoint from the environment, as the SDK reads it, but no credentials (over
    // https: a plain-http endpoint is signed with throwaway credentials, never the chain's).
    let url = format!("https://127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dlq", "list", "orders", "--stack", "sas"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env_remove("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        .env_remove("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ENDPOINT_URL", &url)
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("at {url} failed: no AWS credentials (")), "{stderr}");
}

#[test]
fn stack_and_prefix_exclude_each_other_and_limit_needs_a_dry_run() {
    let out = sasctl(&["dlq", "list", "orders", "--stack", "a", "--prefix", "b"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = sasctl(&["dlq", "redrive", "orders", "--limit", "5"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        one_line_and_exit_2(&["dlq", "redrive", "orders", "--rate", "501"]),
        "sasctl: --rate must be at most 500 (got 501)"
    );
}
