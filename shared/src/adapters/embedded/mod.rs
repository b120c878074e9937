//! The embedded backend: in-process versions of DynamoDB, SQS and SNS with the
//! semantics the handlers rely on (conditional writes, visibility timeout, redelivery,
//! DLQ after max receives, delays, duplicate delivery), plus a controllable clock and,
//! opt-in, DynamoDB's per-item capacity (`capacity`).

pub mod capacity;
mod clock;
mod metrics;
pub mod queue_names;
mod queues;
mod store;

pub use capacity::{CapacityReport, ItemUsage};
pub use clock::ManualClock;
pub use metrics::{CountingMetrics, MetricsSnapshot};
pub use queues::{EmbeddedQueues, QueueId, QueueSettings, Received, SendingAs, StoredMessage};
pub use store::{EmbeddedStore, WriteRecord};

use std::sync::Mutex;

use async_trait::async_trait;

use crate::domain::OperatorAlert;
use crate::ports::{AlertError, Alerts};

/// The operators' topic, kept in memory.
#[derive(Debug, Default)]
pub struct RecordingAlerts(Mutex<Vec<OperatorAlert>>);

impl RecordingAlerts {
    pub fn all(&self) -> Vec<OperatorAlert> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Alerts for RecordingAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(alert.clone());
        Ok(())
    }
}
