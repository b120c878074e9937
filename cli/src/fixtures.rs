//! What the unit tests build records from.

use sas::domain::{LineItem, Order, OrderId, Policy, ProcessState, TaskRecord, Timestamp};

/// A task of order `id` (one item, workflow `w`), created at 1,700,000,000,000 ms, in `state`.
pub fn task(id: &str, state: ProcessState) -> TaskRecord {
    let order = Order {
        order_id: OrderId::parse(id).unwrap(),
        customer_id: "c".into(),
        items: vec![LineItem { sku: "A".into(), quantity: 1 }],
        workflow: "w".into(),
        workflow_version: None,
    };
    let mut t = TaskRecord::new(&order, None, Timestamp(1_700_000_000_000), &Policy::default());
    t.state = state;
    t
}
