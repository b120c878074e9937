//! End to end over an AWS endpoint (moto under infra/with-moto.sh): the four handlers
//! run in-process through the real adapters (`sasctl dev --endpoint-url`'s runner),
//! orders go to the SQS orders queue through the SDK, valid ones with exact
//! duplicates and malformed ones mixed in, the simulated remote service fails,
//! refuses and hangs; then every order's final record and every rejected message's
//! reason are checked.

use std::collections::HashMap;
use std::time::Duration;

use sas::domain::{Action, Cause, ProcessState};
use sas::handlers::REASON_ATTRIBUTE;
use sas::ports::Metric;
use sasctl::dev::{DevOptions, DevOutcome};
use sasctl::remote_sim::RemoteFaults;

fn options(workflow: &str, orders: usize, seed: u64) -> DevOptions {
    DevOptions {
        orders,
        workflow: workflow.into(),
        faults: RemoteFaults {
            transient: 0.15,
            permanent: 0.08,
            undo_permanent: 0.0,
            hang: 0.08,
            latency_max_ms: 1,
            bad_output: 0.02,
            ignores_undone: false,
        },
        duplicate_rate: 0.2,
        malformed: 13,
        // moto serves one request at a time, a few hundred a second: a step timeout
        // the emulator can meet with room to spare on a loaded machine, so recoveries
        // come from the injected hangs and not from a slow emulator.
        step_timeout_ms: 5_000,
        supervisor_period_ms: 500,
        failure_threshold: 3,
        concurrency: 8,
        seed,
        max_runtime: Duration::from_secs(150),
        ..DevOptions::default()
    }
}

async fn run(test: &str, workflow: &str, orders: usize, seed: u64) -> Option<DevOutcome> {
    run_with(test, options(workflow, orders, seed)).await
}

/// One run at a time: the runs share one moto, which serves one request at a time, and
/// three runs beside each other on a two-core machine made every step's replies late, so
/// all orders gave up by lapses (seen in CI).
static ONE_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run_with(test: &str, options: DevOptions) -> Option<DevOutcome> {
    let endpoint = sas_tests::endpoint(test)?;
    let _alone = ONE_RUN_AT_A_TIME.lock().await;
    Some(sasctl::endpoint::run(options, &endpoint, |_| {}).await.expect("run starts"))
}

fn check(run: &DevOutcome) {
    let violations = sasctl::invariants::check(run);
    assert!(violations.is_empty(), "violations: {violations:#?}");
    assert!(!run.timed_out, "orders still moving after {:?}", run.elapsed);

    // Every order sent has exactly one task, terminal, and it is what the domain last
    // wrote: DynamoDB gave back every field as written.
    let tasks: HashMap<&str, _> = run.tasks.iter().map(|t| (t.order_id.as_str(), t)).collect();
    assert_eq!(tasks.len(), run.sent.orders.len());
    for (id, _) in &run.sent.orders {
        let task = tasks.get(id.as_str()).unwrap_or_else(|| panic!("order {id} has no task"));
        assert!(task.state().is_terminal(), "order {id} ended {:?}", task.state());
        let last = run.writes.iter().rev().find(|w| w.after.order_id.as_str() == id).expect("written");
        assert_eq!(&*last.after, *task, "order {id}: stored record differs from the last write");
    }

    // Every bad message is in the orders DLQ with a reason naming what was wrong.
    for (body, want) in &run.sent.bad {
        let kept = run.kept.iter().find(|m| &m.body == body).unwrap_or_else(|| panic!("{body:.80} not kept"));
        let reason = kept.attributes.get(REASON_ATTRIBUTE).expect("kept with a reason");
        assert!(reason.contains(want), "{body:.80}: reason {reason:?} lacks {want:?}");
    }
    assert!(run.sent.bad.len() >= 12, "the malformed mix was sent: {}", run.sent.bad.len());
    assert!(
        run.sent.bad.iter().any(|(_, want)| *want == "different payload"),
        "a conflicting payload under an accepted id was among them"
    );

    // Exact duplicates were recognised as such, not accepted twice or rejected.
    assert!(run.sent.duplicates > 0);
    assert!(run.metrics.count(Metric::OrderDuplicate) >= run.sent.duplicates as u64);
    assert_eq!(run.metrics.count(Metric::OrderAccepted), run.sent.orders.len() as u64);

    // The faults happened, so recovery paths ran on the real adapters too.
    assert!(run.ledger.hangs > 0 && run.ledger.transient > 0 && run.ledger.refusals > 0);
    assert!(
        run.metrics.count(Metric::Recovered) > 0,
        "the supervisor recovered hung attempts via the due index"
    );
}

/// How every order ended, for a failed assertion on the mix of ends.
fn ends(run: &DevOutcome) -> String {
    let ends: Vec<_> = run.tasks.iter().map(|t| format!("{:?} by {:?}", t.state(), t.last_cause)).collect();
    format!("no order Processed; the orders ended: {ends:#?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_step_orders_over_moto() {
    let Some(run) = run("single_step_orders_over_moto", "single-step", 40, 21).await else { return };
    check(&run);
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Processed), "{}", ends(&run));
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Error), "a refusal without compensation");
    assert_eq!(run.alerts.len(), run.tasks.iter().filter(|t| t.state() == ProcessState::Error).count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_step_orders_compensate_over_moto() {
    let Some(run) = run("three_step_orders_compensate_over_moto", "three-step", 25, 22).await else { return };
    check(&run);
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Processed), "{}", ends(&run));
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Compensated), "some orders were undone");
    assert!(
        run.writes
            .iter()
            .any(|w| matches!(w.after.last_cause, Cause::Succeeded { action: Action::Undo, .. })),
        "a compensation step ran"
    );
}

/// A parallel stage over the real adapters: its branch replies race on one DynamoDB item
/// through conditional writes, and a refused or hung branch undoes exactly what may have
/// taken effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_stage_orders_over_moto() {
    let definitions = sas::domain::Definitions::parse(
        r#"{"agents": {"inventory": {}, "payment": {}, "fraud": {}, "shipping": {}},
            "workflows": [{"name": "fan-out", "steps": [
              {"parallel": {"name": "prepare", "steps": [
                {"name": "reserve", "agent": "inventory", "compensation": "release"},
                {"name": "hold-funds", "agent": "payment", "compensation": "release-funds"},
                {"name": "screen", "agent": "fraud", "effect": "none"}]}},
              {"name": "ship", "agent": "shipping"}]}]}"#,
    )
    .expect("a valid definition");
    let options = DevOptions { definitions, ..options("fan-out", 25, 23) };
    let Some(run) = run_with("parallel_stage_orders_over_moto", options).await else { return };
    check(&run);
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Processed), "{}", ends(&run));
    assert!(run.tasks.iter().any(|t| t.state() == ProcessState::Compensated), "some stages were undone");
    assert!(
        run.writes.iter().any(|w| w.after.stage().as_ref().is_some_and(|s| {
            s.branches.iter().filter(|b| b.outcome == sas::domain::Outcome::Succeeded).count() == 2
        })),
        "branches joined one by one"
    );
}
