//! The queue names an embedded run uses (`sasctl dev`, the benchmarks, the simulation,
//! the handler tests): one set, so every in-process run wires the same topology.

use crate::handlers::Topology;
use crate::ports::QueueUrl;

pub const ORDERS: &str = "orders";
pub const ORDERS_DLQ: &str = "orders-dlq";
pub const SCHEDULER: &str = "scheduler";
pub const SCHEDULER_DLQ: &str = "scheduler-dlq";
pub const AGENT: &str = "agent";
pub const AGENT_DLQ: &str = "agent-dlq";
pub const STATUS: &str = "status";

/// Where the handlers send, by these names.
pub fn topology() -> Topology {
    Topology { scheduler_queue: QueueUrl(SCHEDULER.into()), agent_queue: QueueUrl(AGENT.into()) }
}
