//! Proof that the simulation can fail: with a planted bug switched on (`sas::mutations`,
//! this crate's dev-dependency feature), the seeds must find a violation of the
//! invariant that bug breaks within a bounded number of seeds.
//!
//! The switches are process-wide, so this file is its own test binary and its tests
//! take a lock: nothing else runs while a bug is planted.

use std::sync::Mutex;

use sas::mutations::Mutation;
use sas_sim::invariants::Invariant;
use sas_sim::{run_seeds, threads};

static PLANTED: Mutex<()> = Mutex::new(());

/// Seeds the simulation may take to find a planted bug.
const WITHIN: u64 = 200;

struct Planted(Mutation);

impl Planted {
    fn on(m: Mutation) -> Planted {
        m.set(true);
        Planted(m)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// What the seeds with `mutation` on found: for each invariant broken, the first seed
/// that broke it.
fn caught(mutation: Mutation) -> std::collections::BTreeMap<Invariant, u64> {
    caught_within(mutation, WITHIN)
}

/// As `caught`, over the first `within` seeds.
fn caught_within(mutation: Mutation, within: u64) -> std::collections::BTreeMap<Invariant, u64> {
    let _serial = PLANTED.lock().unwrap_or_else(|p| p.into_inner());
    let summary = {
        let _planted = Planted::on(mutation);
        run_seeds(0..within, threads(), None)
    };
    assert!(!mutation.is_on());
    let mut first = std::collections::BTreeMap::new();
    let mut failures = summary.failures;
    failures.sort_by_key(|(seed, _)| *seed);
    for (seed, violations) in &failures {
        for v in violations {
            first.entry(v.invariant).or_insert(*seed);
        }
    }
    println!(
        "{mutation:?}: caught by {} of {within} seeds; first seed per invariant: {first:?}",
        failures.len()
    );
    if let Some((seed, violations)) = failures.first() {
        println!("  seed {seed}:");
        for v in violations {
            println!("    {v}");
        }
    }
    first
}

#[test]
fn disabled_fencing_is_caught() {
    let found = caught(Mutation::DisableFencing);
    assert!(found.contains_key(&Invariant::Fenced), "the fence was never found broken: {found:?}");
}

#[test]
fn an_unconditional_claim_is_caught() {
    let found = caught(Mutation::UnconditionalClaim);
    assert!(found.contains_key(&Invariant::OneLease), "one live lease was never found broken: {found:?}");
}

/// Today's behaviour before pivots: giving up compensates whatever can be undone and
/// ends Compensated while a pivot's effect stands. The remote's ledger must show it.
#[test]
fn compensating_past_a_pivot_is_caught() {
    let found = caught(Mutation::CompensatePastPivot);
    assert!(found.contains_key(&Invariant::NothingStands), "nothing-stands never found broken: {found:?}");
    assert!(found.contains_key(&Invariant::PivotGoesForward), "forward-only never found broken: {found:?}");
}

/// A forward step handed only the output of the step just before it: the remote side
/// sees a step called without an earlier step's output.
#[test]
fn forgetting_outputs_is_caught() {
    let found = caught(Mutation::ForgetOutputs);
    assert!(found.contains_key(&Invariant::Outputs), "outputs were never found missing: {found:?}");
}

/// Running a task on the newest version its handler knows instead of the one it was
/// accepted under: once the seed's new version is out, old tasks call the new steps.
#[test]
fn running_the_newest_version_instead_of_the_pinned_one_is_caught() {
    let found = caught(Mutation::NewestVersion);
    assert!(found.contains_key(&Invariant::Pinned), "pinning was never found broken: {found:?}");
}

/// An operator's write made whatever the stored revision: the same action sent from two
/// terminals lands twice.
#[test]
fn an_operator_action_written_blind_is_caught() {
    let found = caught(Mutation::OperatorBlindWrite);
    assert!(found.contains_key(&Invariant::OperatorOnce), "at-most-once was never found broken: {found:?}");
}

/// Resubmit that takes a task which stopped while undoing: a cancelled task whose undo
/// failed runs forward again.
#[test]
fn resubmitting_a_cancelled_task_is_caught() {
    let found = caught(Mutation::ResubmitAfterUndo);
    assert!(
        found.contains_key(&Invariant::CancelledStaysOut),
        "a cancelled task was never found going forward: {found:?}"
    );
}

/// Issue 24, finding 2: an app's cancel not checked against the order's submitter. Apps'
/// cancels from another sender (`workload.rs`) then cancel orders that are not theirs.
#[test]
fn a_cancel_from_any_sender_is_caught() {
    let found = caught(Mutation::CancelFromAnySender);
    assert!(
        found.contains_key(&Invariant::CancelBySubmitter),
        "no order was found cancelled by another sender: {found:?}"
    );
}

/// A Schedule that wakes a waiting timer whatever its wake time: the duplicate of the
/// Schedule that put it to sleep wakes it at once.
#[test]
fn waking_a_timer_before_its_time_is_caught() {
    let found = caught(Mutation::WakeEarly);
    assert!(found.contains_key(&Invariant::TimerNotEarly), "no timer was found waking early: {found:?}");
}

/// A claim that ignores the pause: a Schedule that was on its way when the operator paused
/// the task (or a redelivered one) dispatches its next step.
#[test]
fn a_claim_of_a_paused_task_is_caught() {
    let found = caught(Mutation::ClaimWhilePaused);
    assert!(found.contains_key(&Invariant::PausedHoldsStill), "no paused task was found claimed: {found:?}");
}

/// A callback token checked for its order and step only: the outside party's token of an
/// earlier attempt, or a forged one (right order, step and attempt, another secret), lands.
#[test]
fn accepting_an_old_or_forged_callback_token_is_caught() {
    let found = caught(Mutation::AcceptOldTokens);
    assert!(
        found.contains_key(&Invariant::RefusedCompletionChangesNothing),
        "no completion was found landing with a token not the live attempt's own: {found:?}"
    );
}

/// A supervisor whose sweep never wakes a waiting timer: a wait past SQS's longest delay
/// (the seeds' timers of 900 to 960 s), or one whose delayed Schedule was lost, never ends.
#[test]
fn a_sweep_that_skips_timers_is_caught() {
    let found = caught(Mutation::SweepSkipsTimers);
    assert!(found.contains_key(&Invariant::TimerOnTime), "no timer was found lost: {found:?}");
}

/// A parallel stage that completes when all its branches but one succeeded: the task goes
/// past the stage while the last branch has not taken effect at the remote side (or never
/// will: its service refuses it).
#[test]
fn joining_a_stage_before_its_last_branch_is_caught() {
    let found = caught(Mutation::JoinEarly);
    assert!(
        found.contains_key(&Invariant::StageJoinsOnlyWhenAll),
        "no task was found past a stage before all its branches took effect: {found:?}"
    );
}

/// Undoing a stage that compensates every branch with a compensation: also those never
/// dispatched, or refused by their service (which had no effect to undo).
#[test]
fn undoing_every_branch_of_a_stage_is_caught() {
    let found = caught(Mutation::UndoEveryBranch);
    assert!(
        found.contains_key(&Invariant::StageUndoExact),
        "no branch was found undone that never took effect: {found:?}"
    );
}

/// A map that dispatches one item more than its cap (issue 39).
#[test]
fn a_map_over_its_cap_is_caught() {
    let found = caught(Mutation::MapOverCap);
    assert!(found.contains_key(&Invariant::MapCapHeld), "no map was found over its cap: {found:?}");
}

/// A map's items under one key: the remote answers every item with the first one's effect.
#[test]
fn items_sharing_a_key_are_caught() {
    let found = caught(Mutation::ItemKeysShared);
    assert!(found.contains_key(&Invariant::MapItemOnce), "no item was found without its own key: {found:?}");
}

/// Undoing a map's refused items, which had no effect to undo.
#[test]
fn undoing_refused_items_is_caught() {
    let found = caught(Mutation::UndoRefusedItems);
    assert!(found.contains_key(&Invariant::MapUndoExact), "no refused item was found undone: {found:?}");
}

/// A map over a limited agent that sends its next item on an item's answer, under the
/// lease, past the agent's gate.
#[test]
fn items_sent_around_the_gate_are_caught() {
    let found = caught(Mutation::ItemsAroundGate);
    assert!(
        found.contains_key(&Invariant::MapItemsThroughGate),
        "no gated map's item was found sent without a claim: {found:?}"
    );
}

/// A gate written whatever its stored revision (issue 27): two schedulers that read the
/// same last free place both take it, and the remote sees more calls at once, or in one
/// second, than its agent's limits allow.
#[test]
fn a_gate_written_blind_is_caught() {
    let found = caught(Mutation::GateBlindWrite);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no limited agent's service was found over its limits: {found:?}"
    );
}

/// A task that leaves an agent's line (a cancel while it waits for a place) without
/// handing its ticket back: its turn comes, and a place is reserved for nobody.
#[test]
fn a_ticket_left_behind_is_caught() {
    let found = caught(Mutation::TicketsLeftBehind);
    assert!(
        found.contains_key(&Invariant::TicketsHandedBack),
        "no ticket was found let through after its task left the line: {found:?}"
    );
}

/// A throttled step that never gives up: a remote that keeps answering 429 keeps its
/// order cycling past the step's throttle budget.
#[test]
fn a_step_throttled_forever_is_caught() {
    let found = caught(Mutation::ThrottledForever);
    assert!(
        found.contains_key(&Invariant::ThrottleBudget),
        "no step was found throttled past its budget: {found:?}"
    );
}

/// Issue 36, item 7: heartbeats within the floor left unwritten, but the wait due one
/// interval after the last one written (no slack): a party beating every interval is
/// lapsed after a beat that fell within the floor.
#[test]
fn a_heartbeat_due_without_the_floors_slack_is_caught() {
    let found = caught(Mutation::HeartbeatNoSlack);
    assert!(found.contains_key(&Invariant::HeartbeatsKept), "no compliant party was found lapsed: {found:?}");
}

/// Every heartbeat written, however soon after the last one.
#[test]
fn a_heartbeat_written_within_the_floor_is_caught() {
    let found = caught(Mutation::HeartbeatEveryWrite);
    assert!(
        found.contains_key(&Invariant::HeartbeatsKept),
        "no heartbeat was found written within the floor: {found:?}"
    );
}

/// Each of an agent's gates holding its whole limits, not its share.
#[test]
fn every_gate_holding_the_whole_limits_is_caught() {
    let found = caught(Mutation::WholeLimitsPerGate);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no limited agent's service was found over its limits: {found:?}"
    );
}

/// Issue 36, item 4: a limited agent's request called although its call's mark was
/// already there: a copy SQS delivered to another container calls without a place, and
/// the remote sees more calls at once, or in one second, than the agent's limits allow.
#[test]
fn a_copy_of_a_request_called_is_caught() {
    let found = caught(Mutation::CopiesCalled);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no limited agent's service was found over its limits: {found:?}"
    );
}

/// A claim under a per-key limit that skips its key gate.
#[test]
fn skipping_the_key_gate_is_caught() {
    let found = caught(Mutation::KeyGateSkipped);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no key's calls were found over its per-key limit: {found:?}"
    );
}

/// Issue 36, item 9: a parallel stage's claim that takes no place for its branch on a
/// limited agent.
#[test]
fn a_stage_claimed_without_its_branchs_place_is_caught() {
    let found = caught(Mutation::StageWithoutPlace);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no limited agent's service was found over its limits: {found:?}"
    );
}

/// Issue 38: an operator's completion by hand written without who gave it and why. Over
/// 2,000 seeds: a completion by hand needs a seed whose operator also pauses, acting
/// while a task waits on a callback (13 of the first 2,000 seeds, the first 204).
#[test]
fn a_completion_by_hand_left_unrecorded_is_caught() {
    let found = caught_within(Mutation::ByHandUnrecorded, 2_000);
    assert!(
        found.contains_key(&Invariant::RefusedCompletionChangesNothing),
        "no completion by hand was found unrecorded: {found:?}"
    );
}

/// Issue 36: a claim the store throttles moves the deadline out by the pending timeout
/// only, not past the backoff its Schedule waits.
#[test]
fn a_store_wait_counted_against_the_step_is_caught() {
    let found = caught(Mutation::StoreWaitShort);
    assert!(
        found.contains_key(&Invariant::StoreWaitUncounted),
        "no store throttle was found leaving the deadline short: {found:?}"
    );
}

/// Issue 36: changes that land together at a gate, each decided on the gate as read: all
/// but the last one's change are lost, places and tickets with them.
#[test]
fn gate_changes_landed_together_on_the_gate_as_read_are_caught() {
    let found = caught_within(Mutation::GateChangesFromRead, 2_000);
    assert!(
        found.contains_key(&Invariant::RemoteWithinLimits),
        "no limit was found broken by changes decided on a stale gate: {found:?}"
    );
}

/// And with nothing planted, the same seeds pass: what the tests above catch is the bug.
#[test]
fn the_same_seeds_pass_without_a_planted_bug() {
    let _serial = PLANTED.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        [
            Mutation::DisableFencing,
            Mutation::UnconditionalClaim,
            Mutation::CompensatePastPivot,
            Mutation::ForgetOutputs,
            Mutation::NewestVersion,
            Mutation::OperatorBlindWrite,
            Mutation::ResubmitAfterUndo,
            Mutation::CancelFromAnySender,
            Mutation::WakeEarly,
            Mutation::AcceptOldTokens,
            Mutation::SweepSkipsTimers,
            Mutation::JoinEarly,
            Mutation::UndoEveryBranch,
            Mutation::GateBlindWrite,
            Mutation::TicketsLeftBehind,
            Mutation::ThrottledForever,
            Mutation::HeartbeatNoSlack,
            Mutation::HeartbeatEveryWrite,
            Mutation::WholeLimitsPerGate,
            Mutation::KeyGateSkipped,
            Mutation::CopiesCalled,
            Mutation::StageWithoutPlace,
            Mutation::ByHandUnrecorded,
            Mutation::StoreWaitShort,
            Mutation::GateChangesFromRead,
            Mutation::MapOverCap,
            Mutation::ItemKeysShared,
            Mutation::UndoRefusedItems,
            Mutation::ItemsAroundGate,
        ]
        .iter()
        .all(|m| !m.is_on())
    );
    let summary = run_seeds(0..WITHIN, threads(), None);
    assert!(summary.failures.is_empty(), "{:?}", summary.failures.first());
}
