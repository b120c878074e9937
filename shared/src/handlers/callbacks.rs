//! The outside's word on a callback step: a completion, failure or heartbeat presented
//! with the step's token, from the callback queue (run by the scheduler function, which
//! hands it messages of that queue alone) or from `sasctl tasks complete|fail|heartbeat`.
//! Either way it is one conditional write through the domain (`TaskRecord::complete`),
//! then its effects, as every move of the pipeline.

use tracing::Instrument;

use super::{Deps, HandlerError, Settings, Transition, perform, transition};
use crate::domain::{
    CallbackMessage, CallbackToken, Completion, CompletionRefused, ProcessState, Refusal, TaskRecord,
    Timestamp, Trigger,
};
use crate::ports::Metric;

/// What a completion came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completed {
    /// It landed: the task was `before` and moved by `trigger`.
    Applied { before: ProcessState, trigger: Trigger, task: Box<TaskRecord> },
    /// A heartbeat acknowledged without a write: it came within the floor of the last one
    /// written, which stands (`Awaiting::due` allows for it). A success to its sender.
    Noted { written_at: Timestamp, due: Timestamp },
    /// It changed nothing, for this reason (told to whoever sent it).
    Refused(CompletionRefused),
}

/// Applies `completion` of the step `token` names. `Err` only for trouble worth trying
/// again (the store unavailable, or a record that does not fit its workflow).
pub async fn complete(
    deps: &Deps,
    settings: &Settings,
    token: &str,
    completion: &Completion,
) -> Result<Completed, HandlerError> {
    let (token, claims) = match CallbackToken::parse(token) {
        Ok(parsed) => parsed,
        Err(e) => return Ok(refused(deps, CompletionRefused::Malformed(e))),
    };
    let span = tracing::info_span!("callback", order_id = %claims.order_id, step = claims.step, attempt = claims.attempt, %token);
    async {
        let policy = settings.policy;
        let outcome = transition(deps, settings, &claims.order_id, |task, wf, now| {
            task.complete(&token, &claims, completion, now, wf, &policy)
        })
        .await?;
        match outcome {
            Transition::Applied { before, decision } => {
                tracing::info!(outcome = completion.as_str(), trigger = ?decision.trigger, state = ?decision.next.state(), "callback applied");
                if decision.trigger != Trigger::Heartbeat {
                    deps.metrics.record(Metric::CallbackApplied, 1);
                }
                // The write landed: the completion is applied whatever its effects do. Were
                // the message redelivered for a failed Schedule or status, it would find its
                // step ended and be kept as refused; the deadline just written brings the
                // supervisor instead, as for an operator's action.
                if let Err(e) = perform(deps, settings, &decision).await {
                    tracing::warn!(error = %e, "callback applied; its effects are left to the supervisor");
                }
                Ok(Completed::Applied {
                    before: before.state(),
                    trigger: decision.trigger,
                    task: Box::new(decision.next),
                })
            }
            Transition::Refused(Refusal::HeartbeatNoted { written_at, floor_ms, due }) => {
                tracing::debug!(%written_at, floor_ms, %due, "heartbeat noted, not written");
                deps.metrics.record(Metric::CallbackHeartbeatNoted, 1);
                Ok(Completed::Noted { written_at, due })
            }
            Transition::Refused(Refusal::Completion(why)) => Ok(refused(deps, why)),
            Transition::Refused(other) => Err(HandlerError::Reject(other.to_string())),
            Transition::NoSuchTask => Ok(refused(deps, CompletionRefused::NoSuchOrder(claims.order_id.clone()))),
        }
    }
    .instrument(span)
    .await
}

fn refused(deps: &Deps, why: CompletionRefused) -> Completed {
    tracing::warn!(%why, "callback refused");
    deps.metrics.record(Metric::CallbackRefused, 1);
    Completed::Refused(why)
}

/// The callback queue's handler: a refused or malformed message is kept in that queue's
/// dead-letter queue with its reason.
#[derive(Clone)]
pub struct Callbacks {
    pub deps: Deps,
    pub settings: Settings,
}

impl Callbacks {
    pub fn new(deps: Deps, settings: Settings) -> Callbacks {
        Callbacks { deps, settings }
    }

    pub async fn handle(&self, message: crate::ports::Inbound) -> Result<(), HandlerError> {
        let parsed = CallbackMessage::parse(&message.body).map_err(|e| {
            self.deps.metrics.record(Metric::CallbackRefused, 1);
            HandlerError::Reject(format!("not a callback message: {e}"))
        })?;
        let completion = parsed.completion().map_err(|e| {
            self.deps.metrics.record(Metric::CallbackRefused, 1);
            HandlerError::Reject(format!("not a callback message: {e}"))
        })?;
        match complete(&self.deps, &self.settings, &parsed.token, &completion).await? {
            Completed::Applied { .. } | Completed::Noted { .. } => Ok(()),
            Completed::Refused(why) => Err(HandlerError::Reject(format!("callback refused: {why}"))),
        }
    }
}
