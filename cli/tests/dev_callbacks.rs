//! `sasctl dev` with the approval example (a callback step), as a user runs it: the
//! built binary, some of every callback fault, `--json`; the report's `callbacks` figures
//! agree with each other and with the final states, and every invariant holds.

use std::process::Command;

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn dev(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl")).arg("dev").args(args).output().expect("sasctl runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("not a JSON report ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout))
    });
    (out.status.code().unwrap_or(-1), report, stderr)
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn the_approval_example_under_callback_faults_reports_consistent_figures() {
    let file = example("approval.json");
    let (code, report, stderr) = dev(&[
        "--workflows",
        &file,
        "--workflow",
        "approval",
        "--orders",
        "120",
        "--seed",
        "7",
        "--step-timeout-ms",
        "400",
        "--supervisor-period-ms",
        "100",
        "--max-seconds",
        "120",
        "--callback-delay-ms",
        "150",
        "--callback-failure-rate",
        "0.1",
        "--callback-late-rate",
        "0.05",
        "--callback-never-rate",
        "0.05",
        "--callback-duplicate-rate",
        "0.2",
        "--callback-stale-rate",
        "0.2",
        "--callback-forged-rate",
        "0.3",
        "--json",
    ]);
    assert_eq!(code, 0, "violations: {}\n{stderr}", report["violations"]);
    assert_eq!(report["violations"], serde_json::json!([]));
    let c = &report["callbacks"];
    let (completed, refused, timed_out, waited) =
        (n(&c["completed"]), n(&c["refused"]), n(&c["timed_out"]), n(&c["waited"]));
    let attempts: u64 = c["attempts"].as_object().unwrap().values().map(n).sum();
    let processed = n(&report["final_states"]["Processed"]);
    assert!(processed > 0 && completed > 0, "{c}");
    // Each Processed order had its approval completed; each wait that began ended by a
    // word or a lapse; each attempt the service started ended one of those ways, unless
    // its agent's call itself lapsed first.
    assert!(completed >= processed, "{c} vs {processed} Processed");
    assert!(completed + timed_out >= waited, "{c}");
    // "of them waited": those that waited are among the attempts the service started.
    assert!(waited <= attempts, "{c}");
    assert!(completed + timed_out <= attempts, "{c}");
    // Every bad word sent was refused (forged ones among them), and nothing else was
    // completed: at most one word an attempt.
    let bad: u64 = c["bad_sent"].as_object().unwrap().values().map(n).sum();
    assert!(n(&c["bad_sent"]["forged"]) > 0, "{c}");
    assert!(refused >= bad && refused > 0, "{c}");
    // The timers' figures are there by their names, with nothing to count here.
    let t = &report["timers"];
    assert_eq!((n(&t["woken"]), n(&t["schedules_early"]), t["max_late_ms"].is_null()), (0, 0, true), "{t}");
    assert!(t.get("early").is_none() && t.get("fired").is_none() && c.get("started").is_none(), "{report}");
}

#[test]
fn the_approval_example_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["workflows", "validate", &example("approval.json")])
        .output()
        .expect("sasctl runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("valid (0 warnings)\n"), "{out:?}");
}

#[test]
fn callback_rates_that_leave_no_room_are_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dev", "--callback-failure-rate", "0.6", "--callback-never-rate", "0.5"])
        .output()
        .expect("sasctl runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        "sasctl: --callback-failure-rate + --callback-late-rate + --callback-never-rate must add up to at most 1 (got 0.6 + 0.02 + 0.5 = 1.12)"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dev", "--callback-forged-rate", "2"])
        .output()
        .expect("sasctl runs");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        "sasctl: --callback-forged-rate must be a number from 0 to 1 (got 2)"
    );
}

/// The human report has a callbacks section, each figure with what it counts, in 80
/// columns; a run without callback steps has none.
#[test]
fn the_report_says_what_each_callback_figure_counts() {
    let file = example("approval.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dev", "--workflows", &file, "--workflow", "approval", "--orders", "40", "--seed", "3"])
        .args(["--callback-forged-rate", "0.5", "--step-timeout-ms", "400", "--supervisor-period-ms", "100"])
        .output()
        .expect("sasctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let section =
        &text[text.find("\ncallbacks (").unwrap_or_else(|| panic!("no callbacks section: {text}"))..];
    let section = &section[..section.find("\n\n").unwrap()];
    for meaning in [
        "attempts the service started",
        "of them waited",
        "completed: a success or failure from the outside applied",
        "heartbeats applied",
        "refused: words that changed nothing",
        "timed out: waits that lapsed",
        "bad words sent, each to be refused",
    ] {
        assert!(section.contains(meaning), "{meaning:?} missing from {section}");
    }
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "over 80 columns: {line:?}");
    }
    let plain = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dev", "--orders", "10", "--malformed", "0"])
        .output()
        .expect("sasctl runs");
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("\ncallbacks ("));
}
