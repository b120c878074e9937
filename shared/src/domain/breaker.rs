//! Circuit breaker for one remote service, as a small state machine over injected time.
//! Written here rather than taken from a crate because it must run on the clock port
//! (simulated time in tests and the simulation); the maintained crates read the system clock.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive transient failures that open the circuit.
    pub failure_threshold: u32,
    /// How long it stays open before one probe call is let through.
    pub open_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed {
        consecutive_failures: u32,
    },
    Open {
        until_ms: u64,
    },
    /// One probe call is in flight; others are refused until it reports.
    HalfOpen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    Call,
    /// Refused; the circuit lets a probe through at this time.
    Refused {
        retry_at_ms: u64,
    },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    pub policy: BreakerPolicy,
    pub state: BreakerState,
}

impl Breaker {
    pub fn new(policy: BreakerPolicy) -> Breaker {
        Breaker { policy, state: BreakerState::Closed { consecutive_failures: 0 } }
    }

    pub fn permit(&mut self, now_ms: u64) -> Permit {
        match self.state {
            BreakerState::Closed { .. } => Permit::Call,
            BreakerState::Open { until_ms } if now_ms >= until_ms => {
                self.state = BreakerState::HalfOpen;
                Permit::Call
            }
            BreakerState::Open { until_ms } => Permit::Refused { retry_at_ms: until_ms },
            // The probe's owner reports soon; a caller retrying shortly after gets the verdict.
            BreakerState::HalfOpen => {
                Permit::Refused { retry_at_ms: now_ms + self.policy.open_ms.clamp(1, 100) }
            }
        }
    }

    pub fn on_success(&mut self) {
        self.state = BreakerState::Closed { consecutive_failures: 0 };
    }

    /// Only transient failures count: a permanent error is the service answering.
    pub fn on_transient_failure(&mut self, now_ms: u64) {
        self.state = match self.state {
            BreakerState::Closed { consecutive_failures }
                if consecutive_failures + 1 < self.policy.failure_threshold =>
            {
                BreakerState::Closed { consecutive_failures: consecutive_failures + 1 }
            }
            _ => BreakerState::Open { until_ms: now_ms + self.policy.open_ms },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerPolicy { failure_threshold: 3, open_ms: 1_000 })
    }

    #[test]
    fn opens_after_threshold_and_probes_after_open_period() {
        let mut b = breaker();
        for _ in 0..2 {
            assert_eq!(b.permit(0), Permit::Call);
            b.on_transient_failure(0);
        }
        assert_eq!(b.permit(0), Permit::Call);
        b.on_transient_failure(10);
        assert_eq!(b.permit(500), Permit::Refused { retry_at_ms: 1_010 });
        assert_eq!(b.permit(1_010), Permit::Call, "probe");
        assert!(matches!(b.permit(1_011), Permit::Refused { .. }), "one probe at a time");
        b.on_success();
        assert_eq!(b.permit(1_012), Permit::Call);
    }

    #[test]
    fn failed_probe_reopens() {
        let mut b = breaker();
        for _ in 0..3 {
            b.on_transient_failure(0);
        }
        assert_eq!(b.permit(1_000), Permit::Call);
        b.on_transient_failure(1_000);
        assert_eq!(b.permit(1_500), Permit::Refused { retry_at_ms: 2_000 });
    }

    #[test]
    fn success_resets_the_count() {
        let mut b = breaker();
        b.on_transient_failure(0);
        b.on_transient_failure(0);
        b.on_success();
        b.on_transient_failure(0);
        b.on_transient_failure(0);
        assert_eq!(b.permit(0), Permit::Call);
    }
}
