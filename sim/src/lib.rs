//! A seeded, deterministic simulation of the whole sas pipeline, in the manner of
//! FoundationDB's and TigerBeetle's: the real handlers run through the real ports on the
//! embedded backend, with simulated time, one seeded generator and a fault layer, on one
//! thread. The same seed gives the same history; a failing seed replays with
//! `SIM_SEED=<n>`. See docs/SIMULATION.md.

pub mod check;
pub mod deploy;
pub mod deployment;
mod event_loop;
mod executor;
pub mod faults;
pub mod gate_log;
pub mod invariants;
mod invocation;
pub mod ledger;
mod operator;
pub mod outside;
pub mod remote;
pub mod run;
pub mod swarm;
pub mod timing;
mod trace_record;
pub mod workload;
pub mod world;

use std::collections::BTreeMap;

use sas::domain::{ProcessState, Trigger};

pub use check::Violation;
pub use run::{Options, Outcome, simulate};

/// One seed, run and checked.
pub struct CheckedRun {
    pub outcome: Outcome,
    pub violations: Vec<Violation>,
}

pub fn run_seed(seed: u64, options: &Options) -> CheckedRun {
    let outcome = simulate(seed, options);
    let violations = check::check(&outcome);
    CheckedRun { outcome, violations }
}

/// What a batch of seeds came to.
#[derive(Debug, Default, Clone)]
pub struct SeedsSummary {
    pub seeds: u64,
    /// (seed, its violations), for every failing seed.
    pub failures: Vec<(u64, Vec<Violation>)>,
    pub coverage: BTreeMap<(ProcessState, Trigger), u64>,
    pub final_states: BTreeMap<ProcessState, u64>,
    pub orders: u64,
    pub invocations: u64,
    pub crashes: u64,
    pub steps: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// The outside party's words of callback steps, by kind (`outside::Word`).
    pub outside: BTreeMap<&'static str, u64>,
    pub metrics: BTreeMap<&'static str, u64>,
    /// The longest an order took to end after the faults stopped, in simulated ms.
    pub max_tail_ms: u64,
    pub simulated_ms: u64,
    /// Forward calls the remote refused because their step's undo was answered first.
    pub late_do_refused: u64,
    /// What parallel stages went through (`check::stage_coverage`).
    pub stages: BTreeMap<&'static str, u64>,
    /// What map steps went through (`check::map_coverage`; `max_in_flight` the most of any).
    pub maps: BTreeMap<&'static str, u64>,
    /// What limited agents' calls went through: `calls`, `copies` (calls under a place
    /// after its reply was sent, a copy of its request called: `ledger::Flight::copy`;
    /// none while only the request that wrote the call's mark calls) and `throttled`.
    pub flow: BTreeMap<&'static str, u64>,
}

impl SeedsSummary {
    fn add(&mut self, seed: u64, v: &CheckedRun) {
        let o = &v.outcome;
        self.seeds += 1;
        if !v.violations.is_empty() {
            self.failures.push((seed, v.violations.clone()));
        }
        for (k, n) in check::coverage(o) {
            *self.coverage.entry(k).or_default() += n;
        }
        for (k, n) in check::stage_coverage(o) {
            *self.stages.entry(k).or_default() += n;
        }
        for (k, n) in check::map_coverage(o) {
            let total = self.maps.entry(k).or_default();
            *total = if k == "max_in_flight" { (*total).max(n) } else { *total + n };
        }
        for t in &o.tasks {
            *self.final_states.entry(t.state()).or_default() += 1;
        }
        self.orders += o.tasks.len() as u64;
        self.invocations += o.invocations;
        self.crashes += o.crashes;
        self.steps += o.steps;
        for (k, n) in &o.fault_counts {
            *self.faults.entry(k).or_default() += n;
        }
        for (k, n) in &o.metrics {
            *self.metrics.entry(k).or_default() += n;
        }
        for (k, n) in o.outside.counts() {
            *self.outside.entry(k).or_default() += n;
        }
        for (w, ctx) in o.writes.iter().zip(&o.write_ctx) {
            // An operator's completions by hand, beside the outside's words.
            if ctx.role == Some(crate::deployment::Role::Operator) {
                let by_hand = match w.after.last_cause {
                    sas::domain::Cause::Completed { .. } => Some("completed_by_hand"),
                    sas::domain::Cause::Failed { .. } => Some("failed_by_hand"),
                    _ => None,
                };
                if let Some(k) = by_hand {
                    *self.outside.entry(k).or_default() += 1;
                }
            }
            if w.after.state().is_terminal() && w.before.as_ref().is_some_and(|b| !b.state().is_terminal()) {
                self.max_tail_ms = self.max_tail_ms.max(ctx.at.saturating_sub(o.quiet_at));
            }
        }
        self.simulated_ms += o.ended_at;
        self.late_do_refused += o.ledger.late_do_refused;
        let flights = o.ledger.flights.values().flatten();
        let (calls, copies) = flights.fold((0, 0), |(n, c), f| (n + 1, c + u64::from(f.copy)));
        for (k, n) in [("calls", calls), ("copies", copies), ("throttled", o.ledger.throttled)] {
            *self.flow.entry(k).or_default() += n;
        }
    }

    fn merge(&mut self, other: SeedsSummary) {
        self.seeds += other.seeds;
        self.failures.extend(other.failures);
        for (k, n) in other.coverage {
            *self.coverage.entry(k).or_default() += n;
        }
        for (k, n) in other.final_states {
            *self.final_states.entry(k).or_default() += n;
        }
        self.orders += other.orders;
        self.invocations += other.invocations;
        self.crashes += other.crashes;
        self.steps += other.steps;
        for (k, n) in other.faults {
            *self.faults.entry(k).or_default() += n;
        }
        for (k, n) in other.metrics {
            *self.metrics.entry(k).or_default() += n;
        }
        for (k, n) in other.outside {
            *self.outside.entry(k).or_default() += n;
        }
        for (k, n) in other.stages {
            *self.stages.entry(k).or_default() += n;
        }
        for (k, n) in other.maps {
            let total = self.maps.entry(k).or_default();
            *total = if k == "max_in_flight" { (*total).max(n) } else { *total + n };
        }
        self.max_tail_ms = self.max_tail_ms.max(other.max_tail_ms);
        self.simulated_ms += other.simulated_ms;
        self.late_do_refused += other.late_do_refused;
        for (k, n) in other.flow {
            *self.flow.entry(k).or_default() += n;
        }
    }

    /// The rows of `lifecycle::TRANSITIONS` and how often the seeds took each.
    pub fn coverage_table(&self) -> String {
        let mut out = String::from("| from | trigger | to | times |\n|---|---|---|---:|\n");
        for (from, trigger, to) in sas::domain::lifecycle::TRANSITIONS {
            let n = self.coverage.get(&(*from, *trigger)).copied().unwrap_or(0);
            out.push_str(&format!("| {from:?} | {trigger:?} | {to:?} | {n} |\n"));
        }
        out
    }

    pub fn uncovered(&self) -> Vec<(ProcessState, Trigger)> {
        sas::domain::lifecycle::TRANSITIONS
            .iter()
            .filter(|(f, t, _)| !self.coverage.contains_key(&(*f, *t)))
            .map(|(f, t, _)| (*f, *t))
            .collect()
    }
}

/// Runs `seeds` on `threads` threads (each seed alone is single-threaded and
/// deterministic; threads only split the list). Stops early once `stop_after` seeds failed.
pub fn run_seeds(seeds: std::ops::Range<u64>, threads: usize, stop_after: Option<usize>) -> SeedsSummary {
    let threads = threads.max(1);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let next = std::sync::atomic::AtomicU64::new(seeds.start);
    let summaries: Vec<SeedsSummary> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut summary = SeedsSummary::default();
                    loop {
                        if stop_after.is_some_and(|n| failed.load(std::sync::atomic::Ordering::SeqCst) >= n) {
                            break;
                        }
                        let seed = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if seed >= seeds.end {
                            break;
                        }
                        let verdict = run_seed(seed, &Options { unhashed: true, ..Options::default() });
                        if !verdict.violations.is_empty() {
                            failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        summary.add(seed, &verdict);
                    }
                    summary
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a simulation thread panicked")).collect()
    });
    let mut total = SeedsSummary::default();
    for s in summaries {
        total.merge(s);
    }
    total.failures.sort_by_key(|(seed, _)| *seed);
    total
}

/// A failing seed, told so it can be replayed.
pub fn describe_failure(seed: u64, violations: &[Violation]) -> String {
    let mut out = format!(
        "seed {seed} FAILED ({} violations); replay: SIM_SEED={seed} cargo test -p sas-sim --test simulation replay -- --nocapture\n",
        violations.len()
    );
    for v in violations.iter().take(10) {
        out.push_str(&format!("  {v}\n"));
    }
    out
}

/// Seeds from the environment: `SIM_SEEDS` (how many, from `SIM_SEED_START`, default 0).
pub fn seeds_from_env(default: u64) -> std::ops::Range<u64> {
    let n = std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let start = std::env::var("SIM_SEED_START").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    start..start + n
}

/// Threads to spread seeds over: `SIM_THREADS`, else one per core.
pub fn threads() -> usize {
    std::env::var("SIM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}
