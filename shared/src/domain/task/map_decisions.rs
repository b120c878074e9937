//! Tests only: a map step's decisions end to end: its claim and cap, its items' replies,
//! tolerated refusals, the give-up and the undo of exactly the items that may have taken
//! effect, lapses, pause, cancel and resubmit.

use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::map::MapStep;
use crate::domain::messages::ReplyOutcome;
use crate::domain::task::fixtures::*;
use crate::domain::task::{Act, Decision, Effect, Outcome, Refusal, StaleReason, TaskRecord};
use crate::domain::workflow::{Action, Entry, MapText, Step, Workflow};

/// quote (a read whose output lists the lines), then the map over them, then a pivot.
fn mapped(lines: usize, cap: u32, tolerated: u32) -> (Workflow, TaskRecord) {
    let wf = Workflow::of_entries(
        "mapped",
        vec![
            Entry::Step(Step::read_only("quote", "q")),
            Entry::Map {
                map: MapText {
                    name: "reserve-lines".into(),
                    items: "$.steps.quote.output.lines".into(),
                    max_concurrency: cap,
                    tolerated_failures: tolerated,
                    step: Step::compensable("reserve", "wh", "release"),
                },
            },
            Entry::Step(Step::pivot("ship", "carrier")),
        ],
    );
    let quoted = claim(&new_task(&wf), &wf, 1, T0);
    let list: Vec<String> = (0..lines).map(|i| format!("\"l{i}\"")).collect();
    let at_map = reply(&quoted, &wf, output(&format!(r#"{{"lines": [{}]}}"#, list.join(","))), T0).next;
    assert_eq!((at_map.state(), at_map.step), (ProcessState::Pending, 1));
    (wf, at_map)
}

fn items_of(d: &Decision) -> Vec<u32> {
    d.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dispatch { item, .. } => *item,
            _ => None,
        })
        .collect()
}

fn item_reply(t: &TaskRecord, wf: &Workflow, index: u32, outcome: ReplyOutcome) -> Decision {
    checked(t, t.apply_reply(&reply_of(t, index, outcome), T0.plus_ms(10), wf, &policy()))
}

fn reply_of(t: &TaskRecord, index: u32, outcome: ReplyOutcome) -> crate::domain::messages::AgentReply {
    let (attempt, _) = t.dispatch_of(t.step, Some(index));
    crate::domain::messages::AgentReply { index: Some(index), attempt, step: t.step, ..reply_for(t, outcome) }
}

fn map_step(wf: &Workflow) -> &MapStep {
    &wf.maps[0]
}

/// Claims and answers the undo of each item in turn, newest first: the items undone.
fn undo_all(mut t: TaskRecord, wf: &Workflow) -> (TaskRecord, Vec<u32>) {
    let mut undone = Vec::new();
    while t.state() == ProcessState::Compensating && t.step == map_step(wf).at {
        let now = t.hold_until().map_or(T0, |h| h.plus_ms(policy().reply_grace_ms)).plus_ms(1);
        let d = checked(&t, t.claim(lease(900 + undone.len() as u128), now, wf, &policy()));
        let [Effect::Dispatch { action: Action::Undo, item: Some(i), .. }] = d.effects[..] else {
            panic!("{:?}", d.effects);
        };
        undone.push(i);
        let claimed = d.next;
        let answer = reply_of(&claimed, i, ok());
        t = checked(&claimed, claimed.apply_reply(&answer, now, wf, &policy())).next;
    }
    (t, undone)
}

#[test]
fn a_maps_claim_dispatches_up_to_its_cap_and_each_reply_the_next_until_all_are_done() {
    let (wf, t) = mapped(5, 2, 0);
    let d = checked(&t, t.claim(lease(2), T0, &wf, &policy()));
    assert_eq!((d.trigger, items_of(&d)), (Trigger::Claimed, vec![0, 1]));
    let mut t = d.next;
    let run = t.stage().unwrap();
    assert!(run.map && run.in_flight() == 2 && run.branches.len() == 5);
    assert_ne!(t.dispatch_of(1, Some(0)).0, t.dispatch_of(1, Some(1)).0, "each item its own attempt");
    for (i, next) in [(1, Some(2)), (0, Some(3)), (2, Some(4)), (3, None)] {
        let d = item_reply(&t, &wf, i, output(&format!(r#"{{"r": {i}}}"#)));
        assert_eq!((d.trigger, items_of(&d)), (Trigger::BranchDone, next.into_iter().collect::<Vec<_>>()));
        assert!(d.next.stage().unwrap().in_flight() <= 2, "the cap holds");
        t = d.next;
    }
    let d = item_reply(&t, &wf, 4, ok());
    assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Advanced, ProcessState::Pending, 2));
    assert_eq!(d.next.outputs["reserve-lines"].as_str(), r#"[{"r":0},{"r":1},{"r":2},{"r":3},null]"#);
    assert_eq!(d.next.stage(), None);
}

#[test]
fn an_items_reply_is_fenced_on_its_own_index_attempt_and_complete_by() {
    let (wf, t) = mapped(3, 2, 0);
    let t = claim(&t, &wf, 2, T0);
    assert_eq!(t.fence(&reply_of(&t, 0, ok()), T0), Ok(()));
    let unsent = reply_of(&t, 2, ok());
    assert!(matches!(t.fence(&unsent, T0), Err(StaleReason::OtherAttempt { current: 0, .. })), "never sent");
    let no_index = crate::domain::messages::AgentReply { index: None, ..reply_of(&t, 0, ok()) };
    assert!(matches!(t.fence(&no_index, T0), Err(StaleReason::OtherStep { .. })));
    let mut swapped = reply_of(&t, 0, ok());
    swapped.attempt = t.dispatch_of(1, Some(1)).0;
    assert!(matches!(t.fence(&swapped, T0), Err(StaleReason::OtherAttempt { .. })));
    let done = item_reply(&t, &wf, 0, ok()).next;
    let again = done.apply_reply(&reply_of(&t, 0, ok()), T0.plus_ms(11), &wf, &policy());
    assert!(matches!(again, Err(Refusal::StaleReply(_))), "a duplicate changes nothing: {again:?}");
}

#[test]
fn refusals_within_tolerance_leave_null_outputs_and_are_passed_over_by_a_later_undo() {
    let (mut wf, t) = mapped(3, 3, 1);
    wf.steps[2] = Step::compensable("ship", "carrier", "recall");
    let t = claim(&t, &wf, 2, T0);
    let t = item_reply(&t, &wf, 1, failed("no stock")).next;
    let t = item_reply(&t, &wf, 0, output(r#"{"id": "a"}"#)).next;
    let d = item_reply(&t, &wf, 2, output(r#"{"id": "c"}"#));
    assert_eq!((d.trigger, d.next.step), (Trigger::Advanced, 2));
    assert_eq!(d.next.outputs["reserve-lines"].as_str(), r#"[{"id":"a"},null,{"id":"c"}]"#);
    assert_eq!(d.next.refused_items, [1]);
    // ship is refused: the map's items are undone, newest first, the refused one passed over.
    let shipping = claim(&d.next, &wf, 3, T0);
    let undoing = reply(&shipping, &wf, failed("no truck"), T0).next;
    assert_eq!((undoing.state(), undoing.step), (ProcessState::Compensating, 1));
    let (end, undone) = undo_all(undoing, &wf);
    assert_eq!(undone, [2, 0]);
    assert_eq!(end.state(), ProcessState::Compensated);
}

#[test]
fn one_refusal_too_many_gives_up_and_undoes_exactly_the_items_that_may_have_taken_effect() {
    let (wf, t) = mapped(6, 3, 1);
    let t = claim(&t, &wf, 2, T0);
    let t = item_reply(&t, &wf, 0, ok()).next; // item 3 dispatched
    let t = item_reply(&t, &wf, 1, failed("no")).next; // tolerated; item 4 dispatched
    let before = t.clone();
    let d = item_reply(&t, &wf, 3, failed("no"));
    assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Undo, ProcessState::Compensating, 1));
    // Items 2 and 4 are still out: the undo waits for their complete-by.
    assert_eq!(d.next.hold_until(), before.complete_by());
    let run = d.next.stage().unwrap();
    assert!(run.branches.iter().all(|b| !b.in_flight()));
    let (end, undone) = undo_all(d.next, &wf);
    assert_eq!(undone, [4, 2, 0], "in doubt or succeeded; never the refused or the unsent");
    assert_eq!(end.state(), ProcessState::Compensated);
}

#[test]
fn an_empty_list_is_done_at_its_claim_and_an_unreadable_one_gives_up_with_nothing_sent() {
    let (wf, t) = mapped(0, 2, 0);
    let d = checked(&t, t.claim(lease(2), T0, &wf, &policy()));
    assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Advanced, ProcessState::Pending, 2));
    assert_eq!(d.next.outputs["reserve-lines"].as_str(), "[]");
    assert!(items_of(&d).is_empty());

    let (wf, _) = mapped(1, 2, 0);
    let quoted = claim(&new_task(&wf), &wf, 1, T0);
    let t = reply(&quoted, &wf, output(r#"{"lines": 3}"#), T0).next;
    let d = checked(&t, t.claim(lease(2), T0, &wf, &policy()));
    assert_eq!((d.trigger, d.next.state()), (Trigger::Undone, ProcessState::Compensated));
    assert!(d.next.last_error.as_deref().unwrap().contains("is not an array"), "{:?}", d.next.last_error);
}

#[test]
fn a_lapse_counts_against_the_items_in_flight_and_the_retry_sends_them_again() {
    let (wf, t) = mapped(4, 2, 0);
    let t = claim(&t, &wf, 2, T0);
    let t = item_reply(&t, &wf, 0, ok()).next; // items 1 and 2 in flight
    let d = lapse(&t, &wf, 0);
    assert_eq!((d.trigger, d.next.state()), (Trigger::Retry, ProcessState::Pending));
    let run = d.next.stage().unwrap();
    assert_eq!(run.branches.iter().map(|b| b.failures).collect::<Vec<_>>(), [0, 1, 1, 0]);
    let again = checked(&d.next, d.next.claim(lease(3), d.next.deadline().unwrap(), &wf, &policy()));
    assert_eq!(items_of(&again), [1, 2]);
}

#[test]
fn a_paused_map_sends_no_new_item_until_resumed() {
    let (wf, t) = mapped(4, 2, 0);
    let t = claim(&t, &wf, 2, T0);
    let t = act(&t, &wf, Act::Pause).next;
    let d = item_reply(&t, &wf, 0, ok());
    assert!(items_of(&d).is_empty());
    let t = item_reply(&d.next, &wf, 1, ok()).next;
    assert_eq!(t.stage().unwrap().in_flight(), 0);
    let d = act(&t, &wf, Act::Resume);
    assert_eq!(items_of(&d), [2, 3]);
    // Left paused past its deadline with nothing out, it waits for the resume, no failure counted.
    let d = lapse(&t, &wf, 0);
    assert_eq!((d.trigger, d.next.state(), d.next.step_failures), (Trigger::Retry, ProcessState::Pending, 0));
    assert!(d.next.parked());
}

#[test]
fn a_cancel_mid_map_undoes_its_items_after_their_complete_by() {
    let (wf, t) = mapped(3, 2, 0);
    let t = claim(&t, &wf, 2, T0);
    let t = item_reply(&t, &wf, 0, ok()).next;
    let d = act(&t, &wf, Act::Cancel);
    assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Cancel, ProcessState::Compensating, 1));
    assert_eq!(d.next.hold_until(), t.complete_by());
    let (end, undone) = undo_all(d.next, &wf);
    assert_eq!(undone, [2, 1, 0]);
    assert_eq!(end.state(), ProcessState::Compensated);
}

#[test]
fn a_resubmit_at_the_map_keeps_its_succeeded_items_and_runs_the_refused_again() {
    let (mut wf, t) = mapped(3, 3, 0);
    wf.on_give_up = crate::domain::workflow::OnGiveUp::Fail;
    let t = claim(&t, &wf, 2, T0);
    let t = item_reply(&t, &wf, 0, ok()).next;
    let t = item_reply(&t, &wf, 2, ok()).next;
    let error = item_reply(&t, &wf, 1, failed("no")).next;
    assert_eq!(error.state(), ProcessState::Error);
    let d = act(&error, &wf, Act::Resubmit { from_step: None });
    let run = d.next.stage().unwrap();
    assert_eq!(run.branches[1].outcome, Outcome::Open);
    assert_eq!(run.branches[1].dispatches, 0, "a refused item had no effect");
    let again = checked(
        &d.next,
        d.next.claim(lease(5), d.next.hold_until().unwrap_or(T0).plus_ms(10_000), &wf, &policy()),
    );
    assert_eq!(items_of(&again), [1]);
}

#[test]
fn a_map_round_trips_through_its_definition_text() {
    let (wf, _) = mapped(1, 2, 1);
    let text = serde_json::to_string(&wf).unwrap();
    assert!(text.contains(r#"{"map":{"name":"reserve-lines","items":"$.steps.quote.output.lines","max_concurrency":2,"tolerated_failures":1,"step":{"name":"reserve""#), "{text}");
    assert_eq!(serde_json::from_str::<Workflow>(&text).unwrap(), wf);
    assert_eq!(wf.map_at(1).map(|m| m.at), Some(1));
    assert_eq!(wf.after(1), 2);
}

#[test]
fn an_item_whose_output_would_take_the_maps_outputs_past_their_bound_gives_up_in_doubt() {
    let (wf, t) = mapped(17, 17, 0);
    let mut t = claim(&t, &wf, 2, T0);
    let big = format!("\"{}\"", "x".repeat(4_000));
    for i in 0..16 {
        t = item_reply(&t, &wf, i, output(&big)).next;
    }
    let d = item_reply(&t, &wf, 16, output(&big));
    assert_eq!((d.trigger, d.next.state()), (Trigger::Undo, ProcessState::Compensating));
    assert!(
        d.next.last_error.as_deref().unwrap().contains("the map's outputs together would be"),
        "{:?}",
        d.next.last_error
    );
    // Every item may have taken effect, the last one too: all seventeen are undone.
    let (end, undone) = undo_all(d.next, &wf);
    assert_eq!(undone, (0..17).rev().collect::<Vec<u32>>());
    assert_eq!(end.state(), ProcessState::Compensated);
}

/// A map over an agent with limits: each item is claimed through the agent's gate, one at
/// a time; its answer hands the lease back (`NextItem`), and the place each claim holds is
/// the one its item's reply frees.
#[test]
fn a_gated_map_claims_each_item_through_the_gate_one_at_a_time() {
    let (mut wf, mut t) = mapped(3, 5, 1);
    wf.gate_maps(|agent| agent == "wh");
    assert!(map_step(&wf).gated);
    let limits: std::collections::BTreeMap<_, _> =
        [("wh".to_owned(), crate::domain::gate::Limits { max_in_flight: Some(2), ..Default::default() })]
            .into();
    let mut holders = Vec::new();
    for (i, answer) in [(0, ok()), (1, failed("no stock")), (2, output(r#"{"id": "c"}"#))] {
        let d = checked(&t, t.claim(lease(10 + i as u128), T0, &wf, &policy()));
        assert_eq!((d.trigger, items_of(&d)), (Trigger::Claimed, vec![i]), "one item per claim, in order");
        let place = crate::domain::task::place_of(&limits, &policy(), &wf, &d).expect("a place in the gate");
        assert_eq!(place.attempt, d.next.dispatch_of(1, Some(i)).0, "held under the item's attempt");
        let answer = reply_of(&d.next, i, answer);
        let freed = crate::domain::task::freed_by(&answer, &wf, &d.next.order, &limits).unwrap();
        assert_eq!(freed.holder, place.holder, "the reply frees the place its claim took");
        holders.push(place.holder);
        let d = checked(&d.next, d.next.apply_reply(&answer, T0.plus_ms(10), &wf, &policy()));
        if i < 2 {
            assert_eq!(
                (d.trigger, d.next.state(), d.next.locked_by()),
                (Trigger::NextItem, ProcessState::Pending, None)
            );
            assert_eq!(d.effects, vec![Effect::Schedule { delay_ms: 0 }]);
            assert_eq!(d.next.stage().map(|r| r.in_flight()), Some(0));
        } else {
            assert_eq!((d.trigger, d.next.step), (Trigger::Advanced, 2));
            assert_eq!(d.next.outputs["reserve-lines"].as_str(), r#"[null,null,{"id":"c"}]"#);
        }
        t = d.next;
    }
    holders.dedup();
    assert_eq!(holders.len(), 3, "each item its own place");
}
