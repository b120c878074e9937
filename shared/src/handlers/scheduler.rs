//! scheduler: claims tasks and dispatches their steps; applies agents' replies only
//! through the fence.

use tracing::Instrument;

use super::{Deps, HandlerError, Inbound, Settings, Transition, gate, perform, transition, transition_from};
use crate::domain::gate::{Admission, MAX_PAUSE_MS};
use crate::domain::{
    AgentReply, Decision, Mint, OrderId, Refusal, ReplyOutcome, SchedulerMessage, TaskRecord, Timestamp, Trigger,
    Workflow,
};
use crate::ports::{Metric, Written};

/// What a Schedule's pass at the gate came to.
enum Gated {
    /// Handled: claimed with a place, waiting with a ticket, or ignored.
    Done,
    /// No gate for this move: decide it the usual way, from this read if one was made.
    NoGate(Option<TaskRecord>),
}

/// Rounds of a gated claim: each lost race on the task (a duplicate Schedule, a supervisor)
/// reads it again. Anything left is redelivered.
const GATED_ROUNDS: usize = 4;

#[derive(Clone)]
pub struct Scheduler {
    pub deps: Deps,
    pub settings: Settings,
}

impl Scheduler {
    pub fn new(deps: Deps, settings: Settings) -> Scheduler {
        Scheduler { deps, settings }
    }

    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        match SchedulerMessage::parse(&message.body).map_err(|e| HandlerError::Reject(e.to_string()))? {
            SchedulerMessage::Schedule { order_id } => self.schedule(&order_id).await,
            SchedulerMessage::Reply(reply) => self.reply(&reply).await,
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
            let read = match self.through_gate(order_id, &decide).await? {
                Gated::Done => return Ok(()),
                Gated::NoGate(read) => read,
            };
            // Past the gate the task needed none; if it moves meanwhile (a concurrent
            // writer wakes its timer, say) and its write is decided again, that decision
            // must not be a claim that needs a place: the claim is left to the Schedule of
            // whoever moved it (or to the supervisor at its deadline), which goes through
            // the gate (sim seed 666).
            let ungated = |task: &TaskRecord, wf: &Workflow, now| {
                let decision = decide(task, wf, now)?;
                if gate::place_of(&self.settings, wf, &decision).is_some() {
                    return Err(Refusal::ClaimLost { state: task.state, locked: task.locked_by.is_some() });
                }
                Ok(decision)
            };
            match transition_from(&self.deps, &self.settings, order_id, read, ungated).await? {
                Transition::Applied { decision, .. } => {
                    match decision.trigger {
                        Trigger::Claimed => {
                            tracing::info!(step = decision.next.step, attempt = decision.next.attempt, %lease, "claimed")
                        }
                        trigger => {
                            tracing::info!(step = decision.next.step, ?trigger, wake_at = ?decision.next.wake_at, "timer")
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
        for _ in 0..GATED_ROUNDS {
            let Some(task) = deps.store.task(order_id).await? else {
                return Ok(Gated::NoGate(None));
            };
            let wf = settings.workflow(&task)?;
            let now = deps.clock.now();
            let Some((decision, place)) =
                decide(&task, wf, now).ok().and_then(|d| gate::place_of(settings, wf, &d).map(|p| (d, p)))
            else {
                return Ok(Gated::NoGate(Some(task)));
            };
            let ticket = task.queued.as_ref().filter(|q| q.agent == place.agent).map(|q| q.ticket);
            match gate::arrive(deps, settings, &place, ticket).await? {
                Admission::Admitted => match deps.store.replace(&decision.next, task.revision).await? {
                    Written::Applied => {
                        if let Some(q) = &task.queued {
                            deps.metrics.record(Metric::CapacityWaitMs, now.millis_since(q.since));
                        }
                        tracing::info!(step = decision.next.step, attempt = decision.next.attempt, %place.agent, "claimed with a place in the gate");
                        perform(deps, settings, &decision).await?;
                        return Ok(Gated::Done);
                    }
                    // Another writer came first: give the place back and decide again.
                    Written::RevisionMoved => {
                        deps.metrics.record(Metric::WriteConflict, 1);
                        gate::release(deps, settings, &place.agent, order_id, decision.next.attempt, None).await;
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
                gate::release(&self.deps, &self.settings, agent, &reply.order_id, reply.attempt, pause).await;
            }
            match result? {
                Transition::Applied { before, decision } => {
                    let latency = self.deps.clock.now().millis_since(before.updated_at);
                    self.deps.metrics.record(Metric::StepLatencyMs, latency);
                    tracing::info!(trigger = ?decision.trigger, state = ?decision.next.state, "reply applied");
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
