//! The remote services the agents front, in-process and on simulated time: the shared
//! service model (`ledger.rs`) decides each call with the world's generator, and this
//! file turns its verdict into simulated waiting.

use std::sync::Arc;

use async_trait::async_trait;
use sas::domain::Action;
use sas::ports::{RemoteCall, RemoteError, RemoteService};

use crate::ledger::{Call, Chance, Flight, Verdict};
use crate::world::{Io, Shared, World};

pub struct SimRemote {
    pub shared: Arc<Shared>,
}

/// The world's generator as the service model's chance: every fault is counted and traced.
struct WorldChance<'a>(&'a mut World);

impl Chance for WorldChance<'_> {
    fn roll(&mut self, kind: &'static str, p: f64) -> bool {
        self.0.roll(kind, p)
    }
    fn coin(&mut self) -> bool {
        self.0.rng.bool()
    }
    fn upto(&mut self, max: u64) -> u64 {
        self.0.rng.u64(0..=max)
    }
}

#[async_trait]
impl RemoteService for SimRemote {
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<Vec<u8>, RemoteError> {
        let key = call.idempotency_key.0.as_str();
        let handed = serde_json::to_string(call.outputs).expect("outputs serialize");
        self.shared.gate(Io::Remote(key.to_owned())).await;
        let (verdict, now, hang_until, body) = {
            let mut w = self.shared.w();
            let w = &mut *w;
            let now = w.now;
            let limited = w.ledger.limits.contains_key(call.agent);
            let holder = if limited {
                crate::ledger::holder_of(w.current_message.as_deref(), key)
            } else {
                String::new()
            };
            let copy = limited && w.ledger.replied.contains_key(&holder);
            // A limited agent's service sheds load before it looks at the request: nothing
            // is decided or applied, and the caller is told when to come back.
            let busy = w.faults.remote_busy;
            if limited && w.roll("remote_busy", busy) {
                let retry_after_ms = w.rng.u64(100..=w.faults.busy_retry_max_ms.max(100));
                w.ledger.throttled += 1;
                w.ledger.flights.entry(call.agent.to_owned()).or_default().push(Flight {
                    start: now,
                    end: now,
                    key: key.to_owned(),
                    holder,
                    copy,
                });
                w.trace.note_args(now, format_args!("remote {key} busy, retry after {retry_after_ms}"));
                return Err(RemoteError::Busy { reason: "429 too many requests".into(), retry_after_ms });
            }
            let mut faults = w.faults.remote;
            if call.action == Action::Do && w.stage_branches.contains(call.step_name) {
                faults.permanent = faults.permanent.max(w.faults.branch_refusal);
            }
            // The ledger lives in the world, and so does the generator the chance borrows.
            let mut ledger = std::mem::take(&mut w.ledger);
            let reached = ledger.reached;
            let verdict = ledger.call(
                &faults,
                &mut WorldChance(w),
                now,
                Call {
                    key,
                    order_id: call.order.order_id.as_str(),
                    step: call.step,
                    action: call.action,
                    timeout_ms,
                    agent: call.agent,
                    name: call.step_name,
                    handed: &handed,
                },
            );
            let body = ledger.answer(key).as_bytes().to_vec();
            // A callback step's work started at the service: whoever finishes it now holds
            // the token (only a call the service saw hands it over).
            if let Some(token) = call.callback_token
                && call.action == Action::Do
                && ledger.reached > reached
                && ledger.is_applied(key)
            {
                w.outside.hand(now, token, &call.order.workflow, call.step_name, key, &mut ledger);
            }
            w.ledger = ledger;
            // The caller's timeout may fire late (a hang past complete-by).
            let overshoot = w.faults.overshoot_max_ms;
            let hang_until = now + timeout_ms + if overshoot > 0 { w.rng.u64(0..=overshoot) } else { 0 };
            match verdict {
                Verdict::Answer { latency_ms } => {
                    w.trace.note_args(now, format_args!("remote {key} ok +{latency_ms}"))
                }
                Verdict::Transient => w.trace.note_args(now, format_args!("remote {key} transient")),
                Verdict::Refused => w.trace.note_args(now, format_args!("remote {key} refused")),
                Verdict::Hang => {
                    w.trace.note_args(now, format_args!("remote {key} hangs until {hang_until}"))
                }
            }
            if limited {
                // The service sees the call end when it answers, or when its caller hangs
                // up: a hang (and an answer slower than the caller waits) closes at
                // `hang_until`, when the caller's timeout fires.
                let end = match verdict {
                    Verdict::Answer { latency_ms } => now + latency_ms,
                    Verdict::Transient | Verdict::Refused => now,
                    Verdict::Hang => hang_until,
                };
                w.ledger.flights.entry(call.agent.to_owned()).or_default().push(Flight {
                    start: now,
                    end,
                    key: key.to_owned(),
                    holder,
                    copy,
                });
            }
            (verdict, now, hang_until, body)
        };
        match verdict {
            Verdict::Answer { latency_ms } => {
                if latency_ms > 0 {
                    self.shared.sleep_until(now + latency_ms).await;
                }
                Ok(body)
            }
            Verdict::Transient => Err(RemoteError::Transient("503 service unavailable".into())),
            Verdict::Refused => Err(RemoteError::Permanent {
                reason: "the remote service refused (HTTP 4xx)".into(),
                detail: Some("422 declined".into()),
            }),
            Verdict::Hang => {
                self.shared.sleep_until(hang_until).await;
                Err(RemoteError::Transient("timed out".into()))
            }
        }
    }
}
