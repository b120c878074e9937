//! The summary a `dev` run ends with.

use std::collections::BTreeMap;
use std::fmt::Write;

use sas::domain::ProcessState;
use sas::ports::Metric;

use crate::dev::DevOutcome;
use crate::invariants::Violation;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub orders_sent: usize,
    pub duplicates_sent: usize,
    pub bad_messages_sent: usize,
    pub accepted: usize,
    pub rejected_kept: usize,
    pub final_states: BTreeMap<String, usize>,
    pub agent_retries: u64,
    pub supervisor_recoveries: u64,
    pub supervisor_runs: u64,
    pub stale_replies_dropped: u64,
    pub claims_lost: u64,
    pub compensations_started: u64,
    pub compensation_steps: u64,
    pub alerts: usize,
    pub remote_calls: u64,
    pub remote_hangs: u64,
    pub remote_transient_failures: u64,
    pub remote_refusals: u64,
    pub order_latency_ms: Percentiles,
    pub step_latency_ms: Percentiles,
    pub elapsed_s: f64,
    pub orders_per_second: f64,
    pub violations: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

impl Report {
    pub fn new(run: &DevOutcome, violations: &[Violation]) -> Report {
        let m = &run.metrics;
        let pct = |metric| Percentiles {
            p50: m.percentile(metric, 50.0),
            p90: m.percentile(metric, 90.0),
            p99: m.percentile(metric, 99.0),
            max: m.percentile(metric, 100.0),
        };
        let mut final_states: BTreeMap<String, usize> =
            ProcessState::ALL.iter().map(|s| (s.as_str().to_owned(), 0)).collect();
        for t in &run.tasks {
            *final_states.entry(t.state.as_str().to_owned()).or_default() += 1;
        }
        let elapsed_s = run.elapsed.as_secs_f64();
        Report {
            orders_sent: run.sent.orders.len(),
            duplicates_sent: run.sent.duplicates,
            bad_messages_sent: run.sent.bad.len(),
            accepted: run.tasks.len(),
            rejected_kept: run.kept.len(),
            final_states,
            agent_retries: m.count(Metric::AgentRetry),
            supervisor_recoveries: m.count(Metric::Recovered),
            supervisor_runs: run.supervisor_runs,
            stale_replies_dropped: m.count(Metric::StaleReply),
            claims_lost: m.count(Metric::ClaimLost),
            compensations_started: m.count(Metric::CompensationStarted),
            compensation_steps: m.count(Metric::CompensationStep),
            alerts: run.alerts.len(),
            remote_calls: run.ledger.calls,
            remote_hangs: run.ledger.hangs,
            remote_transient_failures: run.ledger.transient,
            remote_refusals: run.ledger.refusals,
            order_latency_ms: pct(Metric::OrderLatencyMs),
            step_latency_ms: pct(Metric::StepLatencyMs),
            elapsed_s,
            orders_per_second: if elapsed_s > 0.0 { run.tasks.len() as f64 / elapsed_s } else { 0.0 },
            violations: violations
                .iter()
                .map(|v| (v.invariant.statement().to_owned(), v.detail.clone()))
                .collect(),
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let w = &mut out;
        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        let _ = writeln!(w, "\nsas dev run: {:.1} s, {:.0} orders/s", self.elapsed_s, self.orders_per_second);
        let _ = writeln!(
            w,
            "  sent        {} orders, {} exact duplicates, {} bad messages",
            self.orders_sent, self.duplicates_sent, self.bad_messages_sent
        );
        let _ = writeln!(
            w,
            "  accepted    {}   rejected and kept with a reason: {}",
            self.accepted, self.rejected_kept
        );
        let states: Vec<String> = self.final_states.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let _ = writeln!(w, "  final state {}", states.join(", "));
        let _ = writeln!(
            w,
            "  retries     {} agent retries, {} supervisor recoveries in {} runs",
            self.agent_retries, self.supervisor_recoveries, self.supervisor_runs
        );
        let _ = writeln!(
            w,
            "  fencing     {} stale replies dropped, {} lost claims (duplicate schedules)",
            self.stale_replies_dropped, self.claims_lost
        );
        let _ = writeln!(
            w,
            "  compensation {} started, {} compensating steps run; {} operator alerts",
            self.compensations_started, self.compensation_steps, self.alerts
        );
        let _ = writeln!(
            w,
            "  remote      {} calls: {} hung, {} failed transiently, {} refused",
            self.remote_calls, self.remote_hangs, self.remote_transient_failures, self.remote_refusals
        );
        for (name, p) in [("order", &self.order_latency_ms), ("step", &self.step_latency_ms)] {
            let _ = writeln!(
                w,
                "  {name:<5} latency p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
                opt(p.p50),
                opt(p.p90),
                opt(p.p99),
                opt(p.max)
            );
        }
        if self.violations.is_empty() {
            let _ = writeln!(w, "  invariants  all held");
        } else {
            let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (inv, detail) in &self.violations {
                by.entry(inv).or_default().push(detail);
            }
            let _ = writeln!(w, "  invariants  {} VIOLATIONS", self.violations.len());
            for (inv, details) in by {
                let _ = writeln!(w, "    {inv}: {} times, e.g.", details.len());
                for d in details.iter().take(5) {
                    let _ = writeln!(w, "      - {d}");
                }
            }
        }
        out
    }
}
