//! `bench timers`: how late timers wake, both ways. A wait within SQS's longest delay
//! (15 minutes) wakes on its delayed Schedule; a longer one on the supervisor's sweep.
//! Orders arrive spread over one supervisor period, so the sweep's phase against each
//! wake time is spread too. On the rig's manual clock a delayed message arrives exactly
//! on time: the first row measures sas's side alone (SQS's own delay accuracy adds to it
//! on AWS); the second measures the sweep's period, which dominates.

use std::fmt;

use serde::Serialize;

use sas::domain::ProcessState;
use sas::ports::{Clock, Metric};

use super::rig::{LONG_TIMER, Rig, RigOptions, SHORT_TIMER};

#[derive(Debug, Clone, Serialize)]
pub struct TimerRow {
    pub workflow: String,
    pub wait_ms: u64,
    pub woken_by: &'static str,
    pub orders: usize,
    pub woken: u64,
    pub early: u64,
    pub p50_late_ms: u64,
    pub p99_late_ms: u64,
    pub max_late_ms: u64,
    pub supervisor_period_ms: u64,
    pub all_processed: bool,
}

/// `orders` orders of a timer workflow, one every `supervisor_period_ms / orders`.
pub async fn timer_lateness(workflow: &str, orders: usize, supervisor_period_ms: u64) -> TimerRow {
    let rig = Rig::new(
        RigOptions {
            workflow: workflow.into(),
            supervisor_period_ms,
            reply_to: false,
            ..RigOptions::default()
        },
        true,
    );
    let manual = rig.manual.clone().expect("manual clock");
    let start = manual.now();
    let gap = (supervisor_period_ms / orders.max(1) as u64).max(1);
    for i in 0..orders {
        manual.set(start.plus_ms(i as u64 * gap));
        rig.send_orders(i, 1).await;
        rig.drain().await;
    }
    rig.run_simulated(orders, start.plus_ms(supervisor_period_ms)).await;
    let counted = rig.metrics.snapshot();
    let late = |p: f64| counted.percentile(Metric::TimerLatenessMs, p).unwrap_or(0);
    let wait_ms = super::rig::bench_workflows()
        .get(workflow)
        .and_then(|w| w.steps.iter().find_map(|s| s.wait.as_ref().and_then(|w| w.for_ms)))
        .unwrap_or(0);
    let processed = rig.store.state_counts().get(&ProcessState::Processed).copied().unwrap_or(0);
    TimerRow {
        workflow: workflow.into(),
        wait_ms,
        woken_by: if wait_ms <= sas::domain::wait::MAX_DELAYED_WAKE_MS {
            "delayed Schedule"
        } else {
            "sweep"
        },
        orders,
        woken: counted.count(Metric::TimerWoke),
        early: counted.count(Metric::TimerEarly),
        p50_late_ms: late(50.0),
        p99_late_ms: late(99.0),
        max_late_ms: late(100.0),
        supervisor_period_ms,
        all_processed: processed == orders,
    }
}

/// Both ways, with the same arrivals.
pub async fn timers(orders: usize, supervisor_period_ms: u64) -> Vec<TimerRow> {
    vec![
        timer_lateness(SHORT_TIMER, orders, supervisor_period_ms).await,
        timer_lateness(LONG_TIMER, orders, supervisor_period_ms).await,
    ]
}

impl fmt::Display for TimerRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} ({} ms, woken by the {}): {} orders, {} woken, {} early Schedules (sent again); late p50 {} ms, p99 {} ms, max {} ms (supervisor every {} ms){}",
            self.workflow,
            self.wait_ms,
            self.woken_by,
            self.orders,
            self.woken,
            self.early,
            self.p50_late_ms,
            self.p99_late_ms,
            self.max_late_ms,
            self.supervisor_period_ms,
            if self.all_processed { "" } else { "; NOT all processed" }
        )
    }
}
