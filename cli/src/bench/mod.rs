//! `sasctl bench`: the figures of docs/BENCHMARKS.md, each measured in one run.
//!
//! One file per benchmark, each with its report type (`Display` for text, `Serialize`
//! for `--json`):
//!
//! - `throughput`: the whole pipeline in-process on the embedded backend, the remote
//!   service answered in-process, orders per second, CPU time per order and microseconds
//!   per message per handler.
//! - `sweep`: items the supervisor reads per sweep with 100 due tasks among N finished ones.
//! - `recovery`: simulated time from an agent crash to the order's completion.
//! - `cost`: AWS requests and billed units per order, counted around the ports, priced.
//! - `cold_start`: function binaries launched against a stub Runtime API and an HTTPS
//!   stub of AWS (`aws_stub`): init, first invocation with its TLS connection, peak RSS.
//! - `starvation`: one agent's service hangs every call; the latency of a healthy
//!   agent's steps against a run where both are healthy (`sasctl dev`'s pipeline).
//! - `listing`: on DynamoDB at an endpoint, what listing Error and live tasks reads
//!   among N finished ones (the sparse indexes keep it to what is listed).
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

mod cold_start;
mod cost;
mod counting;
mod listing;
mod measure;
mod recovery;
mod remote;
mod rig;
mod starvation;
mod sweep;
mod throughput;

use serde::Serialize;

use sas::domain::Policy;

pub use cold_start::{
    BENCH_STATE_TABLE, ColdStartCase, ColdStartReport, ColdStartRun, ColdStartTable, cold_start,
    cold_start_case, cold_start_once, judge,
};
pub use cost::{CostAssumptions, CostRow, cost, prices};
pub use counting::{AwsUsage, CountingAlerts, CountingQueues, CountingStore};
pub use listing::{ListingOptions, ListingReport, ListingRow, listing};
pub use measure::{cpu_time, median, peak_rss_kib};
pub use recovery::{RecoveryReport, recovery};
pub use remote::InstantRemote;
pub use rig::{Function, HandlerTime, Rig, RigOptions};
pub use starvation::{Latencies, StarvationOptions, StarvationReport, starvation};
pub use sweep::{SweepReport, SweepRow, sweep_once};
pub use throughput::{ThroughputReport, ThroughputRun, throughput, throughput_once};

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
    /// Items read per supervisor sweep with 100 due tasks among N finished ones.
    Sweep {
        /// Finished-task counts, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,1000000")]
        finished: Vec<usize>,
        #[arg(long, default_value_t = 100)]
        due: usize,
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
    /// AWS requests, billed units and dollars per million orders, against Step Functions.
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
        BenchCommand::Sweep { finished, due } => {
            let mut rows = Vec::new();
            for n in finished {
                rows.push(sweep_once(n, due).await);
            }
            emit(args.json, &SweepReport(rows), ToString::to_string);
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
            emit(args.json, &rows, |all| all.iter().map(ToString::to_string).collect());
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
        BenchCommand::Listing { endpoint_url, finished, errors, live } => {
            let progress = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
            let o = ListingOptions { endpoint: endpoint_url, finished, errors, live, progress };
            emit(args.json, &listing(&o).await?, ToString::to_string);
        }
    }
    Ok(())
}
