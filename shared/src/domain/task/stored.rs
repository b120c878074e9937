//! The record as stored: one item, with what its phase holds as one attribute map,
//! `phase`, beside the top-level `state` and `deadline` (the due index's key). Records
//! written before the phase map, with the same fields at the top level, still read: both
//! forms are read into a draft and built, so a stored item of a shape no phase allows is
//! refused, not read.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::branches::StageRun;
use super::draft::Draft;
use super::outcome::Cause;
use super::record::TaskRecord;
use crate::domain::callback::Awaiting;
use crate::domain::gate::Ticket;
use crate::domain::ids::{LeaseToken, OrderId, Sender, Timestamp};
use crate::domain::lifecycle::ProcessState;
use crate::domain::messages::Order;
use crate::domain::output::Outputs;
use crate::domain::timeline::Entry;

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
/// What is empty, zero or the first version is left out: every byte is billed.
/// The fields after `updated_at` are read only: where records written before the phase
/// map kept what it holds.
#[derive(Serialize, Deserialize)]
struct Stored {
    order_id: OrderId,
    workflow: String,
    #[serde(default = "crate::domain::workflow::first_version", skip_serializing_if = "is_first")]
    workflow_version: u32,
    order: Arc<Order>,
    state: ProcessState,
    step: u32,
    step_attempts: u32,
    attempt: u32,
    #[serde(default, skip_serializing_if = "Held::is_empty")]
    phase: Held,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redo_until: Option<u32>,
    #[serde(default, skip_serializing_if = "is_zero")]
    failure_count: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    step_failures: u32,
    /// Absent before throttle budgets, and while nothing was throttled: zero.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    step_throttled_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    submitter: Option<Sender>,
    #[serde(default, skip_serializing_if = "Outputs::is_empty")]
    outputs: Outputs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    refused_items: Vec<u32>,
    last_cause: Cause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

fn is_first(version: &u32) -> bool {
    *version == crate::domain::workflow::first_version()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_ms(n: &u64) -> bool {
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
            step_throttled_ms: self.step_throttled_ms,
            reply_to: self.reply_to.clone(),
            submitter: self.submitter.clone(),
            outputs: Outputs::clone(&self.outputs),
            refused_items: self.refused_items.clone(),
            last_cause: self.last_cause.clone(),
            last_error: self.last_error.clone(),
            timeline: Vec::clone(&self.timeline),
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
            step_throttled_ms: s.step_throttled_ms,
            reply_to: s.reply_to,
            submitter: s.submitter,
            paused: h.paused || s.paused,
            outputs: Arc::new(s.outputs),
            refused_items: s.refused_items,
            last_cause: s.last_cause,
            last_error: s.last_error,
            timeline: Arc::new(s.timeline),
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
    use crate::domain::task::fixtures::*;
    use crate::domain::workflow::Workflow;

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
