//! `bench sweep`: what one supervisor sweep reads with 100 due tasks among N finished
//! ones and W waiting ones (timers and callbacks not yet due): the sparse due index keeps
//! it independent of both.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use sas::adapters::embedded::queue_names::{self, AGENT, SCHEDULER};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::FastRandom;
use sas::domain::{Awaiting, Phase, Policy, TaskRecord, Timestamp, WaitingFor, Workflows};
use sas::handlers::{Deps, Settings, Supervisor};
use sas::ports::{Clock, StateStore};

use super::counting::{AwsUsage, CountingStore};

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub finished: usize,
    /// Tasks waiting (half on a timer a year out, half on a callback due in a week): in
    /// the due index, not yet due.
    pub waiting: usize,
    pub due: usize,
    /// Index entries read by the sweep (`EmbeddedStore::due_items_read`).
    pub items_read: u64,
    /// Strongly consistent re-reads of the tasks found, before each recovery.
    pub task_reads: u64,
    pub recovered: usize,
    pub sweep_ms: f64,
}

/// 100 (`due`) due tasks among `finished` terminal ones and `waiting` waiting ones,
/// inserted through the store port; one supervisor sweep.
pub async fn sweep_once(finished: usize, waiting: usize, due: usize) -> SweepRow {
    let manual = Arc::new(ManualClock::at(1_000_000));
    let policy = Policy::default();
    let store = Arc::new(EmbeddedStore::new());
    let usage = Arc::new(Mutex::new(AwsUsage::default()));
    for i in 0..finished {
        let order = super::listing::order(&format!("done-{i:08}"));
        let mut task = TaskRecord::new(&order, None, manual.now(), &policy);
        task = task.with_phase(Phase::Processed);
        task.step = 1;
        store.insert(&task).await.expect("insert");
    }
    for i in 0..waiting {
        let order = super::listing::order(&format!("wait-{i:08}"));
        store.insert(&waiting_task(&order, i, manual.now(), &policy)).await.expect("insert");
    }
    for i in 0..due {
        let order = super::listing::order(&format!("due-{i:08}"));
        let task = TaskRecord::new(&order, None, manual.now(), &policy);
        store.insert(&task).await.expect("insert");
    }
    manual.advance(policy.pending_timeout_ms + 1);
    let queues = Arc::new(EmbeddedQueues::new(manual.clone(), 1));
    queues.create(SCHEDULER, QueueSettings::default());
    queues.create(AGENT, QueueSettings::default());
    let counting = Arc::new(CountingStore { inner: store.clone(), usage: usage.clone(), due_shards: 4 });
    let deps = Deps {
        store: counting,
        queues,
        alerts: Arc::new(RecordingAlerts::default()),
        clock: manual.clone(),
        random: Arc::new(FastRandom::seeded(1)),
        metrics: Arc::new(CountingMetrics::default()),
    };
    let settings =
        Settings::new(policy, Workflows::builtin(), queue_names::topology(), queue_names::reply_to_rules());
    let supervisor = Supervisor::new(deps, settings);
    let before = store.due_items_read();
    let started = Instant::now();
    let report = supervisor.sweep().await.expect("sweep");
    let sweep_ms = started.elapsed().as_secs_f64() * 1e3;
    let usage = usage.lock().unwrap_or_else(|p| p.into_inner()).clone();
    SweepRow {
        finished,
        waiting,
        due,
        items_read: store.due_items_read() - before,
        task_reads: usage.ddb_gets,
        recovered: report.retried + report.gave_up,
        sweep_ms,
    }
}

/// A task waiting at step 1, as the domain leaves one: every other on a timer that wakes
/// in a year, the rest on a callback due in a week.
fn waiting_task(order: &sas::domain::Order, i: usize, now: Timestamp, policy: &Policy) -> TaskRecord {
    const DAY_MS: u64 = 24 * 3_600_000;
    let mut task = TaskRecord::new(order, None, now, policy);
    task.step = 1;
    task.attempt = 1;
    if i.is_multiple_of(2) {
        task = task.with_phase(Phase::waiting(WaitingFor::Timer { wake_at: now.plus_ms(365 * DAY_MS) }));
    } else {
        let awaiting = Awaiting {
            step: 1,
            attempt: 1,
            digest: "0".repeat(64),
            timeout_at: now.plus_ms(7 * DAY_MS),
            heartbeat_ms: None,
            last_heartbeat: None,
            started_at: Some(now),
            since: now,
        };
        task = task.with_phase(Phase::waiting(WaitingFor::Callback(awaiting)));
    }
    debug_assert_eq!(task.shape_violation(), None);
    task
}

/// One sweep per finished-task count: a table in text, an array of rows in JSON.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct SweepReport(pub Vec<SweepRow>);

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "finished  waiting  due  index items read  task re-reads  recovered  sweep ms")?;
        for r in &self.0 {
            writeln!(
                f,
                "{:>8}  {:>7}  {:>3}  {:>16}  {:>13}  {:>9}  {:>8.2}",
                r.finished, r.waiting, r.due, r.items_read, r.task_reads, r.recovered, r.sweep_ms
            )?;
        }
        Ok(())
    }
}
