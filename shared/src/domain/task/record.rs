//! The state table's row: what a task is doing (its [`Phase`]) and what it keeps across
//! phases (its order, counters, outputs, history). Read-only outside the domain: every
//! change is a decision (`decisions.rs`).
//!
//! Stored as one item (`stored.rs`).

use std::sync::Arc;

use super::branches::StageRun;
use super::outcome::{Cause, Effect, Policy, Refusal};
use super::phase::{Lease, Phase};
use crate::domain::callback::Awaiting;
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, OrderId, Sender, Timestamp};
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::messages::Order;
use crate::domain::output::Outputs;
use crate::domain::timeline::{Entry, Happened};
use crate::domain::workflow::{Action, Workflow};

/// The state table's row. It carries the order it runs, so accepting an order is one
/// conditional write of one item and claiming a step reads the order with the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version of `workflow` the task was accepted under, and runs to its end
    /// whatever is published after.
    pub workflow_version: u32,
    /// The validated order as accepted; never changes. Shared, because records are
    /// copied at every decision and the order is the largest part of them.
    pub order: Arc<Order>,
    /// Forward: the step to run next (or running). Compensating: the step being undone.
    pub step: u32,
    /// Claims of the current step: non-zero means its remote effect may have happened.
    pub step_attempts: u32,
    /// Claims of this task, all steps; echoed by agents and fenced on.
    pub attempt: u32,
    /// The state and what the task holds in it.
    pub(super) phase: Phase,
    /// Resubmitted from an earlier step than the one it failed at: the steps up to this
    /// one took effect (or may have) on the first way through. Until the task is past it,
    /// nothing is undone: a give-up stops in Error and a cancel is refused.
    pub redo_until: Option<u32>,
    /// Only grows.
    pub failure_count: u32,
    /// Lapses of the current step in the current direction: its failure budget's use.
    /// Starts again at zero when the task moves to another step or starts undoing.
    pub step_failures: u32,
    /// How long in all the current step's remote has asked it to wait (Throttled), in the
    /// current direction: its throttle budget's use (`Step::max_throttled_ms`). Starts
    /// again at zero with `step_failures`.
    pub step_throttled_ms: u64,
    pub reply_to: Option<String>,
    /// Who sent the order: the principal of its SQS `SenderId` (`ids::Sender`). Only a
    /// cancel from the same sender applies, and the same id sent by another is refused.
    /// Absent on records written before it was kept, and in runs whose messages carry no
    /// sender: any cancel applies to those, as it did before.
    pub submitter: Option<Sender>,
    /// The outputs of the forward steps that succeeded, by step name (`output.rs`).
    /// Shared, as the order is: most decisions copy the record and change no output.
    pub outputs: Arc<Outputs>,
    /// The items a finished map step tolerated as refused (they had no effect): an undo
    /// of the map later passes over them. Empty until a map finishes with refusals.
    pub refused_items: Vec<u32>,
    pub last_cause: Cause,
    pub last_error: Option<String>,
    /// The newest moves and operator actions, oldest first (`timeline.rs`). Shared: a
    /// decision copies it once, when it adds its entry, and reads and writes none.
    pub timeline: Arc<Vec<Entry>>,
    /// Older entries let go to keep the record small.
    pub timeline_dropped: u32,
    /// Bumped by every write; every write is conditional on the revision it read.
    pub revision: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl TaskRecord {
    /// A task just accepted: Pending at its first step, due after the pending timeout.
    pub fn new(order: &Order, reply_to: Option<String>, now: Timestamp, policy: &Policy) -> TaskRecord {
        TaskRecord {
            order_id: order.order_id.clone(),
            workflow: order.workflow.clone(),
            workflow_version: 1,
            order: Arc::new(order.clone()),
            step: 0,
            step_attempts: 0,
            attempt: 0,
            phase: Phase::pending(now.plus_ms(policy.pending_timeout_ms)),
            redo_until: None,
            failure_count: 0,
            step_failures: 0,
            step_throttled_ms: 0,
            reply_to,
            submitter: None,
            outputs: Arc::default(),
            refused_items: Vec::new(),
            last_cause: Cause::Submitted,
            last_error: None,
            timeline: Arc::new(vec![Entry {
                at: now,
                what: Happened::Submitted,
                step: 0,
                attempt: 0,
                step_attempt: None,
                note: None,
                by: None,
            }]),
            timeline_dropped: 0,
            revision: 1,
            created_at: now,
            updated_at: now,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// This record in `phase`, set by hand rather than by a decision: for fixtures and
    /// benchmarks that need a task in a given state. The write paths' checks still hold
    /// every record to the rules types cannot state (`shape_violation`).
    pub fn with_phase(mut self, phase: Phase) -> TaskRecord {
        self.phase = phase;
        self
    }

    pub fn state(&self) -> ProcessState {
        self.phase.state()
    }

    /// When the supervisor acts if nothing else has; `None` exactly when ended.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.phase.deadline()
    }

    /// LockedBy: the live lease's token, if claimed.
    pub fn locked_by(&self) -> Option<LeaseToken> {
        self.phase.lease().map(|l| l.token)
    }

    /// The live lease's complete-by.
    pub fn complete_by(&self) -> Option<Timestamp> {
        self.phase.lease().map(|l| l.complete_by)
    }

    pub fn lease(&self) -> Option<&Lease> {
        self.phase.lease()
    }

    /// No claim before this plus the reply grace: an attempt of a cancelled task, or
    /// branches of a stopped stage, may still be out until then.
    pub fn hold_until(&self) -> Option<Timestamp> {
        self.phase.hold_until()
    }

    /// A waiting timer's wake time.
    pub fn wake_at(&self) -> Option<Timestamp> {
        self.phase.wake_at()
    }

    /// A callback step's wait, from its claim until the step ends.
    pub fn callback(&self) -> Option<&Awaiting> {
        self.phase.callback()
    }

    /// Its place in the line of its step's agent's gate, while it waits for one.
    pub fn queued(&self) -> Option<&Ticket> {
        self.phase.queued()
    }

    /// A parallel stage's branches, as recorded.
    pub fn stage(&self) -> Option<&StageRun> {
        self.phase.stage()
    }

    /// Held by an operator: nothing new is dispatched until it is resumed.
    pub fn paused(&self) -> bool {
        self.phase.paused()
    }

    /// The action the current step runs in: compensation undoes, everything else does.
    pub fn action(&self) -> Action {
        if matches!(self.state(), ProcessState::Compensating | ProcessState::Compensated) {
            Action::Undo
        } else {
            Action::Do
        }
    }

    /// Paused, with nothing running or waiting: only a resume moves it on.
    pub fn parked(&self) -> bool {
        self.paused() && self.phase.unclaimed().is_some()
    }

    /// The shape rules that types cannot state (the rest are `Phase`'s): a stage's
    /// branches and a callback's wait belong to the step and attempt the task is at.
    pub fn shape_violation(&self) -> Option<String> {
        let s = self.state();
        if let Some(run) = self.stage() {
            if matches!(s, ProcessState::Pending | ProcessState::Processing) && run.at != self.step {
                return Some(format!(
                    "{s:?} at step {} with the branches of the stage at {}",
                    self.step, run.at
                ));
            }
            if s == ProcessState::Processing && run.latest_complete_by() > self.complete_by() {
                return Some("a branch in flight past the stage's complete-by".into());
            }
            if s != ProcessState::Processing && run.branches.iter().any(|b| b.in_flight()) {
                return Some(format!("{s:?} with a branch in flight"));
            }
            if run.branches.iter().any(|b| b.attempt > self.attempt) {
                return Some("a branch's attempt ahead of the task's".into());
            }
        }
        if let Some(cb) = self.callback()
            && (cb.step, cb.attempt) != (self.step, self.attempt)
        {
            return Some(format!(
                "callback of step {} attempt {} on a task at step {} attempt {}",
                cb.step, cb.attempt, self.step, self.attempt
            ));
        }
        None
    }

    /// The attempt and complete-by a dispatch of `step` carries: its branch's at a stage.
    /// A map item's (`index`) by its own branch.
    pub fn dispatch_of(&self, step: u32, index: Option<u32>) -> (u32, Option<Timestamp>) {
        match self.stage().and_then(|run| run.slot(step, index)).filter(|b| b.in_flight()) {
            Some(b) => (b.attempt, b.complete_by),
            None => (self.attempt, self.complete_by()),
        }
    }

    /// Item `index` of the map step `step`, read from where the map takes its items.
    pub fn map_item(&self, wf: &Workflow, step: u32, index: u32) -> Result<serde_json::Value, String> {
        let map = wf.map_at(step).ok_or_else(|| format!("step {step} is not a map's"))?;
        let path = map.items_path()?;
        let items = path.resolve(|| self.order_items(), &self.outputs).map_err(|e| e.to_string())?;
        items.into_iter().nth(index as usize).ok_or_else(|| format!("{path} has no item {index}"))
    }

    /// The order's lines as JSON: a map's items when it takes them from the order.
    pub fn order_items(&self) -> serde_json::Value {
        serde_json::to_value(&self.order.items).unwrap_or_default()
    }

    /// Item `index`'s output: from the map's run while it has one, else from the array
    /// kept under the map's name once it finished.
    pub fn item_output(&self, wf: &Workflow, step: u32, index: u32) -> Option<serde_json::Value> {
        if let Some(output) =
            self.stage().and_then(|run| run.slot(step, Some(index))).and_then(|b| b.output.as_ref())
        {
            return Some(output.to_value());
        }
        let map = wf.map_at(step)?;
        // A run rebuilt for an undo keeps no outputs: the finished map's array has them.
        match self.outputs.get(&map.name)?.to_value() {
            serde_json::Value::Array(mut items) if (index as usize) < items.len() => {
                Some(items.swap_remove(index as usize)).filter(|v| !v.is_null())
            }
            _ => None,
        }
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
}

/// A decision: the move it makes, the record it writes, and what to do once that write
/// has landed. Inside the task module `next` is still a working copy (`Decision<Draft>`);
/// every public decision hands back a built record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<R = TaskRecord> {
    pub trigger: Trigger,
    pub next: R,
    pub effects: Vec<Effect>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::Trigger;
    use crate::domain::task::fixtures::*;
    use crate::domain::timeline::{self, Happened};
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
        // A task that retries forever keeps Submitted and the newest entries, and counts
        // the rest.
        let mut t = claim(&new_task(&wf), &wf, 1, T0);
        let mut moves = 2;
        for n in 0..40u128 {
            t.step_failures = 0;
            t = lapse(&t, &wf, 0).next;
            t = claim(&t, &wf, 10 + n, t.deadline().unwrap());
            moves += 2;
        }
        assert_eq!(t.timeline.len(), timeline::TIMELINE_LEN);
        assert_eq!(t.timeline_dropped as usize + t.timeline.len(), moves);
        assert_eq!((t.timeline[0].what, t.timeline[0].at), (Happened::Submitted, T0));
        let last = t.timeline.last().unwrap();
        assert_eq!(
            (last.what, last.attempt, last.step_attempt()),
            (Happened::Moved(Trigger::Claimed), 41, 41)
        );
        let before = &t.timeline[t.timeline.len() - 2];
        assert_eq!((before.what, before.attempt), (Happened::Moved(Trigger::Retry), 40));
    }
}
