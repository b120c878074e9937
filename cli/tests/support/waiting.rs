//! A task waiting at a callback step, written to a deployment's table through the domain
//! as the scheduler and the agent's "started" would have left it: what the tests of
//! `tasks complete|fail` (tasks_callbacks.rs) and of the console (console.rs) act on.

use sas::domain::{
    AgentReply, CallbackSecret, CallbackToken, Definitions, Effect, LeaseToken, LineItem, Mint, Order,
    OrderId, Policy, ReplyOutcome, TaskRecord, Timestamp,
};
use sas::ports::Clock as _;

/// A callback step first (approved by a person: an hour to answer, a heartbeat every ten
/// minutes), then a pivot.
pub const DEFINITIONS: &str = r#"{"agents": {"approvals": {}, "shipping": {}},
  "workflows": [{"name": "approve-first", "steps": [
    {"name": "approve", "agent": "approvals", "compensation": "withdraw",
     "callback": {"timeout_ms": 3600000, "heartbeat_ms": 600000}},
    {"name": "ship", "agent": "shipping"}]}]}"#;

/// A task of `approve-first` waiting at its callback step, as the scheduler and the
/// agent's "started" leave it, and the token its agent request carried.
pub fn waiting_task(id: &str, secret: u8) -> (TaskRecord, CallbackToken) {
    let definitions = Definitions::parse(DEFINITIONS).unwrap();
    let wf = definitions.workflows.get("approve-first").unwrap();
    let order = Order {
        order_id: OrderId::parse(id).unwrap(),
        customer_id: "c-1".into(),
        items: vec![LineItem { sku: "A-1".into(), quantity: 1 }],
        workflow: "approve-first".into(),
        workflow_version: None,
    };
    let policy = Policy::default();
    // Claimed two minutes ago: past the heartbeat floor (a tenth of the 10 minutes), so the
    // first heartbeat is written.
    let now = Timestamp(sas::adapters::system::SystemClock.now().0 - 120_000);
    let task = TaskRecord::new(&order, None, now, &policy);
    let lease = LeaseToken(uuid::Uuid::new_v4());
    let claimed =
        task.claim(Mint { lease, secret: Some(CallbackSecret([secret; 32])) }, now, wf, &policy).unwrap();
    let token = claimed
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::Dispatch { callback, .. } => callback.clone(),
            _ => None,
        })
        .expect("a callback step's claim mints a token");
    let reply = AgentReply {
        order_id: order.order_id.clone(),
        step: 0,
        action: sas::domain::Action::Do,
        attempt: claimed.next.attempt,
        lease,
        index: None,
        outcome: ReplyOutcome::Succeeded { output: None },
    };
    let started = claimed.next.apply_reply(&reply, Timestamp(now.0 + 5), wf, &policy).unwrap();
    assert_eq!(started.next.state(), sas::domain::ProcessState::Waiting);
    (started.next, token)
}
