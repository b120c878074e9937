//! Swarm testing: each seed switches every fault on or off, and picks its rates and the
//! shape of the run (concurrency, batch sizes, workload), so that some seeds hammer one
//! mechanism alone and others combine them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sas::domain::gate::{Limits, OrderKey, PerKey};
use sas::handlers::BatchOrder;

use sas::domain::definitions::MAX_STEPS;
use sas::domain::workflow::Stage;
use sas::domain::{Callback, MapStep, OnGiveUp, Step, Wait, Workflow};

use crate::deployment::Role;
use crate::ledger::RemoteFaults;
use crate::outside::OutsideRates;

/// Probabilities and bounds of every fault. All zero: a fault-free world.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Per invocation: it crashes at a uniformly chosen I/O call (or just before the
    /// platform deletes its messages). Its messages come back after the visibility timeout.
    pub crash: f64,
    /// A store call fails before it is applied (throttling).
    pub store_throttle: f64,
    /// A store write is applied but its response is lost (`Unavailable`).
    pub store_lost_response: f64,
    /// A send fails before anything is sent.
    pub send_fail: f64,
    /// A send is applied but its response is lost, so the handler retries it.
    pub send_lost_response: f64,
    /// A message to an internal queue is delivered twice.
    pub duplicate: f64,
    /// A message to an internal queue is delayed by up to `delay_max_ms` (reordering,
    /// and replies that arrive after a retry started).
    pub delay: f64,
    pub delay_max_ms: u64,
    /// The platform fails to delete a handled message: it is redelivered.
    pub delete_lost: f64,
    /// The operators' topic is unreachable.
    pub alert_fail: f64,
    /// The remote service's faults and service time (`ledger.rs`).
    pub remote: RemoteFaults,
    /// A hung remote call's timeout fires up to this late (a hang past complete-by).
    pub overshoot_max_ms: u64,
    /// Each invocation's clock is off by up to this much, either way.
    pub skew_max_ms: u64,
    /// Per I/O call: the invocation's clock jumps (within the skew bound).
    pub skew_jump: f64,
    /// Per loop step: true time jumps forward by up to `jump_max_ms` (a stalled world).
    pub time_jump: f64,
    pub jump_max_ms: u64,
    /// Per supervisor schedule: a second sweep starts at the same time.
    pub double_supervisor: f64,
    /// A function does not run at all from one time to another (throttled to zero, a
    /// broken deploy): its queue backs up and the supervisor sees its tasks lapse.
    pub outage: Option<(Role, u64, u64)>,
    /// A branch of a parallel stage is refused for good by its service (on top of
    /// `remote.permanent`): the stage gives up with other branches still out.
    pub branch_refusal: f64,
    /// A limited agent's call is answered "too many requests" (429, Retry-After of 100 ms
    /// to `busy_retry_max_ms`): its agent replies Throttled and its gate pauses.
    pub remote_busy: f64,
    pub busy_retry_max_ms: u64,
}

impl Faults {
    /// What stays on in the quiet tail: the remote service keeps its latency, nothing else.
    pub fn quiet(&self) -> Faults {
        let remote = RemoteFaults {
            latency_max_ms: self.remote.latency_max_ms,
            ignores_undone: self.remote.ignores_undone,
            ..RemoteFaults::default()
        };
        Faults { remote, ..Faults::default() }
    }

    pub fn enabled(&self) -> Vec<&'static str> {
        let all = [
            ("crash", self.crash),
            ("store_throttle", self.store_throttle),
            ("store_lost_response", self.store_lost_response),
            ("send_fail", self.send_fail),
            ("send_lost_response", self.send_lost_response),
            ("duplicate", self.duplicate),
            ("delay", self.delay),
            ("delete_lost", self.delete_lost),
            ("alert_fail", self.alert_fail),
            ("remote_transient", self.remote.transient),
            ("remote_permanent", self.remote.permanent),
            ("remote_undo_permanent", self.remote.undo_permanent),
            ("remote_hang", self.remote.hang),
            ("remote_bad_output", self.remote.bad_output),
            ("remote_ignores_undone", if self.remote.ignores_undone { 1.0 } else { 0.0 }),
            ("skew", self.skew_max_ms as f64),
            ("time_jump", self.time_jump),
            ("double_supervisor", self.double_supervisor),
            ("outage", if self.outage.is_some() { 1.0 } else { 0.0 }),
            ("branch_refusal", self.branch_refusal),
            ("remote_busy", self.remote_busy),
        ];
        all.into_iter().filter(|(_, v)| *v > 0.0).map(|(k, _)| k).collect()
    }
}

/// Everything a seed decides about its run before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Swarm {
    pub faults: Faults,
    /// Valid orders submitted.
    pub orders: usize,
    /// The workflows orders are drawn from, uniformly (`deployment::workflows_before_publish`).
    pub workflows: &'static [&'static str],
    /// This seed's own random workflow, named `generated` (`generated_workflow`).
    pub generated: Workflow,
    /// A newer version of `generated`, published mid-run (half the seeds).
    pub publish: Option<Publish>,
    /// Agent `c` of the generated workflows is a `queue` agent (half the seeds): its
    /// requests go to a worker's queue (`deployment::WORKER`), and the worker replies.
    pub queue_agent: bool,
    /// Orders sent a second time, byte for byte.
    pub resends: usize,
    /// Orders sent again under an existing id with a different payload.
    pub conflicts: usize,
    /// Bad messages sent to the orders, scheduler and agent queues.
    pub bad_inputs: usize,
    /// Orders arrive over this long.
    pub arrival_window_ms: u64,
    /// Faults stop this long after the first order; then the quiet tail runs.
    pub fault_window_ms: u64,
    /// Concurrent invocations per queue-fed function (Lambda's concurrency).
    pub submission_concurrency: usize,
    pub scheduler_concurrency: usize,
    pub agent_concurrency: usize,
    pub batch_size: usize,
    /// Supervisor index page size (small pages exercise paging), and the most a page
    /// grows to.
    pub page_size: usize,
    pub max_page_size: usize,
    /// How long a supervisor run may take (`SweepBudget::run_ms`): in one seed in four,
    /// short enough that a run stops with due tasks left for the next one.
    pub sweep_run_ms: u64,
    /// Operator actions (resubmit, compensate, cancel) taken on tasks during the fault
    /// window, racing the pipeline; some sent twice at once, as from two terminals.
    pub operator_actions: usize,
    /// Apps' cancel messages on the orders queue.
    pub app_cancels: usize,
    /// How the outside party of callback steps misbehaves (`outside.rs`).
    pub outside: OutsideRates,
    /// The operator also pauses and resumes tasks (`operator.rs`), drawing those choices
    /// from a generator of their own seeded with this; `None`: it never pauses, and the
    /// seed runs as it did before pauses existed.
    pub pauses: Option<u64>,
    /// Flow-control limits of some agents (`with_limits`), as their definitions would set
    /// them; empty: no agent has a gate, and the seed runs as it did before gates existed.
    pub limits: BTreeMap<String, Limits>,
    /// How the scheduler's batches run: by order, as deployed, in three seeds in four;
    /// every message at once in the others (and in `before_limits`' swarms), where one
    /// order's messages of a batch race on its record as two containers' do.
    pub scheduler_batches: BatchOrder,
}

/// A new version of a workflow published during the run, as a deploy rolls it out: from
/// `at_ms`, each invocation runs on a container that has it with a probability growing
/// to one over `rollout_ms`; before, and on the other containers, handlers know only the
/// versions before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    pub at_ms: u64,
    pub rollout_ms: u64,
    pub workflow: Workflow,
}

/// Each seed runs one workflow alone, or all of them together.
const WORKFLOW_MIXES: [&[&str]; 6] = [
    &["single-step"],
    &["three-step"],
    &["saga"],
    &["generated"],
    &["generated"],
    &["single-step", "three-step", "saga", "generated"],
];

/// A random workflow as a team might define one: 1 to 5 steps (one in eight up to the
/// most a workflow may have), each compensable, a pivot or read-only, on one of three
/// agents, some with their own failure budget and timeout, giving up by compensating or
/// (one in four) by failing; in half the workflows some steps wait for a callback, in half
/// there are timers, in half a parallel stage (`with_stage`). Its steps' names start with
/// `prefix`.
pub fn generated_workflow(rng: &mut fastrand::Rng, prefix: &str) -> Workflow {
    let len = if rng.u8(..8) == 0 { rng.usize(6..=MAX_STEPS) } else { rng.usize(1..=5) };
    // Timers come from a generator of their own, seeded from (not drawn from) the seed's:
    // the seed's other draws, and so its other workflows, faults and arrivals, are what
    // they were before timers existed, and half the seeds' workflows have none.
    let mut timers = fastrand::Rng::with_seed(rng.clone().u64(..) ^ TIMER_SALT);
    // Callbacks too, for the same reason.
    let mut callbacks = fastrand::Rng::with_seed(rng.clone().u64(..) ^ CALLBACK_SALT);
    let steps: Vec<Step> = (0..len)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let agent = ["a", "b", "c"][rng.usize(..3)];
            let step = match rng.u8(..3) {
                0 => Step::compensable(&name, agent, &format!("undo-{prefix}{i}")),
                1 => Step::pivot(&name, agent),
                _ => Step::read_only(&name, agent),
            };
            let max_failures = (rng.u8(..3) == 0).then(|| rng.u32(1..=4));
            let timeout_ms = (rng.u8(..3) == 0).then(|| rng.u64(1_000..=2_500));
            Step { max_failures, timeout_ms, ..step }
        })
        .collect();
    // And a parallel stage: seeds whose workflow has none run as they did before stages.
    let mut stages = fastrand::Rng::with_seed(rng.clone().u64(..) ^ STAGE_SALT);
    let steps = if callbacks.bool() { with_callbacks(&mut callbacks, steps) } else { steps };
    let steps = if timers.bool() { with_timers(&mut timers, steps, prefix) } else { steps };
    let mut workflow = Workflow::new("generated", steps);
    if stages.u8(..4) > 0 {
        with_stage(&mut stages, &mut workflow, prefix);
    }
    // And a map step, in one workflow in three, from a generator of its own again.
    let mut maps = fastrand::Rng::with_seed(rng.clone().u64(..) ^ MAP_SALT);
    if maps.u8(..3) == 0 {
        with_map(&mut maps, &mut workflow, prefix);
    }
    workflow.version = rng.u32(1..=3);
    if rng.u8(..4) == 0 {
        workflow.on_give_up = OnGiveUp::Fail;
    }
    workflow
}

const TIMER_SALT: u64 = 0x7469_6d65_7273;
const CALLBACK_SALT: u64 = 0x6361_6c6c_6261_636b;
const STAGE_SALT: u64 = 0x7374_6167_6573;
const MAP_SALT: u64 = 0x6d61_7073;

/// The agent of generated map steps (and of the steps that list their items): given
/// limits last of all (`with_limits`), its maps then gated.
pub const MAP_AGENT: &str = "m";

/// `workflow` with a map step put anywhere outside its stage, right after a read-only
/// step that lists its items: `<prefix>-list`, whose answer the service model gives a
/// `lines` array of none, one, a few or (one time in twenty) hundreds of items, with
/// duplicates (`ledger.rs`). The map runs 1 to 4 items at a time (one in four maps up to
/// 10), tolerates 0 to 2 refusals, and its step is mostly compensable, else a pivot or a
/// read, with a failure budget and timeout of its own as often as other steps.
fn with_map(rng: &mut fastrand::Rng, workflow: &mut Workflow, prefix: &str) {
    if workflow.steps.len() + 2 > MAX_STEPS {
        return;
    }
    let stage = workflow.stages.first().map(|st| (st.start, st.end()));
    let places: Vec<u32> = (0..=workflow.len())
        .filter(|at| stage.is_none_or(|(start, end)| *at <= start || *at >= end))
        .collect();
    let at = places[rng.usize(..places.len())];
    let list = format!("{prefix}-list");
    let name = format!("{prefix}m");
    let step = match rng.u8(..6) {
        0..=3 => Step::compensable(&name, MAP_AGENT, &format!("undo-{name}")),
        4 => Step::pivot(&name, MAP_AGENT),
        _ => Step::read_only(&name, MAP_AGENT),
    };
    let max_failures = (rng.u8(..3) == 0).then(|| rng.u32(1..=4));
    let timeout_ms = (rng.u8(..3) == 0).then(|| rng.u64(1_000..=2_500));
    let step = Step { max_failures, timeout_ms, ..step };
    let i = at as usize;
    workflow.steps.splice(i..i, [Step::read_only(&list, MAP_AGENT), step]);
    for st in workflow.stages.iter_mut().filter(|st| st.start >= at) {
        st.start += 2;
    }
    let max_concurrency = if rng.u8(..4) == 0 { rng.u32(1..=10) } else { rng.u32(1..=4) };
    workflow.maps = vec![MapStep {
        name: format!("{prefix}-map"),
        at: at + 1,
        items: format!("$.steps.{list}.output.lines"),
        max_concurrency,
        tolerated_failures: rng.u32(0..=2),
        gated: false,
    }];
}

/// The most branches a generated stage has: enough for three replies to race one record
/// and for a refusal to find others still out, few enough to keep a seed's run short.
pub const MAX_GENERATED_BRANCHES: usize = 4;

/// `workflow` with a parallel stage of 2 to 4 branches put anywhere among its steps (its
/// length kept within bounds): each branch compensable (half of them), a pivot or
/// read-only, on any agent, a third with a failure budget and a third with a timeout of their own, as the
/// other steps. Branches are plain agent steps: a stage has no timer or callback.
fn with_stage(rng: &mut fastrand::Rng, workflow: &mut Workflow, prefix: &str) {
    let room = MAX_STEPS - workflow.steps.len();
    if room < 2 {
        return;
    }
    let len = rng.usize(2..=MAX_GENERATED_BRANCHES.min(room));
    let at = rng.usize(0..=workflow.steps.len());
    let branches = (0..len).map(|i| {
        let name = format!("{prefix}p{i}");
        let agent = ["a", "b", "c"][rng.usize(..3)];
        // Mostly compensable: a stage holding a pivot that may have taken effect is never
        // undone, and undoing a stage exactly is what there is to check.
        let step = match rng.u8(..5) {
            0..=2 => Step::compensable(&name, agent, &format!("undo-{name}")),
            3 => Step::pivot(&name, agent),
            _ => Step::read_only(&name, agent),
        };
        let max_failures = (rng.u8(..3) == 0).then(|| rng.u32(1..=4));
        let timeout_ms = (rng.u8(..3) == 0).then(|| rng.u64(1_000..=2_500));
        Step { max_failures, timeout_ms, ..step }
    });
    let branches: Vec<Step> = branches.collect();
    workflow.steps.splice(at..at, branches);
    workflow.stages = vec![Stage { name: format!("{prefix}-stage"), start: at as u32, len: len as u32 }];
}

/// `workflow` as it was before its stage was put in: its branches taken out. The steps
/// around them are the ones drawn without stages, so the seed's history is the one it had
/// before stages existed (`sim/tests/simulation.rs` pins some).
pub fn without_stages(workflow: &mut Workflow) {
    // Its map and the step that lists its items too.
    for map in std::mem::take(&mut workflow.maps) {
        workflow.steps.drain(map.at as usize - 1..=map.at as usize);
        for st in workflow.stages.iter_mut().filter(|st| st.start > map.at) {
            st.start -= 2;
        }
    }
    for stage in std::mem::take(&mut workflow.stages).iter().rev() {
        workflow.steps.drain(stage.start as usize..stage.end() as usize);
    }
}

/// `steps` with about two in five (three in four of a single step) waiting for a callback
/// once their agent answers: compensable, pivot and read-only ones alike, before and after
/// pivots.
fn with_callbacks(rng: &mut fastrand::Rng, steps: Vec<Step>) -> Vec<Step> {
    let chance = if steps.len() == 1 { 0.75 } else { 0.4 };
    steps
        .into_iter()
        .map(|step| if rng.f64() < chance { step.with_callback(callback(rng)) } else { step })
        .collect()
}

/// A callback's timeout and heartbeat: most time out within 1.5 to 4 s (so a slow or silent
/// outside makes them lapse), some within 4 to 10 s, a few within 1 to 1.5 s (about the
/// agent's own complete-by); half must hear a heartbeat every 1 to 3 s.
fn callback(rng: &mut fastrand::Rng) -> Callback {
    let timeout_ms = match rng.u8(..10) {
        0 => rng.u64(1_000..=1_500),
        1..=6 => rng.u64(1_500..=4_000),
        _ => rng.u64(4_000..=10_000),
    };
    let heartbeat_ms = rng.bool().then(|| rng.u64(1_000..=timeout_ms.min(3_000)));
    Callback { timeout_ms, heartbeat_ms }
}

/// `steps` with a timer before about one in three of them and after the last one time in
/// two (the workflow's length kept within bounds).
fn with_timers(rng: &mut fastrand::Rng, steps: Vec<Step>, prefix: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let room = MAX_STEPS - steps.len();
    let mut added = 0;
    let last = steps.len();
    for (i, step) in steps.into_iter().map(Some).chain([None]).enumerate() {
        // Before a step one time in three; after the last, one time in two.
        let chance = if i == last { 2 } else { 3 };
        if added < room && rng.u8(..chance) == 0 {
            let agents_before: Vec<String> =
                out.iter().filter(|s| !s.is_timer()).map(|s| s.name.clone()).collect();
            out.push(timer_step(rng, &format!("{prefix}t{added}"), &agents_before));
            added += 1;
        }
        out.extend(step);
    }
    out
}

/// A timer step: most wait a second or three (woken by their delayed Schedule), one in
/// four past SQS's longest delay (woken by the supervisor's sweep), and half of those after
/// an agent step wait until its answer's `release_at` instead (`ledger.rs`), which half
/// the answers lack: the step then fails for good.
fn timer_step(rng: &mut fastrand::Rng, name: &str, agents_before: &[String]) -> Step {
    let for_ms = if rng.u8(..4) == 0 {
        rng.u64(sas::domain::wait::MAX_DELAYED_WAKE_MS + 1..=LONG_WAIT_MS)
    } else {
        rng.u64(1_000..=3_000)
    };
    let wait = match agents_before {
        [] => Wait::for_ms(for_ms),
        before if rng.bool() => {
            Wait::until(&format!("$.steps.{}.output.release_at", before[rng.usize(..before.len())]))
        }
        _ => Wait::for_ms(for_ms),
    };
    Step::timer(name, wait)
}

/// The longest wait a generated timer has.
pub const LONG_WAIT_MS: u64 = 960_000;

fn pick(rng: &mut fastrand::Rng, lo: f64, hi: f64) -> f64 {
    lo + rng.f64() * (hi - lo)
}

impl Swarm {
    /// The seed's swarm: each fault independently on with probability one half.
    pub fn from_rng(rng: &mut fastrand::Rng) -> Swarm {
        let (mut swarm, limit_seed) = Swarm::drawn(rng);
        swarm.with_limits(&mut fastrand::Rng::with_seed(limit_seed));
        // From a side generator, so the seed's other draws are what they were.
        if fastrand::Rng::with_seed(rng.get_seed() ^ BATCH_ORDER_SALT).u8(..4) > 0 {
            swarm.scheduler_batches = BatchOrder::ByOrder;
        }
        swarm
    }

    /// The seed's swarm as it was before agents had limits (`with_limits` changes a
    /// limited seed's shape too): what the pinned histories of `sim/tests/simulation.rs`
    /// replay. Draws from `rng` exactly what `from_rng` draws.
    pub fn before_limits(rng: &mut fastrand::Rng) -> Swarm {
        Swarm::drawn(rng).0
    }

    /// The swarm drawn from the seed's generator, and the seed of the limits' generator.
    fn drawn(rng: &mut fastrand::Rng) -> (Swarm, u64) {
        let on = |rng: &mut fastrand::Rng, lo: f64, hi: f64| if rng.bool() { pick(rng, lo, hi) } else { 0.0 };
        let crash = on(rng, 0.05, 0.4);
        let store_throttle = on(rng, 0.01, 0.1);
        let store_lost_response = on(rng, 0.01, 0.1);
        let send_fail = on(rng, 0.01, 0.1);
        let send_lost_response = on(rng, 0.01, 0.1);
        let duplicate = on(rng, 0.02, 0.3);
        let delay = on(rng, 0.05, 0.4);
        let delete_lost = on(rng, 0.02, 0.2);
        let alert_fail = on(rng, 0.1, 0.5);
        let remote_transient = on(rng, 0.05, 0.5);
        let remote_permanent = on(rng, 0.02, 0.2);
        let remote_undo_permanent = if rng.u8(..4) == 0 { pick(rng, 0.02, 0.2) } else { 0.0 };
        let remote_hang = on(rng, 0.02, 0.3);
        let remote_bad_output = if rng.u8(..4) == 0 { pick(rng, 0.02, 0.2) } else { 0.0 };
        let skew = rng.bool();
        let mut time_jump = on(rng, 0.001, 0.01);
        let double_supervisor = on(rng, 0.1, 0.5);
        let outage = (rng.u8(..4) == 0).then(|| {
            let role = [Role::Submission, Role::Scheduler, Role::Agent][rng.usize(..3)];
            let from = rng.u64(0..=3_000);
            (role, from, from + rng.u64(2_000..=15_000))
        });
        // One seed in four has a remote without the tombstone (a late `do` after its undo is
        // applied). Its world never stalls: the cancel's hold covers delays up to the reply
        // grace, not a request held up for seconds (docs/SIMULATION.md). Drawn from a side
        // generator, so that every other seed runs as it did before this choice existed.
        let ignores_undone = fastrand::Rng::with_seed(rng.get_seed() ^ 0x7b5d_u64).u8(..4) == 0;
        if ignores_undone {
            time_jump = 0.0;
        }
        let mut faults = Faults {
            crash,
            store_throttle,
            store_lost_response,
            send_fail,
            send_lost_response,
            duplicate,
            delay,
            delay_max_ms: rng.u64(100..=6_000),
            delete_lost,
            alert_fail,
            overshoot_max_ms: rng.u64(0..=300),
            remote: RemoteFaults {
                transient: remote_transient,
                permanent: remote_permanent,
                undo_permanent: remote_undo_permanent,
                hang: remote_hang,
                latency_max_ms: rng.u64(0..=200),
                bad_output: remote_bad_output,
                ignores_undone,
            },
            skew_max_ms: if skew { rng.u64(1..=200) } else { 0 },
            skew_jump: if skew { pick(rng, 0.0, 0.05) } else { 0.0 },
            time_jump,
            jump_max_ms: rng.u64(100..=3_000),
            double_supervisor,
            outage,
            branch_refusal: 0.0,
            remote_busy: 0.0,
            busy_retry_max_ms: 0,
        };
        let orders = rng.usize(1..=8);
        let generated = generated_workflow(rng, "g");
        let fault_window_ms = rng.u64(2_000..=20_000);
        let publish = rng.bool().then(|| {
            let mut workflow = generated_workflow(rng, "n");
            workflow.version = generated.version + rng.u32(1..=2);
            // Rolled out within the fault window: the quiet tail runs on one version set.
            let at_ms = rng.u64(0..=fault_window_ms / 2);
            Publish { at_ms, rollout_ms: rng.u64(0..=fault_window_ms / 2), workflow }
        });
        // Most seeds with a stage have its branches refused more often than other steps,
        // from a side generator again: a refusal mid-stage is where branches race a give-up.
        // Map steps' items too: a refusal mid-map is where items race a give-up.
        let fans_out = |w: &Workflow| !w.stages.is_empty() || !w.maps.is_empty();
        let staged = fans_out(&generated) || publish.as_ref().is_some_and(|p| fans_out(&p.workflow));
        let mut side = fastrand::Rng::with_seed(rng.get_seed() ^ STAGE_FAULT_SALT);
        if staged && side.u8(..4) > 0 {
            faults.branch_refusal = pick(&mut side, 0.05, 0.3);
        }
        // The outside party's rates come from a generator of their own too (`outside.rs`).
        let outside = OutsideRates::for_seed(rng.get_seed());
        // Half the seeds pause, from a side generator again.
        let mut side = fastrand::Rng::with_seed(rng.get_seed() ^ PAUSE_SALT);
        let pauses = side.bool().then(|| side.u64(..));
        let limit_seed = rng.get_seed() ^ LIMIT_SALT;
        let mut sweeps = fastrand::Rng::with_seed(rng.get_seed() ^ SWEEP_SALT);
        let swarm = Swarm {
            faults,
            orders,
            workflows: WORKFLOW_MIXES[rng.usize(..WORKFLOW_MIXES.len())],
            generated,
            publish,
            queue_agent: rng.bool(),
            resends: rng.usize(0..=2),
            conflicts: rng.usize(0..=1),
            bad_inputs: rng.usize(0..=3),
            arrival_window_ms: rng.u64(0..=3_000),
            fault_window_ms,
            submission_concurrency: rng.usize(1..=2),
            scheduler_concurrency: rng.usize(1..=3),
            agent_concurrency: rng.usize(1..=3),
            batch_size: rng.usize(1..=10),
            page_size: [1, 2, 100][rng.usize(..3)],
            max_page_size: 0,
            sweep_run_ms: if sweeps.u8(..4) == 0 { sweeps.u64(100..=1_000) } else { 60_000 },
            operator_actions: if rng.bool() { rng.usize(1..=6) } else { 0 },
            app_cancels: if rng.u8(..4) == 0 { rng.usize(1..=2) } else { 0 },
            outside,
            pauses,
            limits: BTreeMap::new(),
            scheduler_batches: BatchOrder::Concurrent,
        };
        let swarm =
            Swarm { max_page_size: swarm.page_size * if sweeps.u8(..4) == 0 { 4 } else { 1 }, ..swarm };
        (swarm, limit_seed)
    }

    /// One seed in three gives some of the agents its orders use flow-control limits
    /// (`max_in_flight` 1 to 4, `max_per_second` 1 to 5, or both; half of them spread over
    /// gates of one or two places; one a parallel stage's branches call only in a third of
    /// those, drawn last), and most of those seeds a
    /// remote that answers limited agents "too many requests" now and then. Drawn from a
    /// side generator: every other seed runs as it did before gates existed.
    fn with_limits(&mut self, side: &mut fastrand::Rng) {
        if side.bool() {
            return;
        }
        let mut all = crate::deployment::workflows_before_publish(&self.generated).all().to_vec();
        all.extend(self.publish.as_ref().map(|p| p.workflow.clone()));
        let branches: BTreeSet<&str> = all
            .iter()
            .flat_map(|w| w.stages.iter().flat_map(move |st| st.branches().filter_map(|i| w.step(i))))
            .map(|s| s.agent.as_str())
            .collect();
        let used: BTreeSet<&str> = all
            .iter()
            .filter(|w| self.workflows.contains(&w.name.as_str()))
            .flat_map(|w| w.steps.iter().filter(|s| !s.is_timer()).map(|s| s.agent.as_str()))
            .filter(|a| !branches.contains(a) && *a != MAP_AGENT)
            .collect();
        let candidates: Vec<&str> = used.into_iter().collect();
        if candidates.is_empty() {
            return;
        }
        let first = side.usize(..candidates.len());
        for (i, agent) in candidates.iter().enumerate() {
            if i != first && side.bool() {
                continue;
            }
            let (max_in_flight, max_per_second) = match side.u8(..3) {
                0 => (Some(side.u32(1..=4)), None),
                1 => (None, Some(side.u32(1..=5))),
                _ => (Some(side.u32(1..=4)), Some(side.u32(1..=5))),
            };
            self.limits.insert(
                (*agent).to_owned(),
                Limits { max_in_flight, max_per_second, places_per_gate: None, per_key: None },
            );
        }
        if side.u8(..4) > 0 {
            self.faults.remote_busy = pick(side, 0.05, 0.3);
            self.faults.busy_retry_max_ms = side.u64(100..=4_000);
            // Throttle budgets of a pause or a few on half the steps of limited agents in
            // the seed's own workflows, so some steps spend theirs and give up.
            let limited: BTreeSet<String> = self.limits.keys().cloned().collect();
            let own =
                std::iter::once(&mut self.generated).chain(self.publish.as_mut().map(|p| &mut p.workflow));
            for step in own.flat_map(|w| w.steps.iter_mut()) {
                if limited.contains(&step.agent) {
                    step.max_throttled_ms = Some(side.u64(1_000..=3_000));
                }
            }
        }
        // A place is a lease: it covers a request held up on its way for as long as the
        // reply grace, not one held up for seconds by a stalled world, which reaches the
        // service after its place lapsed (as the cancel's hold, `ignores_undone` above).
        self.faults.time_jump = 0.0;
        // Three in four of them a burst: many orders at once, on schedulers that run side
        // by side, so that claims meet at one gate and race for its last place.
        let burst = side.u8(..4) > 0;
        if burst {
            self.orders = self.orders.max(side.usize(6..=12));
            self.arrival_window_ms = side.u64(0..=50);
            self.submission_concurrency = 2;
            self.scheduler_concurrency = 3;
            self.batch_size = side.usize(1..=2);
            // With more agents than places: the agents' own concurrency must not be what
            // keeps the calls within the limit.
            self.agent_concurrency = side.usize(4..=6);
            // And few places: two claims that race for the last one are over the limit.
            for l in self.limits.values_mut() {
                l.max_in_flight = l.max_in_flight.map(|_| side.u32(1..=2));
                l.max_per_second = l.max_per_second.map(|_| side.u32(1..=2));
            }
            // And a slower service: a place taken twice shows as two calls at once.
            self.faults.remote.latency_max_ms = self.faults.remote.latency_max_ms.max(side.u64(300..=900));
        }
        // Half of them spread each agent's places over gates of one or two
        // (`gate::Limits::gates`), as 1,000 places spread over gates of 10: a call, its
        // reply and its task's ticket must all find the one gate of its order.
        if side.bool() {
            let per = side.u32(1..=2);
            for l in self.limits.values_mut() {
                l.places_per_gate = Some(per);
            }
        }
        // Some a per-key limit of one or two, on the orders' customer (one in the
        // workload) or workflow (one to four): a key gate in front of the agent's. Drawn
        // last, so that every draw above, and the seeds that rely on it, are as before.
        for l in self.limits.values_mut() {
            if side.bool() {
                let key = if side.bool() { OrderKey::CustomerId } else { OrderKey::Workflow };
                l.per_key = Some(PerKey { key, limit: side.u32(1..=2) });
            }
        }
        // And one in three of them a limited agent in a parallel stage: one that no stage
        // calls from two branches (the definition file allows one limited branch a stage),
        // so the stage's claim takes its place. Drawn after everything above again.
        let once: Vec<String> = branch_agents_once_per_stage(&all);
        if !once.is_empty() && side.u8(..3) == 0 {
            let agent = once[side.usize(..once.len())].clone();
            let (max_in_flight, max_per_second) = match side.u8(..3) {
                0 => (Some(side.u32(1..=2)), None),
                1 => (None, Some(side.u32(1..=2))),
                _ => (Some(side.u32(1..=2)), Some(side.u32(1..=2))),
            };
            let places_per_gate = self.limits.values().next().and_then(|l| l.places_per_gate);
            // Half of them a per-key limit too: a key place taken for a branch's attempt.
            let per_key = side.bool().then(|| PerKey { key: OrderKey::CustomerId, limit: side.u32(1..=2) });
            self.limits.insert(agent, Limits { max_in_flight, max_per_second, places_per_gate, per_key });
        }
        // And half the bursts in batches of up to ten: a batch's claims meet at a gate in
        // one process and land together (`handlers::gate`, `GateLine::commit`). Drawn
        // last again.
        if burst && side.bool() {
            self.batch_size = side.usize(4..=10);
        }
        // And half of those with a map a limited map agent: its items (and its list step)
        // take places in the gate one at a time (`MapStep::gated`), in line with the
        // others' calls. Drawn last again.
        let own = || std::iter::once(&self.generated).chain(self.publish.as_ref().map(|p| &p.workflow));
        if own().any(|w| !w.maps.is_empty()) && side.bool() {
            let (max_in_flight, max_per_second) = match side.u8(..3) {
                0 => (Some(side.u32(1..=2)), None),
                1 => (None, Some(side.u32(1..=3))),
                _ => (Some(side.u32(1..=2)), Some(side.u32(1..=3))),
            };
            let places_per_gate = self.limits.values().next().and_then(|l| l.places_per_gate);
            let limits = Limits { max_in_flight, max_per_second, places_per_gate, per_key: None };
            self.limits.insert(MAP_AGENT.to_owned(), limits);
            let own =
                std::iter::once(&mut self.generated).chain(self.publish.as_mut().map(|p| &mut p.workflow));
            for w in own {
                w.gate_maps(|agent| agent == MAP_AGENT);
            }
        }
    }
}

/// The agents that some parallel stage of `all` calls, and none from two of its branches.
fn branch_agents_once_per_stage(all: &[Workflow]) -> Vec<String> {
    let stages = || all.iter().flat_map(|w| w.stages.iter().map(move |st| (w, st)));
    let agents_of = |w: &Workflow, st: &Stage| -> Vec<String> {
        st.branches().filter_map(|i| w.step(i)).map(|s| s.agent.clone()).collect()
    };
    let called: BTreeSet<String> = stages().flat_map(|(w, st)| agents_of(w, st)).collect();
    called
        .into_iter()
        .filter(|a| stages().all(|(w, st)| agents_of(w, st).iter().filter(|b| *b == a).count() <= 1))
        .collect()
}

/// Salts the pause choices' generator away from the others.
const PAUSE_SALT: u64 = 0x9a05_e5ed;
/// And the branch refusals'.
const STAGE_FAULT_SALT: u64 = 0x5eed_b4a2;
/// And the agents' limits'. Any salt would do; the seeds it gives limits lose their old
/// histories, and this one leaves the seeds of `sim/tests` that alone take some rare rows
/// ((Waiting, Cancel)) or catch some planted bugs (`ResubmitAfterUndo`) still doing so.
const LIMIT_SALT: u64 = 303;
/// The supervisor's budget is drawn from a side generator too.
const SWEEP_SALT: u64 = 0x5eed_5a1e;
/// And the scheduler's batch order.
const BATCH_ORDER_SALT: u64 = 0x5eed_0bd3;

impl Swarm {
    /// The callback steps of the seed's generated workflows, as `name(timeout/heartbeat)`.
    pub fn callback_steps(&self) -> String {
        let workflows = std::iter::once(&self.generated).chain(self.publish.as_ref().map(|p| &p.workflow));
        let steps: Vec<String> = workflows
            .flat_map(|w| w.steps.iter())
            .filter_map(|s| {
                let cb = s.callback?;
                Some(format!("{}({}/{:?})", s.name, cb.timeout_ms, cb.heartbeat_ms))
            })
            .collect();
        if steps.is_empty() { "none".to_owned() } else { steps.join(" ") }
    }
}

impl Swarm {
    /// The parallel stages of the seed's generated workflows, as `name[branch(kind/budget/timeout) ...]`.
    pub fn stages(&self) -> String {
        let workflows = std::iter::once(&self.generated).chain(self.publish.as_ref().map(|p| &p.workflow));
        let stages: Vec<String> = workflows
            .flat_map(|w| w.stages.iter().map(move |st| (w, st)))
            .map(|(w, st)| {
                let branches: Vec<String> = st
                    .branches()
                    .filter_map(|i| w.step(i))
                    .map(|s| format!("{}({:?}/{:?}/{:?})", s.name, s.kind(), s.max_failures, s.timeout_ms))
                    .collect();
                format!("{}@{}[{}]", st.name, st.start, branches.join(" "))
            })
            .collect();
        if stages.is_empty() { "none".to_owned() } else { stages.join(" ") }
    }
}

impl Swarm {
    /// The agents' limits, as `agent(in flight/per second)`.
    pub fn limits_shown(&self) -> String {
        let shown: Vec<String> = self
            .limits
            .iter()
            .map(|(a, l)| format!("{a}({:?}/{:?})", l.max_in_flight, l.max_per_second))
            .collect();
        if shown.is_empty() { "none".to_owned() } else { shown.join(" ") }
    }
}

impl fmt::Display for Swarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} orders ({}), {} resent, {} conflicting, {} bad, {} operator actions, {} app cancels; concurrency {}/{}/{}, batch {}, page {} to {}, sweeps of {} ms; faults: {}; callback steps: {}; stages: {}; outside: {}; limits: {}",
            self.orders,
            self.workflows.join("/"),
            self.resends,
            self.conflicts,
            self.bad_inputs,
            self.operator_actions,
            self.app_cancels,
            self.submission_concurrency,
            self.scheduler_concurrency,
            self.agent_concurrency,
            self.batch_size,
            self.page_size,
            self.max_page_size,
            self.sweep_run_ms,
            self.faults.enabled().join(", "),
            self.callback_steps(),
            self.stages(),
            self.outside.enabled().join(", "),
            self.limits_shown()
        )
    }
}
