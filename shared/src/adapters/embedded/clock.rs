use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::domain::Timestamp;
use crate::ports::Clock;

/// Time that moves only when told to, or when someone sleeps: `sleep_until` jumps the
/// clock forward instead of waiting, so tests of timeouts take no real time.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn at(ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(ms))
    }
    pub fn advance(&self, ms: u64) -> Timestamp {
        Timestamp(self.0.fetch_add(ms, Ordering::SeqCst) + ms)
    }
    pub fn set(&self, t: Timestamp) {
        self.0.fetch_max(t.0, Ordering::SeqCst);
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
    async fn sleep_until(&self, until: Timestamp) {
        self.set(until);
        tokio::task::yield_now().await;
    }
}
