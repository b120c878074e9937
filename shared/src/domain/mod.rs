//! The pattern's domain, pure: no I/O, no clock reads, no randomness of its own.
//! Time and random numbers come in as arguments so every decision is replayable.
//!
//! It reads bottom-up. The layers, lowest first: a file imports only files of lower
//! layers, and files of one layer do not import each other, so each can be read knowing
//! only what is below it (`shared/tests/domain_layers.rs` holds the files to this list).
//!
//! 1. The leaves, importing nothing of the domain:
//!    - `ids.rs`: times, order ids, lease tokens, the idempotency key's type.
//!    - `lifecycle.rs`: the states, the triggers and the transition table.
//!    - `output.rs`: a step's output, bounded.
//!    - `retry.rs`: backoff with jitter.
//!    - `breaker.rs`: the circuit breaker of one remote service.
//!    - `secrets.rs`: where an agent's auth header value lives.
//!    - `reply_to.rs`: which queues an order may name for its status updates.
//!    - `json_shape.rs`: an order's items' shape, read without building a JSON value.
//! 2. Above the leaves:
//!    - `timeline.rs`: a task's bounded history.
//!    - `wait.rs`: timer steps: how long or until when, and the path that names the time.
//!    - `callback.rs`: callback steps: the token the outside completes them with, and the
//!      wait a record keeps for one.
//!    - `gate.rs`: flow control: the places, tickets and rate of one agent with limits.
//!    - `map.rs`: map steps: where their items come from, their bounds, their items' keys.
//! 3. `workflow.rs`: steps and workflows, the saga's terms (compensable, pivot, read-only),
//!    and the idempotency key of one action of one step.
//! 4. `messages.rs`: every message on a queue or topic, and its parser.
//! 5. `task/`: the record and the decisions that move it, the operator's acts among them,
//!    layered inside (`task/mod.rs`).
//! 6. `definitions/`: the definition file, its checks, and the built-in workflows, layered
//!    inside (`definitions/mod.rs`).
//! 7. `mod.rs`: this index and the re-exports.

pub mod breaker;
pub mod callback;
pub mod definitions;
pub mod gate;
pub mod ids;
mod json_shape;
pub mod lifecycle;
pub mod map;
pub mod messages;
pub mod output;
pub mod reply_to;
pub mod retry;
pub mod secrets;
pub mod task;
pub mod timeline;
pub mod wait;
pub mod workflow;

pub use callback::{
    Awaiting, Callback, CallbackSecret, CallbackToken, Completion, CompletionRefused, TokenClaims, TokenError,
};
pub use definitions::{Definitions, Invalid};
pub use ids::{IdempotencyKey, LeaseToken, OrderId, Sender, Timestamp};
pub use lifecycle::{ProcessState, Trigger};
pub use map::{ItemsPath, MapStep, item_key};
pub use messages::*;
pub use operator::{Actor, Origin};
pub use output::{MAX_OUTPUT_BYTES, OutputError, Outputs, StepOutput};
pub use reply_to::{QueueId, ReplyToError, ReplyToRules};
pub use secrets::{SECRET_RETRY_MS, SECRET_TTL_MS, SecretSource, SecretValue};
/// An operator's (or an app's) acts: `task/operator.rs`, under the path they always had.
pub use task::operator;
pub use task::*;
pub use timeline::{Entry, Happened};
pub use wait::{Wait, WaitPath};
pub use workflow::{
    Action, MapText, OnGiveUp, Stage, StageText, Step, StepEffect, StepKind, Workflow, Workflows,
    idempotency_key, is_idempotency_key,
};
