//! Implementations of the ports. `embedded` runs in-process (for `sasctl dev`, tests
//! and the simulation); the others talk to real services.

#[cfg(feature = "aws")]
pub mod aws;
pub mod embedded;
pub mod emf;
pub mod http_remote;
pub mod system;
