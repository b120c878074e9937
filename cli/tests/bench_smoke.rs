//! `sasctl bench` at tiny sizes: structure and sanity only, never timing.

use sas::domain::Policy;
use sasctl::bench::{
    CostAssumptions, ListingOptions, backlog_report, cost, listing, recovery, sweep_once, throughput,
};

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

/// A backlog larger than the first pages: every timer woken, by growing pages, in one run.
#[tokio::test]
async fn a_backlog_of_timers_wakes_in_one_run() {
    let r = backlog_report(2_000, 0, 60_000, 1).await;
    let run = &r.runs[0];
    assert_eq!((run.woken, run.runs), (2_000, 1), "{r:?}");
    assert_eq!(run.pages, 6, "100, 200, 400, then 500 a page: {r:?}");
    assert!(run.max_late_ms >= run.p50_late_ms);
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

/// `bench flow` at a small size: the burst never has more than 10 calls open at the
/// limited service, every neighbour's order is measured in both runs, and the burst's
/// tasks waited (200 orders at once against 10 places); the store's capacity was
/// modelled, and the gate's units priced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_keeps_the_burst_within_its_places_and_measures_the_neighbour() {
    let o = sasctl::bench::FlowOptions {
        orders: 200,
        rate: 20,
        places: 10,
        per_second: None,
        schedulers: 4,
        latency_ms: 50,
        concurrency: 4,
        step_timeout_ms: 1_000,
        seed: 5,
    };
    let r = sasctl::bench::flow(&o, |_, _| {}).await.expect("both runs hold every invariant");
    assert!(r.max_in_flight_seen <= 10 && r.max_in_flight_seen > 1, "{r:?}");
    assert_eq!(r.limited_calls, 200, "{r:?}");
    assert_eq!(r.calls_per_second, r.limited_calls_per_s);
    assert_eq!((r.baseline.samples, r.with_burst.samples), (o.trickle_orders(), o.trickle_orders()), "{r:?}");
    assert!(r.waiting_ms.tasks > 0 && r.waiting_ms.p50 <= r.waiting_ms.max, "{r:?}");
    assert!(r.burst_invariants_broken.is_empty(), "{r:?}");
    assert!(r.max_item_write_units_per_second > 0 && r.max_item_write_units_per_second <= 1_000, "{r:?}");
    assert!(r.gate_write_units > 0 && r.gate_dollars_per_million_calls > 0.0, "{r:?}");
}

/// The command with the flags of limits at scale, at a tiny size: a rate limit, places,
/// two racing scheduler containers and a fast service; its JSON carries the figures.
#[test]
fn flow_takes_places_per_second_and_schedulers() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(["bench", "flow", "--json", "--orders", "60", "--rate", "10", "--places", "20"])
        .args(["--per-second", "100", "--schedulers", "2", "--latency-ms", "10"])
        .output()
        .expect("sasctl runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!((r["max_in_flight"].as_u64(), r["max_per_second"].as_u64()), (Some(20), Some(100)), "{r}");
    assert_eq!((r["schedulers"].as_u64(), r["latency_ms"].as_u64()), (Some(2), Some(10)), "{r}");
    assert_eq!(r["limited_calls"], 60, "{r}");
    assert!(r["max_in_flight_seen"].as_u64().is_some_and(|n| (1..=20).contains(&n)), "{r}");
    for figure in ["calls_per_second", "max_item_write_units_per_second", "store_throttles"] {
        assert!(r[figure].is_number(), "{figure}: {r}");
    }
    assert!(r["gate_dollars_per_million_calls"].as_f64().is_some_and(|d| d > 0.0), "{r}");
    assert_eq!(
        r["ideal_calls_per_s"].as_f64(),
        Some(100.0),
        "20 places / 10 ms = 2,000, capped by 100 a second"
    );
}

/// A limited agent's cost row carries its gate's; an unlimited one's none, and its other
/// counts are the gate's and waiters' more than the same row without limits.
#[tokio::test]
async fn cost_counts_the_gate_of_a_limited_agent() {
    use sas::domain::gate::Limits;
    let a = CostAssumptions::default();
    let free = cost("single-step", 50, false, &a).await;
    assert!(free.gate.is_none());
    let limits = [(
        "orders".to_owned(),
        Limits { max_in_flight: Some(10), max_per_second: None, places_per_gate: None, per_key: None },
    )]
    .into();
    let gated = sasctl::bench::cost_limited("single-step", 50, false, &limits, &a).await;
    assert_eq!(gated.processed, 50);
    let g = gated.gate.as_ref().expect("a gate row");
    assert_eq!(g.limited_calls, 50);
    // Read and written, but changes waiting at the gate land together: in a burst,
    // fewer writes than a claim and a release each.
    assert!(g.gate_reads_per_call > 0.0 && g.gate_writes_per_call > 0.0, "{g:?}");
    assert!(g.gate_writes_per_call < 2.0, "50 at once, batches of 10 land together: {g:?}");
    assert!(g.queued_per_call > 0.0 && g.waiter_writes_per_call > 0.0, "50 at once, 10 places: {g:?}");
    assert!(gated.sas_total > free.sas_total);
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
            // Four finished shards, each read up to the limit (their small key entries),
            // then only the tasks listed.
            ("finished, newest 50", 50, 200, 200, 200, 50),
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
    assert_eq!(task.state(), sas::domain::ProcessState::Waiting);
    let bytes = serde_json::to_string(&task).unwrap().len();
    println!("waiting record: {bytes} bytes of JSON");
    assert!(bytes + 100 <= 1_024, "{bytes} bytes");
}

/// examples/parallel.json's order (a 3-branch stage, then charge and ship) against the
/// same five steps one after the other: every order processed, five calls each. The stage
/// is claimed once for three branches (two claims fewer: 2 WRU, 2 RRU less); each reply
/// that lost a race to a sibling's costs a failed conditional write (billed) and a re-read.
#[tokio::test]
async fn cost_counts_a_parallel_stage_and_each_write_conflict() {
    let a = CostAssumptions::default();
    let seq = cost("sequential-order", 60, false, &a).await;
    let par = cost("parallel-order", 60, false, &a).await;
    for row in [&seq, &par] {
        assert_eq!(row.processed, 60, "{row:?}");
        assert_eq!(row.remote_calls_per_order, 5.0);
    }
    assert_eq!((seq.per_order["ddb_wru"], seq.per_order["ddb_rru"]), (13.0, 10.0));
    assert_eq!(seq.write_conflicts_per_order, 0.0);
    let c = par.write_conflicts_per_order;
    assert_eq!((par.per_order["ddb_wru"], par.per_order["ddb_rru"]), (11.0 + c, 8.0 + c), "{par:?}");
    assert!(
        par.step_functions_standard > seq.step_functions_standard,
        "a Parallel state is a transition more"
    );
    // One order alone: its three replies come back together, in one scheduler batch,
    // which applies them one after another (`BatchOrder::ByOrder`): none loses a race.
    let alone = cost("parallel-order", 1, false, &a).await;
    assert_eq!(alone.write_conflicts_per_order, 0.0);
    assert_eq!((alone.per_order["ddb_wru"], alone.per_order["ddb_rru"]), (11.0, 8.0));
    // With failures (crashes, retries, refusals), every order still ends.
    let faulty = cost("parallel-order", 100, true, &a).await;
    assert_eq!(faulty.processed + faulty.compensated + faulty.failed, 100, "{faulty:?}");
}

/// A stage's five replies meet in one scheduler invocation, which applies one order's
/// messages one after another: none loses a write to its siblings (all at once, an order
/// alone lost 4 + 3 + 2 + 1 = 10); five steps one after the other lose none either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_counts_the_replies_that_race() {
    use sasctl::bench::contention_once;
    let par = contention_once("parallel-5", 20, 1, 1).await;
    let seq = contention_once("sequential-5", 20, 1, 1).await;
    assert_eq!((par.processed, seq.processed), (20, 20));
    assert_eq!(par.write_conflicts_per_order, 0.0, "{par:?}");
    assert_eq!(seq.write_conflicts_per_order, 0.0);
    // One Schedule and five replies, against a Schedule and a reply per step.
    assert_eq!((par.scheduler_messages_per_order, seq.scheduler_messages_per_order), (6.0, 10.0));
    let bulk = contention_once("parallel-5", 200, 0, 1).await;
    assert_eq!(bulk.processed, 200);
}

/// The largest record a definition file allows: MAX_STEPS (20) steps with a stage of
/// MAX_BRANCHES (10), every name at its longest, every step's output at MAX_OUTPUT_BYTES
/// (written to escape as much as JSON can), the largest order (100 items, every field at
/// its longest, a 2 KiB reply_to), a full timeline of the longest notes, and every
/// optional field set at once (more than any one moment of a task holds: an upper bound).
/// It stays well under DynamoDB's 400 KB item limit, as DynamoDB counts it and as the
/// cost model's JSON counts it; `--nocapture` prints both.
#[test]
fn the_largest_record_stays_well_under_dynamodbs_item_limit() {
    use sas::domain::definitions::{MAX_BRANCHES, MAX_NAME_LEN, MAX_STEPS};
    use sas::domain::ids::ORDER_ID_MAX_LEN;
    use sas::domain::messages::{MAX_FIELD_LEN, MAX_ITEMS, MAX_QUANTITY, MAX_REASON_BYTES, MAX_REPLY_TO_LEN};
    use sas::domain::timeline::{MAX_NOTE_BYTES, TIMELINE_LEN};
    use sas::domain::workflow::{Entry as Text, StageText};
    use sas::domain::*;
    use sasctl::bench::{dynamodb_item_bytes, json_item_bytes};

    let name = |i: usize| format!("{i:02}{}", "n".repeat(MAX_NAME_LEN - 2));
    let branches: Vec<Step> =
        (0..MAX_BRANCHES).map(|i| Step::compensable(&name(i), &name(i), &name(i))).collect();
    let mut entries = vec![Text::Parallel { parallel: StageText { name: name(99), steps: branches } }];
    entries.extend(
        (MAX_BRANCHES..MAX_STEPS).map(|i| Text::Step(Step::compensable(&name(i), &name(i), &name(i)))),
    );
    let wf = Workflow::of_entries(&"w".repeat(MAX_NAME_LEN), entries);
    assert_eq!((wf.len() as usize, wf.stages[0].len as usize), (MAX_STEPS, MAX_BRANCHES));

    let long = |c: char, n: usize| c.to_string().repeat(n);
    let order = Order {
        order_id: OrderId::parse(&long('o', ORDER_ID_MAX_LEN)).unwrap(),
        customer_id: long('c', MAX_FIELD_LEN),
        items: (0..MAX_ITEMS)
            .map(|_| LineItem { sku: long('s', MAX_FIELD_LEN), quantity: MAX_QUANTITY })
            .collect(),
        workflow: wf.name.clone(),
        workflow_version: Some(u32::MAX),
    };
    let far = Timestamp(u64::MAX / 1_000);
    let mut t = TaskRecord::new(&order, Some(long('r', MAX_REPLY_TO_LEN)), far, &Policy::default());
    // A JSON string of backslashes: every one doubles again when the record is JSON.
    let worst = format!("\"{}\"", "\\\\".repeat((MAX_OUTPUT_BYTES - 2) / 2));
    let output = StepOutput::from_value(&serde_json::from_str(&worst).unwrap()).unwrap();
    assert!(output.as_str().len() <= MAX_OUTPUT_BYTES && output.as_str().len() > MAX_OUTPUT_BYTES - 2);
    for s in &wf.steps {
        std::sync::Arc::make_mut(&mut t.outputs).insert(s.name.clone(), output.clone());
    }
    let mut run = StageRun::new(&wf.stages[0]);
    for b in &mut run.branches {
        *b = Branch {
            attempt: u32::MAX,
            dispatches: u32::MAX,
            failures: u32::MAX,
            complete_by: Some(far),
            outcome: Outcome::Succeeded,
            output: None,
        };
    }
    let big = u32::MAX;
    (t.step, t.step_attempts, t.attempt, t.failure_count, t.step_failures, t.timeline_dropped) =
        (big, big, big, big, big, big);
    (t.revision, t.redo_until) = (u64::MAX, Some(big));
    // The phase that holds the most: a claimed callback step at a stage, paused.
    let callback = Awaiting {
        step: big,
        attempt: big,
        digest: long('d', 64),
        timeout_at: far,
        heartbeat_ms: Some(u64::MAX),
        last_heartbeat: Some(far),
        started_at: Some(far),
        since: far,
    };
    let lease = Lease { token: LeaseToken(uuid::Uuid::from_u128(u128::MAX)), complete_by: far };
    let phase = |stage: Option<StageRun>| Phase::Processing {
        due: far,
        lease,
        callback: Some(callback.clone()),
        stage,
        paused: true,
    };
    t = t.with_phase(phase(Some(run)));
    t.submitter = Sender::from_sender_id(&long('a', 128));
    t.last_error = Some(long('e', 3 * MAX_REASON_BYTES));
    t.last_cause = Cause::Failed {
        step: big,
        action: Action::Undo,
        reason: long('f', MAX_REASON_BYTES),
        in_doubt: false,
    };
    t.timeline = std::sync::Arc::new(
        (0..TIMELINE_LEN)
            .map(|_| sas::domain::Entry {
                at: far,
                what: Happened::Moved(Trigger::CancelUndone),
                step: big,
                attempt: big,
                step_attempt: Some(big - 1),
                note: Some(long('n', MAX_NOTE_BYTES)),
                by: Some(long('b', MAX_NOTE_BYTES)),
            })
            .collect(),
    );
    t.created_at = far;
    t.updated_at = far;

    let (dynamodb, json) = (dynamodb_item_bytes(&t), json_item_bytes(&t));
    println!("largest record: {dynamodb} bytes as DynamoDB counts it, {json} bytes of JSON (limit 409,600)");
    assert!(dynamodb < 150 * 1024, "{dynamodb} bytes: well under 400 KB");
    let modelled = sas::adapters::embedded::capacity::task_item_bytes(&t);
    assert!(modelled.abs_diff(dynamodb) <= 4, "{modelled} modelled against {dynamodb}");
    assert!(json < 250 * 1024, "{json} bytes");
}

/// Every write of examples/parallel.json's order (its stage's three branches claimed
/// together, each reply applied, then charge and ship), one order alone so its replies race:
/// each is one 1 KB write unit, billed on the larger of the item before and after, as
/// DynamoDB counts the item and as the cost model's JSON does. `--nocapture` prints each.
#[tokio::test]
async fn a_stage_in_flight_fits_one_write_unit() {
    use sasctl::bench::{Rig, RigOptions, dynamodb_item_bytes, json_item_bytes};
    let rig = Rig::new(RigOptions { workflow: "parallel-order".into(), ..RigOptions::default() }, true);
    rig.send_orders(0, 1).await;
    rig.drain().await;
    assert_eq!(rig.terminal(), (1, 1));
    let mut largest = (0, 0);
    for w in rig.store.writes() {
        let (d, j) = (dynamodb_item_bytes(&w.after), json_item_bytes(&w.after));
        let branches = w.after.stage().map_or(0, |r| r.branches.iter().filter(|b| b.in_flight()).count());
        println!(
            "{:<12} {:?} step {}, {branches} branches in flight: {d} bytes (DynamoDB), {j} (JSON)",
            format!("{:?}", w.after.state()),
            w.after.last_cause,
            w.after.step
        );
        largest = (largest.0.max(d), largest.1.max(j));
        // The embedded store's capacity model sizes the item as the adapter writes it.
        let modelled = sas::adapters::embedded::capacity::task_item_bytes(&w.after);
        assert!(modelled.abs_diff(d) <= 4, "{modelled} modelled against {d}");
    }
    println!("largest: {} bytes (DynamoDB), {} (JSON)", largest.0, largest.1);
    assert!(largest.0 <= 1_024 && largest.1 <= 1_024, "{largest:?}");
}

/// `bench fair` at a small size: under the per-key limit the flooding customer never has
/// more than its share at once and the others' orders are all measured; without it, the
/// flood takes every place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_holds_the_flood_to_its_share_and_measures_the_others() {
    let o =
        sasctl::bench::FairOptions { orders: 120, others: 20, rate: 50, per_key: 2, concurrency: 4, seed: 3 };
    let r = sasctl::bench::fair(&o, |_, _| {}).await.expect("both runs hold every invariant");
    let (keyed, open) = (&r.runs[0], &r.runs[1]);
    assert_eq!((keyed.per_key, open.per_key), (Some(2), None));
    assert!(keyed.flood_max_in_flight <= 2 && keyed.flood_max_in_flight >= 1, "{r:?}");
    assert!(open.flood_max_in_flight > 2 && open.service_max_in_flight <= 10, "{r:?}");
    assert_eq!((keyed.others_wait_ms.samples, open.others_wait_ms.samples), (20, 20), "{r:?}");
}

/// The largest record a map step can make, by the approach of
/// `the_largest_record_stays_well_under_dynamodbs_item_limit`: MAX_STEPS (20) steps, one of
/// them a map of MAX_MAP_ITEMS (1,000) items, every item's branch at its largest (u32::MAX
/// counters, a complete-by, succeeded) with an output, the outputs together as much as the
/// map's bound admits (MAX_MAP_OUTPUT_BYTES as the array is kept: outputs, commas,
/// brackets); the map's finished array in `outputs` at that bound too; the 19 other steps'
/// outputs at MAX_OUTPUT_BYTES; every output a JSON string of backslashes (the most a JSON
/// record escapes); every item listed as refused; the largest order (100 lines, every
/// field at 64 characters of 4 UTF-8 bytes each: the order's limits count characters); a
/// full timeline, and everything else as that test sets it. More than one moment of a task
/// holds (the items' run and the finished array, a callback beside a map): an upper bound.
/// Then the largest agent request of a map item: an item's undo, with the order, the 19
/// outputs, the map's array, the item (4 KiB) and its own output. `--nocapture` prints the
/// sizes.
#[test]
fn the_largest_map_record_stays_under_dynamodbs_item_limit() {
    use sas::domain::definitions::{MAX_NAME_LEN, MAX_STEPS};
    use sas::domain::ids::ORDER_ID_MAX_LEN;
    use sas::domain::map::{MAX_MAP_ITEMS, MAX_MAP_OUTPUT_BYTES};
    use sas::domain::messages::{
        MAX_BODY_BYTES, MAX_FIELD_LEN, MAX_ITEMS, MAX_QUANTITY, MAX_REASON_BYTES, MAX_REPLY_TO_LEN,
    };
    use sas::domain::timeline::{MAX_NOTE_BYTES, TIMELINE_LEN};
    use sas::domain::workflow::{Entry as Text, MapText};
    use sas::domain::*;
    use sasctl::bench::{dynamodb_item_bytes, json_item_bytes};

    let name = |i: usize| format!("{i:02}{}", "n".repeat(MAX_NAME_LEN - 2));
    let step = |i: usize| Step::compensable(&name(i), &name(i), &name(i));
    let mut entries: Vec<Text> = (0..MAX_STEPS - 1).map(|i| Text::Step(step(i))).collect();
    let map_at = entries.len() as u32;
    entries.push(Text::Map {
        map: MapText {
            name: name(99),
            items: format!("$.steps.{}.output", name(0)),
            max_concurrency: 50,
            tolerated_failures: MAX_MAP_ITEMS as u32,
            step: step(MAX_STEPS - 1),
        },
    });
    let wf = Workflow::of_entries(&"w".repeat(MAX_NAME_LEN), entries);
    assert_eq!((wf.len() as usize, wf.maps.len(), wf.maps[0].at), (MAX_STEPS, 1, map_at));

    let long = |c: char, n: usize| c.to_string().repeat(n);
    // A character of four UTF-8 bytes: DynamoDB and JSON count bytes.
    let wide = |n: usize| long('\u{1F600}', n);
    let order = Order {
        order_id: OrderId::parse(&long('o', ORDER_ID_MAX_LEN)).unwrap(),
        customer_id: wide(MAX_FIELD_LEN),
        items: (0..MAX_ITEMS)
            .map(|_| LineItem { sku: wide(MAX_FIELD_LEN), quantity: MAX_QUANTITY })
            .collect(),
        workflow: wf.name.clone(),
        workflow_version: Some(u32::MAX),
    };
    // The intake accepts it (at version 1: no workflow has version u32::MAX).
    let asked = Order { workflow_version: None, ..order.clone() };
    let workflows = Workflows::new(vec![wf.clone()]);
    let accepted = OrderRequest::parse(&asked.payload()).and_then(|r| r.validate(&workflows));
    assert!(accepted.is_ok(), "{accepted:?}");
    let far = Timestamp(u64::MAX / 1_000);
    let mut t = TaskRecord::new(&order, Some(long('r', MAX_REPLY_TO_LEN)), far, &Policy::default());
    // A JSON string of `len` bytes, backslashes inside (each doubles again in a JSON
    // record), and one letter if `len` is odd.
    let escaped = |len: usize| {
        assert!(len >= 3);
        let odd = if len.is_multiple_of(2) { "" } else { "a" };
        let text = format!("\"{}{odd}\"", "\\\\".repeat((len - 2) / 2));
        let output = StepOutput::from_value(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(output.as_str().len(), len);
        output
    };
    let full = escaped(MAX_OUTPUT_BYTES);
    for s in wf.steps.iter().take(MAX_STEPS - 1) {
        std::sync::Arc::make_mut(&mut t.outputs).insert(s.name.clone(), full.clone());
    }
    t.refused_items = (0..MAX_MAP_ITEMS as u32).collect();

    // The items: every one succeeded with an output, the outputs together as much as the
    // bound admits (the array as kept: 64,535 bytes of outputs, 999 commas, 2 brackets).
    let mut run = StageRun::for_map(map_at, MAX_MAP_ITEMS);
    let budget = MAX_MAP_OUTPUT_BYTES - 2 - (MAX_MAP_ITEMS - 1);
    let longer = budget - 64 * MAX_MAP_ITEMS;
    for (i, b) in run.branches.iter_mut().enumerate() {
        *b = Branch {
            attempt: u32::MAX,
            dispatches: u32::MAX,
            failures: u32::MAX,
            complete_by: Some(far),
            outcome: Outcome::Succeeded,
            output: Some(escaped(if i < longer { 65 } else { 64 })),
        };
    }
    // The finished map's array, as the map's end makes it from the items' outputs.
    let array = StepOutput::array(run.branches.iter().map(|b| b.output.as_ref()));
    assert_eq!(array.as_str().len(), MAX_MAP_OUTPUT_BYTES, "the bound, exactly");
    std::sync::Arc::make_mut(&mut t.outputs).insert(name(99), array);
    let big = u32::MAX;
    (t.step, t.step_attempts, t.attempt, t.failure_count, t.step_failures, t.timeline_dropped) =
        (big, big, big, big, big, big);
    (t.revision, t.redo_until, t.step_throttled_ms) = (u64::MAX, Some(big), u64::MAX);
    let callback = Awaiting {
        step: big,
        attempt: big,
        digest: long('d', 64),
        timeout_at: far,
        heartbeat_ms: Some(u64::MAX),
        last_heartbeat: Some(far),
        started_at: Some(far),
        since: far,
    };
    let lease = Lease { token: LeaseToken(uuid::Uuid::from_u128(u128::MAX)), complete_by: far };
    let phase = |stage: Option<StageRun>| Phase::Processing {
        due: far,
        lease,
        callback: Some(callback.clone()),
        stage,
        paused: true,
    };
    t = t.with_phase(phase(Some(run)));
    t.submitter = Sender::from_sender_id(&long('a', 128));
    t.last_error = Some(long('e', 3 * MAX_REASON_BYTES));
    t.last_cause = Cause::Failed {
        step: big,
        action: Action::Undo,
        reason: long('f', MAX_REASON_BYTES),
        in_doubt: false,
    };
    t.timeline = std::sync::Arc::new(
        (0..TIMELINE_LEN)
            .map(|_| sas::domain::Entry {
                at: far,
                what: Happened::Moved(Trigger::CancelUndone),
                step: big,
                attempt: big,
                step_attempt: Some(big - 1),
                note: Some(long('n', MAX_NOTE_BYTES)),
                by: Some(long('b', MAX_NOTE_BYTES)),
            })
            .collect(),
    );
    t.created_at = far;
    t.updated_at = far;

    let (dynamodb, json) = (dynamodb_item_bytes(&t), json_item_bytes(&t));
    println!(
        "largest map record: {dynamodb} bytes as DynamoDB counts it, {json} bytes of JSON (limit 409,600)"
    );
    // What its parts take, as DynamoDB counts them: the record without each.
    let without_run = dynamodb_item_bytes(&t.clone().with_phase(phase(None)));
    let mut no_outputs = t.clone();
    no_outputs.outputs = Default::default();
    let without_outputs = dynamodb_item_bytes(&no_outputs);
    println!(
        "  of which the map's run {} bytes, the outputs {} bytes",
        dynamodb - without_run,
        dynamodb - without_outputs
    );
    let modelled = sas::adapters::embedded::capacity::task_item_bytes(&t);
    assert!(modelled.abs_diff(dynamodb) <= 4, "{modelled} modelled against {dynamodb}");
    assert!(dynamodb < 409_600, "{dynamodb} bytes: over DynamoDB's 400 KB item limit");

    // An item's undo: the outputs up to the map's end (the 19 others and the map's
    // array), the item's own output under its step's name, and the item itself (an
    // element of an earlier output, so at most that output less its brackets).
    let map_step = &wf.steps[map_at as usize];
    let mut outputs: std::collections::BTreeMap<String, serde_json::Value> =
        t.outputs.iter().map(|(k, v)| (k.clone(), v.to_value())).collect();
    outputs.insert(map_step.name.clone(), full.to_value());
    let item = escaped(MAX_OUTPUT_BYTES - 2).to_value();
    let index = MAX_MAP_ITEMS as u32 - 1;
    let request = AgentRequest {
        order_id: order.order_id.clone(),
        workflow: wf.name.clone(),
        workflow_version: big,
        step: map_at,
        step_name: map_step.compensation.clone().unwrap(),
        agent: map_step.agent.clone(),
        action: Action::Undo,
        attempt: big,
        lease: LeaseToken(uuid::Uuid::from_u128(u128::MAX)),
        complete_by: far,
        idempotency_key: item_key(&order.order_id, map_at, index, true),
        order: order.clone(),
        outputs,
        // A queue agent's worker is told where to reply: an SQS URL of the longest name.
        reply_queue: Some(format!("https://sqs.ap-southeast-3.amazonaws.com/123456789012/{}", long('q', 80))),
        callback_token: None,
        index: Some(index),
        item: Some(item),
    };
    let body = request.to_body().len();
    println!("largest map item request: {body} bytes (SQS allows {MAX_BODY_BYTES})");
    assert!(body < MAX_BODY_BYTES, "{body} bytes: over SQS's 256 KiB");
}

/// A map over the order's lines, ten at a time, for orders of 10 and of 100 lines, and a
/// stage of ten branches of the same step: every order processed, one call per line (per
/// branch), few write conflicts per item, and the map's cost per item within a factor of
/// the stage's per branch (the 100-line map's record is larger, so each of its writes
/// bills more units). Step Functions counts a Map state as one transition an order.
#[tokio::test]
async fn cost_counts_a_map_per_item() {
    use sas::domain::gate::Limits;
    use sasctl::bench::cost_items;
    let a = CostAssumptions::default();
    let none = std::collections::BTreeMap::new();
    let map_10 = cost_items("map-lines", 40, 10, &none, &a).await;
    let map_100 = cost_items("map-lines", 10, 100, &none, &a).await;
    let stage = cost_items("parallel-10", 40, 1, &none, &a).await;
    let limited = [("warehouse".to_owned(), Limits { max_in_flight: Some(10), ..Default::default() })];
    let gated = cost_items("map-lines", 40, 10, &limited.into(), &a).await;
    for (row, orders, calls) in
        [(&map_10, 40, 10.0), (&map_100, 10, 100.0), (&stage, 40, 10.0), (&gated, 40, 10.0)]
    {
        assert_eq!(row.processed, orders, "{row:?}");
        assert_eq!(row.remote_calls_per_order, calls, "{row:?}");
        let i = row.per_item.as_ref().expect("figures per item");
        assert_eq!(i.items_per_order, calls);
        assert!(i.write_conflicts_per_item <= 0.1, "{i:?}");
        assert!((i.sas - row.sas_total / calls).abs() < 1e-9, "{i:?}");
    }
    let per = |r: &sasctl::bench::CostRow| r.per_item.as_ref().unwrap().sas;
    let stage_per = per(&stage);
    assert!(per(&map_10) < 3.0 * stage_per && per(&map_10) > stage_per / 3.0, "{map_10:?} {stage:?}");
    assert!(per(&map_100) < 10.0 * stage_per, "{map_100:?} {stage:?}");
    assert!(per(&map_100) > per(&map_10), "a larger record bills more an item");
    // A Map state is one transition an order besides its items' Tasks, as a Parallel state
    // is besides its branches', and ten items at a cap of ten take one call's time, as ten
    // branches do: Step Functions prices the two alike.
    assert!((map_10.step_functions_standard - stage.step_functions_standard).abs() < 1e-6, "{map_10:?}");
    assert_eq!(map_10.step_functions_express, stage.step_functions_express);
    // 100 Tasks and 2 transitions an order against 10 and 2.
    assert!(map_100.step_functions_standard > 8.0 * map_10.step_functions_standard, "{map_100:?}");
    // Over a limited agent each item is a claim of its own through the gate: more writes an
    // item than the ungated map's, and the same calls.
    assert!(per(&gated) > per(&map_10), "{gated:?} {map_10:?}");
    assert!(
        gated.per_item.as_ref().unwrap().ddb_wru_per_item
            > map_10.per_item.as_ref().unwrap().ddb_wru_per_item
    );
}

/// `bench map` at a small size: the list step's lines become the map's items, every item
/// called once, ten or fifty at a time, the order processed; the record's writes measured.
#[tokio::test]
async fn map_bench_runs_every_item_of_a_listed_map() {
    for cap in [10, 50] {
        let r = sasctl::bench::map_once(100, cap, 1).await.expect("a cap the rig has");
        assert!(r.processed, "{r:?}");
        assert_eq!(r.item_calls, 100, "{r:?}");
        assert!(r.first_to_last_ms > 0.0 && r.item_calls_per_second > 0.0, "{r:?}");
        // Accepted, the list's claim and answer, the map's claim, a write per item's reply.
        assert!(r.writes >= 100 + 4, "{r:?}");
        assert!(r.largest_record_bytes > 100 * 20 && r.largest_record_bytes < 400 * 1024, "{r:?}");
        assert!(r.write_units >= r.writes as u64 && r.dynamodb_floor_s > 0.0, "{r:?}");
        assert_eq!(r.write_conflicts, 0, "one order's replies are applied one after another");
    }
    assert!(sasctl::bench::map_once(10, 20, 1).await.is_err(), "caps of 10 and 50 only");
}
