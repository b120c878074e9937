//! `sasctl bench flow`: a burst through an agent with `max_in_flight` (`--places`, 10 by
//! default) and optionally `max_per_second`, and a neighbour's trickle beside it.
//!
//! The method is the starvation benchmark's (`starvation`, docs/BENCHMARKS.md 6):
//! `sasctl dev`'s pipeline (embedded backend, real HTTP to the simulated service, the
//! agent function's concurrency capped as a deployment caps it), run twice. The burst
//! run sends `--orders` orders of `via-limited` (agent `limited`) all at once, and
//! meanwhile a trickle of `via-steady` orders (agent `steady`, no limits) at `--rate` a
//! second for as long as the burst should take. The baseline run sends the same trickle
//! alone. The limited service answers in 0 to twice `--latency-ms` (uniform), so its
//! places allow at most places / latency calls a second; the steady one in 0 to 100 ms.
//! `--schedulers` scheduler containers pump the scheduler's queue side by side, so their
//! gate writes race; the store bills and throttles each item as DynamoDB does
//! (`sas::adapters::embedded::capacity`).
//!
//! Figures: the most calls the limited service had open at once (from its own count,
//! `remote_sim::Flights`; at most its places), its calls per second over the burst (from
//! its first call to its last), how long the burst's tasks waited for a place, the
//! `steady` step's latency (first claim to success, as in starvation) with the burst
//! against without it, and the store's side: the most write units one item took in a
//! second, the requests it throttled, and the gate's units in dollars per limited call.

use std::fmt;
use std::time::Duration;

use sas::domain::{Action, Cause, Definitions};
use sas_sim::ledger::RemoteFaults;
use serde::Serialize;

use super::starvation::Latencies;
use crate::dev::{self, DevOptions, DevOutcome, Trickle};
use crate::report::Waiting;

/// The limited agent as a team would declare a service that takes `places` calls at a time
/// (and `per_second` a second), with a call timeout well past its slowest answer; the
/// steady one as starvation declares its services.
fn definitions(o: &FlowOptions) -> String {
    let per_second = o.per_second.map_or(String::new(), |r| format!(r#", "max_per_second": {r}"#));
    format!(
        r#"{{"agents": {{
    "limited": {{"timeout_ms": {}, "max_in_flight": {}{per_second}}},
    "steady": {{"timeout_ms": 250, "breaker": {{"failures": 5, "open_ms": 1000}}}}}},
  "workflows": [
    {{"name": "via-limited", "steps": [{{"name": "limited", "agent": "limited", "effect": "none"}}]}},
    {{"name": "via-steady", "steps": [{{"name": "steady", "agent": "steady", "effect": "none"}}]}}]}}"#,
        (3 * o.latency_ms).max(1_000),
        o.places
    )
}

/// The limited agent's places by default.
pub const PLACES: u32 = 10;
/// The steady service answers in 0 to this many ms (uniform); the mean is half of it.
pub const SERVICE_TIME_MAX_MS: u64 = 100;

#[derive(Debug, Clone, Copy)]
pub struct FlowOptions {
    /// Orders of the burst, all sent at once.
    pub orders: usize,
    /// The unlimited agent's orders per second, beside the burst.
    pub rate: u32,
    /// The limited agent's `max_in_flight` and `max_per_second`.
    pub places: u32,
    pub per_second: Option<u32>,
    /// Scheduler containers side by side (`DevOptions::schedulers`).
    pub schedulers: usize,
    /// The limited service's mean answer time: it answers in 0 to twice this (uniform).
    pub latency_ms: u64,
    /// Concurrent batches per function (agent invocations of 10), as AgentMaxConcurrency
    /// caps them.
    pub concurrency: usize,
    pub step_timeout_ms: u64,
    pub seed: u64,
}

impl FlowOptions {
    /// The limited service's mean answer time by default: the places in ms, at least 50
    /// (10 places: 50 ms, 200 calls a second; 100 places or more: 1,000 calls a second).
    pub fn default_latency_ms(places: u32) -> u64 {
        u64::from(places).max(50)
    }

    /// The agent function's concurrency by default: a batch of 10 calls holds its
    /// invocation until its slowest answers (nearly twice the mean), so two batches per 10
    /// places, at least 10.
    pub fn default_concurrency(places: u32) -> usize {
        (places as usize / 5).max(10)
    }

    /// A claim's complete-by by default: four mean answers, at least a second.
    pub fn default_step_timeout_ms(latency_ms: u64) -> u64 {
        (4 * latency_ms).max(1_000)
    }

    /// The calls a second the limits allow at the limited service's mean time.
    pub fn ideal_per_s(&self) -> f64 {
        let by_places = f64::from(self.places) * 1_000.0 / self.latency_ms.max(1) as f64;
        self.per_second.map_or(by_places, |r| by_places.min(f64::from(r)))
    }

    /// The trickle lasts as long as the burst would at the ideal rate: the neighbour's
    /// orders all meet the burst.
    pub fn trickle_orders(&self) -> usize {
        let burst_s = self.orders as f64 / self.ideal_per_s();
        ((burst_s * f64::from(self.rate)).ceil() as usize).max(1)
    }
}

/// `sasctl bench flow`'s arguments.
#[derive(clap::Args, Debug)]
pub struct FlowArgs {
    /// Orders of the burst, sent at once (1 to 1,000,000).
    #[arg(long, default_value_t = 10_000,
          value_parser = crate::args::whole::<usize>("--orders", 1, 1_000_000))]
    pub orders: usize,
    /// The unlimited agent's orders per second (1 to 1000), for as long as the burst
    /// takes at the ideal rate.
    #[arg(long, default_value_t = 20, value_parser = crate::args::whole::<u32>("--rate", 1, 1_000))]
    pub rate: u32,
    /// The limited agent's max_in_flight (1 to 1000; the definition file's check may
    /// allow fewer).
    #[arg(long, default_value_t = PLACES, value_parser = crate::args::whole::<u32>("--places", 1, 1_000))]
    pub places: u32,
    /// The limited agent's max_per_second (1 to 1000); default: none.
    #[arg(long, value_parser = crate::args::whole::<u32>("--per-second", 1, 1_000))]
    pub per_second: Option<u32>,
    /// Scheduler containers pumping the scheduler's queue side by side (1 to 64), each
    /// with its own turns at the gate: their gate writes race.
    #[arg(long, default_value_t = 4, value_parser = crate::args::whole::<usize>("--schedulers", 1, 64))]
    pub schedulers: usize,
    /// The limited service's mean answer time in ms (1 to 10000); it answers in 0 to
    /// twice this. Default: --places ms, at least 50 (so 100 places or more allow 1,000
    /// calls a second).
    #[arg(long, value_parser = crate::args::whole::<u64>("--latency-ms", 1, 10_000))]
    pub latency_ms: Option<u64>,
    /// Concurrent batches per function (1 to 1000), as AgentMaxConcurrency caps the
    /// agent's. Default: --places / 5, at least 10 (a batch of 10 calls waits for its
    /// slowest).
    #[arg(long, value_parser = crate::args::whole::<usize>("--concurrency", 1, 1_000))]
    pub concurrency: Option<usize>,
    /// A claim's complete-by is this far after the claim, in ms (50 to 50000).
    /// Default: four times --latency-ms, at least 1000.
    #[arg(long, value_parser = crate::args::whole::<u64>("--step-timeout-ms", 50, 50_000))]
    pub step_timeout_ms: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl FlowArgs {
    /// The options, each default that depends on another argument filled in.
    pub fn options(&self) -> FlowOptions {
        let latency_ms = self.latency_ms.unwrap_or(FlowOptions::default_latency_ms(self.places));
        FlowOptions {
            orders: self.orders,
            rate: self.rate,
            places: self.places,
            per_second: self.per_second,
            schedulers: self.schedulers,
            latency_ms,
            concurrency: self.concurrency.unwrap_or(FlowOptions::default_concurrency(self.places)),
            step_timeout_ms: self.step_timeout_ms.unwrap_or(FlowOptions::default_step_timeout_ms(latency_ms)),
            seed: self.seed,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowReport {
    pub orders: usize,
    pub rate: u32,
    pub trickle_orders: usize,
    pub concurrency: usize,
    /// The limited agent's limits (`--places`, `--per-second`), the scheduler containers,
    /// and its service's mean answer time.
    pub max_in_flight: u64,
    pub max_per_second: Option<u32>,
    pub schedulers: usize,
    pub latency_ms: u64,
    /// The most calls the limited service had open at once.
    pub max_in_flight_seen: u64,
    /// The most calls that reached it in any 1,000 ms window.
    pub max_per_second_seen: u64,
    /// Its calls, and their rate from its first call to its last (`calls_per_second`;
    /// `limited_calls_per_s` is the same figure under its first name).
    pub limited_calls: u64,
    pub calls_per_second: f64,
    pub limited_calls_per_s: f64,
    /// Its places over its mean time (or its `max_per_second`, if lower).
    pub ideal_calls_per_s: f64,
    /// The store, over the burst run: the most write units any one item took in a second
    /// (DynamoDB allows 1,000), the most read units (3,000), that item, and the requests
    /// throttled (answered with a retryable error, the message tried again).
    pub max_item_write_units_per_second: u64,
    pub max_item_read_units_per_second: f64,
    pub hottest_item: Option<String>,
    pub store_throttles: u64,
    /// The limited agent's gate items (one unless sharded), the largest one's size as
    /// written, and their reads and writes (throttled ones not counted) per limited call.
    pub gate_items: usize,
    pub gate_item_max_bytes: usize,
    pub gate_reads_per_call: f64,
    pub gate_writes_per_call: f64,
    /// The gates' and waiter notes' billed units over the burst run, and in dollars per
    /// million limited calls (DynamoDB on demand, `cost::prices`).
    pub gate_write_units: u64,
    pub gate_read_units: f64,
    pub gate_dollars_per_million_calls: f64,
    /// From a call's answer to the next call's arrival at the limited service
    /// (`Flights::hand_overs_us`), µs: what giving a place to the next in line costs.
    pub hand_over_p50_us: u64,
    pub hand_over_p90_us: u64,
    /// Waits of the burst's tasks for a place, first arrival at the gate to claim.
    pub waiting_ms: Waiting,
    /// The `steady` step, first claim to success: alone, and beside the burst.
    pub baseline: Latencies,
    pub with_burst: Latencies,
    /// Order latency of the `steady` orders, accepted to Processed: alone and beside it.
    pub baseline_order_p99_ms: u64,
    pub with_burst_order_p99_ms: u64,
    /// Burst run's wall time, s.
    pub burst_s: f64,
    /// The burst's orders by final state (`Processed`, ...): a step that could not reach
    /// the gate in time (throttled past its deadlines) fails as any step does.
    pub burst_orders: std::collections::BTreeMap<String, usize>,
    /// What the burst run broke, by invariant, and the first break's detail: a store that
    /// throttles can send a message to its DLQ (five throttled receives) where no fault
    /// would. Reported rather than refused, so the figures that show why are kept; the
    /// command then exits non-zero.
    pub burst_invariants_broken: std::collections::BTreeMap<String, usize>,
    pub first_broken: Option<String>,
    /// The burst's orders that ended Error, by why (their record's last error, its order
    /// id taken out): what a limit too small for the burst costs.
    pub burst_errors: std::collections::BTreeMap<String, usize>,
}

impl FlowReport {
    pub fn p99_ratio(&self) -> f64 {
        self.with_burst.p99 as f64 / self.baseline.p99.max(1) as f64
    }
}

impl fmt::Display for FlowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "flow: a burst of {} orders through `limited` (max_in_flight {}{}, answering in 0-{} ms), \
             {} `steady` orders at {}/s beside it (0-{} ms); {} scheduler container(s); agent concurrency {} \
             (batches of 10)",
            self.orders,
            self.max_in_flight,
            self.max_per_second.map_or(String::new(), |r| format!(", max_per_second {r}")),
            2 * self.latency_ms,
            self.trickle_orders,
            self.rate,
            SERVICE_TIME_MAX_MS,
            self.schedulers,
            self.concurrency
        )?;
        writeln!(
            f,
            "  limited service: {} calls open at once at most (target <= {}), at most {} in one second",
            self.max_in_flight_seen, self.max_in_flight, self.max_per_second_seen
        )?;
        writeln!(
            f,
            "  limited service: {} calls at {:.0}/s from its first to its last (ideal {:.0}/s: {:.2} of it); run {:.1} s",
            self.limited_calls,
            self.limited_calls_per_s,
            self.ideal_calls_per_s,
            self.limited_calls_per_s / self.ideal_calls_per_s,
            self.burst_s
        )?;
        let ended: Vec<String> = self.burst_orders.iter().map(|(s, n)| format!("{n} {s}")).collect();
        writeln!(f, "  the burst's orders: {}", ended.join(", "))?;
        if let Some(first) = &self.first_broken {
            let broken: Vec<String> =
                self.burst_invariants_broken.iter().map(|(i, n)| format!("{i} {n}")).collect();
            writeln!(f, "  BROKEN in the burst run: {}; first: {first}", broken.join(", "))?;
        }
        writeln!(
            f,
            "  store: at most {} write units ({:.0} read units) a second on one item ({}; DynamoDB allows 1,000 and \
             3,000), {} requests throttled",
            self.max_item_write_units_per_second,
            self.max_item_read_units_per_second,
            self.hottest_item.as_deref().unwrap_or("-"),
            self.store_throttles,
        )?;
        writeln!(
            f,
            "  gate: {} item(s), at most {} bytes; {:.2} reads + {:.2} writes per limited call; with the waiter notes \
             {} write + {:.0} read units, ${:.2} per million limited calls",
            self.gate_items,
            self.gate_item_max_bytes,
            self.gate_reads_per_call,
            self.gate_writes_per_call,
            self.gate_write_units,
            self.gate_read_units,
            self.gate_dollars_per_million_calls
        )?;
        writeln!(
            f,
            "  a place's hand-over, answer to the next call: p50 {:.2} ms  p90 {:.2} ms",
            self.hand_over_p50_us as f64 / 1e3,
            self.hand_over_p90_us as f64 / 1e3
        )?;
        let w = &self.waiting_ms;
        let ms = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        writeln!(
            f,
            "  waiting for a place: {} tasks, p50 {} ms  p90 {} ms  p99 {} ms  max {} ms",
            w.tasks,
            ms(w.p50),
            ms(w.p90),
            ms(w.p99),
            ms(w.max)
        )?;
        for (name, l) in [("steady alone", &self.baseline), ("steady beside the burst", &self.with_burst)] {
            writeln!(
                f,
                "  {name:<24} p50 {:>5} ms  p99 {:>5} ms  max {:>5} ms  ({} steps)",
                l.p50, l.p99, l.max, l.samples
            )?;
        }
        writeln!(
            f,
            "  steady step p99 ratio {:.2} (target <= 2); steady order p99, accepted to Processed: {} ms alone, {} ms beside the burst",
            self.p99_ratio(),
            self.baseline_order_p99_ms,
            self.with_burst_order_p99_ms
        )
    }
}

fn options(o: &FlowOptions, burst: usize) -> Result<DevOptions, String> {
    let definitions =
        Definitions::parse(&definitions(o)).map_err(|e| format!("the limited agent's limits: {e}"))?;
    let limited = RemoteFaults { latency_max_ms: 2 * o.latency_ms, ..RemoteFaults::default() };
    Ok(DevOptions {
        orders: burst,
        definitions,
        workflow: "via-limited".into(),
        faults: RemoteFaults { latency_max_ms: SERVICE_TIME_MAX_MS, ..RemoteFaults::default() },
        agent_faults: [("limited".to_owned(), limited)].into(),
        duplicate_rate: 0.0,
        malformed: 0,
        // A duplicated dispatch is called twice under one place (docs/BENCHMARKS.md 11):
        // set aside here, as starvation sets it aside, so the limit is what is measured.
        queue_duplicate_rate: 0.0,
        step_timeout_ms: o.step_timeout_ms,
        concurrency: o.concurrency,
        seed: o.seed,
        max_runtime: Duration::from_secs(1_800),
        arrival_per_s: None,
        trickle: Some(Trickle { workflow: "via-steady".into(), orders: o.trickle_orders(), per_s: o.rate }),
        schedulers: o.schedulers,
        capacity: true,
        ..DevOptions::default()
    })
}

/// First claim of the `steady` step to its success, per order, in ms; and each `steady`
/// order's accepted-to-Processed p99.
fn steady(run: &DevOutcome) -> (Latencies, u64) {
    let mut claimed = std::collections::HashMap::new();
    let mut created = std::collections::HashMap::new();
    let (mut steps, mut orders) = (Vec::new(), Vec::new());
    for w in run.writes.iter().filter(|w| w.after.workflow == "via-steady") {
        let t = &w.after;
        created.entry(t.order_id.clone()).or_insert(t.created_at);
        match t.last_cause {
            Cause::Claimed { step: 0, action: Action::Do } => {
                claimed.entry(t.order_id.clone()).or_insert(t.updated_at);
            }
            Cause::Succeeded { step: 0, action: Action::Do } => {
                if let Some(at) = claimed.get(&t.order_id) {
                    steps.push(t.updated_at.millis_since(*at));
                }
                if let Some(at) = created.get(&t.order_id) {
                    orders.push(t.updated_at.millis_since(*at));
                }
            }
            _ => {}
        }
    }
    for s in [&mut steps, &mut orders] {
        s.sort_unstable();
    }
    let pick = |s: &[u64], q: f64| s.get(((s.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    let latencies = Latencies {
        samples: steps.len(),
        p50: pick(&steps, 0.50),
        p99: pick(&steps, 0.99),
        max: steps.last().copied().unwrap_or(0),
    };
    (latencies, pick(&orders, 0.99))
}

fn checked(name: &str, run: &DevOutcome) -> Result<(), String> {
    let violations = crate::invariants::check(run);
    match violations.first() {
        None => Ok(()),
        Some(first) => Err(format!("{name} run broke {} invariant(s), first: {first}", violations.len())),
    }
}

/// Runs the baseline, then the burst; `on_progress` sees each run's terminal orders.
pub async fn flow(o: &FlowOptions, on_progress: impl Fn(&str, &dev::Progress)) -> Result<FlowReport, String> {
    let baseline = dev::run(options(o, 0)?, |p| on_progress("baseline", p))
        .await
        .map_err(|e| format!("baseline run failed to start: {e}"))?;
    checked("baseline", &baseline)?;
    let burst = dev::run(options(o, o.orders)?, |p| on_progress("burst", p))
        .await
        .map_err(|e| format!("burst run failed to start: {e}"))?;
    let violations = crate::invariants::check(&burst);
    let seen = burst.flights.get("limited").cloned().unwrap_or_default();
    let span_s = match (seen.arrivals_us.first(), seen.arrivals_us.last()) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => 0.0,
    };
    let figures = crate::report::agent_figures(&burst);
    let mut hand_overs = seen.hand_overs_us.clone();
    hand_overs.sort_unstable();
    let hand_over =
        |q: f64| hand_overs.get(((hand_overs.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    let (base, base_order_p99) = steady(&baseline);
    let (with, with_order_p99) = steady(&burst);
    let capacity = burst.capacity.clone().unwrap_or_default();
    let (all, gates, waiting) =
        (&capacity.all.total, &capacity.gates.total, &capacity.gates_and_waiters.total);
    let per_call = |n: u64| n as f64 / seen.calls.max(1) as f64;
    let calls_per_second = if span_s > 0.0 { seen.calls.saturating_sub(1) as f64 / span_s } else { 0.0 };
    Ok(FlowReport {
        orders: o.orders,
        rate: o.rate,
        trickle_orders: o.trickle_orders(),
        concurrency: o.concurrency,
        max_in_flight: u64::from(o.places),
        max_per_second: o.per_second,
        schedulers: o.schedulers,
        latency_ms: o.latency_ms,
        max_in_flight_seen: seen.max_in_flight,
        max_per_second_seen: seen.max_per_second(),
        limited_calls: seen.calls,
        calls_per_second,
        limited_calls_per_s: calls_per_second,
        ideal_calls_per_s: o.ideal_per_s(),
        max_item_write_units_per_second: all.peak_write_units_per_second,
        max_item_read_units_per_second: all.peak_read_units_per_second,
        hottest_item: capacity.all.hottest_item.clone(),
        store_throttles: all.throttles,
        gate_items: capacity.gates.items,
        gate_item_max_bytes: gates.largest_bytes,
        gate_reads_per_call: per_call(gates.reads),
        gate_writes_per_call: per_call(gates.writes),
        gate_write_units: waiting.write_units,
        gate_read_units: waiting.read_units,
        gate_dollars_per_million_calls: super::cost::dynamodb_micro_dollars(
            waiting.write_units as f64,
            waiting.read_units,
        ) / seen.calls.max(1) as f64,
        hand_over_p50_us: hand_over(0.5),
        hand_over_p90_us: hand_over(0.9),
        waiting_ms: figures.get("limited").map(|a| a.waiting_ms.clone()).unwrap_or_default(),
        baseline: base,
        with_burst: with,
        baseline_order_p99_ms: base_order_p99,
        with_burst_order_p99_ms: with_order_p99,
        burst_s: burst.elapsed.as_secs_f64(),
        burst_invariants_broken: violations.iter().fold(Default::default(), |mut by, v| {
            *by.entry(format!("{:?}", v.invariant)).or_default() += 1;
            by
        }),
        first_broken: violations.first().map(ToString::to_string),
        burst_errors: burst
            .tasks
            .iter()
            .filter(|t| t.workflow == "via-limited" && t.state() == sas::domain::ProcessState::Error)
            .fold(Default::default(), |mut by, t| {
                let why = t.last_error.as_deref().unwrap_or("no error recorded");
                *by.entry(why.replace(t.order_id.as_str(), "<order>")).or_default() += 1;
                by
            }),
        burst_orders: burst.tasks.iter().filter(|t| t.workflow == "via-limited").fold(
            Default::default(),
            |mut by, t| {
                *by.entry(t.state().as_str().to_owned()).or_default() += 1;
                by
            },
        ),
    })
}
