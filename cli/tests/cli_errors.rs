//! Bad input to `sasctl dev` as a new user meets it: each is one line on stderr that
//! names the option (or the URL) and what to do, and exit status 2; never clap's usage
//! noise for a number, never an SDK debug dump. None of these needs an emulator.

use std::process::{Command, Output};

fn sasctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sasctl")).args(args).output().expect("sasctl runs")
}

/// Exit 2, nothing on stdout, and exactly one line on stderr, which it returns.
fn one_line_and_exit_2(args: &[&str]) -> String {
    let out = sasctl(args);
    assert!(out.stdout.is_empty(), "sasctl {args:?} printed to stdout: {:?}", out.stdout);
    one_error_line(args, &out)
}

/// Exit 2 and exactly one line on stderr, free of debug dumps; returns it.
fn one_error_line(args: &[&str], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "sasctl {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "sasctl {args:?}: not one line: {stderr}");
    for noise in ["SdkError", "DispatchFailure", "ConnectorError", "Request {", "Usage:", "panicked"] {
        assert!(!stderr.contains(noise), "sasctl {args:?}: {noise:?} in {stderr}");
    }
    stderr.trim_end().to_owned()
}

#[test]
fn numeric_options_out_of_range_are_one_line_naming_the_option() {
    let cases: &[(&[&str], &str)] = &[
        (&["dev", "--orders", "-5"], "sasctl: --orders must be at least 1 (got -5)"),
        (&["dev", "--orders", "0"], "sasctl: --orders must be at least 1 (got 0)"),
        (&["dev", "--orders=-5"], "sasctl: --orders must be at least 1 (got -5)"),
        (&["dev", "--orders", "many"], "sasctl: --orders must be a whole number (got \"many\")"),
        (&["dev", "--hang-rate", "1.5"], "sasctl: --hang-rate must be a number from 0 to 1 (got 1.5)"),
        (
            &["dev", "--failure-rate", "-0.2"],
            "sasctl: --failure-rate must be a number from 0 to 1 (got -0.2)",
        ),
        (
            &["dev", "--duplicate-rate", "NaN"],
            "sasctl: --duplicate-rate must be a number from 0 to 1 (got NaN)",
        ),
        (
            &["dev", "--supervisor-period-ms", "0"],
            "sasctl: --supervisor-period-ms must be at least 1 (got 0)",
        ),
        (
            &["dev", "--step-timeout-ms", "18446744073709551615"],
            "sasctl: --step-timeout-ms must be at most 50000 (got 18446744073709551615)",
        ),
        (&["dev", "--concurrency", "0"], "sasctl: --concurrency must be at least 1 (got 0)"),
        (&["dev", "--failure-threshold", "0"], "sasctl: --failure-threshold must be at least 1 (got 0)"),
        (&["dev", "--max-seconds", "0"], "sasctl: --max-seconds must be at least 1 (got 0)"),
        (&["dev", "--malformed", "-1"], "sasctl: --malformed must be at least 0 (got -1)"),
        (&["dev", "--seed", "-7"], "sasctl: --seed must be at least 0 (got -7)"),
        (
            &["dev", "--failure-rate", "0.5", "--hang-rate", "0.5"],
            "sasctl: --failure-rate + --permanent-rate + --hang-rate must add up to less than 1 (got 0.5 + 0.01 + 0.5 = 1.01)",
        ),
        (
            &["dev", "--failure-rate", "0.6", "--hang-rate", "0.5"],
            "sasctl: --failure-rate + --permanent-rate + --hang-rate must add up to less than 1 (got 0.6 + 0.01 + 0.5 = 1.11)",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(one_line_and_exit_2(args), *want, "sasctl {args:?}");
    }
}

#[test]
fn an_endpoint_that_is_not_a_url_is_named_with_an_example() {
    for url in ["notaurl", "localhost:4566", "http://"] {
        let line = one_line_and_exit_2(&["dev", "--orders", "5", "--endpoint-url", url]);
        assert_eq!(
            line,
            format!("sasctl: --endpoint-url {url:?} is not an http(s) URL such as http://127.0.0.1:4566")
        );
    }
}

#[test]
fn an_unreachable_endpoint_is_named_with_what_to_do() {
    // A loopback port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let line = one_line_and_exit_2(&["dev", "--orders", "5", "--endpoint-url", &url]);
    assert!(line.starts_with(&format!("sasctl: cannot reach the AWS endpoint {url} (")), "{line}");
    assert!(line.contains("start moto (infra/moto.sh start) or LocalStack, or check the URL"), "{line}");
    assert!(line.len() < 200, "{line}");
}

/// `up` names a bad endpoint, prefix, option or definition file in one line, before
/// it creates anything.
#[test]
fn up_names_its_bad_input_in_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let remote = ["--remote-service-url", "http://127.0.0.1:9"];
    let line = one_line_and_exit_2(&[&["up", "--endpoint-url", &url][..], &remote].concat());
    assert!(line.starts_with(&format!("sasctl: cannot reach the AWS endpoint {url} (")), "{line}");
    assert!(line.contains("start moto (infra/moto.sh start) or LocalStack, or check the URL"), "{line}");
    let cases: &[(&[&str], &str)] = &[
        (
            &["up", "--endpoint-url", "notaurl"],
            "sasctl: --endpoint-url \"notaurl\" is not an http(s) URL such as http://127.0.0.1:4566",
        ),
        (&["up"], "sasctl: missing --endpoint-url <URL> (see --help)"),
        (
            &["up", "--emulator", "moto", "--endpoint-url", &url],
            "sasctl: --emulator <EMULATOR> cannot be used with --endpoint-url <URL> (see --help)",
        ),
        (
            &["up", "--endpoint-url", &url, "--dynamodb-endpoint-url", "nope"],
            "sasctl: --dynamodb-endpoint-url \"nope\" is not an http(s) URL such as http://127.0.0.1:8000",
        ),
        (
            &["up", "--endpoint-url", &url, "--prefix", "a/b"],
            "sasctl: --prefix \"a/b\" must be 1 to 40 of [A-Za-z0-9_-] (it names the table, queues and topic)",
        ),
        (
            &["up", "--endpoint-url", &url, "--supervisor-period-ms", "5"],
            "sasctl: --supervisor-period-ms must be at least 100 (got 5)",
        ),
        (
            &["up", "--endpoint-url", &url, "--concurrency", "0"],
            "sasctl: --concurrency must be at least 1 (got 0)",
        ),
        (
            &["up", "--endpoint-url", &url, "--failure-rate", "0.5", "--hang-rate", "0.5"],
            "sasctl: --failure-rate, --permanent-rate and --hang-rate must add up to less than 1",
        ),
        (
            &["up", "--endpoint-url", &url, "--agent-fault", "nobody=fail:0.1"],
            "sasctl: --agent-fault names agent \"nobody\"; the definitions have: inventory, orders, payment, shipping",
        ),
    ];
    for (args, want) in cases {
        let out =
            Command::new(env!("CARGO_BIN_EXE_sasctl")).args(*args).env_remove("REMOTE_SERVICE_URL").output();
        assert_eq!(one_error_line(args, &out.expect("sasctl runs")), *want, "sasctl {args:?}");
    }
}

/// `workflows publish` takes an endpoint too.
#[test]
fn publish_names_a_bad_or_unreachable_endpoint_in_one_line() {
    let file = format!("{}/../examples/workflows.json", env!("CARGO_MANIFEST_DIR"));
    let line = one_line_and_exit_2(&["workflows", "publish", &file, "--endpoint-url", "notaurl"]);
    assert_eq!(
        line,
        "sasctl: --endpoint-url \"notaurl\" is not an http(s) URL such as http://127.0.0.1:4566"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let args = ["workflows", "publish", &file, "--endpoint-url", &url];
    let line = one_error_line(&args, &sasctl(&args));
    assert!(line.contains(&url) && line.contains("could not be reached"), "{line}");
}

#[test]
fn keep_needs_an_endpoint() {
    let out = sasctl(&["dev", "--keep"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--endpoint-url"), "{out:?}");
}

/// The report names the seed, says what each figure counts, and its alert figures add
/// up to the alerts raised.
#[test]
fn the_report_names_its_seed_and_the_meaning_of_each_figure() {
    let common = ["dev", "--orders", "40", "--workflow", "three-step", "--seed", "42", "--hang-rate", "0.2"];
    let out = sasctl(&[&common[..], &["--failure-threshold", "2"]].concat());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sas dev run: 40 three-step orders, seed 42:"), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "over 80 columns: {line:?}");
        // A figure alone on its line would say nothing of what it counts.
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(!(words.len() == 1 && words[0].parse::<u64>().is_ok()), "a bare figure: {line:?}");
    }
    for meaning in ["for orders that ended Error", "for orders that ended Compensated", "repeats:"] {
        assert!(text.contains(meaning), "{meaning:?} missing from {text}");
    }

    let out = sasctl(&[&common[..], &["--failure-threshold", "2", "--json"]].concat());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(json["seed"], 42);
    let n = |k: &str| json[k].as_u64().unwrap_or_else(|| panic!("{k} in {json}"));
    assert_eq!(
        n("alerts_for_error")
            + n("alerts_for_compensated")
            + n("alerts_for_unfinished")
            + n("alerts_repeated"),
        n("alerts")
    );
    assert!(n("alerts") > 0, "a 20% hang rate with a budget of 2 gives up on some steps: {json}");
}
