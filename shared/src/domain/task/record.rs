//! The record, and what every decision shares: the policy it decides under, the causes
//! and effects it records, its refusals, and the moves every decision makes through the
//! transition table (`moved`) and the timeline (`logged`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::branches::StageRun;
use crate::domain::callback::{Awaiting, CallbackToken, CompletionRefused};
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, OrderId, Sender, Timestamp};
use crate::domain::lifecycle::{self, ProcessState, Trigger};
use crate::domain::messages::{OperatorAlert, Order, OrderStatus};
use crate::domain::output::Outputs;
use crate::domain::retry::Backoff;
use crate::domain::timeline::{self, Entry, Happened};
use crate::domain::workflow::{Action, Workflow};

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
    /// A timer step started waiting until `wake_at`.
    Slept {
        step: u32,
        wake_at: Timestamp,
    },
    /// A timer step's time came (`late_ms` after it: the wake's lateness).
    Woke {
        step: u32,
        late_ms: u64,
    },
    /// A callback step's agent started the work; the task waits for the outside.
    Started {
        step: u32,
    },
    /// The outside sent a heartbeat for a callback step.
    Heartbeat {
        step: u32,
    },
    /// The outside completed a callback step with success.
    Completed {
        step: u32,
    },
    /// The step's agent had no room: the task waits with `ticket` in its gate.
    Queued {
        step: u32,
        ticket: u64,
    },
    /// The agent's remote answered "too many requests": tried again after `retry_after_ms`.
    Throttled {
        step: u32,
        action: Action,
        retry_after_ms: u64,
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
    Pause,
    Resume,
}

impl Act {
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Resubmit { .. } => "resubmit",
            Act::Compensate => "compensate",
            Act::Cancel => "cancel",
            Act::Pause => "pause",
            Act::Resume => "resume",
        }
    }
}

/// How far out a paused task's deadline goes while it waits for a claim (`parked`): it
/// leaves the supervisor's sweep, which reads only what is due. A task paused longer is
/// read again by each sweep, which changes nothing, until it is resumed.
pub const PARKED_MS: u64 = 366 * 24 * 60 * 60 * 1_000;

/// The state table's row. It carries the order it runs, so accepting an order is one
/// conditional write of one item and claiming a step reads the order with the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version of `workflow` the task was accepted under, and runs to its end
    /// whatever is published after.
    #[serde(default = "crate::domain::workflow::first_version")]
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
    /// The complete-by of the attempt in flight when the task was cancelled, or of the
    /// branches of a parallel stage still out when the stage gave up: their agents may
    /// call the service until then, so no claim comes before it plus the reply grace (the
    /// claiming scheduler's own grace, on its own clock), so the undo does not overtake
    /// the effect it undoes; a request held up in the network longer than that still can
    /// (docs/SIMULATION.md, "Open"). A stage's hold lasts through an Error and a resubmit
    /// (an operator's undo or cancel then waits for it too); a claim ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Timestamp>,
    /// Resubmitted from an earlier step than the one it failed at: the steps up to this
    /// one took effect (or may have) on the first way through. Until the task is past it,
    /// nothing is undone: a give-up stops in Error and a cancel is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo_until: Option<u32>,
    /// Only while Waiting: when its timer step wakes (the deadline too, so the due index
    /// brings the supervisor then). Kept apart from the deadline because a later kind of
    /// wait (for an outside event) has a deadline that is not a wake time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<Timestamp>,
    /// Only at a callback step, from its claim until the step ends (Processing while its
    /// agent starts the work, then Waiting): the attempt whose token completes it, the
    /// token's digest, and when it is due (`callback.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Awaiting>,
    /// Only while the task waits for a place in its step's agent's gate (Pending or
    /// Compensating, no lease): the agent, its ticket and when the wait began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<Ticket>,
    /// Only at a parallel stage, from its first claim until the task goes past it (and,
    /// when it gave up there, until it ends): each branch's attempt, complete-by, budget
    /// and outcome (`branches.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageRun>,
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
    /// Who sent the order: the principal of its SQS `SenderId` (`ids::Sender`). Only a
    /// cancel from the same sender applies, and the same id sent by another is refused.
    /// Absent on records written before it was kept, and in runs whose messages carry no
    /// sender: any cancel applies to those, as it did before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<Sender>,
    /// Held by an operator (`Act::Pause`): no claim while set. Only on live tasks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
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
    /// Send the agent request for the claimed step, with the callback token of a callback
    /// step (the only time the token exists whole: the record keeps its digest).
    Dispatch {
        step: u32,
        action: Action,
        callback: Option<CallbackToken>,
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
    /// Paused by an operator: nothing is claimed until it is resumed.
    #[error("paused: nothing is dispatched until it is resumed")]
    Paused,
    /// Not claimable yet: held after a cancel until the cancelled attempt is over.
    #[error("held until {until}: an attempt of a cancelled task or a stopped stage may still be running")]
    Held { until: Timestamp },
    /// A Schedule for a waiting timer that came before its time: nothing changes.
    #[error("asleep until {wake_at}: woken early at {now}")]
    Asleep { wake_at: Timestamp, now: Timestamp },
    #[error("not due: deadline {deadline:?} is after {now}")]
    NotDue { deadline: Option<Timestamp>, now: Timestamp },
    /// A callback completion or heartbeat that does not apply: nothing changed.
    #[error("completion refused: {0}")]
    Completion(CompletionRefused),
    #[error("task record does not fit workflow {workflow:?}: {why}")]
    Corrupt { workflow: String, why: String },
    /// An operator's action that does not apply to the task as it is: nothing changed.
    #[error("cannot {act} a task that is {state}: {why}")]
    NotAllowed { act: &'static str, state: &'static str, why: String },
    /// A message about an order from a sender other than the one that submitted it (an
    /// app's cancel, or the same order id sent again): nothing changed. It names the
    /// message's own sender, never the submitter.
    #[error("order {order_id} was submitted by another sender{}", from_whom(.sent_by.as_ref()))]
    OtherSender { order_id: OrderId, sent_by: Option<Sender> },
}

fn from_whom(sent_by: Option<&Sender>) -> String {
    match sent_by {
        Some(s) => format!(" (this message came from {s})"),
        None => " (this message carries no sender)".to_owned(),
    }
}

fn in_doubt_unless_stored() -> bool {
    true
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why the fence (`reply.rs`) turned a reply away. Here rather than beside the fence
/// because `Refusal::StaleReply` carries it, and every file of the task returns `Refusal`.
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
    /// A branch of a parallel stage that has no dispatch in flight: it answered already,
    /// or it lapsed and waits to be dispatched again.
    #[error("branch {step} has no attempt in flight")]
    BranchIdle { step: u32 },
}

impl Cause {
    /// The step the cause is about (a branch's own, at a parallel stage).
    pub fn step(&self) -> Option<u32> {
        match self {
            Cause::Submitted => None,
            Cause::Claimed { step, .. }
            | Cause::Succeeded { step, .. }
            | Cause::Failed { step, .. }
            | Cause::DeadlinePassed { step, .. }
            | Cause::Slept { step, .. }
            | Cause::Woke { step, .. }
            | Cause::Started { step }
            | Cause::Heartbeat { step }
            | Cause::Completed { step }
            | Cause::Queued { step, .. }
            | Cause::Throttled { step, .. }
            | Cause::Operator { step, .. } => Some(*step),
        }
    }
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
            wake_at: None,
            callback: None,
            queued: None,
            stage: None,
            deadline: Some(now.plus_ms(policy.pending_timeout_ms)),
            failure_count: 0,
            step_failures: 0,
            reply_to,
            submitter: None,
            paused: false,
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
        if self.paused && s.is_terminal() {
            return Some(format!("{s:?} and paused"));
        }
        let may_hold = matches!(s, ProcessState::Compensating | ProcessState::Error | ProcessState::Pending);
        if self.hold_until.is_some() && (!may_hold || self.locked_by.is_some()) {
            return Some(format!("{s:?} held for a cancelled attempt"));
        }
        if self.queued.is_some()
            && (!matches!(s, ProcessState::Pending | ProcessState::Compensating) || self.locked_by.is_some())
        {
            return Some(format!("{s:?} waiting for a place in a gate"));
        }
        if self.wake_at.is_some() && s != ProcessState::Waiting {
            return Some(format!("{s:?} with wake time {:?}", self.wake_at));
        }
        if s == ProcessState::Waiting && self.wake_at.is_some() == self.callback.is_some() {
            return Some("Waiting for neither (or both) a timer and a callback".into());
        }
        if self.wake_at.is_some() && self.deadline != self.wake_at {
            return Some(format!("Waiting until {:?} with deadline {:?}", self.wake_at, self.deadline));
        }
        if let Some(run) = &self.stage {
            if s.is_terminal() && s != ProcessState::Error {
                return Some(format!("{s:?} keeping a stage's branches"));
            }
            if matches!(s, ProcessState::Pending | ProcessState::Processing) && run.at != self.step {
                return Some(format!(
                    "{s:?} at step {} with the branches of the stage at {}",
                    self.step, run.at
                ));
            }
            if s == ProcessState::Processing && run.latest_complete_by() > self.complete_by {
                return Some("a branch in flight past the stage's complete-by".into());
            }
            if s != ProcessState::Processing && run.branches.iter().any(|b| b.in_flight()) {
                return Some(format!("{s:?} with a branch in flight"));
            }
            if run.branches.iter().any(|b| b.attempt > self.attempt) {
                return Some("a branch's attempt ahead of the task's".into());
            }
        }
        if let Some(cb) = &self.callback {
            if !matches!(s, ProcessState::Processing | ProcessState::Waiting) {
                return Some(format!("{s:?} holding a callback"));
            }
            if (cb.step, cb.attempt) != (self.step, self.attempt) {
                return Some(format!(
                    "callback of step {} attempt {} on a task at step {} attempt {}",
                    cb.step, cb.attempt, self.step, self.attempt
                ));
            }
            if s == ProcessState::Waiting && self.deadline != Some(cb.due()) {
                return Some(format!(
                    "Waiting for a callback due {:?} with deadline {:?}",
                    cb.due(),
                    self.deadline
                ));
            }
        }
        None
    }

    pub(in crate::domain) fn moved(
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
        // A stage that gave up may have branches still out, in Error too, and after a
        // resubmit: the hold goes with the task until a claim ends it, so an operator's undo
        // or cancel still waits. Without a stage, only an undo waits for one.
        let held = match state {
            ProcessState::Compensating => true,
            ProcessState::Error | ProcessState::Pending => self.stage.is_some(),
            _ => false,
        };
        if !held {
            next.hold_until = None;
        }
        if state != ProcessState::Waiting {
            next.wake_at = None;
        }
        // Any move but another turn in the line ends the wait for a place; a pause keeps
        // the ticket, for the task to take its turn when resumed if it has not passed.
        if !matches!(trigger, Trigger::Queued | Trigger::Pause | Trigger::Resume) {
            next.queued = None;
        }
        // A callback's token lives as long as its attempt: claimed (Processing), then
        // waiting for the outside. Any other state ends the attempt, and the token with it.
        if !matches!(state, ProcessState::Processing | ProcessState::Waiting) {
            next.callback = None;
        }
        next.revision += 1;
        next.updated_at = now;
        next.last_cause = cause;
        if state.is_terminal() {
            next.deadline = None;
            next.paused = false;
            // Error keeps a stage's branches: a resubmit or an undo decides on them.
            if state != ProcessState::Error {
                next.stage = None;
            }
        }
        // A lease's end is every branch's: a reply of one still out is fenced off.
        if (next.locked_by.is_none() || state != ProcessState::Processing)
            && let Some(run) = &mut next.stage
        {
            run.land_all();
        }
        Ok(next)
    }

    pub(in crate::domain) fn unlocked(mut self) -> TaskRecord {
        self.locked_by = None;
        self.complete_by = None;
        if let Some(run) = &mut self.stage {
            run.land_all();
        }
        self
    }

    /// The branches of the parallel stage the task is at going forward, as recorded, or
    /// fresh before its first claim; `None` at a lone step or while undoing.
    pub(in crate::domain) fn stage_run(&self, wf: &Workflow) -> Option<StageRun> {
        if self.action() != Action::Do || self.state == ProcessState::Compensated {
            return None;
        }
        let stage = wf.stage_at(self.step)?;
        match &self.stage {
            Some(run) if run.at == stage.start => Some(run.clone()),
            _ => Some(StageRun::new(stage)),
        }
    }

    /// Whether step `i` may have taken effect, as a give-up, a cancel or an undo decides it
    /// from where the task is: a branch of a stage by what its record says; going forward,
    /// every step before the current one (it succeeded) and the current one when
    /// `in_doubt`; while undoing, every step below the one being undone.
    pub(in crate::domain) fn may_have_taken_effect(&self, i: u32, in_doubt: bool) -> bool {
        match &self.stage {
            Some(run) if run.contains(i) => run.branch(i).is_some_and(|b| b.may_have_taken_effect()),
            _ => match self.action() {
                Action::Do => i < self.step || (i == self.step && in_doubt),
                Action::Undo => i < self.step,
            },
        }
    }

    /// A give-up at a stage with branches still out: the undo waits until the latest of
    /// their complete-bys (the claiming scheduler adds its reply grace), so it does not
    /// overtake an effect it undoes, as after a cancel.
    pub(in crate::domain) fn hold_for_branches_out(&mut self) {
        if let Some(latest) = self.stage.as_ref().and_then(StageRun::latest_complete_by) {
            self.hold_until = Some(latest);
        }
    }

    /// How long from `now` a claim is held off (`hold_until` plus the reply grace): the
    /// delay of the Schedule that claims a held task.
    pub(in crate::domain) fn held_for_ms(&self, now: Timestamp, policy: &Policy) -> u64 {
        self.hold_until.map_or(0, |h| h.plus_ms(policy.reply_grace_ms).millis_since(now))
    }

    /// The attempt and complete-by a dispatch of `step` carries: its branch's at a stage.
    pub fn dispatch_of(&self, step: u32) -> (u32, Option<Timestamp>) {
        match self.stage.as_ref().and_then(|run| run.branch(step)).filter(|b| b.in_flight()) {
            Some(b) => (b.attempt, b.complete_by),
            None => (self.attempt, self.complete_by),
        }
    }

    /// At the start of `step`: no claim of it yet, and its failure budget whole, for the
    /// next step forward, the next to undo, or one an operator runs again.
    pub(in crate::domain) fn starting_step(mut self, step: u32) -> TaskRecord {
        self.step = step;
        self.step_attempts = 0;
        self.step_failures = 0;
        self
    }

    /// The current forward step is done (answered, or its timer woke, by `onward`): on
    /// to the next step, scheduled at once, or Processed after the last.
    pub(in crate::domain) fn step_done(
        self,
        onward: Trigger,
        now: Timestamp,
        cause: Cause,
        wf: &Workflow,
        policy: &Policy,
        name: String,
    ) -> Result<Decision, Refusal> {
        let after = wf.after(self.step);
        let mut done = self;
        // Past a stage, nothing of it is undone except as a whole: its branches all succeeded.
        done.stage = None;
        if after < wf.len() {
            Ok(Decision {
                trigger: onward,
                next: done.moved(onward, now, cause)?.waiting(now, 0, policy).starting_step(after),
                effects: vec![
                    Effect::Schedule { delay_ms: 0 },
                    Effect::Status { status: OrderStatus::StepCompleted, step: Some(name), reason: None },
                ],
            })
        } else {
            Ok(Decision {
                trigger: Trigger::Finished,
                next: done.moved(Trigger::Finished, now, cause)?.unlocked(),
                effects: vec![Effect::Status {
                    status: OrderStatus::Processed,
                    step: Some(name),
                    reason: None,
                }],
            })
        }
    }

    pub(in crate::domain) fn waiting(mut self, now: Timestamp, delay_ms: u64, policy: &Policy) -> TaskRecord {
        self.deadline = Some(now.plus_ms(delay_ms).plus_ms(policy.pending_timeout_ms));
        self.unlocked()
    }

    pub(in crate::domain) fn step_name(&self, wf: &Workflow, step: u32, action: Action) -> String {
        match (wf.step(step), action) {
            (Some(s), Action::Do) => s.name.clone(),
            (Some(s), Action::Undo) => s.compensation.clone().unwrap_or_else(|| s.name.clone()),
            (None, _) => format!("step-{step}"),
        }
    }

    pub(in crate::domain) fn check_workflow(&self, wf: &Workflow) -> Result<(), Refusal> {
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

    /// Paused, with nothing running or waiting: only a resume moves it on.
    pub fn parked(&self) -> bool {
        self.paused
            && self.locked_by.is_none()
            && matches!(self.state, ProcessState::Pending | ProcessState::Compensating)
    }

    /// Pinned to the version `wf` is (the latest, when an order is accepted).
    pub fn pinned_to(mut self, wf: &Workflow) -> TaskRecord {
        self.workflow_version = wf.version;
        self
    }

    /// Submitted by `sender` (none known: anyone may cancel it, as before senders were kept).
    pub fn submitted_by(mut self, sender: Option<Sender>) -> TaskRecord {
        self.submitter = sender;
        self
    }

    /// Whether a message from `sender` may speak for this order: always when the record
    /// knows no submitter (written before submitters were kept, or in a run without
    /// sender ids), else only when it comes from the submitter. A message without a
    /// sender does not speak for an order that has one.
    pub fn check_sender(&self, sender: Option<&Sender>) -> Result<(), Refusal> {
        match &self.submitter {
            Some(submitter) if Some(submitter) != sender => {
                Err(Refusal::OtherSender { order_id: self.order_id.clone(), sent_by: sender.cloned() })
            }
            _ => Ok(()),
        }
    }

    /// Every decision's record gets its timeline entry here, so no move goes unrecorded.
    /// `by`: who acted and why, for an operator's action.
    pub(in crate::domain) fn logged(
        &self,
        now: Timestamp,
        decided: Result<Decision, Refusal>,
        by: Option<(&str, &str)>,
    ) -> Result<Decision, Refusal> {
        let mut d = decided?;
        if d.next.parked() {
            // Paused and waiting for a claim: no Schedule (it would only be refused), and
            // off the sweep until resumed.
            d.effects.retain(|e| !matches!(e, Effect::Schedule { .. }));
            d.next.deadline = Some(now.plus_ms(PARKED_MS));
        }
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
        // At a stage, the entry names the branch its cause is about, so a timeline shows
        // the branches side by side.
        let at_stage = self.stage.is_some() || d.next.stage.is_some();
        let step = d.next.last_cause.step().filter(|_| at_stage && by.is_none()).unwrap_or(self.step);
        let entry = Entry {
            at: now,
            what: Happened::Moved(d.trigger),
            step,
            attempt: d.next.attempt,
            note,
            by: by.map(|(who, _)| who.to_owned()),
        };
        timeline::push(&mut d.next.timeline, &mut d.next.timeline_dropped, entry);
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::fixtures::*;
    use crate::domain::workflow::Step;

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
}
