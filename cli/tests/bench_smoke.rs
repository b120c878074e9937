//! `sasctl bench` at tiny sizes: structure and sanity only, never timing.

use sas::domain::Policy;
use sasctl::bench::{CostAssumptions, ListingOptions, cost, listing, recovery, sweep_once, throughput};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_processes_every_order() {
    for wf in ["single-step", "three-step"] {
        let r = throughput(wf, 200, 2, 2).await;
        assert_eq!(r.runs.len(), 2);
        for run in &r.runs {
            assert_eq!(run.processed, 200, "{wf}: every order processed");
            let steps = if wf == "single-step" { 1 } else { 3 };
            assert_eq!(run.handlers["submission"].messages, 200);
            assert_eq!(run.handlers["agent"].messages, 200 * steps);
            // One schedule (the claim) and one reply per step.
            assert_eq!(run.handlers["scheduler"].messages, 200 * 2 * steps);
        }
        assert!(r.median_orders_per_second > 0.0);
    }
}

/// Waiting tasks (timers and callbacks not yet due) cost a sweep nothing, like finished ones.
#[tokio::test]
async fn sweep_reads_only_due_items() {
    let small = sweep_once(100, 0, 10).await;
    let large = sweep_once(2_000, 2_000, 10).await;
    for row in [&small, &large] {
        assert_eq!(row.items_read, 10);
        assert_eq!(row.recovered, 10);
    }
}

#[tokio::test]
async fn recovery_completes_every_crashed_order() {
    let policy = Policy { step_timeout_ms: 1_000, reply_grace_ms: 500, ..Policy::default() };
    let r = recovery(20, policy, 2_000, 3).await;
    assert!(r.all_processed);
    assert_eq!(r.crashes, 20);
    assert!(r.min_ms <= r.p50_ms && r.p50_ms <= r.max_ms);
    assert!(r.min_ms >= 1, "recovery takes simulated time");
}

#[tokio::test]
async fn cost_counts_requests() {
    let a = CostAssumptions::default();
    let clean = cost("single-step", 50, false, &a).await;
    assert_eq!(clean.processed, 50);
    assert_eq!(clean.per_order["sns_publishes"], 0.0);
    assert!(clean.per_order["sqs_sends"] > 0.0);
    // The write plan of a clean single-step order (items under 1 KB): the insert and its
    // due-index entry, the claim (which keeps the deadline, so no index write), the
    // final write and the entry's removal; reads: the claim's and the reply's.
    assert_eq!(clean.per_order["ddb_wru"], 5.0);
    assert_eq!(clean.per_order["ddb_rru"], 2.0);
    assert_eq!(clean.per_order["sqs_order_sends"], 1.0);
    assert!(clean.sas_total > 0.0 && clean.step_functions_standard > 0.0);
    let faulty = cost("three-step", 100, true, &a).await;
    assert_eq!(faulty.processed + faulty.compensated + faulty.failed, 100);
    assert!(faulty.remote_calls_per_order >= 3.0);
    // A callback step completed by the outside, then an hour's timer woken by the sweep.
    let waits = cost("callback-timer", 50, false, &a).await;
    assert_eq!(waits.processed, 50, "{waits:?}");
    assert_eq!(waits.per_order["sqs_completion_sends"], 1.0);
    assert_eq!(waits.remote_calls_per_order, 1.0, "the callback step's agent only, once");
    assert!(waits.step_functions_express.is_none(), "Express waits 5 minutes at most");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starvation_measures_the_healthy_agent_in_both_runs() {
    let o = sasctl::bench::StarvationOptions {
        orders: 60,
        rate: 200,
        concurrency: 4,
        step_timeout_ms: 1_000,
        seed: 3,
    };
    let r = sasctl::bench::starvation(&o).await.expect("both runs hold every invariant");
    assert_eq!((r.baseline.samples, r.hanging.samples), (30, 30), "every via-steady order measured: {r:?}");
    assert!(r.hanging_keys > 0, "the slow service was called");
}

/// `bench listing` at a small size against moto (SAS_TEST_ENDPOINT, set by
/// infra/with-moto.sh): each listing returns what it asks for and reads only that, by
/// the adapter's count and by DynamoDB's. Without an endpoint it prints a loud SKIPPED
/// line and passes, except under CI=true, where that is a failure (the rule of
/// tests/src/lib.rs, which this crate cannot depend on: it depends on this one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_reads_only_what_it_lists() {
    const VAR: &str = "SAS_TEST_ENDPOINT";
    let Some(endpoint) = std::env::var(VAR).ok().filter(|e| !e.trim().is_empty()) else {
        let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        assert!(
            !ci,
            "listing_reads_only_what_it_lists: CI=true but {VAR} is not set: run under infra/with-moto.sh"
        );
        let line = format!(
            "*** SKIPPED: moto not running: listing_reads_only_what_it_lists needs {VAR} (run under infra/with-moto.sh) ***\n"
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return;
    };
    let o = ListingOptions { endpoint, finished: 300, errors: 60, live: 7, progress: false };
    let r = listing(&o).await.expect("bench runs");
    let rows: Vec<(&str, usize, u64, u64, u64, u64)> = r
        .rows
        .iter()
        .map(|r| (r.listing.as_str(), r.returned, r.index_items, r.count, r.scanned_count, r.task_reads))
        .collect();
    let since = format!("errors since {}", 1_700_000_000_000u64 + 1_000 + 50);
    assert_eq!(
        rows,
        [
            ("errors", 60, 60, 60, 60, 0),
            ("errors, newest 50", 50, 50, 50, 50, 0),
            (since.as_str(), 10, 10, 10, 10, 0),
            // Four due shards, each read whole (7 entries in all), then each task.
            ("live", 7, 7, 7, 7, 7),
        ]
    );
    let text = r.to_string();
    assert!(text.contains("300 finished, 60 in Error, 7 live (367 items"), "{text}");
}

/// The longest wait there is (366 days) wakes, through the supervisor's sweep (here once a
/// simulated day), never before its time and at most one sweep late.
#[tokio::test]
async fn the_longest_timer_wakes_after_a_year_and_a_day() {
    use sasctl::bench::{Rig, RigOptions};
    const DAY_MS: u64 = 24 * 3_600_000;
    let rig = Rig::new(
        RigOptions {
            workflow: "longest-timer".into(),
            supervisor_period_ms: DAY_MS,
            ..RigOptions::default()
        },
        true,
    );
    rig.send_orders(0, 10).await;
    let start = rig.clock.now();
    let took = rig.run_simulated(10, start.plus_ms(DAY_MS)).await;
    assert_eq!(rig.terminal(), (10, 10));
    let processed = rig.store.state_counts().get(&sas::domain::ProcessState::Processed).copied();
    assert_eq!(processed, Some(10));
    let wait = sas::domain::wait::MAX_WAIT_MS;
    assert!((wait..=wait + DAY_MS).contains(&took), "took {took} ms");
}

/// A timer within SQS's delay wakes on its message, on time; a longer one on the sweep, at
/// most one period late; none early.
#[tokio::test]
async fn timers_wake_on_time_both_ways() {
    let rows = sasctl::bench::timers(40, 60_000).await;
    let (short, long) = (&rows[0], &rows[1]);
    assert!(short.all_processed && long.all_processed);
    assert_eq!((short.woken, long.woken), (40, 40));
    assert_eq!(short.max_late_ms, 0, "{short:?}");
    assert!(long.max_late_ms <= 60_000 && long.max_late_ms > 0, "{long:?}");
}

/// A task waiting on a callback step (the callback-timer order, its agent's answer in):
/// its record, as DynamoDB bills it, is one write unit; `--nocapture` prints its size
/// (docs/BENCHMARKS.md, section 9, prices a waiting month from it).
#[tokio::test]
async fn a_waiting_record_fits_one_write_unit() {
    use sas::ports::StateStore;
    use sasctl::bench::{LambdaFunction, Rig, RigOptions};
    let rig = Rig::new(RigOptions { workflow: "callback-timer".into(), ..RigOptions::default() }, true);
    rig.send_orders(0, 1).await;
    // Accepted, claimed, started by its agent, and the start applied: now it waits.
    for f in [
        LambdaFunction::Submission,
        LambdaFunction::Scheduler,
        LambdaFunction::Agent,
        LambdaFunction::Scheduler,
    ] {
        assert!(rig.invoke(f).await, "{f:?} had a message");
    }
    let id = sas::domain::OrderId::parse("order-00000000").unwrap();
    let task = rig.store.task(&id).await.unwrap().expect("the order's task");
    assert_eq!(task.state, sas::domain::ProcessState::Waiting);
    let bytes = serde_json::to_string(&task).unwrap().len();
    println!("waiting record: {bytes} bytes of JSON");
    assert!(bytes + 100 <= 1_024, "{bytes} bytes");
}
