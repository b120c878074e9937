//! What every part prints the same way: times, and a task's workflow and its steps' names.

use sas::domain::{Definitions, TaskRecord, Timestamp, Workflow};

pub use crate::text::one_line;

/// ISO-8601, UTC, to the millisecond.
pub fn iso(t: Timestamp) -> String {
    crate::text::iso_ms(i64::try_from(t.0).unwrap_or(i64::MAX))
}

/// The workflow version the task runs, if the definitions hold it.
pub fn workflow_of<'a>(definitions: &'a Definitions, task: &TaskRecord) -> Option<&'a Workflow> {
    definitions.workflows.get_version(&task.workflow, task.workflow_version)
}

/// The name of step `step`, if known.
pub fn step_name(wf: Option<&Workflow>, step: u32) -> Option<String> {
    wf.and_then(|w| w.step(step)).map(|s| s.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_iso_8601_utc() {
        assert_eq!(iso(Timestamp(1_700_000_000_123)), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso(Timestamp(0)), "1970-01-01T00:00:00.000Z");
    }
}
