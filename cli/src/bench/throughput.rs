//! `bench throughput`: the whole pipeline in-process, the remote service answered at
//! once: orders per second, CPU time per order, microseconds per message per handler.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use sas::domain::ProcessState;

use super::measure::{cpu_time, median};
use super::rig::{HandlerTime, Rig, RigOptions};

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRun {
    pub orders: usize,
    pub processed: usize,
    pub seconds: f64,
    pub orders_per_second: f64,
    pub cpu_us_per_order: f64,
    pub handlers: BTreeMap<String, HandlerTime>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    pub workflow: String,
    pub orders: usize,
    pub workers: usize,
    pub runs: Vec<ThroughputRun>,
    pub median_orders_per_second: f64,
    pub median_cpu_us_per_order: f64,
    pub median_us_per_message: BTreeMap<String, f64>,
}

/// One run: `orders` orders pre-loaded on the orders queue, then `workers` drivers
/// invoke the functions until every order is terminal. The clock is the system clock;
/// the remote service answers at once.
pub async fn throughput_once(workflow: &str, orders: usize, workers: usize, seed: u64) -> ThroughputRun {
    let rig =
        Arc::new(Rig::new(RigOptions { workflow: workflow.into(), seed, ..RigOptions::default() }, false));
    rig.send_orders(0, orders).await;
    let cpu = cpu_time();
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let rig = rig.clone();
            tokio::spawn(async move { rig.drain().await })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    // A worker may stop while another still produces: finish on this one.
    rig.drain().await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu).as_secs_f64();
    let processed = rig.store.state_counts().get(&ProcessState::Processed).copied().unwrap_or(0);
    ThroughputRun {
        orders,
        processed,
        seconds,
        orders_per_second: processed as f64 / seconds,
        cpu_us_per_order: cpu * 1e6 / orders.max(1) as f64,
        handlers: rig.handler_times(),
    }
}

pub async fn throughput(workflow: &str, orders: usize, workers: usize, repeats: usize) -> ThroughputReport {
    let mut runs = Vec::new();
    for r in 0..repeats.max(1) {
        runs.push(throughput_once(workflow, orders, workers, 1 + r as u64).await);
    }
    let mut ops: Vec<f64> = runs.iter().map(|r| r.orders_per_second).collect();
    let mut cpu: Vec<f64> = runs.iter().map(|r| r.cpu_us_per_order).collect();
    let mut per: BTreeMap<String, f64> = BTreeMap::new();
    for name in ["submission", "scheduler", "agent"] {
        let mut v: Vec<f64> =
            runs.iter().filter_map(|r| r.handlers.get(name)).map(|h| h.us_per_message).collect();
        per.insert(name.into(), median(&mut v));
    }
    ThroughputReport {
        workflow: workflow.into(),
        orders,
        workers,
        median_orders_per_second: median(&mut ops),
        median_cpu_us_per_order: median(&mut cpu),
        median_us_per_message: per,
        runs,
    }
}

impl fmt::Display for ThroughputReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} orders x {} runs, {} worker(s)\n  median {:.0} orders/s, {:.1} us CPU per order",
            self.workflow,
            self.orders,
            self.runs.len(),
            self.workers,
            self.median_orders_per_second,
            self.median_cpu_us_per_order
        )?;
        for (h, us) in &self.median_us_per_message {
            writeln!(f, "  {h:<10} {us:.2} us/message")?;
        }
        let all: Vec<String> = self.runs.iter().map(|x| format!("{:.0}", x.orders_per_second)).collect();
        writeln!(f, "  runs (orders/s): {}", all.join(" "))
    }
}
