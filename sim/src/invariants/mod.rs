//! The one catalogue of the pipeline's invariants, and the checks that need nothing but
//! what every run leaves behind: the state table's write log, the final records, the
//! operator alerts and the remote service's ledger. The simulation (`check.rs`) and
//! `sasctl dev` (`cli/src/invariants.rs`) both run [`check_records`], then add what
//! only they can see (the simulation: which function wrote each write, for which
//! message, and true time; `dev`: the status queue and real-time progress).
//!
//! One idea a file:
//! - `catalogue.rs`: the invariants, in words; a violation; what a run leaves behind.
//! - `transitions.rs`: reading a write back (its trigger, the stage it runs or passes).
//! - `history.rs`: what one order's history shows (steps ran and undone, declined, effects).
//! - `writes.rs`: each landed write against the one before it; operators' actions once.
//! - `failures.rs`: FailureCount and each step's (and branch's) failure budget.
//! - `fences.rs`: replies under the live lease, completions through the token's fence.
//! - `tasks.rs`: each final task against its history (terminal once, alerts, cancel).
//! - `compensation.rs`: compensation in the records and at the remote, stages exactly.
//! - `remote.rs`: the remote's ledger against the final states, its keys, its limits.
//! - `outputs.rs`: what each call was handed and called as, against the pinned version.
//! - `maps.rs`: map steps: the cap, each item's own key and effect, and their exact undo.

mod catalogue;
mod compensation;
mod failures;
mod fences;
mod history;
mod maps;
mod outputs;
mod remote;
mod tasks;
mod transitions;
mod writes;

pub use catalogue::{Invariant, Records, Violation};
pub use history::{dispatched_branches, history_of};
pub use maps::{item_reply_fenced, map_coverage};
pub use transitions::{branch_live, coverage, infer_trigger, running_stage, stages_passed};

use remote::{one_key_per_step_applied_once, remote_within_limits};
use tasks::check_tasks;
use writes::{check_writes, operator_actions_land_once};

/// Every violation the records show; empty means every invariant they can show held.
/// The checks run in a fixed order (each write, then each task, then the operators' and
/// the remote's keys), so the same records always give the same list.
pub fn check_records(r: &Records) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut add = |invariant: Invariant, detail: String| found.push(Violation::new(invariant, detail));
    check_writes(r, &mut add);
    check_tasks(r, &mut add);
    operator_actions_land_once(r.writes, &mut add);
    one_key_per_step_applied_once(r.ledger, &mut add);
    remote_within_limits(r.ledger, r.tasks, &mut add);
    found
}
