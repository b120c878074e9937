//! `sasctl bench starvation`: one agent's service hangs; does it starve the others?
//!
//! Orders arrive as a steady trickle and take two one-step workflows in turn: `via-steady`
//! (agent `steady`, a healthy service) and `via-slow` (agent `slow`). The same pipeline
//! (`sasctl dev`'s: embedded backend, real HTTP to the simulated service, the agent
//! function's concurrency capped as a deployment caps it) runs twice: once with `slow`
//! healthy (the baseline), once with every call to it hanging. The figure is the `steady`
//! step's latency, from its first claim to its success: what a hanging neighbour costs a
//! healthy agent's orders.

use std::fmt;
use std::time::Duration;

use sas::domain::{Action, Cause, Definitions};
use sas_sim::ledger::RemoteFaults;

use serde::Serialize;

use crate::dev::{self, DevOptions, DevOutcome};

/// Both agents as a team would declare services that answer in milliseconds: a call
/// timeout of 250 ms, and the deployment's default breaker (5 failures, open 1 s).
const DEFINITIONS: &str = r#"{"agents": {
    "steady": {"timeout_ms": 250, "breaker": {"failures": 5, "open_ms": 1000}},
    "slow": {"timeout_ms": 250, "breaker": {"failures": 5, "open_ms": 1000}}},
  "workflows": [
    {"name": "via-steady", "steps": [{"name": "steady", "agent": "steady", "effect": "none"}]},
    {"name": "via-slow", "steps": [{"name": "stuck", "agent": "slow", "effect": "none"}]}]}"#;

/// A healthy service answers in 0 to this many ms (uniform): a service on the network,
/// not one on loopback. The hold a hung neighbour can add to a reply is the send
/// coalescer's (20 ms, `SEND_MAX_HOLD_MS`), which this puts in proportion.
pub const SERVICE_TIME_MS: u64 = 50;

#[derive(Debug, Clone, Copy)]
pub struct StarvationOptions {
    pub orders: usize,
    /// Orders per second.
    pub rate: u32,
    /// Concurrent agent invocations (batches of 10), as `AgentMaxConcurrency` caps them.
    pub concurrency: usize,
    pub step_timeout_ms: u64,
    pub seed: u64,
}

/// One run's `steady` step latencies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latencies {
    pub samples: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StarvationReport {
    pub options_orders: usize,
    pub rate: u32,
    pub concurrency: usize,
    pub baseline: Latencies,
    pub hanging: Latencies,
    /// Calls to the hanging service, and how many attempts met its open circuit instead.
    pub hanging_keys: u64,
    pub circuit_open: u64,
}

impl StarvationReport {
    pub fn p99_ratio(&self) -> f64 {
        self.hanging.p99 as f64 / self.baseline.p99.max(1) as f64
    }
}

impl fmt::Display for StarvationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "starvation: {} orders at {}/s, agent concurrency {} (batches of 10); step `steady` latency, first claim to success",
            self.options_orders, self.rate, self.concurrency
        )?;
        for (name, l) in
            [("baseline (slow healthy)", &self.baseline), ("slow hangs every call", &self.hanging)]
        {
            writeln!(
                f,
                "  {name:<24} p50 {:>5} ms  p99 {:>5} ms  max {:>5} ms  ({} steps)",
                l.p50, l.p99, l.max, l.samples
            )?;
        }
        writeln!(
            f,
            "  p99 ratio {:.2} (target <= 2); the hanging service was called for {} steps, {} attempts met its open circuit",
            self.p99_ratio(),
            self.hanging_keys,
            self.circuit_open
        )
    }
}

fn options(o: &StarvationOptions, slow: RemoteFaults) -> DevOptions {
    let healthy = RemoteFaults { latency_max_ms: SERVICE_TIME_MS, ..RemoteFaults::default() };
    DevOptions {
        orders: o.orders,
        definitions: Definitions::parse(DEFINITIONS).expect("the benchmark's definitions are valid"),
        workflow: "via-steady,via-slow".into(),
        faults: healthy,
        agent_faults: [("slow".to_owned(), slow)].into(),
        duplicate_rate: 0.0,
        malformed: 0,
        queue_duplicate_rate: 0.0,
        step_timeout_ms: o.step_timeout_ms,
        concurrency: o.concurrency,
        seed: o.seed,
        max_runtime: Duration::from_secs(600),
        arrival_per_s: Some(o.rate),
        ..DevOptions::default()
    }
}

/// First claim of the `steady` step to its success, per order, in ms.
fn steady_latencies(run: &DevOutcome) -> Latencies {
    let mut claimed = std::collections::HashMap::new();
    let mut samples = Vec::new();
    for w in run.writes.iter().filter(|w| w.after.workflow == "via-steady") {
        let t = &w.after;
        match t.last_cause {
            Cause::Claimed { step: 0, action: Action::Do } => {
                claimed.entry(t.order_id.clone()).or_insert(t.updated_at);
            }
            Cause::Succeeded { step: 0, action: Action::Do } => {
                if let Some(at) = claimed.get(&t.order_id) {
                    samples.push(t.updated_at.millis_since(*at));
                }
            }
            _ => {}
        }
    }
    samples.sort_unstable();
    let pick =
        |q: f64| samples.get(((samples.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    Latencies {
        samples: samples.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: samples.last().copied().unwrap_or(0),
    }
}

pub async fn starvation(o: &StarvationOptions) -> Result<StarvationReport, String> {
    let baseline = dev::run(
        options(o, RemoteFaults { latency_max_ms: SERVICE_TIME_MS, ..RemoteFaults::default() }),
        |_| {},
    )
    .await
    .map_err(|e| format!("baseline run failed to start: {e}"))?;
    let hanging = dev::run(options(o, RemoteFaults { hang: 1.0, ..RemoteFaults::default() }), |_| {})
        .await
        .map_err(|e| format!("hanging run failed to start: {e}"))?;
    for (name, r) in [("baseline", &baseline), ("hanging", &hanging)] {
        let violations = crate::invariants::check(r);
        if !violations.is_empty() {
            return Err(format!(
                "{name} run broke {} invariant(s), first: {}",
                violations.len(),
                violations[0]
            ));
        }
    }
    let calls_to_slow = hanging
        .ledger
        .called_as
        .values()
        .filter(|names| names.iter().any(|(agent, _)| agent == "slow"))
        .count();
    Ok(StarvationReport {
        options_orders: o.orders,
        rate: o.rate,
        concurrency: o.concurrency,
        baseline: steady_latencies(&baseline),
        hanging: steady_latencies(&hanging),
        hanging_keys: calls_to_slow as u64,
        circuit_open: hanging.metrics.count(sas::ports::Metric::CircuitOpen),
    })
}
