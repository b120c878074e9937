//! Exponential backoff with jitter. The jitter is an argument so callers decide where
//! randomness comes from (a seeded generator in tests and the simulation).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub base_ms: u64,
    pub cap_ms: u64,
}

impl Backoff {
    /// Delay before retry number `retry` (0 for the first retry): "equal jitter",
    /// half the exponential ceiling plus a random part of the other half, so no
    /// retry fires immediately and a herd of retries spreads out.
    pub fn delay_ms(&self, retry: u32, jitter: u64) -> u64 {
        let ceiling =
            self.base_ms.saturating_mul(1u64.checked_shl(retry.min(32)).unwrap_or(u64::MAX)).min(self.cap_ms);
        let half = ceiling / 2;
        half + jitter % (ceiling - half + 1)
    }
}

/// How a Schedule whose handling the state store throttled is sent again: after a backoff
/// that doubles from 1 s to a minute, spread by jitter so a burst's Schedules do not all
/// come back at once, at most `MAX_THROTTLED_RESENDS` times; after that it is left to the
/// queue's redelivery, and its limit of receives.
pub const THROTTLED_SCHEDULE: Backoff = Backoff { base_ms: 1_000, cap_ms: 60_000 };

/// The most times one Schedule is sent again for throttling (`THROTTLED_SCHEDULE`).
pub const MAX_THROTTLED_RESENDS: u32 = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grows_then_caps() {
        let b = Backoff { base_ms: 100, cap_ms: 1_000 };
        assert_eq!(b.delay_ms(0, 0), 50);
        assert_eq!(b.delay_ms(0, 50), 100);
        assert_eq!(b.delay_ms(3, 0), 400);
        assert_eq!(b.delay_ms(10, 0), 500);
        assert_eq!(b.delay_ms(40, u64::MAX), 500 + u64::MAX % 501);
    }

    proptest! {
        #[test]
        fn always_within_half_ceiling_and_cap(base in 0u64..10_000, cap in 0u64..100_000, retry in 0u32..100, jitter: u64) {
            let b = Backoff { base_ms: base, cap_ms: cap };
            let d = b.delay_ms(retry, jitter);
            prop_assert!(d <= cap);
            let ceiling = base.saturating_mul(1u64.checked_shl(retry.min(32)).unwrap_or(u64::MAX)).min(cap);
            prop_assert!(d >= ceiling / 2);
        }
    }
}
