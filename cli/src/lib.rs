//! `sasctl`: `dev`, the whole pipeline in one process with its invariant checker and
//! report; `bench`, the benchmarks of docs/BENCHMARKS.md; `workflows`, checking a
//! definition file; `dlq`, reading and redriving a deployment's dead-letter queues
//! (finding the deployment: `deployment`); `tasks`, listing, showing and acting on a
//! deployment's tasks; `agents`, the limited agents' gates; `console`, a local web page
//! over all of them.

pub mod agent_fault;
pub mod agents;
pub mod args;
pub mod aws_stub;
pub mod bench;
pub mod console;
pub mod deployment;
pub mod dev;
pub mod dev_command;
pub mod dlq;
pub mod endpoint;
#[cfg(test)]
mod fixtures;
pub mod history;
pub mod invariants;
pub mod pump;
pub mod remote_sim;
pub mod report;
pub mod resources;
pub mod tap;
pub mod tasks;
pub mod text;
pub mod up;
pub mod up_command;
pub mod workflows;
