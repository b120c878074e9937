//! `sasctl dev`'s checker: the invariants shared with the simulation over the run's
//! records (`sas_sim::invariants`: the write log, final records, alerts and the remote
//! service's ledger), plus what only a `dev` run shows: what was sent and what was
//! kept, the internal dead-letter queues, the status queue and whether it finished; and,
//! for callback steps, what the simulated outside party sent (`callback_checks`); for
//! agents with limits, what their service saw (`limit_checks`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sas::adapters::embedded::WriteRecord;
use sas::domain::{
    Action, Awaiting, CallbackOutcome, Cause, OrderStatus, ProcessState, StatusUpdate, TaskRecord,
};
use sas::handlers::REASON_ATTRIBUTE;
pub use sas_sim::invariants::{Invariant, Violation};
use sas_sim::invariants::{Records, check_records};

use crate::dev::DevOutcome;
use crate::remote_sim::DECLINED;

/// Every violation found; empty means the run upheld every invariant.
pub fn check(run: &DevOutcome) -> Vec<Violation> {
    let shared = check_records(&Records {
        workflows: &run.workflows,
        policy: &run.options.policy(),
        tasks: &run.tasks,
        writes: &run.writes,
        alerts: &run.alerts,
        ledger: &run.ledger,
    });
    let mut found = shared;
    let mut add = |invariant: Invariant, detail: String| found.push(Violation::new(invariant, detail));
    callback_checks(run, &mut add);
    limit_checks(run, &mut add);

    // No loss: every valid order has a task; every bad message is kept with its reason.
    let tasks: BTreeSet<&str> = run.tasks.iter().map(|t| t.order_id.as_str()).collect();
    for (id, _) in &run.sent.orders {
        if !tasks.contains(id.as_str()) {
            add(Invariant::AcceptedOrRejected, format!("order {id} was sent but has no task"));
        }
    }
    if run.tasks.len() != run.sent.orders.len() {
        add(
            Invariant::AcceptedOrRejected,
            format!("{} tasks for {} valid orders", run.tasks.len(), run.sent.orders.len()),
        );
    }
    let mut kept: Vec<_> = run.kept.iter().collect();
    for (body, want) in &run.sent.bad {
        let at = kept.iter().position(|m| {
            &m.body == body && m.attributes.get(REASON_ATTRIBUTE).is_some_and(|r| r.contains(want))
        });
        match at {
            Some(i) => {
                kept.swap_remove(i);
            }
            None => add(
                Invariant::BadInputKept,
                format!("bad message {:?} not kept with a reason containing {want:?}", truncate(body)),
            ),
        }
    }
    // At-least-once delivery may hand the submission a bad message twice; it is kept
    // twice. Anything else kept was never sent as bad: an order lost to the DLQ.
    for m in kept {
        if !run.sent.bad.iter().any(|(body, _)| body == &m.body) {
            add(
                Invariant::AcceptedOrRejected,
                format!("unexpected kept message {:?}: {:?}", truncate(&m.body), m.attributes),
            );
        }
    }
    if run.timed_out {
        add(Invariant::TerminalOnce, format!("run stopped after {:?} with orders still moving", run.elapsed));
    }
    for m in &run.internal_dead_letters {
        add(
            Invariant::NoInternalReject,
            format!("{:?}: {:?}", truncate(&m.body), m.attributes.get(REASON_ATTRIBUTE)),
        );
    }

    // Each terminal order's last final status on its reply_to queue matches its state.
    let mut final_status: HashMap<String, OrderStatus> = HashMap::new();
    for m in &run.statuses {
        if let Ok(update) = serde_json::from_str::<StatusUpdate>(&m.body)
            && let (Some(id), true) = (update.order_id, is_final(update.status))
        {
            final_status.insert(id.as_str().to_owned(), update.status);
        }
    }
    for t in run.tasks.iter().filter(|t| t.state().is_terminal()) {
        let want = match t.state() {
            ProcessState::Processed => OrderStatus::Processed,
            ProcessState::Compensated => OrderStatus::Compensated,
            _ => OrderStatus::Failed,
        };
        if final_status.get(t.order_id.as_str()) != Some(&want) {
            add(
                Invariant::Status,
                format!(
                    "order {} is {:?} but its final status was {:?}",
                    t.order_id,
                    t.state(),
                    final_status.get(t.order_id.as_str())
                ),
            );
        }
    }
    found
}

/// The outside's word a write applied, if it is one: the step and attempt its token was
/// for (the wait the record held before), and what the word was. A failure counts only
/// when it is the dev outside party's (an agent's refusal is a `Failed` cause too).
fn callback_word(w: &WriteRecord) -> Option<(&Awaiting, CallbackOutcome)> {
    let before = w.before.as_ref()?;
    let (step, outcome) = match &w.after.last_cause {
        Cause::Completed { step } => (*step, CallbackOutcome::Success),
        Cause::Heartbeat { step } => (*step, CallbackOutcome::Heartbeat),
        Cause::Failed { step, action: Action::Do, reason, .. } if reason.starts_with(DECLINED) => {
            (*step, CallbackOutcome::Failure)
        }
        _ => return None,
    };
    before.callback().filter(|cb| cb.step == step).map(|cb| (cb, outcome))
}

fn outcome_name(o: CallbackOutcome) -> &'static str {
    match o {
        CallbackOutcome::Success => "success",
        CallbackOutcome::Failure => "failure",
        CallbackOutcome::Heartbeat => "heartbeat",
    }
}

/// The token's fence, as the write log shows it: the record waited on the attempt (its
/// agent's answer due, or started), and the word landed no later than the wait was due.
fn within_its_wait(before: &TaskRecord, after: &TaskRecord, cb: &Awaiting) -> bool {
    matches!(before.state(), ProcessState::Processing | ProcessState::Waiting) && after.updated_at <= cb.due()
}

/// Callback steps, against what the simulated outside party sent (`remote_sim::Outside`):
/// - a step's attempt is completed (success or failure) at most once;
/// - every word applied landed within its attempt's wait, and the outside party sent
///   that attempt a genuine word of that kind: none applied came from a bad token alone
///   (a forged one, an earlier attempt's, one past the timeout);
/// - every bad send (second copy, stale, forged, late) that reached the handler was
///   refused: it is kept in the callback queue's DLQ with its reason. A run that timed
///   out may have stopped before its last sends were read, so this one waits for a
///   finished run.
fn callback_checks(run: &DevOutcome, add: &mut impl FnMut(Invariant, String)) {
    let genuine: BTreeSet<(&str, u32, u32, &str)> = run
        .callback_sends
        .iter()
        .filter(|s| !s.kind.is_bad())
        .map(|s| (s.order_id.as_str(), s.step, s.attempt, outcome_name(s.outcome)))
        .collect();
    let mut completed: BTreeMap<(&str, u32, u32), usize> = BTreeMap::new();
    for w in &run.writes {
        let (Some(before), Some((cb, outcome))) = (&w.before, callback_word(w)) else { continue };
        let id = w.after.order_id.as_str();
        let what = format!("callback: order {id} step {} attempt {}: a {outcome:?}", cb.step, cb.attempt);
        if !within_its_wait(before, &w.after, cb) {
            add(
                Invariant::Fenced,
                format!(
                    "{what} applied from {:?} at {}, its wait due at {}",
                    before.state(),
                    w.after.updated_at,
                    cb.due()
                ),
            );
        }
        if !run.callback_sends.is_empty()
            && !genuine.contains(&(id, cb.step, cb.attempt, outcome_name(outcome)))
        {
            add(
                Invariant::Fenced,
                format!("{what} applied, but the outside party sent that attempt none but bad ones"),
            );
        }
        if outcome != CallbackOutcome::Heartbeat {
            *completed.entry((id, cb.step, cb.attempt)).or_default() += 1;
        }
    }
    for ((id, step, attempt), n) in completed {
        if n > 1 {
            add(
                Invariant::Fenced,
                format!("callback: order {id} step {step} attempt {attempt} completed {n} times"),
            );
        }
    }
    if run.timed_out {
        return;
    }
    let mut refused: Vec<&str> = run
        .callback_kept
        .iter()
        .filter(|m| m.attributes.get(REASON_ATTRIBUTE).is_some_and(|r| r.contains("callback refused")))
        .map(|m| m.body.as_str())
        .collect();
    for send in run.callback_sends.iter().filter(|s| s.kind.is_bad()) {
        match refused.iter().position(|body| *body == send.body) {
            Some(i) => {
                refused.swap_remove(i);
            }
            None => add(
                Invariant::Fenced,
                format!(
                    "callback: a {} {:?} sent to order {} step {} attempt {} was not refused (not kept in the callback DLQ)",
                    send.kind.as_str(),
                    send.outcome,
                    send.order_id,
                    send.step,
                    send.attempt
                ),
            ),
        }
    }
}

/// Flow control, from the simulated service's side of the wire (`remote_sim::Flights`),
/// not from the gate's or the agent's word: no agent's service ever had more calls open
/// at once than its `max_in_flight`, or saw more start in one second than its
/// `max_per_second`.
fn limit_checks(run: &DevOutcome, add: &mut impl FnMut(Invariant, String)) {
    for (agent, def) in &run.options.definitions.agents {
        let (limits, Some(seen)) = (def.limits(), run.flights.get(agent)) else { continue };
        if let Some(max) = limits.max_in_flight
            && seen.max_in_flight > u64::from(max)
        {
            add(
                Invariant::RemoteWithinLimits,
                format!(
                    "agent {agent}: its service had {} calls open at once; max_in_flight is {max}",
                    seen.max_in_flight
                ),
            );
        }
        let per_second = seen.max_per_second();
        if let Some(max) = limits.max_per_second
            && per_second > u64::from(max)
        {
            add(
                Invariant::RemoteWithinLimits,
                format!(
                    "agent {agent}: {per_second} calls reached its service within one second; max_per_second is {max}"
                ),
            );
        }
    }
}

fn is_final(s: OrderStatus) -> bool {
    matches!(s, OrderStatus::Processed | OrderStatus::Compensated | OrderStatus::Failed)
}

fn truncate(s: &str) -> String {
    if s.len() <= 80 {
        s.to_owned()
    } else {
        format!("{}… ({} bytes)", &s[..s.floor_char_boundary(80)], s.len())
    }
}
