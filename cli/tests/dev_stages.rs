//! `sasctl dev` with parallel stages (examples/parallel.json): a fault given to one
//! agent's service hits only the branch that calls that agent.

use std::collections::BTreeMap;
use std::time::Duration;

use sas::domain::{Action, ProcessState, Workflow, idempotency_key};
use sasctl::dev::{self, DevOptions, DevOutcome};
use sasctl::remote_sim::RemoteFaults;

fn parallel() -> sas::domain::Definitions {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/parallel.json")).unwrap();
    sas::domain::Definitions::parse(&text).unwrap()
}

/// The example with every service healthy except what `fault` (an `--agent-fault`) says.
async fn run_with(fault: &str, seed: u64) -> DevOutcome {
    let definitions = parallel();
    let agents: Vec<String> = definitions.agents.keys().cloned().collect();
    let agents: Vec<&str> = agents.iter().map(String::as_str).collect();
    let healthy = RemoteFaults { latency_max_ms: 1, ..RemoteFaults::default() };
    let fault: sasctl::agent_fault::AgentFault = fault.parse().unwrap();
    let options = DevOptions {
        orders: 30,
        definitions,
        workflow: "parallel-order".into(),
        faults: healthy,
        agent_faults: sasctl::agent_fault::per_agent(&[fault], healthy, &agents).unwrap(),
        duplicate_rate: 0.0,
        malformed: 0,
        queue_duplicate_rate: 0.0,
        // Wide enough that a reservation answered in 1 ms never lapses on a busy machine.
        step_timeout_ms: 1_000,
        supervisor_period_ms: 100,
        failure_threshold: 3,
        seed,
        max_runtime: Duration::from_secs(120),
        ..DevOptions::default()
    };
    let run = dev::run(options, |_| {}).await.expect("dev run starts");
    assert!(!run.timed_out && run.tasks.len() == 30 && run.tasks.iter().all(|t| t.state().is_terminal()));
    run
}

fn wf(run: &DevOutcome) -> Workflow {
    run.workflows.get("parallel-order").unwrap().clone()
}

/// Every screen is refused: each order gives up at the stage, and undoes the two
/// reservations (dispatched with it, so they may have taken effect) and nothing else.
/// No other key is refused, and nothing after the stage is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_fraud_service_refuses_only_the_screen_branch() {
    let run = run_with("fraud=refuse:0.999", 41).await;
    let wf = wf(&run);
    let screen = wf.steps.iter().position(|s| s.name == "screen").unwrap() as u32;
    assert!(run.tasks.iter().all(|t| t.state() == ProcessState::Compensated), "{:?}", run.tasks[0].state());
    let refused: Vec<&String> = run
        .ledger
        .settled
        .iter()
        .filter(|(_, s)| **s == sas_sim::ledger::Settled::Refused)
        .map(|(k, _)| k)
        .collect();
    assert_eq!(refused.len(), 30, "{refused:?}");
    for t in &run.tasks {
        let key = |step, action| idempotency_key(&t.order_id, step, action).0;
        assert!(refused.contains(&&key(screen, Action::Do)));
        for reserve in ["reserve-east", "reserve-west"] {
            let step = wf.steps.iter().position(|s| s.name == reserve).unwrap() as u32;
            let (done, undone) = (
                run.ledger.is_applied(&key(step, Action::Do)),
                run.ledger.is_applied(&key(step, Action::Undo)),
            );
            assert!(!done || undone, "order {}: {reserve} applied and never undone", t.order_id);
        }
        for later in wf.after(screen)..wf.len() {
            assert!(
                !run.ledger.keys.contains_key(&(t.order_id.to_string(), later, Action::Do)),
                "step {later} ran"
            );
        }
    }
}

/// Every screen hangs: the stage lapses until screen's budget is spent. Each retry
/// dispatches screen alone; the reservations, which answered, are dispatched once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_fraud_service_retries_only_the_screen_branch() {
    let run = run_with("fraud=hang:0.999", 42).await;
    let wf = wf(&run);
    let stage = &wf.stages[0];
    // The most dispatches each branch had, over every record written.
    let mut most: BTreeMap<u32, u32> = BTreeMap::new();
    for w in &run.writes {
        for (step, b) in w.after.stage().iter().flat_map(|r| r.each()) {
            let n = most.entry(step).or_default();
            *n = (*n).max(b.dispatches);
        }
    }
    let names: BTreeMap<&str, u32> =
        stage.branches().map(|s| (wf.steps[s as usize].name.as_str(), most[&s])).collect();
    assert_eq!(names, BTreeMap::from([("reserve-east", 1), ("reserve-west", 1), ("screen", 3)]));
    assert!(run.tasks.iter().all(|t| t.state() == ProcessState::Compensated));
}

/// As a user runs it: `sasctl dev --workflows examples/parallel.json`, with one
/// warehouse refusing some reservations besides the usual faults, `--json`. Every order
/// ends, some undone, and every invariant holds, those of the shared checker
/// (`sas_sim::invariants`) among them, which knows stages: several branches in flight
/// under one lease, replies fenced per branch, an undo of exactly the branches that may
/// have taken effect.
#[test]
fn the_parallel_example_runs_to_a_clean_report() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/parallel.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["dev", "--workflows", file, "--orders", "150", "--seed", "5", "--step-timeout-ms", "400"])
        .args(["--supervisor-period-ms", "100", "--failure-threshold", "3", "--max-seconds", "120"])
        .args(["--agent-fault", "warehouse-west=refuse:0.2", "--json"])
        .output()
        .expect("sasctl runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let violations = report["violations"].as_array().expect("a list");
    assert!(
        violations.is_empty(),
        "{} violations, e.g. {:?}",
        violations.len(),
        violations.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(report["workflow"], "parallel-order");
    let states = &report["final_states"];
    let n = |s: &str| states[s].as_u64().unwrap();
    assert_eq!(n("Processed") + n("Compensated") + n("Error"), report["accepted"].as_u64().unwrap());
    assert!(n("Processed") > 0 && n("Compensated") > 0, "{states}");
}
