//! Parallel stages through the four handlers on the embedded backend: the claim's
//! dispatches, the branch replies racing in one scheduler batch, the join, and the undo
//! of exactly the branches that may have taken effect.

mod common;

use common::*;
use sas::domain::workflow::{Entry, StageText};
use sas::domain::{Action, OrderStatus, ProcessState, Step, Workflow, Workflows};
use sas::ports::Metric;

const FLOW: &str = "fan-out";

/// check (reads), stage `reserve-all` (reserve-a and reserve-b, compensable; screen,
/// reads), then ship (a pivot).
fn harness() -> Harness {
    let wf = Workflow::of_entries(
        FLOW,
        vec![
            Entry::Step(Step::read_only("check", "inventory")),
            Entry::Parallel {
                parallel: StageText {
                    name: "reserve-all".into(),
                    steps: vec![
                        Step::compensable("reserve-a", "inventory", "release-a"),
                        Step::compensable("reserve-b", "payment", "release-b"),
                        Step::read_only("screen", "shipping"),
                    ],
                },
            },
            Entry::Step(Step::pivot("ship", "shipping")),
        ],
    );
    let mut all = Workflows::builtin().all().to_vec();
    all.push(wf);
    Harness::with_workflows(policy(), Workflows::new(all))
}

/// Submits one order and runs it to its stage's dispatch: the check's request and reply
/// go through, then the claim of the stage.
async fn to_the_stage(h: &Harness) {
    h.submit("o-1", FLOW).await;
    all_ok(h.pump_orders().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_agent().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    all_ok(h.pump_scheduler().await, 1);
    assert_eq!((h.task("o-1").state(), h.task("o-1").step), (ProcessState::Processing, 1));
}

#[tokio::test]
async fn branches_are_dispatched_together_and_their_racing_replies_all_land() {
    let h = harness();
    to_the_stage(&h).await;
    assert_eq!(h.depth(AGENT), 3, "one request per branch");
    h.remote.then([
        Script::Answer(r#"{"a":1}"#.into()),
        Script::Answer(r#"{"b":2}"#.into()),
        Script::Answer(r#"{"ok":true}"#.into()),
    ]);
    all_ok(h.pump_agent().await, 3);
    let calls = h.remote.calls();
    let keys: Vec<&str> = calls.iter().map(|c| c.key.0.as_str()).collect();
    assert_eq!(keys, ["o-1:0:do", "o-1:1:do", "o-1:2:do", "o-1:3:do"]);
    // A branch is handed what came before its stage, not its siblings' answers.
    assert!(calls[1..].iter().all(|c| c.outputs == "{}"), "{:?}", calls);

    // The three replies arrive in one batch, handled at once: they race on the record.
    let report = h.batch(SCHEDULER, SCHEDULER_DLQ, |m| h.scheduler.handle(m)).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let task = h.task("o-1");
    assert_eq!((task.state(), task.step, task.stage()), (ProcessState::Pending, 4, None));
    assert_eq!(task.outputs.keys().collect::<Vec<_>>(), ["reserve-a", "reserve-b", "screen"]);

    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    let ship = h.remote.calls().pop().unwrap();
    assert_eq!(ship.step_name, "ship");
    assert!(ship.outputs.contains("reserve-a") && ship.outputs.contains("screen"), "{}", ship.outputs);
    assert_eq!(h.count(Metric::StepSucceeded), 5);
    let completed = h.statuses().iter().filter(|s| s.status == OrderStatus::StepCompleted).count();
    assert_eq!(completed, 4, "the check and each branch");
    h.finish();
}

#[tokio::test]
async fn a_refused_branch_undoes_only_the_branches_that_may_have_taken_effect() {
    let h = harness();
    to_the_stage(&h).await;
    // reserve-a succeeds, reserve-b is refused, screen (a read) succeeds.
    h.remote.then([Script::Ok, Script::Permanent("no stock"), Script::Ok]);
    all_ok(h.pump_agent().await, 3);
    h.run_until_quiet().await;
    // screen was still out when reserve-b's refusal stopped the stage: its reply is
    // fenced off, and the undo waits until its complete-by and the reply grace.
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Compensating);
    let hold = task.hold_until().expect("held for the branch still out");
    assert_eq!(h.count(Metric::StaleReply), 1, "screen's reply");
    h.at(hold.plus_ms(policy().reply_grace_ms));
    h.run_until_quiet().await;
    let task = h.task("o-1");
    assert_eq!(task.state(), ProcessState::Compensated);
    let undone: Vec<(u32, Action)> =
        h.remote.steps().into_iter().filter(|(_, action)| *action == Action::Undo).collect();
    assert_eq!(undone, [(1, Action::Undo)], "release-a only: reserve-b had no effect, screen only read");
    assert!(h.statuses().iter().any(|s| s.status == OrderStatus::Compensated));
    h.finish();
}

/// The stage harness with `payment` (reserve-b's agent) at most 1 call at once.
fn payment_limited() -> Harness {
    use sas::domain::gate::Limits;
    use sas::handlers::{Agent, AgentSettings, Scheduler, Submission, Supervisor};
    let mut h = harness();
    let one = Limits { max_in_flight: Some(1), ..Limits::default() };
    h.settings.topology.limits.insert("payment".into(), one);
    h.scheduler = Scheduler::new(h.deps.clone(), h.settings.clone());
    h.supervisor = Supervisor::new(h.deps.clone(), h.settings.clone());
    h.submission = Submission::new(h.deps.clone(), h.settings.clone());
    h.agent = Agent::new(
        h.agent.deps.clone(),
        AgentSettings { limited: true, ..AgentSettings::default() },
        h.settings.workflows.clone(),
    );
    h
}

/// A limited branch's service answering 429 is waited out in place, within its
/// complete-by: a branch cannot go back to its gate alone (the stage's one lease).
#[tokio::test]
async fn a_limited_branch_answered_429_waits_in_place() {
    let h = payment_limited();
    to_the_stage(&h).await;
    assert_eq!(h.depth(AGENT), 3);
    h.remote.then([Script::Ok, Script::Busy(200), Script::Ok, Script::Ok]);
    all_ok(h.pump_agent().await, 3);
    let b: Vec<Script> =
        h.remote.calls().into_iter().filter(|c| c.step_name == "reserve-b").map(|c| c.outcome).collect();
    assert_eq!(b, [Script::Busy(200), Script::Ok], "called again after the Retry-After");
    h.run_until_quiet().await;
    assert_eq!(h.task("o-1").state(), ProcessState::Processed);
    assert_eq!((h.count(Metric::Throttled), h.depth(SCHEDULER_DLQ)), (0, 0), "no throttled reply");
}

/// A branch may call a limited agent: the stage's claim takes that branch's place before
/// it dispatches anything, a second order's stage waits its turn with a ticket (nothing of
/// it dispatched, no failure counted), and the first's branch reply hands the place over.
#[tokio::test]
async fn a_stage_with_a_limited_branch_waits_its_turn_as_a_whole() {
    let h = payment_limited();
    for id in ["o-1", "o-2"] {
        h.submit(id, FLOW).await;
    }
    all_ok(h.pump_orders().await, 2);
    all_ok(h.pump_scheduler().await, 2);
    all_ok(h.pump_agent().await, 2);
    // The checks' replies, then the stages' claims: o-1 takes payment's one place.
    all_ok(h.pump_scheduler().await, 2);
    all_ok(h.pump_scheduler().await, 2);
    let (first, second) = (h.task("o-1"), h.task("o-2"));
    assert_eq!((first.state(), first.step), (ProcessState::Processing, 1));
    assert_eq!((second.state(), second.step), (ProcessState::Pending, 1));
    assert_eq!(second.queued().map(|q| q.agent.as_str()), Some("payment"));
    assert_eq!(h.depth(AGENT), 3, "o-1's three branches only");
    let gate = h.store.peek_gate("payment").expect("payment's gate");
    let o1 = first.stage().unwrap().branch(2).unwrap().attempt;
    assert_eq!(gate.holds.len(), 1);
    assert!(gate.holds[0].holder.starts_with(&format!("o-1#{o1}.")), "{:?}", gate.holds);

    // o-1's branches answer; reserve-b's reply hands payment's place to o-2's stage.
    all_ok(h.pump_agent().await, 3);
    h.run_until_quiet().await;
    for id in ["o-1", "o-2"] {
        assert_eq!(h.task(id).state(), ProcessState::Processed, "{id}");
        assert_eq!(h.task(id).failure_count, 0, "{id}: waiting counts no failure");
    }
    let payments: Vec<String> =
        h.remote.calls().iter().filter(|c| c.step_name == "reserve-b").map(|c| c.key.0.clone()).collect();
    assert_eq!(payments, ["o-1:2:do", "o-2:2:do"]);
    assert!(h.store.peek_gate("payment").is_none_or(|g| g.holds.is_empty()), "every place given back");
    assert_eq!(h.count(Metric::CapacityQueued), 1);
}
