//! submission: validate an order, insert it with its task in one conditional write,
//! schedule it.

use tracing::Instrument;

use super::{Deps, HandlerError, Inbound, Settings, schedule, send_status};
use crate::domain::{
    Act, Actor, CancelRequest, Intake, MessageError, OrderRequest, OrderStatus, Origin, ProcessState,
    Refusal, Sender, TaskRecord, sniff_order_id, sniff_reply_to,
};
use crate::ports::{Inserted, Metric};

/// Deliveries of a cancel that finds no order before it is kept as bad input.
pub const CANCEL_WAITS_FOR_ORDER: u32 = 3;

#[derive(Clone)]
pub struct Submission {
    pub deps: Deps,
    pub settings: Settings,
}

impl Submission {
    pub fn new(deps: Deps, settings: Settings) -> Submission {
        Submission { deps, settings }
    }

    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        match Intake::parse(&message.body) {
            Ok(Intake::Order(request)) => self.submit(&message, request).await,
            Ok(Intake::Cancel(cancel)) => self.cancel(&message, cancel).await,
            Err(e) => self.reject(&message.body, e).await,
        }
    }

    /// An app's cancel: the same action as an operator's, named as the app's, and applied
    /// only when it comes from the sender that submitted the order.
    async fn cancel(&self, message: &Inbound, request: CancelRequest) -> Result<(), HandlerError> {
        let span = tracing::info_span!("cancel", order_id = %request.cancel);
        async {
            let by = request.actor_name();
            let sender = sender_of(message);
            let origin = Origin::App { sender: sender.as_ref() };
            let actor = Actor { by: &by, why: &request.reason, seen: None, origin };
            match super::operate(&self.deps, &self.settings, &request.cancel, Act::Cancel, actor).await? {
                super::Operated::Applied { .. } => Ok(()),
                // Not the submitter's: kept with the reason for an operator to see, and
                // nothing goes to the order's reply_to, which belongs to its submitter.
                super::Operated::Refused(refusal @ Refusal::OtherSender { .. }) => {
                    tracing::warn!(%refusal, "cancel from another sender refused");
                    self.reject(&message.body, MessageError::Invalid(refusal.to_string())).await
                }
                super::Operated::Refused(refusal) => {
                    tracing::info!(%refusal, "cancel refused");
                    let task = self.deps.store.task(&request.cancel).await?;
                    let reply_to = task.as_ref().and_then(|t| t.reply_to.as_deref());
                    let now = self.deps.clock.now();
                    send_status(
                        &self.deps,
                        &self.settings.reply_to,
                        reply_to,
                        Some(&request.cancel),
                        OrderStatus::CancelRefused,
                        None,
                        Some(refusal.to_string()),
                        now,
                    )
                    .await
                }
                // The order and its cancel travel on one queue that does not keep their
                // order: a cancel read first waits for its order through redelivery,
                // and is kept with its reason when the order never comes.
                super::Operated::NoSuchTask if message.receive_count < CANCEL_WAITS_FOR_ORDER => Err(
                    HandlerError::Retry(format!("no order {} yet to cancel; trying again", request.cancel)),
                ),
                super::Operated::NoSuchTask => {
                    let reason = format!(
                        "no order {} to cancel (looked {} times)",
                        request.cancel, message.receive_count
                    );
                    self.reject(&message.body, MessageError::Invalid(reason)).await
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn submit(&self, message: &Inbound, request: OrderRequest) -> Result<(), HandlerError> {
        let now = self.deps.clock.now();
        let (order, reply_to) = match request.validate(&self.settings.workflows) {
            Ok(valid) => valid,
            Err(e) => return self.reject(&message.body, e).await,
        };
        if let Some(r) = &reply_to
            && let Err(refusal) = self.settings.reply_to.allows(r)
        {
            return self.reject(&message.body, MessageError::Invalid(refusal.to_string())).await;
        }
        let span = tracing::info_span!("submission", order_id = %order.order_id, step = 0, attempt = 0);
        async {
            // validate resolved the name and the version asked for, so this is found.
            let sender = sender_of(message);
            let mut task = TaskRecord::new(&order, reply_to.clone(), now, &self.settings.policy)
                .submitted_by(sender.clone());
            if let Some(wf) = self.settings.workflows.for_order(&order.workflow, order.workflow_version) {
                task = task.pinned_to(wf);
            }
            match self.deps.store.insert(&task).await? {
                Inserted::New => {
                    tracing::info!("order accepted");
                    self.deps.metrics.record(Metric::OrderAccepted, 1);
                    schedule(&self.deps, &self.settings, &order.order_id, 0).await?;
                    send_status(
                        &self.deps,
                        &self.settings.reply_to,
                        reply_to.as_deref(),
                        Some(&order.order_id),
                        OrderStatus::Received,
                        None,
                        None,
                        now,
                    )
                    .await
                }
                // The id is taken by another sender's order: never a duplicate delivery, even
                // with the same payload (order ids are one namespace for every writer).
                // Nor does it tell the message's reply_to: `rejected` under this id would
                // read, wherever status is shared, as the live order's own rejection.
                Inserted::Exists(existing) if let Err(refusal) = existing.check_sender(sender.as_ref()) => {
                    let reason = format!("{refusal}; this id is taken");
                    self.keep_untold(&message.body, MessageError::Invalid(reason))
                }
                Inserted::Exists(existing) if existing.order.payload() == order.payload() => {
                    tracing::info!("duplicate delivery of an accepted order");
                    self.deps.metrics.record(Metric::OrderDuplicate, 1);
                    // The first delivery may have crashed before scheduling: finish its work.
                    // A spare Schedule is harmless (its claim is simply lost), and so is a
                    // second `received`.
                    if existing.state() == ProcessState::Pending && existing.attempt == 0 {
                        schedule(&self.deps, &self.settings, &order.order_id, 0).await?;
                        let reply_to = reply_to.as_deref();
                        send_status(
                            &self.deps,
                            &self.settings.reply_to,
                            reply_to,
                            Some(&order.order_id),
                            OrderStatus::Received,
                            None,
                            None,
                            now,
                        )
                        .await?;
                    }
                    Ok(())
                }
                Inserted::Exists(_) => {
                    let reason = format!("order {} already exists with a different payload", order.order_id);
                    self.reject(&message.body, MessageError::Invalid(reason)).await
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Kept in the DLQ with its reason, and nobody told: for a message whose status would
    /// speak for an order that is not its sender's.
    fn keep_untold(&self, body: &str, error: MessageError) -> Result<(), HandlerError> {
        let reason = error.to_string();
        tracing::warn!(order_id = sniff_order_id(body).as_ref().map(|o| o.as_str()), %reason, "order rejected");
        self.deps.metrics.record(Metric::OrderRejected, 1);
        Err(HandlerError::Reject(reason))
    }

    async fn reject(&self, body: &str, error: MessageError) -> Result<(), HandlerError> {
        let order_id = sniff_order_id(body);
        let reason = error.to_string();
        tracing::warn!(order_id = order_id.as_ref().map(|o| o.as_str()), %reason, "order rejected");
        self.deps.metrics.record(Metric::OrderRejected, 1);
        let now = self.deps.clock.now();
        // `rejected` goes only where a status may go; a refused reply_to hears nothing,
        // and the order waits in the DLQ with its reason.
        send_status(
            &self.deps,
            &self.settings.reply_to,
            sniff_reply_to(body).as_deref(),
            order_id.as_ref(),
            OrderStatus::Rejected,
            None,
            Some(reason.clone()),
            now,
        )
        .await?;
        Err(HandlerError::Reject(reason))
    }
}

/// The sender of an orders-queue message, from its SQS `SenderId`.
fn sender_of(message: &Inbound) -> Option<Sender> {
    message.sender.as_deref().and_then(Sender::from_sender_id)
}
