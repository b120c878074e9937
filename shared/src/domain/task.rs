//! The task record (the state table's row) and the decisions that move it.
//!
//! Each decision is a pure function of the record as read, the event, the time and the
//! workflow. It returns the next record and the effects to perform after the write.
//! The store writes the next record only if the row still has the revision that was
//! read, so a decision made on a stale read can never land: that one conditional
//! write is what makes claims exclusive, replies fenced and recoveries happen once.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ids::{IdempotencyKey, LeaseToken, OrderId, Timestamp};
use super::lifecycle::{self, ProcessState, Trigger};
use super::messages::{AgentReply, OperatorAlert, Order, OrderStatus, ReplyOutcome, cut_reason};
use super::output::{Outputs, StepOutput};
use super::retry::Backoff;
use super::timeline::{self, Entry, Happened};
use super::workflow::{Action, Workflow, idempotency_key};

/// Timing and limits that decisions need; read once from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// A claim's complete-by is this far after the claim.
    pub step_timeout_ms: u64,
    /// Time allowed after complete-by for a reply to travel before the supervisor acts.
    pub reply_grace_ms: u64,
    /// A waiting (unclaimed) task is due this long after it started waiting.
    pub pending_timeout_ms: u64,
    /// Lapses of one step before giving up (its forward action and its compensation
    /// each get this budget), for steps that set no `max_failures` of their own.
    pub failure_threshold: u32,
    /// Delay before a recovered task is scheduled again.
    pub retry_backoff: Backoff,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            step_timeout_ms: 30_000,
            reply_grace_ms: 10_000,
            pending_timeout_ms: 60_000,
            failure_threshold: 5,
            retry_backoff: Backoff { base_ms: 1_000, cap_ms: 60_000 },
        }
    }
}

/// Why the record last changed; the history of a task is the sequence of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    Submitted,
    Claimed {
        step: u32,
        action: Action,
    },
    Succeeded {
        step: u32,
        action: Action,
    },
    Failed {
        step: u32,
        action: Action,
        reason: String,
        /// The step answered, but its answer leaves its effect in doubt (an output that
        /// cannot be kept): a refusal has this false, and the step had no effect. Stored
        /// only when false: a record written before the field existed reads as in doubt,
        /// since a refusal and an unusable output then looked alike, and only "in doubt"
        /// can never undo around a pivot's effect.
        #[serde(default = "in_doubt_unless_stored", skip_serializing_if = "Clone::clone")]
        in_doubt: bool,
    },
    DeadlinePassed {
        step: u32,
        state: ProcessState,
    },
    /// An operator (or an app's cancel message) acted on the task at `step`.
    Operator {
        step: u32,
        act: Act,
    },
}

/// An operator's action, as recorded in the task's cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "act", rename_all = "snake_case")]
pub enum Act {
    Resubmit {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_step: Option<u32>,
    },
    Compensate,
    Cancel,
}

impl Act {
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Resubmit { .. } => "resubmit",
            Act::Compensate => "compensate",
            Act::Cancel => "cancel",
        }
    }
}

/// The state table's row. It carries the order it runs, so accepting an order is one
/// conditional write of one item and claiming a step reads the order with the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version of `workflow` the task was accepted under, and runs to its end
    /// whatever is published after.
    #[serde(default = "super::workflow::first_version")]
    pub workflow_version: u32,
    /// The validated order as accepted; never changes. Shared, because records are
    /// copied at every decision and the order is the largest part of them.
    pub order: Arc<Order>,
    pub state: ProcessState,
    /// Forward: the step to run next (or running). Compensating: the step being undone.
    pub step: u32,
    /// Claims of the current step: non-zero means its remote effect may have happened.
    pub step_attempts: u32,
    /// Claims of this task, all steps; echoed by agents and fenced on.
    pub attempt: u32,
    /// LockedBy: the live lease, if any.
    pub locked_by: Option<LeaseToken>,
    /// The live lease's complete-by.
    pub complete_by: Option<Timestamp>,
    /// The complete-by of the attempt in flight when the task was cancelled: its agent may
    /// call the service until then, so no claim comes before it plus the reply grace (the
    /// claiming scheduler's own grace, on its own clock), so the undo does not overtake
    /// the effect it undoes; a request held up in the network longer than that still can
    /// (docs/SIMULATION.md, "Open").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Timestamp>,
    /// Resubmitted from an earlier step than the one it failed at: the steps up to this
    /// one took effect (or may have) on the first way through. Until the task is past it,
    /// nothing is undone: a give-up stops in Error and a cancel is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo_until: Option<u32>,
    /// When the supervisor acts if nothing else has. `None` exactly when terminal,
    /// which keeps finished tasks out of the sparse due index.
    pub deadline: Option<Timestamp>,
    /// Only grows.
    pub failure_count: u32,
    /// Lapses of the current step in the current direction: its failure budget's use.
    /// Starts again at zero when the task moves to another step or starts undoing.
    #[serde(default)]
    pub step_failures: u32,
    pub reply_to: Option<String>,
    /// The outputs of the forward steps that succeeded, by step name (`output.rs`).
    #[serde(default, skip_serializing_if = "Outputs::is_empty")]
    pub outputs: Outputs,
    pub last_cause: Cause,
    pub last_error: Option<String>,
    /// The newest moves and operator actions, oldest first (`timeline.rs`).
    #[serde(default)]
    pub timeline: Vec<Entry>,
    /// Older entries let go to keep the record small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timeline_dropped: u32,
    /// Bumped by every write; every write is conditional on the revision it read.
    pub revision: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Something to do once the decision's write has landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the agent request for the claimed step.
    Dispatch {
        step: u32,
        action: Action,
    },
    /// Put a `Schedule` message on the scheduler's queue.
    Schedule {
        delay_ms: u64,
    },
    /// Tell `reply_to`, if the order named one.
    Status {
        status: OrderStatus,
        step: Option<String>,
        reason: Option<String>,
    },
    Alert(OperatorAlert),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub trigger: Trigger,
    pub next: TaskRecord,
    pub effects: Vec<Effect>,
}

/// Why a decision was refused: each is an expected outcome, not a fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("claim lost: task is {state:?} and {}", if *.locked { "locked" } else { "unlocked" })]
    ClaimLost { state: ProcessState, locked: bool },
    #[error("stale reply: {0}")]
    StaleReply(StaleReason),
    /// Not claimable yet: held after a cancel until the cancelled attempt is over.
    #[error("held until {until}: the cancelled attempt may still be running")]
    Held { until: Timestamp },
    #[error("not due: deadline {deadline:?} is after {now}")]
    NotDue { deadline: Option<Timestamp>, now: Timestamp },
    #[error("task record does not fit workflow {workflow:?}: {why}")]
    Corrupt { workflow: String, why: String },
    /// An operator's action that does not apply to the task as it is: nothing changed.
    #[error("cannot {act} a task that is {state}: {why}")]
    NotAllowed { act: &'static str, state: &'static str, why: String },
}

fn in_doubt_unless_stored() -> bool {
    true
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StaleReason {
    #[error("task is {0:?} with no live lease")]
    NoLease(ProcessState),
    #[error("the lease was superseded")]
    OtherLease,
    #[error("reply is for attempt {reply}, task is at attempt {current}")]
    OtherAttempt { current: u32, reply: u32 },
    #[error("reply is for step {reply} ({reply_action:?}), task is at step {current}")]
    OtherStep { current: u32, reply: u32, reply_action: Action },
    #[error("reply arrived at {now}, after complete-by {complete_by}")]
    PastCompleteBy { complete_by: Timestamp, now: Timestamp },
}

impl TaskRecord {
    pub fn new(order: &Order, reply_to: Option<String>, now: Timestamp, policy: &Policy) -> TaskRecord {
        TaskRecord {
            order_id: order.order_id.clone(),
            workflow: order.workflow.clone(),
            workflow_version: 1,
            order: Arc::new(order.clone()),
            state: ProcessState::Pending,
            step: 0,
            step_attempts: 0,
            attempt: 0,
            locked_by: None,
            complete_by: None,
            hold_until: None,
            redo_until: None,
            deadline: Some(now.plus_ms(policy.pending_timeout_ms)),
            failure_count: 0,
            step_failures: 0,
            reply_to,
            outputs: Outputs::new(),
            last_cause: Cause::Submitted,
            last_error: None,
            timeline: vec![Entry {
                at: now,
                what: Happened::Submitted,
                step: 0,
                attempt: 0,
                note: None,
                by: None,
            }],
            timeline_dropped: 0,
            revision: 1,
            created_at: now,
            updated_at: now,
        }
    }

    /// The action the current step runs in: compensation undoes, everything else does.
    pub fn action(&self) -> Action {
        if matches!(self.state, ProcessState::Compensating | ProcessState::Compensated) {
            Action::Undo
        } else {
            Action::Do
        }
    }

    /// The shape rules every record obeys; the checkers and tests hold all writes to them.
    pub fn shape_violation(&self) -> Option<String> {
        let s = self.state;
        if s.is_terminal() != self.deadline.is_none() {
            return Some(format!("{s:?} with deadline {:?}", self.deadline));
        }
        if self.locked_by.is_some() != self.complete_by.is_some() {
            return Some("LockedBy and CompleteBy disagree".into());
        }
        if s == ProcessState::Processing && self.locked_by.is_none() {
            return Some("Processing without a lease".into());
        }
        if !matches!(s, ProcessState::Processing | ProcessState::Compensating) && self.locked_by.is_some() {
            return Some(format!("{s:?} holding a lease"));
        }
        if self.hold_until.is_some() && (s != ProcessState::Compensating || self.locked_by.is_some()) {
            return Some(format!("{s:?} held for a cancelled attempt"));
        }
        None
    }

    pub(super) fn moved(
        &self,
        trigger: Trigger,
        now: Timestamp,
        cause: Cause,
    ) -> Result<TaskRecord, Refusal> {
        let state = lifecycle::next(self.state, trigger).ok_or_else(|| Refusal::Corrupt {
            workflow: self.workflow.clone(),
            why: format!("no transition {:?} --{trigger:?}-->", self.state),
        })?;
        let mut next = self.clone();
        next.state = state;
        if state != ProcessState::Compensating {
            next.hold_until = None;
        }
        next.revision += 1;
        next.updated_at = now;
        next.last_cause = cause;
        if state.is_terminal() {
            next.deadline = None;
        }
        Ok(next)
    }

    /// The planted bug of `Mutation::UnconditionalClaim`: a claim written as a plain
    /// overwrite (`SET state = Processing, LockedBy = :new`), ignoring the table.
    fn overwritten_by_claim(&self, now: Timestamp, cause: Cause) -> TaskRecord {
        let mut next = self.clone();
        if self.state != ProcessState::Compensating {
            next.state = ProcessState::Processing;
        }
        next.revision += 1;
        next.updated_at = now;
        next.last_cause = cause;
        next
    }

    pub(super) fn unlocked(mut self) -> TaskRecord {
        self.locked_by = None;
        self.complete_by = None;
        self
    }

    pub(super) fn waiting(mut self, now: Timestamp, delay_ms: u64, policy: &Policy) -> TaskRecord {
        self.deadline = Some(now.plus_ms(delay_ms).plus_ms(policy.pending_timeout_ms));
        self.unlocked()
    }

    pub(super) fn step_name(&self, wf: &Workflow, step: u32, action: Action) -> String {
        match (wf.step(step), action) {
            (Some(s), Action::Do) => s.name.clone(),
            (Some(s), Action::Undo) => s.compensation.clone().unwrap_or_else(|| s.name.clone()),
            (None, _) => format!("step-{step}"),
        }
    }

    pub(super) fn check_workflow(&self, wf: &Workflow) -> Result<(), Refusal> {
        let other_version = wf.version != self.workflow_version && !crate::mutations::newest_version();
        if wf.name != self.workflow || other_version || wf.step(self.step).is_none() {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!(
                    "workflow {:?} v{} has no step {} of a task pinned to v{}",
                    wf.name, wf.version, self.step, self.workflow_version
                ),
            });
        }
        Ok(())
    }

    /// Pinned to the version `wf` is (the latest, when an order is accepted).
    pub fn pinned_to(mut self, wf: &Workflow) -> TaskRecord {
        self.workflow_version = wf.version;
        self
    }

    /// `action` names what gave up, which the record after the move may no longer show
    /// (a failed compensation leaves the task in Error, a forward state).
    pub(super) fn alert(
        &self,
        wf: &Workflow,
        action: Action,
        now: Timestamp,
        reason: &str,
        in_doubt: Option<IdempotencyKey>,
    ) -> Effect {
        Effect::Alert(OperatorAlert {
            order_id: self.order_id.clone(),
            workflow: self.workflow.clone(),
            step: self.step,
            step_name: self.step_name(wf, self.step, action),
            state: self.state,
            failure_count: self.failure_count,
            reason: reason.to_owned(),
            idempotency_key: in_doubt,
            at: now,
        })
    }

    /// Scheduler: take the task for its current step (Pending, or Compensating and unlocked).
    pub fn claim(
        &self,
        lease: LeaseToken,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        self.logged(now, self.decide_claim(lease, now, wf, policy), None)
    }

    /// Every decision's record gets its timeline entry here, so no move goes unrecorded.
    /// `by`: who acted and why, for an operator's action.
    pub(super) fn logged(
        &self,
        now: Timestamp,
        decided: Result<Decision, Refusal>,
        by: Option<(&str, &str)>,
    ) -> Result<Decision, Refusal> {
        let mut d = decided?;
        let past_redo = d.next.redo_until.is_some_and(|u| d.next.step > u);
        if past_redo || matches!(d.next.state, ProcessState::Processed | ProcessState::Compensated) {
            d.next.redo_until = None;
        }
        let note = match by {
            Some((_, why)) => Some(why.to_owned()),
            None if d.next.last_error != self.last_error => d.next.last_error.clone(),
            None => match &d.next.last_cause {
                Cause::Failed { reason, .. } => Some(reason.clone()),
                _ => None,
            },
        };
        let entry = Entry {
            at: now,
            what: Happened::Moved(d.trigger),
            step: self.step,
            attempt: d.next.attempt,
            note,
            by: by.map(|(who, _)| who.to_owned()),
        };
        timeline::push(&mut d.next.timeline, &mut d.next.timeline_dropped, entry);
        Ok(d)
    }

    fn decide_claim(
        &self,
        lease: LeaseToken,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        let unconditional = crate::mutations::claim_unconditional();
        if !unconditional
            && (self.locked_by.is_some()
                || !matches!(self.state, ProcessState::Pending | ProcessState::Compensating))
        {
            return Err(Refusal::ClaimLost { state: self.state, locked: self.locked_by.is_some() });
        }
        if let Some(until) = self.hold_until.map(|h| h.plus_ms(policy.reply_grace_ms))
            && now < until
            && !unconditional
        {
            return Err(Refusal::Held { until });
        }
        self.check_workflow(wf)?;
        let action = self.action();
        let cause = Cause::Claimed { step: self.step, action };
        let mut next = if unconditional && lifecycle::next(self.state, Trigger::Claimed).is_none() {
            self.overwritten_by_claim(now, cause)
        } else {
            self.moved(Trigger::Claimed, now, cause)?
        };
        let complete_by = now.plus_ms(wf.timeout_ms(self.step, policy.step_timeout_ms));
        next.locked_by = Some(lease);
        next.complete_by = Some(complete_by);
        next.hold_until = None;
        // The deadline is the due index's key: moving it costs the index a delete and a
        // put. A waiting task's deadline usually covers the attempt already (the claim
        // comes milliseconds after the wait began, and the pending timeout is longer
        // than step timeout + grace), so it stays; it only moves when it would come
        // before the reply window closes. The fence uses complete-by, not the deadline.
        let needed = complete_by.plus_ms(policy.reply_grace_ms);
        if next.deadline.is_none_or(|d| d < needed) {
            next.deadline = Some(needed);
        }
        next.attempt += 1;
        next.step_attempts += 1;
        Ok(Decision {
            trigger: Trigger::Claimed,
            next,
            effects: vec![Effect::Dispatch { step: self.step, action }],
        })
    }

    /// The fence: the reply belongs to the live lease of this very attempt, in time.
    pub fn fence(&self, reply: &AgentReply, now: Timestamp) -> Result<(), StaleReason> {
        if crate::mutations::fencing_disabled() {
            return Ok(());
        }
        let lease = match (self.state, self.locked_by) {
            (ProcessState::Processing | ProcessState::Compensating, Some(lease)) => lease,
            (state, _) => return Err(StaleReason::NoLease(state)),
        };
        if lease != reply.lease {
            return Err(StaleReason::OtherLease);
        }
        if self.attempt != reply.attempt {
            return Err(StaleReason::OtherAttempt { current: self.attempt, reply: reply.attempt });
        }
        if self.step != reply.step || self.action() != reply.action {
            return Err(StaleReason::OtherStep {
                current: self.step,
                reply: reply.step,
                reply_action: reply.action,
            });
        }
        match self.complete_by {
            Some(complete_by) if now <= complete_by => Ok(()),
            complete_by => {
                Err(StaleReason::PastCompleteBy { complete_by: complete_by.unwrap_or_default(), now })
            }
        }
    }

    /// Scheduler: apply an agent's reply, if it passes the fence.
    pub fn apply_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        self.logged(now, self.decide_reply(reply, now, wf, policy), None)
    }

    fn decide_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        self.fence(reply, now).map_err(Refusal::StaleReply)?;
        self.check_workflow(wf)?;
        let (step, action) = (self.step, reply.action);
        let name = self.step_name(wf, step, action);
        match (&reply.outcome, action) {
            (ReplyOutcome::Succeeded { output }, Action::Do) => {
                let kept = match output.as_ref().map(StepOutput::from_value).transpose() {
                    Ok(kept) => kept,
                    Err(e) => {
                        let reason = format!("step {name} succeeded, but its output cannot be kept: {e}");
                        return self.bad_output(now, wf, policy, &reason, None);
                    }
                };
                let cause = Cause::Succeeded { step, action };
                let mut done = self.clone();
                if let Some(kept) = kept {
                    done.outputs.insert(name.clone(), kept);
                }
                if step + 1 < wf.len() {
                    let mut next = done.moved(Trigger::Advanced, now, cause)?.waiting(now, 0, policy);
                    next.step += 1;
                    next.step_attempts = 0;
                    next.step_failures = 0;
                    Ok(Decision {
                        trigger: Trigger::Advanced,
                        next,
                        effects: vec![
                            Effect::Schedule { delay_ms: 0 },
                            Effect::Status {
                                status: OrderStatus::StepCompleted,
                                step: Some(name),
                                reason: None,
                            },
                        ],
                    })
                } else {
                    let next = done.moved(Trigger::Finished, now, cause)?.unlocked();
                    Ok(Decision {
                        trigger: Trigger::Finished,
                        next,
                        effects: vec![Effect::Status {
                            status: OrderStatus::Processed,
                            step: Some(name),
                            reason: None,
                        }],
                    })
                }
            }
            // A compensation's answer is not kept: nothing runs after it that could use it.
            (ReplyOutcome::Succeeded { .. } | ReplyOutcome::BadOutput { .. }, Action::Undo) => {
                let cause = Cause::Succeeded { step, action };
                match wf.compensable_at_or_below(step.checked_sub(1)) {
                    Some(below) => {
                        let mut next = self.moved(Trigger::UndoAdvanced, now, cause)?.waiting(now, 0, policy);
                        next.step = below;
                        next.step_attempts = 0;
                        next.step_failures = 0;
                        Ok(Decision {
                            trigger: Trigger::UndoAdvanced,
                            next,
                            effects: vec![
                                Effect::Schedule { delay_ms: 0 },
                                Effect::Status {
                                    status: OrderStatus::StepUndone,
                                    step: Some(name),
                                    reason: None,
                                },
                            ],
                        })
                    }
                    None => {
                        let next = self.moved(Trigger::Undone, now, cause)?.unlocked();
                        Ok(Decision {
                            trigger: Trigger::Undone,
                            next,
                            effects: vec![Effect::Status {
                                status: OrderStatus::Compensated,
                                step: Some(name),
                                reason: None,
                            }],
                        })
                    }
                }
            }
            (ReplyOutcome::Failed { reason, detail }, Action::Do) => {
                // A queue worker's words are bounded here as the agent's are at the source.
                let (reason, detail) = (&cut_reason(reason.clone()), &detail.clone().map(cut_reason));
                let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt: false };
                // A refusal is definitive: this step had no effect, so only the ones
                // before it can stand.
                let why = Why { told: reason, detail: detail.as_deref() };
                self.give_up(now, wf, policy, cause, why, false, false)
            }
            (ReplyOutcome::BadOutput { reason, detail }, Action::Do) => {
                let reason =
                    cut_reason(format!("step {name} succeeded, but its output cannot be kept: {reason}"));
                self.bad_output(now, wf, policy, &reason, detail.clone().map(cut_reason).as_deref())
            }
            (ReplyOutcome::Failed { reason, detail }, Action::Undo) => {
                let (reason, detail) = (&cut_reason(reason.clone()), &detail.clone().map(cut_reason));
                let cause = Cause::Failed { step, action, reason: reason.clone(), in_doubt: false };
                let told = format!("compensation {name} failed: {reason}");
                self.fail(now, wf, cause, Why { told: &told, detail: detail.as_deref() })
            }
        }
    }

    /// The step answered success with an output later steps cannot have: it took effect,
    /// and asking again returns the same answer (the key is the same), so the task gives
    /// up at once with the step in doubt: its compensation runs if it has one, and a
    /// pivot leaves the task in Error naming its key.
    fn bad_output(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        reason: &str,
        detail: Option<&str>,
    ) -> Result<Decision, Refusal> {
        let cause =
            Cause::Failed { step: self.step, action: Action::Do, reason: reason.to_owned(), in_doubt: true };
        self.give_up(now, wf, policy, cause, Why { told: reason, detail }, true, true)
    }

    /// Supervisor: the deadline passed with nothing else moving the task.
    pub fn lapse(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision, Refusal> {
        self.logged(now, self.decide_lapse(now, wf, policy, jitter), None)
    }

    fn decide_lapse(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision, Refusal> {
        match self.deadline {
            Some(deadline) if deadline <= now => {}
            deadline => return Err(Refusal::NotDue { deadline, now }),
        }
        self.check_workflow(wf)?;
        let cause = Cause::DeadlinePassed { step: self.step, state: self.state };
        let mut counted = self.clone();
        counted.failure_count += 1;
        counted.step_failures += 1;
        let step_failures = counted.step_failures;
        let budget = wf.max_failures(self.step, policy.failure_threshold);
        counted.last_error = Some(match self.state {
            ProcessState::Processing | ProcessState::Compensating if self.locked_by.is_some() => {
                format!("attempt {} passed its deadline without a reply", self.attempt)
            }
            _ => "waited past its deadline without being claimed".to_owned(),
        });
        if step_failures < budget {
            let delay_ms = policy.retry_backoff.delay_ms(step_failures - 1, jitter);
            let next = counted.moved(Trigger::Retry, now, cause)?.waiting(now, delay_ms, policy);
            return Ok(Decision {
                trigger: Trigger::Retry,
                next,
                effects: vec![Effect::Schedule { delay_ms }],
            });
        }
        let reason =
            format!("failure threshold reached: {step_failures} failures of this step (threshold {budget})");
        match self.action() {
            // Dispatched at least once and never answered for good: it may have taken effect.
            Action::Do => {
                counted.give_up(now, wf, policy, cause, Why::plain(&reason), self.step_attempts > 0, true)
            }
            Action::Undo => counted.fail(now, wf, cause, Why::plain(&reason)),
        }
    }

    fn fail(&self, now: Timestamp, wf: &Workflow, cause: Cause, why: Why) -> Result<Decision, Refusal> {
        self.stop(Trigger::Fail, now, wf, cause, why, None)
    }

    /// Error with an alert and a `failed` status; `in_doubt` is the key of a step whose
    /// outcome is unknown, for the operator to look up at the remote side.
    fn stop(
        &self,
        trigger: Trigger,
        now: Timestamp,
        wf: &Workflow,
        cause: Cause,
        why: Why,
        in_doubt: Option<IdempotencyKey>,
    ) -> Result<Decision, Refusal> {
        let mut next = self.moved(trigger, now, cause)?.unlocked();
        let operator = why.for_operator();
        next.last_error = Some(operator.clone());
        let step = Some(self.step_name(wf, self.step, self.action()));
        Ok(Decision {
            trigger,
            effects: vec![
                next.alert(wf, self.action(), now, &operator, in_doubt),
                Effect::Status { status: OrderStatus::Failed, step, reason: Some(why.told.to_owned()) },
            ],
            next,
        })
    }

    /// Why giving up must not undo anything, if it must not: undoing would leave a
    /// pivot's effect standing under a `Compensated` that says nothing stands.
    /// `in_doubt`: the current step was dispatched without a definitive answer.
    pub(super) fn forward_only(
        &self,
        wf: &Workflow,
        reason: &str,
        in_doubt: bool,
    ) -> Option<(String, Option<IdempotencyKey>)> {
        if crate::mutations::compensate_past_pivot() {
            return None;
        }
        let key = in_doubt.then(|| idempotency_key(&self.order_id, self.step, Action::Do));
        if let Some(why) = self.redoing() {
            return Some((format!("{reason}; nothing undone: {why}"), key));
        }
        let current = wf.step(self.step)?;
        if let Some(pivot) = wf.pivot_before(self.step) {
            let pivot = &wf.step(pivot)?.name;
            let unknown = match &key {
                Some(key) => format!("; {} outcome unknown (idempotency key {key})", current.name),
                None => String::new(),
            };
            return Some((
                format!(
                    "{reason}; nothing undone: pivot step {pivot} took effect, so the task only goes forward{unknown}"
                ),
                key,
            ));
        }
        match key {
            Some(key) if current.is_pivot() => Some((
                format!(
                    "{reason}; nothing undone: pivot step {} outcome unknown (idempotency key {key})",
                    current.name
                ),
                Some(key),
            )),
            _ => None,
        }
    }

    /// Why the task only goes forward while it re-runs steps that took effect already.
    pub(super) fn redoing(&self) -> Option<String> {
        self.redo_until.filter(|u| self.step <= *u).map(|u| {
            format!(
                "it was resubmitted from an earlier step, and steps up to {u} took effect (or may have) before, so it only goes forward until it is past step {u}"
            )
        })
    }

    /// Stop going forward. A pivot that took effect, or may have (`in_doubt`: the current
    /// step was dispatched without a definitive answer), leaves the task in Error with
    /// nothing undone. Otherwise undo what may have taken effect, newest first, if the
    /// workflow compensates at all, else Error.
    #[allow(clippy::too_many_arguments)]
    fn give_up(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        cause: Cause,
        why: Why,
        in_doubt: bool,
        alert: bool,
    ) -> Result<Decision, Refusal> {
        if let Some((told, key)) = self.forward_only(wf, why.told, in_doubt) {
            return self.stop(Trigger::ForwardOnly, now, wf, cause, Why { told: &told, ..why }, key);
        }
        if !wf.compensates() {
            return self.fail(now, wf, cause, why);
        }
        let undo_from = if in_doubt { Some(self.step) } else { self.step.checked_sub(1) };
        let step = Some(self.step_name(wf, self.step, Action::Do));
        let (trigger, mut next, status) = match wf.compensable_at_or_below(undo_from) {
            Some(first) => {
                let mut next = self.moved(Trigger::Undo, now, cause)?.waiting(now, 0, policy);
                next.step = first;
                next.step_attempts = 0;
                next.step_failures = 0;
                (Trigger::Undo, next, OrderStatus::Compensating)
            }
            None => (
                Trigger::Undone,
                self.moved(Trigger::Undone, now, cause)?.unlocked(),
                OrderStatus::Compensated,
            ),
        };
        let operator = why.for_operator();
        next.last_error = Some(operator.clone());
        let mut effects = Vec::new();
        if trigger == Trigger::Undo {
            effects.push(Effect::Schedule { delay_ms: 0 });
        }
        effects.push(Effect::Status { status, step, reason: Some(why.told.to_owned()) });
        if alert {
            effects.push(next.alert(wf, next.action(), now, &operator, None));
        }
        Ok(Decision { trigger, next, effects })
    }
}

/// Why a task stops, in two registers: what the order's submitter is told (`reply_to`),
/// and what the operator and the record get, which adds the remote service's own words
/// when it gave any (they may name its internals, so they never reach the submitter).
#[derive(Debug, Clone, Copy)]
struct Why<'a> {
    told: &'a str,
    detail: Option<&'a str>,
}

impl<'a> Why<'a> {
    fn plain(told: &'a str) -> Why<'a> {
        Why { told, detail: None }
    }
    fn for_operator(&self) -> String {
        match self.detail {
            Some(detail) => format!("{} ({detail})", self.told),
            None => self.told.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Actor;
    use crate::domain::messages::LineItem;
    use crate::domain::workflow::{Step, StepKind};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const T0: Timestamp = Timestamp(1_000_000);

    fn policy() -> Policy {
        Policy {
            step_timeout_ms: 1_000,
            reply_grace_ms: 500,
            pending_timeout_ms: 2_000,
            failure_threshold: 3,
            retry_backoff: Backoff { base_ms: 100, cap_ms: 1_000 },
        }
    }

    fn lease(n: u128) -> LeaseToken {
        LeaseToken(uuid::Uuid::from_u128(n))
    }

    fn new_task(wf: &Workflow) -> TaskRecord {
        let order = Order {
            order_id: OrderId::parse("o-1").unwrap(),
            customer_id: "c-1".into(),
            items: vec![LineItem { sku: "A".into(), quantity: 1 }],
            workflow: wf.name.clone(),
            workflow_version: None,
        };
        let task = TaskRecord::new(&order, Some("status".into()), T0, &policy());
        assert_eq!(task.shape_violation(), None);
        task
    }

    /// Every decision the tests make goes through here: it must follow the table,
    /// keep the record's shape and bump the revision.
    fn checked(before: &TaskRecord, result: Result<Decision, Refusal>) -> Decision {
        let d = result.unwrap_or_else(|r| panic!("refused from {:?}: {r}", before.state));
        assert_eq!(lifecycle::next(before.state, d.trigger), Some(d.next.state), "{:?}", d.trigger);
        assert_eq!(d.next.shape_violation(), None, "{:?}", d.next);
        assert_eq!(d.next.revision, before.revision + 1);
        assert!(d.next.failure_count >= before.failure_count);
        d
    }

    fn claim(task: &TaskRecord, wf: &Workflow, n: u128, now: Timestamp) -> TaskRecord {
        checked(task, task.claim(lease(n), now, wf, &policy())).next
    }

    /// The reply the live lease's agent would send.
    fn reply_for(task: &TaskRecord, outcome: ReplyOutcome) -> AgentReply {
        AgentReply {
            order_id: task.order_id.clone(),
            step: task.step,
            action: task.action(),
            attempt: task.attempt,
            lease: task.locked_by.expect("a live lease"),
            outcome,
        }
    }

    fn ok() -> ReplyOutcome {
        ReplyOutcome::DONE
    }

    fn failed(reason: &str) -> ReplyOutcome {
        ReplyOutcome::Failed { reason: reason.into(), detail: None }
    }

    fn reply(task: &TaskRecord, wf: &Workflow, outcome: ReplyOutcome, now: Timestamp) -> Decision {
        checked(task, task.apply_reply(&reply_for(task, outcome), now, wf, &policy()))
    }

    fn lapse(task: &TaskRecord, wf: &Workflow, jitter: u64) -> Decision {
        let now = task.deadline.expect("non-terminal");
        checked(task, task.lapse(now, wf, &policy(), jitter))
    }

    /// Claim and succeed steps until the task sits Pending at `step`.
    fn pending_at(wf: &Workflow, step: u32) -> TaskRecord {
        let mut task = new_task(wf);
        for s in 0..step {
            task = claim(&task, wf, 100 + s as u128, T0);
            task = reply(&task, wf, ok(), T0).next;
        }
        assert_eq!((task.state, task.step), (ProcessState::Pending, step));
        task
    }

    fn alerts(d: &Decision) -> Vec<&OperatorAlert> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Alert(a) => Some(a),
                _ => None,
            })
            .collect()
    }

    fn statuses(d: &Decision) -> Vec<OrderStatus> {
        d.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Status { status, .. } => Some(*status),
                _ => None,
            })
            .collect()
    }

    // ---- claim ----

    #[test]
    fn claim_from_pending_takes_a_lease_until_complete_by() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        let now = T0.plus_ms(10);
        let d = checked(&task, task.claim(lease(1), now, &wf, &policy()));
        assert_eq!(d.trigger, Trigger::Claimed);
        assert_eq!(d.next.state, ProcessState::Processing);
        assert_eq!(d.next.locked_by, Some(lease(1)));
        assert_eq!(d.next.complete_by, Some(now.plus_ms(1_000)));
        // The pending deadline (T0 + 2000) covers complete-by + grace (T0 + 1510): kept.
        assert_eq!(d.next.deadline, task.deadline);
        assert_eq!((d.next.attempt, d.next.step_attempts, d.next.step), (1, 1, 0));
        assert_eq!(d.next.last_cause, Cause::Claimed { step: 0, action: Action::Do });
        assert_eq!(d.next.updated_at, now);
        assert_eq!(d.effects, vec![Effect::Dispatch { step: 0, action: Action::Do }]);
    }

    #[test]
    fn a_late_claim_moves_the_deadline_to_cover_its_reply_window() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        for (after_ms, deadline) in
            [(0, T0.plus_ms(2_000)), (500, T0.plus_ms(2_000)), (501, T0.plus_ms(2_001))]
        {
            let now = T0.plus_ms(after_ms);
            let d = checked(&task, task.claim(lease(1), now, &wf, &policy()));
            assert_eq!(d.next.deadline, Some(deadline), "claimed {after_ms} ms after submission");
            assert!(d.next.deadline >= d.next.complete_by.map(|c| c.plus_ms(500)));
        }
    }

    /// A queue worker's reply did not come through an agent that bounds its words: a
    /// reason of any length is cut before it reaches the record, the alert or reply_to.
    #[test]
    fn a_long_reason_from_a_reply_is_cut() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 1), &wf, 1, T0);
        let long = "x".repeat(200_000);
        let outcome = ReplyOutcome::Failed { reason: long.clone(), detail: Some(long.clone()) };
        let d = reply(&task, &wf, outcome, T0);
        let last_error = d.next.last_error.clone().unwrap();
        assert!(last_error.len() <= 3 * crate::domain::MAX_REASON_BYTES, "{} bytes", last_error.len());
        assert!(
            matches!(&d.next.last_cause, Cause::Failed { reason, .. } if reason.len() <= crate::domain::MAX_REASON_BYTES)
        );
        let bad = ReplyOutcome::BadOutput { reason: long.clone(), detail: None };
        let d = reply(&task, &wf, bad, T0);
        assert!(d.next.last_error.unwrap().len() <= 2 * crate::domain::MAX_REASON_BYTES);
    }

    #[test]
    fn claim_from_unlocked_compensating_dispatches_the_undo() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 1), &wf, 1, T0);
        let compensating = reply(&task, &wf, failed("declined"), T0).next;
        assert_eq!((compensating.state, compensating.step), (ProcessState::Compensating, 0));
        assert_eq!(compensating.locked_by, None);
        let d = checked(&compensating, compensating.claim(lease(2), T0, &wf, &policy()));
        assert_eq!(d.trigger, Trigger::Claimed);
        assert_eq!(d.next.state, ProcessState::Compensating);
        assert_eq!(d.next.locked_by, Some(lease(2)));
        assert_eq!(d.next.step_attempts, 1);
        assert_eq!(d.next.attempt, compensating.attempt + 1);
        assert_eq!(d.effects, vec![Effect::Dispatch { step: 0, action: Action::Undo }]);
    }

    #[test]
    fn claim_is_refused_when_locked_or_terminal() {
        let wf = Workflow::three_step();
        let processing = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!(
            processing.claim(lease(2), T0, &wf, &policy()),
            Err(Refusal::ClaimLost { state: ProcessState::Processing, locked: true })
        );
        // A lease that lapsed in time is still a lease until the supervisor takes it away.
        assert!(matches!(
            processing.claim(lease(2), T0.plus_ms(1_000_000), &wf, &policy()),
            Err(Refusal::ClaimLost { locked: true, .. })
        ));

        let compensating = reply(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        let locked = claim(&compensating, &wf, 2, T0);
        assert_eq!(
            locked.claim(lease(3), T0, &wf, &policy()),
            Err(Refusal::ClaimLost { state: ProcessState::Compensating, locked: true })
        );

        let processed = {
            let single = Workflow::single_step();
            let t = claim(&new_task(&single), &single, 1, T0);
            reply(&t, &single, ok(), T0).next
        };
        let error = {
            let single = Workflow::single_step();
            let t = claim(&new_task(&single), &single, 1, T0);
            reply(&t, &single, failed("no"), T0).next
        };
        let compensated = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("no"), T0).next;
        for (terminal, want) in [
            (processed, ProcessState::Processed),
            (error, ProcessState::Error),
            (compensated, ProcessState::Compensated),
        ] {
            assert_eq!(terminal.state, want);
            let wf = if want == ProcessState::Compensated {
                Workflow::three_step()
            } else {
                Workflow::single_step()
            };
            assert_eq!(
                terminal.claim(lease(9), T0, &wf, &policy()),
                Err(Refusal::ClaimLost { state: want, locked: false })
            );
        }
    }

    #[test]
    fn attempts_count_claims_of_the_task_and_of_the_step() {
        let wf = Workflow::three_step();
        let t = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!((t.attempt, t.step_attempts), (1, 1));
        let t = lapse(&t, &wf, 0).next;
        assert_eq!((t.attempt, t.step_attempts), (1, 1), "a retry keeps the counts");
        let t = claim(&t, &wf, 2, t.deadline.unwrap());
        assert_eq!((t.attempt, t.step_attempts), (2, 2));
        let now = t.complete_by.unwrap();
        let t = reply(&t, &wf, ok(), now).next;
        assert_eq!((t.step, t.attempt, t.step_attempts), (1, 2, 0), "a new step starts its own count");
        let t = claim(&t, &wf, 3, now);
        assert_eq!((t.step, t.attempt, t.step_attempts), (1, 3, 1));
    }

    #[test]
    fn claim_refuses_a_record_that_does_not_fit_its_workflow() {
        let task = new_task(&Workflow::three_step());
        assert!(matches!(
            task.claim(lease(1), T0, &Workflow::single_step(), &policy()),
            Err(Refusal::Corrupt { .. })
        ));
        let mut beyond = pending_at(&Workflow::three_step(), 2);
        beyond.step = 7;
        assert!(matches!(
            beyond.claim(lease(1), T0, &Workflow::three_step(), &policy()),
            Err(Refusal::Corrupt { .. })
        ));
    }

    // ---- the fence ----

    #[test]
    fn fence_refuses_every_reply_but_the_live_attempts_in_time() {
        let wf = Workflow::three_step();
        let pending = new_task(&wf);
        let task = claim(&pending, &wf, 1, T0);
        let good = reply_for(&task, ok());
        let complete_by = task.complete_by.unwrap();
        let stale = |r: &AgentReply, now: Timestamp, why: StaleReason| {
            assert_eq!(task.fence(r, now), Err(why.clone()));
            assert_eq!(task.apply_reply(r, now, &wf, &policy()), Err(Refusal::StaleReply(why)));
        };

        assert_eq!(task.fence(&good, T0), Ok(()));
        assert_eq!(task.fence(&good, complete_by), Ok(()), "complete-by itself is still in time");

        // No lease: the task waits (for instance after the supervisor took it back).
        assert_eq!(pending.fence(&good, T0), Err(StaleReason::NoLease(ProcessState::Pending)));
        assert_eq!(
            pending.apply_reply(&good, T0, &wf, &policy()),
            Err(Refusal::StaleReply(StaleReason::NoLease(ProcessState::Pending)))
        );
        let done = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("no"), T0).next;
        assert_eq!(done.fence(&good, T0), Err(StaleReason::NoLease(ProcessState::Compensated)));

        stale(&AgentReply { lease: lease(2), ..good.clone() }, T0, StaleReason::OtherLease);
        stale(
            &AgentReply { attempt: 2, ..good.clone() },
            T0,
            StaleReason::OtherAttempt { current: 1, reply: 2 },
        );
        stale(
            &AgentReply { attempt: 0, ..good.clone() },
            T0,
            StaleReason::OtherAttempt { current: 1, reply: 0 },
        );
        stale(
            &AgentReply { step: 1, ..good.clone() },
            T0,
            StaleReason::OtherStep { current: 0, reply: 1, reply_action: Action::Do },
        );
        stale(
            &AgentReply { action: Action::Undo, ..good.clone() },
            T0,
            StaleReason::OtherStep { current: 0, reply: 0, reply_action: Action::Undo },
        );
        let late = complete_by.plus_ms(1);
        stale(&good, late, StaleReason::PastCompleteBy { complete_by, now: late });
    }

    #[test]
    fn fence_in_compensation_refuses_a_forward_reply_for_the_same_step() {
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&pending_at(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        let task = claim(&compensating, &wf, 2, T0);
        let undo = reply_for(&task, ok());
        assert_eq!(undo.action, Action::Undo);
        assert_eq!(task.fence(&undo, T0), Ok(()));
        let forward = AgentReply { action: Action::Do, ..undo };
        assert_eq!(
            task.fence(&forward, T0),
            Err(StaleReason::OtherStep { current: 0, reply: 0, reply_action: Action::Do })
        );
    }

    // ---- replies ----

    #[test]
    fn success_advances_step_by_step_then_finishes() {
        let wf = Workflow::three_step();
        let mut task = new_task(&wf);
        let names = ["reserve-inventory", "charge-payment", "ship-order"];
        for (step, name) in names.iter().enumerate() {
            task = claim(&task, &wf, step as u128, T0.plus_ms(step as u64));
            let now = task.complete_by.unwrap();
            let d = reply(&task, &wf, ok(), now);
            assert_eq!(d.next.last_cause, Cause::Succeeded { step: step as u32, action: Action::Do });
            assert_eq!(d.next.locked_by, None);
            if step + 1 < names.len() {
                assert_eq!(d.trigger, Trigger::Advanced);
                assert_eq!(d.next.state, ProcessState::Pending);
                assert_eq!((d.next.step, d.next.step_attempts), (step as u32 + 1, 0));
                assert_eq!(d.next.deadline, Some(now.plus_ms(2_000)));
                assert_eq!(
                    d.effects,
                    vec![
                        Effect::Schedule { delay_ms: 0 },
                        Effect::Status {
                            status: OrderStatus::StepCompleted,
                            step: Some(name.to_string()),
                            reason: None
                        },
                    ]
                );
            } else {
                assert_eq!(d.trigger, Trigger::Finished);
                assert_eq!(d.next.state, ProcessState::Processed);
                assert_eq!(d.next.deadline, None);
                assert_eq!(
                    d.effects,
                    vec![Effect::Status {
                        status: OrderStatus::Processed,
                        step: Some("ship-order".into()),
                        reason: None
                    }]
                );
            }
            task = d.next;
        }
        assert_eq!(task.failure_count, 0);
    }

    #[test]
    fn single_step_success_finishes_at_once() {
        let wf = Workflow::single_step();
        let d = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, ok(), T0);
        assert_eq!(
            (d.trigger, d.next.state, d.next.deadline),
            (Trigger::Finished, ProcessState::Processed, None)
        );
    }

    #[test]
    fn permanent_failure_without_compensation_is_an_error_with_an_alert() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let d = reply(&task, &wf, failed("card declined"), T0.plus_ms(5));
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state, ProcessState::Error);
        assert_eq!((d.next.deadline, d.next.locked_by), (None, None));
        assert_eq!(d.next.failure_count, 0, "a refusal is an answer, not a lapse");
        assert!(d.next.last_error.as_deref().unwrap().contains("card declined"));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].order_id, task.order_id);
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(alerts[0].step_name, "process-order");
        assert!(alerts[0].reason.contains("card declined"));
        assert_eq!(alerts[0].at, T0.plus_ms(5));
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);
    }

    #[test]
    fn the_remote_services_own_words_reach_the_operator_not_the_submitter() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let outcome = ReplyOutcome::Failed {
            reason: "the remote service refused (HTTP 4xx)".into(),
            detail: Some("https://pay.internal/orders/process-order answered 403: no".into()),
        };
        let d = reply(&task, &wf, outcome, T0);
        let told = d.effects.iter().find_map(|e| match e {
            Effect::Status { reason, .. } => reason.clone(),
            _ => None,
        });
        assert_eq!(told.as_deref(), Some("the remote service refused (HTTP 4xx)"));
        let alerts = alerts(&d);
        assert!(alerts[0].reason.contains("answered 403"), "{}", alerts[0].reason);
        assert!(d.next.last_error.as_deref().unwrap().contains("answered 403"));
        assert_eq!(
            d.next.last_cause,
            Cause::Failed {
                step: 0,
                action: Action::Do,
                reason: "the remote service refused (HTTP 4xx)".into(),
                in_doubt: false
            }
        );
    }

    #[test]
    fn permanent_failure_at_the_first_step_has_nothing_to_undo() {
        let wf = Workflow::three_step();
        let d = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, failed("out of stock"), T0);
        assert_eq!(d.trigger, Trigger::Undone);
        assert_eq!(d.next.state, ProcessState::Compensated);
        assert_eq!(d.next.deadline, None);
        assert!(alerts(&d).is_empty(), "undoing is the planned outcome, not an operator's problem");
        assert_eq!(statuses(&d), vec![OrderStatus::Compensated]);
    }

    #[test]
    fn permanent_failure_compensates_completed_steps_in_reverse_order() {
        let wf = Workflow::three_step();
        let task = claim(&pending_at(&wf, 2), &wf, 1, T0);
        let d = reply(&task, &wf, failed("address rejected"), T0);
        assert_eq!(d.trigger, Trigger::Undo);
        let mut task = d.next;
        // Step 2 (ship-order) refused, so it had no effect and has no compensation:
        // undoing starts at step 1.
        assert_eq!((task.state, task.step, task.step_attempts), (ProcessState::Compensating, 1, 0));
        assert_eq!(task.step_failures, 0);
        assert_eq!(task.locked_by, None);
        assert_eq!(
            d.effects,
            vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status {
                    status: OrderStatus::Compensating,
                    step: Some("ship-order".into()),
                    reason: Some("address rejected".into())
                },
            ]
        );

        let mut undone = Vec::new();
        loop {
            let claimed = checked(&task, task.claim(lease(50 + undone.len() as u128), T0, &wf, &policy()));
            assert_eq!(claimed.effects, vec![Effect::Dispatch { step: task.step, action: Action::Undo }]);
            let d = reply(&claimed.next, &wf, ok(), T0);
            undone.push(task.step);
            task = d.next;
            match d.trigger {
                Trigger::UndoAdvanced => {
                    assert_eq!(task.state, ProcessState::Compensating);
                    assert_eq!(
                        d.effects,
                        vec![
                            Effect::Schedule { delay_ms: 0 },
                            Effect::Status {
                                status: OrderStatus::StepUndone,
                                step: Some("refund-payment".into()),
                                reason: None
                            },
                        ]
                    );
                }
                Trigger::Undone => {
                    assert_eq!(task.state, ProcessState::Compensated);
                    assert_eq!(
                        d.effects,
                        vec![Effect::Status {
                            status: OrderStatus::Compensated,
                            step: Some("release-inventory".into()),
                            reason: None
                        }]
                    );
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(undone, vec![1, 0]);
        assert_eq!(task.deadline, None);
    }

    #[test]
    fn compensation_failure_is_an_error_with_an_alert() {
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&pending_at(&wf, 2), &wf, 1, T0), &wf, failed("no"), T0).next;
        let undoing = claim(&compensating, &wf, 2, T0);
        let d = reply(&undoing, &wf, failed("refund refused"), T0);
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state, ProcessState::Error);
        assert_eq!(d.next.deadline, None);
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert!(
            alerts[0].reason.contains("compensation refund-payment failed: refund refused"),
            "{alerts:?}"
        );
        // The operator is told what failed: the refund, not the charge it undoes.
        assert_eq!((alerts[0].step, alerts[0].step_name.as_str()), (1, "refund-payment"));
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);
    }

    // ---- lapse ----

    #[test]
    fn lapse_below_threshold_retries_with_backoff() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let now = task.deadline.unwrap();
        let d = checked(&task, task.lapse(now, &wf, &policy(), 7));
        let delay = policy().retry_backoff.delay_ms(0, 7);
        assert!(delay > 0);
        assert_eq!(d.trigger, Trigger::Retry);
        assert_eq!(d.next.state, ProcessState::Pending);
        assert_eq!((d.next.locked_by, d.next.complete_by), (None, None));
        assert_eq!(d.next.failure_count, 1);
        assert_eq!(d.next.deadline, Some(now.plus_ms(delay + 2_000)), "the deadline moves past the delay");
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: delay }]);
        assert_eq!(d.next.last_cause, Cause::DeadlinePassed { step: 0, state: ProcessState::Processing });
        assert!(d.next.last_error.as_deref().unwrap().contains("attempt 1"));

        // The second retry backs off further.
        let again = claim(&d.next, &wf, 2, d.next.deadline.unwrap());
        let d2 = lapse(&again, &wf, 7);
        assert_eq!(d2.next.failure_count, 2);
        assert_eq!(d2.effects, vec![Effect::Schedule { delay_ms: policy().retry_backoff.delay_ms(1, 7) }]);
    }

    #[test]
    fn lapse_of_an_unclaimed_task_retries_it() {
        let wf = Workflow::single_step();
        let task = new_task(&wf);
        let d = lapse(&task, &wf, 0);
        assert_eq!(
            (d.trigger, d.next.state, d.next.failure_count),
            (Trigger::Retry, ProcessState::Pending, 1)
        );
        assert!(d.next.last_error.as_deref().unwrap().contains("without being claimed"));
    }

    #[test]
    fn lapse_is_refused_when_not_due() {
        let wf = Workflow::single_step();
        let task = claim(&new_task(&wf), &wf, 1, T0);
        let deadline = task.deadline.unwrap();
        let early = Timestamp(deadline.0 - 1);
        assert_eq!(
            task.lapse(early, &wf, &policy(), 0),
            Err(Refusal::NotDue { deadline: Some(deadline), now: early })
        );
        // Past complete-by but within the reply grace: still not the supervisor's.
        assert!(task.lapse(task.complete_by.unwrap().plus_ms(1), &wf, &policy(), 0).is_err());
        let done = reply(&task, &wf, ok(), T0).next;
        let far = Timestamp(u64::MAX);
        assert_eq!(done.lapse(far, &wf, &policy(), 0), Err(Refusal::NotDue { deadline: None, now: far }));
    }

    /// Lapses (claiming in between when `claim_between`) until the decision is not a retry.
    fn lapse_to_threshold(mut task: TaskRecord, wf: &Workflow, claim_between: bool) -> Decision {
        for n in 0.. {
            if claim_between && task.state == ProcessState::Pending {
                task = claim(&task, wf, 1_000 + n, task.deadline.unwrap());
            }
            let d = lapse(&task, wf, n as u64);
            if d.trigger != Trigger::Retry {
                assert_eq!(d.next.failure_count, task.failure_count + 1);
                return d;
            }
            assert!(alerts(&d).is_empty(), "no alert below the threshold");
            task = d.next;
        }
        unreachable!()
    }

    #[test]
    fn lapse_at_threshold_single_step_is_an_error_with_one_alert() {
        let wf = Workflow::single_step();
        let d = lapse_to_threshold(new_task(&wf), &wf, true);
        // process-order is a pivot dispatched three times without an answer.
        assert_eq!(d.trigger, Trigger::ForwardOnly);
        assert_eq!(d.next.state, ProcessState::Error);
        assert_eq!(d.next.failure_count, 3);
        assert_eq!(d.next.attempt, 3);
        assert_eq!((d.next.deadline, d.next.locked_by), (None, None));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].failure_count, 3);
        assert!(alerts[0].reason.contains("failure threshold reached"));
        assert!(alerts[0].reason.contains("process-order outcome unknown (idempotency key o-1:0:do)"));
        assert_eq!(statuses(&d), vec![OrderStatus::Failed]);

        // Never dispatched: nothing can stand, and with nothing to undo it is a plain Error.
        let d = lapse_to_threshold(new_task(&wf), &wf, false);
        assert_eq!((d.trigger, d.next.state), (Trigger::Fail, ProcessState::Error));
        assert_eq!(self::alerts(&d).len(), 1);
        assert_eq!(self::alerts(&d)[0].idempotency_key, None);
    }

    #[test]
    fn lapse_at_threshold_compensates_the_in_flight_step_too() {
        let wf = Workflow::three_step();
        // Step 1 (charge-payment) was dispatched, so the charge may have happened.
        let d = lapse_to_threshold(pending_at(&wf, 1), &wf, true);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 1));
        assert_eq!((d.next.failure_count, d.next.step_failures), (3, 0), "undoing starts a fresh budget");
        assert_eq!(d.next.step_attempts, 0);
        assert_eq!(alerts(&d).len(), 1);
        assert!(d.effects.contains(&Effect::Schedule { delay_ms: 0 }));
        assert_eq!(statuses(&d), vec![OrderStatus::Compensating]);
    }

    #[test]
    fn lapse_at_threshold_of_an_undispatched_step_undoes_only_the_ones_before() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(pending_at(&wf, 1), &wf, false);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 0));
    }

    #[test]
    fn lapse_at_threshold_with_nothing_to_undo_is_compensated_directly() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(new_task(&wf), &wf, false);
        assert_eq!(d.trigger, Trigger::Undone);
        assert_eq!(d.next.state, ProcessState::Compensated);
        assert_eq!(d.next.deadline, None);
        assert_eq!(alerts(&d).len(), 1, "the operator still hears the order gave up");
        assert_eq!(statuses(&d), vec![OrderStatus::Compensated]);
    }

    #[test]
    fn compensation_has_its_own_failure_budget() {
        let wf = Workflow::three_step();
        let gave_up = lapse_to_threshold(pending_at(&wf, 1), &wf, true).next;
        assert_eq!((gave_up.state, gave_up.step), (ProcessState::Compensating, 1));
        assert_eq!((gave_up.failure_count, gave_up.step_failures), (3, 0));

        // The first compensation lapse is the phase's first failure: a retry with the
        // first backoff, not an instant Error because the forward phase used the budget.
        let claimed = claim(&gave_up, &wf, 77, gave_up.deadline.unwrap());
        let d = lapse(&claimed, &wf, 5);
        assert_eq!(d.trigger, Trigger::Retry);
        assert_eq!(d.next.state, ProcessState::Compensating);
        assert_eq!(d.next.locked_by, None);
        assert_eq!(d.next.failure_count, 4);
        assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: policy().retry_backoff.delay_ms(0, 5) }]);

        let d = lapse_to_threshold(d.next, &wf, true);
        assert_eq!(d.trigger, Trigger::Fail);
        assert_eq!(d.next.state, ProcessState::Error);
        assert_eq!(d.next.failure_count, 6, "three forward failures, then three compensation failures");
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].step_name, "refund-payment", "the compensation is what timed out");
    }

    // ---- pivots and per-step budgets ----

    /// Claims and succeeds steps of `wf` until the task waits at `step`.
    fn at_step(wf: &Workflow, step: u32) -> TaskRecord {
        pending_at(wf, step)
    }

    #[test]
    fn a_pivot_in_doubt_at_the_threshold_is_an_error_with_nothing_undone() {
        // The defect this guards: ship-order took effect but kept answering late; giving
        // up refunded and released, ended Compensated, and the goods had shipped.
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(at_step(&wf, 2), &wf, true);
        assert_eq!(d.trigger, Trigger::ForwardOnly);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Error, 2));
        assert_eq!((d.next.deadline, d.next.locked_by), (None, None));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::Schedule { .. } | Effect::Dispatch { .. })));
        let alerts = alerts(&d);
        assert_eq!(alerts.len(), 1);
        assert_eq!((alerts[0].step, alerts[0].step_name.as_str()), (2, "ship-order"), "names the pivot");
        assert_eq!(alerts[0].state, ProcessState::Error);
        assert_eq!(alerts[0].idempotency_key, Some(IdempotencyKey("o-1:2:do".into())));
        assert!(
            alerts[0].reason.contains("pivot step ship-order outcome unknown (idempotency key o-1:2:do)")
        );
        let status = d.effects.iter().find_map(|e| match e {
            Effect::Status { status, step, reason } => Some((*status, step.clone(), reason.clone().unwrap())),
            _ => None,
        });
        let (status, step, reason) = status.expect("a status");
        assert_eq!((status, step.as_deref()), (OrderStatus::Failed, Some("ship-order")));
        assert!(reason.contains("outcome unknown") && reason.contains("o-1:2:do"), "{reason}");
    }

    #[test]
    fn a_pivot_refused_for_good_compensates_the_steps_before_it() {
        let wf = Workflow::three_step();
        let d = reply(&claim(&at_step(&wf, 2), &wf, 1, T0), &wf, failed("422 address rejected"), T0);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn a_pivot_never_dispatched_compensates_the_steps_before_it() {
        let wf = Workflow::three_step();
        let d = lapse_to_threshold(at_step(&wf, 2), &wf, false);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn after_a_pivot_took_effect_every_give_up_is_an_error() {
        let wf = mixed();
        // a, r, b (pivot) done; c refused for good: b stands, so nothing is undone.
        let task = claim(&at_step(&wf, 3), &wf, 1, T0);
        let d = reply(&task, &wf, failed("422 no"), T0);
        assert_eq!((d.trigger, d.next.state), (Trigger::ForwardOnly, ProcessState::Error));
        let alerts = alerts(&d);
        assert_eq!((alerts[0].step_name.as_str(), alerts[0].idempotency_key.clone()), ("c", None));
        assert!(alerts[0].reason.contains("pivot step b took effect"), "{}", alerts[0].reason);

        // c lapses past its own budget of one: in doubt as well, and still forward only.
        let d = lapse(&task, &wf, 0);
        assert_eq!((d.trigger, d.next.state), (Trigger::ForwardOnly, ProcessState::Error));
        let alerts = self::alerts(&d);
        assert_eq!(alerts[0].idempotency_key, Some(IdempotencyKey("o-1:3:do".into())));
        assert!(alerts[0].reason.contains("c outcome unknown"), "{}", alerts[0].reason);
    }

    #[test]
    fn a_read_only_step_in_doubt_is_not_a_pivot() {
        let wf = mixed();
        // r only reads: giving up on it undoes a and ends Compensated in the end.
        let d = lapse_to_threshold(at_step(&wf, 1), &wf, true);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 0));
    }

    #[test]
    fn the_failure_budget_is_per_step() {
        let wf = Workflow::three_step();
        // Two lapses (threshold 3) on step 0, then it succeeds.
        let mut task = claim(&new_task(&wf), &wf, 1, T0);
        for n in 0..2 {
            task = lapse(&task, &wf, 0).next;
            assert_eq!(task.step_failures, n + 1);
            task = claim(&task, &wf, 10 + n as u128, task.deadline.unwrap());
        }
        let now = task.complete_by.unwrap();
        task = reply(&task, &wf, ok(), now).next;
        assert_eq!((task.step, task.failure_count, task.step_failures), (1, 2, 0));
        // Step 1 gets its own three: two lapses retry, the third gives up.
        for n in 0..2 {
            task = claim(&task, &wf, 20 + n, task.deadline.unwrap());
            let d = lapse(&task, &wf, 0);
            assert_eq!(d.trigger, Trigger::Retry, "lapse {} of step 1", n + 1);
            task = d.next;
        }
        task = claim(&task, &wf, 30, task.deadline.unwrap());
        let d = lapse(&task, &wf, 0);
        assert_eq!(d.trigger, Trigger::Undo);
        assert_eq!(d.next.failure_count, 5, "FailureCount still counts every lapse");

        // A step's own max_failures overrides the deployment's threshold: c gives up at once.
        let wf = mixed();
        let c = claim(&at_step(&wf, 3), &wf, 1, T0);
        assert_ne!(lapse(&c, &wf, 0).trigger, Trigger::Retry);
        let a = claim(&new_task(&wf), &wf, 1, T0);
        let d = lapse_to_threshold(a, &wf, true);
        assert_eq!(d.next.failure_count, 5, "a has a budget of five");
    }

    #[test]
    fn a_step_with_its_own_timeout_gets_that_complete_by_and_a_deadline_to_match() {
        let slow = Step { timeout_ms: Some(7_000), ..Step::pivot("slow", "a") };
        let wf = Workflow::new("timed", vec![Step::pivot("fast", "a"), slow]);
        let first = claim(&new_task(&wf), &wf, 1, T0);
        assert_eq!(first.complete_by, Some(T0.plus_ms(policy().step_timeout_ms)));
        let waiting = reply(&first, &wf, ok(), T0).next;
        let second = claim(&waiting, &wf, 2, T0);
        assert_eq!(second.complete_by, Some(T0.plus_ms(7_000)));
        assert_eq!(second.deadline, Some(T0.plus_ms(7_000 + policy().reply_grace_ms)));
    }

    #[test]
    fn a_task_runs_the_version_it_was_accepted_under() {
        let v1 = Workflow::new("w", vec![Step::pivot("s", "a")]);
        let v2 =
            Workflow { version: 2, ..Workflow::new("w", vec![Step::pivot("s", "a"), Step::pivot("t", "a")]) };
        let task = new_task(&v1).pinned_to(&v1);
        assert_eq!(task.workflow_version, 1);
        assert!(task.claim(lease(1), T0, &v1, &policy()).is_ok());
        // Given the newer version by mistake (a lookup by name), nothing is written.
        assert!(matches!(task.claim(lease(1), T0, &v2, &policy()), Err(Refusal::Corrupt { .. })));
        assert_eq!(new_task(&v2).pinned_to(&v2).workflow_version, 2);
    }

    /// A record written before `in_doubt` existed cannot tell a refusal from an unusable
    /// output: it reads as in doubt, which never undoes around a pivot.
    #[test]
    fn a_failure_stored_without_in_doubt_reads_as_in_doubt() {
        let old: Cause =
            serde_json::from_str(r#"{"kind":"failed","step":2,"action":"do","reason":"x"}"#).unwrap();
        assert!(matches!(old, Cause::Failed { in_doubt: true, .. }));
        let refusal = Cause::Failed { step: 2, action: Action::Do, reason: "x".into(), in_doubt: false };
        let json = serde_json::to_string(&refusal).unwrap();
        assert!(json.contains(r#""in_doubt":false"#), "{json}");
        assert_eq!(serde_json::from_str::<Cause>(&json).unwrap(), refusal);
        let unusable = Cause::Failed { step: 2, action: Action::Do, reason: "x".into(), in_doubt: true };
        assert!(!serde_json::to_string(&unusable).unwrap().contains("in_doubt"));
    }

    // ---- operator actions ----

    const OPS: Actor<'static> =
        Actor { by: "arn:aws:iam::123456789012:user/ops", why: "remote fixed", seen: None };

    fn act(task: &TaskRecord, wf: &Workflow, act: Act) -> Decision {
        checked(task, task.act(act, OPS, T0.plus_ms(50_000), wf, &policy()))
    }

    fn refused(task: &TaskRecord, wf: &Workflow, act: Act) -> String {
        match task.act(act, OPS, T0.plus_ms(50_000), wf, &policy()) {
            Err(r @ Refusal::NotAllowed { .. }) => r.to_string(),
            other => panic!("{act:?} on {:?} was not refused: {other:?}", task.state),
        }
    }

    fn output(json: &str) -> ReplyOutcome {
        ReplyOutcome::Succeeded { output: Some(serde_json::from_str(json).unwrap()) }
    }

    /// Three-step, but giving up stops in Error instead of undoing.
    fn three_step_failing() -> Workflow {
        Workflow { on_give_up: crate::domain::OnGiveUp::Fail, ..Workflow::three_step() }
    }

    /// Reserve and charge succeeded (with outputs), ship refused: Error at step 2.
    fn error_at_ship(wf: &Workflow) -> TaskRecord {
        let t = claim(&new_task(wf), wf, 1, T0);
        let t = reply(&t, wf, output(r#"{"reservation":"r-1"}"#), T0).next;
        let t = claim(&t, wf, 2, T0);
        let t = reply(&t, wf, output(r#"{"charge":"c-1"}"#), T0).next;
        let t = claim(&t, wf, 3, T0);
        let d = reply(&t, wf, failed("address rejected"), T0);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Error, 2));
        d.next
    }

    /// Three-step, charge refused, then the refund refused too: Error while undoing.
    fn error_while_undoing() -> TaskRecord {
        let wf = Workflow::three_step();
        let t = claim(&pending_at(&wf, 2), &wf, 1, T0);
        let t = reply(&t, &wf, failed("address rejected"), T0).next;
        let t = claim(&t, &wf, 2, T0);
        let d = reply(&t, &wf, failed("refund refused"), T0);
        assert_eq!((d.trigger, d.next.state, d.next.step), (Trigger::Fail, ProcessState::Error, 1));
        d.next
    }

    #[test]
    fn resubmit_runs_an_error_task_again_from_its_failed_step_with_a_fresh_budget() {
        let wf = Workflow::single_step();
        let mut task = claim(&new_task(&wf), &wf, 1, T0);
        task.step_failures = 2;
        let error = reply(&task, &wf, failed("card declined"), T0).next;
        let d = act(&error, &wf, Act::Resubmit { from_step: None });
        assert_eq!((d.trigger, d.next.state, d.next.step), (Trigger::Resubmit, ProcessState::Pending, 0));
        assert_eq!((d.next.step_attempts, d.next.step_failures), (0, 0));
        assert_eq!(d.next.failure_count, error.failure_count, "the count only grows");
        assert_eq!(d.next.last_error, None);
        assert_eq!(d.next.last_cause, Cause::Operator { step: 0, act: Act::Resubmit { from_step: None } });
        assert!(d.next.deadline.is_some());
        assert_eq!(
            d.effects,
            vec![
                Effect::Schedule { delay_ms: 0 },
                Effect::Status {
                    status: OrderStatus::Resubmitted,
                    step: Some("process-order".into()),
                    reason: None
                },
            ]
        );
        let entry = d.next.timeline.last().unwrap();
        assert_eq!(entry.what, Happened::Moved(Trigger::Resubmit));
        assert_eq!((entry.note.as_deref(), entry.by.as_deref()), (Some(OPS.why), Some(OPS.by)));
        // It runs as any task does, to the end.
        let again = claim(&d.next, &wf, 2, T0.plus_ms(50_000));
        let done = reply(&again, &wf, ok(), T0.plus_ms(50_000)).next;
        assert_eq!(done.state, ProcessState::Processed);
    }

    /// Found by the simulation: a resubmitted pivot whose first attempt may have taken
    /// effect must stay in doubt, or a cancel (or a later give-up) would undo around it.
    #[test]
    fn a_resubmitted_step_that_may_have_taken_effect_stays_in_doubt() {
        let single = Workflow::single_step();
        let error = lapse_to_threshold(claim(&new_task(&single), &single, 1, T0), &single, true).next;
        let again = act(&error, &single, Act::Resubmit { from_step: None }).next;
        assert!(again.step_attempts > 0);
        assert!(refused(&again, &single, Act::Cancel).contains("may have taken effect"));
        let wf = three_step_failing();
        let from_charge = act(&error_at_ship(&wf), &wf, Act::Resubmit { from_step: Some(1) }).next;
        assert!(from_charge.step_attempts > 0, "charge succeeded before: its effect stands");
    }

    /// Also found by the simulation: resubmitted from an earlier step, the task re-runs
    /// steps whose effects (a pivot's among them) stand from the first way through, so
    /// until it is past the step it failed at, it only goes forward.
    #[test]
    fn a_task_resubmitted_from_an_earlier_step_only_goes_forward_until_past_where_it_failed() {
        let wf = three_step_failing();
        let again = act(&error_at_ship(&wf), &wf, Act::Resubmit { from_step: Some(0) }).next;
        assert_eq!((again.step, again.redo_until), (0, Some(2)));
        assert!(refused(&again, &wf, Act::Cancel).contains("resubmitted from an earlier step"));
        let d = lapse_to_threshold(again.clone(), &wf, true);
        assert_eq!((d.trigger, d.next.state), (Trigger::ForwardOnly, ProcessState::Error));
        assert!(refused(&d.next, &wf, Act::Compensate).contains("resubmitted from an earlier step"));
        // Through every step again: past the one it failed at, the mark is gone.
        let mut t = again;
        for (n, step) in (0..3u32).enumerate() {
            assert_eq!(t.step, step);
            t = claim(&t, &wf, 40 + n as u128, T0);
            t = reply(&t, &wf, ok(), T0).next;
        }
        assert_eq!((t.state, t.redo_until), (ProcessState::Processed, None));
    }

    /// Found by the simulation (1M seeds): the same resubmit sent twice, the second late,
    /// landed again after the task had failed once more. Decided on the revision seen, it
    /// lands once.
    #[test]
    fn an_action_decided_on_a_revision_is_refused_once_the_task_moved() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        let seen = Actor { seen: Some(error.revision), ..OPS };
        let d = checked(&error, error.act(Act::Resubmit { from_step: None }, seen, T0, &wf, &policy()));
        let mut again = d.next.clone();
        again.state = ProcessState::Error;
        again.deadline = None;
        let why = match again.act(Act::Resubmit { from_step: None }, seen, T0, &wf, &policy()) {
            Err(r) => r.to_string(),
            Ok(d) => panic!("landed twice: {:?}", d.trigger),
        };
        assert!(why.contains("changed since it was looked at"), "{why}");
    }

    #[test]
    fn resubmit_from_an_earlier_step_keeps_only_the_outputs_before_it() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        assert_eq!(error.outputs.len(), 2);
        let from_ship = act(&error, &wf, Act::Resubmit { from_step: None }).next;
        assert_eq!((from_ship.step, from_ship.outputs.len()), (2, 2));
        let from_charge = act(&error, &wf, Act::Resubmit { from_step: Some(1) }).next;
        assert_eq!(from_charge.step, 1);
        assert_eq!(from_charge.outputs.keys().collect::<Vec<_>>(), vec!["reserve-inventory"]);
    }

    #[test]
    fn resubmit_is_refused_unless_the_task_is_in_error_going_forward() {
        let wf = Workflow::three_step();
        for task in [new_task(&wf), claim(&new_task(&wf), &wf, 1, T0)] {
            assert!(refused(&task, &wf, Act::Resubmit { from_step: None }).contains("only a task in Error"));
        }
        let failing = three_step_failing();
        let why = refused(&error_at_ship(&failing), &failing, Act::Resubmit { from_step: Some(3) });
        assert!(why.contains("never skips a step"), "{why}");
        let why = refused(&error_while_undoing(), &wf, Act::Resubmit { from_step: None });
        assert!(why.contains("stopped while undoing"), "{why}");
    }

    #[test]
    fn compensate_undoes_the_completed_steps_of_an_error_task_newest_first() {
        let wf = three_step_failing();
        let error = error_at_ship(&wf);
        let d = act(&error, &wf, Act::Compensate);
        assert_eq!(
            (d.trigger, d.next.state, d.next.step),
            (Trigger::OperatorUndo, ProcessState::Compensating, 1),
            "ship was refused, so undoing starts at charge"
        );
        assert_eq!(d.next.locked_by, None);
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        // Then the pipeline undoes charge, then reserve, and ends Compensated.
        let t = claim(&d.next, &wf, 7, T0);
        let t = reply(&t, &wf, ok(), T0).next;
        assert_eq!((t.state, t.step), (ProcessState::Compensating, 0));
        let t = claim(&t, &wf, 8, T0);
        assert_eq!(reply(&t, &wf, ok(), T0).next.state, ProcessState::Compensated);
        // Twice, from two terminals: the second decides on what the first wrote.
        assert!(refused(&d.next, &wf, Act::Compensate).contains("only a task in Error"));
    }

    #[test]
    fn compensate_resumes_an_undo_whose_compensation_failed() {
        let wf = Workflow::three_step();
        let error = error_while_undoing();
        let d = act(&error, &wf, Act::Compensate);
        assert_eq!((d.next.state, d.next.step, d.next.step_failures), (ProcessState::Compensating, 1, 0));
        let d = checked(&d.next, d.next.claim(lease(9), T0, &wf, &policy()));
        assert_eq!(d.effects, vec![Effect::Dispatch { step: 1, action: Action::Undo }]);
    }

    #[test]
    fn compensate_is_refused_past_a_pivot_and_with_nothing_to_undo() {
        let mixed = mixed();
        // b (a pivot) succeeded, c refused: only forward is left.
        let error = reply(&claim(&at_step(&mixed, 3), &mixed, 1, T0), &mixed, failed("no"), T0).next;
        assert_eq!(error.state, ProcessState::Error);
        let why = refused(&error, &mixed, Act::Compensate);
        assert!(why.contains("pivot step b took effect"), "{why}");
        // Single-step: its one step was refused and has no compensation.
        let single = Workflow::single_step();
        let error = reply(&claim(&new_task(&single), &single, 1, T0), &single, failed("no"), T0).next;
        assert!(refused(&error, &single, Act::Compensate).contains("nothing to undo"));
        // Or the pivot may have taken effect: it answered nothing, attempt after attempt.
        let error = lapse_to_threshold(claim(&new_task(&single), &single, 1, T0), &single, true).next;
        assert_eq!(error.state, ProcessState::Error);
        assert!(refused(&error, &single, Act::Compensate).contains("may have taken effect"));
    }

    #[test]
    fn cancel_of_a_task_that_did_nothing_yet_is_compensated_at_once() {
        let wf = Workflow::three_step();
        let d = act(&new_task(&wf), &wf, Act::Cancel);
        assert_eq!(
            (d.trigger, d.next.state, d.next.deadline),
            (Trigger::CancelUndone, ProcessState::Compensated, None)
        );
        assert_eq!(statuses(&d), vec![OrderStatus::Cancelled, OrderStatus::Compensated]);
        assert!(alerts(&d).is_empty());
    }

    #[test]
    fn cancel_fences_off_the_attempt_in_flight_and_undoes_it_too() {
        let wf = Workflow::three_step();
        let charging = claim(&at_step(&wf, 1), &wf, 5, T0);
        let d = act(&charging, &wf, Act::Cancel);
        assert_eq!((d.trigger, d.next.state, d.next.step), (Trigger::Cancel, ProcessState::Compensating, 1));
        assert_eq!((d.next.locked_by, d.next.complete_by), (None, None), "the lease is gone");
        assert_eq!(statuses(&d), vec![OrderStatus::Cancelled]);
        // The charge's own reply, however good, no longer lands.
        let late = reply_for(&charging, ok());
        assert!(matches!(d.next.apply_reply(&late, T0, &wf, &policy()), Err(Refusal::StaleReply(_))));
        // Its agent may call the service until complete-by: the undo waits for that.
        let hold = charging.complete_by.unwrap().plus_ms(policy().reply_grace_ms);
        // Held even when the canceller's clock says that time is up already (an operator's
        // laptop may run ahead): the claiming scheduler judges it on its own clock.
        assert_eq!(d.next.hold_until, charging.complete_by);
        assert_eq!(d.effects[0], Effect::Schedule { delay_ms: 0 });
        let cancelled_at = T0.plus_ms(100);
        let early = checked(&charging, charging.act(Act::Cancel, OPS, cancelled_at, &wf, &policy()));
        assert_eq!(early.effects[0], Effect::Schedule { delay_ms: hold.millis_since(cancelled_at) });
        assert!(early.next.deadline.unwrap() > hold);
        assert_eq!(
            early.next.claim(lease(6), Timestamp(hold.0 - 1), &wf, &policy()),
            Err(Refusal::Held { until: hold })
        );
        let undoing = claim(&early.next, &wf, 6, hold);
        assert_eq!(undoing.hold_until, None);
        assert!(matches!(undoing.apply_reply(&late, T0, &wf, &policy()), Err(Refusal::StaleReply(_))));
        // A task waiting for its next step undoes the ones before it.
        let d = act(&at_step(&wf, 2), &wf, Act::Cancel);
        assert_eq!((d.next.state, d.next.step), (ProcessState::Compensating, 1));
    }

    #[test]
    fn cancel_is_refused_where_it_cannot_undo_or_the_task_is_not_live() {
        let single = Workflow::single_step();
        let in_flight = claim(&new_task(&single), &single, 1, T0);
        assert!(refused(&in_flight, &single, Act::Cancel).contains("pivot step process-order may have"));
        let mixed = mixed();
        assert!(refused(&at_step(&mixed, 3), &mixed, Act::Cancel).contains("pivot step b took effect"));
        let wf = Workflow::three_step();
        let compensating = reply(&claim(&at_step(&wf, 1), &wf, 1, T0), &wf, failed("no"), T0).next;
        assert!(refused(&compensating, &wf, Act::Cancel).contains("undoing its steps already"));
        assert!(refused(&error_while_undoing(), &wf, Act::Cancel).contains("`compensate`"));
        let processed = reply(&claim(&new_task(&single), &single, 1, T0), &single, ok(), T0).next;
        assert!(refused(&processed, &single, Act::Cancel).contains("ended"));
        for act in [Act::Compensate, Act::Resubmit { from_step: None }] {
            refused(&processed, &single, act);
        }
    }

    #[test]
    fn every_move_is_in_the_timeline_and_the_timeline_stays_bounded() {
        let wf = Workflow::three_step();
        let t = new_task(&wf);
        assert_eq!(t.timeline.iter().map(|e| e.what).collect::<Vec<_>>(), vec![Happened::Submitted]);
        let claimed = claim(&t, &wf, 1, T0.plus_ms(3));
        let last = claimed.timeline.last().unwrap();
        assert_eq!(
            (last.what, last.at, last.step, last.attempt),
            (Happened::Moved(Trigger::Claimed), T0.plus_ms(3), 0, 1)
        );
        let refused = reply(&claimed, &wf, failed("out of stock"), T0).next;
        assert_eq!(refused.timeline.last().unwrap().note.as_deref(), Some("out of stock"));
        // A task that retries forever keeps only the newest entries, and counts the rest.
        let mut t = claim(&new_task(&wf), &wf, 1, T0);
        let mut moves = 2;
        for n in 0..40u128 {
            t.step_failures = 0;
            t = lapse(&t, &wf, 0).next;
            t = claim(&t, &wf, 10 + n, t.deadline.unwrap());
            moves += 2;
        }
        assert_eq!(t.timeline.len(), timeline::TIMELINE_LEN);
        assert_eq!(t.timeline_dropped as usize + t.timeline.len(), moves);
    }

    /// Every row of the transition table is made by some decision of this module.
    #[test]
    fn every_row_of_the_table_is_a_decision() {
        let mut made = BTreeSet::new();
        let mut note = |before: &TaskRecord, d: &Decision| {
            made.insert((before.state, d.trigger, d.next.state));
        };
        let three = Workflow::three_step();
        let single = Workflow::single_step();
        let mixed = mixed();
        let pending = new_task(&three);
        let processing = claim(&pending, &three, 1, T0);
        let charging = claim(&at_step(&three, 1), &three, 2, T0);
        let shipping = claim(&at_step(&three, 2), &three, 3, T0);
        let undoing = claim(&reply(&shipping, &three, failed("no"), T0).next, &three, 4, T0);
        let undoing_last = reply(&undoing, &three, ok(), T0).next;
        let undoing_last = claim(&undoing_last, &three, 5, T0);
        let compensating = reply(&charging, &three, failed("no"), T0).next;
        let single_pending = new_task(&single);
        let single_processing = claim(&single_pending, &single, 6, T0);
        let mixed_c = claim(&at_step(&mixed, 3), &mixed, 7, T0);
        let mut pending_charge_in_doubt = lapse(&charging, &three, 0).next;
        pending_charge_in_doubt.step_failures = 2;
        let mut pending_ship_in_doubt = lapse(&shipping, &three, 0).next;
        pending_ship_in_doubt.step_failures = 2;
        let mut pending_first = new_task(&three);
        pending_first.step_failures = 2;
        let mut pending_single = new_task(&single);
        pending_single.step_failures = 2;

        let cases: Vec<(&TaskRecord, Decision)> = vec![
            (&pending, checked(&pending, pending.claim(lease(9), T0, &three, &policy()))),
            (&pending, lapse(&pending, &three, 0)),
            (&pending_single, lapse(&pending_single, &single, 0)),
            (&pending_ship_in_doubt, lapse(&pending_ship_in_doubt, &three, 0)),
            (&pending_charge_in_doubt, lapse(&pending_charge_in_doubt, &three, 0)),
            (&pending_first, lapse(&pending_first, &three, 0)),
            (&processing, reply(&processing, &three, ok(), T0)),
            (&single_processing, reply(&single_processing, &single, ok(), T0)),
            (&processing, lapse(&processing, &three, 0)),
            (&single_processing, reply(&single_processing, &single, failed("no"), T0)),
            (&mixed_c, reply(&mixed_c, &mixed, failed("no"), T0)),
            (&charging, reply(&charging, &three, failed("no"), T0)),
            (&processing, reply(&processing, &three, failed("no"), T0)),
            (&compensating, checked(&compensating, compensating.claim(lease(9), T0, &three, &policy()))),
            (&undoing, reply(&undoing, &three, ok(), T0)),
            (&undoing_last, reply(&undoing_last, &three, ok(), T0)),
            (&undoing, lapse(&undoing, &three, 0)),
            (&undoing, reply(&undoing, &three, failed("no"), T0)),
        ];
        let failing = three_step_failing();
        let error_at_ship = error_at_ship(&failing);
        let cancel_pending = at_step(&three, 2);
        let single_new = new_task(&single);
        let reads_first =
            Workflow::new("reads-first", vec![Step::read_only("look", "a"), Step::pivot("buy", "a")]);
        let looking = claim(&new_task(&reads_first), &reads_first, 8, T0);
        let operator_cases: Vec<(&TaskRecord, Decision)> = vec![
            (&error_at_ship, act(&error_at_ship, &failing, Act::Resubmit { from_step: None })),
            (&error_at_ship, act(&error_at_ship, &failing, Act::Compensate)),
            (&cancel_pending, act(&cancel_pending, &three, Act::Cancel)),
            (&charging, act(&charging, &three, Act::Cancel)),
            (&single_new, act(&single_new, &single, Act::Cancel)),
            (&processing, act(&processing, &three, Act::Cancel)),
            (&looking, act(&looking, &reads_first, Act::Cancel)),
        ];
        let cases: Vec<_> = cases.into_iter().chain(operator_cases).collect();
        for (before, d) in &cases {
            note(before, d);
        }
        let table: BTreeSet<_> = lifecycle::TRANSITIONS.iter().copied().collect();
        assert_eq!(made, table, "rows made by decisions vs the table");
    }

    // ---- random sequences ----

    /// A workflow with steps that have no compensation in the middle and at the end.
    fn mixed() -> Workflow {
        Workflow::new(
            "mixed",
            vec![
                Step::compensable("a", "a", "undo-a").with_max_failures(5),
                Step::read_only("r", "a"),
                Step::pivot("b", "a"),
                Step::compensable("c", "a", "undo-c").with_max_failures(1),
                Step::pivot("d", "a"),
            ],
        )
    }

    #[derive(Debug, Clone, Copy)]
    enum Tamper {
        None,
        Lease,
        Attempt,
        Step,
        Action,
    }

    #[derive(Debug, Clone)]
    enum Event {
        Advance(u64),
        Claim,
        /// Reply as the agent of the latest dispatch (`None`) or of dispatch number `pick`
        /// (mod the dispatches so far) would.
        Reply {
            pick: Option<usize>,
            tamper: Tamper,
            ok: bool,
        },
        Lapse {
            jitter: u64,
        },
        Operate(Act),
    }

    fn event() -> impl Strategy<Value = Event> {
        let tamper = prop_oneof![
            6 => Just(Tamper::None),
            1 => Just(Tamper::Lease),
            1 => Just(Tamper::Attempt),
            1 => Just(Tamper::Step),
            1 => Just(Tamper::Action),
        ];
        prop_oneof![
            3 => (0u64..400).prop_map(Event::Advance),
            1 => (400u64..4_000).prop_map(Event::Advance),
            3 => Just(Event::Claim),
            5 => (prop::option::weighted(0.3, any::<usize>()), tamper, prop::bool::weighted(0.8))
                .prop_map(|(pick, tamper, ok)| Event::Reply { pick, tamper, ok }),
            2 => any::<u64>().prop_map(|jitter| Event::Lapse { jitter }),
            1 => prop_oneof![
                Just(Act::Cancel),
                Just(Act::Compensate),
                Just(Act::Resubmit { from_step: None }),
                (0u32..6).prop_map(|n| Act::Resubmit { from_step: Some(n) }),
            ].prop_map(Event::Operate),
        ]
    }

    /// The identity of one dispatch, as its agent echoes it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Dispatched {
        lease: LeaseToken,
        attempt: u32,
        step: u32,
        action: Action,
        complete_by: Timestamp,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_event_sequences_keep_every_invariant(
            which in 0usize..3,
            events in prop::collection::vec(event(), 0..80),
        ) {
            let wf = [Workflow::single_step(), Workflow::three_step(), mixed()][which].clone();
            let policy = policy();
            let mut task = new_task(&wf);
            let mut now = T0;
            let mut leases = 0u128;
            let mut dispatched: Vec<Dispatched> = Vec::new();
            let mut forward_done: Vec<u32> = Vec::new();
            let mut forward_claimed: BTreeSet<u32> = BTreeSet::new();
            // Forward steps a definitive refusal settled: they had no effect.
            let mut refused: BTreeSet<u32> = BTreeSet::new();
            let mut undone: Vec<u32> = Vec::new();
            let mut cancelled = false;

            for ev in events {
                let before = task.clone();
                let result = match ev {
                    Event::Advance(ms) => {
                        now = now.plus_ms(ms);
                        continue;
                    }
                    Event::Claim => {
                        leases += 1;
                        let r = task.claim(lease(leases), now, &wf, &policy);
                        let claimable = task.locked_by.is_none()
                            && matches!(task.state, ProcessState::Pending | ProcessState::Compensating)
                            && task.hold_until.is_none_or(|h| now >= h.plus_ms(policy.reply_grace_ms));
                        prop_assert_eq!(r.is_ok(), claimable, "{:?}", r);
                        if let Ok(d) = &r {
                            let action = d.next.action();
                            dispatched.push(Dispatched {
                                lease: lease(leases),
                                attempt: d.next.attempt,
                                step: d.next.step,
                                action,
                                complete_by: d.next.complete_by.unwrap(),
                            });
                            if action == Action::Do {
                                forward_claimed.insert(d.next.step);
                                prop_assert!(!cancelled, "step {} claimed after the task was cancelled", d.next.step);
                            }
                            // Attempts identify claims: no two dispatches share one.
                            prop_assert_eq!(d.next.attempt as usize, dispatched.len());
                        }
                        r
                    }
                    Event::Reply { pick, tamper, ok } => {
                        if dispatched.is_empty() {
                            continue;
                        }
                        let mut from = dispatched[pick.map_or(dispatched.len() - 1, |p| p % dispatched.len())];
                        match tamper {
                            Tamper::None => {}
                            Tamper::Lease => from.lease = lease(u128::MAX),
                            Tamper::Attempt => from.attempt = from.attempt.wrapping_add(1),
                            Tamper::Step => from.step = from.step.wrapping_add(1),
                            Tamper::Action => {
                                from.action = match from.action {
                                    Action::Do => Action::Undo,
                                    Action::Undo => Action::Do,
                                }
                            }
                        }
                        let outcome = if ok { ReplyOutcome::DONE } else { ReplyOutcome::Failed { reason: "no".into(), detail: None } };
                        let reply = AgentReply {
                            order_id: task.order_id.clone(),
                            step: from.step,
                            action: from.action,
                            attempt: from.attempt,
                            lease: from.lease,
                            outcome,
                        };
                        let r = task.apply_reply(&reply, now, &wf, &policy);
                        // The fence: only the live dispatch's own reply, in time, lands.
                        let live = task.locked_by == Some(from.lease)
                            && dispatched.last().map(|d| (d.lease, d.attempt, d.step, d.action))
                                == Some((from.lease, from.attempt, from.step, from.action))
                            && now <= from.complete_by;
                        prop_assert_eq!(r.is_ok(), live, "{:?} {:?}", r, from);
                        if let Err(refusal) = &r {
                            prop_assert!(matches!(refusal, Refusal::StaleReply(_)), "{:?}", refusal);
                        }
                        r
                    }
                    Event::Lapse { jitter } => {
                        let r = task.lapse(now, &wf, &policy, jitter);
                        let due = task.deadline.is_some_and(|d| d <= now);
                        prop_assert_eq!(r.is_ok(), due, "{:?}", r);
                        r
                    }
                    Event::Operate(act) => {
                        let actor = Actor { by: "op", why: "test", seen: None };
                        let r = task.act(act, actor, now, &wf, &policy);
                        let allowed = match act {
                            Act::Cancel => matches!(task.state, ProcessState::Pending | ProcessState::Processing),
                            Act::Compensate | Act::Resubmit { .. } => task.state == ProcessState::Error,
                        };
                        if !allowed {
                            prop_assert!(matches!(r, Err(Refusal::NotAllowed { .. })), "{:?} on {:?}: {:?}", act, task.state, r);
                        }
                        if let Ok(d) = &r {
                            prop_assert_eq!(d.next.failure_count, task.failure_count);
                            match d.trigger {
                                Trigger::Cancel | Trigger::CancelUndone => cancelled = true,
                                Trigger::Resubmit => {
                                    prop_assert!(!cancelled, "a cancelled task went forward again");
                                    forward_done.truncate(d.next.step as usize);
                                }
                                _ => {}
                            }
                        }
                        r
                    }
                };
                let Ok(d) = result else {
                    prop_assert_eq!(&task, &before);
                    continue;
                };

                prop_assert!(
                    !before.state.is_terminal() || (d.trigger.is_operator() && before.state == ProcessState::Error),
                    "terminal {:?} moved", before.state
                );
                prop_assert!(
                    lifecycle::TRANSITIONS.contains(&(before.state, d.trigger, d.next.state)),
                    "{:?} --{:?}--> {:?}", before.state, d.trigger, d.next.state
                );
                prop_assert!(d.next.failure_count >= before.failure_count);
                prop_assert!(d.next.revision > before.revision);
                prop_assert_eq!(d.next.shape_violation(), None);
                prop_assert!(d.next.attempt >= before.attempt);
                let alert_count = d.effects.iter().filter(|e| matches!(e, Effect::Alert(_))).count();
                prop_assert!(alert_count <= 1);
                if d.next.state == ProcessState::Error {
                    prop_assert_eq!(alert_count, 1, "an Error always tells an operator");
                }

                if let Cause::Succeeded { step, action } = d.next.last_cause.clone() {
                    match action {
                        Action::Do => {
                            prop_assert_eq!(step as usize, forward_done.len(), "forward steps in order");
                            forward_done.push(step);
                        }
                        Action::Undo => {
                            prop_assert!(wf.step(step).unwrap().compensation.is_some());
                            prop_assert!(forward_claimed.contains(&step), "undid step {} never started", step);
                            if let Some(&last) = undone.last() {
                                prop_assert!(step < last, "compensation {} after {}", step, last);
                            }
                            prop_assert!(!undone.contains(&step));
                            undone.push(step);
                        }
                    }
                }
                if let Cause::Failed { step, action: Action::Do, .. } = d.next.last_cause {
                    refused.insert(step);
                }
                if let Cause::Succeeded { step, action: Action::Do } = d.next.last_cause {
                    // Run again after a resubmit: a refusal before it no longer says it had no effect.
                    refused.remove(&step);
                }
                if d.next.state == ProcessState::Compensated {
                    // Nothing stands: every step that was dispatched and not refused
                    // only read or was undone; no pivot may have taken effect.
                    for &s in &forward_claimed {
                        let kind = wf.step(s).unwrap().kind();
                        let stands = match kind {
                            StepKind::ReadOnly => false,
                            StepKind::Compensable => !refused.contains(&s) && !undone.contains(&s),
                            StepKind::Pivot => !refused.contains(&s),
                        };
                        prop_assert!(!stands, "Compensated, but step {} ({:?}) may stand", s, kind);
                    }
                }
                let budget = wf.max_failures(d.next.step, policy.failure_threshold);
                prop_assert!(d.next.step_failures <= budget, "budget overrun: {} of {}", d.next.step_failures, budget);
                task = d.next;
            }
        }
    }
}
