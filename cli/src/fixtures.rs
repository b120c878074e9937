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

/// quote (a read whose output lists the lines), then the map `reserve-lines` over them,
/// at most `cap` at a time with `tolerated` refusals tolerated, then ship.
pub fn map_workflow(cap: u32, tolerated: u32) -> sas::domain::Workflow {
    use sas::domain::Step;
    use sas::domain::workflow::{Entry, MapText};
    sas::domain::Workflow::of_entries(
        "w",
        vec![
            Entry::Step(Step::read_only("quote", "quotes")),
            Entry::Map {
                map: MapText {
                    name: "reserve-lines".into(),
                    items: "$.steps.quote.output.lines".into(),
                    max_concurrency: cap,
                    tolerated_failures: tolerated,
                    step: Step::compensable("reserve", "warehouse", "release"),
                },
            },
            Entry::Step(Step::compensable("ship", "shipping", "recall")),
        ],
    )
}

/// The reply to the task's dispatch of its current step (of item `index` at a map), `at`
/// ms after creation, applied.
pub fn answer(
    t: &TaskRecord,
    wf: &sas::domain::Workflow,
    index: Option<u32>,
    outcome: sas::domain::ReplyOutcome,
    at: u64,
) -> TaskRecord {
    let (attempt, _) = t.dispatch_of(t.step, index);
    let r = sas::domain::AgentReply {
        order_id: t.order_id.clone(),
        step: t.step,
        action: t.action(),
        attempt,
        lease: t.locked_by().expect("a live lease"),
        index,
        outcome,
    };
    t.apply_reply(&r, Timestamp(1_700_000_000_000 + at), wf, &Policy::default()).expect("applied").next
}

/// Claimed by lease `n`, `at` ms after creation.
pub fn claimed(t: &TaskRecord, wf: &sas::domain::Workflow, n: u128, at: u64) -> TaskRecord {
    let lease = LeaseToken(uuid::Uuid::from_u128(n));
    t.claim(lease, Timestamp(1_700_000_000_000 + at), wf, &Policy::default()).expect("claimed").next
}

/// Of `map_workflow`: quoted with `lines` lines, Pending at the map, its items not read yet.
pub fn at_map(wf: &sas::domain::Workflow, lines: usize) -> TaskRecord {
    let t = claimed(&task("o-1", ProcessState::Pending), wf, 1, 10);
    let list: Vec<String> = (0..lines).map(|i| format!("\"l{i}\"")).collect();
    let output = serde_json::from_str(&format!(r#"{{"lines": [{}]}}"#, list.join(","))).unwrap();
    let t = answer(&t, wf, None, sas::domain::ReplyOutcome::Succeeded { output: Some(output) }, 15);
    assert_eq!((t.state(), t.step), (ProcessState::Pending, 1));
    t
}

/// Five lines, two at a time, one refusal tolerated, claimed at 20 ms: item 0 succeeded,
/// item 1 refused, items 2 and 3 in flight, item 4 not run yet.
pub fn map_under_way() -> (sas::domain::Workflow, TaskRecord) {
    use sas::domain::ReplyOutcome;
    let wf = map_workflow(2, 1);
    let t = claimed(&at_map(&wf, 5), &wf, 2, 20);
    let t = answer(&t, &wf, Some(0), ReplyOutcome::Succeeded { output: None }, 30);
    let refused = ReplyOutcome::Failed { reason: "422: no stock".into(), detail: None };
    (wf.clone(), answer(&t, &wf, Some(1), refused, 40))
}
