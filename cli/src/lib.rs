//! `sasctl`: the local `dev` run of the whole pipeline, its invariant checker and report.

pub mod agent_fault;
pub mod args;
pub mod aws_stub;
pub mod bench;
pub mod dev;
pub mod endpoint;
pub mod invariants;
pub mod remote_sim;
pub mod report;
pub mod resources;
pub mod workflows;
