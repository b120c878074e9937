//! The remote services the agents front, in-process: seeded faults, deduplication by
//! idempotency key (a key's first verdict, applied or refused, is final), and a ledger
//! of every call and every applied effect.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use sas::domain::Action;
use sas::ports::{RemoteCall, RemoteError, RemoteService};

use crate::world::{Io, Shared};

/// How an idempotency key was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The effect was applied, at this true time.
    Applied {
        at: u64,
    },
    Refused,
}

/// What the remote side saw and did.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub calls: u64,
    pub hangs: u64,
    pub transient: u64,
    /// Answers of success, deduplicated ones included.
    pub successes: u64,
    /// Times each key's effect was applied. The service deduplicates, so more than one
    /// would mean the service (the model) is broken; the checker verifies it anyway.
    pub applied: BTreeMap<String, u32>,
    pub settled: BTreeMap<String, Settled>,
    /// (order id, step, action) -> every idempotency key it was called with.
    pub keys: BTreeMap<(String, u32, Action), BTreeSet<String>>,
    /// Applied effects in the order they happened: (true time, order id, step, action).
    pub effects: Vec<(u64, String, u32, Action)>,
}

enum Verdict {
    Ok {
        latency: u64,
    },
    Transient,
    Refused,
    /// Never answers; the caller's timeout ends the call at this true time.
    Hang {
        until: u64,
    },
}

pub struct SimRemote {
    pub shared: Arc<Shared>,
}

#[async_trait]
impl RemoteService for SimRemote {
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<(), RemoteError> {
        let key = call.idempotency_key.0.clone();
        self.shared.gate(Io::Remote(key.clone())).await;
        let verdict = {
            let mut w = self.shared.w();
            let w = &mut *w;
            let order = call.order.order_id.as_str().to_owned();
            w.ledger.calls += 1;
            w.ledger.keys.entry((order.clone(), call.step, call.action)).or_default().insert(key.clone());
            let settled = w.ledger.settled.get(&key).copied();
            let f = w.faults;
            let now = w.now;
            let overshoot = if f.overshoot_max_ms > 0 { w.rng.u64(0..=f.overshoot_max_ms) } else { 0 };
            let apply = |w: &mut crate::world::World| {
                if settled.is_none() {
                    w.ledger.settled.insert(key.clone(), Settled::Applied { at: now });
                    *w.ledger.applied.entry(key.clone()).or_default() += 1;
                    w.ledger.effects.push((now, order.clone(), call.step, call.action));
                }
            };
            let (permanent_kind, permanent) = match call.action {
                Action::Do => ("remote_permanent", f.remote_permanent),
                Action::Undo => ("remote_undo_permanent", f.remote_undo_permanent),
            };
            let verdict = if w.roll("remote_hang", f.remote_hang) {
                w.ledger.hangs += 1;
                // Half the hangs lose the response of work that was done.
                if w.rng.bool() {
                    apply(w);
                }
                Verdict::Hang { until: now + timeout_ms + overshoot }
            } else if w.roll("remote_transient", f.remote_transient) {
                w.ledger.transient += 1;
                Verdict::Transient
            } else if settled == Some(Settled::Refused) {
                Verdict::Refused
            } else if settled.is_none() && w.roll(permanent_kind, permanent) {
                w.ledger.settled.insert(key.clone(), Settled::Refused);
                Verdict::Refused
            } else {
                apply(w);
                let latency =
                    if f.remote_latency_max_ms > 0 { w.rng.u64(0..=f.remote_latency_max_ms) } else { 0 };
                if latency >= timeout_ms {
                    // Answered too late: the caller's timeout fired first.
                    Verdict::Hang { until: now + timeout_ms + overshoot }
                } else {
                    w.ledger.successes += 1;
                    Verdict::Ok { latency }
                }
            };
            let line = match &verdict {
                Verdict::Ok { latency } => format!("remote {key} ok +{latency}"),
                Verdict::Transient => format!("remote {key} transient"),
                Verdict::Refused => format!("remote {key} refused"),
                Verdict::Hang { until } => format!("remote {key} hangs until {until}"),
            };
            w.trace.note(now, || line);
            verdict
        };
        match verdict {
            Verdict::Ok { latency } => {
                if latency > 0 {
                    let now = self.shared.w().now;
                    self.shared.sleep_until(now + latency).await;
                }
                Ok(())
            }
            Verdict::Transient => Err(RemoteError::Transient("503 service unavailable".into())),
            Verdict::Refused => Err(RemoteError::Permanent("422 declined".into())),
            Verdict::Hang { until } => {
                self.shared.sleep_until(until).await;
                Err(RemoteError::Transient("timed out".into()))
            }
        }
    }
}
