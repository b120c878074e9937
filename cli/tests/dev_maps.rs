//! `sasctl dev` with a map step: the report's `maps.<name>` figures (items run over, the
//! most items of one order in flight at once, items undone) against what the run's own
//! records and the simulated service's ledger say.

use std::time::Duration;

use sas::domain::{Definitions, ProcessState};
use sasctl::dev::{self, DevOptions, DevOutcome};
use sasctl::remote_sim::RemoteFaults;
use sasctl::report::Report;

/// charge, then reserve-lines over the order's lines (1 to 3 in a dev run), at most
/// `cap` at a time, then ship.
fn definitions(cap: u32) -> Definitions {
    definitions_with(cap, "{}")
}

/// As `definitions`, the warehouse agent defined as `warehouse` (its limits, say).
fn definitions_with(cap: u32, warehouse: &str) -> Definitions {
    let text = format!(
        r#"{{
  "agents": {{"payment": {{}}, "warehouse": {warehouse}, "shipping": {{}}}},
  "workflows": [{{
    "name": "map-order",
    "steps": [
      {{"name": "charge", "agent": "payment", "compensation": "refund"}},
      {{"map": {{"name": "reserve-lines", "items": "$.order.items", "max_concurrency": {cap},
                "step": {{"name": "reserve", "agent": "warehouse", "compensation": "release"}}}}}},
      {{"name": "ship", "agent": "shipping"}}
    ]
  }}]
}}"#
    );
    Definitions::parse(&text).unwrap()
}

/// Every service healthy except the `--agent-fault`s given: refusals at the warehouse
/// (one item refused undoes the others) and at shipping (the whole map undone).
async fn run_with(cap: u32, faults: &[&str], seed: u64) -> DevOutcome {
    run_of(definitions(cap), faults, seed).await
}

async fn run_of(definitions: Definitions, faults: &[&str], seed: u64) -> DevOutcome {
    let agents: Vec<String> = definitions.agents.keys().cloned().collect();
    let agents: Vec<&str> = agents.iter().map(String::as_str).collect();
    let healthy = RemoteFaults { latency_max_ms: 2, ..RemoteFaults::default() };
    let faults: Vec<sasctl::agent_fault::AgentFault> = faults.iter().map(|f| f.parse().unwrap()).collect();
    let options = DevOptions {
        orders: 60,
        definitions,
        workflow: "map-order".into(),
        faults: healthy,
        agent_faults: sasctl::agent_fault::per_agent(&faults, healthy, &agents).unwrap(),
        duplicate_rate: 0.0,
        malformed: 0,
        queue_duplicate_rate: 0.0,
        step_timeout_ms: 1_000,
        supervisor_period_ms: 100,
        failure_threshold: 3,
        seed,
        max_runtime: Duration::from_secs(120),
        ..DevOptions::default()
    };
    let run = dev::run(options, |_| {}).await.expect("dev run starts");
    assert!(!run.timed_out && run.tasks.len() == 60 && run.tasks.iter().all(|t| t.state().is_terminal()));
    run
}

/// The item undos the simulated service applied: keys `<order>:1.<index>:undo`.
fn item_undos_applied(run: &DevOutcome) -> u64 {
    run.ledger.applied.keys().filter(|k| k.ends_with(":undo") && k.contains(":1.")).count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_a_maps_items_its_most_in_flight_and_its_items_undone() {
    let run = run_with(3, &["warehouse=refuse:0.15", "shipping=refuse:0.3"], 7).await;
    let report = Report::new(&run, &[]);
    let m = &report.maps["reserve-lines"];
    // The charge never fails: every order's map read its lines.
    let lines: usize = run.tasks.iter().map(|t| t.order.items.len()).sum();
    assert_eq!(m.items, lines as u64);
    assert_eq!(m.max_concurrency, 3);
    // Orders of two or three lines dispatch them at once at the map's claim.
    assert!(m.max_in_flight_seen > 1 && m.max_in_flight_seen <= 3, "{m:?}");
    let compensated = run.tasks.iter().filter(|t| t.state() == ProcessState::Compensated).count();
    assert!(compensated > 0, "{:?}", report.final_states);
    assert!(m.undone > 0, "{m:?}");
    // Every undo the pipeline saw succeed is one the service applied, and none other.
    assert_eq!(m.undone, item_undos_applied(&run), "{m:?}");
    assert!(report.compensation_steps >= m.undone);
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(
        v["maps"]["reserve-lines"],
        serde_json::json!({"max_concurrency": 3, "items": m.items,
                           "max_in_flight_seen": m.max_in_flight_seen, "undone": m.undone})
    );
    let text = report.render();
    assert!(
        text.contains("\nmap steps (from the records the run wrote)\n  reserve-lines: at most 3 items"),
        "{text}"
    );
}

/// One at a time: never two items of an order in flight, whatever its lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_of_one_at_a_time_never_has_two_items_in_flight() {
    let run = run_with(1, &[], 8).await;
    let report = Report::new(&run, &[]);
    let m = &report.maps["reserve-lines"];
    assert_eq!((m.max_in_flight_seen, m.undone), (1, 0), "{m:?}");
    assert!(run.tasks.iter().all(|t| t.state() == ProcessState::Processed));
    assert!(m.items > 60, "some orders have several lines: {m:?}");
}

/// A map over an agent with limits sends one item at a time, each through the agent's gate:
/// whatever its cap, no order has two items in flight, the service never sees more calls at
/// once than the agent's `max_in_flight` (the run's invariants check it), and the items
/// refused undo the others as for any map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_over_a_limited_agent_takes_places_item_by_item() {
    let definitions = definitions_with(3, r#"{"max_in_flight": 2}"#);
    assert!(definitions.workflows.default_workflow().maps[0].gated);
    let run = run_of(definitions, &["warehouse=refuse:0.1"], 9).await;
    let violations = sasctl::invariants::check(&run);
    assert!(violations.is_empty(), "{violations:#?}");
    let m = &Report::new(&run, &[]).maps["reserve-lines"];
    assert_eq!(m.max_in_flight_seen, 1, "{m:?}");
    assert!(m.items > 60, "some orders have several lines: {m:?}");
    let seen = run.flights.get("warehouse").map(|f| f.max_in_flight);
    assert!(seen.is_some_and(|n| (1..=2).contains(&n)), "the warehouse saw {seen:?} calls at once");
    let states: Vec<_> = run.tasks.iter().map(|t| t.state()).collect();
    assert!(
        states.contains(&ProcessState::Processed) && states.contains(&ProcessState::Compensated),
        "{states:?}"
    );
}

/// A run of a workflow without a map has no `maps` in its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_a_map_reports_no_maps() {
    let options =
        DevOptions { orders: 5, malformed: 0, max_runtime: Duration::from_secs(60), ..DevOptions::default() };
    let run = dev::run(options, |_| {}).await.expect("dev run starts");
    let v = serde_json::to_value(Report::new(&run, &[])).unwrap();
    assert!(v.get("maps").is_none(), "{v}");
    assert!(!Report::new(&run, &[]).render().contains("map steps"));
}
