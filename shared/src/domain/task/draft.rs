//! A decision's working copy of the record, and the moves every decision shares: through
//! the transition table (`moved`) and into the timeline (`logged`). A draft becomes a
//! record only through `build`, which refuses one that fits no phase of its state.

use std::sync::Arc;

use super::branches::{Outcome, StageRun};
use super::outcome::{Cause, Effect, PARKED_MS, Policy, Refusal};
use super::phase::{Claim, Lease, Phase, Unclaimed, WaitingFor};
use super::record::{Decision, TaskRecord};
use crate::domain::callback::Awaiting;
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, OrderId, Sender, Timestamp};
use crate::domain::lifecycle::{self, ProcessState, Trigger};
use crate::domain::map::MapStep;
use crate::domain::messages::{Order, OrderStatus};
use crate::domain::output::{Outputs, StepOutput};
use crate::domain::timeline::{self, Entry, Happened};
use crate::domain::workflow::{Action, Workflow};

/// A decision's working copy of the record: every field any phase may hold, flat, as the
/// moves that every decision shares (below) read and set them. It never leaves the domain
/// and is never stored: `Draft::build` (`phase.rs`) turns it into a [`TaskRecord`], whose
/// phase holds exactly what its state allows, and refuses a draft that breaks that shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::domain) struct Draft {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version of `workflow` the task was accepted under, and runs to its end
    /// whatever is published after.
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
    pub hold_until: Option<Timestamp>,
    /// Resubmitted from an earlier step than the one it failed at: the steps up to this
    /// one took effect (or may have) on the first way through. Until the task is past it,
    /// nothing is undone: a give-up stops in Error and a cancel is refused.
    pub redo_until: Option<u32>,
    /// Only while Waiting: when its timer step wakes (the deadline too, so the due index
    /// brings the supervisor then). Kept apart from the deadline because a later kind of
    /// wait (for an outside event) has a deadline that is not a wake time.
    pub wake_at: Option<Timestamp>,
    /// Only at a callback step, from its claim until the step ends (Processing while its
    /// agent starts the work, then Waiting): the attempt whose token completes it, the
    /// token's digest, and when it is due (`callback.rs`).
    pub callback: Option<Awaiting>,
    /// Only while the task waits for a place in its step's agent's gate (Pending or
    /// Compensating, no lease): the agent, its ticket and when the wait began.
    pub queued: Option<Ticket>,
    /// Only at a parallel stage, from its first claim until the task goes past it (and,
    /// when it gave up there, until it ends): each branch's attempt, complete-by, budget
    /// and outcome (`branches.rs`).
    pub stage: Option<StageRun>,
    /// When the supervisor acts if nothing else has. `None` exactly when terminal,
    /// which keeps finished tasks out of the sparse due index.
    pub deadline: Option<Timestamp>,
    /// Only grows.
    pub failure_count: u32,
    /// Lapses of the current step in the current direction: its failure budget's use.
    /// Starts again at zero when the task moves to another step or starts undoing.
    pub step_failures: u32,
    /// The current step's throttled wait so far (`TaskRecord::step_throttled_ms`).
    pub step_throttled_ms: u64,
    pub reply_to: Option<String>,
    /// Who sent the order: the principal of its SQS `SenderId` (`ids::Sender`). Only a
    /// cancel from the same sender applies, and the same id sent by another is refused.
    /// Absent on records written before it was kept, and in runs whose messages carry no
    /// sender: any cancel applies to those, as it did before.
    pub submitter: Option<Sender>,
    /// Held by an operator (`Act::Pause`): no claim while set. Only on live tasks.
    pub paused: bool,
    /// The outputs of the forward steps that succeeded, by step name (`output.rs`).
    pub outputs: Arc<Outputs>,
    /// The items a finished map step tolerated as refused (they had no effect): an undo
    /// of the map later passes over them. Empty until a map finishes with refusals.
    pub refused_items: Vec<u32>,
    pub last_cause: Cause,
    pub last_error: Option<String>,
    /// The newest moves and operator actions, oldest first (`timeline.rs`).
    pub timeline: Arc<Vec<Entry>>,
    /// Older entries let go to keep the record small.
    pub timeline_dropped: u32,
    /// Bumped by every write; every write is conditional on the revision it read.
    pub revision: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Draft {
    /// The action the current step runs in: compensation undoes, everything else does.
    pub(in crate::domain) fn action(&self) -> Action {
        if matches!(self.state, ProcessState::Compensating | ProcessState::Compensated) {
            Action::Undo
        } else {
            Action::Do
        }
    }

    pub(in crate::domain) fn moved(
        &self,
        trigger: Trigger,
        now: Timestamp,
        cause: Cause,
    ) -> Result<Draft, Refusal> {
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

    pub(in crate::domain) fn unlocked(mut self) -> Draft {
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
            Some(run) if run.map && run.at == i => run.next_to_undo().is_some(),
            Some(run) if !run.map && run.contains(i) => {
                run.branch(i).is_some_and(|b| b.may_have_taken_effect())
            }
            _ => match self.action() {
                Action::Do => i < self.step || (i == self.step && in_doubt),
                Action::Undo => i < self.step,
            },
        }
    }

    /// The items of the map step at `at` as an undo decides on them: as recorded while
    /// its run is kept (it stopped there, or its undo began), else rebuilt from what a
    /// finished map keeps: the array of its outputs (one per item) and the items it
    /// tolerated as refused. Every other item of a finished map succeeded.
    pub(in crate::domain) fn map_run_for_undo(&self, wf: &Workflow, at: u32) -> StageRun {
        if let Some(run) = self.stage.as_ref().filter(|r| r.map && r.at == at) {
            return run.clone();
        }
        let done = wf
            .map_at(at)
            .filter(|_| at < self.step || self.action() == Action::Undo)
            .and_then(|m| self.outputs.get(&m.name))
            .and_then(|o| match o.to_value() {
                serde_json::Value::Array(items) => Some(items.len()),
                _ => None,
            })
            .unwrap_or(0);
        let mut run = StageRun::for_map(at, done);
        for (i, b) in run.branches.iter_mut().enumerate() {
            b.dispatches = 1;
            b.outcome = match self.refused_items.contains(&(i as u32)) {
                true => Outcome::Refused,
                false => Outcome::Succeeded,
            };
        }
        run
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

    /// At the start of `step`: no claim of it yet, and its failure budget whole, for the
    /// next step forward, the next to undo, or one an operator runs again.
    pub(in crate::domain) fn starting_step(mut self, step: u32) -> Draft {
        self.step = step;
        self.step_attempts = 0;
        self.step_failures = 0;
        self.step_throttled_ms = 0;
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
    ) -> Result<Decision<Draft>, Refusal> {
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

    /// A map step is done (every item answered, at most `tolerated_failures` refused, or
    /// no items at all): its items' outputs become one array under its name, in item
    /// order, its refused items are kept for an undo later, and the task goes on.
    pub(in crate::domain) fn map_done(
        mut self,
        map: &MapStep,
        now: Timestamp,
        cause: Cause,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let run = self.stage.take().unwrap_or_else(|| StageRun::for_map(self.step, 0));
        let array = StepOutput::array(run.branches.iter().map(|b| b.output.as_ref()));
        Arc::make_mut(&mut self.outputs).insert(map.name.clone(), array);
        self.refused_items = (0u32..)
            .zip(&run.branches)
            .filter(|(_, b)| b.outcome == Outcome::Refused)
            .map(|(i, _)| i)
            .collect();
        self.step_done(Trigger::Advanced, now, cause, wf, policy, map.name.clone())
    }

    pub(in crate::domain) fn waiting(mut self, now: Timestamp, delay_ms: u64, policy: &Policy) -> Draft {
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
    pub(in crate::domain) fn parked(&self) -> bool {
        self.paused
            && self.locked_by.is_none()
            && matches!(self.state, ProcessState::Pending | ProcessState::Compensating)
    }

    /// Every decision's record gets its timeline entry here, so no move goes unrecorded.
    /// `by`: who acted and why, for an operator's action.
    pub(in crate::domain) fn logged(
        &self,
        now: Timestamp,
        decided: Result<Decision<Draft>, Refusal>,
        by: Option<(&str, &str)>,
    ) -> Result<Decision<Draft>, Refusal> {
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
            // The step's own count after the move, or before it when the move began a new
            // count (the step went on, or its undoing began): the attempt the move ended.
            step_attempt: Some(if d.next.step_attempts == 0 {
                self.step_attempts
            } else {
                d.next.step_attempts
            }),
            note,
            by: by.map(|(who, _)| who.to_owned()),
        };
        timeline::push(Arc::make_mut(&mut d.next.timeline), &mut d.next.timeline_dropped, entry);
        Ok(d)
    }
}

impl Draft {
    /// The phase this draft describes, or why it describes none: the shape rules that
    /// types state. It takes what the phase holds out of the draft (a decision's draft is
    /// built once), and words a broken rule only when one breaks.
    fn phase(&mut self) -> Result<Phase, String> {
        let s = self.state;
        let lease = match (self.locked_by, self.complete_by) {
            (Some(token), Some(complete_by)) => Some(Lease { token, complete_by }),
            (None, None) => None,
            _ => return Err("LockedBy and CompleteBy disagree".into()),
        };
        let deadline = self.deadline;
        let due = || deadline.ok_or_else(|| format!("{s:?} with deadline None"));
        let none = |what: &dyn Fn() -> String, held: bool| {
            if held { Err(format!("{s:?} {}", what())) } else { Ok(()) }
        };
        let fixed = |what: &'static str| move || what.to_owned();
        if !matches!(s, ProcessState::Pending | ProcessState::Compensating | ProcessState::Error) {
            none(&fixed("held for a cancelled attempt"), self.hold_until.is_some())?;
        }
        if s != ProcessState::Waiting {
            let wake_at = self.wake_at;
            none(&|| format!("with wake time {wake_at:?}"), wake_at.is_some())?;
        }
        if !matches!(s, ProcessState::Processing | ProcessState::Waiting) {
            none(&fixed("holding a callback"), self.callback.is_some())?;
        }
        if !matches!(s, ProcessState::Pending | ProcessState::Compensating) || lease.is_some() {
            none(&fixed("waiting for a place in a gate"), self.queued.is_some())?;
        }
        if !matches!(s, ProcessState::Processing | ProcessState::Compensating) {
            none(&fixed("holding a lease"), lease.is_some())?;
        }
        if s.is_terminal() {
            none(&|| format!("with deadline {deadline:?}"), deadline.is_some())?;
            none(&fixed("and paused"), self.paused)?;
            if s != ProcessState::Error {
                none(&fixed("keeping a stage's branches"), self.stage.is_some())?;
            }
        }
        let paused = self.paused;
        let hold_until = self.hold_until;
        Ok(match s {
            ProcessState::Pending => Phase::Pending {
                due: due()?,
                wait: Unclaimed { hold_until, queued: self.queued.take() },
                stage: self.stage.take(),
                paused,
            },
            ProcessState::Processing => Phase::Processing {
                due: due()?,
                lease: lease.ok_or("Processing without a lease")?,
                callback: self.callback.take(),
                stage: self.stage.take(),
                paused,
            },
            ProcessState::Waiting => {
                none(&fixed("keeping a stage's branches"), self.stage.is_some())?;
                let wait = match (self.wake_at, self.callback.take()) {
                    (Some(wake_at), None) => WaitingFor::Timer { wake_at },
                    (None, Some(cb)) => WaitingFor::Callback(cb),
                    _ => return Err("Waiting for neither (or both) a timer and a callback".into()),
                };
                let phase = Phase::Waiting { wait, paused };
                if phase.deadline() != deadline {
                    return Err(format!("Waiting until {:?} with deadline {deadline:?}", phase.deadline()));
                }
                phase
            }
            ProcessState::Compensating => {
                if lease.is_some() {
                    none(&fixed("held for a cancelled attempt"), hold_until.is_some())?;
                }
                let claim = match lease {
                    Some(lease) => Claim::Leased(lease),
                    None => Claim::Unclaimed(Unclaimed { hold_until, queued: self.queued.take() }),
                };
                Phase::Compensating { due: due()?, claim, stage: self.stage.take(), paused }
            }
            ProcessState::Processed => Phase::Processed,
            ProcessState::Error => Phase::Error { stage: self.stage.take(), hold_until },
            ProcessState::Compensated => Phase::Compensated,
        })
    }

    /// The record this draft describes. A draft that breaks the record's shape is a bug
    /// in the decision that made it: refused as a corrupt record, so nothing is written.
    pub(in crate::domain) fn build(mut self) -> Result<TaskRecord, Refusal> {
        let corrupt = |workflow: &str, why: String| Refusal::Corrupt { workflow: workflow.to_owned(), why };
        let phase = self.phase().map_err(|why| corrupt(&self.workflow, why))?;
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
            step_throttled_ms: self.step_throttled_ms,
            reply_to: self.reply_to,
            submitter: self.submitter,
            outputs: self.outputs,
            refused_items: self.refused_items,
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
            step_throttled_ms: self.step_throttled_ms,
            reply_to: self.reply_to.clone(),
            submitter: self.submitter.clone(),
            paused: p.paused(),
            outputs: self.outputs.clone(),
            refused_items: self.refused_items.clone(),
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
