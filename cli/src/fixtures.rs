//! What the unit tests build records from.

use sas::domain::{
    Lease, LeaseToken, LineItem, Order, OrderId, Phase, Policy, ProcessState, TaskRecord, Timestamp,
    WaitingFor,
};

/// A task of order `id` (one item, workflow `w`), created at 1,700,000,000,000 ms, in `state`.
pub fn task(id: &str, state: ProcessState) -> TaskRecord {
    let order = Order {
        order_id: OrderId::parse(id).unwrap(),
        customer_id: "c".into(),
        items: vec![LineItem { sku: "A".into(), quantity: 1 }],
        workflow: "w".into(),
        workflow_version: None,
    };
    let created = Timestamp(1_700_000_000_000);
    let t = TaskRecord::new(&order, None, created, &Policy::default());
    let due = created.plus_ms(60_000);
    let lease = Lease { token: LeaseToken(uuid::Uuid::from_u128(1)), complete_by: created.plus_ms(30_000) };
    let phase = match state {
        ProcessState::Pending => return t,
        ProcessState::Processing => Phase::processing(lease, due),
        // A timer, unless the test gives it another wait.
        ProcessState::Waiting => Phase::waiting(WaitingFor::Timer { wake_at: due }),
        ProcessState::Compensating => Phase::compensating(None, due),
        ended => Phase::ended(ended).expect("an end"),
    };
    t.with_phase(phase)
}
