//! The discrete-event loop. It owns true time and every scheduling decision: which
//! queue's messages start an invocation, which pending I/O call of which running
//! invocation goes next (interleaving concurrent invocations call by call), when time
//! moves, when the supervisor fires and where a crash lands. Each decision is drawn from
//! the seed's one generator, so a seed replays exactly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::Poll;

use futures::FutureExt;
use sas::adapters::embedded::queue_names::SCHEDULER;
use sas::adapters::embedded::{QueueId, Received};
use sas::domain::{Act, Action, AgentReply, OrderId, SchedulerMessage, TaskRecord, Timestamp, Workflows};
use sas::handlers::{BatchOrder, DeadLetters, Inbound};
use sas::ports::{Outgoing, QueueUrl, Queues, StateStore};

use crate::deploy::Deployed;
use crate::deployment::{CALLBACKS, Role, SUPERVISOR_PERIOD_MS, WORK};
use crate::invariants::{Invariant, Violation, branch_live, running_stage};
use crate::invocation::{Invocation, InvocationFuture, NotingAcks, outside_command, run_messages, sweep};
use crate::operator;
use crate::swarm::Swarm;
use crate::timing::{IO_WEIGHT, MAX_STEPS, START_WEIGHT, TICK_MAX_MS, TICK_WEIGHT, seed_bound_ms};
use crate::workload::Arrival;
use crate::world::{InvocationId, Running, Shared};

mod ending;

pub struct EventLoop {
    swarm: Swarm,
    shared: Arc<Shared>,
    deployed: Deployed,
    /// Which of the deployment's agents runs an invocation now.
    agent_busy: Vec<bool>,
    invocations: BTreeMap<InvocationId, Invocation>,
    last_id: InvocationId,
    arrivals: Vec<Arrival>,
    next_arrival: usize,
    /// When the operator acts (`Swarm::operator_actions`), and how many actions so far.
    operator_times: Vec<u64>,
    next_operator: usize,
    operator_actions: usize,
    /// The operator's pause choices (`Swarm::pauses`), apart from the world's generator.
    pause_rng: Option<fastrand::Rng>,
    next_sweep: u64,
    quiet_at: u64,
    quiet: bool,
    /// True time the world first ran with the faults off: `quiet_at`, or later when a
    /// time jump of the fault window carried the clock past it.
    resumed_at: u64,
    deadline: u64,
    steps: u64,
    started: u64,
    crashes: u64,
    runtime: Vec<Violation>,
    /// Supervisor runs that overlapped in time, as a group: what was due when each
    /// started, and whether any of them met a fault or crashed.
    sweep_group: Vec<(InvocationId, Vec<(OrderId, u64)>)>,
    sweep_group_faulted: bool,
    /// The seed's workflows (`deploy::workflows`), built once for the whole seed.
    workflows: Workflows,
    /// Whether some have a parallel stage (to tell how branch replies arrive): seeds
    /// without one pay nothing for it.
    staged: bool,
    /// The seed's bound (`timing::seed_bound_ms`).
    bound_ms: u64,
    /// How branch replies arrived (`count_branch_replies`).
    branch_replies: BTreeMap<&'static str, u64>,
    /// `run_ready`'s list of woken invocations, kept to be reused.
    woken: Vec<InvocationId>,
    /// The work queues' places in the embedded queues, by `WORK`'s order: asked about at
    /// every step, so not looked up by name each time.
    work_ids: [QueueId; WORK.len()],
}

/// How many roles there are (`Role as usize` below this).
const ROLES: usize = 6;
const _: () = assert!(Role::Outside as usize + 1 == ROLES, "Role::Outside is the last role");

/// A role's outage: the role, from, until (`Faults::outage`).
type Outage = Option<(Role, u64, u64)>;

/// Whether `role` is in its outage at `now`.
fn out(outage: Outage, role: Role, now: u64) -> bool {
    outage.is_some_and(|(r, from, until)| r == role && from <= now && now < until)
}

/// What the loop leaves behind, for the run's outcome (`run.rs`).
pub struct Ended {
    pub swarm: Swarm,
    pub workflows: Workflows,
    pub bound_ms: u64,
    pub shared: Arc<Shared>,
    pub deployed: Deployed,
    pub arrivals: Vec<Arrival>,
    pub quiet_at: u64,
    pub resumed_at: u64,
    pub steps: u64,
    pub invocations: u64,
    pub crashes: u64,
    /// Violations seen while running (panics, a sweep that skipped a due task, no end).
    pub runtime: Vec<Violation>,
    pub branch_replies: BTreeMap<&'static str, u64>,
}

impl EventLoop {
    /// A loop over `deployed`. Draws the operator's times from `rng`, after the
    /// deployment's draws (`deploy::deploy`).
    pub fn new(
        swarm: Swarm,
        workflows: Workflows,
        shared: Arc<Shared>,
        deployed: Deployed,
        arrivals: Vec<Arrival>,
        rng: &mut fastrand::Rng,
    ) -> EventLoop {
        let quiet_at = swarm.fault_window_ms;
        let bound_ms = seed_bound_ms(&swarm, &workflows);
        let deadline = quiet_at + bound_ms;
        // Within the fault window, so that the quiet tail's liveness bound holds.
        let mut operator_times: Vec<u64> =
            (0..swarm.operator_actions).map(|_| rng.u64(0..=quiet_at)).collect();
        operator_times.sort_unstable();
        let staged = workflows.all().iter().any(|w| !w.stages.is_empty());
        let work_ids = WORK.map(|w| deployed.queues.id(w.queue).expect("the work queues are deployed"));
        EventLoop {
            work_ids,
            workflows,
            staged,
            bound_ms,
            branch_replies: BTreeMap::new(),
            woken: Vec::new(),
            agent_busy: vec![false; deployed.agents.len()],
            shared,
            deployed,
            invocations: BTreeMap::new(),
            last_id: 0,
            arrivals,
            next_arrival: 0,
            operator_times,
            next_operator: 0,
            operator_actions: 0,
            pause_rng: swarm.pauses.map(fastrand::Rng::with_seed),
            next_sweep: SUPERVISOR_PERIOD_MS,
            quiet_at,
            quiet: false,
            resumed_at: quiet_at,
            deadline,
            steps: 0,
            started: 0,
            crashes: 0,
            runtime: Vec::new(),
            sweep_group: Vec::new(),
            sweep_group_faulted: false,
            swarm,
        }
    }

    /// Runs until every order has ended and nothing is left in flight, or until the run
    /// breaks its liveness bound.
    pub fn run(mut self) -> Ended {
        self.run_to_the_end();
        Ended {
            swarm: self.swarm,
            workflows: self.workflows,
            bound_ms: self.bound_ms,
            shared: self.shared,
            deployed: self.deployed,
            arrivals: self.arrivals,
            quiet_at: self.quiet_at,
            resumed_at: self.resumed_at,
            steps: self.steps,
            invocations: self.started,
            crashes: self.crashes,
            runtime: self.runtime,
            branch_replies: self.branch_replies,
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

    /// `note` of formatted arguments (`Trace::note_args`).
    fn note_args(&self, line: std::fmt::Arguments<'_>) {
        let mut w = self.shared.w();
        let now = w.now;
        w.trace.note_args(now, line);
    }

    fn run_to_the_end(&mut self) {
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
            self.deliver_outside(now);
            self.start_operator_actions(now);
            if !self.quiet && now >= self.quiet_at {
                self.quiet = true;
                self.resumed_at = now;
                let mut w = self.shared.w();
                w.faults = w.faults.quiet();
                w.trace.note(now, || "quiet: faults off".into());
            }
            if now >= self.next_sweep {
                self.next_sweep += SUPERVISOR_PERIOD_MS;
                if self.quiet {
                    self.resume_held();
                }
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
                        self.deployed.store.state_counts()
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
        let (pending, outage) = {
            let w = self.shared.w();
            (w.pending_count(), w.faults.outage)
        };
        let running = self.running_by_role();
        let visible = self.deployed.queues.next_visible_each(&self.work_ids);
        // The work queues an invocation may start from, in order (no allocation per step).
        let mut startable = [0; WORK.len()];
        let mut startables = 0;
        for (i, &at) in visible.iter().enumerate() {
            if self.startable(i, now, &running, outage, at) {
                startable[startables] = i;
                startables += 1;
            }
        }
        let startable = &startable[..startables];
        if pending == 0 && startable.is_empty() {
            let next = self.next_event(now, &running, &visible);
            self.advance_to(next.max(now + 1));
            return;
        }
        let tick = if pending == 0 { 0 } else { TICK_WEIGHT };
        let total = IO_WEIGHT * pending as u64 + START_WEIGHT * startable.len() as u64 + tick;
        let mut r = self.shared.w().rng.u64(..total);
        if r < IO_WEIGHT * pending as u64 {
            let (ticket, id) = self.shared.w().nth_pending((r / IO_WEIGHT) as usize).expect("counted above");
            self.grant(ticket, id);
            return;
        }
        r -= IO_WEIGHT * pending as u64;
        if r < START_WEIGHT * startable.len() as u64 {
            self.start_batch(startable[(r / START_WEIGHT) as usize]);
            return;
        }
        let by = self.shared.w().rng.u64(1..=TICK_MAX_MS);
        self.advance_to(now + by);
    }

    /// How many invocations run, by role (`Role as usize`): one pass over them for a
    /// step's every question of how many run as what.
    fn running_by_role(&self) -> [usize; ROLES] {
        let mut running = [0; ROLES];
        for i in self.invocations.values() {
            running[i.role as usize] += 1;
        }
        running
    }

    fn limit(&self, role: Role) -> usize {
        match role {
            Role::Submission => self.swarm.submission_concurrency,
            Role::Scheduler => self.swarm.scheduler_concurrency,
            Role::Agent => self.swarm.agent_concurrency,
            Role::Supervisor | Role::Operator | Role::Outside => 0,
        }
    }

    /// Whether an invocation may start from `WORK[work]`, whose queue's next message is
    /// visible at `visible`.
    fn startable(
        &self,
        work: usize,
        now: u64,
        running: &[usize; ROLES],
        outage: Outage,
        visible: Option<Timestamp>,
    ) -> bool {
        let consumer = WORK[work].consumer;
        running[consumer as usize] < self.limit(consumer)
            && !out(outage, consumer, now)
            && visible.is_some_and(|t| t.0 <= now)
    }

    /// When something next happens, given the invocations `running` and when each work
    /// queue's next message is `visible` (by `WORK`'s order).
    fn next_event(
        &self,
        now: u64,
        running: &[usize; ROLES],
        visible: &[Option<Timestamp>; WORK.len()],
    ) -> u64 {
        let mut next = self.next_sweep;
        if let Some(t) = self.shared.w().next_timer() {
            next = next.min(t);
        }
        let outage = self.shared.w().faults.outage;
        if let Some((_, from, until)) = outage {
            for t in [from, until] {
                if t > now {
                    next = next.min(t);
                }
            }
        }
        for (work, visible) in WORK.iter().zip(visible) {
            let full = running[work.consumer as usize] >= self.limit(work.consumer)
                || out(outage, work.consumer, now);
            if let Some(t) = visible
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
        if let Some(t) = self.shared.w().outside.next_send() {
            next = next.min(t);
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
            // As SQS does, the queue records who sent the message (`SenderId`).
            let from = match &a.sender {
                Some(sender_id) => Arc::new(self.deployed.queues.sending_as(sender_id)) as Arc<dyn Queues>,
                None => self.deployed.queues.clone(),
            };
            self.next_arrival += 1;
            let p = self.shared.w().faults.duplicate;
            let copies = if self.roll_outside("duplicate", p) { 2 } else { 1 };
            for _ in 0..copies {
                self.note_args(format_args!("arrive {queue} {body}"));
                let sent = from.send(&QueueUrl(queue.into()), Outgoing::new(body.clone())).now_or_never();
                assert!(matches!(sent, Some(Ok(()))), "the embedded queue accepts at once");
            }
        }
    }

    /// The outside party's words due now (`outside.rs`): on the callback queue (where,
    /// like any message from outside, one may arrive twice), or run directly as `sasctl
    /// tasks complete|fail|heartbeat` on a scheduler function's container.
    fn deliver_outside(&mut self, now: u64) {
        let due = self.shared.w().outside.due(now);
        for planned in due {
            let body = planned.body;
            match planned.direct {
                Some((token, completion)) => {
                    let (id, crash_at) = self.new_invocation(Role::Outside);
                    let callbacks = self.deployed.callbacks[self.generation()].clone();
                    self.note_args(format_args!("inv {id} outside {:?} {body}", planned.word));
                    let future = outside_command(callbacks, self.shared.clone(), body, token, completion);
                    self.invocations
                        .insert(id, Invocation::unqueued(Role::Outside, future, crash_at, Vec::new()));
                    self.run_ready();
                }
                None => {
                    let p = self.shared.w().faults.duplicate;
                    let copies = if self.roll_outside("duplicate", p) { 2 } else { 1 };
                    for _ in 0..copies {
                        self.note_args(format_args!("outside {:?} {body}", planned.word));
                        let sent = self
                            .deployed
                            .queues
                            .send(&QueueUrl(CALLBACKS.into()), Outgoing::new(body.clone()))
                            .now_or_never();
                        assert!(matches!(sent, Some(Ok(()))), "the embedded queue accepts at once");
                    }
                }
            }
        }
    }

    fn finished(&self) -> bool {
        self.next_arrival == self.arrivals.len()
            && self.next_operator == self.operator_times.len()
            && self.invocations.is_empty()
            && !self.shared.w().has_timers()
            && self.work_ids.iter().all(|id| self.deployed.queues.depth_at(*id) == 0)
            && self.deployed.store.state_counts().keys().all(|s| s.is_terminal())
    }

    // ---- invocations ----

    /// A new invocation's id and where it will crash, if it does; draws its clock's skew.
    fn new_invocation(&mut self, role: Role) -> (InvocationId, Option<u32>) {
        self.last_id += 1;
        self.started += 1;
        let id = self.last_id;
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
        w.running.insert(id, Running { role: Some(role), skew, faulted: skew != 0, hit: false });
        let now = w.now;
        w.trace.note_args(now, format_args!("start inv {id} {role:?} skew {skew} crash_at {crash_at:?}"));
        (id, crash_at)
    }

    fn start_batch(&mut self, work: usize) {
        let work_queue = WORK[work];
        let queue = work_queue.queue;
        let role = work_queue.consumer;
        let received = self.deployed.queues.receive(queue, self.swarm.batch_size).expect("queue exists");
        if received.is_empty() {
            return;
        }
        let replies = if queue == SCHEDULER { self.count_branch_replies(&received) } else { Vec::new() };
        let (id, crash_at) = self.new_invocation(role);
        let generation = self.generation();
        // The ids as a `Vec<&str>` would print, without making one.
        struct Ids<'a>(&'a [Received]);
        impl std::fmt::Debug for Ids<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_list().entries(self.0.iter().map(|r| r.message.message_id.as_str())).finish()
            }
        }
        self.note_args(format_args!("inv {id} receives {queue} {:?}", Ids(&received)));
        let messages: Vec<Inbound> = received.iter().map(|r| r.message.inbound()).collect();
        let dead_letters = DeadLetters {
            queues: self.deployed.sends.clone(),
            source: QueueUrl(queue.into()),
            dead_letter_queue: QueueUrl(work_queue.dead_letter.into()),
            metrics: self.deployed.metrics.clone(),
        };
        let shared = self.shared.clone();
        let mut agent_slot = None;
        let future = match role {
            Role::Submission => run_messages(
                (self.deployed.submission[generation].clone(), BatchOrder::Concurrent),
                shared,
                messages,
                dead_letters,
            ),
            // The scheduler function takes the callback queue with its `Callbacks` handler.
            Role::Scheduler if queue == CALLBACKS => {
                let noting = NotingAcks {
                    callbacks: self.deployed.callbacks[generation].clone(),
                    shared: shared.clone(),
                };
                run_messages((noting, BatchOrder::Concurrent), shared, messages, dead_letters)
            }
            Role::Scheduler => run_messages(
                (self.deployed.scheduler[generation].clone(), self.swarm.scheduler_batches),
                shared,
                messages,
                dead_letters,
            ),
            Role::Agent => {
                let slot = self.agent_busy.iter().position(|busy| !busy).expect("a free agent");
                self.agent_busy[slot] = true;
                agent_slot = Some(slot);
                run_messages(
                    (self.deployed.agents[slot][generation].clone(), BatchOrder::Concurrent),
                    shared,
                    messages,
                    dead_letters,
                )
            }
            Role::Supervisor | Role::Operator | Role::Outside => {
                unreachable!("{role:?} is not fed by a queue")
            }
        };
        let mut invocation = Invocation::batch(role, future, queue, received, crash_at, agent_slot);
        invocation.replies = replies;
        self.invocations.insert(id, invocation);
        self.run_ready();
    }

    /// How the branch replies of a batch find their task as they are received, to show the
    /// races stages are run through (nothing here draws from the generator or writes to the
    /// trace): `live` (its branch's dispatch is in flight), `stale` (within the stage, but a
    /// duplicate or an earlier dispatch's), `late` (the stage ended: the task went past it
    /// or gave up), `out_of_order` (live while a branch before it is still out), `racing`
    /// (another reply of the same stage is in this batch or in a running scheduler's).
    fn count_branch_replies(&mut self, received: &[Received]) -> Vec<Option<(OrderId, u32)>> {
        if !self.staged {
            return Vec::new();
        }
        let all = &self.workflows;
        // Each message parsed once, here: the batch's replies, and those of the running
        // schedulers' batches as they were parsed when those started (`Invocation::replies`).
        // A forward reply names its action `"do"`, or spells it with escapes: no other body
        // can be one, and is not parsed.
        let may_be_forward = |body: &str| body.contains(r#""do""#) || body.contains('\\');
        let replies: Vec<Option<AgentReply>> = received
            .iter()
            .map(|r| {
                match may_be_forward(&r.message.body).then(|| SchedulerMessage::parse(&r.message.body)) {
                    Some(Ok(SchedulerMessage::Reply(reply))) if reply.action == Action::Do => Some(reply),
                    _ => None,
                }
            })
            .collect();
        let mut counted = Vec::new();
        for (n, reply) in replies.iter().enumerate() {
            let Some(reply) = reply else { continue };
            let Some(task) = self.deployed.store.peek(&reply.order_id) else { continue };
            let Some(wf) = all.get_version(&task.workflow, task.workflow_version) else { continue };
            let Some(stage) = wf.stage_of(reply.step) else { continue };
            counted.push("branch_replies");
            let dispatch = task.stage().and_then(|run| run.branch(reply.step));
            if running_stage(&task, wf) != Some(stage) {
                counted.push("late");
            } else if branch_live(&task, reply.step, task.updated_at)
                && dispatch.is_some_and(|b| b.attempt == reply.attempt)
            {
                counted.push("live");
                let run = task.stage().expect("live at its stage");
                if run.each().any(|(i, b)| i < reply.step && b.in_flight()) {
                    counted.push("out_of_order");
                }
            } else {
                counted.push("stale");
            }
            let same_stage =
                |(order_id, step): (&OrderId, u32)| *order_id == reply.order_id && stage.contains(step);
            let in_batch = replies
                .iter()
                .enumerate()
                .filter(|(m, _)| *m != n)
                .filter_map(|(_, o)| o.as_ref().map(|o| (&o.order_id, o.step)));
            let elsewhere = self
                .invocations
                .values()
                .filter(|i| i.queue == Some(SCHEDULER))
                .flat_map(|i| i.replies.iter().flatten().map(|(o, step)| (o, *step)));
            if in_batch.chain(elsewhere).any(same_stage) {
                counted.push("racing");
            }
        }
        for kind in counted {
            *self.branch_replies.entry(kind).or_default() += 1;
        }
        replies.into_iter().map(|r| r.map(|r| (r.order_id, r.step))).collect()
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

    /// An operator acts on a task (`operator::decide`); a twin starts a second invocation
    /// with the same action.
    fn start_operator_action(&mut self) {
        let tasks = self.deployed.store.tasks();
        if tasks.is_empty() {
            return;
        }
        let operator::Decision { task, mut command, twins } =
            operator::decide(&tasks, &mut self.shared.w(), self.pause_rng.as_mut());
        if let operator::Command::ByHand { step, name, completion } = &mut command {
            let settings = &self.deployed.submission[self.generation()].settings;
            let wf = settings.workflows.get_version(&task.workflow, task.workflow_version);
            *name =
                wf.and_then(|wf| wf.step(*step)).map_or_else(|| format!("step-{step}"), |s| s.name.clone());
            // The outside's own output for the step, relayed.
            if let sas::domain::Completion::Success { output } = completion {
                let key = sas::domain::idempotency_key(&task.order_id, *step, sas::domain::Action::Do).0;
                *output = self
                    .shared
                    .w()
                    .ledger
                    .callback_outputs
                    .get(&key)
                    .and_then(|o| serde_json::from_str(o).ok());
            }
        }
        self.operator_actions += 1;
        let why = format!("op-{}", self.operator_actions);
        for _ in 0..1 + usize::from(twins) {
            let (id, crash_at) = self.new_invocation(Role::Operator);
            let submission = self.deployed.submission[self.generation()].clone();
            let (order_id, why, seen) = (task.order_id.clone(), why.clone(), task.revision);
            self.note_args(format_args!("inv {id} operator {command:?} on {order_id} ({why})"));
            let future: InvocationFuture =
                operator::command(submission, order_id, command.clone(), why, seen);
            self.invocations.insert(id, Invocation::unqueued(Role::Operator, future, crash_at, Vec::new()));
        }
        self.run_ready();
    }

    /// After the faults stop, the operator lifts every hold it left, once a supervisor
    /// period (a pause that lands after a resume is lifted the next time), so every order
    /// can end: a paused task waits for its operator, not for the liveness bound.
    fn resume_held(&mut self) {
        let held: Vec<TaskRecord> = self.deployed.store.tasks_where(|t| t.paused());
        if held.is_empty() {
            return;
        }
        for task in held {
            self.operator_actions += 1;
            let why = format!("op-{} (lift the hold)", self.operator_actions);
            let (id, crash_at) = self.new_invocation(Role::Operator);
            let submission = self.deployed.submission[self.generation()].clone();
            let (order_id, seen) = (task.order_id.clone(), task.revision);
            self.note_args(format_args!("inv {id} operator Resume on {order_id} ({why})"));
            let future: InvocationFuture =
                operator::command(submission, order_id, operator::Command::Act(Act::Resume), why, seen);
            self.invocations.insert(id, Invocation::unqueued(Role::Operator, future, crash_at, Vec::new()));
        }
        self.run_ready();
    }

    fn start_sweep(&mut self) {
        let (id, crash_at) = self.new_invocation(Role::Supervisor);
        // What is due by this run's own clock as it starts: the next run must act on it.
        let local_now = {
            let w = self.shared.w();
            w.now.saturating_add_signed(w.running[&id].skew)
        };
        let store = &self.deployed.store;
        let due_at_start = store
            .due(Timestamp(local_now), usize::MAX)
            .now_or_never()
            .expect("the embedded store answers at once")
            .expect("no faults outside the fault layer")
            .into_iter()
            .filter_map(|id| store.peek_revision(&id).map(|revision| (id, revision)))
            .collect();
        let future = sweep(self.deployed.supervisor[self.generation()].clone());
        self.invocations.insert(id, Invocation::unqueued(Role::Supervisor, future, crash_at, due_at_start));
        self.run_ready();
    }

    /// Polls every woken invocation until none is woken.
    fn run_ready(&mut self) {
        // The list of woken invocations is kept between calls, so polling allocates none.
        let mut woken = std::mem::take(&mut self.woken);
        loop {
            woken.clear();
            woken.extend(self.invocations.iter().filter(|(_, i)| i.flag.take()).map(|(id, _)| *id));
            if woken.is_empty() {
                break;
            }
            for &id in &woken {
                self.poll(id);
            }
        }
        self.woken = woken;
    }

    fn poll(&mut self, id: InvocationId) {
        let Some(invocation) = self.invocations.get_mut(&id) else { return };
        match invocation.poll(id, &self.shared) {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(returned)) => self.finish(id, returned),
            Err(text) => {
                let role = invocation.role;
                self.runtime.push(Violation::new(
                    Invariant::NoPanic,
                    format!("{role:?} invocation {id} panicked: {text}"),
                ));
                self.crash(id, "panicked");
            }
        }
    }

    /// Lets invocation `id` make its pending I/O call `ticket`, unless it crashes there.
    fn grant(&mut self, ticket: u64, id: InvocationId) {
        let Some(invocation) = self.invocations.get_mut(&id) else { return };
        if invocation.crash_at == Some(invocation.granted) {
            self.crash(id, "at an I/O call");
            return;
        }
        invocation.granted += 1;
        let waker = {
            let mut w = self.shared.w();
            w.current_invocation = Some(id);
            let f = w.faults;
            if f.skew_max_ms > 0 && w.roll("skew_jump", f.skew_jump) {
                let b = f.skew_max_ms as i64;
                let skew = w.rng.i64(-b..=b);
                w.running.entry(id).or_default().skew = skew;
            }
            w.current_invocation = None;
            w.note_io(id, ticket);
            w.grant(ticket)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        self.run_ready();
    }
}
