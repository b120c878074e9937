//! A deployment's definition file: the agents (remote services) its steps call and the
//! workflows its orders run, as a team writes them (JSON; its schema is
//! `docs/workflows.schema.json`, generated from these types). `examples/workflows.json`
//! holds the built-in workflows and is the default when a deployment names no file.
//!
//! Parsing is strict (unknown keys are errors, so a typo is not a silent default), and
//! [`DefinitionFile::check`] finds every problem at once, each naming the workflow, step
//! and field, so `sasctl workflows validate` and a function's cold start can both say
//! exactly what is wrong.
//!
//! The files' layers, lowest first; a file imports only files of lower layers
//! (`shared/tests/domain_layers.rs` holds them to it):
//!
//! 1. Peers:
//!    - `limits.rs`: the bounds (step timeouts, steps, branches, failures, names).
//!    - `problem.rs`: one problem, located, and the problems of a file that cannot be used.
//!    - `urls.rs`: the URLs a file may name (remote services, secrets' hosts, queues).
//!    - `waiting_steps.rs`: the checks of a timer step's wait and a callback step's timeout.
//! 2. `file.rs`: the file as written (the types the schema is made from), and its parse.
//! 3. Peers:
//!    - `check.rs`: every problem of a file, errors and warnings, in file order.
//!    - `previous.rs`: what publishing a file in place of the last one would break.
//!    - `shape.rs`: every shape error of a file that does not parse, each located by its
//!      agent, or its workflow and step, and its line and column.
//! 4. `checked.rs`: a checked file, ready to run, and the built-in workflows.
//! 5. `mod.rs`: this index and the re-exports.

mod check;
mod checked;
mod file;
mod limits;
mod previous;
mod problem;
mod shape;
mod urls;
mod waiting_steps;

pub use checked::{Definitions, EXAMPLE};
pub use file::{AgentDef, AgentKind, AuthDef, BreakerDef, DefinitionFile, PerKeyDef, RetryDef};
pub use limits::{
    MAX_BRANCHES, MAX_FAILURES, MAX_MAX_THROTTLED_MS, MAX_NAME_LEN, MAX_STEP_TIMEOUT_MS, MAX_STEPS,
    MIN_MAX_THROTTLED_MS, MIN_STEP_TIMEOUT_MS,
};
pub use problem::{Invalid, Problem, Severity};
pub use urls::remote_url_allowed;
