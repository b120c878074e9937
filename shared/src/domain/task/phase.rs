//! Where a task is, as one enum: each state of the lifecycle with exactly what the task
//! holds in it. A lease and its complete-by exist only while it is claimed, a wake time
//! only while a timer waits, a callback's wait only from its claim until its step ends, a
//! ticket only while it waits for a place, and nothing at all once it has ended but what
//! an Error keeps of a stopped stage. A record of another shape cannot be built.
//!
//! A decision works on a flat copy (`draft.rs`) and builds its next record from it
//! (`Draft::build`), which refuses a copy that fits no phase of its state.

use serde::{Deserialize, Serialize};

use super::branches::StageRun;
use crate::domain::callback::Awaiting;
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, Timestamp};
use crate::domain::lifecycle::ProcessState;

/// A claim's lease: the scheduler that holds the task and until when its agent may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// LockedBy: the token the agent's reply must echo.
    pub token: LeaseToken,
    pub complete_by: Timestamp,
}

/// A task that waits for a claim (Pending, or Compensating and unclaimed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unclaimed {
    /// No claim before this (plus the reply grace): an attempt of a cancelled task, or
    /// branches of a stage that gave up, may still be running until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Timestamp>,
    /// Its place in the line of its step's agent's gate, while it waits for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<Ticket>,
}

/// What a Waiting task waits for: a timer's time, or the outside's word on a callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    Timer { wake_at: Timestamp },
    Callback(Awaiting),
}

/// A claim held while undoing, or the wait for one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    Leased(Lease),
    Unclaimed(Unclaimed),
}

/// The task's state and what it holds there. `due` is the deadline: when the supervisor
/// acts if nothing else has (every live phase has one, an ended one none, which keeps
/// ended tasks out of the sparse due index). `paused`: held by an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Pending {
        due: Timestamp,
        wait: Unclaimed,
        /// A stage's branches as they were left (its claim dispatches those not done).
        stage: Option<StageRun>,
        paused: bool,
    },
    Processing {
        due: Timestamp,
        lease: Lease,
        /// A callback step's wait, from its claim.
        callback: Option<Awaiting>,
        stage: Option<StageRun>,
        paused: bool,
    },
    /// Its deadline is when the wait ends: the wake time, or the callback's due time.
    Waiting {
        wait: WaitingFor,
        paused: bool,
    },
    Compensating {
        due: Timestamp,
        claim: Claim,
        /// The branches of a stage that gave up: which of them the undo covers.
        stage: Option<StageRun>,
        paused: bool,
    },
    Processed,
    /// A stage that gave up keeps its branches (a resubmit or an undo decides on them)
    /// and its hold while branches may still be out.
    Error {
        stage: Option<StageRun>,
        hold_until: Option<Timestamp>,
    },
    Compensated,
}

impl Phase {
    /// Waiting for a claim, due at `due`, holding nothing.
    pub fn pending(due: Timestamp) -> Phase {
        Phase::Pending { due, wait: Unclaimed::default(), stage: None, paused: false }
    }

    /// Claimed under `lease`, due at `due` (at least its complete-by plus the reply grace).
    pub fn processing(lease: Lease, due: Timestamp) -> Phase {
        Phase::Processing { due, lease, callback: None, stage: None, paused: false }
    }

    /// Undoing: claimed under `lease`, or waiting for a claim.
    pub fn compensating(lease: Option<Lease>, due: Timestamp) -> Phase {
        let claim = lease.map_or(Claim::Unclaimed(Unclaimed::default()), Claim::Leased);
        Phase::Compensating { due, claim, stage: None, paused: false }
    }

    /// Waiting for a timer or for the outside.
    pub fn waiting(wait: WaitingFor) -> Phase {
        Phase::Waiting { wait, paused: false }
    }

    /// Ended in `state`, holding nothing; `None` for a state that is not an end.
    pub fn ended(state: ProcessState) -> Option<Phase> {
        match state {
            ProcessState::Processed => Some(Phase::Processed),
            ProcessState::Error => Some(Phase::Error { stage: None, hold_until: None }),
            ProcessState::Compensated => Some(Phase::Compensated),
            _ => None,
        }
    }

    pub fn state(&self) -> ProcessState {
        match self {
            Phase::Pending { .. } => ProcessState::Pending,
            Phase::Processing { .. } => ProcessState::Processing,
            Phase::Waiting { .. } => ProcessState::Waiting,
            Phase::Compensating { .. } => ProcessState::Compensating,
            Phase::Processed => ProcessState::Processed,
            Phase::Error { .. } => ProcessState::Error,
            Phase::Compensated => ProcessState::Compensated,
        }
    }

    pub fn deadline(&self) -> Option<Timestamp> {
        match self {
            Phase::Pending { due, .. } | Phase::Processing { due, .. } | Phase::Compensating { due, .. } => {
                Some(*due)
            }
            Phase::Waiting { wait: WaitingFor::Timer { wake_at }, .. } => Some(*wake_at),
            Phase::Waiting { wait: WaitingFor::Callback(cb), .. } => Some(cb.due()),
            Phase::Processed | Phase::Error { .. } | Phase::Compensated => None,
        }
    }

    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Phase::Processing { lease, .. } | Phase::Compensating { claim: Claim::Leased(lease), .. } => {
                Some(lease)
            }
            _ => None,
        }
    }

    pub fn unclaimed(&self) -> Option<&Unclaimed> {
        match self {
            Phase::Pending { wait, .. } | Phase::Compensating { claim: Claim::Unclaimed(wait), .. } => {
                Some(wait)
            }
            _ => None,
        }
    }

    pub fn hold_until(&self) -> Option<Timestamp> {
        match self {
            Phase::Error { hold_until, .. } => *hold_until,
            _ => self.unclaimed().and_then(|u| u.hold_until),
        }
    }

    pub fn queued(&self) -> Option<&Ticket> {
        self.unclaimed().and_then(|u| u.queued.as_ref())
    }

    pub fn wake_at(&self) -> Option<Timestamp> {
        match self {
            Phase::Waiting { wait: WaitingFor::Timer { wake_at }, .. } => Some(*wake_at),
            _ => None,
        }
    }

    pub fn callback(&self) -> Option<&Awaiting> {
        match self {
            Phase::Processing { callback, .. } => callback.as_ref(),
            Phase::Waiting { wait: WaitingFor::Callback(cb), .. } => Some(cb),
            _ => None,
        }
    }

    pub fn stage(&self) -> Option<&StageRun> {
        match self {
            Phase::Pending { stage, .. }
            | Phase::Processing { stage, .. }
            | Phase::Compensating { stage, .. }
            | Phase::Error { stage, .. } => stage.as_ref(),
            _ => None,
        }
    }

    pub fn paused(&self) -> bool {
        match self {
            Phase::Pending { paused, .. }
            | Phase::Processing { paused, .. }
            | Phase::Waiting { paused, .. }
            | Phase::Compensating { paused, .. } => *paused,
            _ => false,
        }
    }
}
