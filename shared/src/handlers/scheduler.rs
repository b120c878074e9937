//! scheduler: claims tasks and dispatches their steps; applies agents' replies only
//! through the fence.

use tracing::Instrument;

use super::{Deps, HandlerError, Inbound, Settings, Transition, perform, transition};
use crate::domain::{AgentReply, Mint, OrderId, Refusal, SchedulerMessage, Trigger};
use crate::ports::Metric;

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
            match transition(&self.deps, &self.settings, order_id, |task, wf, now| {
                let callback = wf.step(task.step).is_some_and(|s| s.is_callback());
                let secret = callback.then(|| *secret.get_or_init(|| self.deps.random.callback_secret()));
                task.schedule(Mint { lease, secret }, now, wf, &policy)
            })
            .await?
            {
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

    async fn reply(&self, reply: &AgentReply) -> Result<(), HandlerError> {
        let span = tracing::info_span!("scheduler", order_id = %reply.order_id, step = reply.step, attempt = reply.attempt);
        async {
            let policy = self.settings.policy;
            match transition(&self.deps, &self.settings, &reply.order_id, |task, wf, now| {
                task.apply_reply(reply, now, wf, &policy)
            })
            .await?
            {
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
