//! The simulated deployment: its four functions, the queues that feed them and their
//! settings, its timing (a scaled-down production config), its workflows and the agents'
//! retry policy. Queue names are the library's (`sas::adapters::embedded::queue_names`).

use sas::adapters::embedded::QueueSettings;
use sas::adapters::embedded::queue_names::{AGENT, AGENT_DLQ, ORDERS, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ};
use sas::domain::breaker::BreakerPolicy;
use sas::domain::retry::Backoff;
use sas::domain::{Policy, Step, Workflow, Workflows};
use sas::handlers::AgentSettings;

/// Who an invocation runs as: one of the deployment's four functions, or an operator's
/// command (not a function of the deployment, but a writer the checks must tell apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Submission,
    Scheduler,
    Agent,
    Supervisor,
    /// An operator's `sasctl tasks` command: resubmit, compensate or cancel one task.
    Operator,
    /// The outside party's `sasctl tasks complete|fail|heartbeat`: a callback step's word
    /// sent directly rather than on the callback queue (`outside.rs`).
    Outside,
}

/// The queue of the `queue` agent `c` (`Swarm::queue_agent`), and its dead letters. Its
/// worker, outside the pipeline in a real deployment, is modelled by the agent's own code:
/// it takes a request, calls the remote service, and replies on the scheduler's queue.
pub const WORKER: &str = "worker-c";
pub const WORKER_DLQ: &str = "worker-c-dlq";
/// The agent that is a queue agent in the seeds that have one.
pub const QUEUE_AGENT: &str = "c";

/// The callback queue, where the outside completes, fails or beats for callback steps
/// (`CallbackMessage`); the scheduler function takes its messages with its `Callbacks`
/// handler. A refused word is kept in its dead-letter queue with the reason.
pub const CALLBACKS: &str = "callbacks";
pub const CALLBACKS_DLQ: &str = "callbacks-dlq";

/// A queue that feeds a function, as Lambda's SQS event source mapping reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkQueue {
    pub queue: &'static str,
    pub dead_letter: &'static str,
    pub visibility_timeout_ms: u64,
    pub consumer: Role,
}

impl WorkQueue {
    /// The queue's settings: its dead-letter queue after `MAX_RECEIVES` receives. No
    /// duplicates of its own: the fault layer decides those, from the seed.
    pub fn settings(&self) -> QueueSettings {
        QueueSettings {
            visibility_timeout_ms: self.visibility_timeout_ms,
            max_receives: MAX_RECEIVES,
            dead_letter: Some(self.dead_letter.to_owned()),
            duplicate_rate: 0.0,
        }
    }
}

const fn work(
    queue: &'static str,
    dead_letter: &'static str,
    visibility_timeout_ms: u64,
    consumer: Role,
) -> WorkQueue {
    WorkQueue { queue, dead_letter, visibility_timeout_ms, consumer }
}

/// The work queues.
pub const WORK: [WorkQueue; 5] = [
    work(ORDERS, ORDERS_DLQ, 3_000, Role::Submission),
    work(SCHEDULER, SCHEDULER_DLQ, 3_000, Role::Scheduler),
    work(AGENT, AGENT_DLQ, 6_000, Role::Agent),
    work(WORKER, WORKER_DLQ, 6_000, Role::Agent),
    work(CALLBACKS, CALLBACKS_DLQ, 3_000, Role::Scheduler),
];
pub const MAX_RECEIVES: u32 = 5;
pub const SUPERVISOR_PERIOD_MS: u64 = 1_000;
/// The longest a send waits for the rest of its invocation's: the agent's deployed hold.
/// One coalescer serves every simulated function; the others' longer hold deployed
/// (`config::DEFAULT_SEND_MAX_HOLD_MS`) only lets more sends share a request, and the
/// simulation's message delays already reorder sends by far more than it.
pub const SEND_MAX_HOLD_MS: u64 = sas::config::DEFAULT_AGENT_SEND_MAX_HOLD_MS;

/// The timing the simulated deployment runs with: a scaled-down production config.
pub fn policy() -> Policy {
    Policy {
        step_timeout_ms: 1_000,
        reply_grace_ms: 500,
        pending_timeout_ms: 2_000,
        failure_threshold: 3,
        retry_backoff: Backoff { base_ms: 200, cap_ms: 2_000 },
    }
}

/// The built-in workflows; a saga with a read-only first step, a pivot in the middle, a
/// compensable step after it and budgets of their own (giving up after the pivot must go
/// forward only, and a read in doubt is no pivot); and the seed's random workflow
/// (`Swarm::generated`): what handlers know before the seed's new version is published
/// (`Swarm::publish`, added by `deploy::workflows`).
pub fn workflows_before_publish(generated: &Workflow) -> Workflows {
    // The same three for every seed: built (the example file parsed) once per process.
    static FIXED: std::sync::OnceLock<[Workflow; 3]> = std::sync::OnceLock::new();
    let fixed = FIXED.get_or_init(|| {
        let saga = Workflow::new(
            "saga",
            vec![
                Step::read_only("check-stock", "inventory").with_max_failures(2),
                Step::compensable("reserve-inventory", "inventory", "release-inventory"),
                Step::pivot("ship-order", "shipping"),
                Step::compensable("send-invoice", "billing", "void-invoice").with_max_failures(4),
            ],
        );
        // Throttle budgets of a few of the remote's pauses (`busy_retry_max_ms`): most
        // throttled calls are these workflows', so their steps spend a budget and give up.
        [Workflow::single_step(), Workflow::three_step(), saga].map(|mut w| {
            for (i, step) in w.steps.iter_mut().enumerate() {
                step.max_throttled_ms = Some(1_000 + 500 * i as u64);
            }
            w
        })
    });
    let mut all = fixed.to_vec();
    all.push(generated.clone());
    Workflows::new(all)
}

pub fn agent_settings() -> AgentSettings {
    AgentSettings {
        retry: Backoff { base_ms: 50, cap_ms: 400 },
        breaker: BreakerPolicy { failure_threshold: 5, open_ms: 300 },
        limited: false,
        one_call: false,
    }
}
