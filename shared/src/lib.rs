//! sas: the Scheduler Agent Supervisor pattern on AWS Lambda.
//!
//! `domain` is pure; `ports` are the traits the handlers need; `adapters` implement
//! them (embedded in-process, and the real services); `handlers` are the four
//! functions' logic, shared by the Lambda binaries and `sasctl dev`.

pub mod adapters;
pub mod config;
pub mod domain;
pub mod handlers;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod mutations;
pub mod ports;
