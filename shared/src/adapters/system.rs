//! The real clock and real randomness.
//!
//! A lease token is a capability: whoever holds it can send a fenced reply for that
//! attempt, and queue workers in any language see the leases of the requests they serve.
//! So a deployment's leases come from the operating system's generator (`SystemRandom`),
//! never from a fast generator whose state its outputs give away. Seeded runs (the
//! simulation, `sasctl dev --seed`, tests) keep a replayable source (`FastRandom`) behind
//! the same port.

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::domain::CallbackSecret;
use crate::domain::{LeaseToken, Timestamp};
use crate::ports::{Clock, Random};

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Timestamp(since.as_millis() as u64)
    }
    async fn sleep_until(&self, until: Timestamp) {
        let wait = until.millis_since(self.now());
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
    }
}

/// A deployment's randomness: leases from the operating system's generator (a version-4
/// UUID, 122 random bits), jitter from a fast generator seeded from it (jitter is no
/// secret).
#[derive(Debug)]
pub struct SystemRandom(std::sync::Mutex<fastrand::Rng>);

impl SystemRandom {
    pub fn new() -> SystemRandom {
        SystemRandom(std::sync::Mutex::new(fastrand::Rng::with_seed(uuid::Uuid::new_v4().as_u64_pair().0)))
    }
}

impl Default for SystemRandom {
    fn default() -> Self {
        SystemRandom::new()
    }
}

impl Random for SystemRandom {
    fn lease(&self) -> LeaseToken {
        LeaseToken(uuid::Uuid::new_v4())
    }
    fn jitter(&self) -> u64 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).u64(..)
    }
    fn callback_secret(&self) -> CallbackSecret {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 32];
        // The operating system's generator failing is not something to carry on from: a
        // token with a guessable secret would be worse than a claim that does not happen.
        ring::rand::SystemRandom::new().fill(&mut bytes).expect("the operating system's random generator");
        CallbackSecret(bytes)
    }
}

/// Replayable leases and jitter from a seeded generator, for in-process runs only: its
/// leases are as predictable as its seed.
#[derive(Debug)]
pub struct FastRandom(std::sync::Mutex<fastrand::Rng>);

impl FastRandom {
    pub fn seeded(seed: u64) -> FastRandom {
        FastRandom(std::sync::Mutex::new(fastrand::Rng::with_seed(seed)))
    }
    fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Random for FastRandom {
    fn lease(&self) -> LeaseToken {
        // A version-4 UUID built from the generator, so seeded runs replay their leases.
        let bits = self.with(|r| r.u128(..));
        LeaseToken(uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid())
    }
    fn jitter(&self) -> u64 {
        self.with(|r| r.u64(..))
    }
    fn callback_secret(&self) -> CallbackSecret {
        let (a, b) = self.with(|r| (r.u128(..), r.u128(..)));
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&a.to_le_bytes());
        bytes[16..].copy_from_slice(&b.to_le_bytes());
        CallbackSecret(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deployment's leases owe nothing to a fast generator's state: with fastrand's
    /// thread-local state set alike, two sources still give different leases (a source
    /// seeded from that state, as `fastrand::Rng::new()` is, would give the same).
    #[test]
    fn a_deployments_leases_come_from_the_operating_system() {
        fastrand::seed(7);
        let first = SystemRandom::new().lease();
        fastrand::seed(7);
        let second = SystemRandom::new().lease();
        assert_ne!(first, second);
        assert_eq!(first.0.get_version(), Some(uuid::Version::Random));
        // What the old source did, for contrast: the same state, the same lease.
        let seeded_from_state = || {
            fastrand::seed(7);
            let bits = fastrand::Rng::new().u128(..);
            uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid()
        };
        assert_eq!(seeded_from_state(), seeded_from_state());
    }

    #[test]
    fn seeded_runs_replay_their_leases() {
        assert_eq!(FastRandom::seeded(3).lease(), FastRandom::seeded(3).lease());
    }
}
