//! The state table's row: what a task is doing (its [`Phase`]) and what it keeps across
//! phases (its order, counters, outputs, history). Read-only outside the domain: every
//! change is a decision (`decisions.rs`).
//!
//! Stored as one item. What the phase holds is one attribute map, `phase`, beside the
//! top-level `state` and `deadline` (the due index's key); records written before the
//! phase map, with the same fields at the top level, still read.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::branches::StageRun;
use super::draft::Draft;
use super::outcome::{Cause, Policy, Refusal};
use super::phase::{Lease, Phase};
use crate::domain::callback::Awaiting;
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, OrderId, Sender, Timestamp};
use crate::domain::lifecycle::ProcessState;
use crate::domain::messages::Order;
use crate::domain::output::Outputs;
use crate::domain::timeline::Entry;
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
    pub reply_to: Option<String>,
    /// Who sent the order: the principal of its SQS `SenderId` (`ids::Sender`). Only a
    /// cancel from the same sender applies, and the same id sent by another is refused.
    /// Absent on records written before it was kept, and in runs whose messages carry no
    /// sender: any cancel applies to those, as it did before.
    pub submitter: Option<Sender>,
    /// The outputs of the forward steps that succeeded, by step name (`output.rs`).
    pub outputs: Outputs,
    pub last_cause: Cause,
    pub last_error: Option<String>,
    /// The newest moves and operator actions, oldest first (`timeline.rs`).
    pub timeline: Vec<Entry>,
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
        Draft::new(order, reply_to, now, policy).build().expect("a new task has a Pending phase")
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
    pub fn dispatch_of(&self, step: u32) -> (u32, Option<Timestamp>) {
        match self.stage().and_then(|run| run.branch(step)).filter(|b| b.in_flight()) {
            Some(b) => (b.attempt, b.complete_by),
            None => (self.attempt, self.complete_by()),
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

/// What a phase holds, as stored: one map with the fields of the record's phase.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Held {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    complete_by: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_until: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wake_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    callback: Option<Awaiting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queued: Option<Ticket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stage: Option<StageRun>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    paused: bool,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.lease.is_none()
            && self.complete_by.is_none()
            && self.hold_until.is_none()
            && self.wake_at.is_none()
            && self.callback.is_none()
            && self.queued.is_none()
            && self.stage.is_none()
            && !self.paused
    }
}

/// The stored item. `deadline` stays at the top level: the due index is keyed on it.
/// The fields after `updated_at` are read only: where records written before the phase
/// map kept what it holds.
#[derive(Serialize, Deserialize)]
struct Stored {
    order_id: OrderId,
    workflow: String,
    #[serde(default = "crate::domain::workflow::first_version")]
    workflow_version: u32,
    order: Arc<Order>,
    state: ProcessState,
    step: u32,
    step_attempts: u32,
    attempt: u32,
    #[serde(default, skip_serializing_if = "Held::is_empty")]
    phase: Held,
    deadline: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redo_until: Option<u32>,
    failure_count: u32,
    #[serde(default)]
    step_failures: u32,
    reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    submitter: Option<Sender>,
    #[serde(default, skip_serializing_if = "Outputs::is_empty")]
    outputs: Outputs,
    last_cause: Cause,
    last_error: Option<String>,
    #[serde(default)]
    timeline: Vec<Entry>,
    #[serde(default, skip_serializing_if = "is_zero")]
    timeline_dropped: u32,
    revision: u64,
    created_at: Timestamp,
    updated_at: Timestamp,
    #[serde(default, skip_serializing)]
    locked_by: Option<LeaseToken>,
    #[serde(default, skip_serializing)]
    complete_by: Option<Timestamp>,
    #[serde(default, skip_serializing)]
    hold_until: Option<Timestamp>,
    #[serde(default, skip_serializing)]
    wake_at: Option<Timestamp>,
    #[serde(default, skip_serializing)]
    callback: Option<Awaiting>,
    #[serde(default, skip_serializing)]
    queued: Option<Ticket>,
    #[serde(default, skip_serializing)]
    stage: Option<StageRun>,
    #[serde(default, skip_serializing)]
    paused: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Serialize for TaskRecord {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let p = &self.phase;
        let held = Held {
            lease: self.locked_by(),
            complete_by: self.complete_by(),
            hold_until: p.hold_until(),
            wake_at: p.wake_at(),
            callback: p.callback().cloned(),
            queued: p.queued().cloned(),
            stage: p.stage().cloned(),
            paused: p.paused(),
        };
        Stored {
            order_id: self.order_id.clone(),
            workflow: self.workflow.clone(),
            workflow_version: self.workflow_version,
            order: self.order.clone(),
            state: self.state(),
            step: self.step,
            step_attempts: self.step_attempts,
            attempt: self.attempt,
            phase: held,
            deadline: self.deadline(),
            redo_until: self.redo_until,
            failure_count: self.failure_count,
            step_failures: self.step_failures,
            reply_to: self.reply_to.clone(),
            submitter: self.submitter.clone(),
            outputs: self.outputs.clone(),
            last_cause: self.last_cause.clone(),
            last_error: self.last_error.clone(),
            timeline: self.timeline.clone(),
            timeline_dropped: self.timeline_dropped,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
            locked_by: None,
            complete_by: None,
            hold_until: None,
            wake_at: None,
            callback: None,
            queued: None,
            stage: None,
            paused: false,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TaskRecord {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TaskRecord, D::Error> {
        let s = Stored::deserialize(deserializer)?;
        let h = s.phase;
        let draft = Draft {
            order_id: s.order_id,
            workflow: s.workflow,
            workflow_version: s.workflow_version,
            order: s.order,
            state: s.state,
            step: s.step,
            step_attempts: s.step_attempts,
            attempt: s.attempt,
            locked_by: h.lease.or(s.locked_by),
            complete_by: h.complete_by.or(s.complete_by),
            hold_until: h.hold_until.or(s.hold_until),
            redo_until: s.redo_until,
            wake_at: h.wake_at.or(s.wake_at),
            callback: h.callback.or(s.callback),
            queued: h.queued.or(s.queued),
            stage: h.stage.or(s.stage),
            deadline: s.deadline,
            failure_count: s.failure_count,
            step_failures: s.step_failures,
            reply_to: s.reply_to,
            submitter: s.submitter,
            paused: h.paused || s.paused,
            outputs: s.outputs,
            last_cause: s.last_cause,
            last_error: s.last_error,
            timeline: s.timeline,
            timeline_dropped: s.timeline_dropped,
            revision: s.revision,
            created_at: s.created_at,
            updated_at: s.updated_at,
        };
        draft.build().map_err(serde::de::Error::custom)
    }
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
        // A task that retries forever keeps only the newest entries, and counts the rest.
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
    }

    /// The stored form: what the phase holds is one map; the deadline stays at the top.
    #[test]
    fn a_record_is_stored_with_its_phase_in_one_map_and_reads_back() {
        let wf = Workflow::three_step();
        let claimed = claim(&new_task(&wf), &wf, 1, T0);
        let json = serde_json::to_value(&claimed).unwrap();
        assert_eq!(json["state"], "Processing");
        assert_eq!(json["phase"]["lease"], serde_json::to_value(lease(1)).unwrap());
        assert_eq!(json["phase"]["complete_by"], serde_json::to_value(claimed.complete_by()).unwrap());
        assert_eq!(json["deadline"], serde_json::to_value(claimed.deadline()).unwrap());
        for flat in ["locked_by", "complete_by", "wake_at", "callback", "queued", "stage", "paused"] {
            assert!(json.get(flat).is_none(), "{flat} is not stored at the top: {json}");
        }
        assert_eq!(serde_json::from_value::<TaskRecord>(json).unwrap(), claimed);
        // A record with nothing held stores no phase map.
        let fresh = serde_json::to_value(new_task(&wf)).unwrap();
        assert!(fresh.get("phase").is_none(), "{fresh}");
    }

    /// Records written before the phase map kept its fields at the top level: they read
    /// as the same record.
    #[test]
    fn a_record_written_before_the_phase_map_still_reads() {
        let wf = Workflow::three_step();
        let claimed = claim(&new_task(&wf), &wf, 1, T0);
        let mut old = serde_json::to_value(&claimed).unwrap();
        let held = old.as_object_mut().unwrap().remove("phase").unwrap();
        old["locked_by"] = held["lease"].clone();
        old["complete_by"] = held["complete_by"].clone();
        old["hold_until"] = serde_json::Value::Null;
        assert_eq!(serde_json::from_value::<TaskRecord>(old).unwrap(), claimed);
        // And one whose fields break the record's shape is refused, not read.
        let mut broken = serde_json::to_value(&claimed).unwrap();
        broken["state"] = "Pending".into();
        let err = serde_json::from_value::<TaskRecord>(broken).unwrap_err();
        assert!(err.to_string().contains("holding a lease"), "{err}");
    }
}
