//! `bench backlog`: a backlog of timers all due at once, woken by the supervisor: how late
//! the last one wakes against the supervisor's period. 100,000 tasks wait on an hour's
//! timer (past SQS's longest delay, so only the sweep wakes them) before a step, so each
//! wake writes the task and sends its Schedule; all are due at the moment a run starts; runs come once a period until none is left. Within a run the time is real,
//! each store call and each SQS request taking `--latency-ms` (a DynamoDB or SQS round
//! trip; 0 measures sas's own CPU alone) while the run's other recoveries go on; between
//! runs the clock jumps to the next period. The run's budget is the function's: 60 s from
//! its start (`SweepBudget`), as on Lambda.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;

use sas::adapters::embedded::queue_names::{self, AGENT, SCHEDULER};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::{FastRandom, SystemClock};
use sas::domain::{OrderId, Phase, Policy, TaskRecord, Timestamp, WaitingFor};
use sas::handlers::{DEFAULT_MAX_HOLD, Deps, SendCoalescer, Settings, Supervisor, SweepBudget};
use sas::ports::{
    Clock, Inserted, Metric, Noted, Outgoing, QueueError, QueueUrl, Queues, StateStore, StoreError, Written,
};

use super::measure::{cpu_time, median};

/// An hour's wait, then a step: woken, a task goes on to the step with a Schedule.
const TIMER_THEN_STEP: &str = "timer-then-ship";

fn workflows() -> sas::domain::Workflows {
    use sas::domain::{Step, Wait, Workflow, Workflows};
    Workflows::new(vec![Workflow::new(
        TIMER_THEN_STEP,
        vec![Step::timer("an-hour", Wait::for_ms(3_600_000)), Step::pivot("ship", "carrier")],
    )])
}

/// One backlog, woken.
#[derive(Debug, Clone, Serialize)]
pub struct BacklogRun {
    /// Supervisor runs until every timer woke (1: all in the run that found them due).
    pub runs: usize,
    /// Index pages read, all runs.
    pub pages: usize,
    pub woken: u64,
    pub p50_late_ms: u64,
    /// The latest timer's lateness: from its time (the first run's start) to its wake.
    pub max_late_ms: u64,
    /// Wall time of the runs themselves.
    pub sweep_seconds: f64,
    /// The process's CPU time during the runs, per timer woken (the sweep is one task on
    /// one thread, as in a Lambda invocation).
    pub cpu_us_per_timer: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BacklogReport {
    pub timers: usize,
    pub latency_ms: u64,
    pub supervisor_period_ms: u64,
    pub runs: Vec<BacklogRun>,
    pub median_max_late_ms: u64,
    pub median_p50_late_ms: u64,
    /// The latest timer woke within one period of its time, in every run.
    pub within_one_period: bool,
}

/// The system clock, shifted back by a settable amount: the first run starts exactly at the
/// timers' time, and the wait between runs costs no wall time.
struct ShiftedClock {
    back_ms: AtomicU64,
}

#[async_trait]
impl Clock for ShiftedClock {
    fn now(&self) -> Timestamp {
        Timestamp(SystemClock.now().0 - self.back_ms.load(Ordering::Relaxed))
    }
    async fn sleep_until(&self, until: Timestamp) {
        let left = until.millis_since(self.now());
        tokio::time::sleep(Duration::from_millis(left)).await;
    }
}

impl ShiftedClock {
    /// Shifts it so that it reads `at` now.
    fn set(&self, at: Timestamp) {
        self.back_ms.store(SystemClock.now().0 - at.0, Ordering::Relaxed);
    }
}

/// A store whose task reads, writes and index queries each take `ms`.
struct Slow {
    inner: Arc<EmbeddedStore>,
    ms: u64,
}

impl Slow {
    async fn trip(&self) {
        if self.ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
    }
}

#[async_trait]
impl StateStore for Slow {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        self.inner.insert(task).await
    }
    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        self.trip().await;
        self.inner.task(id).await
    }
    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        self.trip().await;
        self.inner.replace(next, expected_revision).await
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        self.trip().await;
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

/// Queues whose every request (a SendMessageBatch of up to ten) takes `ms`.
struct SlowQueues {
    inner: Arc<EmbeddedQueues>,
    ms: u64,
}

#[async_trait]
impl Queues for SlowQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        if self.ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
        self.inner.send_batch(queue, messages).await
    }
}

/// `timers` tasks waiting on an hour's timer, all due at `at`.
async fn backlog(store: &EmbeddedStore, timers: usize, at: Timestamp) {
    let policy = Policy::default();
    for i in 0..timers {
        let mut order = super::listing::order(&format!("timer-{i:08}"));
        order.workflow = TIMER_THEN_STEP.into();
        let mut task = TaskRecord::new(&order, None, at, &policy);
        task.attempt = 1;
        task.step_attempts = 1;
        task = task.with_phase(Phase::waiting(WaitingFor::Timer { wake_at: at }));
        debug_assert_eq!(task.shape_violation(), None);
        store.insert(&task).await.expect("insert");
    }
}

/// One backlog of `timers`, woken by runs once every `period_ms`.
pub async fn backlog_once(timers: usize, latency_ms: u64, period_ms: u64) -> BacklogRun {
    let store = Arc::new(EmbeddedStore::new());
    let at = SystemClock.now();
    backlog(&store, timers, at).await;
    let clock = Arc::new(ShiftedClock { back_ms: AtomicU64::new(0) });
    let queues = Arc::new(EmbeddedQueues::new(clock.clone(), 1));
    queues.create(SCHEDULER, QueueSettings::default());
    queues.create(AGENT, QueueSettings::default());
    let slow: Arc<dyn Queues> = Arc::new(SlowQueues { inner: queues.clone(), ms: latency_ms });
    let metrics = Arc::new(CountingMetrics::default());
    let deps = Deps {
        store: Arc::new(Slow { inner: store.clone(), ms: latency_ms }),
        queues: Arc::new(SendCoalescer::new(slow, DEFAULT_MAX_HOLD)),
        alerts: Arc::new(RecordingAlerts::default()),
        clock: clock.clone(),
        random: Arc::new(FastRandom::seeded(1)),
        metrics: metrics.clone(),
    };
    let settings =
        Settings::new(Policy::default(), workflows(), queue_names::topology(), queue_names::reply_to_rules());
    let supervisor = Supervisor {
        budget: SweepBudget { run_ms: period_ms, ..SweepBudget::default() },
        ..Supervisor::new(deps, settings)
    };
    let (mut runs, mut pages, mut sweep_seconds) = (0, 0, 0.0);
    let cpu = cpu_time();
    loop {
        clock.set(at.plus_ms(runs as u64 * period_ms));
        let started = Instant::now();
        let report = supervisor.sweep().await.expect("sweep");
        sweep_seconds += started.elapsed().as_secs_f64();
        runs += 1;
        pages += report.pages;
        if !report.cut_short || runs >= 1_000 {
            break;
        }
    }
    let cpu = (cpu_time() - cpu).as_secs_f64();
    let counted = metrics.snapshot();
    let woken = counted.count(Metric::TimerWoke);
    BacklogRun {
        runs,
        pages,
        woken,
        p50_late_ms: counted.percentile(Metric::TimerLatenessMs, 50.0).unwrap_or(0),
        max_late_ms: counted.percentile(Metric::TimerLatenessMs, 100.0).unwrap_or(0),
        sweep_seconds,
        cpu_us_per_timer: cpu * 1e6 / woken.max(1) as f64,
    }
}

pub async fn backlog_report(timers: usize, latency_ms: u64, period_ms: u64, repeats: usize) -> BacklogReport {
    let mut runs = Vec::new();
    for _ in 0..repeats.max(1) {
        runs.push(backlog_once(timers, latency_ms, period_ms).await);
    }
    let med =
        |f: fn(&BacklogRun) -> u64| median(&mut runs.iter().map(|r| f(r) as f64).collect::<Vec<_>>()) as u64;
    BacklogReport {
        timers,
        latency_ms,
        supervisor_period_ms: period_ms,
        median_max_late_ms: med(|r| r.max_late_ms),
        median_p50_late_ms: med(|r| r.p50_late_ms),
        within_one_period: runs.iter().all(|r| r.woken == timers as u64 && r.max_late_ms <= period_ms),
        runs,
    }
}

impl fmt::Display for BacklogReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} timers due at once, {} ms a store call or SQS request, supervisor every {} ms: latest woke {} ms late (median of {}), p50 {} ms; {}",
            self.timers,
            self.latency_ms,
            self.supervisor_period_ms,
            self.median_max_late_ms,
            self.runs.len(),
            self.median_p50_late_ms,
            if self.within_one_period { "within one period" } else { "NOT within one period" }
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "  {} run(s), {} pages, {} woken, late p50 {} ms, max {} ms, {:.2} s sweeping, {:.1} us CPU per timer",
                r.runs, r.pages, r.woken, r.p50_late_ms, r.max_late_ms, r.sweep_seconds, r.cpu_us_per_timer
            )?;
        }
        Ok(())
    }
}
