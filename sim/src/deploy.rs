//! Puts up the simulated deployment (`deployment.rs`) for one seed: the embedded store and
//! queues, the fault layer over them, the send coalescer the functions send through, the
//! remote service, and each handler twice, on a container from before the seed's publish
//! and on one from after.

use std::collections::BTreeMap;
use std::sync::Arc;

use sas::adapters::embedded::queue_names::{self, AGENT_DLQ, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ, STATUS};
use sas::adapters::embedded::{
    CountingMetrics, EmbeddedQueues, EmbeddedStore, QueueSettings, RecordingAlerts,
};
use sas::adapters::system::FastRandom;
use sas::domain::Workflows;
use sas::domain::definitions::{AgentDef, AgentKind};
use sas::handlers::{
    Agent, AgentDeps, Callbacks, Deps, Scheduler, SendCoalescer, Settings, Submission, Supervisor,
    SweepBudget,
};
use sas::ports::{QueueUrl, Queues};

use crate::deployment::{
    CALLBACKS_DLQ, QUEUE_AGENT, SEND_MAX_HOLD_MS, WORK, WORKER, WORKER_DLQ, agent_settings, policy,
    workflows_before_publish,
};
use crate::faults::{SimAlerts, SimClock, SimQueues, SimStore, TrueClock};
use crate::remote::SimRemote;
use crate::swarm::Swarm;
use crate::world::Shared;

/// The seed's workflows once its new version is published: the deployment's
/// (`deployment::workflows_before_publish`) and the published one (`Swarm::publish`).
pub fn workflows(swarm: &Swarm) -> Workflows {
    let mut all = workflows_before_publish(&swarm.generated).all().to_vec();
    all.extend(swarm.publish.as_ref().map(|p| p.workflow.clone()));
    Workflows::new(all)
}

/// The definitions of the seed's agents that differ from the deployment's defaults: the
/// queue agent (`QUEUE_AGENT`, in the seeds that have one) and the agents with limits.
pub fn agent_defs(swarm: &Swarm) -> BTreeMap<String, AgentDef> {
    let mut defs: BTreeMap<String, AgentDef> = BTreeMap::new();
    if swarm.queue_agent {
        let def = defs.entry(QUEUE_AGENT.to_owned()).or_default();
        def.kind = AgentKind::Queue;
        def.queue_url = Some(WORKER.to_owned());
    }
    for (agent, limits) in &swarm.limits {
        let def = defs.entry(agent.clone()).or_default();
        def.max_in_flight = limits.max_in_flight;
        def.max_per_second = limits.max_per_second;
    }
    defs
}

/// The deployment, up. Each handler is held twice: on a container from before the seed's
/// publish (index 0) and after (1), since a rollout runs both side by side.
pub struct Deployed {
    pub store: Arc<EmbeddedStore>,
    pub queues: Arc<EmbeddedQueues>,
    /// The fault layer's queues behind a send coalescer, as the functions send.
    pub sends: Arc<dyn Queues>,
    pub alerts: Arc<RecordingAlerts>,
    pub metrics: Arc<CountingMetrics>,
    /// Shared by every invocation of a generation: a clone of these would be the same
    /// handler (their state, an agent's breakers, is shared through `Arc`s already).
    pub submission: [Arc<Submission>; 2],
    /// A clone is another container's scheduler, with turns of its own at the gates:
    /// each invocation runs on a clone.
    pub scheduler: [Scheduler; 2],
    /// The scheduler function's handler of the callback queue (and of `sasctl tasks
    /// complete`, which runs the same `complete`).
    pub callbacks: [Arc<Callbacks>; 2],
    pub supervisor: [Arc<Supervisor>; 2],
    /// One agent per unit of the agent's concurrency, as Lambda runs a container per
    /// concurrent invocation: each keeps its own circuit breakers.
    pub agents: Vec<[Arc<Agent>; 2]>,
}

/// Puts the deployment up. Draws the queues', the handlers' and each agent's generator
/// seeds from `rng`, in that order: a seed's history depends on it.
/// `workflows`: the seed's (`workflows`), as the deployment after its publish knows them.
pub fn deploy(
    swarm: &Swarm,
    workflows: &Workflows,
    shared: &Arc<Shared>,
    rng: &mut fastrand::Rng,
) -> Deployed {
    let store = Arc::new(EmbeddedStore::new());
    let queues = Arc::new(EmbeddedQueues::new(Arc::new(TrueClock { shared: shared.clone() }), rng.u64(..)));
    for q in [ORDERS_DLQ, SCHEDULER_DLQ, AGENT_DLQ, WORKER_DLQ, CALLBACKS_DLQ, STATUS] {
        queues.create(q, QueueSettings::default());
    }
    for work in WORK {
        queues.create(work.queue, work.settings());
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
    // The agents as a definition file would give them: the queue agent, and the limits,
    // reaching the scheduler (`Topology::limits`) and the agents (`Agent::with_agents`)
    // the way a deployment's definitions do.
    let defs = agent_defs(swarm);
    let mut topology = queue_names::topology().with_queue_agents(&defs);
    // With how many places each of their gates holds, which no definition file sets.
    topology.limits.clone_from(&swarm.limits);
    let settings = Settings::new(policy(), workflows.clone(), topology, queue_names::reply_to_rules());
    let before = settings.clone().with_workflows(workflows_before_publish(&swarm.generated));
    let generations = [&before, &settings];
    let remote = Arc::new(SimRemote { shared: shared.clone() });
    // Every agent container marks its limited agents' calls in the one table.
    let call_starts: Arc<dyn sas::ports::CallStarts> =
        Arc::new(SimStore { inner: store.clone(), shared: shared.clone() });
    let agents = (0..swarm.agent_concurrency)
        .map(|_| {
            let deps = AgentDeps {
                queues: sends.clone(),
                clock: clock.clone(),
                random: Arc::new(FastRandom::seeded(rng.u64(..))),
                metrics: metrics.clone(),
                remote: remote.clone(),
                scheduler_queue: QueueUrl(SCHEDULER.into()),
                call_starts: Some(call_starts.clone()),
            };
            generations.map(|g| {
                Arc::new(Agent::new(deps.clone(), agent_settings(), g.workflows.clone()).with_agents(&defs))
            })
        })
        .collect();
    let supervisor = generations.map(|g| {
        let mut supervisor = Supervisor::new(deps.clone(), g.clone());
        supervisor.budget = SweepBudget {
            page_size: swarm.page_size,
            max_page_size: swarm.max_page_size,
            run_ms: swarm.sweep_run_ms,
            margin_ms: swarm.sweep_run_ms / 10,
        };
        Arc::new(supervisor)
    });
    Deployed {
        submission: generations.map(|g| Arc::new(Submission::new(deps.clone(), g.clone()))),
        scheduler: generations.map(|g| Scheduler::new(deps.clone(), g.clone())),
        callbacks: generations.map(|g| Arc::new(Callbacks::new(deps.clone(), g.clone()))),
        supervisor,
        agents,
        store,
        queues,
        sends,
        alerts,
        metrics,
    }
}
