//! The discrete-event loop. It owns true time and every scheduling decision: which
//! queue's messages start an invocation, which pending I/O call of which running
//! invocation goes next (interleaving concurrent invocations call by call), when time
//! moves, when the supervisor fires and where a crash lands. Each decision is drawn from
//! the seed's one generator, so a seed replays exactly.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures::FutureExt;
use sas::adapters::embedded::queue_names::{self, AGENT_DLQ, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ, STATUS};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, QueueSettings, Received, RecordingAlerts, StoredMessage,
    WriteRecord,
};
use sas::adapters::system::FastRandom;
use sas::domain::{
    Act, Actor, OperatorAlert, Order, OrderId, Policy, ProcessState, TaskRecord, Timestamp, Workflows,
};
use sas::handlers::{
    Agent, AgentDeps, BatchReport, DeadLetters, Deps, HandlerError, Inbound, Operated, Scheduler,
    SendCoalescer, Settings, Submission, Supervisor, SweepReport, run_batch,
};
use sas::ports::{Outgoing, QueueUrl, Queues, StateStore};

use crate::deployment::{
    Function, MAX_RECEIVES, QUEUE_AGENT, SEND_MAX_HOLD_MS, SUPERVISOR_PERIOD_MS, WORK, WORKER, WORKER_DLQ,
    agent_settings, policy, workflows_before_publish,
};
use crate::executor::{Flag, poll_caught, with_msg};
use crate::faults::{SimAlerts, SimClock, SimQueues, SimStore, TrueClock};
use crate::invariants::{Invariant, Violation};
use crate::ledger::Ledger;
use crate::remote::SimRemote;
use crate::swarm::{Faults, Swarm};
use crate::workload::{self, Arrival};
use crate::world::{InvId, InvMeta, Shared, WriteCtx};

/// Largest step of time the loop takes between two I/O calls.
const TICK_MAX_MS: u64 = 25;

/// The seed's workflows once its new version is published: the deployment's
/// (`deployment::workflows_before_publish`) and the published one (`Swarm::publish`).
pub fn workflows(swarm: &Swarm) -> Workflows {
    let mut all = workflows_before_publish(&swarm.generated).all().to_vec();
    all.extend(swarm.publish.as_ref().map(|p| p.workflow.clone()));
    Workflows::new(all)
}

/// How long after the faults stop every order must have ended: the worst case of every
/// step, forward and then undone, using its whole failure budget, each failure costing a
/// lease, its grace, a pending timeout, the longest backoff, a supervisor period and the
/// clocks' skew; plus one visibility timeout and one message delay still in flight, and
/// some slack.
pub fn liveness_bound_ms(policy: &Policy, faults: &Faults, workflows: &Workflows) -> u64 {
    let all = workflows.all().iter();
    let longest = all.clone().map(|w| w.len()).max().unwrap_or(1);
    let budget = all
        .flat_map(|w| (0..w.len()).map(|i| w.max_failures(i, policy.failure_threshold)))
        .max()
        .unwrap_or(policy.failure_threshold);
    let step_timeout = workflows
        .all()
        .iter()
        .flat_map(|w| (0..w.len()).map(|i| w.timeout_ms(i, policy.step_timeout_ms)))
        .max()
        .unwrap_or(policy.step_timeout_ms);
    let cycle = step_timeout
        + policy.reply_grace_ms
        + policy.pending_timeout_ms
        + policy.retry_backoff.cap_ms
        + SUPERVISOR_PERIOD_MS
        + 2 * faults.skew_max_ms
        + faults.overshoot_max_ms;
    let cycles = u64::from(2 * longest - 1) * u64::from(budget) + u64::from(longest) + 1;
    let in_flight = WORK.iter().map(|w| w.2).max().unwrap_or(0) + faults.delay_max_ms;
    cycles * cycle + in_flight + 5_000
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Keep every trace line (for printing a failing seed's history).
    pub keep_trace: bool,
    /// Overrides the seed's swarm.
    pub swarm: Option<Swarm>,
}

/// Everything a run leaves behind for the checker and the report.
pub struct Outcome {
    pub seed: u64,
    pub swarm: Swarm,
    pub policy: Policy,
    pub workflows: Workflows,
    pub arrivals: Vec<Arrival>,
    pub tasks: Vec<TaskRecord>,
    /// The order each accepted task carries, by id.
    pub orders: BTreeMap<OrderId, std::sync::Arc<Order>>,
    pub writes: Vec<WriteRecord>,
    pub write_ctx: Vec<WriteCtx>,
    pub dead_letters: BTreeMap<&'static str, Vec<StoredMessage>>,
    pub alerts: Vec<OperatorAlert>,
    pub ledger: Ledger,
    /// True time the faults stopped, and the bound everything had to end within after.
    pub quiet_at: u64,
    pub bound_ms: u64,
    pub ended_at: u64,
    pub steps: u64,
    pub invocations: u64,
    pub crashes: u64,
    pub fault_counts: BTreeMap<&'static str, u64>,
    /// The pipeline's own counters (stale replies dropped, claims lost, recoveries, ...).
    pub metrics: BTreeMap<&'static str, u64>,
    /// Violations seen while running (panics, a sweep that skipped a due task, no progress).
    pub runtime: Vec<Violation>,
    pub hash: u64,
    pub trace: Vec<String>,
}

enum InvOut {
    Batch(BatchReport),
    Sweep(Result<SweepReport, HandlerError>),
    Operator(Result<Operated, HandlerError>),
}

/// Who the simulated operator's actions name.
pub const OPERATOR: &str = "sim-operator";

struct Inv {
    function: Function,
    fut: Pin<Box<dyn Future<Output = InvOut>>>,
    flag: Arc<Flag>,
    queue: Option<&'static str>,
    received: Vec<Received>,
    /// Crash when this many I/O calls have been granted (at the next one, or at the end).
    crash_at: Option<u32>,
    granted: u32,
    agent_slot: Option<usize>,
    /// Supervisor: the tasks due when it started, by revision, for the "acted on by the
    /// next run" check.
    due_at_start: Vec<(OrderId, u64)>,
}

impl Inv {
    /// An invocation no queue feeds (a supervisor run, an operator's command).
    fn unqueued(
        function: Function,
        fut: Pin<Box<dyn Future<Output = InvOut>>>,
        crash_at: Option<u32>,
        due_at_start: Vec<(OrderId, u64)>,
    ) -> Inv {
        Inv {
            function,
            fut,
            flag: Flag::woken(),
            queue: None,
            received: Vec::new(),
            crash_at,
            granted: 0,
            agent_slot: None,
            due_at_start,
        }
    }
}

struct Sim {
    seed: u64,
    swarm: Swarm,
    shared: Arc<Shared>,
    store: Arc<EmbeddedStore>,
    queues: Arc<EmbeddedQueues>,
    /// The fault layer's queues behind a send coalescer, as the functions send.
    sends: Arc<dyn Queues>,
    alerts: Arc<RecordingAlerts>,
    metrics: Arc<CountingMetrics>,
    /// Each handler twice: on a container from before the seed's publish (0) and after (1).
    submission: [Submission; 2],
    scheduler: [Scheduler; 2],
    supervisor: [Supervisor; 2],
    agents: Vec<([Agent; 2], bool)>,
    invs: BTreeMap<InvId, Inv>,
    next_inv: InvId,
    arrivals: Vec<Arrival>,
    next_arrival: usize,
    /// When the operator acts (`Swarm::operator_actions`), and how many actions so far.
    operator_times: Vec<u64>,
    next_operator: usize,
    operator_actions: usize,
    next_sweep: u64,
    quiet_at: u64,
    quiet: bool,
    deadline: u64,
    steps: u64,
    invocations: u64,
    crashes: u64,
    runtime: Vec<Violation>,
    /// Supervisor runs that overlapped in time, as a group: what was due when each
    /// started, and whether any of them met a fault or crashed.
    sweep_group: Vec<(InvId, Vec<(OrderId, u64)>)>,
    sweep_group_faulted: bool,
}

/// Runs one seed to the end and returns what it left behind.
pub fn simulate(seed: u64, options: &Options) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Drawn even when the caller gives its own, so that a seed's given swarm meets the
    // same arrivals and world as the seed's own.
    let drawn = Swarm::from_rng(&mut rng);
    let swarm = options.swarm.clone().unwrap_or(drawn);
    let arrivals = workload::generate(&mut rng, &swarm);
    let shared = Shared::new(rng.u64(..), swarm.faults, options.keep_trace);
    let mut sim = Sim::new(seed, swarm, shared, arrivals, &mut rng);
    sim.run();
    sim.outcome()
}

impl Sim {
    fn new(
        seed: u64,
        swarm: Swarm,
        shared: Arc<Shared>,
        arrivals: Vec<Arrival>,
        rng: &mut fastrand::Rng,
    ) -> Sim {
        let store = Arc::new(EmbeddedStore::new());
        let queues =
            Arc::new(EmbeddedQueues::new(Arc::new(TrueClock { shared: shared.clone() }), rng.u64(..)));
        for q in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, WORKER_DLQ, STATUS] {
            queues.create(q, QueueSettings::default());
        }
        for (q, dlq, visibility_timeout_ms, _) in WORK {
            queues.create(
                q,
                QueueSettings {
                    visibility_timeout_ms,
                    max_receives: MAX_RECEIVES,
                    dead_letter: Some(dlq.to_owned()),
                    duplicate_rate: 0.0,
                },
            );
        }
        let sim_queues = Arc::new(SimQueues { inner: queues.clone(), shared: shared.clone() });
        let alerts = Arc::new(RecordingAlerts::default());
        let metrics = Arc::new(CountingMetrics::default());
        let clock = Arc::new(SimClock { shared: shared.clone() });
        // Held on simulated time: a timer the loop fires like any other, so a seed replays.
        let sends: Arc<dyn Queues> =
            Arc::new(SendCoalescer::on_clock(sim_queues, SEND_MAX_HOLD_MS, clock.clone()));
        let deps = Deps {
            store: Arc::new(SimStore { inner: store.clone(), shared: shared.clone() }),
            queues: sends.clone(),
            alerts: Arc::new(SimAlerts { inner: alerts.clone(), shared: shared.clone() }),
            clock: clock.clone(),
            random: Arc::new(FastRandom::seeded(rng.u64(..))),
            metrics: metrics.clone(),
        };
        let mut topology = queue_names::topology();
        if swarm.queue_agent {
            topology.queue_agents.insert(QUEUE_AGENT.to_owned(), QueueUrl(WORKER.into()));
        }
        let settings = Settings::new(policy(), workflows(&swarm), topology, queue_names::reply_to_rules());
        let before = settings.clone().with_workflows(workflows_before_publish(&swarm.generated));
        let generations = [&before, &settings];
        let remote = Arc::new(SimRemote { shared: shared.clone() });
        let agents = (0..swarm.agent_concurrency)
            .map(|_| {
                let deps = AgentDeps {
                    queues: sends.clone(),
                    clock: clock.clone(),
                    random: Arc::new(FastRandom::seeded(rng.u64(..))),
                    metrics: metrics.clone(),
                    remote: remote.clone(),
                    scheduler_queue: QueueUrl(SCHEDULER.into()),
                };
                (generations.map(|g| Agent::new(deps.clone(), agent_settings(), g.workflows.clone())), false)
            })
            .collect();
        let supervisor = generations.map(|g| {
            let mut supervisor = Supervisor::new(deps.clone(), g.clone());
            supervisor.page_size = swarm.page_size;
            supervisor
        });
        let quiet_at = swarm.fault_window_ms;
        let deadline = quiet_at + liveness_bound_ms(&settings.policy, &swarm.faults, &settings.workflows);
        // Within the fault window, so that the quiet tail's liveness bound holds.
        let mut operator_times: Vec<u64> =
            (0..swarm.operator_actions).map(|_| rng.u64(0..=quiet_at)).collect();
        operator_times.sort_unstable();
        Sim {
            seed,
            shared,
            store,
            queues,
            sends,
            alerts,
            metrics,
            submission: generations.map(|g| Submission::new(deps.clone(), g.clone())),
            scheduler: generations.map(|g| Scheduler::new(deps.clone(), g.clone())),
            supervisor,
            agents,
            invs: BTreeMap::new(),
            next_inv: 0,
            arrivals,
            next_arrival: 0,
            operator_times,
            next_operator: 0,
            operator_actions: 0,
            next_sweep: SUPERVISOR_PERIOD_MS,
            quiet_at,
            quiet: false,
            deadline,
            steps: 0,
            invocations: 0,
            crashes: 0,
            runtime: Vec::new(),
            sweep_group: Vec::new(),
            sweep_group_faulted: false,
            swarm,
        }
    }

    fn now(&self) -> u64 {
        self.shared.w().now
    }

    fn note(&self, line: impl FnOnce() -> String) {
        let mut w = self.shared.w();
        let now = w.now;
        w.trace.note(now, line);
    }

    fn run(&mut self) {
        const MAX_STEPS: u64 = 2_000_000;
        loop {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                self.runtime
                    .push(Violation::new(Invariant::Liveness, format!("no end after {MAX_STEPS} steps")));
                return;
            }
            self.run_ready();
            let now = self.now();
            self.deliver_arrivals(now);
            self.start_operator_actions(now);
            if !self.quiet && now >= self.quiet_at {
                self.quiet = true;
                let mut w = self.shared.w();
                w.faults = w.faults.quiet();
                w.trace.note(now, || "quiet: faults off".into());
            }
            if now >= self.next_sweep {
                self.next_sweep += SUPERVISOR_PERIOD_MS;
                self.start_sweep();
                let p = self.shared.w().faults.double_supervisor;
                if self.roll_outside("double_supervisor", p) {
                    self.start_sweep();
                }
                continue;
            }
            if self.finished() {
                return;
            }
            if now > self.deadline {
                self.runtime.push(Violation::new(
                    Invariant::Liveness,
                    format!(
                        "still running at {now}ms, {}ms after the faults stopped (bound {}ms): {:?}",
                        now - self.quiet_at,
                        self.deadline - self.quiet_at,
                        self.store.state_counts()
                    ),
                ));
                return;
            }
            let jump = self.shared.w().faults.time_jump;
            if self.roll_outside("time_jump", jump) {
                let max = self.shared.w().faults.jump_max_ms.max(1);
                let by = self.shared.w().rng.u64(1..=max);
                self.advance_to(now + by);
                continue;
            }
            self.step(now);
        }
    }

    /// One scheduling decision: run some pending I/O call, start an invocation, or let time pass.
    fn step(&mut self, now: u64) {
        let pending = self.shared.w().pending();
        let startable: Vec<usize> = (0..WORK.len()).filter(|&i| self.startable(i, now)).collect();
        if pending.is_empty() && startable.is_empty() {
            let next = self.next_event(now);
            self.advance_to(next.max(now + 1));
            return;
        }
        const IO: u64 = 4;
        const START: u64 = 3;
        const TICK: u64 = 2;
        let tick = if pending.is_empty() { 0 } else { TICK };
        let total = IO * pending.len() as u64 + START * startable.len() as u64 + tick;
        let mut r = self.shared.w().rng.u64(..total);
        if r < IO * pending.len() as u64 {
            let (ticket, inv) = pending[(r / IO) as usize];
            self.grant(ticket, inv);
            return;
        }
        r -= IO * pending.len() as u64;
        if r < START * startable.len() as u64 {
            self.start_batch(startable[(r / START) as usize]);
            return;
        }
        let by = self.shared.w().rng.u64(1..=TICK_MAX_MS);
        self.advance_to(now + by);
    }

    fn running(&self, function: Function) -> usize {
        self.invs.values().filter(|i| i.function == function).count()
    }

    fn limit(&self, function: Function) -> usize {
        match function {
            Function::Submission => self.swarm.submission_concurrency,
            Function::Scheduler => self.swarm.scheduler_concurrency,
            Function::Agent => self.swarm.agent_concurrency,
            Function::Supervisor | Function::Operator => 0,
        }
    }

    fn startable(&self, work: usize, now: u64) -> bool {
        let (queue, _, _, function) = WORK[work];
        self.running(function) < self.limit(function)
            && !self.out(function, now)
            && self.queues.next_visible(queue).is_some_and(|t| t.0 <= now)
    }

    /// Whether `function` is in its outage at `now`.
    fn out(&self, function: Function, now: u64) -> bool {
        self.shared
            .w()
            .faults
            .outage
            .is_some_and(|(f, from, until)| f == function && from <= now && now < until)
    }

    fn next_event(&self, now: u64) -> u64 {
        let mut next = self.next_sweep;
        if let Some(t) = self.shared.w().next_timer() {
            next = next.min(t);
        }
        if let Some((_, from, until)) = self.shared.w().faults.outage {
            for t in [from, until] {
                if t > now {
                    next = next.min(t);
                }
            }
        }
        for (i, (queue, ..)) in WORK.iter().enumerate() {
            let function = WORK[i].3;
            let full = self.running(function) >= self.limit(function) || self.out(function, now);
            if let Some(t) = self.queues.next_visible(queue)
                && !full
            {
                next = next.min(t.0);
            }
        }
        if let Some(a) = self.arrivals.get(self.next_arrival) {
            next = next.min(a.at);
        }
        if let Some(t) = self.operator_times.get(self.next_operator) {
            next = next.min(*t);
        }
        if !self.quiet {
            next = next.min(self.quiet_at);
        }
        next.max(now)
    }

    fn advance_to(&mut self, t: u64) {
        let wakers = {
            let mut w = self.shared.w();
            if t <= w.now {
                return;
            }
            w.now = t;
            w.due_timers()
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// Which definitions a starting invocation's container holds: before the seed's new
    /// version is published, the old; during its rollout, the new with a probability
    /// growing to one; after, the new.
    fn generation(&self) -> usize {
        let Some(publish) = &self.swarm.publish else { return 0 };
        let now = self.now();
        if now < publish.at_ms {
            return 0;
        }
        let share = match publish.rollout_ms {
            0 => 1.0,
            r => ((now - publish.at_ms) as f64 / r as f64).min(1.0),
        };
        // Drawn from the world's generator, but not a fault: not counted as one.
        usize::from(self.shared.w().rng.f64() < share)
    }

    /// A fault decided by the loop itself, outside any invocation.
    fn roll_outside(&self, kind: &'static str, p: f64) -> bool {
        self.shared.w().roll(kind, p)
    }

    fn deliver_arrivals(&mut self, now: u64) {
        while let Some(a) = self.arrivals.get(self.next_arrival) {
            if a.at > now {
                break;
            }
            let (queue, body) = (a.queue, a.body.clone());
            self.next_arrival += 1;
            let p = self.shared.w().faults.duplicate;
            let copies = if self.roll_outside("duplicate", p) { 2 } else { 1 };
            for _ in 0..copies {
                self.note(|| format!("arrive {queue} {body}"));
                let sent =
                    self.queues.send(&QueueUrl(queue.into()), Outgoing::new(body.clone())).now_or_never();
                assert!(matches!(sent, Some(Ok(()))), "the embedded queue accepts at once");
            }
        }
    }

    fn finished(&self) -> bool {
        self.next_arrival == self.arrivals.len()
            && self.next_operator == self.operator_times.len()
            && self.invs.is_empty()
            && !self.shared.w().has_timers()
            && WORK.iter().all(|(q, ..)| self.queues.depth(q) == 0)
            && self.store.state_counts().keys().all(|s| s.is_terminal())
    }

    // ---- invocations ----

    fn new_inv(&mut self, function: Function) -> (InvId, Option<u32>) {
        self.next_inv += 1;
        self.invocations += 1;
        let id = self.next_inv;
        let mut w = self.shared.w();
        let f = w.faults;
        let skew = if f.skew_max_ms > 0 {
            let b = f.skew_max_ms as i64;
            w.rng.i64(-b..=b)
        } else {
            0
        };
        let crash = f.crash > 0.0 && w.rng.f64() < f.crash;
        let crash_at = crash.then(|| w.rng.u32(0..=12));
        w.invs.insert(id, InvMeta { function: Some(function), skew, faulted: skew != 0 });
        let now = w.now;
        w.trace.note(now, || format!("start inv {id} {function:?} skew {skew} crash_at {crash_at:?}"));
        (id, crash_at)
    }

    fn start_batch(&mut self, work: usize) {
        let (queue, dlq, _, function) = WORK[work];
        let received = self.queues.receive(queue, self.swarm.batch_size).expect("queue exists");
        if received.is_empty() {
            return;
        }
        let (id, crash_at) = self.new_inv(function);
        let generation = self.generation();
        self.note(|| {
            let ids: Vec<&str> = received.iter().map(|r| r.message.message_id.as_str()).collect();
            format!("inv {id} receives {queue} {ids:?}")
        });
        let messages: Vec<Inbound> = received.iter().map(|r| r.message.inbound()).collect();
        let dead_letters = DeadLetters {
            queues: self.sends.clone(),
            source: QueueUrl(queue.into()),
            dead_letter_queue: QueueUrl(dlq.into()),
            metrics: self.metrics.clone(),
        };
        let shared = self.shared.clone();
        let mut agent_slot = None;
        let fut: Pin<Box<dyn Future<Output = InvOut>>> = match function {
            Function::Submission => {
                let h = self.submission[generation].clone();
                Box::pin(async move {
                    InvOut::Batch(
                        run_batch(messages, &dead_letters, |m| {
                            let body = m.body.clone();
                            with_msg(&shared, &body, h.handle(m))
                        })
                        .await,
                    )
                })
            }
            Function::Scheduler => {
                let h = self.scheduler[generation].clone();
                Box::pin(async move {
                    InvOut::Batch(
                        run_batch(messages, &dead_letters, |m| {
                            let body = m.body.clone();
                            with_msg(&shared, &body, h.handle(m))
                        })
                        .await,
                    )
                })
            }
            Function::Agent => {
                let slot = self.agents.iter().position(|(_, busy)| !busy).expect("a free agent");
                self.agents[slot].1 = true;
                agent_slot = Some(slot);
                let h = self.agents[slot].0[generation].clone();
                Box::pin(async move {
                    InvOut::Batch(
                        run_batch(messages, &dead_letters, |m| {
                            let body = m.body.clone();
                            with_msg(&shared, &body, h.handle(m))
                        })
                        .await,
                    )
                })
            }
            Function::Supervisor | Function::Operator => unreachable!("{function:?} is not fed by a queue"),
        };
        let inv = Inv {
            function,
            fut,
            flag: Flag::woken(),
            queue: Some(queue),
            received,
            crash_at,
            granted: 0,
            agent_slot,
            due_at_start: Vec::new(),
        };
        self.invs.insert(id, inv);
        self.run_ready();
    }

    fn start_operator_actions(&mut self, now: u64) {
        while let Some(&t) = self.operator_times.get(self.next_operator) {
            if t > now {
                break;
            }
            self.next_operator += 1;
            self.start_operator_action();
        }
    }

    /// An operator acts on a task picked at random, with what its state calls for (or,
    /// now and then, what it does not: that must be refused). One in three is sent twice
    /// at once, as from two terminals: the two must land at most once between them.
    fn start_operator_action(&mut self) {
        let tasks = self.store.tasks();
        if tasks.is_empty() {
            return;
        }
        let (task, act, twins) = {
            let mut w = self.shared.w();
            // Mostly a task in Error, when there is one: that is what operators act on.
            let errors: Vec<&TaskRecord> = tasks.iter().filter(|t| t.state == ProcessState::Error).collect();
            let task = if !errors.is_empty() && w.rng.u8(..3) > 0 {
                errors[w.rng.usize(..errors.len())].clone()
            } else {
                tasks[w.rng.usize(..tasks.len())].clone()
            };
            let resubmit = |w: &mut crate::world::World| Act::Resubmit {
                from_step: (w.rng.u8(..3) == 0).then(|| w.rng.u32(0..=task.step + 1)),
            };
            let act = match task.state {
                ProcessState::Error if w.rng.bool() => Act::Compensate,
                ProcessState::Error => resubmit(&mut w),
                ProcessState::Pending | ProcessState::Processing if w.rng.u8(..4) > 0 => Act::Cancel,
                _ => match w.rng.u8(..3) {
                    0 => Act::Cancel,
                    1 => Act::Compensate,
                    _ => resubmit(&mut w),
                },
            };
            (task, act, w.rng.u8(..3) == 0)
        };
        self.operator_actions += 1;
        let why = format!("op-{}", self.operator_actions);
        for _ in 0..1 + usize::from(twins) {
            let (id, crash_at) = self.new_inv(Function::Operator);
            let h = self.submission[self.generation()].clone();
            let (order_id, why, seen) = (task.order_id.clone(), why.clone(), task.revision);
            self.note(|| format!("inv {id} operator {act:?} on {order_id} ({why})"));
            let fut: Pin<Box<dyn Future<Output = InvOut>>> = Box::pin(async move {
                // Decided on the task as the operator saw it: a twin, or one delayed until
                // the task came back to the same state, must not land a second time.
                let actor = Actor { by: OPERATOR, why: &why, seen: Some(seen) };
                InvOut::Operator(sas::handlers::operate(&h.deps, &h.settings, &order_id, act, actor).await)
            });
            self.invs.insert(id, Inv::unqueued(Function::Operator, fut, crash_at, Vec::new()));
        }
        self.run_ready();
    }

    fn start_sweep(&mut self) {
        let (id, crash_at) = self.new_inv(Function::Supervisor);
        // What is due by this run's own clock as it starts: the next run must act on it.
        let local_now = {
            let w = self.shared.w();
            w.now.saturating_add_signed(w.invs[&id].skew)
        };
        let due_at_start = self
            .store
            .due(Timestamp(local_now), usize::MAX)
            .now_or_never()
            .expect("the embedded store answers at once")
            .expect("no faults outside the fault layer")
            .into_iter()
            .filter_map(|id| self.store.peek(&id))
            .map(|t| (t.order_id, t.revision))
            .collect();
        let h = self.supervisor[self.generation()].clone();
        let fut = Box::pin(async move { InvOut::Sweep(h.sweep().await) });
        self.invs.insert(id, Inv::unqueued(Function::Supervisor, fut, crash_at, due_at_start));
        self.run_ready();
    }

    /// Polls every woken invocation until none is woken.
    fn run_ready(&mut self) {
        loop {
            let woken: Vec<InvId> =
                self.invs.iter().filter(|(_, i)| i.flag.take()).map(|(id, _)| *id).collect();
            if woken.is_empty() {
                return;
            }
            for id in woken {
                self.poll(id);
            }
        }
    }

    fn poll(&mut self, id: InvId) {
        let Some(inv) = self.invs.get_mut(&id) else { return };
        {
            let mut w = self.shared.w();
            w.current_inv = Some(id);
            w.current_msg = None;
        }
        let result = poll_caught(inv.fut.as_mut(), &inv.flag);
        {
            let mut w = self.shared.w();
            w.current_inv = None;
            w.current_msg = None;
        }
        match result {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(out)) => self.finish(id, out),
            Err(text) => {
                let function = inv.function;
                self.runtime.push(Violation::new(
                    Invariant::NoPanic,
                    format!("{function:?} invocation {id} panicked: {text}"),
                ));
                self.crash(id, "panicked");
            }
        }
    }

    fn grant(&mut self, ticket: u64, inv_id: InvId) {
        let Some(inv) = self.invs.get_mut(&inv_id) else { return };
        if inv.crash_at == Some(inv.granted) {
            self.crash(inv_id, "at an I/O call");
            return;
        }
        inv.granted += 1;
        let waker = {
            let mut w = self.shared.w();
            w.current_inv = Some(inv_id);
            let f = w.faults;
            if f.skew_max_ms > 0 && w.roll("skew_jump", f.skew_jump) {
                let b = f.skew_max_ms as i64;
                let skew = w.rng.i64(-b..=b);
                w.invs.entry(inv_id).or_default().skew = skew;
            }
            w.current_inv = None;
            let io = w.ticket_io(ticket).map(|(_, io)| io);
            let now = w.now;
            w.trace.note(now, || format!("inv {inv_id} io {io:?}"));
            w.grant(ticket)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        self.run_ready();
    }

    /// The invocation dies where it stands: nothing more of it runs, its messages are not
    /// deleted and come back once their visibility lapses.
    fn crash(&mut self, id: InvId, how: &str) {
        let Some(inv) = self.invs.remove(&id) else { return };
        self.crashes += 1;
        if let Some(slot) = inv.agent_slot {
            self.agents[slot].1 = false;
        }
        if inv.function == Function::Supervisor {
            self.sweep_group_faulted = true;
            self.end_of_sweep();
        }
        self.note(|| format!("crash inv {id} {how}"));
        drop(inv);
        self.shared.w().invs.remove(&id);
    }

    fn finish(&mut self, id: InvId, out: InvOut) {
        if self.invs.get(&id).is_some_and(|i| i.crash_at.is_some()) {
            // It crashed after its last I/O call, before the platform deleted anything.
            self.crash(id, "before its messages were deleted");
            return;
        }
        let inv = self.invs.remove(&id).expect("finishing a live invocation");
        if let Some(slot) = inv.agent_slot {
            self.agents[slot].1 = false;
        }
        match out {
            InvOut::Batch(report) => {
                let queue = inv.queue.expect("batches come from a queue");
                for r in &inv.received {
                    if report.failures.contains(&r.message.message_id) {
                        continue;
                    }
                    let lost = {
                        let mut w = self.shared.w();
                        w.current_inv = Some(id);
                        let p = w.faults.delete_lost;
                        let lost = w.roll("delete_lost", p);
                        w.current_inv = None;
                        lost
                    };
                    if !lost {
                        self.queues.delete(queue, &r.receipt);
                    }
                }
                self.note(|| format!("finish inv {id} failures {:?} kept {}", report.failures, report.kept));
            }
            InvOut::Operator(result) => {
                self.note(|| format!("finish inv {id} operator {result:?}"));
            }
            InvOut::Sweep(result) => {
                let faulted = self.shared.w().invs.get(&id).is_some_and(|m| m.faulted);
                self.note(|| format!("finish inv {id} sweep {result:?}"));
                let clean = result.as_ref().is_ok_and(|r| r.errors == 0) && !faulted;
                self.sweep_group_faulted |= !clean;
                self.sweep_group.push((id, inv.due_at_start));
                self.end_of_sweep();
            }
        }
        self.shared.w().invs.remove(&id);
    }

    /// When the last of a group of overlapping supervisor runs ends, and none of them met a
    /// fault: every task due when any of them started has been acted on (by them or by
    /// anyone else). `Invariant::Supervised` ("a task past its deadline is acted on by the
    /// next supervisor run"), allowing concurrent runs to share the work.
    fn end_of_sweep(&mut self) {
        if self.invs.values().any(|i| i.function == Function::Supervisor) {
            return;
        }
        let group = std::mem::take(&mut self.sweep_group);
        if std::mem::take(&mut self.sweep_group_faulted) {
            return;
        }
        for (id, due) in group {
            for (order_id, revision) in due {
                let now = self.store.task(&order_id).now_or_never().expect("at once").expect("no fault");
                if now.is_some_and(|t| t.revision == revision) {
                    self.runtime.push(Violation::new(
                        Invariant::Supervised,
                        format!("supervisor run {id} (and any overlapping) left order {order_id}, due at its start, untouched"),
                    ));
                }
            }
        }
    }

    fn outcome(self) -> Outcome {
        let tasks = self.store.tasks();
        let orders = tasks.iter().map(|t| (t.order_id.clone(), t.order.clone())).collect();
        let dead_letters = [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, WORKER_DLQ]
            .into_iter()
            .map(|q| (q, self.queues.drain(q)))
            .collect();
        let mut w = self.shared.w();
        Outcome {
            seed: self.seed,
            policy: policy(),
            workflows: workflows(&self.swarm),
            arrivals: self.arrivals.clone(),
            tasks,
            orders,
            writes: self.store.writes(),
            write_ctx: std::mem::take(&mut w.write_ctx),
            dead_letters,
            alerts: self.alerts.all(),
            ledger: std::mem::take(&mut w.ledger),
            quiet_at: self.quiet_at,
            bound_ms: liveness_bound_ms(&policy(), &self.swarm.faults, &workflows(&self.swarm)),
            ended_at: w.now,
            steps: self.steps,
            invocations: self.invocations,
            crashes: self.crashes,
            fault_counts: std::mem::take(&mut w.fault_counts),
            metrics: self.metrics.snapshot().counters.into_iter().map(|(m, n)| (m.name(), n)).collect(),
            runtime: self.runtime,
            hash: w.trace.hash.0,
            trace: w.trace.lines.take().unwrap_or_default(),
            swarm: self.swarm,
        }
    }
}
