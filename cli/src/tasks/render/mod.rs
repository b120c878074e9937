//! How tasks are printed: a table row and a JSON object per listed task, a record with
//! its timeline, and the command lines an operator can paste next.
//!
//! The files, each using only those listed before it (this index only declares them and
//! re-exports what the commands use):
//!
//! - `basics.rs`: what every part prints the same way (times, a task's workflow, step names);
//! - `waits.rs`: what a waiting task waits for (a timer, a callback, a place in a gate);
//! - `stage.rs`: a parallel stage and its branches side by side;
//! - `map.rs`: a map step, how far it is over its items, and the items worth a look;
//! - `timeline.rs`: the timeline's entries, each in its lane at a stage;
//! - `summary.rs`: a listed task, as a table row and as a JSON object;
//! - `commands.rs`: the command lines that apply to a task;
//! - `record.rs`: one task's record as `show` prints it.
//!
//! Nothing here reads the clock or the deployment: the callers pass `now`.

mod basics;
mod commands;
mod map;
mod record;
mod stage;
mod summary;
mod timeline;
mod waits;

pub use basics::{iso, one_line, step_name, workflow_of};
pub use commands::{deployment_flags, next_commands, shell_word};
pub use map::{MapPhase, map_view};
pub use record::{show_json, show_text};
pub use summary::{table_at, task_summary_json};
pub use waits::{queued_line, span, throttled_until};
