//! The real clock and real randomness.

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

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

/// Random leases and jitter from a generator that is either seeded (replayable) or
/// seeded from the OS.
#[derive(Debug)]
pub struct FastRandom(std::sync::Mutex<fastrand::Rng>);

impl FastRandom {
    pub fn from_entropy() -> FastRandom {
        FastRandom(std::sync::Mutex::new(fastrand::Rng::new()))
    }
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
}
