//! The fault layer: each port the handlers use, wrapped so that every I/O call first
//! waits at the world's gate (where the loop may crash the invocation instead) and then
//! may fail the way the real service fails.

use std::sync::Arc;

use async_trait::async_trait;
use sas::adapters::embedded::queue_names::{AGENT, SCHEDULER};
use sas::adapters::embedded::{EmbeddedQueues, EmbeddedStore, RecordingAlerts};
use sas::domain::gate::{CallMark, CallStart, Gate};
use sas::domain::{OperatorAlert, OrderId, TaskRecord, Timestamp};
use sas::ports::{
    AlertError, Alerts, CallStarts, Clock, Inserted, Noted, Outgoing, QueueError, QueueUrl, Queues,
    StateStore, StoreError, Written,
};

use crate::world::{Io, Shared, WriteCtx};

/// Queues whose messages the duplicate and delay faults touch: the pipeline's own.
pub const INTERNAL: [&str; 3] = [SCHEDULER, AGENT, crate::deployment::WORKER];

pub struct SimStore {
    pub inner: Arc<EmbeddedStore>,
    pub shared: Arc<Shared>,
}

impl SimStore {
    async fn before(&self, io: Io) -> Result<(), StoreError> {
        self.shared.gate(io).await;
        let mut w = self.shared.w();
        let p = w.faults.store_throttle;
        if w.roll("store_throttle", p) {
            return Err(StoreError::Throttled("sim: throttled".into()));
        }
        Ok(())
    }

    /// After a write was tried: records who made it if it `landed`, then may lose its
    /// response (the write stands, the handler sees `Unavailable`).
    fn written<T>(&self, result: Result<T, StoreError>, landed: bool) -> Result<T, StoreError> {
        if landed {
            let mut w = self.shared.w();
            let ctx = WriteCtx {
                invocation: w.current_invocation.unwrap_or(0),
                role: w.current_role(),
                message: w.current_message.clone(),
                at: w.now,
            };
            w.write_ctx.push(ctx);
        }
        let mut w = self.shared.w();
        let p = w.faults.store_lost_response;
        if w.roll("store_lost_response", p) {
            return Err(StoreError::Unavailable("sim: response lost".into()));
        }
        result
    }
}

#[async_trait]
impl StateStore for SimStore {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        self.before(Io::Insert).await?;
        let result = self.inner.insert(task).await;
        let landed = matches!(result, Ok(Inserted::New));
        self.written(result, landed)
    }

    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        self.before(Io::ReadTask).await?;
        self.inner.task(id).await
    }

    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        self.before(Io::Replace).await?;
        let result = self.inner.replace(next, expected_revision).await;
        let landed = matches!(result, Ok(Written::Applied));
        self.written(result, landed)
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        self.before(Io::Due).await?;
        self.inner.due(now, limit).await
    }
    // The gate and its waiters fail the way task reads and writes do; a gate write is no
    // task write, so it leaves no `WriteCtx` behind.
    async fn gate(&self, agent: &str) -> Result<Option<Gate>, StoreError> {
        self.before(Io::ReadGate).await?;
        self.inner.gate(agent).await
    }
    async fn replace_gate(&self, next: &Gate, expected_revision: u64) -> Result<Written, StoreError> {
        self.before(Io::ReplaceGate).await?;
        let result = self.inner.replace_gate(next, expected_revision).await;
        if matches!(result, Ok(Written::RevisionMoved)) {
            let mut w = self.shared.w();
            if let Some(inv) = w.current_invocation {
                w.gates.lost_race(inv);
            }
        }
        if matches!(result, Ok(Written::Applied)) {
            // The gate as written, for a replay to follow who held which place when.
            let mut w = self.shared.w();
            let now = w.now;
            w.gates.landed(next, now);
            w.trace.note(now, || {
                let holds: Vec<String> =
                    next.holds.iter().map(|h| format!("{}<{}", h.holder, h.until.0)).collect();
                let tails: Vec<u64> = next.tails.iter().map(|t| t.0).collect();
                format!(
                    "gate {} rev {} holds {holds:?} tails {tails:?} tickets {}..{} paused {:?}",
                    next.agent, next.revision, next.admitted, next.issued, next.paused_until
                )
            });
        }
        self.written(result, false)
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError> {
        self.before(Io::PutWaiter).await?;
        let result = self.inner.put_waiter(agent, ticket, order_id, now).await;
        self.written(result, false)
    }
    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        self.before(Io::ReadWaiter).await?;
        self.inner.waiter(agent, ticket).await
    }
}

/// A limited agent's call mark fails, or is held up, the way the store's other writes are
/// (and its response may be lost after it landed); it is no task write either.
#[async_trait]
impl CallStarts for SimStore {
    async fn start_call(&self, mark: &CallMark) -> Result<CallStart, StoreError> {
        self.before(Io::StartCall).await?;
        let result = self.inner.start_call(mark).await;
        {
            let mut w = self.shared.w();
            let now = w.now;
            w.trace.note_args(now, format_args!("call mark {} {:?}", mark.key, result));
        }
        self.written(result, false)
    }
}

pub struct SimQueues {
    pub inner: Arc<EmbeddedQueues>,
    pub shared: Arc<Shared>,
}

#[async_trait]
impl Queues for SimQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        self.shared.gate(Io::Send(queue.0.clone())).await;
        let unavailable =
            || QueueError::Unavailable { queue: queue.0.clone(), reason: "sim: unreachable".into() };
        let mut out = Vec::with_capacity(messages.len());
        {
            let mut w = self.shared.w();
            let f = w.faults;
            if w.roll("send_fail", f.send_fail) {
                return Err(unavailable());
            }
            let internal = INTERNAL.contains(&queue.0.as_str());
            if queue.0 == SCHEDULER && !w.ledger.limits.is_empty() {
                // An agent's reply ends its attempt's calls, sent or not: whatever calls
                // under that place after it would be a copy of its request (`Flight::copy`).
                for m in &messages {
                    if m.body.starts_with(r#"{"type":"reply""#) {
                        let place = crate::ledger::holder_of(Some(&m.body), "");
                        let now = w.now;
                        w.ledger.replied.entry(place).or_insert(now);
                    }
                }
            }
            for mut m in messages {
                if internal && w.roll("delay", f.delay) {
                    m.delay_ms += w.rng.u64(1..=f.delay_max_ms.max(1));
                }
                if internal && w.roll("duplicate", f.duplicate) {
                    let mut copy = m.clone();
                    if w.rng.bool() {
                        copy.delay_ms += w.rng.u64(0..=f.delay_max_ms.max(1));
                    }
                    out.push(copy);
                }
                let now = w.now;
                w.trace.note_args(now, format_args!("send {queue} +{}ms {}", m.delay_ms, m.body));
                out.push(m);
            }
        }
        self.inner.send_batch(queue, out).await?;
        let mut w = self.shared.w();
        let p = w.faults.send_lost_response;
        if w.roll("send_lost_response", p) {
            return Err(unavailable());
        }
        Ok(())
    }
}

pub struct SimAlerts {
    pub inner: Arc<RecordingAlerts>,
    pub shared: Arc<Shared>,
}

#[async_trait]
impl Alerts for SimAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.shared.gate(Io::Alert).await;
        {
            let mut w = self.shared.w();
            let p = w.faults.alert_fail;
            if w.roll("alert_fail", p) {
                return Err(AlertError("sim: topic unreachable".into()));
            }
            let now = w.now;
            w.trace.note_args(now, format_args!("alert {} {}", alert.order_id, alert.reason));
        }
        self.inner.raise(alert).await
    }
}

/// The running invocation's clock: true time plus its host's skew. Sleeping registers a
/// timer the loop fires when true time gets there.
pub struct SimClock {
    pub shared: Arc<Shared>,
}

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.shared.w().local_now())
    }
    async fn sleep_until(&self, until: Timestamp) {
        let at = {
            let w = self.shared.w();
            until.0.saturating_add_signed(-w.current_skew())
        };
        self.shared.sleep_until(at).await;
    }
}

/// True time, for the services themselves (queue visibility and delays).
pub struct TrueClock {
    pub shared: Arc<Shared>,
}

#[async_trait]
impl Clock for TrueClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.shared.w().now)
    }
    async fn sleep_until(&self, until: Timestamp) {
        self.shared.sleep_until(until.0).await;
    }
}
