//! DESIGN.md's invariants, checked after a run against everything it left behind: the
//! state table's write log, the final records, kept (dead-lettered) messages, status
//! updates, alerts, and the remote service's own ledger of calls and effects.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sas::domain::{Action, Cause, OrderStatus, ProcessState, StatusUpdate};
use sas::handlers::REASON_ATTRIBUTE;

use crate::dev::DevOutcome;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

struct Found(Vec<Violation>);

impl Found {
    fn add(&mut self, invariant: &'static str, detail: impl Into<String>) {
        self.0.push(Violation { invariant, detail: detail.into() });
    }
}

pub const ACCEPTED_OR_REJECTED: &str = "every order sent is accepted or rejected with a reason";
pub const TERMINAL: &str = "every accepted order reaches a terminal state";
pub const ABSORBING: &str = "terminal states never change";
pub const SHAPE: &str = "every record is well-formed (lease, deadline)";
pub const ONE_LEASE: &str = "at most one live lease per task";
pub const FENCED: &str = "a stale reply never changes state";
pub const FAILURES: &str = "FailureCount only grows and the threshold is honoured";
pub const COMPENSATION: &str = "completed steps of an undone task are compensated once, in reverse order";
pub const IDEMPOTENCY: &str = "one idempotency key per step, its effect applied at most once";
pub const REMOTE_AGREES: &str = "the remote side agrees with the final state";
pub const ALERTED: &str = "every Error task raised an operator alert";
pub const NO_INTERNAL_LOSS: &str = "no internal message dead-lettered";
pub const STATUS: &str = "reply_to receives each order's final status";

/// Every violation found; empty means the run upheld every invariant.
pub fn check(run: &DevOutcome) -> Vec<Violation> {
    let mut found = Found(Vec::new());
    let threshold = run.options.failure_threshold;
    let tasks: HashMap<&str, &sas::domain::TaskRecord> =
        run.tasks.iter().map(|t| (t.order_id.as_str(), t)).collect();

    // No loss: every valid order has a task; every bad message is kept with its reason.
    for (id, _) in &run.sent.orders {
        if !tasks.contains_key(id.as_str()) {
            found.add(ACCEPTED_OR_REJECTED, format!("order {id} was sent but has no task"));
        }
    }
    if run.tasks.len() != run.sent.orders.len() {
        found.add(
            ACCEPTED_OR_REJECTED,
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
            None => found.add(
                ACCEPTED_OR_REJECTED,
                format!("bad message {:?} not kept with a reason containing {want:?}", truncate(body)),
            ),
        }
    }
    // At-least-once delivery may hand the submission a bad message twice; it is kept
    // twice. Anything else kept was never sent as bad: an order lost to the DLQ.
    for m in kept {
        if !run.sent.bad.iter().any(|(body, _)| body == &m.body) {
            found.add(
                ACCEPTED_OR_REJECTED,
                format!("unexpected kept message {:?}: {:?}", truncate(&m.body), m.attributes),
            );
        }
    }

    if run.timed_out {
        found.add(TERMINAL, format!("run stopped after {:?} with orders still moving", run.elapsed));
    }
    for t in &run.tasks {
        if !t.state.is_terminal() {
            found.add(TERMINAL, format!("order {} ended {:?} at step {}", t.order_id, t.state, t.step));
        }
    }

    // Per-write checks, then per-order histories.
    let mut histories: BTreeMap<&str, Vec<&sas::adapters::embedded::WriteRecord>> = BTreeMap::new();
    for w in &run.writes {
        histories.entry(w.after.order_id.as_str()).or_default().push(w);
        let id = &w.after.order_id;
        if let Some(v) = w.after.shape_violation() {
            found.add(SHAPE, format!("order {id} revision {}: {v}", w.after.revision));
        }
        let Some(before) = &w.before else { continue };
        if before.state.is_terminal() {
            found.add(ABSORBING, format!("order {id} left {:?} for {:?}", before.state, w.after.state));
        }
        if let (Some(old), Some(new)) = (before.locked_by, w.after.locked_by)
            && old != new
        {
            found.add(ONE_LEASE, format!("order {id}: lease {old} replaced by {new} while live"));
        }
        if w.after.failure_count < before.failure_count {
            found.add(
                FAILURES,
                format!("order {id}: FailureCount {} -> {}", before.failure_count, w.after.failure_count),
            );
        }
        let phase = w.after.failure_count - w.after.undo_failure_base.unwrap_or(0).min(w.after.failure_count);
        if phase > threshold {
            found.add(FAILURES, format!("order {id}: {phase} failures in one phase, threshold {threshold}"));
        }
        if let Cause::Succeeded { step, action } | Cause::Failed { step, action, .. } = &w.after.last_cause {
            let fenced = before.locked_by.is_some()
                && matches!(before.state, ProcessState::Processing | ProcessState::Compensating)
                && before.step == *step
                && before.action() == *action
                && before.complete_by.is_some_and(|cb| w.after.updated_at <= cb);
            if !fenced {
                found.add(FENCED, format!("order {id}: reply for step {step} applied to {before:?}"));
            }
        }
    }

    let workflow_of = |name: &str| run.workflows.get(name);
    for (id, history) in &histories {
        let Some(task) = tasks.get(id) else { continue };
        let Some(workflow) = workflow_of(&task.workflow) else {
            found.add(SHAPE, format!("order {id}: unknown workflow {}", task.workflow));
            continue;
        };
        let mut done = BTreeSet::new();
        let mut claimed = BTreeSet::new();
        let mut undone: Vec<u32> = Vec::new();
        let mut terminal_entries = 0;
        for w in history {
            match &w.after.last_cause {
                Cause::Succeeded { step, action: Action::Do } => {
                    done.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Undo } => undone.push(*step),
                Cause::Claimed { step, action: Action::Do } => {
                    claimed.insert(*step);
                }
                _ => {}
            }
            if w.after.state.is_terminal() && w.before.as_ref().is_none_or(|b| !b.state.is_terminal()) {
                terminal_entries += 1;
            }
        }
        if task.state.is_terminal() && terminal_entries != 1 {
            found.add(ABSORBING, format!("order {id} entered a terminal state {terminal_entries} times"));
        }
        if undone.windows(2).any(|p| p[0] <= p[1]) {
            found.add(COMPENSATION, format!("order {id}: compensations ran in order {undone:?}"));
        }
        let undone_set: BTreeSet<u32> = undone.iter().copied().collect();
        if !undone_set.is_subset(&claimed) {
            found.add(COMPENSATION, format!("order {id}: undid {undone:?} but only ran {claimed:?}"));
        }
        match task.state {
            ProcessState::Processed if done.len() as u32 != workflow.len() || !undone.is_empty() => {
                found.add(
                    COMPENSATION,
                    format!("order {id} Processed with steps {done:?} done and {undone:?} undone"),
                );
            }
            ProcessState::Compensated => {
                for step in &done {
                    let compensable = workflow.step(*step).is_some_and(|s| s.compensation.is_some());
                    if compensable && !undone_set.contains(step) {
                        found.add(
                            COMPENSATION,
                            format!("order {id} Compensated but step {step} was never undone"),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    // The remote side's view.
    for ((order, step, action), keys) in &run.ledger.keys {
        if keys.len() != 1 {
            found.add(IDEMPOTENCY, format!("order {order} step {step} {action} called with keys {keys:?}"));
        }
    }
    for (key, n) in &run.ledger.effects {
        if *n > 1 {
            found.add(IDEMPOTENCY, format!("effect {key} applied {n} times"));
        }
    }
    let applied = |id: &sas::domain::OrderId, step: u32, action: Action| {
        run.ledger.effects.contains_key(&sas::domain::idempotency_key(id, step, action).0)
    };
    for t in &run.tasks {
        let Some(workflow) = workflow_of(&t.workflow) else { continue };
        let id = &t.order_id;
        for step in 0..workflow.len() {
            let compensable = workflow.step(step).is_some_and(|s| s.compensation.is_some());
            match t.state {
                ProcessState::Processed if !applied(id, step, Action::Do) => {
                    found.add(
                        REMOTE_AGREES,
                        format!("order {id} Processed but the remote never applied step {step}"),
                    );
                }
                ProcessState::Processed if applied(id, step, Action::Undo) => {
                    found.add(
                        REMOTE_AGREES,
                        format!("order {id} Processed but step {step} was undone remotely"),
                    );
                }
                ProcessState::Compensated
                    if compensable && applied(id, step, Action::Do) && !applied(id, step, Action::Undo) =>
                {
                    found.add(
                        REMOTE_AGREES,
                        format!(
                            "order {id} Compensated but step {step}'s remote effect was not undone; history: {}",
                            history_of(run, id)
                        ),
                    );
                }
                _ => {}
            }
        }
    }

    let alerted: BTreeSet<&str> = run.alerts.iter().map(|a| a.order_id.as_str()).collect();
    for t in run.tasks.iter().filter(|t| t.state == ProcessState::Error) {
        if !alerted.contains(t.order_id.as_str()) {
            found.add(ALERTED, format!("order {} is Error without an alert", t.order_id));
        }
    }

    for m in &run.internal_dead_letters {
        found.add(
            NO_INTERNAL_LOSS,
            format!("{:?}: {:?}", truncate(&m.body), m.attributes.get(REASON_ATTRIBUTE)),
        );
    }

    let mut final_status: HashMap<String, OrderStatus> = HashMap::new();
    for m in &run.statuses {
        if let Ok(update) = serde_json::from_str::<StatusUpdate>(&m.body)
            && let (Some(id), true) = (update.order_id, is_final(update.status))
        {
            final_status.insert(id.as_str().to_owned(), update.status);
        }
    }
    for t in run.tasks.iter().filter(|t| t.state.is_terminal()) {
        let want = match t.state {
            ProcessState::Processed => OrderStatus::Processed,
            ProcessState::Compensated => OrderStatus::Compensated,
            _ => OrderStatus::Failed,
        };
        if final_status.get(t.order_id.as_str()) != Some(&want) {
            found.add(
                STATUS,
                format!(
                    "order {} is {:?} but its final status was {:?}",
                    t.order_id,
                    t.state,
                    final_status.get(t.order_id.as_str())
                ),
            );
        }
    }
    found.0
}

/// One order's causes, compactly, for a violation's detail.
fn history_of(run: &DevOutcome, id: &sas::domain::OrderId) -> String {
    let causes: Vec<String> = run
        .writes
        .iter()
        .filter(|w| &w.after.order_id == id)
        .map(|w| format!("{:?}->{:?}@{}", w.after.last_cause, w.after.state, w.after.updated_at.0 % 100_000))
        .collect();
    causes.join(", ")
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
