//! Where a task is, as one enum: each state of the lifecycle with exactly what the task
//! holds in it. A lease and its complete-by exist only while it is claimed, a wake time
//! only while a timer waits, a callback's wait only from its claim until its step ends, a
//! ticket only while it waits for a place, and nothing at all once it has ended but what
//! an Error keeps of a stopped stage. A record of another shape cannot be built.
//!
//! A decision works on a flat copy (`draft.rs`) and builds its next record here
//! (`Draft::build`), which refuses a copy that does not fit its state's phase.

use serde::{Deserialize, Serialize};

use super::branches::StageRun;
use super::draft::Draft;
use super::outcome::Refusal;
use super::record::TaskRecord;
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

    /// The phase a flat draft describes, or why it describes none: the shape rules
    /// that types state.
    pub(super) fn of(d: &Draft) -> Result<Phase, String> {
        let s = d.state;
        let lease = match (d.locked_by, d.complete_by) {
            (Some(token), Some(complete_by)) => Some(Lease { token, complete_by }),
            (None, None) => None,
            _ => return Err("LockedBy and CompleteBy disagree".into()),
        };
        let due = || d.deadline.ok_or_else(|| format!("{s:?} with deadline None"));
        let none = |what: &str, held: bool| if held { Err(format!("{s:?} {what}")) } else { Ok(()) };
        let unclaimed = || Unclaimed { hold_until: d.hold_until, queued: d.queued.clone() };
        if !matches!(s, ProcessState::Pending | ProcessState::Compensating | ProcessState::Error) {
            none("held for a cancelled attempt", d.hold_until.is_some())?;
        }
        if s != ProcessState::Waiting {
            none(&format!("with wake time {:?}", d.wake_at), d.wake_at.is_some())?;
        }
        if !matches!(s, ProcessState::Processing | ProcessState::Waiting) {
            none("holding a callback", d.callback.is_some())?;
        }
        if !matches!(s, ProcessState::Pending | ProcessState::Compensating) || lease.is_some() {
            none("waiting for a place in a gate", d.queued.is_some())?;
        }
        if !matches!(s, ProcessState::Processing | ProcessState::Compensating) {
            none("holding a lease", lease.is_some())?;
        }
        if s.is_terminal() {
            none(&format!("with deadline {:?}", d.deadline), d.deadline.is_some())?;
            none("and paused", d.paused)?;
            if s != ProcessState::Error {
                none("keeping a stage's branches", d.stage.is_some())?;
            }
        }
        let (stage, paused) = (d.stage.clone(), d.paused);
        Ok(match s {
            ProcessState::Pending => Phase::Pending { due: due()?, wait: unclaimed(), stage, paused },
            ProcessState::Processing => Phase::Processing {
                due: due()?,
                lease: lease.ok_or("Processing without a lease")?,
                callback: d.callback.clone(),
                stage,
                paused,
            },
            ProcessState::Waiting => {
                none("keeping a stage's branches", stage.is_some())?;
                let wait = match (d.wake_at, &d.callback) {
                    (Some(wake_at), None) => WaitingFor::Timer { wake_at },
                    (None, Some(cb)) => WaitingFor::Callback(cb.clone()),
                    _ => return Err("Waiting for neither (or both) a timer and a callback".into()),
                };
                let phase = Phase::Waiting { wait, paused };
                if phase.deadline() != d.deadline {
                    return Err(format!(
                        "Waiting until {:?} with deadline {:?}",
                        phase.deadline(),
                        d.deadline
                    ));
                }
                phase
            }
            ProcessState::Compensating => {
                if lease.is_some() {
                    none("held for a cancelled attempt", d.hold_until.is_some())?;
                }
                let claim = match lease {
                    Some(lease) => Claim::Leased(lease),
                    None => Claim::Unclaimed(unclaimed()),
                };
                Phase::Compensating { due: due()?, claim, stage, paused }
            }
            ProcessState::Processed => Phase::Processed,
            ProcessState::Error => Phase::Error { stage, hold_until: d.hold_until },
            ProcessState::Compensated => Phase::Compensated,
        })
    }
}

impl Draft {
    /// The record this draft describes. A draft that breaks the record's shape is a bug
    /// in the decision that made it: refused as a corrupt record, so nothing is written.
    pub(in crate::domain) fn build(self) -> Result<TaskRecord, Refusal> {
        let corrupt = |workflow: &str, why: String| Refusal::Corrupt { workflow: workflow.to_owned(), why };
        let phase = Phase::of(&self).map_err(|why| corrupt(&self.workflow, why))?;
        let record = TaskRecord {
            order_id: self.order_id,
            workflow: self.workflow,
            workflow_version: self.workflow_version,
            order: self.order,
            step: self.step,
            step_attempts: self.step_attempts,
            attempt: self.attempt,
            phase,
            redo_until: self.redo_until,
            failure_count: self.failure_count,
            step_failures: self.step_failures,
            reply_to: self.reply_to,
            submitter: self.submitter,
            outputs: self.outputs,
            last_cause: self.last_cause,
            last_error: self.last_error,
            timeline: self.timeline,
            timeline_dropped: self.timeline_dropped,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
        };
        match record.shape_violation() {
            Some(why) => Err(corrupt(&record.workflow, why)),
            None => Ok(record),
        }
    }
}

impl TaskRecord {
    /// The flat working copy a decision starts from.
    pub(in crate::domain) fn draft(&self) -> Draft {
        let p = &self.phase;
        let lease = p.lease();
        Draft {
            order_id: self.order_id.clone(),
            workflow: self.workflow.clone(),
            workflow_version: self.workflow_version,
            order: self.order.clone(),
            state: p.state(),
            step: self.step,
            step_attempts: self.step_attempts,
            attempt: self.attempt,
            locked_by: lease.map(|l| l.token),
            complete_by: lease.map(|l| l.complete_by),
            hold_until: p.hold_until(),
            redo_until: self.redo_until,
            wake_at: p.wake_at(),
            callback: p.callback().cloned(),
            queued: p.queued().cloned(),
            stage: p.stage().cloned(),
            deadline: p.deadline(),
            failure_count: self.failure_count,
            step_failures: self.step_failures,
            reply_to: self.reply_to.clone(),
            submitter: self.submitter.clone(),
            paused: p.paused(),
            outputs: self.outputs.clone(),
            last_cause: self.last_cause.clone(),
            last_error: self.last_error.clone(),
            timeline: self.timeline.clone(),
            timeline_dropped: self.timeline_dropped,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}
