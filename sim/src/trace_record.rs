//! A landed operator action's line in the trace: the record written, field by field with
//! the phase's fields flat (a stage only when there is one), as its debug rendering was
//! before the record held its phase as one enum. The trace hash covers this line, so a
//! change of the record's layout alone moves no history's hash (scripts/sim-fingerprint.sh).

use sas::domain::TaskRecord;
use sas::handlers::{HandlerError, Operated};

pub fn operated_line(result: &Result<Operated, HandlerError>) -> String {
    match result {
        Ok(Operated::Applied { before, trigger, task }) => {
            format!("Ok(Applied {{ before: {before:?}, trigger: {trigger:?}, task: {} }})", flat(task))
        }
        other => format!("{other:?}"),
    }
}

fn flat(t: &TaskRecord) -> String {
    let stage = t.stage().map(|s| format!("stage: {:?}, ", Some(s))).unwrap_or_default();
    format!(
        "TaskRecord {{ order_id: {:?}, workflow: {:?}, workflow_version: {:?}, order: {:?}, state: {:?}, step: {:?}, \
         step_attempts: {:?}, attempt: {:?}, locked_by: {:?}, complete_by: {:?}, hold_until: {:?}, \
         redo_until: {:?}, wake_at: {:?}, callback: {:?}, queued: {:?}, {stage}deadline: {:?}, \
         failure_count: {:?}, step_failures: {:?}, reply_to: {:?}, submitter: {:?}, paused: {:?}, \
         outputs: {:?}, last_cause: {:?}, last_error: {:?}, timeline: {:?}, timeline_dropped: {:?}, \
         revision: {:?}, created_at: {:?}, updated_at: {:?} }}",
        t.order_id,
        t.workflow,
        t.workflow_version,
        t.order,
        t.state(),
        t.step,
        t.step_attempts,
        t.attempt,
        t.locked_by(),
        t.complete_by(),
        t.hold_until(),
        t.redo_until,
        t.wake_at(),
        t.callback(),
        t.queued(),
        t.deadline(),
        t.failure_count,
        t.step_failures,
        t.reply_to,
        t.submitter,
        t.paused(),
        t.outputs,
        t.last_cause,
        t.last_error,
        t.timeline,
        t.timeline_dropped,
        t.revision,
        t.created_at,
        t.updated_at
    )
}
