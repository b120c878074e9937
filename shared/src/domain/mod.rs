//! The pattern's domain, pure: no I/O, no clock reads, no randomness of its own.
//! Time and random numbers come in as arguments so every decision is replayable.

pub mod breaker;
pub mod definitions;
pub mod ids;
pub mod lifecycle;
pub mod messages;
pub mod operator;
pub mod output;
pub mod reply_to;
pub mod retry;
pub mod secrets;
pub mod task;
pub mod timeline;
pub mod workflow;

pub use definitions::{Definitions, Invalid};
pub use ids::{IdempotencyKey, LeaseToken, OrderId, Timestamp};
pub use lifecycle::{ProcessState, Trigger};
pub use messages::*;
pub use operator::Actor;
pub use output::{MAX_OUTPUT_BYTES, OutputError, Outputs, StepOutput};
pub use reply_to::{QueueId, ReplyToError, ReplyToRules};
pub use secrets::{SecretSource, SecretValue};
pub use task::*;
pub use timeline::{Entry, Happened};
pub use workflow::{
    Action, OnGiveUp, Step, StepEffect, StepKind, Workflow, Workflows, idempotency_key, is_idempotency_key,
};
