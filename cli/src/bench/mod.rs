//! `sasctl bench`: the figures of docs/BENCHMARKS.md, each measured in one run.
//!
//! One file per benchmark, each with its report type (`Display` for text, `Serialize`
//! for `--json`):
//!
//! - `throughput`: the whole pipeline in-process on the embedded backend, the remote
//!   service answered in-process, orders per second, CPU time per order and microseconds
//!   per message per handler.
//! - `sweep`: items the supervisor reads per sweep with 100 due tasks among N finished ones.
//! - `backlog`: 100,000 timers due at once: how late the supervisor wakes the last one.
//! - `recovery`: simulated time from an agent crash to the order's completion.
//! - `cost`: AWS requests and billed units per order, counted around the ports, priced.
//! - `contention`: a parallel stage's branch replies racing on one record, against the
//!   same steps one after the other: orders per second, CPU and write conflicts per order.
//! - `cold_start`: function binaries launched against a stub Runtime API and an HTTPS
//!   stub of AWS (`aws_stub`): init, first invocation with its TLS connection, peak RSS.
//! - `starvation`: one agent's service hangs every call; the latency of a healthy
//!   agent's steps against a run where both are healthy (`sasctl dev`'s pipeline).
//! - `flow`: a burst through a limited agent (`--places`, `--per-second`) beside an
//!   unlimited agent's trickle, with racing scheduler containers and the store's per-item
//!   capacity modelled: the most calls its service saw at once, its calls per second, the
//!   waits for a place, the hottest item's write units a second, the store's throttles,
//!   the gate's cost, and the neighbour's latency against a run without the burst.
//! - `fair`: one customer's flood and 50 others' orders through one limited agent, with
//!   and without `max_in_flight_per_key`: the others' waits, the flood's calls at once.
//! - `listing`: on DynamoDB at an endpoint, what listing Error and live tasks reads
//!   among N finished ones (the sparse indexes keep it to what is listed).
//! - `traffic`: the functions as `sasctl up` runs them, against an endpoint through a
//!   counting proxy (`proxy`): requests, dollars and latency per order for bulk and
//!   trickle arrivals and each queue's batching window; and an idle month's cost.
//! - `map`: one map step over 1,000 items, alone on the rig: the time from its first
//!   item's call to its last, the items' calls per second, and its record's writes.
//!
//! What they share:
//!
//! - `rig`: the pipeline in-process, invoked as Lambda's event source mappings would.
//! - `counting`: ports that count AWS requests and billed units around the embedded ones.
//! - `remote`: the remote service answered in-process.
//! - `measure`: CPU time, peak RSS, medians and percentiles.
//!
//! This file holds the command: its arguments, and printing each report as text or JSON.
//! Nothing here asserts a timing: the smoke test in `tests` checks structure only.

mod backlog;
mod cold_start;
mod contention;
mod cost;
mod counting;
mod fair;
mod flow;
mod listing;
mod map;
mod measure;
mod proxy;
mod recovery;
mod remote;
mod rig;
mod starvation;
mod sweep;
mod throughput;
mod timers;
mod traffic;

use serde::Serialize;

use sas::domain::Policy;

pub use backlog::{BacklogReport, BacklogRun, backlog_once, backlog_report};
pub use cold_start::{
    BENCH_STATE_TABLE, ColdStartCase, ColdStartReport, ColdStartRun, ColdStartTable, cold_start,
    cold_start_case, cold_start_once, judge,
};
pub use contention::{ContentionReport, ContentionRow, ContentionRun, contention, contention_once};
pub use cost::{
    CostAssumptions, CostRow, GateCost, ItemCost, TimerLateness, cost, cost_items, cost_limited, prices,
};
pub use counting::{
    AwsUsage, CountingAlerts, CountingQueues, CountingStore, GateUsage, dynamodb_item_bytes, json_item_bytes,
};
pub use fair::{FairOptions, FairReport, FairRun, fair};
pub use flow::{FlowArgs, FlowOptions, FlowReport, flow};
pub use listing::{ListingOptions, ListingReport, ListingRow, listing};
pub use map::{MapConcurrency, MapReport, MapRun, map_bench, map_once};
pub use measure::{cpu_time, median, peak_rss_kib};
pub use proxy::{CountingProxy, RequestCounts, classify};
pub use recovery::{RecoveryReport, recovery};
pub use remote::InstantRemote;
pub use rig::{HandlerTime, LambdaFunction, Rig, RigOptions};
pub use starvation::{Latencies, StarvationOptions, StarvationReport, starvation};
pub use sweep::{SweepReport, SweepRow, sweep_once};
pub use throughput::{ThroughputReport, ThroughputRun, throughput, throughput_once};
pub use timers::{TimerRow, timer_lateness, timers};
pub use traffic::{IDLE_POLLERS, IdleReport, TrafficOptions, TrafficReport, TrafficRow, idle, traffic};

use crate::up::Windows;

/// The published table (docs/BENCHMARKS.md, section 8): no window anywhere, then each
/// queue alone at 1, 5 and 20 s.
fn matrix() -> Vec<Windows> {
    let mut all = vec![Windows::default()];
    for s in [1, 5, 20] {
        let ms = s * 1000;
        all.push(Windows { orders_ms: ms, ..Windows::default() });
        all.push(Windows { scheduler_ms: ms, ..Windows::default() });
        all.push(Windows { agent_ms: ms, ..Windows::default() });
    }
    all
}

fn positive_rate(arg: &str) -> Result<f64, String> {
    match arg.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 100.0 => Ok(r),
        _ => Err(format!("{arg:?}: orders per second, more than 0 and at most 100")),
    }
}

/// `bench map`'s caps: the rig has a list-and-map workflow for each.
fn map_cap(arg: &str) -> Result<u32, String> {
    match arg.trim() {
        "10" => Ok(10),
        "50" => Ok(50),
        _ => Err(format!("{arg:?}: the bench's maps run 10 or 50 items at a time")),
    }
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// End-to-end orders/s, CPU per order, microseconds per message per handler.
    Throughput {
        #[arg(long, default_value_t = 100_000)]
        orders: usize,
        /// single-step, three-step or both.
        #[arg(long, default_value = "both")]
        workflow: String,
        /// Concurrent drivers (tokio tasks on the runtime's worker threads).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Runs per workflow; medians are quoted.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// A parallel stage's branch replies racing on one record: five steps one after the
    /// other (sequential-5) against the same five as one stage's branches (parallel-5),
    /// each store call a round trip. Orders/s, CPU and write conflicts (re-read and
    /// re-decided writes) per order, with the orders in waves: 1 (an order alone, its
    /// replies in one batch: the most that race) and 0 (all at once).
    Contention {
        /// Orders per run (1 to 10,000,000).
        #[arg(long, default_value_t = 20_000,
              value_parser = crate::args::whole::<usize>("--orders", 1, 10_000_000))]
        orders: usize,
        /// Orders per wave, comma separated (0 to 10,000,000); 0: all at once.
        #[arg(long, value_delimiter = ',', default_value = "1,0",
              value_parser = crate::args::whole::<usize>("--waves", 0, 10_000_000))]
        waves: Vec<usize>,
        /// Runs per workflow and wave (1 to 100); medians are quoted.
        #[arg(long, default_value_t = 5, value_parser = crate::args::whole::<usize>("--repeats", 1, 100))]
        repeats: usize,
    },
    /// Items read per supervisor sweep with 100 due tasks among N finished ones and W
    /// waiting ones (timers and callbacks not yet due).
    Sweep {
        /// Finished-task counts, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,1000000")]
        finished: Vec<usize>,
        /// Waiting-task counts, comma separated: one row per finished and waiting count.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        waiting: Vec<usize>,
        #[arg(long, default_value_t = 100)]
        due: usize,
    },
    /// A backlog of timers all due at once (an hour's wait before a step), woken by the
    /// supervisor's runs: how late the latest wakes against the period. Real time within a
    /// run, each store call and SQS request taking --latency-ms.
    Backlog {
        /// Timers due at once (1 to 1,000,000).
        #[arg(long, default_value_t = 100_000,
              value_parser = crate::args::whole::<usize>("--timers", 1, 1_000_000))]
        timers: usize,
        /// Milliseconds each store call and SQS request takes (0 to 1000).
        #[arg(long, default_value_t = 10, value_parser = crate::args::whole::<u64>("--latency-ms", 0, 1_000))]
        latency_ms: u64,
        /// The supervisor's period, which is also each run's time budget, in ms (10000 to 3600000).
        #[arg(long, default_value_t = 60_000,
              value_parser = crate::args::whole::<u64>("--supervisor-period-ms", 10_000, 3_600_000))]
        supervisor_period_ms: u64,
        /// Backlogs (1 to 100); medians are quoted.
        #[arg(long, default_value_t = 3, value_parser = crate::args::whole::<usize>("--repeats", 1, 100))]
        repeats: usize,
    },
    /// How late timers wake, both ways: a 5-minute wait on its delayed Schedule, an hour's
    /// on the supervisor's sweep (simulated time, orders spread over one period).
    Timers {
        #[arg(long, default_value_t = 1_000)]
        orders: usize,
        #[arg(long, default_value_t = 60_000)]
        supervisor_period_ms: u64,
    },
    /// Simulated time from an agent crash to the order's completion.
    Recovery {
        #[arg(long, default_value_t = 1_000)]
        orders: usize,
        #[arg(long, default_value_t = 30_000)]
        step_timeout_ms: u64,
        #[arg(long, default_value_t = 10_000)]
        reply_grace_ms: u64,
        /// A waiting task's deadline; a prompt claim keeps it when it covers the attempt.
        #[arg(long, default_value_t = 60_000)]
        pending_timeout_ms: u64,
        #[arg(long, default_value_t = 60_000)]
        supervisor_period_ms: u64,
        /// Base of the supervisor's retry backoff (the first retry waits up to this).
        #[arg(long, default_value_t = 1_000)]
        retry_base_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// AWS requests, billed units and dollars per million orders, against Step Functions:
    /// single-step and three-step orders (with and without failures), a callback step and
    /// an hour's timer, examples/parallel.json's order (a 3-branch stage) beside the
    /// same order's steps one after the other (examples/sequential.json), single-step
    /// and three-step again with one agent limited to 10 calls at once (its gate's cost),
    /// and a map step over orders of 10 and of 100 lines (10 at a time) beside a stage of
    /// ten branches of the same step, with their figures per item.
    Cost {
        #[arg(long, default_value_t = 10_000)]
        orders: usize,
        #[arg(long, default_value_t = 256)]
        memory_mb: u64,
        #[arg(long, default_value_t = 50)]
        invocation_ms: u64,
        #[arg(long, default_value_t = 50)]
        remote_call_ms: u64,
    },
    /// One map step over --items items (a list step's answer), alone on the rig (embedded,
    /// system clock, the remote answering at once): the time from the first item's call to
    /// the last and the items' calls per second at each --concurrency, and the map's record
    /// write by write (its largest size, its write units, and the least time DynamoDB's
    /// 1,000 write units a second on one item allow them).
    Map {
        /// Items of the map (1 to 1,000).
        #[arg(long, default_value_t = 1_000, value_parser = crate::args::whole::<usize>("--items", 1, 1_000))]
        items: usize,
        /// The map's max_concurrency, comma separated: 10 and/or 50.
        #[arg(long, value_delimiter = ',', default_value = "10,50", value_parser = map_cap)]
        concurrency: Vec<u32>,
        /// Runs per cap (1 to 100); medians are quoted.
        #[arg(long, default_value_t = 5, value_parser = crate::args::whole::<usize>("--repeats", 1, 100))]
        repeats: usize,
    },
    /// Launch function binaries against a stub Lambda Runtime API and a local HTTPS stub
    /// of AWS (and the remote service): init time, first invocation including its first
    /// TLS connection, peak RSS.
    ColdStart {
        /// Function binaries (e.g. target/release/submission).
        #[arg(required = true)]
        binaries: Vec<std::path::PathBuf>,
        #[arg(long, default_value_t = 7)]
        repeats: usize,
    },
    /// One agent's service hangs every call: a healthy agent's step latency (p50, p99)
    /// against a run where both are healthy.
    Starvation {
        #[arg(long, default_value_t = 4_000)]
        orders: usize,
        /// Orders per second (a steady trickle).
        #[arg(long, default_value_t = 200)]
        rate: u32,
        /// Concurrent agent invocations (batches of 10), as AgentMaxConcurrency caps them
        /// (its default is 10).
        #[arg(long, default_value_t = 10)]
        concurrency: usize,
        #[arg(long, default_value_t = 1_000)]
        step_timeout_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Flow control: a burst of --orders orders through an agent with max_in_flight
    /// --places (and max_per_second --per-second) whose service answers in 0 to twice
    /// --latency-ms, and an unlimited agent's orders at --rate a second beside it, with
    /// --schedulers scheduler containers racing at the gate and the store billing and
    /// throttling each item as DynamoDB does. The most calls the limited service saw at
    /// once (its own count), its calls per second against places / latency, the waits for a
    /// place, the most write units one item took in a second, the store's throttles, the
    /// gate's dollars per million calls, and the unlimited agent's step latency against a
    /// run of its orders alone.
    Flow(FlowArgs),
    /// Fair shares: one customer's --orders orders at once and --others orders of 50 other
    /// customers at --rate a second beside them, through one agent with max_in_flight 10,
    /// with max_in_flight_per_key --per-key on the customer and without: the others'
    /// waits for their call and the flooding customer's most calls at once.
    Fair {
        /// The flooding customer's orders, sent at once (1 to 1,000,000).
        #[arg(long, default_value_t = 2_000,
              value_parser = crate::args::whole::<usize>("--orders", 1, 1_000_000))]
        orders: usize,
        /// The other customers' orders (1 to 1,000,000).
        #[arg(long, default_value_t = 200,
              value_parser = crate::args::whole::<usize>("--others", 1, 1_000_000))]
        others: usize,
        /// The other customers' orders per second (1 to 1000).
        #[arg(long, default_value_t = 50, value_parser = crate::args::whole::<u32>("--rate", 1, 1_000))]
        rate: u32,
        /// Calls at once per customer in the run with a per-key limit (1 to 10).
        #[arg(long, default_value_t = 2, value_parser = crate::args::whole::<u32>("--per-key", 1, 10))]
        per_key: u32,
        /// Concurrent batches per function (1 to 1000).
        #[arg(long, default_value_t = 10, value_parser = crate::args::whole::<usize>("--concurrency", 1, 1_000))]
        concurrency: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Cost and latency per order as traffic arrives: the four functions run as `sasctl up`
    /// runs them, against an endpoint (moto) through a proxy that counts every request;
    /// orders arrive at --rate per second or all at once (--bulk). One run per --windows
    /// (or the whole --matrix); each makes its own sas-traffic-* resources and removes them.
    /// Like `sasctl up`, the functions take their tuning variables (SEND_MAX_HOLD_MS, ...)
    /// from the environment when set.
    Traffic {
        /// The AWS endpoint to run against: moto (infra/moto.sh start) or LocalStack.
        #[arg(long, value_name = "URL")]
        endpoint_url: String,
        /// Orders per second (a trickle); without it, --bulk.
        #[arg(long, value_parser = positive_rate, conflicts_with = "bulk")]
        rate: Option<f64>,
        /// All orders at once, ten to a SendMessageBatch.
        #[arg(long)]
        bulk: bool,
        /// Orders per run.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        orders: u64,
        /// single-step or three-step (of the built-in examples/workflows.json), or with
        /// --workflows examples/parallel.json (or sequential.json) parallel-order (or
        /// sequential-order): the workflows the cost model knows too.
        #[arg(long, default_value = "single-step")]
        workflow: String,
        /// The definition file the functions run (default: the built-in
        /// examples/workflows.json).
        #[arg(long, value_name = "FILE")]
        workflows: Option<std::path::PathBuf>,
        /// Batching windows ORDERS/SCHEDULER/AGENT in seconds, one run each (repeatable).
        #[arg(long, value_parser = Windows::parse, default_value = "0/0/0")]
        windows: Vec<Windows>,
        /// One run per window of the published table: 0/0/0, then each queue at 1, 5, 20 s.
        #[arg(long, conflicts_with = "windows")]
        matrix: bool,
        /// Batches in flight per function.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
        concurrency: u64,
    },
    /// An idle deployment: the functions with no orders for --seconds against an endpoint
    /// through a counting proxy, priced for a month (every queue's pollers, the supervisor).
    Idle {
        /// The AWS endpoint to run against: moto (infra/moto.sh start) or LocalStack.
        #[arg(long, value_name = "URL")]
        endpoint_url: String,
        /// How long to watch the idle functions (the supervisor runs every 20 s meanwhile).
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(20..=3_600))]
        seconds: u64,
    },
    /// On DynamoDB at an endpoint (moto, LocalStack, AWS): items read listing Error and
    /// live tasks among N finished ones, counted by the adapter and by DynamoDB itself.
    /// Makes a bench-listing-xxxxxxxx-state table and deletes it at the end.
    Listing {
        #[arg(long, value_name = "URL")]
        endpoint_url: String,
        /// Finished tasks (Processed and Compensated, half each).
        #[arg(long, default_value_t = 100_000)]
        finished: usize,
        /// Tasks in Error.
        #[arg(long, default_value_t = 1_000)]
        errors: usize,
        /// Live (Pending) tasks.
        #[arg(long, default_value_t = 20)]
        live: usize,
    },
}

fn workflows(arg: &str) -> Vec<&'static str> {
    match arg {
        "single-step" => vec!["single-step"],
        "three-step" => vec!["three-step"],
        _ => vec!["single-step", "three-step"],
    }
}

fn emit<T: Serialize>(json: bool, value: &T, text: impl FnOnce(&T) -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
    } else {
        println!("{}", text(value));
    }
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    match args.what {
        BenchCommand::Throughput { orders, workflow, workers, repeats } => {
            let mut reports = Vec::new();
            for wf in workflows(&workflow) {
                reports.push(throughput(wf, orders, workers, repeats).await);
            }
            emit(args.json, &reports, |all| all.iter().map(ToString::to_string).collect());
        }
        BenchCommand::Contention { orders, waves, repeats } => {
            let report = contention(&[rig::SEQUENTIAL_5, rig::PARALLEL_5], orders, &waves, repeats).await;
            emit(args.json, &report, ToString::to_string);
        }
        BenchCommand::Sweep { finished, waiting, due } => {
            let mut rows = Vec::new();
            for n in finished {
                for &w in &waiting {
                    rows.push(sweep_once(n, w, due).await);
                }
            }
            emit(args.json, &SweepReport(rows), ToString::to_string);
        }
        BenchCommand::Backlog { timers, latency_ms, supervisor_period_ms, repeats } => {
            let report = backlog_report(timers, latency_ms, supervisor_period_ms, repeats).await;
            emit(args.json, &report, ToString::to_string);
        }
        BenchCommand::Timers { orders, supervisor_period_ms } => {
            let rows = timers(orders, supervisor_period_ms).await;
            emit(args.json, &rows, |all| all.iter().map(ToString::to_string).collect());
        }
        BenchCommand::Recovery {
            orders,
            step_timeout_ms,
            reply_grace_ms,
            pending_timeout_ms,
            supervisor_period_ms,
            retry_base_ms,
            seed,
        } => {
            let mut policy =
                Policy { step_timeout_ms, reply_grace_ms, pending_timeout_ms, ..Policy::default() };
            policy.retry_backoff.base_ms = retry_base_ms;
            emit(args.json, &recovery(orders, policy, supervisor_period_ms, seed).await, ToString::to_string);
        }
        BenchCommand::Cost { orders, memory_mb, invocation_ms, remote_call_ms } => {
            let a = CostAssumptions { memory_mb, invocation_ms, remote_call_ms };
            let mut rows = Vec::new();
            for wf in ["single-step", "three-step"] {
                for failures in [false, true] {
                    rows.push(cost(wf, orders, failures, &a).await);
                }
            }
            rows.push(cost(rig::CALLBACK_TIMER, orders, false, &a).await);
            for wf in [rig::SEQUENTIAL_ORDER, rig::PARALLEL_ORDER] {
                for failures in [false, true] {
                    rows.push(cost(wf, orders, failures, &a).await);
                }
            }
            // Flow control: the single-step and three-step rows again, one agent with
            // max_in_flight 10 (docs/BENCHMARKS.md 11); every order arrives at once, so all
            // but ten wait for a place. And single-step with 100 places: the same burst with
            // far less waiting, nearer the gate's floor (a read and a write at the claim and
            // at the release).
            let limited = [
                ("single-step", "orders", 10),
                ("three-step", "payment", 10),
                ("single-step", "orders", 100),
            ];
            for (wf, agent, places) in limited {
                let limits = [(
                    agent.to_owned(),
                    sas::domain::gate::Limits {
                        max_in_flight: Some(places),
                        max_per_second: None,
                        places_per_gate: None,
                        per_key: None,
                    },
                )];
                rows.push(cost_limited(wf, orders, false, &limits.into(), &a).await);
            }
            // Map steps (docs/BENCHMARKS.md, "Map steps (issue 39)"): one step over the
            // order's lines, ten at a time, for orders of 10 and of 100 lines; and the same
            // step as a stage's ten branches. Figures per item (per remote call) too. Last,
            // the 10-line map with its agent limited to 10 places: one item at a time, each
            // claimed through the gate.
            let none = std::collections::BTreeMap::new();
            for (wf, lines) in [(rig::MAP_LINES, 10), (rig::MAP_LINES, 100), (rig::PARALLEL_10, 1)] {
                rows.push(cost_items(wf, orders, lines, &none, &a).await);
            }
            let warehouse = [(
                "warehouse".to_owned(),
                sas::domain::gate::Limits { max_in_flight: Some(10), ..Default::default() },
            )];
            rows.push(cost_items(rig::MAP_LINES, orders, 10, &warehouse.into(), &a).await);
            emit(args.json, &rows, |all| all.iter().map(ToString::to_string).collect());
        }
        BenchCommand::Map { items, concurrency, repeats } => {
            emit(args.json, &map_bench(items, &concurrency, repeats).await?, ToString::to_string);
        }
        BenchCommand::ColdStart { binaries, repeats } => {
            let mut reports = Vec::new();
            for b in &binaries {
                reports.push(cold_start(b, repeats).await.map_err(|e| format!("{}: {e}", b.display()))?);
            }
            emit(args.json, &ColdStartTable(reports), ToString::to_string);
        }
        BenchCommand::Starvation { orders, rate, concurrency, step_timeout_ms, seed } => {
            let o = StarvationOptions { orders, rate, concurrency, step_timeout_ms, seed };
            emit(args.json, &starvation(&o).await?, ToString::to_string);
        }
        BenchCommand::Flow(flow_args) => {
            let o = flow_args.options();
            let bar = crate::text::progress_bar(0, "terminal");
            if args.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            let report = flow(&o, |run, p| {
                bar.set_length(p.expected as u64);
                bar.set_position(p.terminal as u64);
                bar.set_message(run.to_owned());
            })
            .await;
            bar.finish_and_clear();
            let report = report?;
            emit(args.json, &report, ToString::to_string);
            if let Some(first) = &report.first_broken {
                return Err(format!(
                    "the burst run broke invariants ({:?}), first: {first}",
                    report.burst_invariants_broken
                ));
            }
        }
        BenchCommand::Fair { orders, others, rate, per_key, concurrency, seed } => {
            let o = FairOptions { orders, others, rate, per_key, concurrency, seed };
            emit(args.json, &fair(&o, |_, _| {}).await?, ToString::to_string);
        }
        BenchCommand::Traffic {
            endpoint_url,
            rate,
            bulk: _,
            orders,
            workflow,
            workflows,
            windows,
            matrix,
            concurrency,
        } => {
            // The functions run the file's workflow; the cost model prices DynamoDB from
            // its own copy of it, so it must know it by name too.
            let file = crate::workflows::load(workflows.as_deref())?;
            let modelled = rig::bench_workflows();
            if file.workflows.get(&workflow).is_none()
                || modelled.get(&workflow) != file.workflows.get(&workflow)
            {
                let known: Vec<&str> = file
                    .workflows
                    .names()
                    .into_iter()
                    .filter(|n| modelled.get(n) == file.workflows.get(n))
                    .collect();
                return Err(format!(
                    "--workflow {workflow:?}: {} has {} that the cost model prices too",
                    crate::workflows::source_name(workflows.as_deref()),
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                ));
            }
            let o = TrafficOptions {
                endpoint: endpoint_url,
                workflows,
                workflow,
                orders: orders as usize,
                rate,
                windows: if matrix { self::matrix() } else { windows },
                concurrency: concurrency as usize,
            };
            emit(args.json, &traffic(&o).await?, ToString::to_string);
        }
        BenchCommand::Idle { endpoint_url, seconds } => {
            emit(args.json, &idle(&endpoint_url, seconds).await?, ToString::to_string);
        }
        BenchCommand::Listing { endpoint_url, finished, errors, live } => {
            let progress = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
            let o = ListingOptions { endpoint: endpoint_url, finished, errors, live, progress };
            emit(args.json, &listing(&o).await?, ToString::to_string);
        }
    }
    Ok(())
}
