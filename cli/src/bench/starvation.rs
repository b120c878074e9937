//! `sasctl bench starvation`: one agent's service hangs; does it starve the others?
//!
//! Every order runs a workflow of two read-only steps: `steady` (agent `steady`, a healthy
//! service) then `stuck` (agent `slow`). The same pipeline (`sasctl dev`'s, embedded
//! backend, real HTTP to the simulated service, the agent function's concurrency capped
//! as a deployment caps it) runs twice: once with `slow` healthy (the baseline), once with
//! every call to it hanging. The figure is the `steady` step's latency, from its first
//! claim to its success, per order: what a hanging neighbour costs a healthy agent.

use std::fmt;
use std::time::Duration;

use sas::domain::{Action, Cause, Definitions};
use sas_sim::ledger::RemoteFaults;

use serde::Serialize;

use crate::dev::{self, DevOptions, DevOutcome};

const DEFINITIONS: &str = r#"{"agents": {"steady": {}, "slow": {}},
  "workflows": [{"name": "pair", "steps": [
    {"name": "steady", "agent": "steady", "effect": "none"},
    {"name": "stuck", "agent": "slow", "effect": "none"}]}]}"#;

#[derive(Debug, Clone, Copy)]
pub struct StarvationOptions {
    pub orders: usize,
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
            "starvation: {} orders, agent concurrency {} (batches of 10); step `steady` latency, first claim to success",
            self.options_orders, self.concurrency
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
    let healthy = RemoteFaults { latency_max_ms: 2, ..RemoteFaults::default() };
    DevOptions {
        orders: o.orders,
        definitions: Definitions::parse(DEFINITIONS).expect("the benchmark's definitions are valid"),
        workflow: "pair".into(),
        faults: healthy,
        agent_faults: [("slow".to_owned(), slow)].into(),
        duplicate_rate: 0.0,
        malformed: 0,
        queue_duplicate_rate: 0.0,
        step_timeout_ms: o.step_timeout_ms,
        concurrency: o.concurrency,
        seed: o.seed,
        max_runtime: Duration::from_secs(600),
        ..DevOptions::default()
    }
}

/// First claim of step 0 to its success, per order, in ms.
fn steady_latencies(run: &DevOutcome) -> Latencies {
    let mut claimed = std::collections::HashMap::new();
    let mut samples = Vec::new();
    for w in &run.writes {
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
    let baseline =
        dev::run(options(o, RemoteFaults { latency_max_ms: 2, ..RemoteFaults::default() }), |_| {})
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
        concurrency: o.concurrency,
        baseline: steady_latencies(&baseline),
        hanging: steady_latencies(&hanging),
        hanging_keys: calls_to_slow as u64,
        circuit_open: hanging.metrics.count(sas::ports::Metric::CircuitOpen),
    })
}
