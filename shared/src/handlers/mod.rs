//! The four functions' logic, written once against the ports: the Lambda binaries
//! and `sasctl dev` run exactly this code.

pub mod agent;
pub mod batch;
pub mod callbacks;
pub mod coalesce;
mod gate;
pub mod operator;
pub mod scheduler;
pub mod settings;
pub mod submission;
pub mod supervisor;

use std::sync::Arc;

use crate::domain::{
    AgentRequest, Decision, Effect, OrderId, OrderStatus, Refusal, ReplyToRules, StatusUpdate, TaskRecord,
    Timestamp, Workflow, idempotency_key,
};
use crate::ports::{
    Alerts, Clock, Metric, Metrics, Outgoing, QueueError, QueueUrl, Queues, Random, StateStore, StoreError,
};

pub use agent::{Agent, AgentDeps, AgentOutcome, AgentSettings};
pub use batch::{BatchOrder, BatchReport, DeadLetters, REASON_ATTRIBUTE, run_batch, run_batch_in};
pub use callbacks::{Callbacks, Completed, complete};
pub use coalesce::{DEFAULT_MAX_HOLD, SendCoalescer};
pub use operator::{Operated, complete_as_operator, operate};
pub use scheduler::Scheduler;
pub use settings::Settings;
pub use submission::Submission;
pub use supervisor::{Supervisor, SweepBudget, SweepReport};
// Defined with the ports, so the adapters that build them need not import the handlers.
pub use crate::ports::{Inbound, Topology};

/// How a message's handling failed, by what should happen to the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Bad input: retrying cannot help. The message is kept with this reason.
    #[error("rejected: {0}")]
    Reject(String),
    /// Infrastructure trouble: leave the message for redelivery.
    #[error("retry: {0}")]
    Retry(String),
    /// The state store throttled: leave the message for redelivery, unless the handler
    /// can send it again with a delay of its own (`Scheduler`).
    #[error("throttled: {0}")]
    Throttled(String),
}

impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => HandlerError::Retry(e.to_string()),
            StoreError::Throttled(_) => HandlerError::Throttled(e.to_string()),
            StoreError::Corrupt { .. } | StoreError::NotIndexed(_) => HandlerError::Reject(e.to_string()),
        }
    }
}

impl From<QueueError> for HandlerError {
    fn from(e: QueueError) -> Self {
        HandlerError::Retry(e.to_string())
    }
}

/// The ports, built once per process and shared by every invocation.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn StateStore>,
    pub queues: Arc<dyn Queues>,
    pub alerts: Arc<dyn Alerts>,
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    pub metrics: Arc<dyn Metrics>,
}

/// What a conditional transition came to. Short-lived, so its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Transition {
    Applied { before: TaskRecord, decision: Decision },
    Refused(Refusal),
    NoSuchTask,
}

/// Read the task, decide on it, write the decision conditional on the revision read.
///
/// A decision's operator alert is raised *before* its write. An alert goes with giving
/// up, and giving up usually ends the task: a terminal record has no deadline, so after
/// the write nothing would ever bring the alert back if the process crashed or the topic
/// was down (the redelivered reply no longer passes the fence, and the supervisor no
/// longer finds the task). Raised first, a failure leaves the task untouched for
/// redelivery or the next supervisor run to decide again: alerts are at least once (a
/// lost race after the alert can repeat it) instead of at most once.
pub(crate) async fn transition(
    deps: &Deps,
    settings: &Settings,
    order_id: &OrderId,
    decide: impl Fn(&TaskRecord, &Workflow, Timestamp) -> Result<Decision, Refusal>,
) -> Result<Transition, HandlerError> {
    let mut tries = 0;
    loop {
        let Some(task) = deps.store.task(order_id).await? else {
            return Ok(Transition::NoSuchTask);
        };
        let workflow = settings.workflow(&task)?;
        tries += 1;
        let now = deps.clock.now();
        let decision = match decide(&task, workflow, now) {
            Ok(d) => d,
            Err(refusal) => return Ok(Transition::Refused(refusal)),
        };
        raise_alerts(deps, &decision).await?;
        match deps.store.replace(&decision.next, task.revision).await? {
            crate::ports::Written::Applied => {
                return Ok(Transition::Applied { before: task, decision });
            }
            crate::ports::Written::RevisionMoved => {
                deps.metrics.record(Metric::WriteConflict, 1);
                if tries >= crate::domain::conflict_retries(workflow) {
                    return Err(HandlerError::Retry(format!(
                        "task {order_id} kept changing under concurrent writers"
                    )));
                }
            }
        }
    }
}

/// Raises a decision's operator alerts, before its write (`transition` says why).
pub(crate) async fn raise_alerts(deps: &Deps, decision: &Decision) -> Result<(), HandlerError> {
    for effect in &decision.effects {
        if let Effect::Alert(alert) = effect {
            raise(deps, alert).await?;
        }
    }
    Ok(())
}

/// Carries out a landed decision's effects. A failure here is retried by redelivery;
/// if the message is lost instead, the deadline just written brings the supervisor.
pub(crate) async fn perform(
    deps: &Deps,
    settings: &Settings,
    decision: &Decision,
) -> Result<(), HandlerError> {
    let task = &decision.next;
    let now = deps.clock.now();
    let mut first_error = None;
    if let Err(e) = dispatch_all(deps, settings, task, &decision.effects).await {
        tracing::warn!(order_id = %task.order_id, error = %e, "dispatch failed after its write landed");
        first_error.get_or_insert(e);
    }
    for effect in &decision.effects {
        let result = match effect {
            // Sent above, together.
            Effect::Dispatch { .. } => Ok(()),
            Effect::Schedule { delay_ms } => schedule(deps, settings, &task.order_id, *delay_ms).await,
            Effect::Status { status, step, reason } => {
                send_status(
                    deps,
                    &settings.reply_to,
                    task.reply_to.as_deref(),
                    Some(&task.order_id),
                    *status,
                    step.clone(),
                    reason.clone(),
                    now,
                )
                .await
            }
            // Raised before the write, by `transition`.
            Effect::Alert(_) => Ok(()),
            Effect::HandBack(ticket) => {
                let let_through = gate::LetThrough::default();
                let turns = gate::Turns::default();
                gate::withdraw(deps, settings, &turns, &let_through, &ticket.agent, ticket.ticket).await;
                gate::wake(deps, settings, let_through.take()).await;
                Ok(())
            }
        };
        if let Err(e) = result {
            tracing::warn!(order_id = %task.order_id, error = %e, "effect failed after its write landed");
            first_error.get_or_insert(e);
        }
    }
    record_trigger_metrics(deps, decision, now);
    first_error.map_or(Ok(()), Err)
}

async fn raise(deps: &Deps, alert: &crate::domain::OperatorAlert) -> Result<(), HandlerError> {
    tracing::error!(order_id = %alert.order_id, step = alert.step, reason = %alert.reason, "operator alert");
    deps.alerts.raise(alert).await.map_err(|e| HandlerError::Retry(e.to_string()))
}

fn record_trigger_metrics(deps: &Deps, decision: &Decision, now: Timestamp) {
    use crate::domain::Trigger::*;
    let m = &deps.metrics;
    let task = &decision.next;
    if let crate::domain::Cause::Woke { late_ms, .. } = task.last_cause {
        m.record(Metric::TimerWoke, 1);
        m.record(Metric::TimerLatenessMs, late_ms);
    }
    // Only a callback's wait lapses from Waiting (a timer wakes instead).
    if let crate::domain::Cause::DeadlinePassed { state: crate::domain::ProcessState::Waiting, .. } =
        task.last_cause
    {
        m.record(Metric::CallbackTimedOut, 1);
    }
    match decision.trigger {
        Claimed => m.record(Metric::Claimed, 1),
        Started => m.record(Metric::CallbackStarted, 1),
        Heartbeat => m.record(Metric::CallbackHeartbeat, 1),
        Slept => m.record(Metric::TimerStarted, 1),
        // Counted above, with its lateness.
        Woke => {}
        Advanced | BranchDone | NextItem => m.record(Metric::StepSucceeded, 1),
        Finished => {
            m.record(Metric::StepSucceeded, 1);
            m.record(Metric::Processed, 1);
            m.record(Metric::OrderLatencyMs, now.millis_since(task.created_at));
        }
        Retry => m.record(Metric::Recovered, 1),
        Fail | ForwardOnly => m.record(Metric::Failed, 1),
        Undo => m.record(Metric::CompensationStarted, 1),
        UndoAdvanced => m.record(Metric::CompensationStep, 1),
        Undone => {
            if matches!(task.last_cause, crate::domain::Cause::Succeeded { .. }) {
                m.record(Metric::CompensationStep, 1);
            }
            m.record(Metric::Compensated, 1);
        }
        Resubmit | OperatorUndo | Cancel | Pause | Resume => m.record(Metric::OperatorAction, 1),
        Queued => m.record(Metric::CapacityQueued, 1),
        Throttled => m.record(Metric::Throttled, 1),
        CancelUndone => {
            m.record(Metric::OperatorAction, 1);
            m.record(Metric::Compensated, 1);
        }
    }
}

/// Sends the decision's agent requests. A lone step's claim has one; a parallel stage's
/// has one per branch, sent as one batch per queue (one request, however many branches,
/// and one send for the invocation's coalescer to count).
async fn dispatch_all(
    deps: &Deps,
    settings: &Settings,
    task: &TaskRecord,
    effects: &[Effect],
) -> Result<(), HandlerError> {
    let mut by_queue: Vec<(&QueueUrl, Vec<Outgoing>)> = Vec::new();
    for effect in effects {
        let Effect::Dispatch { step, action, callback, item } = effect else { continue };
        let (queue, request) = agent_request(settings, task, *step, *action, callback.clone(), *item)?;
        match by_queue.iter_mut().find(|(q, _)| *q == queue) {
            Some((_, messages)) => messages.push(Outgoing::new(request.to_body())),
            None => by_queue.push((queue, vec![Outgoing::new(request.to_body())])),
        }
    }
    for (queue, mut messages) in by_queue {
        match messages.len() {
            1 => deps.queues.send(queue, messages.remove(0)).await?,
            _ => deps.queues.send_batch(queue, messages).await?,
        }
    }
    Ok(())
}

/// The request for one step's action, and the queue it goes to.
fn agent_request<'s>(
    settings: &'s Settings,
    task: &TaskRecord,
    step: u32,
    action: crate::domain::Action,
    callback_token: Option<crate::domain::CallbackToken>,
    index: Option<u32>,
) -> Result<(&'s QueueUrl, AgentRequest), HandlerError> {
    let workflow = settings.workflow(task)?;
    let step_def = workflow
        .step(step)
        .ok_or_else(|| HandlerError::Reject(format!("workflow {} has no step {step}", workflow.name)))?;
    // A branch of a parallel stage, or an item of a map, carries its own attempt and
    // complete-by.
    let (attempt, complete_by) = task.dispatch_of(step, index);
    let (Some(lease), Some(complete_by)) = (task.locked_by(), complete_by) else {
        return Err(HandlerError::Reject(format!("task {} dispatched without a lease", task.order_id)));
    };
    let step_name = match action {
        crate::domain::Action::Do => step_def.name.clone(),
        crate::domain::Action::Undo => step_def.compensation.clone().unwrap_or_else(|| step_def.name.clone()),
    };
    let request = AgentRequest {
        order_id: task.order_id.clone(),
        workflow: task.workflow.clone(),
        workflow_version: task.workflow_version,
        step,
        step_name,
        agent: step_def.agent.clone(),
        action,
        attempt,
        lease,
        complete_by,
        idempotency_key: match index {
            Some(i) => {
                crate::domain::item_key(&task.order_id, step, i, action == crate::domain::Action::Undo)
            }
            None => idempotency_key(&task.order_id, step, action),
        },
        order: (*task.order).clone(),
        outputs: outputs_for(task, workflow, step, action),
        reply_queue: None,
        callback_token,
        index,
        item: None,
    };
    let request = match index {
        Some(i) => item_request(request, task, workflow, step, i)?,
        None => request,
    };
    // A queue agent's worker is outside: it gets the request on its own queue, with where
    // to reply; the agent function knows that already.
    let (queue, request) = match settings.topology.queue_agents.get(&step_def.agent) {
        Some(queue) => (
            queue,
            AgentRequest { reply_queue: Some(settings.topology.scheduler_queue.0.clone()), ..request },
        ),
        None => (&settings.topology.agent_queue, request),
    };
    Ok((queue, request))
}

/// An item's request: the item itself, and for its compensation the item's own output,
/// under its step's name (as a lone step's compensation gets its step's).
fn item_request(
    mut request: AgentRequest,
    task: &TaskRecord,
    workflow: &Workflow,
    step: u32,
    index: u32,
) -> Result<AgentRequest, HandlerError> {
    let item = task.map_item(workflow, step, index).map_err(|why| {
        HandlerError::Reject(format!("task {} item {index} of step {step}: {why}", task.order_id))
    })?;
    request.item = Some(item);
    if request.action == crate::domain::Action::Undo
        && let Some(output) = task.item_output(workflow, step, index)
        && let Some(s) = workflow.step(step)
    {
        request.outputs.insert(s.name.clone(), output);
    }
    Ok(request)
}

/// What a step is handed: the outputs of the steps before it, and for a compensation
/// also the output of the step it undoes (every output kept belongs to a step that
/// succeeded, and a compensation runs only after the steps above it were undone).
fn outputs_for(
    task: &TaskRecord,
    workflow: &Workflow,
    step: u32,
    action: crate::domain::Action,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    // A branch of a parallel stage gets what came before its stage; a compensation gets
    // every output up to the end of its step's stage (its siblings' too).
    let upto = match action {
        crate::domain::Action::Do => workflow.together(step).start,
        crate::domain::Action::Undo => workflow.after(step),
    };
    // A map's outputs are kept under its name, not its step's.
    let mut names: Vec<&str> = (0..upto)
        .filter_map(|i| {
            workflow.map_at(i).map(|m| m.name.as_str()).or(workflow.step(i).map(|s| s.name.as_str()))
        })
        .collect();
    if crate::mutations::forget_outputs() && action == crate::domain::Action::Do {
        names = names.split_off(names.len().saturating_sub(1));
    }
    names
        .into_iter()
        .filter_map(|name| task.outputs.get(name).map(|o| (name.to_owned(), o.to_value())))
        .collect()
}

pub(crate) async fn schedule(
    deps: &Deps,
    settings: &Settings,
    order_id: &OrderId,
    delay_ms: u64,
) -> Result<(), HandlerError> {
    let body =
        crate::domain::SchedulerMessage::Schedule { order_id: order_id.clone(), turn: None, throttled: 0 }
            .to_body();
    deps.queues.send(&settings.topology.scheduler_queue, Outgoing::delayed(body, delay_ms)).await?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_status(
    deps: &Deps,
    rules: &ReplyToRules,
    reply_to: Option<&str>,
    order_id: Option<&OrderId>,
    status: OrderStatus,
    step: Option<String>,
    reason: Option<String>,
    at: Timestamp,
) -> Result<(), HandlerError> {
    let Some(reply_to) = reply_to else {
        return Ok(());
    };
    // Checked again at every send, not only at submission: a record written before the
    // rules changed (a queue taken off the allow-list) must not keep its way in.
    if let Err(refusal) = rules.allows(reply_to) {
        tracing::warn!(order_id = order_id.map(|o| o.as_str()), %refusal, "status update not sent");
        return Ok(());
    }
    let update = StatusUpdate { order_id: order_id.cloned(), status, step, reason, at };
    // Status is a courtesy to the sender; the state table is the truth. A reply_to that
    // is wrong or down must not hold up (or poison-loop) the order itself.
    if let Err(e) = deps.queues.send(&QueueUrl(reply_to.to_owned()), Outgoing::new(update.to_body())).await {
        tracing::warn!(order_id = order_id.map(|o| o.as_str()), error = %e, "status update not delivered");
    }
    Ok(())
}
