//! What the application sends in one run: valid orders of the deployment's workflows,
//! byte-for-byte resends, conflicting payloads under an existing id, apps' cancels (some from
//! a sender other than the order's), and bad messages to every queue.

use sas::adapters::embedded::queue_names::{AGENT, ORDERS, SCHEDULER, STATUS};

/// A message the outside world sends, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub at: u64,
    pub queue: &'static str,
    pub body: String,
    pub kind: Input,
    /// The SQS `SenderId` the message arrives with: the app's role and a session name
    /// that changes from container to container; none for the bad input (any sender).
    pub sender: Option<String>,
}

/// The role every order of a run is sent under (its unique id, as SQS's `SenderId` gives
/// it), and another role that may write to the orders queue but sent none of them.
pub const APP: &str = "AROASIMAPP";
pub const OTHER_APP: &str = "AROASIMOTHER";

/// An app's `SenderId` from one of its containers: the session name is dropped when the
/// sender is compared, so the app is the same sender from every container.
fn sender_id(role: &str, container: usize) -> Option<String> {
    Some(format!("{role}:container-{container}"))
}

/// What an arrival puts into the pipeline, and so what the checker expects of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A valid order (first send, resend, or a conflicting payload under its id).
    Order { id: String },
    /// Bad input, and a phrase the reason it is kept with must contain.
    Bad { expect: &'static str },
    /// An app's cancel of order `id` (which may not be accepted yet, or ever); `foreign`:
    /// sent by a sender other than the order's, so it must never apply.
    Cancel { id: String, foreign: bool },
}

/// The reason an app's cancel number `n` gives: unique, so the checker can tell which
/// cancel a write carried out.
pub fn cancel_reason(n: usize) -> String {
    format!("app cancel {n}")
}

pub fn order_body(id: &str, customer: &str, quantity: u32, workflow: &str, reply_to: bool) -> String {
    let reply = if reply_to { format!(r#","reply_to":"{STATUS}""#) } else { String::new() };
    format!(
        r#"{{"order_id":"{id}","customer_id":"{customer}","items":[{{"sku":"A-1","quantity":{quantity}}}],"workflow":"{workflow}"{reply}}}"#
    )
}

/// Bad inputs the run mixes in, per queue, with what their rejection must say.
const BAD: &[(&str, &str, &str)] = &[
    (ORDERS, "{not json", "not a valid message"),
    (ORDERS, r#"{"order_id":"x-1","customer_id":"c","items":[]}"#, "items is empty"),
    (ORDERS, r#"{"order_id":"x/2","customer_id":"c","items":[{"sku":"A","quantity":1}]}"#, "only ASCII"),
    (
        ORDERS,
        r#"{"order_id":"x-3","customer_id":"c","items":[{"sku":"A","quantity":1}],"workflow":"nope"}"#,
        "unknown workflow",
    ),
    (
        ORDERS,
        r#"{"order_id":"x-4","customer_id":"c","items":[{"sku":"A","quantity":1}],"workflow":"single-step","workflow_version":9}"#,
        "has no version 9",
    ),
    (SCHEDULER, r#"{"type":"launch","order_id":"o-1"}"#, "unknown variant"),
    (SCHEDULER, r#"{"type":"schedule","order_id":"ghost"}"#, "unknown order"),
    (
        SCHEDULER,
        r#"{"type":"reply","order_id":"ghost","step":0,"action":"do","attempt":1,"lease":"00000000-0000-0000-0000-000000000001","outcome":{"status":"succeeded"}}"#,
        "unknown order",
    ),
    (AGENT, r#"{"order_id":"o-1"}"#, "missing field"),
    (AGENT, "[]", "not a valid message"),
];

pub fn generate(rng: &mut fastrand::Rng, swarm: &crate::swarm::Swarm) -> Vec<Arrival> {
    let mut out = Vec::new();
    let window = swarm.arrival_window_ms;
    let at = |rng: &mut fastrand::Rng| if window == 0 { 0 } else { rng.u64(0..=window) };
    let mut valid = Vec::new();
    for i in 0..swarm.orders {
        let id = format!("o-{i}");
        let workflow = swarm.workflows[rng.usize(..swarm.workflows.len())];
        let mut body = order_body(&id, "c-1", 1 + i as u32, workflow, rng.bool());
        // Some orders name the version they want: the one from before any publish.
        if workflow == "generated" && rng.u8(..3) == 0 {
            let named = format!(r#""workflow":"generated","workflow_version":{}"#, swarm.generated.version);
            body = body.replace(r#""workflow":"generated""#, &named);
        }
        valid.push((id.clone(), body.clone(), workflow));
        let sender = sender_id(APP, i % 3);
        out.push(Arrival { at: at(rng), queue: ORDERS, body, kind: Input::Order { id }, sender });
    }
    // Who sends what is derived from what was drawn, never drawn itself: a seed's
    // history is the same as before senders were simulated, except where a cancel from
    // another sender is now refused.
    for r in 0..swarm.resends {
        let (id, body, _) = valid[rng.usize(..valid.len())].clone();
        let sender = sender_id(APP, r % 3 + 3);
        out.push(Arrival { at: at(rng), queue: ORDERS, body, kind: Input::Order { id }, sender });
    }
    for c in 0..swarm.conflicts {
        let (id, _, workflow) = valid[rng.usize(..valid.len())].clone();
        let body = order_body(&id, "c-other", 99, workflow, true);
        let sender = sender_id(APP, c % 3);
        out.push(Arrival { at: at(rng), queue: ORDERS, body, kind: Input::Order { id }, sender });
    }
    for n in 0..swarm.app_cancels {
        let which = rng.usize(..valid.len());
        let id = valid[which].0.clone();
        let body = format!(r#"{{"cancel":"{id}","reason":"{}"}}"#, cancel_reason(n));
        // One cancel in three comes from another role that may write to the queue.
        let foreign = which.is_multiple_of(3);
        let sender = sender_id(if foreign { OTHER_APP } else { APP }, n + 6);
        out.push(Arrival { at: at(rng), queue: ORDERS, body, kind: Input::Cancel { id, foreign }, sender });
    }
    for _ in 0..swarm.bad_inputs {
        let (queue, body, expect) = BAD[rng.usize(..BAD.len())];
        let arrival =
            Arrival { at: at(rng), queue, body: body.to_owned(), kind: Input::Bad { expect }, sender: None };
        out.push(arrival);
    }
    out.sort_by_key(|a| a.at);
    out
}
