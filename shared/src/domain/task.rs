//! The task record (the state table's row) and the decisions that move it.
//!
//! Each decision is a pure function of the record as read, the event, the time and the
//! workflow. It returns the next record and the effects to perform after the write.
//! The store writes the next record only if the row still has the revision that was
//! read, so a decision made on a stale read can never land: that one conditional
//! write is what makes claims exclusive, replies fenced and recoveries happen once.

use serde::{Deserialize, Serialize};

use super::ids::{IdempotencyKey, LeaseToken, OrderId, Timestamp};
use super::lifecycle::{self, ProcessState, Trigger};
use super::messages::{AgentReply, OperatorAlert, Order, OrderStatus, ReplyOutcome};
use super::retry::Backoff;
use super::workflow::{Action, Workflow};

/// Timing and limits that decisions need; read once from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// A claim's complete-by is this far after the claim.
    pub step_timeout_ms: u64,
    /// Time allowed after complete-by for a reply to travel before the supervisor acts.
    pub reply_grace_ms: u64,
    /// A waiting (unclaimed) task is due this long after it started waiting.
    pub pending_timeout_ms: u64,
    /// Failures (per phase: forward, then compensation) before giving up.
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

/// The orders table's row: the validated order as accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRecord {
    pub order: Order,
    pub received_at: Timestamp,
}

/// Why the record last changed; the history of a task is the sequence of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    Submitted,
    Claimed { step: u32, action: Action },
    Succeeded { step: u32, action: Action },
    Failed { step: u32, action: Action, reason: String },
    DeadlinePassed { step: u32, state: ProcessState },
}

/// The state table's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub order_id: OrderId,
    pub workflow: String,
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
    /// When the supervisor acts if nothing else has. `None` exactly when terminal,
    /// which keeps finished tasks out of the sparse due index.
    pub deadline: Option<Timestamp>,
    /// Only grows.
    pub failure_count: u32,
    /// `failure_count` when compensation began: the compensation phase's budget starts there.
    pub undo_failure_base: Option<u32>,
    pub reply_to: Option<String>,
    pub last_cause: Cause,
    pub last_error: Option<String>,
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
    #[error("not due: deadline {deadline:?} is after {now}")]
    NotDue { deadline: Option<Timestamp>, now: Timestamp },
    #[error("task record does not fit workflow {workflow:?}: {why}")]
    Corrupt { workflow: String, why: String },
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

/// The same for every retry and every attempt of one action of one step.
pub fn idempotency_key(order_id: &OrderId, step: u32, action: Action) -> IdempotencyKey {
    IdempotencyKey(format!("{order_id}:{step}:{}", action.as_str()))
}

impl TaskRecord {
    pub fn new(order: &Order, reply_to: Option<String>, now: Timestamp, policy: &Policy) -> TaskRecord {
        TaskRecord {
            order_id: order.order_id.clone(),
            workflow: order.workflow.clone(),
            state: ProcessState::Pending,
            step: 0,
            step_attempts: 0,
            attempt: 0,
            locked_by: None,
            complete_by: None,
            deadline: Some(now.plus_ms(policy.pending_timeout_ms)),
            failure_count: 0,
            undo_failure_base: None,
            reply_to,
            last_cause: Cause::Submitted,
            last_error: None,
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
        None
    }

    fn moved(&self, trigger: Trigger, now: Timestamp, cause: Cause) -> Result<TaskRecord, Refusal> {
        let state = lifecycle::next(self.state, trigger).ok_or_else(|| Refusal::Corrupt {
            workflow: self.workflow.clone(),
            why: format!("no transition {:?} --{trigger:?}-->", self.state),
        })?;
        let mut next = self.clone();
        next.state = state;
        next.revision += 1;
        next.updated_at = now;
        next.last_cause = cause;
        if state.is_terminal() {
            next.deadline = None;
        }
        Ok(next)
    }

    fn unlocked(mut self) -> TaskRecord {
        self.locked_by = None;
        self.complete_by = None;
        self
    }

    fn waiting(mut self, now: Timestamp, delay_ms: u64, policy: &Policy) -> TaskRecord {
        self.deadline = Some(now.plus_ms(delay_ms).plus_ms(policy.pending_timeout_ms));
        self.unlocked()
    }

    fn step_name(&self, wf: &Workflow, step: u32, action: Action) -> String {
        match (wf.step(step), action) {
            (Some(s), Action::Do) => s.name.clone(),
            (Some(s), Action::Undo) => s.compensation.clone().unwrap_or_else(|| s.name.clone()),
            (None, _) => format!("step-{step}"),
        }
    }

    fn check_workflow(&self, wf: &Workflow) -> Result<(), Refusal> {
        if wf.name != self.workflow || wf.step(self.step).is_none() {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("workflow {:?} has no step {}", wf.name, self.step),
            });
        }
        Ok(())
    }

    fn alert(&self, wf: &Workflow, now: Timestamp, reason: &str) -> Effect {
        Effect::Alert(OperatorAlert {
            order_id: self.order_id.clone(),
            workflow: self.workflow.clone(),
            step: self.step,
            step_name: self.step_name(wf, self.step, self.action()),
            state: self.state,
            failure_count: self.failure_count,
            reason: reason.to_owned(),
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
        if self.locked_by.is_some()
            || !matches!(self.state, ProcessState::Pending | ProcessState::Compensating)
        {
            return Err(Refusal::ClaimLost { state: self.state, locked: self.locked_by.is_some() });
        }
        self.check_workflow(wf)?;
        let action = self.action();
        let mut next = self.moved(Trigger::Claimed, now, Cause::Claimed { step: self.step, action })?;
        let complete_by = now.plus_ms(policy.step_timeout_ms);
        next.locked_by = Some(lease);
        next.complete_by = Some(complete_by);
        next.deadline = Some(complete_by.plus_ms(policy.reply_grace_ms));
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
        self.fence(reply, now).map_err(Refusal::StaleReply)?;
        self.check_workflow(wf)?;
        let (step, action) = (self.step, reply.action);
        let name = self.step_name(wf, step, action);
        match (&reply.outcome, action) {
            (ReplyOutcome::Succeeded, Action::Do) => {
                let cause = Cause::Succeeded { step, action };
                if step + 1 < wf.len() {
                    let mut next = self.moved(Trigger::Advanced, now, cause)?.waiting(now, 0, policy);
                    next.step += 1;
                    next.step_attempts = 0;
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
                    let next = self.moved(Trigger::Finished, now, cause)?.unlocked();
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
            (ReplyOutcome::Succeeded, Action::Undo) => {
                let cause = Cause::Succeeded { step, action };
                match wf.compensable_at_or_below(step.checked_sub(1)) {
                    Some(below) => {
                        let mut next = self.moved(Trigger::UndoAdvanced, now, cause)?.waiting(now, 0, policy);
                        next.step = below;
                        next.step_attempts = 0;
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
            (ReplyOutcome::Failed { reason }, Action::Do) => {
                let cause = Cause::Failed { step, action, reason: reason.clone() };
                // The remote refused, so this step had no effect: undo only the ones before it.
                self.give_up(now, wf, policy, cause, reason, step.checked_sub(1), false)
            }
            (ReplyOutcome::Failed { reason }, Action::Undo) => {
                let cause = Cause::Failed { step, action, reason: reason.clone() };
                self.fail(now, wf, cause, &format!("compensation {name} failed: {reason}"))
            }
        }
    }

    /// Supervisor: the deadline passed with nothing else moving the task.
    pub fn lapse(
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
        let phase_failures = counted.failure_count - counted.undo_failure_base.unwrap_or(0);
        counted.last_error = Some(match self.state {
            ProcessState::Processing | ProcessState::Compensating if self.locked_by.is_some() => {
                format!("attempt {} passed its deadline without a reply", self.attempt)
            }
            _ => "waited past its deadline without being claimed".to_owned(),
        });
        if phase_failures < policy.failure_threshold {
            let delay_ms = policy.retry_backoff.delay_ms(phase_failures - 1, jitter);
            let next = counted.moved(Trigger::Retry, now, cause)?.waiting(now, delay_ms, policy);
            return Ok(Decision {
                trigger: Trigger::Retry,
                next,
                effects: vec![Effect::Schedule { delay_ms }],
            });
        }
        let reason = format!(
            "failure threshold reached: {phase_failures} failures (threshold {})",
            policy.failure_threshold
        );
        match self.action() {
            // The step was dispatched at least once, so it may have taken effect: undo it too.
            Action::Do => {
                let from = if self.step_attempts > 0 { Some(self.step) } else { self.step.checked_sub(1) };
                counted.give_up(now, wf, policy, cause, &reason, from, true)
            }
            Action::Undo => counted.fail(now, wf, cause, &reason),
        }
    }

    fn fail(&self, now: Timestamp, wf: &Workflow, cause: Cause, reason: &str) -> Result<Decision, Refusal> {
        let mut next = self.moved(Trigger::Fail, now, cause)?.unlocked();
        next.last_error = Some(reason.to_owned());
        let step = Some(self.step_name(wf, self.step, self.action()));
        Ok(Decision {
            trigger: Trigger::Fail,
            effects: vec![
                next.alert(wf, now, reason),
                Effect::Status { status: OrderStatus::Failed, step, reason: Some(reason.to_owned()) },
            ],
            next,
        })
    }

    /// Stop going forward: undo from `undo_from` down if the workflow compensates, else Error.
    #[allow(clippy::too_many_arguments)]
    fn give_up(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        cause: Cause,
        reason: &str,
        undo_from: Option<u32>,
        alert: bool,
    ) -> Result<Decision, Refusal> {
        if !wf.compensates() {
            return self.fail(now, wf, cause, reason);
        }
        let step = Some(self.step_name(wf, self.step, Action::Do));
        let (trigger, mut next, status) = match wf.compensable_at_or_below(undo_from) {
            Some(first) => {
                let mut next = self.moved(Trigger::Undo, now, cause)?.waiting(now, 0, policy);
                next.step = first;
                next.step_attempts = 0;
                next.undo_failure_base = Some(next.failure_count);
                (Trigger::Undo, next, OrderStatus::Compensating)
            }
            None => (
                Trigger::Undone,
                self.moved(Trigger::Undone, now, cause)?.unlocked(),
                OrderStatus::Compensated,
            ),
        };
        next.last_error = Some(reason.to_owned());
        let mut effects = Vec::new();
        if trigger == Trigger::Undo {
            effects.push(Effect::Schedule { delay_ms: 0 });
        }
        effects.push(Effect::Status { status, step, reason: Some(reason.to_owned()) });
        if alert {
            effects.push(next.alert(wf, now, reason));
        }
        Ok(Decision { trigger, next, effects })
    }
}
