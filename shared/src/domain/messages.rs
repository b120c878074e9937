//! Every message that crosses a queue or topic, and the parsers that turn a body into
//! one. A parser never panics: bad input is a [`MessageError`] that names what is wrong.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::callback::{CallbackToken, Completion};
use super::ids::{LeaseToken, OrderId, Timestamp};
use super::json_shape::ItemsShape;
use super::workflow::{Action, Workflows};

/// SQS's own limit: a larger body cannot have come through a queue intact.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
pub const MAX_ITEMS: usize = 100;
pub const MAX_QUANTITY: u32 = 10_000;
pub const MAX_FIELD_LEN: usize = 64;
pub const MAX_REPLY_TO_LEN: usize = 2_048;
/// A reason made from input (serde echoes field names and values, a body holds up to
/// 256 KiB) is cut to this many bytes where it is made, so the DLQ attribute, the
/// `rejected` status and the log line all carry the same short text.
pub const MAX_REASON_BYTES: usize = 1_024;

/// `text` cut to at most [`MAX_REASON_BYTES`] bytes (on a character boundary), marked with
/// `…` when cut.
pub fn cut_reason(text: String) -> String {
    if text.len() <= MAX_REASON_BYTES {
        return text;
    }
    let mut end = MAX_REASON_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("body is {0} bytes; at most {MAX_BODY_BYTES} are accepted")]
    TooLarge(usize),
    #[error("not a valid message: {0}")]
    Malformed(String),
    #[error("invalid order: {0}")]
    Invalid(String),
}

impl MessageError {
    fn from_json(e: serde_json::Error) -> MessageError {
        MessageError::Malformed(cut_reason(e.to_string()))
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, MessageError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(MessageError::TooLarge(body.len()));
    }
    let parsed = serde_json::from_str(body).map_err(MessageError::from_json)?;
    // serde also reads a struct from a positional array of its fields; every message
    // in the contract is a JSON object, so that looser form is refused.
    if !body.trim_start().starts_with('{') {
        return Err(MessageError::Malformed("a message must be a JSON object, not an array".into()));
    }
    Ok(parsed)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineItem {
    pub sku: String,
    pub quantity: u32,
}

/// What an application sends to the `orders` queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    pub order_id: OrderId,
    pub customer_id: String,
    pub items: Vec<LineItem>,
    /// Workflow name; the deployment's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The workflow's version to run; the latest when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
    /// Queue URL that receives status updates for this order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// What an application sends to the `orders` queue to cancel an order it sent: the
/// task stops and what it did is undone, as `sasctl tasks cancel` does. The outcome goes
/// to the order's `reply_to`: `cancelled` (then `step_undone` and `compensated`), or
/// `cancel_refused` with the reason when it cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// The order to cancel.
    pub cancel: OrderId,
    /// Why, recorded in the task's timeline.
    pub reason: String,
    /// Who asked (a user or service name), recorded with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

impl CancelRequest {
    pub fn validate(self) -> Result<CancelRequest, MessageError> {
        check_text("reason", &self.reason)?;
        if let Some(by) = &self.requested_by {
            check_text("requested_by", by)?;
        }
        Ok(self)
    }

    /// Who the timeline names: the app, through the orders queue.
    pub fn actor_name(&self) -> String {
        match &self.requested_by {
            Some(by) => format!("app:{by}"),
            None => "app".to_owned(),
        }
    }
}

/// A message on the `orders` queue: an order, or a cancel of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intake {
    Order(OrderRequest),
    Cancel(CancelRequest),
}

impl Intake {
    /// Whether `body` is read as a cancel, valid or not: a JSON object with a `cancel`
    /// field (what `sasctl dlq redrive` holds back unless asked).
    pub fn is_cancel(body: &str) -> bool {
        body.len() <= MAX_BODY_BYTES
            && serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(body)
                .is_ok_and(|m| m.contains_key("cancel"))
    }

    /// A JSON object with a `cancel` field is a cancel; anything else is read as an order.
    pub fn parse(body: &str) -> Result<Intake, MessageError> {
        if Intake::is_cancel(body) {
            parse_json::<CancelRequest>(body).and_then(CancelRequest::validate).map(Intake::Cancel)
        } else {
            OrderRequest::parse(body).map(Intake::Order)
        }
    }
}

/// A validated order: what is stored and what agents see. Its JSON is the payload
/// that decides whether a second submission under the same id is a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: OrderId,
    pub customer_id: String,
    pub items: Vec<LineItem>,
    pub workflow: String,
    /// The version the order asked for, if it named one (else it runs the latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
}

impl Order {
    /// The order's value of a per-key limit's field (`gate::key_gate_of`): a number as
    /// its decimal text; a field the order lacks (a `workflow_version` not asked for) is
    /// the key `""`.
    pub fn key_value(&self, key: crate::domain::gate::OrderKey) -> String {
        use crate::domain::gate::OrderKey;
        match key {
            OrderKey::OrderId => self.order_id.as_str().to_owned(),
            OrderKey::CustomerId => self.customer_id.clone(),
            OrderKey::Workflow => self.workflow.clone(),
            OrderKey::WorkflowVersion => self.workflow_version.map(|v| v.to_string()).unwrap_or_default(),
        }
    }

    /// The canonical payload: field order is fixed by the struct, so equal orders
    /// give equal strings. `reply_to` is delivery, not content, and is left out.
    pub fn payload(&self) -> String {
        serde_json::to_string(self).expect("an Order always serializes")
    }
}

fn check_text(field: &str, value: &str) -> Result<(), MessageError> {
    if value.trim().is_empty() {
        return Err(MessageError::Invalid(format!("{field} is empty")));
    }
    if value.chars().count() > MAX_FIELD_LEN {
        return Err(MessageError::Invalid(format!("{field} is longer than {MAX_FIELD_LEN} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(MessageError::Invalid(format!("{field} contains control characters")));
    }
    Ok(())
}

impl OrderRequest {
    pub fn parse(body: &str) -> Result<OrderRequest, MessageError> {
        let request = parse_json(body)?;
        // The typed parse accepted it (so it is well-formed and small); the items must be
        // objects too, not positional arrays. Only their shape is read, not built.
        let shape: ItemsShape = serde_json::from_str(body).map_err(MessageError::from_json)?;
        if !shape.items_are_objects {
            return Err(MessageError::Malformed("items must be JSON objects, not arrays".into()));
        }
        Ok(request)
    }

    /// Checks what the type cannot, and resolves the workflow name.
    pub fn validate(self, workflows: &Workflows) -> Result<(Order, Option<String>), MessageError> {
        check_text("customer_id", &self.customer_id)?;
        if self.items.is_empty() {
            return Err(MessageError::Invalid("items is empty".into()));
        }
        if self.items.len() > MAX_ITEMS {
            return Err(MessageError::Invalid(format!(
                "{} items; at most {MAX_ITEMS} are allowed",
                self.items.len()
            )));
        }
        for (i, item) in self.items.iter().enumerate() {
            check_text(&format!("items[{i}].sku"), &item.sku)?;
            if item.quantity == 0 || item.quantity > MAX_QUANTITY {
                return Err(MessageError::Invalid(format!(
                    "items[{i}].quantity is {}; it must be 1 to {MAX_QUANTITY}",
                    item.quantity
                )));
            }
        }
        let workflow = match &self.workflow {
            None => workflows.default_workflow(),
            Some(name) => workflows.get(name).ok_or_else(|| {
                MessageError::Invalid(cut_reason(format!(
                    "unknown workflow {name:?}; known: {}",
                    workflows.names().join(", ")
                )))
            })?,
        };
        if let Some(version) = self.workflow_version
            && workflows.get_version(&workflow.name, version).is_none()
        {
            let known: Vec<String> =
                workflows.versions(&workflow.name).iter().map(|v| format!("v{v}")).collect();
            return Err(MessageError::Invalid(cut_reason(format!(
                "workflow {:?} has no version {version}; known: {}",
                workflow.name,
                known.join(", ")
            ))));
        }
        if let Some(r) = &self.reply_to
            && (r.trim().is_empty() || r.len() > MAX_REPLY_TO_LEN || r.chars().any(char::is_control))
        {
            return Err(MessageError::Invalid("reply_to must be a queue URL".into()));
        }
        let order = Order {
            order_id: self.order_id,
            customer_id: self.customer_id,
            items: self.items,
            workflow: workflow.name.clone(),
            workflow_version: self.workflow_version,
        };
        Ok((order, self.reply_to))
    }
}

/// Best effort at naming the order a bad body was about, for the rejection's status and log.
pub fn sniff_order_id(body: &str) -> Option<OrderId> {
    if body.len() > MAX_BODY_BYTES {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    OrderId::parse(v.get("order_id")?.as_str()?).ok()
}

/// Best effort at finding where a rejected order wanted its status.
pub fn sniff_reply_to(body: &str) -> Option<String> {
    if body.len() > MAX_BODY_BYTES {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let r = v.get("reply_to")?.as_str()?;
    (!r.trim().is_empty() && r.len() <= MAX_REPLY_TO_LEN).then(|| r.to_owned())
}

/// What the callback queue carries: the outside's word on a callback step.
/// `{"token": "sas1...", "outcome": "success", "output": {...}}`,
/// `{"token": "...", "outcome": "failure", "reason": "declined"}` or
/// `{"token": "...", "outcome": "heartbeat"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackMessage {
    pub token: String,
    pub outcome: CallbackOutcome,
    /// With `success`: the step's output (a JSON object, at most 4 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// With `failure`: why, for the order's submitter and the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackOutcome {
    Success,
    Failure,
    Heartbeat,
}

impl CallbackMessage {
    pub fn parse(body: &str) -> Result<CallbackMessage, MessageError> {
        parse_json(body)
    }
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("messages always serialize")
    }
    pub fn new(token: &str, completion: &Completion) -> CallbackMessage {
        let (outcome, output, reason) = match completion {
            Completion::Success { output } => (CallbackOutcome::Success, output.clone(), None),
            Completion::Failure { reason } => (CallbackOutcome::Failure, None, Some(reason.clone())),
            Completion::Heartbeat => (CallbackOutcome::Heartbeat, None, None),
        };
        CallbackMessage { token: token.to_owned(), outcome, output, reason }
    }
    /// What it says, if its fields fit its outcome.
    pub fn completion(&self) -> Result<Completion, String> {
        match (self.outcome, &self.output, &self.reason) {
            (CallbackOutcome::Success, output, None) => Ok(Completion::Success { output: output.clone() }),
            (CallbackOutcome::Failure, None, Some(reason)) if !reason.trim().is_empty() => {
                Ok(Completion::Failure { reason: reason.clone() })
            }
            (CallbackOutcome::Failure, None, _) => Err("a failure needs a reason".to_owned()),
            (CallbackOutcome::Heartbeat, None, None) => Ok(Completion::Heartbeat),
            (outcome, _, _) => Err(format!(
                "{} takes {}",
                serde_json::to_string(&outcome).unwrap_or_default(),
                match outcome {
                    CallbackOutcome::Success => "an output and no reason",
                    CallbackOutcome::Failure => "a reason and no output",
                    CallbackOutcome::Heartbeat => "neither output nor reason",
                }
            )),
        }
    }
}

/// Everything the scheduler's queue carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerMessage {
    /// Claim the task and dispatch its current step.
    Schedule {
        order_id: OrderId,
        /// Set by a limited agent's gate when it wakes the task: the ticket whose turn
        /// came. A task that no longer holds it (cancelled, moved on) gives it back at
        /// once, instead of leaving its reserved place to lapse.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn: Option<Turn>,
        /// How many times the scheduler sent this Schedule again because the state store
        /// throttled its handling (`retry::THROTTLED_SCHEDULE`).
        #[serde(default, skip_serializing_if = "is_zero")]
        throttled: u32,
    },
    /// An agent's answer for one attempt.
    Reply(AgentReply),
    /// Look at a limited agent's gate again: only time could make room for the tickets
    /// waiting there (`domain::gate`), and now it may have.
    Gate {
        agent: String,
        /// The time the look was planned for (`Gate::poke_at`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
}

impl SchedulerMessage {
    pub fn parse(body: &str) -> Result<SchedulerMessage, MessageError> {
        if let Some(message) = SchedulerMessage::parse_tag_first(body) {
            return Ok(message);
        }
        parse_json(body)
    }

    /// A schedule or a reply as `to_body` writes them, its tag first, read straight into
    /// its fields: the tagged enum's own parse first copies every field into a buffer to
    /// find the tag, which made it most of a scheduler message's handling. Only what that
    /// parse reads the same is read here: the same fields after the tag, no other tag, the
    /// same size limit; anything else, an error included, is left to it.
    fn parse_tag_first(body: &str) -> Option<SchedulerMessage> {
        if body.len() > MAX_BODY_BYTES {
            return None;
        }
        let (fields, reply) = if let Some(rest) = body.strip_prefix(r#"{"type":"reply","#) {
            (rest, true)
        } else if let Some(rest) = body.strip_prefix(r#"{"type":"schedule","#) {
            (rest, false)
        } else {
            return None;
        };
        let mut object = String::with_capacity(fields.len() + 1);
        object.push('{');
        object.push_str(fields);
        if reply {
            serde_json::from_str::<AgentReply>(&object).ok().map(SchedulerMessage::Reply)
        } else {
            let ScheduleFields { order_id, turn, throttled } = serde_json::from_str(&object).ok()?;
            Some(SchedulerMessage::Schedule { order_id, turn, throttled })
        }
    }
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("messages always serialize")
    }
}

/// `SchedulerMessage::Schedule`'s fields, for `SchedulerMessage::parse_tag_first`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFields {
    order_id: OrderId,
    #[serde(default)]
    turn: Option<Turn>,
    #[serde(default)]
    throttled: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A ticket's turn at a limited agent's gate (`domain::gate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub agent: String,
    pub ticket: u64,
}

/// The scheduler's instruction to an agent: run one action of one step, under a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version the task is pinned to.
    #[serde(default = "super::workflow::first_version")]
    pub workflow_version: u32,
    pub step: u32,
    /// The step's name (forward) or its compensation's name (undo).
    pub step_name: String,
    pub agent: String,
    pub action: Action,
    pub attempt: u32,
    pub lease: LeaseToken,
    pub complete_by: Timestamp,
    pub idempotency_key: super::ids::IdempotencyKey,
    pub order: Order,
    /// The outputs of the task's steps that succeeded so far, by step name: every
    /// earlier step's for a forward step, and the undone step's own for a compensation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// For a `queue` agent's worker: the scheduler's queue, where its reply goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue: Option<String>,
    /// For a callback step: the token the outside completes the step with (only here
    /// whole; shown redacted everywhere else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_token: Option<CallbackToken>,
    /// For an item of a map step: its index in the map's items, and the item itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<serde_json::Value>,
}

/// How an agent request disagrees with the workflow it names. The agent's queue is
/// written only by the scheduler, but the agent calls what the request names, so it
/// checks: a request naming another agent or step would reach another endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestMismatch {
    #[error("agent request names unknown workflow {0:?} v{1}")]
    UnknownWorkflow(String, u32),
    #[error("agent request names step {step}, which workflow {workflow} does not have")]
    NoSuchStep { workflow: String, step: u32 },
    #[error("agent request for step {step} of {workflow} names {field} {got:?}; the workflow has {want:?}")]
    Field { workflow: String, step: u32, field: &'static str, got: String, want: String },
    #[error("agent request undoes step {step} of {workflow}, which has no compensation")]
    NoCompensation { workflow: String, step: u32 },
    #[error("agent request names step {step} of {workflow}, a timer step, which calls no agent")]
    Timer { workflow: String, step: u32 },
    #[error("agent request's {0} does not match its order id, step and action")]
    Inconsistent(&'static str),
    #[error("agent request for step {step} of {workflow} {why}")]
    Item { workflow: String, step: u32, why: &'static str },
}

impl AgentRequest {
    pub fn parse(body: &str) -> Result<AgentRequest, MessageError> {
        parse_json(body)
    }

    /// Whether the request is one the scheduler could have sent for `workflows`: its
    /// agent and step name are the workflow's, its key and order are its own.
    pub fn check(&self, workflows: &Workflows) -> Result<(), RequestMismatch> {
        let workflow = if crate::mutations::newest_version() {
            workflows.get(&self.workflow)
        } else {
            workflows.get_version(&self.workflow, self.workflow_version)
        };
        let workflow = workflow
            .ok_or_else(|| RequestMismatch::UnknownWorkflow(self.workflow.clone(), self.workflow_version))?;
        let step = workflow.step(self.step).ok_or_else(|| RequestMismatch::NoSuchStep {
            workflow: workflow.name.clone(),
            step: self.step,
        })?;
        if step.is_timer() {
            return Err(RequestMismatch::Timer { workflow: workflow.name.clone(), step: self.step });
        }
        // Only a step with a compensation is ever undone: an undo of a pivot would call
        // the pivot's own action again under a new key.
        let name = match (self.action, &step.compensation) {
            (super::workflow::Action::Do, _) => &step.name,
            (super::workflow::Action::Undo, Some(compensation)) => compensation,
            (super::workflow::Action::Undo, None) => {
                return Err(RequestMismatch::NoCompensation {
                    workflow: workflow.name.clone(),
                    step: self.step,
                });
            }
        };
        for (field, got, want) in [("agent", &self.agent, &step.agent), ("step_name", &self.step_name, name)]
        {
            if got != want {
                return Err(RequestMismatch::Field {
                    workflow: workflow.name.clone(),
                    step: self.step,
                    field,
                    got: cut_reason(got.clone()),
                    want: want.clone(),
                });
            }
        }
        let key_ok = match (workflow.map_at(self.step), self.index) {
            (Some(_), Some(index)) => {
                let undo = self.action == super::workflow::Action::Undo;
                self.idempotency_key == super::map::item_key(&self.order_id, self.step, index, undo)
            }
            (None, None) => super::workflow::is_idempotency_key(
                &self.idempotency_key,
                &self.order_id,
                self.step,
                self.action,
            ),
            (Some(_), None) => {
                let why = "names no item, and the step is a map's";
                return Err(RequestMismatch::Item { workflow: workflow.name.clone(), step: self.step, why });
            }
            (None, Some(_)) => {
                let why = "names an item, and the step is not a map's";
                return Err(RequestMismatch::Item { workflow: workflow.name.clone(), step: self.step, why });
            }
        };
        if !key_ok {
            return Err(RequestMismatch::Inconsistent("idempotency_key"));
        }
        if self.order.order_id != self.order_id || self.order.workflow != self.workflow {
            return Err(RequestMismatch::Inconsistent("order"));
        }
        Ok(())
    }
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("messages always serialize")
    }
    /// Echoes the fencing fields so the scheduler can match the reply to its claim.
    pub fn reply(&self, outcome: ReplyOutcome) -> AgentReply {
        AgentReply {
            order_id: self.order_id.clone(),
            step: self.step,
            action: self.action,
            attempt: self.attempt,
            lease: self.lease,
            index: self.index,
            outcome,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentReply {
    pub order_id: OrderId,
    pub step: u32,
    pub action: Action,
    pub attempt: u32,
    pub lease: LeaseToken,
    /// The item of a map step the reply is for, echoed from its request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub outcome: ReplyOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplyOutcome {
    /// The step took effect; `output` is the service's answer, kept for later steps
    /// (a compensation's answer is not kept).
    Succeeded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<serde_json::Value>,
    },
    /// The remote service refused for good (e.g. a 4xx): retrying cannot help.
    Failed {
        /// What failed and its status class: this reaches the order's submitter.
        reason: String,
        /// The service's own answer (bounded): for the record and the operator only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// The service answered success, but with an output that cannot be kept (not JSON,
    /// or over the size limit): the step took effect and later steps cannot have what it
    /// returned, so the task gives up with the step's outcome in doubt.
    BadOutput {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// The service answered 429 or 503 with Retry-After, and nothing was done: the step
    /// goes back to wait after `retry_after_ms`, no failure counted, and the agent's gate
    /// lets nobody through until then. Only a step outside a parallel stage is answered so.
    Throttled { retry_after_ms: u64 },
}

impl ReplyOutcome {
    /// Success with nothing to keep.
    pub const DONE: ReplyOutcome = ReplyOutcome::Succeeded { output: None };
}

/// What `reply_to` receives as an order moves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusUpdate {
    pub order_id: Option<OrderId>,
    pub status: OrderStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at: Timestamp,
}

impl StatusUpdate {
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("messages always serialize")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Received,
    Rejected,
    StepCompleted,
    StepUndone,
    Compensating,
    Processed,
    Compensated,
    Failed,
    /// An operator sent an Error task forward again.
    Resubmitted,
    /// The task was cancelled; undoing what it did follows (`step_undone`, then
    /// `compensated`).
    Cancelled,
    /// A cancel message could not be applied (the reason says why); nothing changed.
    CancelRefused,
    /// The task waits at `step`: a callback step's work started and waits for the
    /// outside to complete it.
    Waiting,
}

/// What the operators' topic receives when a task needs a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorAlert {
    pub order_id: OrderId,
    pub workflow: String,
    pub step: u32,
    pub step_name: String,
    pub state: super::lifecycle::ProcessState,
    pub failure_count: u32,
    pub reason: String,
    /// The idempotency key of a step whose outcome is unknown (dispatched, no definitive
    /// answer), so the operator can ask the remote side what happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<super::ids::IdempotencyKey>,
    pub at: Timestamp,
}

impl OperatorAlert {
    pub fn subject(&self) -> String {
        format!("sas: order {} {} at step {}", self.order_id, self.state.as_str(), self.step_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_on_the_orders_queue_is_told_from_an_order() {
        let cancel = Intake::parse(r#"{"cancel":"o-1","reason":"customer changed their mind"}"#).unwrap();
        let Intake::Cancel(c) = cancel else { panic!("not a cancel") };
        assert_eq!((c.cancel.as_str(), c.actor_name().as_str()), ("o-1", "app"));
        let c = Intake::parse(r#"{"cancel":"o-1","reason":"r","requested_by":"crm"}"#).unwrap();
        assert!(matches!(c, Intake::Cancel(c) if c.actor_name() == "app:crm"));
        assert!(matches!(Intake::parse(&order_json("")), Ok(Intake::Order(_))));
        for bad in [
            r#"{"cancel":"o-1"}"#,
            r#"{"cancel":"o-1","reason":""}"#,
            r#"{"cancel":"o 1","reason":"r"}"#,
            r#"{"cancel":"o-1","reason":"r","items":[]}"#,
            r#"{"cancel":"o-1","reason":"a\u0000b"}"#,
        ] {
            assert!(Intake::parse(bad).is_err(), "{bad}");
        }
        assert!(Intake::is_cancel(r#"{"cancel":"o-1"}"#), "an invalid cancel is still a cancel");
        assert!(!Intake::is_cancel(r#"{"order_id":"o-1"}"#));
        assert!(!Intake::is_cancel(r#"["cancel"]"#));
    }

    /// A forged request naming a timer step (its agent empty, as the step's) reaches no
    /// endpoint: a timer calls nothing.
    #[test]
    fn a_request_for_a_timer_step_is_refused() {
        use crate::domain::wait::Wait;
        use crate::domain::workflow::{Step, Workflow};
        let wf = Workflow::new("w", vec![Step::timer("t", Wait::for_ms(1_000)), Step::pivot("p", "a")]);
        let workflows = Workflows::new(vec![wf]);
        let order_id = OrderId::parse("o-1").unwrap();
        let order = Order {
            order_id: order_id.clone(),
            customer_id: "c".into(),
            items: vec![],
            workflow: "w".into(),
            workflow_version: None,
        };
        let request = |step: u32, name: &str, agent: &str| AgentRequest {
            order_id: order_id.clone(),
            workflow: "w".into(),
            workflow_version: 1,
            step,
            step_name: name.into(),
            agent: agent.into(),
            action: Action::Do,
            attempt: 1,
            lease: LeaseToken(uuid::Uuid::nil()),
            complete_by: Timestamp(1),
            idempotency_key: super::super::workflow::idempotency_key(&order_id, step, Action::Do),
            order: order.clone(),
            outputs: BTreeMap::new(),
            reply_queue: None,
            callback_token: None,
            index: None,
            item: None,
        };
        assert_eq!(request(1, "p", "a").check(&workflows), Ok(()));
        assert_eq!(
            request(0, "t", "").check(&workflows),
            Err(RequestMismatch::Timer { workflow: "w".into(), step: 0 })
        );
    }

    fn order_json(extra: &str) -> String {
        format!(r#"{{"order_id":"o-1","customer_id":"c-1","items":[{{"sku":"A","quantity":2}}]{extra}}}"#)
    }

    #[test]
    fn valid_order_resolves_default_workflow() {
        let (order, reply_to) =
            OrderRequest::parse(&order_json("")).unwrap().validate(&Workflows::builtin()).unwrap();
        assert_eq!(order.workflow, "single-step");
        assert_eq!(reply_to, None);
    }

    #[test]
    fn bad_orders_are_named() {
        let w = Workflows::builtin();
        let cases = [
            ("{", "not a valid message"),
            (r#"{"order_id":"o-1"}"#, "missing field"),
            (&order_json(r#","colour":"red""#), "unknown field"),
            (&order_json(r#","workflow":"nope""#), "unknown workflow"),
            (r#"{"order_id":"o-1","customer_id":"c","items":[]}"#, "items is empty"),
            (r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":0}]}"#, "quantity is 0"),
            (r#"{"order_id":"o-1","customer_id":"c","items":[{"sku":"A","quantity":-1}]}"#, "invalid value"),
            (r#"{"order_id":"o/1","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#, "only ASCII"),
            (
                r#"{"order_id":"o-1","customer_id":" ","items":[{"sku":"A","quantity":1}]}"#,
                "customer_id is empty",
            ),
            (&order_json(r#","reply_to":"""#), "reply_to"),
        ];
        for (body, want) in cases {
            let err = OrderRequest::parse(body).and_then(|r| r.validate(&w)).unwrap_err();
            assert!(err.to_string().contains(want), "{body}: {err}");
        }
        for positional in
            [r#"["o-1","c",[["A",1]]]"#, r#"{"order_id":"o-1","customer_id":"c","items":[["A",1]]}"#]
        {
            let err = OrderRequest::parse(positional).unwrap_err();
            assert!(matches!(err, MessageError::Malformed(_)), "{positional}: {err}");
        }
        assert!(SchedulerMessage::parse(r#"["schedule","o-1"]"#).is_err());
        let big = "x".repeat(MAX_BODY_BYTES + 1);
        assert_eq!(OrderRequest::parse(&big).unwrap_err(), MessageError::TooLarge(MAX_BODY_BYTES + 1));
    }

    #[test]
    fn reasons_made_from_input_are_cut_once() {
        let field = "é".repeat(100_000);
        let body = order_json(&format!(r#","{field}":1"#));
        let err = OrderRequest::parse(&body).unwrap_err().to_string();
        assert!(err.len() <= MAX_REASON_BYTES + 30, "{} bytes", err.len());
        assert!(err.ends_with('…'), "{err}");
        let body = order_json(&format!(r#","workflow":"{}""#, "w".repeat(200_000)));
        let err =
            OrderRequest::parse(&body).unwrap().validate(&Workflows::builtin()).unwrap_err().to_string();
        assert!(err.len() <= MAX_REASON_BYTES + 30, "{} bytes", err.len());
        assert_eq!(cut_reason("short".into()), "short");
    }

    #[test]
    fn payload_ignores_reply_to() {
        let w = Workflows::builtin();
        let a = OrderRequest::parse(&order_json("")).unwrap().validate(&w).unwrap().0;
        let b = OrderRequest::parse(&order_json(r#","reply_to":"q""#)).unwrap().validate(&w).unwrap().0;
        assert_eq!(a.payload(), b.payload());
    }

    #[test]
    fn scheduler_messages_round_trip() {
        let m =
            SchedulerMessage::Schedule { order_id: OrderId::parse("o-1").unwrap(), turn: None, throttled: 0 };
        assert_eq!(m.to_body(), r#"{"type":"schedule","order_id":"o-1"}"#, "as before turns");
        assert_eq!(SchedulerMessage::parse(&m.to_body()).unwrap(), m);
        let woken = SchedulerMessage::Schedule {
            order_id: OrderId::parse("o-1").unwrap(),
            turn: Some(Turn { agent: "pay".into(), ticket: 7 }),
            throttled: 0,
        };
        assert_eq!(
            woken.to_body(),
            r#"{"type":"schedule","order_id":"o-1","turn":{"agent":"pay","ticket":7}}"#
        );
        assert_eq!(SchedulerMessage::parse(&woken.to_body()).unwrap(), woken);
        let again =
            SchedulerMessage::Schedule { order_id: OrderId::parse("o-1").unwrap(), turn: None, throttled: 3 };
        assert_eq!(again.to_body(), r#"{"type":"schedule","order_id":"o-1","throttled":3}"#);
        assert_eq!(SchedulerMessage::parse(&again.to_body()).unwrap(), again);
        assert!(SchedulerMessage::parse(r#"{"type":"launch","order_id":"o-1"}"#).is_err());
    }

    /// The tag-first reading agrees with the tagged enum's own wherever it reads anything.
    #[test]
    fn tag_first_reads_as_the_tagged_parse() {
        let lease = r#""lease":"67e55044-10b1-426f-9247-bb680e5fe0c8""#;
        let reply =
            format!(r#"{{"type":"reply","order_id":"o-1","step":2,"action":"do","attempt":3,{lease}"#);
        let bodies = [
            r#"{"type":"schedule","order_id":"o-1"}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","type":"schedule"}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","at":5}"#.to_owned(),
            r#"{"type":"schedule","order_id":"no spaces"}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1"} x"#.to_owned(),
            r#"{"type":"schedule",}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","turn":{"agent":"pay","ticket":7}}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","turn":{"agent":"pay","ticket":7,"x":1}}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","turn":null}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","throttled":2}"#.to_owned(),
            r#"{"type":"schedule","order_id":"o-1","throttled":-2}"#.to_owned(),
            format!(
                r#"{reply},"outcome":{{"status":"succeeded","output":{{"n":1.5,"s":"é","big":18446744073709551616}}}}}}"#
            ),
            format!(r#"{reply},"outcome":{{"status":"succeeded"}}}}"#),
            format!(r#"{reply},"outcome":{{"status":"failed","reason":"r","detail":null}}}}"#),
            format!(r#"{reply},"outcome":{{"status":"throttled","retry_after_ms":100}}}}"#),
            format!(r#"{reply},"outcome":{{"status":"succeeded"}},"type":"reply"}}"#),
            format!(r#"{reply},"outcome":{{"status":"succeeded"}},"extra":1}}"#),
            format!(r#"{reply},"outcome":{{"status":"succeeded","output":null}}}}"#),
            format!(r#"{reply},"step":-1,"outcome":{{"status":"succeeded"}}}}"#),
            format!(r#"{reply},"outcome":{{"status":"succeeded"}},"step":4}}"#),
        ];
        let mut read = 0;
        for body in &bodies {
            let tagged = parse_json::<SchedulerMessage>(body).ok();
            if let Some(fast) = SchedulerMessage::parse_tag_first(body) {
                read += 1;
                assert_eq!(Some(&fast), tagged.as_ref(), "{body}");
            }
            assert_eq!(SchedulerMessage::parse(body).ok(), tagged, "{body}");
        }
        assert!(read >= 6, "the common bodies are read tag first ({read})");
    }
}
