//! The simulation's checker: the shared invariants over the run's records
//! (`invariants.rs`), plus what only the simulation can see: every message that arrived
//! and where it was kept, which function wrote each write and for which message, and
//! true time (for liveness).

use std::collections::{BTreeMap, BTreeSet};

use sas::adapters::embedded::queue_names::{AGENT, AGENT_DLQ, ORDERS, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ};
use sas::domain::{Act, Cause, MessageError, OrderRequest, ProcessState, SchedulerMessage, Trigger};
use sas::handlers::REASON_ATTRIBUTE;

use crate::deployment::{MAX_RECEIVES, Role};
pub use crate::invariants::{Invariant, Violation};
use crate::invariants::{Records, check_records};
use crate::run::Outcome;
use crate::workload::Input;

/// (state, trigger) of every landed transition of the run.
pub fn coverage(run: &Outcome) -> BTreeMap<(ProcessState, Trigger), u64> {
    crate::invariants::coverage(&run.writes, &run.workflows)
}

fn reason(m: &sas::adapters::embedded::StoredMessage) -> Option<&str> {
    m.attributes.get(REASON_ATTRIBUTE).map(String::as_str)
}

fn short(s: &str) -> String {
    if s.len() <= 120 { s.to_owned() } else { format!("{}…", &s[..s.floor_char_boundary(120)]) }
}

fn is_schedule_of(message: &Option<Result<SchedulerMessage, MessageError>>, id: &str) -> bool {
    matches!(message, Some(Ok(SchedulerMessage::Schedule { order_id })) if order_id.as_str() == id)
}

/// Every violation of the run; empty means every invariant held.
pub fn check(run: &Outcome) -> Vec<Violation> {
    let mut found: Vec<Violation> = run.runtime.clone();
    found.extend(check_records(&Records {
        workflows: &run.workflows,
        policy: &run.policy,
        tasks: &run.tasks,
        writes: &run.writes,
        alerts: &run.alerts,
        ledger: &run.ledger,
    }));
    let mut add = |invariant: Invariant, detail: String| found.push(Violation::new(invariant, detail));

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
    let mut cancel_bodies: BTreeSet<&str> = BTreeSet::new();
    let mut foreign_cancels: BTreeSet<&str> = BTreeSet::new();
    for a in &run.arrivals {
        match &a.kind {
            // A cancel lands (the write names its reason: `OperatorOnce`), is refused (its
            // order ended or is undoing), or is kept when its order never came (below).
            Input::Cancel { foreign: false, .. } => {
                cancel_bodies.insert(&a.body);
            }
            // One from a sender other than the order's is kept with that reason (or, its
            // order not there yet, as one that found no order), and never lands (below).
            Input::Cancel { id, foreign: true } => {
                cancel_bodies.insert(&a.body);
                foreign_cancels.insert(&a.body);
                let ok = kept(a.queue, &a.body)
                    .into_iter()
                    .any(|r| r.is_some_and(|r| r.contains("another sender") || r.contains("to cancel")))
                    || redriven(a.queue, &a.body);
                if !ok {
                    add(
                        Invariant::BadInputKept,
                        format!("a cancel of order {id} from another sender not kept with its reason"),
                    );
                }
            }
            Input::Order { id } => {
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
                                Invariant::AcceptedOrRejected,
                                format!("conflicting order {id} not kept with a reason: {}", short(&a.body)),
                            );
                        }
                    }
                    (None, _) => {
                        if !redriven(a.queue, &a.body) {
                            add(
                                Invariant::AcceptedOrRejected,
                                format!("order {id} neither accepted nor kept: lost"),
                            );
                        }
                    }
                }
            }
            Input::Bad { expect } => {
                bad_bodies.insert(&a.body);
                let ok = kept(a.queue, &a.body).into_iter().any(|r| r.is_some_and(|r| r.contains(expect)))
                    || redriven(a.queue, &a.body);
                if !ok {
                    add(
                        Invariant::BadInputKept,
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
                let cancel_without_order = cancel_bodies.contains(m.body.as_str()) && r.contains("to cancel");
                let foreign = foreign_cancels.contains(m.body.as_str()) && r.contains("another sender");
                if !r.contains("different payload") && !cancel_without_order && !foreign {
                    add(
                        Invariant::AcceptedOrRejected,
                        format!("valid order rejected: {r}: {}", short(&m.body)),
                    );
                }
            } else {
                add(Invariant::NoInternalReject, format!("{dlq}: {r}: {}", short(&m.body)));
            }
        }
    }

    // ---- every write, against who wrote it and for which message ----
    if run.write_ctx.len() != run.writes.len() {
        add(
            Invariant::Lifecycle,
            format!("{} writes but {} write contexts", run.writes.len(), run.write_ctx.len()),
        );
        return found;
    }
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let id = after.order_id.as_str();
        let message = ctx.message.as_deref().map(SchedulerMessage::parse);
        match &after.last_cause {
            Cause::DeadlinePassed { .. } if ctx.role != Some(Role::Supervisor) => {
                add(Invariant::Lifecycle, format!("order {id}: a lapse written by {:?}", ctx.role));
            }
            // Operators act through `sasctl tasks`; apps cancel through the orders queue.
            Cause::Operator { .. } if !matches!(ctx.role, Some(Role::Operator | Role::Submission)) => {
                add(
                    Invariant::Lifecycle,
                    format!("order {id}: an operator's action written by {:?}", ctx.role),
                );
            }
            // Judged by who sent the cancel, as the workload made it, not by the record.
            Cause::Operator { act: Act::Cancel, .. }
                if ctx.message.as_deref().is_some_and(|m| foreign_cancels.contains(m)) =>
            {
                add(
                    Invariant::CancelBySubmitter,
                    format!("order {id}: cancelled by a message from another sender: {:?}", ctx.message),
                );
            }
            Cause::Claimed { .. } if !is_schedule_of(&message, id) => {
                add(Invariant::Lifecycle, format!("order {id}: claimed while handling {:?}", ctx.message));
            }
            Cause::Slept { .. } if !(ctx.role == Some(Role::Scheduler) && is_schedule_of(&message, id)) => {
                add(
                    Invariant::Lifecycle,
                    format!("order {id}: put to sleep while handling {:?}", ctx.message),
                );
            }
            Cause::Woke { .. }
                if !(ctx.role == Some(Role::Supervisor)
                    || (ctx.role == Some(Role::Scheduler) && is_schedule_of(&message, id))) =>
            {
                add(
                    Invariant::Lifecycle,
                    format!("order {id}: woken by {:?} for {:?}", ctx.role, ctx.message),
                );
            }
            // A timer step whose time cannot be read fails for good when a Schedule comes.
            Cause::Failed { step, action: sas::domain::Action::Do, .. }
                if ctx.role == Some(Role::Scheduler)
                    && is_schedule_of(&message, id)
                    && before.state == ProcessState::Pending
                    && *step == before.step
                    && run
                        .workflows
                        .get_version(&before.workflow, before.workflow_version)
                        .and_then(|wf| wf.step(*step))
                        .is_some_and(|s| s.is_timer()) => {}
            // The fence, checked against the very reply the write was made for.
            Cause::Succeeded { step, action } | Cause::Failed { step, action, .. }
                if ctx.role == Some(Role::Scheduler) =>
            {
                let Some(Ok(SchedulerMessage::Reply(reply))) = message else {
                    add(
                        Invariant::Fenced,
                        format!("order {id}: a reply's write made while handling {:?}", ctx.message),
                    );
                    continue;
                };
                let succeeded = matches!(after.last_cause, Cause::Succeeded { .. });
                let live = reply.order_id.as_str() == id
                    && before.locked_by == Some(reply.lease)
                    && before.attempt == reply.attempt
                    && before.step == reply.step
                    && before.action() == reply.action
                    && (*step, *action) == (reply.step, reply.action)
                    && succeeded == matches!(reply.outcome, sas::domain::ReplyOutcome::Succeeded { .. })
                    && before.complete_by.is_some_and(|cb| after.updated_at <= cb);
                if !live {
                    add(
                        Invariant::Fenced,
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
            Cause::Succeeded { .. } | Cause::Failed { .. } => {
                add(Invariant::Fenced, format!("order {id}: a reply's outcome written by {:?}", ctx.role));
            }
            _ => {}
        }
    }

    // ---- timers: never early, and on time once the faults stop ----
    // A wake time is read on the sleeping function's clock and checked on the waking one's;
    // each may be off true time by the run's skew, so true time allows that much.
    let faults = &run.swarm.faults;
    let skew = faults.skew_max_ms;
    let on_time = crate::deployment::SUPERVISOR_PERIOD_MS + skew + faults.overshoot_max_ms + 1_000;
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let Some(before) = w.before.as_ref().filter(|b| b.state == ProcessState::Waiting) else { continue };
        let (Cause::Woke { .. }, Some(at)) = (&w.after.last_cause, before.wake_at) else { continue };
        let id = w.after.order_id.as_str();
        if ctx.at + skew < at.0 {
            add(
                Invariant::TimerNotEarly,
                format!("order {id}: timer due at {at} woke at {}ms (clock skew allowed: {skew}ms)", ctx.at),
            );
        }
        // Late from its wake time, or from when the world ran again after the faults if a
        // time jump of the fault window carried the clock past both (nothing runs during a
        // jump, the supervisor included).
        let from = at.0.max(run.resumed_at);
        if at.0 + skew >= run.quiet_at && ctx.at > from + on_time {
            add(
                Invariant::TimerOnTime,
                format!("order {id}: timer due at {at} woke at {}ms, more than {on_time}ms late", ctx.at),
            );
        }
    }

    // ---- a paused task holds still: nothing is claimed and no timer starts ----
    for w in &run.writes {
        let Some(before) = w.before.as_ref().filter(|b| b.paused) else { continue };
        if matches!(w.after.last_cause, Cause::Claimed { .. } | Cause::Slept { .. })
            && w.after.revision > before.revision
        {
            add(
                Invariant::PausedHoldsStill,
                format!("order {}: {:?} while paused", w.after.order_id, w.after.last_cause),
            );
        }
    }

    // ---- liveness: every order ended within the bound after the faults stopped ----
    let deadline = run.quiet_at + run.bound_ms;
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let entered_terminal =
            w.after.state.is_terminal() && w.before.as_ref().is_none_or(|b| !b.state.is_terminal());
        if entered_terminal && ctx.at > deadline {
            add(
                Invariant::Liveness,
                format!(
                    "order {} ended at {}ms, after the bound {deadline}ms (faults stopped at {}ms)",
                    w.after.order_id, ctx.at, run.quiet_at
                ),
            );
        }
    }
    found
}
