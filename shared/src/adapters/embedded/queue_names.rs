//! The queue names an embedded run uses (`sasctl dev`, the benchmarks, the simulation,
//! the handler tests): one set, so every in-process run wires the same topology.

use crate::domain::ReplyToRules;
use crate::ports::{QueueUrl, Topology};

pub const ORDERS: &str = "orders";
pub const ORDERS_DLQ: &str = "orders-dlq";
pub const SCHEDULER: &str = "scheduler";
pub const SCHEDULER_DLQ: &str = "scheduler-dlq";
pub const AGENT: &str = "agent";
pub const AGENT_DLQ: &str = "agent-dlq";
pub const STATUS: &str = "status";

/// Where the handlers send, by these names.
pub fn topology() -> Topology {
    Topology::new(QueueUrl(SCHEDULER.into()), QueueUrl(AGENT.into()))
}

/// The `reply_to` rules of an in-process run: status to the `status` queue only, never to
/// one of the pipeline's own queues. The handlers start with these; a Lambda function
/// replaces them with its configuration's (`config::StateConfig::reply_to`).
pub fn reply_to_rules() -> ReplyToRules {
    ReplyToRules::names(&[STATUS], &[ORDERS, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ, AGENT, AGENT_DLQ])
}
