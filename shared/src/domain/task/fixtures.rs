//! Tests only: tasks in the states the tests start from, and decisions checked against
//! the table and the record's shape rules. The operator's tests (`operator.rs`) use them too.

use super::operator::{Actor, Origin};
use crate::domain::ids::{LeaseToken, OrderId, Timestamp};
use crate::domain::lifecycle::{self, ProcessState, Trigger};
use crate::domain::messages::{AgentReply, LineItem, OperatorAlert, Order, OrderStatus, ReplyOutcome};
use crate::domain::retry::Backoff;
use crate::domain::wait::Wait;
use crate::domain::workflow::{OnGiveUp, Step, Workflow};

use super::{Act, Decision, Effect, Mint, Policy, Refusal, TaskRecord};
use crate::domain::callback::{Callback, CallbackSecret, CallbackToken, TokenClaims};

pub(in crate::domain) const T0: Timestamp = Timestamp(1_000_000);

pub(in crate::domain) fn policy() -> Policy {
    Policy {
        step_timeout_ms: 1_000,
        reply_grace_ms: 500,
        pending_timeout_ms: 2_000,
        failure_threshold: 3,
        retry_backoff: Backoff { base_ms: 100, cap_ms: 1_000 },
    }
}

pub(in crate::domain) fn lease(n: u128) -> LeaseToken {
    LeaseToken(uuid::Uuid::from_u128(n))
}

pub(in crate::domain) fn new_task(wf: &Workflow) -> TaskRecord {
    let order = Order {
        order_id: OrderId::parse("o-1").unwrap(),
        customer_id: "c-1".into(),
        items: vec![LineItem { sku: "A".into(), quantity: 1 }],
        workflow: wf.name.clone(),
        workflow_version: None,
    };
    let task = TaskRecord::new(&order, Some("status".into()), T0, &policy());
    assert_eq!(task.shape_violation(), None);
    task
}

/// Every decision the tests make goes through here: it must follow the table,
/// keep the record's shape and bump the revision.
pub(in crate::domain) fn checked(before: &TaskRecord, result: Result<Decision, Refusal>) -> Decision {
    let d = result.unwrap_or_else(|r| panic!("refused from {:?}: {r}", before.state()));
    assert_eq!(lifecycle::next(before.state(), d.trigger), Some(d.next.state()), "{:?}", d.trigger);
    assert_eq!(d.next.shape_violation(), None, "{:?}", d.next);
    assert_eq!(d.next.revision, before.revision + 1);
    assert!(d.next.failure_count >= before.failure_count);
    d
}

pub(in crate::domain) fn claim(task: &TaskRecord, wf: &Workflow, n: u128, now: Timestamp) -> TaskRecord {
    checked(task, task.claim(mint(n), now, wf, &policy())).next
}

/// Lease `n`, and a secret of its own for a callback step's token.
pub(in crate::domain) fn mint(n: u128) -> Mint {
    Mint { lease: lease(n), secret: Some(CallbackSecret([n as u8; 32])) }
}

/// charge (compensable), approve (a callback, 10 s, heartbeat 3 s, compensable), ship (pivot).
pub(in crate::domain) fn approval() -> Workflow {
    Workflow::new(
        "approval",
        vec![
            Step::compensable("charge", "pay", "refund"),
            Step::compensable("approve", "approvals", "withdraw")
                .with_callback(Callback { timeout_ms: 10_000, heartbeat_ms: Some(3_000) }),
            Step::pivot("ship", "carrier"),
        ],
    )
}

/// Claimed at `wf`'s callback step `step` at `at` (earlier steps answered at T0), and the
/// token its dispatch carries.
pub(in crate::domain) fn claimed_callback(
    wf: &Workflow,
    step: u32,
    at: Timestamp,
) -> (TaskRecord, CallbackToken) {
    let mut t = new_task(wf);
    for n in 0..step {
        t = reply(&claim(&t, wf, 100 + n as u128, T0), wf, ok(), T0).next;
    }
    let d = checked(&t, t.claim(mint(2), at, wf, &policy()));
    let Some(Effect::Dispatch { callback: Some(token), .. }) = d.effects.first().cloned() else {
        panic!("no token dispatched: {:?}", d.effects)
    };
    (d.next, token)
}

/// Waiting at `wf`'s callback step `step`: its agent answered (with a ticket) at T0 + 5.
pub(in crate::domain) fn started_callback(wf: &Workflow, step: u32) -> (TaskRecord, CallbackToken) {
    let (t, token) = claimed_callback(wf, step, T0);
    let d = checked(
        &t,
        t.apply_reply(&reply_for(&t, output(r#"{"ticket":"A-1"}"#)), T0.plus_ms(5), wf, &policy()),
    );
    (d.next, token)
}

pub(in crate::domain) fn claims_of(token: &CallbackToken) -> TokenClaims {
    CallbackToken::parse(token.expose()).unwrap().1
}

/// The reply the live lease's agent would send.
pub(in crate::domain) fn reply_for(task: &TaskRecord, outcome: ReplyOutcome) -> AgentReply {
    AgentReply {
        order_id: task.order_id.clone(),
        step: task.step,
        action: task.action(),
        attempt: task.attempt,
        lease: task.locked_by().expect("a live lease"),
        index: None,
        outcome,
    }
}

pub(in crate::domain) fn ok() -> ReplyOutcome {
    ReplyOutcome::DONE
}

pub(in crate::domain) fn failed(reason: &str) -> ReplyOutcome {
    ReplyOutcome::Failed { reason: reason.into(), detail: None }
}

pub(in crate::domain) fn reply(
    task: &TaskRecord,
    wf: &Workflow,
    outcome: ReplyOutcome,
    now: Timestamp,
) -> Decision {
    checked(task, task.apply_reply(&reply_for(task, outcome), now, wf, &policy()))
}

pub(in crate::domain) fn lapse(task: &TaskRecord, wf: &Workflow, jitter: u64) -> Decision {
    let now = task.deadline().expect("non-terminal");
    checked(task, task.lapse(now, wf, &policy(), jitter))
}

/// Claim and succeed steps (a timer's: sleep, then wake at its time) until the task sits
/// Pending at `step`.
pub(in crate::domain) fn pending_at(wf: &Workflow, step: u32) -> TaskRecord {
    let mut task = new_task(wf);
    for s in 0..step {
        if wf.step(s).is_some_and(Step::is_timer) {
            task = sleep(&task, wf, T0);
            task = checked(&task, task.wake(task.wake_at().unwrap(), wf, &policy())).next;
            continue;
        }
        task = claim(&task, wf, 100 + s as u128, T0);
        task = reply(&task, wf, ok(), T0).next;
    }
    assert_eq!((task.state(), task.step), (ProcessState::Pending, step));
    task
}

pub(in crate::domain) fn alerts(d: &Decision) -> Vec<&OperatorAlert> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Alert(a) => Some(a),
            _ => None,
        })
        .collect()
}

pub(in crate::domain) fn statuses(d: &Decision) -> Vec<OrderStatus> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect()
}

/// A Schedule for a task Pending at a timer step: it sleeps.
pub(in crate::domain) fn sleep(task: &TaskRecord, wf: &Workflow, now: Timestamp) -> TaskRecord {
    let d = checked(task, task.schedule(lease(99), now, wf, &policy()));
    assert_eq!((d.trigger, d.next.state()), (Trigger::Slept, ProcessState::Waiting));
    d.next
}

/// Charge (compensable, answering when to release), a 5 s cool-off, a hold until the
/// charge's `release_at`, then ship (a pivot).
pub(in crate::domain) fn timed() -> Workflow {
    Workflow::new(
        "timed",
        vec![
            Step::compensable("charge", "pay", "refund"),
            Step::timer("cool-off", Wait::for_ms(5_000)),
            Step::timer("hold", Wait::until("$.steps.charge.output.release_at")),
            Step::pivot("ship", "ship"),
        ],
    )
}

/// A timer first, then a compensable step, then a timer last.
pub(in crate::domain) fn timer_first() -> Workflow {
    Workflow::new(
        "timer-first",
        vec![
            Step::timer("wait", Wait::for_ms(1_000)),
            Step::compensable("reserve", "stock", "release"),
            Step::timer("settle", Wait::for_ms(2_000_000)),
        ],
    )
}

/// Lapses (claiming in between when `claim_between`) until the decision is not a retry.
pub(in crate::domain) fn lapse_to_threshold(
    mut task: TaskRecord,
    wf: &Workflow,
    claim_between: bool,
) -> Decision {
    for n in 0.. {
        if claim_between && task.state() == ProcessState::Pending {
            task = claim(&task, wf, 1_000 + n, task.deadline().unwrap());
        }
        let d = lapse(&task, wf, n as u64);
        if d.trigger != Trigger::Retry {
            assert_eq!(d.next.failure_count, task.failure_count + 1);
            return d;
        }
        assert!(alerts(&d).is_empty(), "no alert below the threshold");
        task = d.next;
    }
    unreachable!()
}

/// A workflow with steps that have no compensation in the middle and at the end.
pub(in crate::domain) fn mixed() -> Workflow {
    Workflow::new(
        "mixed",
        vec![
            Step::compensable("a", "a", "undo-a").with_max_failures(5),
            Step::read_only("r", "a"),
            Step::pivot("b", "a"),
            Step::compensable("c", "a", "undo-c").with_max_failures(1),
            Step::pivot("d", "a"),
        ],
    )
}

pub(in crate::domain) const OPS: Actor<'static> = Actor {
    by: "arn:aws:iam::123456789012:user/ops",
    why: "remote fixed",
    seen: None,
    origin: Origin::Operator,
};

pub(in crate::domain) fn act(task: &TaskRecord, wf: &Workflow, act: Act) -> Decision {
    checked(task, task.act(act, OPS, T0.plus_ms(50_000), wf, &policy()))
}

pub(in crate::domain) fn refused(task: &TaskRecord, wf: &Workflow, act: Act) -> String {
    match task.act(act, OPS, T0.plus_ms(50_000), wf, &policy()) {
        Err(r @ Refusal::NotAllowed { .. }) => r.to_string(),
        other => panic!("{act:?} on {:?} was not refused: {other:?}", task.state()),
    }
}

pub(in crate::domain) fn output(json: &str) -> ReplyOutcome {
    ReplyOutcome::Succeeded { output: Some(serde_json::from_str(json).unwrap()) }
}

/// Three-step, but giving up stops in Error instead of undoing.
pub(in crate::domain) fn three_step_failing() -> Workflow {
    Workflow { on_give_up: OnGiveUp::Fail, ..Workflow::three_step() }
}

/// Reserve and charge succeeded (with outputs), ship refused: Error at step 2.
pub(in crate::domain) fn error_at_ship(wf: &Workflow) -> TaskRecord {
    let t = claim(&new_task(wf), wf, 1, T0);
    let t = reply(&t, wf, output(r#"{"reservation":"r-1"}"#), T0).next;
    let t = claim(&t, wf, 2, T0);
    let t = reply(&t, wf, output(r#"{"charge":"c-1"}"#), T0).next;
    let t = claim(&t, wf, 3, T0);
    let d = reply(&t, wf, failed("address rejected"), T0);
    assert_eq!((d.next.state(), d.next.step), (ProcessState::Error, 2));
    d.next
}

/// Three-step, charge refused, then the refund refused too: Error while undoing.
pub(in crate::domain) fn error_while_undoing() -> TaskRecord {
    let wf = Workflow::three_step();
    let t = claim(&pending_at(&wf, 2), &wf, 1, T0);
    let t = reply(&t, &wf, failed("address rejected"), T0).next;
    let t = claim(&t, &wf, 2, T0);
    let d = reply(&t, &wf, failed("refund refused"), T0);
    assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Fail, ProcessState::Error, 1));
    d.next
}

/// check (reads), then stage `reserve-all` of reserve-a and reserve-b (compensable) and
/// notify (a pivot), then ship (a pivot).
pub(in crate::domain) fn parallel() -> Workflow {
    use crate::domain::workflow::{Entry, StageText};
    Workflow::of_entries(
        "parallel",
        vec![
            Entry::Step(Step::read_only("check", "a")),
            Entry::Parallel {
                parallel: StageText {
                    name: "reserve-all".into(),
                    steps: vec![
                        Step::compensable("reserve-a", "wh-a", "release-a"),
                        Step::compensable("reserve-b", "wh-b", "release-b"),
                        Step::read_only("notify", "crm"),
                    ],
                },
            },
            Entry::Step(Step::pivot("ship", "carrier")),
        ],
    )
}

/// The reply branch `step` of a claimed stage would send.
pub(in crate::domain) fn branch_reply(task: &TaskRecord, step: u32, outcome: ReplyOutcome) -> AgentReply {
    let (attempt, _) = task.dispatch_of(step, None);
    AgentReply { step, attempt, ..reply_for(task, outcome) }
}
