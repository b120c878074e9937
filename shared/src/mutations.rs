//! Planted bugs for the deterministic simulation's self-check (crate `sas-sim`): with
//! the `mutations` feature, a test can switch one on and assert that the simulation
//! finds the violation it causes. Without the feature every switch is a constant
//! `false`, so production builds carry neither the switches nor the branches.

#[cfg(feature = "mutations")]
mod switches {
    use std::sync::atomic::{AtomicBool, Ordering};

    static DISABLE_FENCING: AtomicBool = AtomicBool::new(false);
    static UNCONDITIONAL_CLAIM: AtomicBool = AtomicBool::new(false);
    static COMPENSATE_PAST_PIVOT: AtomicBool = AtomicBool::new(false);
    static FORGET_OUTPUTS: AtomicBool = AtomicBool::new(false);
    static NEWEST_VERSION: AtomicBool = AtomicBool::new(false);
    static OPERATOR_BLIND_WRITE: AtomicBool = AtomicBool::new(false);
    static RESUBMIT_AFTER_UNDO: AtomicBool = AtomicBool::new(false);
    static CANCEL_FROM_ANY_SENDER: AtomicBool = AtomicBool::new(false);
    static WAKE_EARLY: AtomicBool = AtomicBool::new(false);
    static ACCEPT_OLD_TOKENS: AtomicBool = AtomicBool::new(false);
    static CLAIM_WHILE_PAUSED: AtomicBool = AtomicBool::new(false);
    static SWEEP_SKIPS_TIMERS: AtomicBool = AtomicBool::new(false);
    static JOIN_EARLY: AtomicBool = AtomicBool::new(false);
    static UNDO_EVERY_BRANCH: AtomicBool = AtomicBool::new(false);
    static GATE_BLIND_WRITE: AtomicBool = AtomicBool::new(false);
    static TICKETS_LEFT_BEHIND: AtomicBool = AtomicBool::new(false);
    static THROTTLED_FOREVER: AtomicBool = AtomicBool::new(false);
    static HEARTBEAT_NO_SLACK: AtomicBool = AtomicBool::new(false);
    static HEARTBEAT_EVERY_WRITE: AtomicBool = AtomicBool::new(false);
    static WHOLE_LIMITS_PER_GATE: AtomicBool = AtomicBool::new(false);
    static KEY_GATE_SKIPPED: AtomicBool = AtomicBool::new(false);
    static COPIES_CALLED: AtomicBool = AtomicBool::new(false);
    static STAGE_WITHOUT_PLACE: AtomicBool = AtomicBool::new(false);
    static BY_HAND_UNRECORDED: AtomicBool = AtomicBool::new(false);
    static STORE_WAIT_SHORT: AtomicBool = AtomicBool::new(false);
    static GATE_CHANGES_FROM_READ: AtomicBool = AtomicBool::new(false);
    static MAP_OVER_CAP: AtomicBool = AtomicBool::new(false);
    static ITEM_KEYS_SHARED: AtomicBool = AtomicBool::new(false);
    static UNDO_REFUSED_ITEMS: AtomicBool = AtomicBool::new(false);
    static ITEMS_AROUND_GATE: AtomicBool = AtomicBool::new(false);

    /// A planted bug, process-wide: tests that switch one on must not share a process
    /// with tests that expect the real behaviour.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Mutation {
        /// `TaskRecord::fence` accepts every reply.
        DisableFencing,
        /// `TaskRecord::claim` ignores the state and lease, and the embedded store writes
        /// a claim whatever the stored revision: a claim as a plain overwrite.
        UnconditionalClaim,
        /// Giving up ignores pivots: it compensates whatever can be undone and may end
        /// Compensated while a pivot's effect stands (the behaviour before pivots).
        CompensatePastPivot,
        /// A forward step is handed only the output of the step just before it.
        ForgetOutputs,
        /// A task runs on the newest version of its workflow its handler knows, not the
        /// version it is pinned to: the handlers look it up so, and neither the record's
        /// own check nor the agent's refuses the other version.
        NewestVersion,
        /// The embedded store writes an operator's action whatever the stored revision:
        /// two operators acting at once both land, the second on a task the first moved.
        OperatorBlindWrite,
        /// Resubmit accepts a task that stopped while undoing (a cancelled task whose
        /// compensation failed): it goes forward again after being cancelled.
        ResubmitAfterUndo,
        /// An app's cancel is not checked against the order's submitter: any sender
        /// that may write to the orders queue cancels any order.
        CancelFromAnySender,
        /// A Schedule wakes a waiting timer whatever its wake time: a duplicate of the
        /// Schedule that put it to sleep wakes it at once.
        WakeEarly,
        /// A callback token is checked for its order and step only: a completion with the
        /// token of an earlier attempt (or a forged one) applies.
        AcceptOldTokens,
        /// A claim ignores the pause: a paused task dispatches its next step.
        ClaimWhilePaused,
        /// The supervisor's sweep never wakes a waiting timer (its `recover` answers "not
        /// due"): only the timer's delayed Schedule does, so a wait past SQS's longest delay,
        /// or one whose Schedule was lost, never ends.
        SweepSkipsTimers,
        /// A parallel stage completes on the success of all its branches but one: the
        /// last branch's reply is never waited for.
        JoinEarly,
        /// Undoing a parallel stage compensates every branch that has a compensation,
        /// also those never dispatched or refused (which had no effect to undo).
        UndoEveryBranch,
        /// The embedded store writes an agent's gate whatever the stored revision: the
        /// check for room and the taking of a place are no longer one atomic step, so two
        /// schedulers that read the same last free place both take it.
        GateBlindWrite,
        /// A task that leaves an agent's line without taking its turn keeps its ticket
        /// in the gate (no `Effect::HandBack`): when its turn comes, a place is reserved
        /// for a task that will not come, and the live waiters behind it wait it out.
        TicketsLeftBehind,
        /// A throttled step never gives up: its throttle budget is ignored, and a remote
        /// that keeps answering 429 keeps the order cycling (the behaviour before budgets).
        ThrottledForever,
        /// A callback's heartbeat is due one interval after the last heartbeat written,
        /// without the floor's slack, while heartbeats within the floor are still left
        /// unwritten: a party beating every interval is lapsed after a beat that fell
        /// within the floor (the earlier attempt at the floor, reverted for this).
        HeartbeatNoSlack,
        /// Every heartbeat is written, however soon after the last one (the behaviour
        /// before the floor).
        HeartbeatEveryWrite,
        /// Each gate of an agent whose places are spread over several holds the agent's
        /// whole limits, not its share: together they let through more.
        WholeLimitsPerGate,
        /// A claim under a per-key limit takes no place in its key gate: a key's orders
        /// take as many of the agent's places as they find.
        KeyGateSkipped,
        /// A limited agent's request calls even when its call's mark was already there
        /// (`CallStart::AlreadyStarted`): a copy of the request that reached another
        /// container is called without a place (the behaviour before call marks).
        CopiesCalled,
        /// A parallel stage's claim takes no place for its branch on a limited agent
        /// (the behaviour before limited agents could run in stages).
        StageWithoutPlace,
        /// An operator's completion by hand is written without who gave it and why.
        ByHandUnrecorded,
        /// A claim the store throttles moves the task's deadline out by the pending
        /// timeout only, not past the backoff its Schedule waits: the supervisor would
        /// count the store's wait against the step.
        StoreWaitShort,
        /// Changes that land together at a gate each decide on the gate as read, not on
        /// the one the change before left: the write keeps the last change's gate only.
        GateChangesFromRead,
        /// A map dispatches one item more than its `max_concurrency`.
        MapOverCap,
        /// A map's items share one idempotency key (the item's index left out of it): the
        /// remote answers every item with the first one's effect.
        ItemKeysShared,
        /// Undoing a map undoes its refused items too (which had no effect to undo).
        UndoRefusedItems,
        /// A map over a limited agent sends its next item on an item's answer, under the
        /// lease, as a map over an agent without limits does: past the agent's gate.
        ItemsAroundGate,
    }

    impl Mutation {
        fn flag(self) -> &'static AtomicBool {
            match self {
                Mutation::DisableFencing => &DISABLE_FENCING,
                Mutation::UnconditionalClaim => &UNCONDITIONAL_CLAIM,
                Mutation::CompensatePastPivot => &COMPENSATE_PAST_PIVOT,
                Mutation::ForgetOutputs => &FORGET_OUTPUTS,
                Mutation::NewestVersion => &NEWEST_VERSION,
                Mutation::OperatorBlindWrite => &OPERATOR_BLIND_WRITE,
                Mutation::ResubmitAfterUndo => &RESUBMIT_AFTER_UNDO,
                Mutation::CancelFromAnySender => &CANCEL_FROM_ANY_SENDER,
                Mutation::WakeEarly => &WAKE_EARLY,
                Mutation::AcceptOldTokens => &ACCEPT_OLD_TOKENS,
                Mutation::ClaimWhilePaused => &CLAIM_WHILE_PAUSED,
                Mutation::SweepSkipsTimers => &SWEEP_SKIPS_TIMERS,
                Mutation::JoinEarly => &JOIN_EARLY,
                Mutation::UndoEveryBranch => &UNDO_EVERY_BRANCH,
                Mutation::GateBlindWrite => &GATE_BLIND_WRITE,
                Mutation::TicketsLeftBehind => &TICKETS_LEFT_BEHIND,
                Mutation::ThrottledForever => &THROTTLED_FOREVER,
                Mutation::HeartbeatNoSlack => &HEARTBEAT_NO_SLACK,
                Mutation::HeartbeatEveryWrite => &HEARTBEAT_EVERY_WRITE,
                Mutation::WholeLimitsPerGate => &WHOLE_LIMITS_PER_GATE,
                Mutation::KeyGateSkipped => &KEY_GATE_SKIPPED,
                Mutation::CopiesCalled => &COPIES_CALLED,
                Mutation::StageWithoutPlace => &STAGE_WITHOUT_PLACE,
                Mutation::ByHandUnrecorded => &BY_HAND_UNRECORDED,
                Mutation::StoreWaitShort => &STORE_WAIT_SHORT,
                Mutation::GateChangesFromRead => &GATE_CHANGES_FROM_READ,
                Mutation::MapOverCap => &MAP_OVER_CAP,
                Mutation::ItemKeysShared => &ITEM_KEYS_SHARED,
                Mutation::UndoRefusedItems => &UNDO_REFUSED_ITEMS,
                Mutation::ItemsAroundGate => &ITEMS_AROUND_GATE,
            }
        }
        pub fn set(self, on: bool) {
            self.flag().store(on, Ordering::SeqCst);
        }
        pub fn is_on(self) -> bool {
            // Kept in every binary that can plant a bug, for `scripts/check-no-mutations.sh`.
            std::hint::black_box(&super::COMPILED_IN);
            self.flag().load(Ordering::SeqCst)
        }
    }

    pub fn fencing_disabled() -> bool {
        Mutation::DisableFencing.is_on()
    }
    pub fn claim_unconditional() -> bool {
        Mutation::UnconditionalClaim.is_on()
    }
    pub fn compensate_past_pivot() -> bool {
        Mutation::CompensatePastPivot.is_on()
    }
    pub fn forget_outputs() -> bool {
        Mutation::ForgetOutputs.is_on()
    }
    pub fn newest_version() -> bool {
        Mutation::NewestVersion.is_on()
    }
    pub fn operator_blind_write() -> bool {
        Mutation::OperatorBlindWrite.is_on()
    }
    pub fn resubmit_after_undo() -> bool {
        Mutation::ResubmitAfterUndo.is_on()
    }
    pub fn cancel_from_any_sender() -> bool {
        Mutation::CancelFromAnySender.is_on()
    }
    pub fn wake_early() -> bool {
        Mutation::WakeEarly.is_on()
    }
    pub fn accept_old_tokens() -> bool {
        Mutation::AcceptOldTokens.is_on()
    }
    pub fn claim_while_paused() -> bool {
        Mutation::ClaimWhilePaused.is_on()
    }
    pub fn sweep_skips_timers() -> bool {
        Mutation::SweepSkipsTimers.is_on()
    }
    pub fn join_early() -> bool {
        Mutation::JoinEarly.is_on()
    }
    pub fn undo_every_branch() -> bool {
        Mutation::UndoEveryBranch.is_on()
    }
    pub fn gate_blind_write() -> bool {
        Mutation::GateBlindWrite.is_on()
    }
    pub fn tickets_left_behind() -> bool {
        Mutation::TicketsLeftBehind.is_on()
    }
    pub fn throttled_forever() -> bool {
        Mutation::ThrottledForever.is_on()
    }
    pub fn heartbeat_no_slack() -> bool {
        Mutation::HeartbeatNoSlack.is_on()
    }
    pub fn heartbeat_every_write() -> bool {
        Mutation::HeartbeatEveryWrite.is_on()
    }
    pub fn whole_limits_per_gate() -> bool {
        Mutation::WholeLimitsPerGate.is_on()
    }
    pub fn key_gate_skipped() -> bool {
        Mutation::KeyGateSkipped.is_on()
    }
    pub fn copies_called() -> bool {
        Mutation::CopiesCalled.is_on()
    }
    pub fn stage_without_place() -> bool {
        Mutation::StageWithoutPlace.is_on()
    }
    pub fn by_hand_unrecorded() -> bool {
        Mutation::ByHandUnrecorded.is_on()
    }
    pub fn store_wait_short() -> bool {
        Mutation::StoreWaitShort.is_on()
    }
    pub fn gate_changes_from_read() -> bool {
        Mutation::GateChangesFromRead.is_on()
    }
    pub fn map_over_cap() -> bool {
        Mutation::MapOverCap.is_on()
    }
    pub fn item_keys_shared() -> bool {
        Mutation::ItemKeysShared.is_on()
    }
    pub fn undo_refused_items() -> bool {
        Mutation::UndoRefusedItems.is_on()
    }
    pub fn items_around_gate() -> bool {
        Mutation::ItemsAroundGate.is_on()
    }
}

#[cfg(feature = "mutations")]
pub use switches::*;

/// In every binary built with the feature, and in no other: `scripts/check-no-mutations.sh`
/// and `scripts/package.sh` refuse a function binary that holds it.
#[cfg(feature = "mutations")]
pub static COMPILED_IN: [u8; 32] = *b"sas-planted-bugs-are-compiled-in";

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn fencing_disabled() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn claim_unconditional() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn compensate_past_pivot() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn forget_outputs() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn newest_version() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn operator_blind_write() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn resubmit_after_undo() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn cancel_from_any_sender() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn wake_early() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn accept_old_tokens() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn claim_while_paused() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn sweep_skips_timers() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn join_early() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn undo_every_branch() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn gate_blind_write() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn tickets_left_behind() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn throttled_forever() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn heartbeat_no_slack() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn heartbeat_every_write() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn whole_limits_per_gate() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn key_gate_skipped() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn copies_called() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn stage_without_place() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn by_hand_unrecorded() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn store_wait_short() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn gate_changes_from_read() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn map_over_cap() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn item_keys_shared() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn undo_refused_items() -> bool {
    false
}

#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub(crate) const fn items_around_gate() -> bool {
    false
}
