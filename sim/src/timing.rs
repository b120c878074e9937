//! How the loop paces a run, and when it gives up on one: the weights of its choices,
//! the most time it lets pass between two I/O calls, its step cap, and the bound every
//! order must end within once the faults stop.

use sas::domain::{Policy, Workflow, Workflows};

use crate::deployment::{SUPERVISOR_PERIOD_MS, WORK};
use crate::swarm::{Faults, Swarm};

/// The weights the loop draws its next step by (docs/SIMULATION.md, "How it works"): each
/// pending I/O call, each queue whose messages could start an invocation, and letting time
/// pass, which counts only while calls are pending, so that I/O takes time.
pub const IO_WEIGHT: u64 = 4;
pub const START_WEIGHT: u64 = 3;
pub const TICK_WEIGHT: u64 = 2;
/// Largest step of time the loop takes between two I/O calls.
pub const TICK_MAX_MS: u64 = 25;
/// Loop steps after which a run that has not ended is a liveness violation: a run that
/// spins without moving time past its deadline would otherwise never end.
pub const MAX_STEPS: u64 = 2_000_000;

/// How long after the faults stop every order must have ended: the worst case of every
/// step, forward and then undone, using its whole failure budget, each failure costing a
/// lease (a callback step's: its agent's and its callback's timeout), its grace, a pending
/// timeout, the longest backoff, a supervisor period and the clocks' skew; plus one
/// visibility timeout and one message delay still in flight, and some slack.
pub fn liveness_bound_ms(policy: &Policy, faults: &Faults, workflows: &Workflows) -> u64 {
    let (cycles, cycle) = failure_cycles(policy, faults, workflows);
    let in_flight = WORK.iter().map(|w| w.visibility_timeout_ms).max().unwrap_or(0) + faults.delay_max_ms;
    // Timers: each waits its length (an `until`, a little after its step's effect) and
    // then up to a supervisor period; waiting is no failure, so it adds no cycles.
    let waits = workflows
        .all()
        .iter()
        .map(|w| {
            w.steps
                .iter()
                .filter_map(|s| s.wait.as_ref())
                .map(|wait| wait.for_ms.unwrap_or(crate::ledger::RELEASE_AFTER_MS + cycle) + cycle)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    cycles * cycle + in_flight + waits + 5_000
}

/// The most attempts an order's steps may take (forward and undone, each using its whole
/// failure budget), and the longest one of them may last.
fn failure_cycles(policy: &Policy, faults: &Faults, workflows: &Workflows) -> (u64, u64) {
    let longest = workflows.all().iter().map(|w| w.len()).max().unwrap_or(1);
    let largest = |of_step: &dyn Fn(&Workflow, u32) -> u64, default: u64| {
        workflows.all().iter().flat_map(|w| (0..w.len()).map(|i| of_step(w, i))).max().unwrap_or(default)
    };
    let threshold = policy.failure_threshold;
    let budget = largest(&|w, i| u64::from(w.max_failures(i, threshold)), u64::from(threshold));
    // A callback step's attempt lasts until its callback's timeout at most (heartbeats
    // only bring a lapse sooner), counted from its claim: past its agent's complete-by.
    let step_timeout = largest(
        &|w, i| {
            let callback = w.step(i).and_then(|s| s.callback).map_or(0, |cb| cb.timeout_ms);
            w.timeout_ms(i, policy.step_timeout_ms) + callback
        },
        policy.step_timeout_ms,
    );
    let cycle = step_timeout
        + policy.reply_grace_ms
        + policy.pending_timeout_ms
        + policy.retry_backoff.cap_ms
        + SUPERVISOR_PERIOD_MS
        + 2 * faults.skew_max_ms
        + faults.overshoot_max_ms;
    let cycles = u64::from(2 * longest - 1) * budget + u64::from(longest) + 1;
    (cycles, cycle)
}

/// The seed's bound: `liveness_bound_ms`, and in a seed whose agents have limits, room for
/// each order's attempts to wait behind every other order's (a gate may let calls through
/// one at a time), each of those also waiting out a place reserved for a task that never
/// came (`gate::RESERVATION_MS`) and a remote's pause. Timers hold no place: their waits
/// are counted once.
pub fn seed_bound_ms(swarm: &Swarm, workflows: &Workflows) -> u64 {
    let policy = crate::deployment::policy();
    let bound = liveness_bound_ms(&policy, &swarm.faults, workflows);
    if swarm.limits.is_empty() {
        return bound;
    }
    let (cycles, cycle) = failure_cycles(&policy, &swarm.faults, workflows);
    let waits = sas::domain::gate::RESERVATION_MS + swarm.faults.busy_retry_max_ms;
    bound + swarm.orders as u64 * cycles * (cycle + waits)
}
