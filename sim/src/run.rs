//! One seed's run: what it draws, in which order (a seed replays only if that order holds),
//! and what it leaves behind for the checker (`check.rs`) and the report. The deployment
//! is put up by `deploy.rs` and driven by the discrete-event loop (`event_loop.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use sas::adapters::embedded::queue_names::{AGENT_DLQ, ORDERS_DLQ, SCHEDULER_DLQ};
use sas::adapters::embedded::{StoredMessage, WriteRecord};
use sas::domain::{OperatorAlert, Order, OrderId, Policy, TaskRecord, Workflows};

use crate::deploy::{deploy, workflows};
use crate::deployment::{CALLBACKS_DLQ, WORKER_DLQ, policy};
use crate::event_loop::{Ended, EventLoop};
use crate::invariants::Violation;
use crate::ledger::Ledger;
use crate::outside::Outside;
use crate::swarm::Swarm;
use crate::workload::{self, Arrival};
use crate::world::{Shared, WriteCtx};

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Keep every trace line (for printing a failing seed's history).
    pub keep_trace: bool,
    /// Overrides the seed's swarm.
    pub swarm: Option<Swarm>,
    /// Leaves the trace unhashed (`Outcome::hash` 0) unless its lines are kept: for runs of
    /// many seeds (`run_seeds`), which sum what the seeds did and never compare histories.
    /// Nothing noted in the trace draws from the generator or changes the world, so the
    /// run decides the same.
    pub unhashed: bool,
}

/// Everything a run leaves behind for the checker and the report.
pub struct Outcome {
    pub seed: u64,
    pub swarm: Swarm,
    pub policy: Policy,
    pub workflows: Workflows,
    pub arrivals: Vec<Arrival>,
    pub tasks: Vec<TaskRecord>,
    /// The order each accepted task carries, by id.
    pub orders: BTreeMap<OrderId, Arc<Order>>,
    pub writes: Vec<WriteRecord>,
    pub write_ctx: Vec<WriteCtx>,
    /// What the gates let through, and which invocations ended cleanly.
    pub gates: crate::gate_log::GateLog,
    /// When each supervisor run that stopped at its time budget ended (true time).
    pub sweeps_cut_short: Vec<u64>,
    pub dead_letters: BTreeMap<&'static str, Vec<StoredMessage>>,
    pub alerts: Vec<OperatorAlert>,
    pub ledger: Ledger,
    /// The outside party of callback steps: the tokens the remote service was handed and
    /// every word it sent.
    pub outside: Outside,
    /// True time the faults stopped, and the bound everything had to end within after.
    pub quiet_at: u64,
    /// True time the world first ran after the faults stopped (later than `quiet_at` when
    /// a time jump that began in the fault window carried the clock past it).
    pub resumed_at: u64,
    pub bound_ms: u64,
    pub ended_at: u64,
    pub steps: u64,
    pub invocations: u64,
    pub crashes: u64,
    pub fault_counts: BTreeMap<&'static str, u64>,
    /// The pipeline's own counters (stale replies dropped, claims lost, recoveries, ...).
    pub metrics: BTreeMap<&'static str, u64>,
    /// Violations seen while running (panics, a sweep that skipped a due task, no progress).
    pub runtime: Vec<Violation>,
    /// How branch replies of parallel stages arrived, by kind (`EventLoop::count_branch_replies`).
    pub branch_replies: BTreeMap<&'static str, u64>,
    /// The history's hash (FNV-1a of every trace line and its time); 0 if `Options::unhashed`.
    pub hash: u64,
    pub trace: Vec<String>,
}

/// Runs one seed to the end and returns what it left behind.
pub fn simulate(seed: u64, options: &Options) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Drawn even when the caller gives its own, so that a seed's given swarm meets the
    // same arrivals and world as the seed's own.
    let drawn = Swarm::from_rng(&mut rng);
    let swarm = options.swarm.clone().unwrap_or(drawn);
    let arrivals = workload::generate(&mut rng, &swarm);
    let shared = Shared::new(rng.u64(..), swarm.faults, options.keep_trace, options.unhashed);
    shared.w().ledger.limits = swarm.limits.clone();
    shared.w().ledger.clock_slack_ms = 2 * swarm.faults.skew_max_ms;
    // Built once per seed, and handed to each part that reads them.
    let workflows = workflows(&swarm);
    shared.w().outside = Outside::new(seed, swarm.outside, &workflows);
    shared.w().stage_branches = workflows
        .all()
        .iter()
        .flat_map(|w| {
            let branches = w.stages.iter().flat_map(|st| st.branches().filter_map(|i| w.step(i)));
            branches.chain(w.maps.iter().filter_map(|m| w.step(m.at)))
        })
        .map(|s| s.name.clone())
        .collect();
    let deployed = deploy(&swarm, &workflows, &shared, &mut rng);
    let ended = EventLoop::new(swarm, workflows, shared, deployed, arrivals, &mut rng).run();
    outcome(seed, ended)
}

fn outcome(seed: u64, ended: Ended) -> Outcome {
    let Ended {
        swarm,
        workflows,
        bound_ms,
        shared,
        deployed,
        arrivals,
        quiet_at,
        resumed_at,
        steps,
        invocations,
        crashes,
        runtime,
        branch_replies,
    } = ended;
    let tasks = deployed.store.tasks();
    let orders = tasks.iter().map(|t| (t.order_id.clone(), t.order.clone())).collect();
    let dead_letters = [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, WORKER_DLQ, CALLBACKS_DLQ]
        .into_iter()
        .map(|q| (q, deployed.queues.drain(q)))
        .collect();
    let mut w = shared.w();
    Outcome {
        seed,
        policy: policy(),
        workflows,
        arrivals,
        tasks,
        orders,
        writes: deployed.store.take_writes(),
        write_ctx: std::mem::take(&mut w.write_ctx),
        gates: std::mem::take(&mut w.gates),
        sweeps_cut_short: std::mem::take(&mut w.sweeps_cut_short),
        dead_letters,
        alerts: deployed.alerts.all(),
        ledger: std::mem::take(&mut w.ledger),
        outside: std::mem::take(&mut w.outside),
        quiet_at,
        resumed_at,
        bound_ms,
        ended_at: w.now,
        steps,
        invocations,
        crashes,
        fault_counts: std::mem::take(&mut w.fault_counts),
        metrics: deployed.metrics.snapshot().counters.into_iter().map(|(m, n)| (m.name(), n)).collect(),
        runtime,
        branch_replies,
        hash: w.trace.hash.0,
        trace: w.trace.lines.take().unwrap_or_default(),
        swarm,
    }
}
