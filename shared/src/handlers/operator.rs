//! An operator's action on one task (`sasctl tasks`, an app's cancel message): the
//! domain's decision on a fresh read, one conditional write, then its effects (the
//! scheduler is told to go on, `reply_to` hears the new status), exactly as the
//! pipeline's own moves are made. A write that loses to a concurrent one is decided
//! again on what won, so acting twice, from two terminals or twice from one, changes
//! the task at most once.

use super::{Deps, HandlerError, Settings, Transition, perform, transition};
use crate::domain::{
    Act, Actor, Completion, Decision, OrderId, ProcessState, Refusal, TaskRecord, Timestamp, Trigger,
    Workflow,
};

/// What an operator's action came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operated {
    /// The action landed: the task was `before` and moved by `trigger`.
    Applied {
        before: ProcessState,
        trigger: Trigger,
        task: Box<TaskRecord>,
    },
    /// The action does not apply to the task as it is; nothing changed.
    Refused(Refusal),
    NoSuchTask,
}

/// Carries out `act` on the task `order_id` on behalf of `actor`.
pub async fn operate(
    deps: &Deps,
    settings: &Settings,
    order_id: &OrderId,
    act: Act,
    actor: Actor<'_>,
) -> Result<Operated, HandlerError> {
    let policy = settings.policy;
    operated(deps, settings, order_id, act.as_str(), actor, |task, wf, now| {
        task.act(act, actor, now, wf, &policy)
    })
    .await
}

/// Completes (or fails) the callback step named `step` that the task `order_id` waits on,
/// without its token, on behalf of `actor` (`TaskRecord::complete_as_operator`).
pub async fn complete_as_operator(
    deps: &Deps,
    settings: &Settings,
    order_id: &OrderId,
    step: &str,
    completion: &Completion,
    actor: Actor<'_>,
) -> Result<Operated, HandlerError> {
    let policy = settings.policy;
    let what = match completion {
        Completion::Success { .. } => "complete",
        Completion::Failure { .. } => "fail",
        Completion::Heartbeat => "heartbeat",
    };
    operated(deps, settings, order_id, what, actor, |task, wf, now| {
        let Some(index) = wf.step_named(step) else {
            let why = format!("workflow {} v{} has no step {step}", wf.name, wf.version);
            return Err(Refusal::NotAllowed { act: what, state: task.state().as_str(), why });
        };
        task.complete_as_operator(index, completion, actor, now, wf, &policy)
    })
    .await
}

/// An operator's decision on a fresh read (`decide`), its write, then its effects.
async fn operated(
    deps: &Deps,
    settings: &Settings,
    order_id: &OrderId,
    what: &str,
    actor: Actor<'_>,
    decide: impl Fn(&TaskRecord, &Workflow, Timestamp) -> Result<Decision, Refusal>,
) -> Result<Operated, HandlerError> {
    match transition(deps, settings, order_id, decide).await? {
        Transition::Applied { before, decision } => {
            tracing::info!(
                order_id = %order_id, act = what, by = actor.by, why = actor.why,
                from = ?before.state(), trigger = ?decision.trigger, "operator action"
            );
            // The write landed: the action is done whatever its effects do. A Schedule that
            // fails to go out is made up for by the deadline just written (the supervisor
            // acts on it), and a status is a courtesy.
            if let Err(e) = perform(deps, settings, &decision).await {
                tracing::warn!(order_id = %order_id, error = %e, "operator action landed; its effects are left to the supervisor");
            }
            Ok(Operated::Applied {
                before: before.state(),
                trigger: decision.trigger,
                task: Box::new(decision.next),
            })
        }
        Transition::Refused(refusal) => Ok(Operated::Refused(refusal)),
        Transition::NoSuchTask => Ok(Operated::NoSuchTask),
    }
}
