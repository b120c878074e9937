//! `bench recovery`: simulated time from an agent crash to the order's completion, and
//! the bound the timeouts promise.

use std::fmt;

use serde::Serialize;

use sas::adapters::embedded::queue_names::AGENT;
use sas::domain::{Policy, ProcessState};
use sas::ports::Clock;

use super::measure::percentile;
use super::rig::{LambdaFunction, Rig, RigOptions};

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryReport {
    pub orders: usize,
    pub crashes: usize,
    pub step_timeout_ms: u64,
    pub reply_grace_ms: u64,
    pub pending_timeout_ms: u64,
    pub supervisor_period_ms: u64,
    pub retry_base_ms: u64,
    /// Crash to Processed, simulated ms.
    pub p50_ms: u64,
    pub p90_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
    pub min_ms: u64,
    /// max(step timeout + reply grace, pending timeout) + supervisor period + first
    /// retry backoff (max).
    pub bound_ms: u64,
    pub within_bound: usize,
    pub all_processed: bool,
}

/// `orders` single-step orders, each in a world of its own on a manual clock. Each
/// order's agent crashes on its first attempt at a uniformly random time within the
/// step timeout, and the supervisor's phase is uniformly random: the distribution of
/// crash-to-completion times over those two.
pub async fn recovery(orders: usize, policy: Policy, supervisor_period_ms: u64, seed: u64) -> RecoveryReport {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut latencies = Vec::new();
    let mut all_processed = true;
    for i in 0..orders {
        let rig = Rig::new(
            RigOptions {
                workflow: "single-step".into(),
                policy,
                supervisor_period_ms,
                seed: seed.wrapping_add(i as u64),
                reply_to: false,
                ..RigOptions::default()
            },
            true,
        );
        let manual = rig.manual.clone().expect("manual");
        rig.send_orders(i, 1).await;
        // Submission and claim, then the agent receives its request and crashes.
        rig.invoke(LambdaFunction::Submission).await;
        rig.invoke(LambdaFunction::Scheduler).await;
        let got = rig.queues.receive(AGENT, 1).expect("agent queue");
        let crash_at = manual.advance(rng.u64(0..policy.step_timeout_ms));
        drop(got); // never deleted, never answered: redelivered after the visibility timeout
        let first_tick = manual.now().plus_ms(rng.u64(0..supervisor_period_ms.max(1)));
        rig.run_simulated(1, first_tick).await;
        let task = rig.store.tasks().pop().expect("one task");
        all_processed &= task.state() == ProcessState::Processed;
        latencies.push(task.updated_at.millis_since(crash_at));
    }
    latencies.sort_unstable();
    // The claim keeps the pending deadline when it covers complete-by + grace (it does
    // here: the claim comes at once), so the supervisor acts at the later of the two.
    let deadline_after_claim =
        (policy.step_timeout_ms + policy.reply_grace_ms).max(policy.pending_timeout_ms);
    let bound = deadline_after_claim + supervisor_period_ms + policy.retry_backoff.base_ms;
    RecoveryReport {
        orders,
        crashes: orders,
        step_timeout_ms: policy.step_timeout_ms,
        reply_grace_ms: policy.reply_grace_ms,
        pending_timeout_ms: policy.pending_timeout_ms,
        supervisor_period_ms,
        retry_base_ms: policy.retry_backoff.base_ms,
        p50_ms: percentile(&latencies, 50.0),
        p90_ms: percentile(&latencies, 90.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0),
        min_ms: latencies.first().copied().unwrap_or(0),
        bound_ms: bound,
        within_bound: latencies.iter().filter(|&&l| l <= bound).count(),
        all_processed,
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} crashes; step timeout {} ms, reply grace {} ms, pending timeout {} ms, supervisor period {} ms, retry base {} ms\n\
             crash -> processed (simulated ms): min {} p50 {} p90 {} p99 {} max {}\n\
             bound (max(timeout + grace, pending) + period + retry base): {} ms; within bound {}/{}; all processed: {}",
            self.crashes,
            self.step_timeout_ms,
            self.reply_grace_ms,
            self.pending_timeout_ms,
            self.supervisor_period_ms,
            self.retry_base_ms,
            self.min_ms,
            self.p50_ms,
            self.p90_ms,
            self.p99_ms,
            self.max_ms,
            self.bound_ms,
            self.within_bound,
            self.orders,
            self.all_processed
        )
    }
}
