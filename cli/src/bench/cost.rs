//! `bench cost`: AWS requests and billed units per order, counted around the ports and
//! priced, beside what Step Functions would charge for the same work.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;

use serde::Serialize;

use sas::domain::{Policy, ProcessState};

use super::rig::{Rig, RigOptions};

/// Published us-east-1 prices (November 2026 list prices; see docs/BENCHMARKS.md).
pub mod prices {
    pub const DDB_PER_MILLION_WRU: f64 = 0.625;
    pub const DDB_PER_MILLION_RRU: f64 = 0.125;
    pub const SQS_PER_MILLION_REQUESTS: f64 = 0.40;
    pub const SNS_PER_MILLION_PUBLISHES: f64 = 0.50;
    pub const LAMBDA_PER_MILLION_REQUESTS: f64 = 0.20;
    pub const LAMBDA_ARM_PER_GB_SECOND: f64 = 0.000_013_333_4;
    pub const SFN_STANDARD_PER_TRANSITION: f64 = 0.025 / 1_000.0;
    pub const SFN_EXPRESS_PER_MILLION_REQUESTS: f64 = 1.00;
    pub const SFN_EXPRESS_PER_GB_SECOND: f64 = 0.000_016_67;
}

/// DynamoDB on demand, in millionths of a dollar, for `wru` write and `rru` read units:
/// dollars per million of whatever the units were counted over.
pub fn dynamodb_micro_dollars(wru: f64, rru: f64) -> f64 {
    wru * prices::DDB_PER_MILLION_WRU + rru * prices::DDB_PER_MILLION_RRU
}

#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    pub workflow: String,
    pub failures: bool,
    pub orders: usize,
    pub processed: usize,
    pub compensated: usize,
    pub failed: usize,
    pub remote_calls_per_order: f64,
    /// Conditional writes that lost a race and were read and decided again (the
    /// `WriteConflicts` metric): a parallel stage's branch replies race on one record.
    /// Each is billed (a failed condition is a write, its re-read a read): the counts
    /// below include them.
    pub write_conflicts_per_order: f64,
    pub per_order: BTreeMap<String, f64>,
    /// Dollars per million orders, by service, and the total.
    pub dollars_per_million: BTreeMap<String, f64>,
    pub sas_total: f64,
    pub step_functions_standard: f64,
    /// `None` where Express cannot run the workflow (a wait longer than its 5 minutes).
    pub step_functions_express: Option<f64>,
    /// Timers woken, and how late the latest woke (ms after its time), when the workflow
    /// has timer steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timers: Option<TimerLateness>,
    /// Flow control, when an agent of the workflow has limits: what its gate cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateCost>,
    /// Rows of many calls an order (a map step's items, a wide stage's branches): the
    /// figures per item.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_item: Option<ItemCost>,
}

/// A row's figures per item: per remote call, the items of a map step (or the branches
/// of a stage) being one call each.
#[derive(Debug, Clone, Serialize)]
pub struct ItemCost {
    /// Lines of each order: a map over `$.order.items` runs one item per line.
    pub line_items: usize,
    /// Remote calls per order.
    pub items_per_order: f64,
    /// Dollars per million items (remote calls): sas, and Step Functions as the row
    /// prices it per order.
    pub sas: f64,
    pub step_functions_standard: f64,
    pub step_functions_express: Option<f64>,
    pub write_conflicts_per_item: f64,
    pub ddb_wru_per_item: f64,
    pub ddb_rru_per_item: f64,
    /// The largest task item written, by its JSON length (what the model bills a write
    /// on, per started KB): a map's record holds a branch per item while it runs.
    pub largest_record_bytes: usize,
}

/// What flow control adds to an order's bill, per remote call of a limited agent: the gate
/// read and conditional write at the claim and again at the release, the call's mark the
/// agent writes before it calls, and for a call that had to wait its ticket's waiter put
/// and get and its arrivals at the gate again. Every call of the row's limited agents
/// counts (`limited_calls`).
#[derive(Debug, Clone, Serialize)]
pub struct GateCost {
    /// The agents' limits, by agent.
    pub limits: BTreeMap<String, sas::domain::gate::Limits>,
    pub limited_calls: u64,
    /// Tasks that found no room and took a ticket (`CapacityQueued`), per limited call.
    pub queued_per_call: f64,
    /// Gate writes that lost a race and were read and decided again (`GateConflicts`):
    /// each is billed, and counted in the figures below.
    pub conflicts_per_call: f64,
    pub gate_reads_per_call: f64,
    pub gate_writes_per_call: f64,
    pub waiter_writes_per_call: f64,
    pub waiter_reads_per_call: f64,
    /// The agents' call marks (`CallStarts`), one per request that went to call.
    pub call_marks_per_call: f64,
    /// The gate's, waiters' and call marks' DynamoDB units, in dollars per million limited calls.
    pub dynamodb_per_million_calls: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimerLateness {
    pub woken: u64,
    pub p50_late_ms: u64,
    pub max_late_ms: u64,
}

#[derive(Debug, Clone)]
pub struct CostAssumptions {
    pub memory_mb: u64,
    /// Billed duration of one invocation (a batch of up to 10 messages handled concurrently).
    pub invocation_ms: u64,
    /// Duration of one remote call, for Express's duration charge and its Lambda task.
    pub remote_call_ms: u64,
}

impl Default for CostAssumptions {
    fn default() -> Self {
        CostAssumptions { memory_mb: 256, invocation_ms: 50, remote_call_ms: 50 }
    }
}

pub async fn cost(workflow: &str, orders: usize, failures: bool, a: &CostAssumptions) -> CostRow {
    cost_limited(workflow, orders, failures, &BTreeMap::new(), a).await
}

/// As `cost`, with `limits` on the workflow's agents (all orders arrive at once, so with
/// `max_in_flight` most of them wait for a place: the dearest case).
pub async fn cost_limited(
    workflow: &str,
    orders: usize,
    failures: bool,
    limits: &BTreeMap<String, sas::domain::gate::Limits>,
    a: &CostAssumptions,
) -> CostRow {
    cost_run(workflow, orders, failures, limits, None, a).await
}

/// As `cost` without failures, each order of `line_items` lines, with the figures per
/// item (per remote call): for a map step's items and a wide stage's branches; `limits`
/// by agent (a map over a limited agent claims each item through its gate).
pub async fn cost_items(
    workflow: &str,
    orders: usize,
    line_items: usize,
    limits: &BTreeMap<String, sas::domain::gate::Limits>,
    a: &CostAssumptions,
) -> CostRow {
    cost_run(workflow, orders, false, limits, Some(line_items), a).await
}

async fn cost_run(
    workflow: &str,
    orders: usize,
    failures: bool,
    limits: &BTreeMap<String, sas::domain::gate::Limits>,
    line_items: Option<usize>,
    a: &CostAssumptions,
) -> CostRow {
    let policy = Policy::default();
    let (transient, permanent, crash) = if failures { (0.10, 0.01, 0.02) } else { (0.0, 0.0, 0.0) };
    let rig = Rig::new(
        RigOptions {
            workflow: workflow.into(),
            transient_rate: transient,
            permanent_rate: permanent,
            crash_rate: crash,
            policy,
            supervisor_period_ms: 60_000,
            seed: 7,
            count: true,
            reply_to: true,
            round_trips: true,
            limits: limits.clone(),
            line_items: line_items.unwrap_or(1),
            list_items: 0,
            // Nothing here reads the store's log: a map's records are large and many.
            keep_writes: false,
        },
        true,
    );
    rig.send_orders(0, orders).await;
    let first_tick = rig.clock.now().plus_ms(60_000);
    rig.run_simulated(orders, first_tick).await;
    let counts = rig.store.state_counts();
    let u = rig.usage.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let n = orders.max(1) as f64;
    let calls = rig.remote.calls.load(Ordering::Relaxed) as f64;
    // Function invocations the pipeline made (the supervisor's runs are on a schedule,
    // not per order: a fixed 43,200 a month at rate(1 minute), left out here).
    let invocations: u64 =
        u.invocations.iter().filter(|(k, _)| k.as_str() != "supervisor").map(|(_, v)| v).sum();
    let gb_s = invocations as f64 * (a.memory_mb as f64 / 1024.0) * (a.invocation_ms as f64 / 1000.0);
    // The application's own SendMessage of each order, as in Step Functions' intake below,
    // and the outside party's of each callback completion.
    let order_sends = n;
    let completion_sends = rig.completions_sent.load(Ordering::Relaxed) as f64;
    let sqs_requests = order_sends + completion_sends + (u.sqs_sends + u.sqs_receives + u.sqs_deletes) as f64;
    let per_order: BTreeMap<String, f64> = [
        ("ddb_wru", u.wru / n),
        ("ddb_rru", u.rru / n),
        ("ddb_requests", (u.ddb_gets + u.ddb_puts) as f64 / n),
        ("sqs_order_sends", order_sends / n),
        ("sqs_completion_sends", completion_sends / n),
        ("sqs_sends", u.sqs_sends as f64 / n),
        ("sqs_receives", u.sqs_receives as f64 / n),
        ("sqs_deletes", u.sqs_deletes as f64 / n),
        ("sns_publishes", u.sns_publishes as f64 / n),
        ("lambda_invocations", invocations as f64 / n),
        ("lambda_gb_seconds", gb_s / n),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    use prices::*;
    let m = 1e6 / n;
    let dollars: BTreeMap<String, f64> = [
        ("dynamodb", dynamodb_micro_dollars(u.wru, u.rru) / 1e6 * m),
        ("sqs", sqs_requests * SQS_PER_MILLION_REQUESTS / 1e6 * m),
        ("sns", u.sns_publishes as f64 * SNS_PER_MILLION_PUBLISHES / 1e6 * m),
        ("lambda_requests", invocations as f64 * LAMBDA_PER_MILLION_REQUESTS / 1e6 * m),
        ("lambda_duration", gb_s * LAMBDA_ARM_PER_GB_SECOND * m),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let sas_total = dollars.values().sum();
    // Step Functions doing the scheduler's and supervisor's work: one Task state per
    // remote call (a Retry is a transition too), one terminal state per order; each Task
    // invokes the agent Lambda once, unbatched. Intake (orders queue -> StartExecution)
    // costs one SQS send + receive/delete at batch 10 + one Lambda invocation per 10.
    // A timer is a Wait state: one more transition each. A callback is a Task with
    // `.waitForTaskToken`, already one per call; SendTaskSuccess itself is not billed.
    let wf = super::rig::bench_workflows().get(workflow).cloned();
    let timers = wf.as_ref().map_or(0, |w| w.steps.iter().filter(|s| s.is_timer()).count()) as f64;
    let longest_wait_ms = wf
        .as_ref()
        .and_then(|w| w.steps.iter().filter_map(|s| s.wait.as_ref().and_then(|w| w.for_ms)).max())
        .unwrap_or(0);
    // A parallel stage is a Parallel state: one transition more per order; its branches'
    // Tasks are counted with the calls.
    let stages = wf.as_ref().map_or(0, |w| w.stages.len()) as f64;
    // A map step is an inline Map state (inline mode runs up to 40 iterations at once; the
    // map's cap here is 10): one transition more per order for the Map state, and its
    // iterations' Tasks, one per item, counted with the calls. Assumed, from AWS's
    // "Transitions" page: an inline Map's iterations are not billed a transition of their
    // own (a Distributed Map bills one per child execution: one per item more).
    let maps = wf.as_ref().map_or(0, |w| w.maps.len()) as f64;
    let transitions = calls + n * (1.0 + timers + stages + maps);
    let agent_lambda = calls
        * (LAMBDA_PER_MILLION_REQUESTS / 1e6
            + (a.memory_mb as f64 / 1024.0) * (a.remote_call_ms as f64 / 1000.0) * LAMBDA_ARM_PER_GB_SECOND);
    let intake = n * (1.2 * SQS_PER_MILLION_REQUESTS / 1e6 + 0.1 * LAMBDA_PER_MILLION_REQUESTS / 1e6);
    let standard = (transitions * SFN_STANDARD_PER_TRANSITION + agent_lambda + intake) * m;
    // Express: per execution, billed in 100 ms steps at 64 MB (the minimum); a stage's
    // branches run at once, so its calls take one call's time; a map's items run
    // `max_concurrency` at a time, so they take ceil(items / cap) calls' time.
    let items = rig.remote.item_calls.load(Ordering::Relaxed) as f64 / n;
    let mapped: f64 = wf
        .as_ref()
        .map_or(0.0, |w| w.maps.iter().map(|m| items - (items / f64::from(m.max_concurrency)).ceil()).sum());
    let side_by_side =
        wf.as_ref().map_or(0, |w| w.stages.iter().map(|s| s.len - 1).sum::<u32>()) as f64 + mapped;
    let express_ms = ((calls / n - side_by_side).max(0.0) * a.remote_call_ms as f64 / 100.0).ceil() * 100.0;
    let express = (n
        * (SFN_EXPRESS_PER_MILLION_REQUESTS / 1e6
            + 0.0625 * express_ms / 1000.0 * SFN_EXPRESS_PER_GB_SECOND)
        + agent_lambda
        + intake)
        * m;
    // Express runs at most 5 minutes, and has no `.waitForTaskToken`.
    let has_callback = wf.as_ref().is_some_and(|w| w.steps.iter().any(|s| s.is_callback()));
    let express = (longest_wait_ms <= 300_000 && !has_callback).then_some(express);
    let counted = rig.metrics.snapshot();
    let write_conflicts = counted.count(sas::ports::Metric::WriteConflict) as f64;
    let woken = counted.count(sas::ports::Metric::TimerWoke);
    let timers = (woken > 0).then(|| TimerLateness {
        woken,
        p50_late_ms: counted.percentile(sas::ports::Metric::TimerLatenessMs, 50.0).unwrap_or(0),
        max_late_ms: counted.percentile(sas::ports::Metric::TimerLatenessMs, 100.0).unwrap_or(0),
    });
    let gate = (!limits.is_empty()).then(|| {
        let limited_calls = rig.remote.calls_to(limits.keys());
        let per = |v: f64| v / (limited_calls.max(1) as f64);
        let g = &u.gate;
        GateCost {
            limits: limits.clone(),
            limited_calls,
            queued_per_call: per(counted.count(sas::ports::Metric::CapacityQueued) as f64),
            conflicts_per_call: per(counted.count(sas::ports::Metric::GateConflict) as f64),
            gate_reads_per_call: per(g.gate_reads as f64),
            gate_writes_per_call: per(g.gate_writes as f64),
            waiter_writes_per_call: per(g.waiter_writes as f64),
            waiter_reads_per_call: per(g.waiter_reads as f64),
            call_marks_per_call: per(g.call_marks as f64),
            dynamodb_per_million_calls: per(dynamodb_micro_dollars(g.wru, g.rru)),
        }
    });
    let per_item = line_items.map(|line_items| {
        let per = calls / n;
        let each = |v: f64| v / per.max(f64::MIN_POSITIVE);
        ItemCost {
            line_items,
            items_per_order: per,
            sas: each(sas_total),
            step_functions_standard: each(standard),
            step_functions_express: express.map(each),
            write_conflicts_per_item: write_conflicts / calls.max(1.0),
            ddb_wru_per_item: u.wru / calls.max(1.0),
            ddb_rru_per_item: u.rru / calls.max(1.0),
            largest_record_bytes: u.largest_item_bytes,
        }
    });
    CostRow {
        per_item,
        gate,
        timers,
        workflow: workflow.into(),
        failures,
        orders,
        processed: counts.get(&ProcessState::Processed).copied().unwrap_or(0),
        compensated: counts.get(&ProcessState::Compensated).copied().unwrap_or(0),
        failed: counts.get(&ProcessState::Error).copied().unwrap_or(0),
        remote_calls_per_order: calls / n,
        write_conflicts_per_order: write_conflicts / n,
        per_order,
        dollars_per_million: dollars,
        sas_total,
        step_functions_standard: standard,
        step_functions_express: express,
    }
}

impl fmt::Display for CostRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {} ({} orders: {} processed, {} compensated, {} error; {:.3} remote calls/order)",
            self.workflow,
            if self.failures { "with failures" } else { "no failures" },
            self.orders,
            self.processed,
            self.compensated,
            self.failed,
            self.remote_calls_per_order
        )?;
        let per: Vec<String> = self.per_order.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        writeln!(f, "  per order: {}", per.join(", "))?;
        if self.write_conflicts_per_order > 0.0 {
            writeln!(
                f,
                "  write conflicts: {:.3} per order (each a billed write and re-read, counted above)",
                self.write_conflicts_per_order
            )?;
        }
        if let Some(i) = &self.per_item {
            let express = i.step_functions_express.map_or("n/a".to_owned(), |e| format!("${e:.2}"));
            writeln!(
                f,
                "  per item ({} line(s) an order, {:.3} calls an order): sas ${:.2}, Step Functions Standard \
                 ${:.2}, Express {express} per million items; {:.3} write conflicts, {:.2} WRU + {:.2} RRU an \
                 item; the largest record {} bytes (JSON)",
                i.line_items,
                i.items_per_order,
                i.sas,
                i.step_functions_standard,
                i.write_conflicts_per_item,
                i.ddb_wru_per_item,
                i.ddb_rru_per_item,
                i.largest_record_bytes
            )?;
        }
        let d: Vec<String> = self.dollars_per_million.iter().map(|(k, v)| format!("{k} ${v:.2}")).collect();
        writeln!(f, "  $/million orders: {}", d.join(", "))?;
        if let Some(t) = &self.timers {
            writeln!(
                f,
                "  timers: {} woken, late by p50 {} ms, max {} ms",
                t.woken, t.p50_late_ms, t.max_late_ms
            )?;
        }
        if let Some(g) = &self.gate {
            let limits: Vec<String> = g
                .limits
                .iter()
                .map(|(agent, l)| {
                    let mut v = Vec::new();
                    if let Some(m) = l.max_in_flight {
                        v.push(format!("max_in_flight {m}"));
                    }
                    if let Some(m) = l.max_per_second {
                        v.push(format!("max_per_second {m}"));
                    }
                    format!("{agent} {}", v.join(", "))
                })
                .collect();
            writeln!(
                f,
                "  flow control ({}): per limited call (of {}) {:.3} queued, gate {:.3} reads + {:.3} writes \
                 ({:.3} conflicts), waiter {:.3} puts + {:.3} gets, call marks {:.3}; the gate's DynamoDB \
                 ${:.2}/million calls",
                limits.join("; "),
                g.limited_calls,
                g.queued_per_call,
                g.gate_reads_per_call,
                g.gate_writes_per_call,
                g.conflicts_per_call,
                g.waiter_writes_per_call,
                g.waiter_reads_per_call,
                g.call_marks_per_call,
                g.dynamodb_per_million_calls
            )?;
        }
        let express = self
            .step_functions_express
            .map_or("n/a (over 5 minutes, or a task token)".to_owned(), |e| format!("${e:.2}"));
        writeln!(
            f,
            "  sas ${:.2}  |  Step Functions Standard ${:.2}  Express {express}",
            self.sas_total, self.step_functions_standard
        )
    }
}
