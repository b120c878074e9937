//! scheduler: claims tasks and dispatches their steps; applies agents' replies only
//! through the fence.

use tracing::Instrument;

use super::{
    Deps, HandlerError, Inbound, Settings, Transition, gate, perform, raise_alerts, schedule, transition,
};
use crate::domain::retry::{MAX_THROTTLED_RESENDS, THROTTLED_SCHEDULE};
use crate::domain::{
    AgentReply, Done, Freed, Next, OrderId, Refusal, SchedulerMessage, Scheduling, Seen, Trigger, Turn,
    freed_by,
};
use crate::ports::{Metric, Outgoing, Written};

/// The most turns one message's invocation claims itself; the rest are woken through the
/// queue. A reply frees one place; a look after a pause can let a gate's worth through,
/// and claiming those one after another would hold the message's batch.
const MAX_HAND_OVERS: usize = 8;

pub struct Scheduler {
    pub deps: Deps,
    /// Shared by its clones: every container of a deployment runs the same settings.
    pub settings: std::sync::Arc<Settings>,
    /// This process's turns at the limited agents' gates.
    turns: std::sync::Arc<gate::Turns>,
}

/// A clone is another container's scheduler (the simulation runs its invocations so): it
/// takes its own turns at the gates, and races the others' writes as containers do.
impl Clone for Scheduler {
    fn clone(&self) -> Scheduler {
        Scheduler { deps: self.deps.clone(), settings: self.settings.clone(), turns: Default::default() }
    }
}

impl Scheduler {
    pub fn new(deps: Deps, settings: Settings) -> Scheduler {
        Scheduler { deps, settings: std::sync::Arc::new(settings), turns: Default::default() }
    }

    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        let let_through = gate::LetThrough::default();
        let result =
            match SchedulerMessage::parse(&message.body).map_err(|e| HandlerError::Reject(e.to_string()))? {
                SchedulerMessage::Schedule { order_id, turn, throttled } => {
                    match self.schedule(&order_id, turn.clone(), &let_through).await {
                        Err(HandlerError::Throttled(why)) if throttled < MAX_THROTTLED_RESENDS => {
                            self.send_again(order_id, turn, throttled, &why).await
                        }
                        other => other,
                    }
                }
                SchedulerMessage::Reply(reply) => self.reply(&reply, &let_through).await,
                SchedulerMessage::Gate { agent, at } => {
                    gate::look(&self.deps, &self.settings, &self.turns, &let_through, &agent, at).await
                }
            };
        // Whatever came of the message, the places it let through are taken.
        self.hand_over(&let_through).await;
        result
    }

    /// Claims the tasks of the turns a message let through, here and now: a place freed
    /// by a reply goes to the next in line with no queue hop between (the reply, then the
    /// next request: two hops, not three). Past `MAX_HAND_OVERS`, or where a claim fails,
    /// a turn is woken through the scheduler's queue as before, so none is lost.
    async fn hand_over(&self, let_through: &gate::LetThrough) {
        let (deps, settings) = (&self.deps, &self.settings);
        let mut left = MAX_HAND_OVERS;
        loop {
            let turns = let_through.take();
            if turns.is_empty() {
                return;
            }
            for turn in turns {
                if left == 0 {
                    gate::wake(deps, settings, vec![turn]).await;
                    continue;
                }
                left -= 1;
                let order_id = match deps.store.waiter(&turn.agent, turn.ticket).await {
                    // Not noted yet: the task looks at the gate again after noting itself.
                    Ok(None) => continue,
                    Ok(Some(order_id)) => order_id,
                    Err(e) => {
                        tracing::warn!(agent = %turn.agent, ticket = turn.ticket, error = %e, "waiter note unread; the turn is woken through the queue");
                        gate::wake(deps, settings, vec![turn]).await;
                        continue;
                    }
                };
                deps.metrics.record(Metric::HandedOver, 1);
                let woken = match self.schedule(&order_id, Some(turn.clone()), let_through).await {
                    Ok(()) => continue,
                    Err(HandlerError::Throttled(why)) => self.send_again(order_id, Some(turn), 0, &why).await,
                    // The Schedule message gets what a failed claim gets: redelivery, or
                    // the DLQ with its reason.
                    Err(e) => {
                        tracing::info!(order_id = %order_id, error = %e, "hand-over not claimed here; woken through the queue");
                        gate::send_turn(deps, settings, order_id, turn).await
                    }
                };
                if let Err(e) = woken {
                    tracing::warn!(error = %e, "could not wake the next in line");
                }
            }
        }
    }

    /// Sends a Schedule whose handling the state store throttled (`throttled` times
    /// before) again, after a backoff: redelivery would come sooner and count toward the
    /// queue's receives, so a burst that throttles a hot item would end in the DLQ.
    async fn send_again(
        &self,
        order_id: OrderId,
        turn: Option<Turn>,
        throttled: u32,
        why: &str,
    ) -> Result<(), HandlerError> {
        let delay_ms = THROTTLED_SCHEDULE.delay_ms(throttled, self.deps.random.jitter());
        tracing::info!(%order_id, throttled, delay_ms, %why, "throttled; the Schedule is sent again");
        self.deps.metrics.record(Metric::ScheduleThrottled, 1);
        let body = SchedulerMessage::Schedule { order_id, turn, throttled: throttled + 1 }.to_body();
        self.deps
            .queues
            .send(&self.settings.topology.scheduler_queue, Outgoing::delayed(body, delay_ms))
            .await?;
        Ok(())
    }

    /// A Schedule: the domain's machine decides each step (`domain::Scheduling`); this
    /// performs them, in order, and reports what came of each.
    async fn schedule(
        &self,
        order_id: &OrderId,
        turn: Option<Turn>,
        let_through: &gate::LetThrough,
    ) -> Result<(), HandlerError> {
        let span = tracing::info_span!("scheduler", order_id = %order_id);
        async {
            let (deps, settings) = (&self.deps, &self.settings);
            let lease = deps.random.lease();
            // The gate's own wake: not a message anyone sent wrong, even for a task gone.
            let woken = turn.is_some();
            let mut run = Scheduling::new(order_id.clone(), lease, &settings.topology.limits, settings.policy)
                .woken_for(turn.map(|t| (t.agent, t.ticket)));
            let mut seen = Seen::Nothing;
            let done = loop {
                seen = match run.next(seen) {
                    Next::ReadTask => match deps.store.task(order_id).await? {
                        Some(task) => {
                            let wf = settings.workflow(&task)?;
                            Seen::Task(Some((task, wf, deps.clock.now())))
                        }
                        None => Seen::Task(None),
                    },
                    Next::DrawSecret => Seen::Secret(deps.random.callback_secret()),
                    Next::Arrive { place, ticket } => {
                        match gate::arrive(deps, settings, &self.turns, let_through, &place, ticket).await {
                            Ok(admission) => Seen::Admission(admission),
                            Err(HandlerError::Throttled(why)) => Seen::Throttled(why),
                            Err(e) => return Err(e),
                        }
                    }
                    Next::Release { agent, holder } => {
                        gate::release(deps, settings, &self.turns, let_through, &agent, &holder, None).await;
                        Seen::Nothing
                    }
                    Next::Withdraw { agent, ticket } => {
                        gate::withdraw(deps, settings, &self.turns, let_through, &agent, ticket).await;
                        Seen::Nothing
                    }
                    Next::Unclaim { agent, holder, ticket } => {
                        gate::unclaim(deps, settings, &self.turns, let_through, &agent, &holder, ticket).await;
                        Seen::Nothing
                    }
                    Next::Write { decision, revision } => {
                        raise_alerts(deps, &decision).await?;
                        let landed = match deps.store.replace(&decision.next, revision).await {
                            Ok(written) => {
                                if written != Written::Applied {
                                    deps.metrics.record(Metric::WriteConflict, 1);
                                }
                                written == Written::Applied
                            }
                            // No answer (throttled, or lost on its way back): the record says
                            // whether it landed. One that did goes on; a claim that did not
                            // gives its place back now, rather than hold it until it lapses,
                            // and the Schedule is sent again or redelivered as for any error.
                            Err(e) => match deps.store.task(order_id).await {
                                Ok(Some(stored)) if stored == decision.next => {
                                    tracing::info!(error = %e, "write unanswered, and landed");
                                    true
                                }
                                Ok(Some(_)) => {
                                    tracing::info!(error = %e, "write unanswered, and not landed");
                                    match run.next(Seen::Landed(false)) {
                                        Next::Release { agent, holder } => {
                                            gate::release(deps, settings, &self.turns, let_through, &agent, &holder, None)
                                                .await
                                        }
                                        Next::Unclaim { agent, holder, ticket } => {
                                            gate::unclaim(deps, settings, &self.turns, let_through, &agent, &holder, ticket)
                                                .await
                                        }
                                        _ => {}
                                    }
                                    return Err(e.into());
                                }
                                _ => return Err(e.into()),
                            },
                        };
                        Seen::Landed(landed)
                    }
                    Next::Perform { decision, waited_ms } => {
                        let next = &decision.next;
                        match (decision.trigger, waited_ms) {
                            (Trigger::Claimed, Some(waited)) => {
                                deps.metrics.record(Metric::CapacityWaitMs, waited);
                                tracing::info!(step = next.step, attempt = next.attempt, %lease, waited, "claimed with a place in the gate")
                            }
                            (Trigger::Claimed, None) => {
                                tracing::info!(step = next.step, attempt = next.attempt, %lease, "claimed")
                            }
                            (Trigger::Queued, _) => {
                                tracing::info!(queued = ?next.queued(), "waiting for a place in the gate")
                            }
                            (trigger, _) => {
                                tracing::info!(step = next.step, ?trigger, wake_at = ?next.wake_at(), "timer")
                            }
                        }
                        perform(deps, settings, &decision).await?;
                        Seen::Nothing
                    }
                    Next::NoteWaiter { agent, ticket, at } => {
                        let noted = deps.store.put_waiter(&agent, ticket, order_id, at).await?;
                        if noted == crate::ports::Noted::HeldByAnother {
                            // A gate hands each ticket out once; a note by another order
                            // means its numbering started again (say, its item deleted
                            // while the notes wait out their TTL). The wake goes to that
                            // order: this one waits for the supervisor to ask the gate again.
                            tracing::warn!(%agent, ticket, order = %order_id, "another order holds this ticket's waiter note; only the supervisor's re-ask wakes this one");
                        }
                        Seen::Nothing
                    }
                    Next::Rearm { delay_ms } => {
                        schedule(deps, settings, order_id, delay_ms).await?;
                        Seen::Nothing
                    }
                    Next::LookBehind { agent, ticket } => {
                        Seen::Behind(deps.store.gate(&agent).await?.is_some_and(|g| g.behind(ticket)))
                    }
                    Next::Done(done) => break done,
                };
            };
            match done {
                Done::Handled => Ok(()),
                // A duplicate of the Schedule that put the timer to sleep, or one read on a
                // clock behind the writer's: sent again for the timer's time if a message can
                // wait that long (`Next::Rearm`), else the supervisor's sweep wakes it.
                Done::Refused(refusal @ Refusal::Asleep { .. }) => {
                    tracing::info!(%refusal, "schedule before the timer's time");
                    deps.metrics.record(Metric::TimerEarly, 1);
                    Ok(())
                }
                // Held: the cancel's own delayed Schedule (or the supervisor) claims it later.
                // Paused: the resume sends a Schedule of its own.
                Done::Refused(refusal @ (Refusal::ClaimLost { .. } | Refusal::Held { .. } | Refusal::Paused)) => {
                    tracing::info!(%refusal, "schedule ignored");
                    deps.metrics.record(Metric::ClaimLost, 1);
                    Ok(())
                }
                Done::Ignored(refusal) => {
                    tracing::info!(%refusal, "schedule ignored; its ticket handed back");
                    Ok(())
                }
                Done::Refused(refusal) => Err(HandlerError::Reject(refusal.to_string())),
                // Its turn was handed on (`Next::Withdraw`) before the pass ended.
                Done::NoSuchTask if woken => {
                    tracing::info!("woken at the gate for a task that is gone: its turn handed on");
                    Ok(())
                }
                Done::NoSuchTask => Err(HandlerError::Reject(format!("schedule for unknown order {order_id}"))),
                Done::KeptChanging(why) => Err(HandlerError::Retry(why)),
                Done::Throttled(why) => Err(HandlerError::Throttled(why)),
            }
        }
        .instrument(span)
        .await
    }

    async fn reply(&self, reply: &AgentReply, let_through: &gate::LetThrough) -> Result<(), HandlerError> {
        let span = tracing::info_span!("scheduler", order_id = %reply.order_id, step = reply.step, attempt = reply.attempt);
        async {
            let (deps, settings) = (&self.deps, &self.settings);
            // The place the reply frees, known once the task is read (its workflow says
            // which agent the step calls). It is given back, and the next in line
            // claimed and dispatched, while the reply's own write goes on: the call has
            // answered whatever that write meets, and a place's hand-over waits on as few
            // store calls as it can. The reply's own sends (its status, the next step's
            // Schedule) come after, as they may wait out the batch's send hold. The next in
            // line may be a sibling branch of the reply's own order: the two writes then
            // race on its record, and the conditional write settles it.
            let (freed_tx, freed_rx) = futures::channel::oneshot::channel::<Freed>();
            let freed_tx = std::sync::Mutex::new(Some(freed_tx));
            let take_tx = || freed_tx.lock().unwrap_or_else(|p| p.into_inner()).take();
            let applied = async {
                let result = transition(deps, settings, &reply.order_id, |task, wf, now| {
                    // The first decision that names a place sends it; a retried decide
                    // (another writer came first) finds the sender gone.
                    if let Some(freed) = freed_by(reply, wf, &task.order, &settings.topology.limits)
                        && let Some(tx) = take_tx()
                    {
                        let _ = tx.send(freed);
                    }
                    task.apply_reply(reply, now, wf, &settings.policy)
                })
                .await;
                // Never decided (no such task, an error): nothing freed, the wait ends.
                drop(take_tx());
                result
            };
            let handed_over = async {
                // No place freed (an agent without limits, or no task): nothing to hand over.
                let Ok(f) = freed_rx.await else { return };
                let pause_until = f.pause_ms.map(|ms| deps.clock.now().plus_ms(ms));
                gate::release(deps, settings, &self.turns, let_through, &f.gate, &f.holder, pause_until).await;
                if let Some((gate, holder)) = &f.key {
                    gate::release(deps, settings, &self.turns, let_through, gate, holder, None).await;
                }
                self.hand_over(let_through).await;
            };
            let (result, ()) = futures::join!(applied, handed_over);
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
