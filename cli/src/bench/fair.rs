//! `sasctl bench fair`: one customer's flood against everyone else's orders, through an
//! agent with `max_in_flight: 10`, with and without `max_in_flight_per_key` on the
//! customer.
//!
//! The method is `bench flow`'s: `sasctl dev`'s pipeline (embedded backend, real HTTP to
//! the simulated service, answering in 0 to 100 ms), run twice. Each run sends one
//! customer's `--orders` orders at once and, beside them from the start, `--others`
//! orders of 50 other customers at `--rate` a second, all through the one agent. The
//! first run limits each customer to `--per-key` calls at once; the second does not
//! (the flood then holds the agent's line, and everyone else waits behind it).
//!
//! Figures per run: the other customers' waits, accepted to their call's claim (p50,
//! p99, max), and the most calls at once at the service, the flooding customer's and all (its own count).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use sas::domain::{Action, Cause, Definitions, Timestamp};
use sas_sim::ledger::RemoteFaults;
use serde::Serialize;

use super::starvation::Latencies;
use crate::dev::{self, Customers, DevOptions, DevOutcome, Trickle};

/// The agent's places.
pub const MAX_IN_FLIGHT: u32 = 10;
/// The service answers in 0 to this many ms (uniform).
const SERVICE_TIME_MAX_MS: u64 = 100;
/// The flooding customer.
const FLOOD: &str = "flood";
/// Other customers the others' orders take in turn.
const OTHERS: u32 = 50;

#[derive(Debug, Clone, Copy)]
pub struct FairOptions {
    /// The flooding customer's orders, sent at once.
    pub orders: usize,
    /// The other customers' orders, at `rate` a second beside the flood.
    pub others: usize,
    pub rate: u32,
    /// Calls at once per customer in the first run.
    pub per_key: u32,
    pub concurrency: usize,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FairRun {
    /// The per-key limit, if the run had one.
    pub per_key: Option<u32>,
    /// The other customers' orders, accepted to their call's claim, in ms.
    pub others_wait_ms: Latencies,
    /// The flooding customer's most calls at once, at the service.
    pub flood_max_in_flight: u64,
    /// The service's most calls at once, from its own count.
    pub service_max_in_flight: u64,
    /// The run's wall time, s.
    pub elapsed_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FairReport {
    pub orders: usize,
    pub others: usize,
    pub rate: u32,
    pub max_in_flight: u32,
    pub runs: Vec<FairRun>,
}

impl fmt::Display for FairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fair: one customer's {} orders at once, {} orders of {OTHERS} others at {}/s beside them, \
             one agent with max_in_flight {}; the service answers in 0-{SERVICE_TIME_MAX_MS} ms",
            self.orders, self.others, self.rate, self.max_in_flight
        )?;
        for r in &self.runs {
            let limit =
                r.per_key.map_or("no per-key limit".to_owned(), |n| format!("max_in_flight_per_key {n}"));
            let w = &r.others_wait_ms;
            writeln!(
                f,
                "  {limit:<26} others wait p50 {:>6} ms  p99 {:>6} ms  max {:>6} ms ({} orders); \
                 flood at most {} at once, service at most {}; run {:.1} s",
                w.p50, w.p99, w.max, w.samples, r.flood_max_in_flight, r.service_max_in_flight, r.elapsed_s
            )?;
        }
        Ok(())
    }
}

fn definitions(per_key: Option<u32>) -> Definitions {
    let key = per_key.map_or(String::new(), |n| {
        format!(r#", "max_in_flight_per_key": {{"key": "$.order.customer_id", "limit": {n}}}"#)
    });
    let text = format!(
        r#"{{"agents": {{"limited": {{"timeout_ms": 1000, "max_in_flight": {MAX_IN_FLIGHT}{key}}}}},
          "workflows": [{{"name": "via-limited", "steps": [{{"name": "limited", "agent": "limited", "effect": "none"}}]}}]}}"#
    );
    Definitions::parse(&text).expect("the benchmark's definitions are valid")
}

fn options(o: &FairOptions, per_key: Option<u32>) -> DevOptions {
    DevOptions {
        orders: o.orders,
        definitions: definitions(per_key),
        workflow: "via-limited".into(),
        faults: RemoteFaults { latency_max_ms: SERVICE_TIME_MAX_MS, ..RemoteFaults::default() },
        duplicate_rate: 0.0,
        malformed: 0,
        queue_duplicate_rate: 0.0,
        step_timeout_ms: 1_000,
        concurrency: o.concurrency,
        seed: o.seed,
        max_runtime: Duration::from_secs(1_800),
        arrival_per_s: None,
        trickle: Some(Trickle { workflow: "via-limited".into(), orders: o.others, per_s: o.rate }),
        customers: Some(Customers { burst: FLOOD.into(), others: OTHERS }),
        ..DevOptions::default()
    }
}

/// The figures of one run, from its writes.
fn figures(run: &DevOutcome, per_key: Option<u32>) -> FairRun {
    let mut created: HashMap<&str, Timestamp> = HashMap::new();
    let mut waits = Vec::new();
    let mut claimed: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for w in &run.writes {
        let t = &w.after;
        let id = t.order_id.as_str();
        created.entry(id).or_insert(t.created_at);
        if t.last_cause == (Cause::Claimed { step: 0, action: Action::Do })
            && t.order.customer_id != FLOOD
            && claimed.insert(id)
        {
            waits.push(t.updated_at.millis_since(created[id]));
        }
    }
    waits.sort_unstable();
    let pick = |q: f64| waits.get(((waits.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    FairRun {
        per_key,
        others_wait_ms: Latencies {
            samples: waits.len(),
            p50: pick(0.5),
            p99: pick(0.99),
            max: waits.last().copied().unwrap_or(0),
        },
        // The flood's orders are the run's own, `order-...`: counted at the service.
        flood_max_in_flight: run.flights.get("limited:order").map_or(0, |f| f.max_in_flight),
        service_max_in_flight: run.flights.get("limited").map_or(0, |f| f.max_in_flight),
        elapsed_s: run.elapsed.as_secs_f64(),
    }
}

/// The run with a per-key limit, then the one without; `on_progress` sees each run's
/// terminal orders.
pub async fn fair(o: &FairOptions, on_progress: impl Fn(&str, &dev::Progress)) -> Result<FairReport, String> {
    let mut runs = Vec::new();
    for (name, per_key) in [("per-key", Some(o.per_key)), ("no per-key", None)] {
        let run = dev::run(options(o, per_key), |p| on_progress(name, p))
            .await
            .map_err(|e| format!("{name} run failed to start: {e}"))?;
        let violations = crate::invariants::check(&run);
        if let Some(first) = violations.first() {
            return Err(format!("{name} run broke {} invariant(s), first: {first}", violations.len()));
        }
        runs.push(figures(&run, per_key));
    }
    Ok(FairReport { orders: o.orders, others: o.others, rate: o.rate, max_in_flight: MAX_IN_FLIGHT, runs })
}
