//! Tests only: every decision, the pipeline's and the operator's, against the transition
//! table and the record's invariants, one by one and in random sequences.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::operator::{Actor, Origin};
use crate::domain::callback::{Callback, CallbackToken, Completion};
use crate::domain::ids::{LeaseToken, Timestamp};
use crate::domain::lifecycle::{self, ProcessState, Trigger};
use crate::domain::messages::{AgentReply, ReplyOutcome};
use crate::domain::workflow::{Action, Step, StepKind, Workflow};

use super::fixtures::*;
use super::{Act, Cause, Decision, Effect, Refusal, TaskRecord};

/// Every row of the transition table is made by some decision of this module.
#[test]
fn every_row_of_the_table_is_a_decision() {
    let mut made = BTreeSet::new();
    let mut note = |before: &TaskRecord, d: &Decision| {
        made.insert((before.state(), d.trigger, d.next.state()));
    };
    let three = Workflow::three_step();
    let single = Workflow::single_step();
    let mixed = mixed();
    let pending = new_task(&three);
    let processing = claim(&pending, &three, 1, T0);
    let charging = claim(&pending_at(&three, 1), &three, 2, T0);
    let shipping = claim(&pending_at(&three, 2), &three, 3, T0);
    let undoing = claim(&reply(&shipping, &three, failed("no"), T0).next, &three, 4, T0);
    let undoing_last = reply(&undoing, &three, ok(), T0).next;
    let undoing_last = claim(&undoing_last, &three, 5, T0);
    let compensating = reply(&charging, &three, failed("no"), T0).next;
    let single_pending = new_task(&single);
    let single_processing = claim(&single_pending, &single, 6, T0);
    let mixed_c = claim(&pending_at(&mixed, 3), &mixed, 7, T0);
    let mut pending_charge_in_doubt = lapse(&charging, &three, 0).next;
    pending_charge_in_doubt.step_failures = 2;
    let mut pending_ship_in_doubt = lapse(&shipping, &three, 0).next;
    pending_ship_in_doubt.step_failures = 2;
    let mut pending_first = new_task(&three);
    pending_first.step_failures = 2;
    let mut pending_single = new_task(&single);
    pending_single.step_failures = 2;

    let cases: Vec<(&TaskRecord, Decision)> = vec![
        (&pending, checked(&pending, pending.claim(lease(9), T0, &three, &policy()))),
        (&pending, lapse(&pending, &three, 0)),
        (&pending_single, lapse(&pending_single, &single, 0)),
        (&pending_ship_in_doubt, lapse(&pending_ship_in_doubt, &three, 0)),
        (&pending_charge_in_doubt, lapse(&pending_charge_in_doubt, &three, 0)),
        (&pending_first, lapse(&pending_first, &three, 0)),
        (&processing, reply(&processing, &three, ok(), T0)),
        (&single_processing, reply(&single_processing, &single, ok(), T0)),
        (&processing, lapse(&processing, &three, 0)),
        (&single_processing, reply(&single_processing, &single, failed("no"), T0)),
        (&mixed_c, reply(&mixed_c, &mixed, failed("no"), T0)),
        (&charging, reply(&charging, &three, failed("no"), T0)),
        (&processing, reply(&processing, &three, failed("no"), T0)),
        (&compensating, checked(&compensating, compensating.claim(lease(9), T0, &three, &policy()))),
        (&undoing, reply(&undoing, &three, ok(), T0)),
        (&undoing_last, reply(&undoing_last, &three, ok(), T0)),
        (&undoing, lapse(&undoing, &three, 0)),
        (&undoing, reply(&undoing, &three, failed("no"), T0)),
    ];
    let failing = three_step_failing();
    let error_at_ship = error_at_ship(&failing);
    let cancel_pending = pending_at(&three, 2);
    let single_new = new_task(&single);
    let reads_first =
        Workflow::new("reads-first", vec![Step::read_only("look", "a"), Step::pivot("buy", "a")]);
    let looking = claim(&new_task(&reads_first), &reads_first, 8, T0);
    let operator_cases: Vec<(&TaskRecord, Decision)> = vec![
        (&error_at_ship, act(&error_at_ship, &failing, Act::Resubmit { from_step: None })),
        (&error_at_ship, act(&error_at_ship, &failing, Act::Compensate)),
        (&cancel_pending, act(&cancel_pending, &three, Act::Cancel)),
        (&charging, act(&charging, &three, Act::Cancel)),
        (&single_new, act(&single_new, &single, Act::Cancel)),
        (&processing, act(&processing, &three, Act::Cancel)),
        (&looking, act(&looking, &reads_first, Act::Cancel)),
    ];
    // Timers: sleep, wake on (or at the end), and a cancel while waiting.
    let timed = timed();
    let first = timer_first();
    let cooling = pending_at(&timed, 1);
    let cool_sleeping = sleep(&cooling, &timed, T0);
    let first_sleeping = sleep(&new_task(&first), &first, T0);
    let last_sleeping = sleep(&pending_at(&first, 2), &first, T0);
    let at = |t: &TaskRecord| t.wake_at().unwrap();
    let timer_cases: Vec<(&TaskRecord, Decision)> = vec![
        (&cooling, checked(&cooling, cooling.schedule(lease(10), T0, &timed, &policy()))),
        (
            &cool_sleeping,
            checked(&cool_sleeping, cool_sleeping.schedule(lease(11), at(&cool_sleeping), &timed, &policy())),
        ),
        (
            &last_sleeping,
            checked(&last_sleeping, last_sleeping.recover(at(&last_sleeping), &first, &policy(), 0)),
        ),
        (&cool_sleeping, act(&cool_sleeping, &timed, Act::Cancel)),
        (&first_sleeping, act(&first_sleeping, &first, Act::Cancel)),
    ];
    // Callbacks: started, heartbeats while claimed and waiting, completed, failed with each
    // give-up, and lapsed.
    let approval = approval();
    let (claimed_cb, token) = claimed_callback(&approval, 1, T0);
    let (waiting_cb, _) = started_callback(&approval, 1);
    let claims = claims_of(&token);
    let beat = Completion::Heartbeat;
    let done = Completion::Success { output: None };
    let no = Completion::Failure { reason: "declined".into() };
    let complete = |t: &TaskRecord, wf: &Workflow, c: &Completion| {
        checked(t, t.complete(&token, &claims, c, T0.plus_ms(10), wf, &policy()))
    };
    // A heartbeat is written once the floor (1 s here) has passed since the claim.
    let heartbeat = |t: &TaskRecord| {
        checked(t, t.complete(&token, &claims, &beat, T0.plus_ms(1_500), &approval, &policy()))
    };
    // Nothing compensates: a refusal ends in Error.
    let lone = Workflow::new(
        "lone",
        vec![
            Step::read_only("approve", "a").with_callback(Callback { timeout_ms: 5_000, heartbeat_ms: None }),
        ],
    );
    let (lone_waiting, lone_token) = started_callback(&lone, 0);
    // A pivot before it: only forward.
    let after_pivot =
        Workflow::new("after-pivot", vec![Step::pivot("charge", "a"), approval.steps[1].clone()]);
    let (pivot_waiting, _) = started_callback(&after_pivot, 1);
    // Only a read before it: a refusal leaves nothing to undo.
    let after_read =
        Workflow::new("after-read", vec![Step::read_only("look", "a"), approval.steps[1].clone()]);
    let (read_waiting, _) = started_callback(&after_read, 1);
    let lone_done = checked(
        &lone_waiting,
        lone_waiting.complete(&lone_token, &claims_of(&lone_token), &done, T0.plus_ms(10), &lone, &policy()),
    );
    let due = waiting_cb.deadline().unwrap();
    let callback_cases: Vec<(&TaskRecord, Decision)> = vec![
        (&claimed_cb, reply(&claimed_cb, &approval, ok(), T0)),
        (&claimed_cb, heartbeat(&claimed_cb)),
        (&waiting_cb, heartbeat(&waiting_cb)),
        (&waiting_cb, complete(&waiting_cb, &approval, &done)),
        (&lone_waiting, lone_done),
        (&waiting_cb, checked(&waiting_cb, waiting_cb.recover(due, &approval, &policy(), 0))),
        (&lone_waiting, complete_with(&lone_waiting, &lone, &lone_token, &no)),
        (&pivot_waiting, complete(&pivot_waiting, &after_pivot, &no)),
        (&waiting_cb, complete(&waiting_cb, &approval, &no)),
        (&read_waiting, complete(&read_waiting, &after_read, &no)),
    ];
    // Pause and resume every live state.
    let live: [&TaskRecord; 4] = [&pending, &processing, &cool_sleeping, &undoing];
    let wf_of = |t: &TaskRecord| if t.workflow == timed.name { timed.clone() } else { three.clone() };
    let paused: Vec<TaskRecord> = live.iter().map(|t| act(t, &wf_of(t), Act::Pause).next).collect();
    let mut pause_cases: Vec<(&TaskRecord, Decision)> = Vec::new();
    for (t, p) in live.into_iter().zip(&paused) {
        pause_cases.push((t, act(t, &wf_of(t), Act::Pause)));
        pause_cases.push((p, act(p, &wf_of(p), Act::Resume)));
    }
    // Parallel stages: a branch's success while others run.
    let parallel = parallel();
    let at_stage = claim(
        &reply(&claim(&new_task(&parallel), &parallel, 12, T0), &parallel, ok(), T0).next,
        &parallel,
        13,
        T0,
    );
    let branch_done =
        checked(&at_stage, at_stage.apply_reply(&branch_reply(&at_stage, 2, ok()), T0, &parallel, &policy()));
    let stage_cases: Vec<(&TaskRecord, Decision)> = vec![(&at_stage, branch_done)];
    // Map steps: one over no items is done at its claim (then on, or the end).
    // And a gated one's first item answered hands the lease back for the next one's claim.
    let at_map = |then: Option<Step>, lines: &str| {
        use crate::domain::workflow::{Entry, MapText};
        let map = MapText {
            name: "each".into(),
            items: "$.steps.quote.output.lines".into(),
            max_concurrency: 2,
            tolerated_failures: 0,
            step: Step::compensable("reserve", "wh", "release"),
        };
        let mut entries = vec![Entry::Step(Step::read_only("quote", "q")), Entry::Map { map }];
        entries.extend(then.map(Entry::Step));
        let mut wf = Workflow::of_entries("mapped", entries);
        wf.gate_maps(|agent| agent == "wh");
        let quoted = claim(&new_task(&wf), &wf, 14, T0);
        let at_map = reply(&quoted, &wf, output(&format!(r#"{{"lines": {lines}}}"#)), T0).next;
        let d = checked(&at_map, at_map.claim(lease(15), T0, &wf, &policy()));
        (wf, at_map, d)
    };
    let (_, map_then_ship, map_advanced) = at_map(Some(Step::pivot("ship", "carrier")), "[]");
    let (_, map_last, map_finished) = at_map(None, "[]");
    let (gated, _, first_item) = at_map(None, r#"["a", "b"]"#);
    let item_claimed = first_item.next;
    let answer = AgentReply {
        index: Some(0),
        attempt: item_claimed.dispatch_of(1, Some(0)).0,
        ..reply_for(&item_claimed, ok())
    };
    let next_item = checked(&item_claimed, item_claimed.apply_reply(&answer, T0, &gated, &policy()));
    let stage_cases: Vec<(&TaskRecord, Decision)> = stage_cases
        .into_iter()
        .chain([(&map_then_ship, map_advanced), (&map_last, map_finished), (&item_claimed, next_item)])
        .collect();
    // Flow control: waiting for a place before a forward claim and a compensation's, and a
    // remote's "too many requests" to each.
    let throttled = || ReplyOutcome::Throttled { retry_after_ms: 1_000 };
    let capacity_cases: Vec<(&TaskRecord, Decision)> = vec![
        (&pending, checked(&pending, pending.queue("a", 0, T0, &policy()))),
        (&pending, checked(&pending, pending.defer(T0, &policy()))),
        (&compensating, checked(&compensating, compensating.queue("a", 1, T0, &policy()))),
        (&processing, reply(&processing, &three, throttled(), T0)),
        (&undoing, reply(&undoing, &three, throttled(), T0)),
    ];
    let cases: Vec<_> = cases
        .into_iter()
        .chain(stage_cases)
        .chain(capacity_cases)
        .chain(operator_cases)
        .chain(timer_cases)
        .chain(callback_cases)
        .chain(pause_cases)
        .collect();
    for (before, d) in &cases {
        note(before, d);
    }
    let table: BTreeSet<_> = lifecycle::TRANSITIONS.iter().copied().collect();
    assert_eq!(made, table, "rows made by decisions vs the table");
}

fn complete_with(t: &TaskRecord, wf: &Workflow, token: &CallbackToken, c: &Completion) -> Decision {
    checked(t, t.complete(token, &claims_of(token), c, T0.plus_ms(10), wf, &policy()))
}

#[derive(Debug, Clone, Copy)]
enum Tamper {
    None,
    Lease,
    Attempt,
    Step,
    Action,
}

#[derive(Debug, Clone)]
enum Event {
    Advance(u64),
    Claim,
    /// Reply as the agent of the latest dispatch (`None`) or of dispatch number `pick`
    /// (mod the dispatches so far) would.
    Reply {
        pick: Option<usize>,
        tamper: Tamper,
        ok: bool,
    },
    Lapse {
        jitter: u64,
    },
    Operate(Act),
}

fn event() -> impl Strategy<Value = Event> {
    let tamper = prop_oneof![
        6 => Just(Tamper::None),
        1 => Just(Tamper::Lease),
        1 => Just(Tamper::Attempt),
        1 => Just(Tamper::Step),
        1 => Just(Tamper::Action),
    ];
    prop_oneof![
        3 => (0u64..400).prop_map(Event::Advance),
        1 => (400u64..4_000).prop_map(Event::Advance),
        3 => Just(Event::Claim),
        5 => (prop::option::weighted(0.3, any::<usize>()), tamper, prop::bool::weighted(0.8))
            .prop_map(|(pick, tamper, ok)| Event::Reply { pick, tamper, ok }),
        2 => any::<u64>().prop_map(|jitter| Event::Lapse { jitter }),
        1 => prop_oneof![
            Just(Act::Cancel),
            Just(Act::Compensate),
            Just(Act::Resubmit { from_step: None }),
            (0u32..6).prop_map(|n| Act::Resubmit { from_step: Some(n) }),
            Just(Act::Pause),
            Just(Act::Resume),
        ].prop_map(Event::Operate),
    ]
}

/// The identity of one dispatch, as its agent echoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dispatched {
    lease: LeaseToken,
    attempt: u32,
    step: u32,
    action: Action,
    complete_by: Timestamp,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_event_sequences_keep_every_invariant(
        which in 0usize..5,
        events in prop::collection::vec(event(), 0..80),
    ) {
        let wf = [Workflow::single_step(), Workflow::three_step(), mixed(), timed(), timer_first()][which].clone();
        let policy = policy();
        let mut task = new_task(&wf);
        let mut now = T0;
        let mut leases = 0u128;
        let mut dispatched: Vec<Dispatched> = Vec::new();
        let mut forward_done: Vec<u32> = Vec::new();
        let mut forward_claimed: BTreeSet<u32> = BTreeSet::new();
        // Forward steps a definitive refusal settled: they had no effect.
        let mut refused: BTreeSet<u32> = BTreeSet::new();
        let mut undone: Vec<u32> = Vec::new();
        let mut cancelled = false;

        for ev in events {
            let before = task.clone();
            let result = match ev {
                Event::Advance(ms) => {
                    now = now.plus_ms(ms);
                    continue;
                }
                Event::Claim => {
                    leases += 1;
                    // A Schedule message's decision: wake, sleep or claim.
                    let r = task.schedule(lease(leases), now, &wf, &policy);
                    let claimable = task.locked_by().is_none()
                        && matches!(task.state(), ProcessState::Pending | ProcessState::Compensating)
                        && task.hold_until().is_none_or(|h| now >= h.plus_ms(policy.reply_grace_ms))
                        && !task.paused();
                    if task.parked() {
                        prop_assert!(matches!(r, Err(Refusal::Paused)), "a paused task claimed: {:?}", r);
                    }
                    let wakes = task.state() == ProcessState::Waiting && task.wake_at().is_some_and(|w| now >= w);
                    prop_assert_eq!(r.is_ok(), claimable || wakes, "{:?}", r);
                    if task.state() == ProcessState::Waiting && !wakes {
                        prop_assert!(matches!(r, Err(Refusal::Asleep { .. })), "{:?}", r);
                    }
                    let timer = task.state() == ProcessState::Pending && wf.step(task.step).is_some_and(Step::is_timer);
                    if let Ok(d) = &r && (timer || wakes) {
                        prop_assert!(d.effects.iter().all(|e| !matches!(e, Effect::Dispatch { .. })), "a timer dispatches nothing");
                        prop_assert_eq!((d.next.attempt, d.next.failure_count), (task.attempt, task.failure_count));
                        if d.next.state() == ProcessState::Waiting {
                            prop_assert!(d.next.wake_at() >= Some(now));
                            prop_assert!(!cancelled, "a cancelled task slept on a step");
                        }
                    }
                    if let Ok(d) = &r && d.trigger == Trigger::Claimed {
                        let action = d.next.action();
                        dispatched.push(Dispatched {
                            lease: lease(leases),
                            attempt: d.next.attempt,
                            step: d.next.step,
                            action,
                            complete_by: d.next.complete_by().unwrap(),
                        });
                        if action == Action::Do {
                            forward_claimed.insert(d.next.step);
                            prop_assert!(!cancelled, "step {} claimed after the task was cancelled", d.next.step);
                        }
                        // Attempts identify claims: no two dispatches share one.
                        prop_assert_eq!(d.next.attempt as usize, dispatched.len());
                    }
                    r
                }
                Event::Reply { pick, tamper, ok } => {
                    if dispatched.is_empty() {
                        continue;
                    }
                    let mut from = dispatched[pick.map_or(dispatched.len() - 1, |p| p % dispatched.len())];
                    match tamper {
                        Tamper::None => {}
                        Tamper::Lease => from.lease = lease(u128::MAX),
                        Tamper::Attempt => from.attempt = from.attempt.wrapping_add(1),
                        Tamper::Step => from.step = from.step.wrapping_add(1),
                        Tamper::Action => {
                            from.action = match from.action {
                                Action::Do => Action::Undo,
                                Action::Undo => Action::Do,
                            }
                        }
                    }
                    let outcome = if ok { ReplyOutcome::DONE } else { ReplyOutcome::Failed { reason: "no".into(), detail: None } };
                    let reply = AgentReply {
                        order_id: task.order_id.clone(),
                        step: from.step,
                        action: from.action,
                        attempt: from.attempt,
                        lease: from.lease,
                        index: None,
                        outcome,
                    };
                    let r = task.apply_reply(&reply, now, &wf, &policy);
                    // The fence: only the live dispatch's own reply, in time, lands.
                    let live = task.locked_by() == Some(from.lease)
                        && dispatched.last().map(|d| (d.lease, d.attempt, d.step, d.action))
                            == Some((from.lease, from.attempt, from.step, from.action))
                        && now <= from.complete_by;
                    prop_assert_eq!(r.is_ok(), live, "{:?} {:?}", r, from);
                    if let Err(refusal) = &r {
                        prop_assert!(matches!(refusal, Refusal::StaleReply(_)), "{:?}", refusal);
                    }
                    r
                }
                Event::Lapse { jitter } => {
                    let r = task.recover(now, &wf, &policy, jitter);
                    let due = task.deadline().is_some_and(|d| d <= now) && !task.parked();
                    prop_assert_eq!(r.is_ok(), due, "{:?}", r);
                    if task.state() == ProcessState::Waiting && let Ok(d) = &r {
                        prop_assert_eq!(d.next.failure_count, task.failure_count, "waiting is no failure");
                    }
                    r
                }
                Event::Operate(act) => {
                    let actor = Actor { by: "op", why: "test", seen: None, origin: Origin::Operator };
                    let r = task.act(act, actor, now, &wf, &policy);
                    let allowed = match act {
                        Act::Cancel => matches!(task.state(), ProcessState::Pending | ProcessState::Processing | ProcessState::Waiting),
                        Act::Compensate | Act::Resubmit { .. } => task.state() == ProcessState::Error,
                        Act::Pause => !task.state().is_terminal() && !task.paused(),
                        Act::Resume => task.paused(),
                    };
                    if matches!(act, Act::Pause | Act::Resume) {
                        prop_assert_eq!(r.is_ok(), allowed, "{:?}: {:?}", act, r);
                    }
                    if !allowed {
                        prop_assert!(matches!(r, Err(Refusal::NotAllowed { .. })), "{:?} on {:?}: {:?}", act, task.state(), r);
                    }
                    if let Ok(d) = &r {
                        prop_assert_eq!(d.next.failure_count, task.failure_count);
                        match d.trigger {
                            Trigger::Cancel | Trigger::CancelUndone => cancelled = true,
                            Trigger::Resubmit => {
                                prop_assert!(!cancelled, "a cancelled task went forward again");
                                forward_done.truncate(d.next.step as usize);
                            }
                            _ => {}
                        }
                    }
                    r
                }
            };
            let Ok(d) = result else {
                prop_assert_eq!(&task, &before);
                continue;
            };

            prop_assert!(
                !before.state().is_terminal() || (d.trigger.is_operator() && before.state() == ProcessState::Error),
                "terminal {:?} moved", before.state()
            );
            prop_assert!(
                lifecycle::TRANSITIONS.contains(&(before.state(), d.trigger, d.next.state())),
                "{:?} --{:?}--> {:?}", before.state(), d.trigger, d.next.state()
            );
            prop_assert!(d.next.failure_count >= before.failure_count);
            prop_assert!(d.next.revision > before.revision);
            prop_assert_eq!(d.next.shape_violation(), None);
            prop_assert!(d.next.attempt >= before.attempt);
            // A paused task dispatches nothing, and one that waits for a claim is off the sweep.
            if before.paused() {
                prop_assert!(d.trigger != Trigger::Claimed, "a paused task was claimed");
            }
            if d.next.parked() {
                let quiet = d.effects.iter().all(|e| !matches!(e, Effect::Schedule { .. } | Effect::Dispatch { .. }));
                prop_assert!(quiet, "a parked task sent {:?}", d.effects);
                prop_assert!(d.next.deadline().is_some_and(|dl| dl.millis_since(now) >= super::PARKED_MS));
            }
            // A timer never wakes before its time.
            if before.state() == ProcessState::Waiting && matches!(d.trigger, Trigger::Woke | Trigger::Finished) {
                prop_assert!(before.wake_at().is_some_and(|w| now >= w), "woke at {:?} before {:?}", now, before.wake_at());
            }
            let alert_count = d.effects.iter().filter(|e| matches!(e, Effect::Alert(_))).count();
            prop_assert!(alert_count <= 1);
            if d.next.state() == ProcessState::Error {
                prop_assert_eq!(alert_count, 1, "an Error always tells an operator");
            }

            if let Cause::Succeeded { step, action } = d.next.last_cause.clone() {
                match action {
                    Action::Do => {
                        prop_assert_eq!(step as usize, forward_done.len(), "forward steps in order");
                        forward_done.push(step);
                    }
                    Action::Undo => {
                        prop_assert!(wf.step(step).unwrap().compensation.is_some());
                        prop_assert!(forward_claimed.contains(&step), "undid step {} never started", step);
                        if let Some(&last) = undone.last() {
                            prop_assert!(step < last, "compensation {} after {}", step, last);
                        }
                        prop_assert!(!undone.contains(&step));
                        undone.push(step);
                    }
                }
            }
            if let Cause::Woke { step, .. } = d.next.last_cause {
                prop_assert_eq!(step as usize, forward_done.len(), "a timer wakes in its turn");
                forward_done.push(step);
            }
            if let Cause::Failed { step, action: Action::Do, .. } = d.next.last_cause {
                refused.insert(step);
            }
            if let Cause::Succeeded { step, action: Action::Do } = d.next.last_cause {
                // Run again after a resubmit: a refusal before it no longer says it had no effect.
                refused.remove(&step);
            }
            if d.next.state() == ProcessState::Compensated {
                // Nothing stands: every step that was dispatched and not refused
                // only read or was undone; no pivot may have taken effect.
                for &s in &forward_claimed {
                    let kind = wf.step(s).unwrap().kind();
                    let stands = match kind {
                        StepKind::ReadOnly => false,
                        StepKind::Compensable => !refused.contains(&s) && !undone.contains(&s),
                        StepKind::Pivot => !refused.contains(&s),
                    };
                    prop_assert!(!stands, "Compensated, but step {} ({:?}) may stand", s, kind);
                }
            }
            let budget = wf.max_failures(d.next.step, policy.failure_threshold);
            prop_assert!(d.next.step_failures <= budget, "budget overrun: {} of {}", d.next.step_failures, budget);
            task = d.next;
        }
    }
}
