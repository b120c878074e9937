//! `bench contention`: a parallel stage's branch replies race on one record. Five steps
//! one after the other (`sequential-5`) against the same five as one stage's branches
//! (`parallel-5`), on the embedded backend with each store call a round trip (the other
//! handlers of an invocation run meanwhile, as while a DynamoDB call is on the network):
//! orders per second, CPU time per order, and the conditional writes that lost a race
//! (the `WriteConflicts` metric) per order.
//!
//! How many replies of one order meet in one scheduler invocation decides the conflicts,
//! and that depends on the load: the orders go in waves of `wave` orders, each wave driven
//! until every order of it has ended (`wave` 1: an order alone, its five replies in one
//! batch, the most they can race; 0: all at once, as `bench throughput` sends them).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use serde::Serialize;

use sas::domain::ProcessState;
use sas::ports::Metric;

use super::measure::{cpu_time, median};
use super::rig::{Rig, RigOptions};

#[derive(Debug, Clone, Serialize)]
pub struct ContentionRun {
    pub processed: usize,
    pub seconds: f64,
    pub orders_per_second: f64,
    pub cpu_us_per_order: f64,
    pub write_conflicts_per_order: f64,
    /// Scheduler messages per order (a Schedule per claim, a reply per step).
    pub scheduler_messages_per_order: f64,
    pub scheduler_us_per_message: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContentionRow {
    pub workflow: String,
    pub orders: usize,
    /// Orders per wave; 0: all at once.
    pub wave: usize,
    pub runs: Vec<ContentionRun>,
    pub median_orders_per_second: f64,
    pub median_cpu_us_per_order: f64,
    pub median_write_conflicts_per_order: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContentionReport(pub Vec<ContentionRow>);

/// One run: `orders` orders of `workflow` in waves of `wave` (0: one wave of all, put on
/// the orders queue before the clock starts, as `bench throughput` does; else each wave
/// sent within the timed part), one driver.
pub async fn contention_once(workflow: &str, orders: usize, wave: usize, seed: u64) -> ContentionRun {
    let rig = Rig::new(
        RigOptions { workflow: workflow.into(), seed, round_trips: true, ..RigOptions::default() },
        false,
    );
    if wave == 0 {
        rig.send_orders(0, orders).await;
    }
    let cpu = cpu_time();
    let started = Instant::now();
    if wave == 0 {
        rig.drain().await;
    } else {
        let mut first = 0;
        while first < orders {
            let n = wave.min(orders - first);
            rig.send_orders(first, n).await;
            rig.drain().await;
            first += n;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu).as_secs_f64();
    let processed = rig.store.state_counts().get(&ProcessState::Processed).copied().unwrap_or(0);
    let n = orders.max(1) as f64;
    let scheduler = rig.handler_times().remove("scheduler");
    ContentionRun {
        processed,
        seconds,
        orders_per_second: processed as f64 / seconds,
        cpu_us_per_order: cpu * 1e6 / n,
        write_conflicts_per_order: rig.metrics.snapshot().count(Metric::WriteConflict) as f64 / n,
        scheduler_messages_per_order: scheduler.as_ref().map_or(0.0, |h| h.messages as f64 / n),
        scheduler_us_per_message: scheduler.map_or(0.0, |h| h.us_per_message),
    }
}

pub async fn contention(
    workflows: &[&str],
    orders: usize,
    waves: &[usize],
    repeats: usize,
) -> ContentionReport {
    let mut rows = Vec::new();
    for &wave in waves {
        for wf in workflows {
            let mut runs = Vec::new();
            for r in 0..repeats.max(1) {
                runs.push(contention_once(wf, orders, wave, 1 + r as u64).await);
            }
            let pick = |f: fn(&ContentionRun) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
            rows.push(ContentionRow {
                workflow: (*wf).to_owned(),
                orders,
                wave,
                median_orders_per_second: pick(|r| r.orders_per_second),
                median_cpu_us_per_order: pick(|r| r.cpu_us_per_order),
                median_write_conflicts_per_order: pick(|r| r.write_conflicts_per_order),
                runs,
            });
        }
    }
    ContentionReport(rows)
}

impl fmt::Display for ContentionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| workflow | wave | orders/s (median) | runs | CPU per order | write conflicts per order | scheduler msgs per order | scheduler us/msg |"
        )?;
        writeln!(f, "|---|---|---:|---|---:|---:|---:|---:|")?;
        for r in &self.0 {
            let runs: Vec<String> = r.runs.iter().map(|x| format!("{:.0}", x.orders_per_second)).collect();
            let wave = if r.wave == 0 { "all at once".to_owned() } else { r.wave.to_string() };
            let sched: BTreeMap<&str, f64> = [
                (
                    "msgs",
                    median(&mut r.runs.iter().map(|x| x.scheduler_messages_per_order).collect::<Vec<_>>()),
                ),
                ("us", median(&mut r.runs.iter().map(|x| x.scheduler_us_per_message).collect::<Vec<_>>())),
            ]
            .into_iter()
            .collect();
            writeln!(
                f,
                "| {} | {wave} | {:.0} | {} | {:.1} us | {:.2} | {:.2} | {:.2} |",
                r.workflow,
                r.median_orders_per_second,
                runs.join(" "),
                r.median_cpu_us_per_order,
                r.median_write_conflicts_per_order,
                sched["msgs"],
                sched["us"]
            )?;
        }
        Ok(())
    }
}
