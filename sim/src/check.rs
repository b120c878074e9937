//! The invariants of DESIGN.md, checked over everything a run recorded: the state
//! table's write log (with who wrote each write and for which message), the final
//! records, the stored orders, the dead-letter queues, the alerts and the remote
//! service's ledger.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sas::domain::{
    Action, Cause, OrderRequest, ProcessState, SchedulerMessage, TaskRecord, Trigger, idempotency_key,
    lifecycle,
};
use sas::handlers::REASON_ATTRIBUTE;

use crate::run::{AGENT, AGENT_DLQ, MAX_RECEIVES, ORDERS, ORDERS_DLQ, Outcome, SCHEDULER, SCHEDULER_DLQ};
use crate::workload::Sent;
use crate::world::Function;

pub const ACCEPTED_OR_REJECTED: &str = "every order sent is accepted or rejected with a reason, never lost";
pub const TERMINAL_ONCE: &str = "every accepted order reaches exactly one terminal state";
pub const ABSORBING: &str = "terminal states never change";
pub const LIFECYCLE: &str = "every write is a move of the transition table on the latest revision";
pub const SHAPE: &str = "every record is well-formed (lease, deadline)";
pub const ONE_LEASE: &str = "at most one live lease per task";
pub const FENCED: &str = "a stale reply never changes state";
pub const FAILURES: &str = "FailureCount only grows and the threshold is honoured";
pub const COMPENSATION: &str =
    "each completed step of an undone task is compensated exactly once, in reverse order";
pub const IDEMPOTENCY: &str = "one idempotency key per step, its remote effect applied at most once";
pub const REMOTE_AGREES: &str = "the remote side agrees with the final state";
pub const LIVENESS: &str = "every order is terminal within a bound after the faults stop";
pub const SUPERVISED: &str = "a task past its deadline is acted on by the next supervisor run";
pub const NO_PANIC: &str = "no handler panics";
pub const BAD_INPUT_KEPT: &str = "bad input is kept with its reason";
pub const NO_INTERNAL_REJECT: &str = "no message the pipeline made itself is rejected";
pub const ALERTED: &str = "every give-up (Error, or the failure threshold) raises an operator alert";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: &'static str, detail: impl Into<String>) -> Violation {
        Violation { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

/// The trigger a landed write carried out, read back from the record before and after.
pub fn infer_trigger(before: &TaskRecord, after: &TaskRecord) -> Option<Trigger> {
    use ProcessState::*;
    Some(match &after.last_cause {
        Cause::Submitted => return None,
        Cause::Claimed { .. } => Trigger::Claimed,
        Cause::Succeeded { action: Action::Do, .. } if after.state == Processed => Trigger::Finished,
        Cause::Succeeded { action: Action::Do, .. } => Trigger::Advanced,
        Cause::Succeeded { action: Action::Undo, .. } if after.state == Compensated => Trigger::Undone,
        Cause::Succeeded { action: Action::Undo, .. } => Trigger::UndoAdvanced,
        Cause::Failed { .. } | Cause::DeadlinePassed { .. } => match (before.state, after.state) {
            (_, Error) => Trigger::Fail,
            (_, Compensated) => Trigger::Undone,
            (Compensating, Compensating) => Trigger::Retry,
            (_, Compensating) => Trigger::Undo,
            (_, Pending) => Trigger::Retry,
            _ => return None,
        },
    })
}

/// (state, trigger) of every landed transition of the run.
pub fn coverage(run: &Outcome) -> BTreeMap<(ProcessState, Trigger), u64> {
    let mut seen = BTreeMap::new();
    for w in &run.writes {
        if let Some(before) = &w.before
            && let Some(trigger) = infer_trigger(before, &w.after)
        {
            *seen.entry((before.state, trigger)).or_default() += 1;
        }
    }
    seen
}

fn reason(m: &sas::adapters::embedded::StoredMessage) -> Option<&str> {
    m.attributes.get(REASON_ATTRIBUTE).map(String::as_str)
}

fn short(s: &str) -> String {
    if s.len() <= 120 { s.to_owned() } else { format!("{}…", &s[..s.floor_char_boundary(120)]) }
}

/// One landed write of a task: after, before, and the true time it landed.
type HistoryEntry<'a> = (&'a TaskRecord, Option<&'a TaskRecord>, u64);

/// Every violation of the run; empty means every invariant held.
pub fn check(run: &Outcome) -> Vec<Violation> {
    let mut found: Vec<Violation> = run.runtime.clone();
    let mut add = |invariant: &'static str, detail: String| found.push(Violation::new(invariant, detail));
    let threshold = run.policy.failure_threshold;
    let tasks: BTreeMap<&str, &TaskRecord> = run.tasks.iter().map(|t| (t.order_id.as_str(), t)).collect();

    // ---- no loss: orders, bad input, internal messages ----
    let dlq_of = |queue: &str| match queue {
        ORDERS => ORDERS_DLQ,
        SCHEDULER => SCHEDULER_DLQ,
        AGENT => AGENT_DLQ,
        _ => unreachable!("arrivals go to the work queues"),
    };
    let kept = |queue: &str, body: &str| -> Vec<Option<&str>> {
        run.dead_letters[dlq_of(queue)].iter().filter(|m| m.body == body).map(reason).collect()
    };
    let redriven = |queue: &str, body: &str| {
        run.dead_letters[dlq_of(queue)]
            .iter()
            .any(|m| m.body == body && reason(m).is_none() && m.receive_count >= MAX_RECEIVES)
    };
    let payload = |body: &str| {
        OrderRequest::parse(body).and_then(|r| r.validate(&run.workflows)).map(|(o, _)| o.payload()).ok()
    };
    let mut bad_bodies: BTreeSet<&str> = BTreeSet::new();
    for a in &run.arrivals {
        match &a.kind {
            Sent::Order { id } => {
                let stored = run.orders.iter().find(|(k, _)| k.as_str() == id).map(|(_, o)| o.payload());
                let mine = payload(&a.body);
                match (&stored, &mine) {
                    (Some(s), Some(m)) if s == m => {}
                    (Some(_), _) => {
                        let conflict = kept(a.queue, &a.body)
                            .into_iter()
                            .any(|r| r.is_some_and(|r| r.contains("different payload")));
                        if !conflict && !redriven(a.queue, &a.body) {
                            add(
                                ACCEPTED_OR_REJECTED,
                                format!("conflicting order {id} not kept with a reason: {}", short(&a.body)),
                            );
                        }
                    }
                    (None, _) => {
                        if !redriven(a.queue, &a.body) {
                            add(ACCEPTED_OR_REJECTED, format!("order {id} neither accepted nor kept: lost"));
                        }
                    }
                }
            }
            Sent::Bad { expect } => {
                bad_bodies.insert(&a.body);
                let ok = kept(a.queue, &a.body).into_iter().any(|r| r.is_some_and(|r| r.contains(expect)))
                    || redriven(a.queue, &a.body);
                if !ok {
                    add(
                        BAD_INPUT_KEPT,
                        format!(
                            "bad input to {} not kept with {expect:?}: {} (kept as {:?})",
                            a.queue,
                            short(&a.body),
                            kept(a.queue, &a.body)
                        ),
                    );
                }
            }
        }
    }
    for (dlq, messages) in &run.dead_letters {
        for m in messages {
            let Some(r) = reason(m) else { continue };
            if bad_bodies.contains(m.body.as_str()) {
                continue;
            }
            if *dlq == ORDERS_DLQ {
                if !r.contains("different payload") {
                    add(ACCEPTED_OR_REJECTED, format!("valid order rejected: {r}: {}", short(&m.body)));
                }
            } else {
                add(NO_INTERNAL_REJECT, format!("{dlq}: {r}: {}", short(&m.body)));
            }
        }
    }

    // ---- every write ----
    if run.write_ctx.len() != run.writes.len() {
        add(LIFECYCLE, format!("{} writes but {} write contexts", run.writes.len(), run.write_ctx.len()));
        return found;
    }
    let mut latest: BTreeMap<&str, &TaskRecord> = BTreeMap::new();
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let after = &w.after;
        let id = after.order_id.as_str();
        if let Some(v) = after.shape_violation() {
            add(SHAPE, format!("order {id} revision {}: {v}", after.revision));
        }
        let Some(before) = &w.before else {
            if latest.contains_key(id) {
                add(TERMINAL_ONCE, format!("order {id} inserted twice"));
            }
            if after.state != ProcessState::Pending {
                add(LIFECYCLE, format!("order {id} inserted as {:?}", after.state));
            }
            latest.insert(id, after);
            continue;
        };
        if latest.get(id) != Some(&before) {
            add(LIFECYCLE, format!("order {id}: a write did not start from the latest revision"));
        }
        latest.insert(id, after);
        if before.state.is_terminal() {
            add(
                ABSORBING,
                format!("order {id} left {:?} for {:?} ({:?})", before.state, after.state, after.last_cause),
            );
        }
        if after.revision != before.revision + 1 {
            add(LIFECYCLE, format!("order {id}: revision {} -> {}", before.revision, after.revision));
        }
        match infer_trigger(before, after) {
            Some(t) if lifecycle::next(before.state, t) == Some(after.state) => {}
            t => add(
                LIFECYCLE,
                format!("order {id}: {:?} --{t:?}--> {:?} is not in the table", before.state, after.state),
            ),
        }
        if let (Some(old), Some(new)) = (before.locked_by, after.locked_by)
            && old != new
        {
            add(
                ONE_LEASE,
                format!("order {id}: live lease {old} replaced by {new} ({:?})", after.last_cause),
            );
        }
        // FailureCount.
        if after.failure_count < before.failure_count {
            add(
                FAILURES,
                format!("order {id}: FailureCount {} -> {}", before.failure_count, after.failure_count),
            );
        }
        let phase = after.failure_count.saturating_sub(after.undo_failure_base.unwrap_or(0));
        if phase > threshold {
            add(FAILURES, format!("order {id}: {phase} failures in one phase, threshold {threshold}"));
        }
        match &after.last_cause {
            Cause::DeadlinePassed { .. } => {
                if after.failure_count != before.failure_count + 1 {
                    add(FAILURES, format!("order {id}: a lapse moved FailureCount by other than one"));
                }
                let used = after.failure_count.saturating_sub(before.undo_failure_base.unwrap_or(0));
                let retried = after.state == ProcessState::Pending
                    || (before.state == ProcessState::Compensating
                        && after.state == ProcessState::Compensating);
                if retried != (used < threshold) {
                    add(
                        FAILURES,
                        format!(
                            "order {id}: {used} failures of {threshold} and the lapse went to {:?}",
                            after.state
                        ),
                    );
                }
                if ctx.function != Some(Function::Supervisor) {
                    add(LIFECYCLE, format!("order {id}: a lapse written by {:?}", ctx.function));
                }
            }
            _ if after.failure_count != before.failure_count => {
                add(FAILURES, format!("order {id}: {:?} changed FailureCount", after.last_cause));
            }
            _ => {}
        }
        // The fence, checked against the very reply the write was made for.
        let message = ctx.message.as_deref().map(SchedulerMessage::parse);
        match &after.last_cause {
            Cause::Claimed { .. } => {
                if !matches!(&message, Some(Ok(SchedulerMessage::Schedule { order_id })) if order_id.as_str() == id)
                {
                    add(LIFECYCLE, format!("order {id}: claimed while handling {:?}", ctx.message));
                }
                if before.locked_by.is_some() {
                    add(
                        ONE_LEASE,
                        format!("order {id}: claimed while lease {:?} was live", before.locked_by),
                    );
                }
            }
            Cause::Succeeded { step, action } | Cause::Failed { step, action, .. }
                if ctx.function == Some(Function::Scheduler) =>
            {
                let Some(Ok(SchedulerMessage::Reply(reply))) = message else {
                    add(FENCED, format!("order {id}: a reply's write made while handling {:?}", ctx.message));
                    continue;
                };
                let succeeded = matches!(after.last_cause, Cause::Succeeded { .. });
                let live = reply.order_id.as_str() == id
                    && before.locked_by == Some(reply.lease)
                    && before.attempt == reply.attempt
                    && before.step == reply.step
                    && before.action() == reply.action
                    && (*step, *action) == (reply.step, reply.action)
                    && succeeded == matches!(reply.outcome, sas::domain::ReplyOutcome::Succeeded)
                    && before.complete_by.is_some_and(|cb| after.updated_at <= cb);
                if !live {
                    add(
                        FENCED,
                        format!(
                            "order {id}: reply (step {} {:?}, attempt {}, lease {}) applied to step {} {:?} attempt {} lease {:?} complete-by {:?} at {}",
                            reply.step,
                            reply.action,
                            reply.attempt,
                            reply.lease,
                            before.step,
                            before.action(),
                            before.attempt,
                            before.locked_by,
                            before.complete_by,
                            after.updated_at
                        ),
                    );
                }
            }
            Cause::Succeeded { .. } => {
                add(FENCED, format!("order {id}: a success written by {:?}", ctx.function));
            }
            _ => {}
        }
    }

    // ---- each order's history ----
    let mut histories: BTreeMap<&str, Vec<HistoryEntry>> = BTreeMap::new();
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        histories.entry(w.after.order_id.as_str()).or_default().push((&w.after, w.before.as_ref(), ctx.at));
    }
    let applied = |id: &str, step: u32, action: Action| {
        let oid = sas::domain::OrderId::parse(id).expect("stored ids are valid");
        run.ledger.applied.contains_key(&idempotency_key(&oid, step, action).0)
    };
    let deadline = run.quiet_at + run.bound_ms;
    for (id, &task) in &tasks {
        let Some(workflow) = run.workflows.get(&task.workflow) else {
            add(SHAPE, format!("order {id}: unknown workflow {}", task.workflow));
            continue;
        };
        if task.order.order_id != task.order_id || task.order.workflow != task.workflow {
            add(
                SHAPE,
                format!(
                    "task {id} carries order {} of workflow {}",
                    task.order.order_id, task.order.workflow
                ),
            );
        }
        let history = histories.get(id).map(Vec::as_slice).unwrap_or_default();
        let mut claimed_do = BTreeSet::new();
        let mut undone: Vec<u32> = Vec::new();
        let mut terminal_entries = Vec::new();
        for (after, before, at) in history {
            match &after.last_cause {
                Cause::Claimed { step, action: Action::Do } => {
                    claimed_do.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Undo } => undone.push(*step),
                _ => {}
            }
            if after.state.is_terminal() && before.is_none_or(|b| !b.state.is_terminal()) {
                terminal_entries.push(*at);
            }
        }
        if !task.state.is_terminal() {
            add(TERMINAL_ONCE, format!("order {id} ended {:?} at step {}", task.state, task.step));
        } else if terminal_entries.len() != 1 {
            add(
                TERMINAL_ONCE,
                format!("order {id} entered a terminal state {} times", terminal_entries.len()),
            );
        }
        if let Some(&at) = terminal_entries.first()
            && at > deadline
        {
            add(
                LIVENESS,
                format!(
                    "order {id} ended at {at}ms, after the bound {deadline}ms (faults stopped at {}ms)",
                    run.quiet_at
                ),
            );
        }
        // Giving up tells an operator: every move to Error, and every give-up at the
        // failure threshold, has its alert (same state and FailureCount).
        for (after, before, _) in history {
            let Some(before) = before else { continue };
            let gave_up = matches!(after.last_cause, Cause::DeadlinePassed { .. })
                && infer_trigger(before, after) != Some(Trigger::Retry);
            if (after.state == ProcessState::Error || gave_up)
                && !run.alerts.iter().any(|a| {
                    a.order_id.as_str() == *id
                        && a.state == after.state
                        && a.failure_count == after.failure_count
                })
            {
                add(
                    ALERTED,
                    format!("order {id} went to {:?} ({:?}) without an alert", after.state, after.last_cause),
                );
            }
        }
        // Compensation in the records: descending, once each, only what ran forward.
        if undone.windows(2).any(|p| p[0] <= p[1]) {
            add(COMPENSATION, format!("order {id}: compensations in order {undone:?}"));
        }
        for step in &undone {
            if !claimed_do.contains(step) || workflow.step(*step).is_none_or(|s| s.compensation.is_none()) {
                add(
                    COMPENSATION,
                    format!("order {id}: undid step {step}, which never ran or cannot be undone"),
                );
            }
        }
        // Compensation at the remote side.
        let effects: Vec<(u32, Action)> = run
            .ledger
            .effects
            .iter()
            .filter(|(_, o, ..)| o == id)
            .map(|(_, _, step, action)| (*step, *action))
            .collect();
        let undo_steps: Vec<u32> =
            effects.iter().filter(|(_, a)| *a == Action::Undo).map(|(s, _)| *s).collect();
        if undo_steps.windows(2).any(|p| p[0] <= p[1]) {
            add(COMPENSATION, format!("order {id}: the remote undid steps in order {undo_steps:?}"));
        }
        for (i, (step, action)) in effects.iter().enumerate() {
            if *action == Action::Do && effects[..i].contains(&(*step, Action::Undo)) {
                add(COMPENSATION, format!("order {id}: step {step} took effect after it was undone"));
            }
            if *action == Action::Undo && !effects[..i].contains(&(*step, Action::Do)) {
                // Undoing a step that never took effect is a harmless no-op by design.
            }
        }
        for step in 0..workflow.len() {
            let compensable = workflow.step(step).is_some_and(|s| s.compensation.is_some());
            let done = applied(id, step, Action::Do);
            let undone_remote = applied(id, step, Action::Undo);
            match task.state {
                ProcessState::Processed if !done || undone_remote => add(
                    REMOTE_AGREES,
                    format!("order {id} Processed but step {step}: done {done}, undone {undone_remote}"),
                ),
                ProcessState::Compensated if compensable && done && !undone_remote => add(
                    COMPENSATION,
                    format!("order {id} Compensated but step {step} took effect and was never undone"),
                ),
                _ => {}
            }
        }
    }

    // ---- the remote side: one key per step and action, each effect at most once ----
    for ((order, step, action), keys) in &run.ledger.keys {
        let oid = sas::domain::OrderId::parse(order).expect("valid");
        let want = idempotency_key(&oid, *step, *action).0;
        if keys.len() != 1 || !keys.contains(&want) {
            add(IDEMPOTENCY, format!("order {order} step {step} {action:?} called with keys {keys:?}"));
        }
    }
    for (key, n) in &run.ledger.applied {
        if *n > 1 {
            add(IDEMPOTENCY, format!("effect {key} applied {n} times"));
        }
    }
    found
}
