//! Watching the ports without changing them: a state store that tells a [`Tap`] of
//! every write that landed, and an alert port that tells a second one of every alert
//! the first raised. `sasctl dev --endpoint-url` keeps a write log for its checker
//! with them; `sasctl up` prints what happens to each order.

use std::sync::Arc;

use async_trait::async_trait;
use sas::domain::{OperatorAlert, OrderId, TaskRecord, Timestamp};
use sas::ports::{AlertError, Alerts, CallStarts, Inserted, Noted, StateStore, StoreError, Written};

/// How a write landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed {
    /// A new task: its order was accepted.
    Inserted,
    /// A conditional replace of an existing task.
    Replaced,
}

/// Told of every write that landed, after it landed. Exact as long as every writer goes
/// through the store it watches: then the record a write replaced is the last one it
/// was told of for that order.
pub trait Tap: Send + Sync {
    fn landed(&self, task: &TaskRecord, how: Landed);
}

/// A state store that tells `tap` of its landed writes.
pub struct TapStore<S, T> {
    inner: S,
    tap: T,
}

impl<S, T> TapStore<S, T> {
    pub fn new(inner: S, tap: T) -> TapStore<S, T> {
        TapStore { inner, tap }
    }

    pub fn tap(&self) -> &T {
        &self.tap
    }
}

/// A call mark is no task write: nothing to tell.
#[async_trait]
impl<S: CallStarts, T: Tap> CallStarts for TapStore<S, T> {
    async fn start_call(
        &self,
        mark: &sas::domain::gate::CallMark,
    ) -> Result<sas::domain::gate::CallStart, StoreError> {
        self.inner.start_call(mark).await
    }
}

#[async_trait]
impl<S: StateStore, T: Tap> StateStore for TapStore<S, T> {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let inserted = self.inner.insert(task).await?;
        if inserted == Inserted::New {
            self.tap.landed(task, Landed::Inserted);
        }
        Ok(inserted)
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        self.inner.task(id).await
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        let written = self.inner.replace(next, expected_revision).await?;
        if written == Written::Applied {
            self.tap.landed(next, Landed::Replaced);
        }
        Ok(written)
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        self.inner.due(now, limit).await
    }
    async fn gate(&self, agent: &str) -> Result<Option<sas::domain::gate::Gate>, StoreError> {
        self.inner.gate(agent).await
    }
    async fn replace_gate(
        &self,
        next: &sas::domain::gate::Gate,
        expected_revision: u64,
    ) -> Result<Written, StoreError> {
        self.inner.replace_gate(next, expected_revision).await
    }
    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        now: Timestamp,
    ) -> Result<Noted, StoreError> {
        self.inner.put_waiter(agent, ticket, order_id, now).await
    }
    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        self.inner.waiter(agent, ticket).await
    }
}

/// Alerts raised on `first` (the operators' topic) and, once that succeeded, on `then`.
pub struct TeeAlerts {
    pub first: Arc<dyn Alerts>,
    pub then: Arc<dyn Alerts>,
}

#[async_trait]
impl Alerts for TeeAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.first.raise(alert).await?;
        self.then.raise(alert).await
    }
}

impl<T: Tap + ?Sized> Tap for Arc<T> {
    fn landed(&self, task: &TaskRecord, how: Landed) {
        (**self).landed(task, how);
    }
}
