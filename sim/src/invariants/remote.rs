//! The remote service's side: its ledger agrees with each task's final state, one
//! idempotency key per step with each effect applied at most once, and a limited agent's
//! service never over its limits.

use std::collections::BTreeSet;

use sas::domain::{Action, OrderId, ProcessState, StepKind, TaskRecord, Workflow, idempotency_key};

use super::catalogue::{Invariant, Records};
use super::history::history_of;
use super::transitions::applied;
use crate::ledger::Ledger;

/// The remote side's ledger against the final state: a Processed task has every step
/// applied and none undone; a Compensated one left no effect standing.
pub(super) fn remote_agrees(
    r: &Records,
    task: &TaskRecord,
    workflow: &Workflow,
    declined: &BTreeSet<u32>,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    // A timer step calls no remote service: the ledger has nothing of it.
    // A map's items are judged item by item (`maps.rs`).
    let steps = (0..workflow.len()).zip(&workflow.steps);
    for (step, def) in steps.filter(|(s, d)| !d.is_timer() && workflow.map_at(*s).is_none()) {
        let done = applied(r.ledger, id, step, Action::Do);
        let undone = applied(r.ledger, id, step, Action::Undo);
        match task.state() {
            ProcessState::Processed if !done || undone => add(
                Invariant::RemoteAgrees,
                format!("order {id} Processed but step {step}: applied {done}, undone {undone}"),
            ),
            // A callback step the outside declined had no effect, whatever the call started.
            ProcessState::Compensated if done && !declined.contains(&step) => {
                let stands = match def.kind() {
                    StepKind::ReadOnly => false,
                    StepKind::Compensable => !undone,
                    StepKind::Pivot => true,
                };
                if stands {
                    add(
                        Invariant::NothingStands,
                        format!(
                            "order {id} Compensated but {} step {step} ({}) took effect{}; history: {}",
                            match def.kind() {
                                StepKind::Pivot => "pivot",
                                _ => "compensable",
                            },
                            def.name,
                            if def.kind() == StepKind::Pivot { "" } else { " and was never undone" },
                            history_of(r.writes, id)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// The remote side: one key per step and action, each effect applied at most once.
pub(super) fn one_key_per_step_applied_once(ledger: &Ledger, add: &mut impl FnMut(Invariant, String)) {
    for ((order, step, action), keys) in &ledger.keys {
        // A map's items' keys are judged with their map (`maps.rs`).
        if keys.iter().all(|k| super::maps::item_of(k, order, *step).is_some()) {
            continue;
        }
        let want = OrderId::parse(order).map(|oid| idempotency_key(&oid, *step, *action).0);
        if keys.len() != 1 || want.is_err() || !keys.contains(want.as_ref().unwrap_or(&String::new())) {
            add(
                Invariant::Idempotency,
                format!("order {order} step {step} {action:?} called with keys {keys:?}"),
            );
        }
    }
    for (key, n) in &ledger.applied {
        if *n > 1 {
            add(Invariant::Idempotency, format!("effect {key} applied {n} times"));
        }
    }
}

/// The limits judged where they matter, at the remote service: from the calls its ledger
/// saw (`Ledger::flights`), not from the gates that are meant to keep them. A call is in
/// flight from its start until its end (a call that ended at the instant another started
/// is over); the rate counts the calls started in every window of `RATE_WINDOW_MS`. Both
/// within the clocks' slack (`Ledger::clock_slack_ms`): a place lapsed, or a rate tail
/// ended, by one clock while a call went on by another's.
///
/// Every call the service saw counts, copies of a request included: SQS delivers a
/// message at least once, and a limited agent calls only for the request that wrote the
/// call's mark first (`domain::gate::CallStart`), so a copy, in any container, is never a
/// second call under the one place. The run still counts the calls made under a place
/// after its reply was sent (`Flight::copy`): none, while that holds.
///
/// Under a per-key limit, the calls of each key's orders (the key's value read from the
/// orders as accepted, `tasks`) are held to it the same way.
pub(super) fn remote_within_limits(
    ledger: &Ledger,
    tasks: &[TaskRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    use sas::domain::gate::RATE_WINDOW_MS;
    let slack = ledger.clock_slack_ms;
    let window_ms = RATE_WINDOW_MS.saturating_sub(slack);
    for (agent, limits) in &ledger.limits {
        let Some(flights) = ledger.flights.get(agent) else { continue };
        // Each call by its place and its rank among the agent's calls: two copies' calls
        // under one place are two calls.
        let flights: Vec<(String, &crate::ledger::Flight)> =
            flights.iter().enumerate().map(|(i, f)| (format!("{}@{i}", f.holder), f)).collect();
        // One violation per limit and agent is enough to tell the story.
        let mut in_flight_told = false;
        let mut rate_told = false;
        for (i, (id, f)) in flights.iter().enumerate() {
            let before = &flights[..i];
            if let Some(max) = limits.max_in_flight
                && !in_flight_told
            {
                let open: BTreeSet<&str> = before
                    .iter()
                    .filter(|(_, g)| g.end > f.start + slack)
                    .map(|(id, _)| id.as_str())
                    .chain([id.as_str()])
                    .collect();
                if open.len() as u64 > u64::from(max) {
                    in_flight_told = true;
                    add(
                        Invariant::RemoteWithinLimits,
                        format!(
                            "agent {agent} (max_in_flight {max}): call {} of {} started at {} ms with {} calls in flight: {open:?}",
                            f.key,
                            f.holder,
                            f.start,
                            open.len()
                        ),
                    );
                }
            }
            if let Some(max) = limits.max_per_second
                && !rate_told
            {
                let window: BTreeSet<&str> = before
                    .iter()
                    .filter(|(_, g)| g.start + window_ms > f.start)
                    .map(|(id, _)| id.as_str())
                    .chain([id.as_str()])
                    .collect();
                if window.len() as u64 > u64::from(max) {
                    rate_told = true;
                    let starts: Vec<(u64, &str)> = before
                        .iter()
                        .filter(|(_, g)| g.start + window_ms > f.start)
                        .map(|(id, g)| (g.start, id.as_str()))
                        .collect();
                    add(
                        Invariant::RemoteWithinLimits,
                        format!(
                            "agent {agent} (max_per_second {max}): call {} of {} started at {} ms, {} calls within {window_ms} ms: {starts:?}",
                            f.key,
                            f.holder,
                            f.start,
                            window.len()
                        ),
                    );
                }
            }
        }
        if let Some(per_key) = limits.per_key {
            per_key_within(agent, per_key, &flights, tasks, slack, add);
        }
    }
}

/// At no instant more than `per_key.limit` places' calls of one key's orders in flight.
fn per_key_within(
    agent: &str,
    per_key: sas::domain::gate::PerKey,
    flights: &[(String, &crate::ledger::Flight)],
    tasks: &[TaskRecord],
    slack: u64,
    add: &mut impl FnMut(Invariant, String),
) {
    let key_of = |holder: &str| {
        let order = holder.split_once('#').map_or(holder, |(o, _)| o);
        tasks.iter().find(|t| t.order_id.as_str() == order).map(|t| t.order.key_value(per_key.key))
    };
    // Each call by its id (its place and rank): copies' calls count, as for the agent's.
    let mut by_key: std::collections::BTreeMap<String, Vec<(&str, &crate::ledger::Flight)>> =
        Default::default();
    for (id, f) in flights {
        if let Some(key) = key_of(&f.holder) {
            by_key.entry(key).or_default().push((id.as_str(), *f));
        }
    }
    for (key, flights) in by_key {
        for (i, (id, f)) in flights.iter().enumerate() {
            let open: BTreeSet<&str> = flights[..i]
                .iter()
                .filter(|(_, g)| g.end > f.start + slack)
                .map(|(id, _)| *id)
                .chain([*id])
                .collect();
            if open.len() as u64 > u64::from(per_key.limit) {
                add(
                    Invariant::RemoteWithinLimits,
                    format!(
                        "agent {agent} (max_in_flight_per_key {} of {}): call {} of {} (key {key:?}) started at {} ms with calls of {} places of the key in flight: {open:?}",
                        per_key.limit,
                        per_key.key.path(),
                        f.key,
                        f.holder,
                        f.start,
                        open.len()
                    ),
                );
                break;
            }
        }
    }
}
