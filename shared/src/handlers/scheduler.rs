//! scheduler: claims tasks and dispatches their steps; applies agents' replies only
//! through the fence.

use tracing::Instrument;

use super::{Deps, HandlerError, Inbound, Settings, Transition, gate, perform, transition, transition_from};
use crate::domain::gate::{Admission, MAX_PAUSE_MS, call_holder};
use crate::domain::{
    AgentReply, Decision, Mint, OrderId, Refusal, ReplyOutcome, SchedulerMessage, TaskRecord, Timestamp,
    Trigger, Workflow,
};
use crate::ports::{Metric, Written};

/// What a Schedule's pass at the gate came to.
enum Gated {
    /// Handled: claimed with a place, waiting with a ticket, or ignored.
    Done,
    /// No gate for this move: decide it the usual way, from this read if one was made.
    NoGate(Option<Box<TaskRecord>>),
}

/// Rounds of a gated claim: each lost race on the task (a duplicate Schedule, a supervisor)
/// reads it again. Anything left is redelivered.
const GATED_ROUNDS: usize = 4;

pub struct Scheduler {
    pub deps: Deps,
    pub settings: Settings,
    /// This process's turns at the limited agents' gates.
    turns: std::sync::Arc<gate::Turns>,
}

/// A clone is another container's scheduler (the simulation runs its invocations so): it
/// takes its own turns at the gates, and races the others' writes as containers do.
impl Clone for Scheduler {
    fn clone(&self) -> Scheduler {
        Scheduler::new(self.deps.clone(), self.settings.clone())
    }
}

impl Scheduler {
    pub fn new(deps: Deps, settings: Settings) -> Scheduler {
        Scheduler { deps, settings, turns: Default::default() }
    }

    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        match SchedulerMessage::parse(&message.body).map_err(|e| HandlerError::Reject(e.to_string()))? {
            SchedulerMessage::Schedule { order_id } => self.schedule(&order_id).await,
            SchedulerMessage::Reply(reply) => self.reply(&reply).await,
            SchedulerMessage::Gate { agent, at } => {
                gate::look(&self.deps, &self.settings, &self.turns, &agent, at).await
            }
        }
    }

    async fn schedule(&self, order_id: &OrderId) -> Result<(), HandlerError> {
        let span = tracing::info_span!("scheduler", order_id = %order_id);
        async {
            let lease = self.deps.random.lease();
            // Drawn once, only for a callback step (the claim mints its token from it).
            let secret = std::sync::OnceLock::new();
            let policy = self.settings.policy;
            let decide = |task: &TaskRecord, wf: &Workflow, now| {
                let callback = wf.step(task.step).is_some_and(|s| s.is_callback());
                let secret = callback.then(|| *secret.get_or_init(|| self.deps.random.callback_secret()));
                task.schedule(Mint { lease, secret }, now, wf, &policy)
            };
            // A move that needs no gate, decided again after a lost race, may turn into a
            // claim that does (a timer woken by two at once, into a limited agent's step):
            // that one goes back through the gate, never around it.
            let needs_gate = std::sync::atomic::AtomicBool::new(false);
            let ungated = |task: &TaskRecord, wf: &Workflow, now| {
                let decision = decide(task, wf, now)?;
                if gate::place_of(&self.settings, wf, &decision).is_some() {
                    needs_gate.store(true, std::sync::atomic::Ordering::Relaxed);
                    return Err(Refusal::ClaimLost { state: task.state(), locked: false });
                }
                Ok(decision)
            };
            let mut rounds = 0;
            let transition = loop {
                let read = match self.through_gate(order_id, &decide).await? {
                    Gated::Done => return Ok(()),
                    Gated::NoGate(read) => read.map(|t| *t),
                };
                needs_gate.store(false, std::sync::atomic::Ordering::Relaxed);
                let transition = transition_from(&self.deps, &self.settings, order_id, read, &ungated).await?;
                rounds += 1;
                if !needs_gate.load(std::sync::atomic::Ordering::Relaxed) {
                    break transition;
                }
                if rounds >= GATED_ROUNDS {
                    return Err(HandlerError::Retry(format!("task {order_id} kept changing at its gate")));
                }
            };
            match transition {
                Transition::Applied { decision, .. } => {
                    match decision.trigger {
                        Trigger::Claimed => {
                            tracing::info!(step = decision.next.step, attempt = decision.next.attempt, %lease, "claimed")
                        }
                        trigger => {
                            tracing::info!(step = decision.next.step, ?trigger, wake_at = ?decision.next.wake_at(), "timer")
                        }
                    }
                    perform(&self.deps, &self.settings, &decision).await
                }
                // A duplicate of the Schedule that put the timer to sleep, or one from before:
                // the timer's own delayed Schedule (or the supervisor) wakes it on time.
                Transition::Refused(refusal @ Refusal::Asleep { .. }) => {
                    tracing::info!(%refusal, "schedule before the timer's time ignored");
                    self.deps.metrics.record(Metric::TimerEarly, 1);
                    Ok(())
                }
                // Held: the cancel's own delayed Schedule (or the supervisor) claims it later.
                // Paused: the resume sends a Schedule of its own.
                Transition::Refused(
                    refusal @ (Refusal::ClaimLost { .. } | Refusal::Held { .. } | Refusal::Paused),
                ) => {
                    tracing::info!(%refusal, "schedule ignored");
                    self.deps.metrics.record(Metric::ClaimLost, 1);
                    Ok(())
                }
                Transition::Refused(refusal) => Err(HandlerError::Reject(refusal.to_string())),
                Transition::NoSuchTask => {
                    Err(HandlerError::Reject(format!("schedule for unknown order {order_id}")))
                }
            }
        }
        .instrument(span)
        .await
    }

    /// A claim that dispatches an agent with limits, through its gate: the claim is
    /// written only once a place is held for its call; without room, the task waits with
    /// a ticket. A task whose next move needs no gate goes the usual way, from the read
    /// made here (so an agent without limits costs no more where others have them).
    async fn through_gate(
        &self,
        order_id: &OrderId,
        decide: &impl Fn(&TaskRecord, &Workflow, Timestamp) -> Result<Decision, Refusal>,
    ) -> Result<Gated, HandlerError> {
        if self.settings.topology.limits.is_empty() {
            return Ok(Gated::NoGate(None));
        }
        let (deps, settings) = (&self.deps, &self.settings);
        // A ticket taken here and not yet written to the task: a lost task write keeps it.
        let mut taken: Option<(String, u64)> = None;
        for _ in 0..GATED_ROUNDS {
            let Some(task) = deps.store.task(order_id).await? else {
                return Ok(Gated::NoGate(None));
            };
            let wf = settings.workflow(&task)?;
            let now = deps.clock.now();
            let decided = decide(&task, wf, now);
            let Some((decision, place)) =
                decided.as_ref().ok().and_then(|d| gate::place_of(settings, wf, d).map(|p| (d.clone(), p)))
            else {
                // Woken while paused: its turn is over, and the place kept for it goes to
                // the next in line rather than waiting to lapse.
                if let (Err(Refusal::Paused), Some(q)) = (&decided, &task.queued()) {
                    gate::release(deps, settings, &self.turns, &q.agent, &gate::reserved_for(q.ticket), None)
                        .await;
                }
                return Ok(Gated::NoGate(Some(Box::new(task))));
            };
            let ticket = task
                .queued()
                .as_ref()
                .filter(|q| q.agent == place.agent)
                .map(|q| q.ticket)
                .or_else(|| taken.as_ref().filter(|(a, _)| *a == place.agent).map(|(_, t)| *t));
            match gate::arrive(deps, settings, &self.turns, &place, ticket).await? {
                Admission::Admitted => match deps.store.replace(&decision.next, task.revision).await? {
                    Written::Applied => {
                        if let Some(q) = task.queued() {
                            deps.metrics.record(Metric::CapacityWaitMs, now.millis_since(q.since));
                        }
                        tracing::info!(step = decision.next.step, attempt = decision.next.attempt, %place.agent, "claimed with a place in the gate");
                        perform(deps, settings, &decision).await?;
                        return Ok(Gated::Done);
                    }
                    // Another writer came first: the place goes back to the ticket it came
                    // with (the task keeps its turn), or back to the gate, and decide again.
                    Written::RevisionMoved => {
                        deps.metrics.record(Metric::WriteConflict, 1);
                        match ticket {
                            Some(t) => {
                                gate::unclaim(deps, settings, &self.turns, &place.agent, &place.holder, t)
                                    .await
                            }
                            None => {
                                gate::release(deps, settings, &self.turns, &place.agent, &place.holder, None)
                                    .await
                            }
                        }
                    }
                },
                Admission::Queued { ticket } => {
                    let queued = match task.queue(&place.agent, ticket, now, &settings.policy) {
                        Ok(d) => d,
                        // Paused or moved on: the ticket's turn comes and its place lapses.
                        Err(refusal) => {
                            tracing::info!(%refusal, "schedule ignored");
                            return Ok(Gated::Done);
                        }
                    };
                    if deps.store.replace(&queued.next, task.revision).await? == Written::RevisionMoved {
                        deps.metrics.record(Metric::WriteConflict, 1);
                        taken = Some((place.agent.clone(), ticket));
                        continue;
                    }
                    perform(deps, settings, &queued).await?;
                    deps.store.put_waiter(&place.agent, ticket, order_id, now).await?;
                    tracing::info!(%place.agent, ticket, "waiting for a place in the gate");
                    // Let through while noting itself, nobody could wake it: look again.
                    let gate = deps.store.gate(&place.agent).await?;
                    if gate.is_some_and(|g| g.behind(ticket)) {
                        return Ok(Gated::Done);
                    }
                }
                Admission::StillWaiting { ticket } => {
                    // Noted again: a note lost to an error after the Queued write would
                    // leave nobody to wake this ticket but the supervisor.
                    deps.store.put_waiter(&place.agent, ticket, order_id, now).await?;
                    tracing::info!(%place.agent, ticket, "still waiting for a place in the gate");
                    return Ok(Gated::Done);
                }
            }
        }
        Err(HandlerError::Retry(format!("task {order_id} kept changing while it passed its gate")))
    }

    async fn reply(&self, reply: &AgentReply) -> Result<(), HandlerError> {
        let span = tracing::info_span!("scheduler", order_id = %reply.order_id, step = reply.step, attempt = reply.attempt);
        async {
            let policy = self.settings.policy;
            // The agent the reply's step calls, noted while deciding (the task's workflow says).
            let called = std::sync::Mutex::new(None::<String>);
            let result = transition(&self.deps, &self.settings, &reply.order_id, |task, wf, now| {
                if let Some(step) = wf.step(reply.step) {
                    *called.lock().unwrap_or_else(|p| p.into_inner()) = Some(step.agent.clone());
                }
                task.apply_reply(reply, now, wf, &policy)
            })
            .await;
            // Whatever the fence said, the call this reply answers is over: its place in a
            // limited agent's gate is free (a remote's Retry-After pauses the gate too).
            let called = called.into_inner().unwrap_or_else(|p| p.into_inner());
            if let Some(agent) = called.as_deref()
                && self.settings.topology.limits.contains_key(agent)
            {
                let pause = match reply.outcome {
                    ReplyOutcome::Throttled { retry_after_ms } => {
                        Some(self.deps.clock.now().plus_ms(retry_after_ms.clamp(1, MAX_PAUSE_MS)))
                    }
                    _ => None,
                };
                let holder = call_holder(&reply.order_id, reply.attempt, &reply.lease);
                gate::release(&self.deps, &self.settings, &self.turns, agent, &holder, pause).await;
            }
            match result? {
                Transition::Applied { before, decision } => {
                    let latency = self.deps.clock.now().millis_since(before.updated_at);
                    self.deps.metrics.record(Metric::StepLatencyMs, latency);
                    tracing::info!(trigger = ?decision.trigger, state = ?decision.next.state(), "reply applied");
                    perform(&self.deps, &self.settings, &decision).await
                }
                Transition::Refused(Refusal::StaleReply(why)) => {
                    tracing::info!(%why, "stale reply dropped");
                    self.deps.metrics.record(Metric::StaleReply, 1);
                    Ok(())
                }
                Transition::Refused(refusal) => Err(HandlerError::Reject(refusal.to_string())),
                Transition::NoSuchTask => {
                    Err(HandlerError::Reject(format!("reply for unknown order {}", reply.order_id)))
                }
            }
        }
        .instrument(span)
        .await
    }
}
