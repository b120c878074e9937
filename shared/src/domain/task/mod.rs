//! The task record (the state table's row) and the decisions that move it.
//!
//! Each decision is a pure function of the record as read, the event, the time and the
//! workflow. It returns the next record and the effects to perform after the write.
//! The store writes the next record only if the row still has the revision that was
//! read, so a decision made on a stale read can never land: that one conditional
//! write is what makes claims exclusive, replies fenced and recoveries happen once.
//!
//! Every decision takes its next state from the transition table (`lifecycle.rs`) through
//! `Draft::moved`, enters the timeline through `Draft::logged`, and becomes a record through
//! `Draft::build`, which refuses a draft that fits no phase of its state. The files'
//! layers, lowest first; a file imports only files of lower layers
//! (`shared/tests/domain_layers.rs` holds them to it):
//!
//! 1. `branches.rs`: a parallel stage's branches as the record keeps them.
//! 2. `outcome.rs`: the policy, causes, effects and refusals every decision shares, and
//!    who acts (an operator's or an app's `Actor`).
//! 3. `phase.rs`: the phase, one enum: each state with exactly what it holds.
//! 4. `record.rs`: the record (read-only outside the domain) and a decision's result.
//! 5. `draft.rs`: a decision's flat working copy, the moves every decision shares, and
//!    the build of a draft into a record.
//! 6. Peers:
//!    - `stored.rs`: the record as stored, and records stored before the phase map.
//!    - `compensation.rs`: what forbids undoing (a pivot, a redo), and the next compensation.
//!    - `capacity.rs`: waiting for a place in a limited agent's gate, and a remote's
//!      "too many requests".
//! 7. `recovery.rs`: a lapse past the deadline, and the give-up rule.
//! 8. `claim.rs`: a scheduler takes the task for its current step (or all the branches
//!    of its stage, or a map's items up to its cap; a map whose items cannot be read
//!    gives up there).
//! 9. Peers:
//!    - `reply.rs`: the fence, then an agent's reply.
//!    - `timer.rs`: a Schedule's decision (wake, sleep at a timer step, or claim), and
//!      the supervisor's (wake or lapse).
//!    - `callback.rs`: a callback step's agent started the work; the outside's
//!      completion, failure or heartbeat through the step's token, or an operator's by hand.
//!    - `operator.rs`: an operator's (or an app's) resubmit, compensate, cancel, pause and
//!      resume.
//! 10. `decisions.rs`: the public decisions, one per message kind and operator act.
//! 11. `scheduling.rs`: a Schedule handled whole (a limited agent's gate and the rounds
//!     of lost races included), as a machine the scheduler drives without deciding.
//! 12. Tests only:
//!    - `fixtures.rs`: tasks in the states tests start from; checked decisions.
//!    - `invariants.rs`: every decision against the table, in random sequences too.
//!    - `map_decisions.rs`: a map step's decisions end to end.
//! 13. `mod.rs`: this index and the re-exports.

mod branches;
mod callback;
mod capacity;
mod claim;
mod compensation;
mod decisions;
mod draft;
pub mod operator;
mod outcome;
mod phase;
mod record;
mod recovery;
mod reply;
mod scheduling;
mod stored;
mod timer;

#[cfg(test)]
pub(super) mod fixtures;
#[cfg(test)]
mod invariants;
#[cfg(test)]
mod map_decisions;

pub use branches::{Branch, Outcome, StageRun};
pub use claim::Mint;
pub use outcome::{Act, Cause, Effect, PARKED_MS, Policy, Refusal, StaleReason};
pub use phase::{Claim, Lease, Phase, Unclaimed, WaitingFor};
pub use record::{Decision, TaskRecord};
pub use scheduling::{
    CONFLICT_RETRIES, Done, Freed, GATED_ROUNDS, Next, Place, Scheduling, Seen, conflict_retries, freed_by,
    place_of,
};
