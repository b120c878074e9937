//! The simulation's checker: the shared invariants over the run's records
//! (`invariants/`), plus what only the simulation can see: every message that arrived
//! and where it was kept, which function wrote each write and for which message, and
//! true time (for liveness).

use std::collections::{BTreeMap, BTreeSet};

use sas::adapters::embedded::queue_names::{AGENT, AGENT_DLQ, ORDERS, ORDERS_DLQ, SCHEDULER, SCHEDULER_DLQ};
use sas::domain::{
    Act, Action, CallbackMessage, CallbackToken, Cause, Completion, MessageError, OrderRequest, ProcessState,
    SchedulerMessage, Trigger, idempotency_key,
};
use sas::handlers::REASON_ATTRIBUTE;

use crate::deployment::{CALLBACKS, CALLBACKS_DLQ, MAX_RECEIVES, Role};
pub use crate::invariants::{Invariant, Violation};
use crate::invariants::{
    Records, branch_live, check_records, dispatched_branches, item_reply_fenced, running_stage, stages_passed,
};
use crate::ledger::Settled;
use crate::run::Outcome;
use crate::workload::Input;

/// (state, trigger) of every landed transition of the run.
pub fn coverage(run: &Outcome) -> BTreeMap<(ProcessState, Trigger), u64> {
    crate::invariants::coverage(&run.writes, &run.workflows)
}

/// What the run's map steps went through (`invariants::map_coverage`).
pub fn map_coverage(run: &Outcome) -> BTreeMap<&'static str, u64> {
    crate::invariants::map_coverage(&run.writes, &run.workflows)
}

/// What the run's parallel stages went through: how their branch replies arrived
/// (`Outcome::branch_replies`) and what the writes did with them.
pub fn stage_coverage(run: &Outcome) -> BTreeMap<&'static str, u64> {
    let mut seen = run.branch_replies.clone();
    let mut count = |kind: &'static str| *seen.entry(kind).or_default() += 1;
    for w in &run.writes {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(wf) = run.workflows.get_version(&after.workflow, after.workflow_version) else { continue };
        if wf.stages.is_empty() {
            continue;
        }
        if dispatched_branches(w).is_some() {
            count("stage_claims");
        }
        if !stages_passed(before, after, wf).is_empty() {
            count("stages_joined");
        }
        let stopped = matches!(
            after.state(),
            ProcessState::Compensating | ProcessState::Compensated | ProcessState::Error
        );
        if running_stage(before, wf).is_some() && stopped {
            count(match after.last_cause {
                Cause::Operator { .. } => "stages_cancelled",
                _ => "stages_given_up",
            });
        }
        match after.last_cause {
            Cause::Succeeded { action: Action::Do, .. } if after.state() == ProcessState::Processing => {
                count("branches_done")
            }
            Cause::Succeeded { step, action: Action::Undo } if wf.stage_of(step).is_some() => {
                count("branches_undone")
            }
            _ => {}
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

/// Whether `kept` is the message `sent`, as sent or as the scheduler sent it again after
/// the state store throttled it (the same Schedule, counting its resends).
fn same_message(kept: &str, sent: &str) -> bool {
    if kept == sent {
        return true;
    }
    let unthrottled = |body: &str| match SchedulerMessage::parse(body) {
        Ok(SchedulerMessage::Schedule { order_id, turn, .. }) => {
            Some(SchedulerMessage::Schedule { order_id, turn, throttled: 0 })
        }
        _ => None,
    };
    kept.contains(r#""throttled":"#) && unthrottled(kept).is_some_and(|k| unthrottled(sent) == Some(k))
}

fn is_schedule_of(message: &Option<Result<SchedulerMessage, MessageError>>, id: &str) -> bool {
    matches!(message, Some(Ok(SchedulerMessage::Schedule { order_id, .. })) if order_id.as_str() == id)
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
        CALLBACKS => CALLBACKS_DLQ,
        _ => unreachable!("arrivals go to the work queues"),
    };
    let kept = |queue: &str, body: &str| -> Vec<Option<&str>> {
        run.dead_letters[dlq_of(queue)].iter().filter(|m| same_message(&m.body, body)).map(reason).collect()
    };
    let redriven = |queue: &str, body: &str| {
        run.dead_letters[dlq_of(queue)]
            .iter()
            .any(|m| same_message(&m.body, body) && reason(m).is_none() && m.receive_count >= MAX_RECEIVES)
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
    // The outside's words: a malformed one is kept with its reason; any other may be refused
    // (late, stale, forged, a duplicate, a step that ended) and is then kept with the reason
    // it was refused for, as docs/REFERENCE.md says of the callback queue.
    let words: BTreeSet<&str> = run.outside.sent.iter().map(|s| s.body.as_str()).collect();
    for sent in run.outside.sent.iter().filter(|s| !s.direct) {
        let Some(expect) = sent.expect else { continue };
        let ok = kept(CALLBACKS, &sent.body).into_iter().any(|r| r.is_some_and(|r| r.contains(expect)))
            || redriven(CALLBACKS, &sent.body);
        if !ok {
            add(
                Invariant::BadInputKept,
                format!(
                    "malformed callback message not kept with {expect:?}: {} (kept as {:?})",
                    short(&sent.body),
                    kept(CALLBACKS, &sent.body)
                ),
            );
        }
    }
    for (dlq, messages) in &run.dead_letters {
        for m in messages {
            let Some(r) = reason(m) else { continue };
            if bad_bodies.iter().any(|b| same_message(&m.body, b)) {
                continue;
            }
            if *dlq == CALLBACKS_DLQ && words.contains(m.body.as_str()) {
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
    // Orders that ever held a ticket at a gate, as of the write at hand.
    let mut ever_queued: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let id = after.order_id.as_str();
        if before.queued().is_some() {
            ever_queued.insert(id);
        }
        // Made for a word of the outside: judged with the callbacks, below.
        if ctx.message.as_deref().is_some_and(|m| words.contains(m)) {
            continue;
        }
        // An operator's completion by hand (no token): only of the callback step the task
        // waits on, once its agent answered that the work started, before it is due, and
        // recorded with who gave it.
        if ctx.role == Some(Role::Operator)
            && let Cause::Completed { step } | Cause::Failed { step, action: Action::Do, .. } =
                after.last_cause
        {
            let waited = before
                .callback()
                .filter(|cb| before.state() == ProcessState::Waiting && cb.started_at.is_some());
            let fits = waited.is_some_and(|cb| cb.step == step && after.updated_at <= cb.due());
            let recorded =
                after.timeline.last().is_some_and(|e| e.by.as_deref() == Some(crate::operator::OPERATOR));
            if !(fits && recorded) {
                add(
                    Invariant::RefusedCompletionChangesNothing,
                    format!(
                        "order {id}: completed by hand as {:?} at {} while {:?} at step {} waited on {waited:?} (recorded: {recorded})",
                        after.last_cause,
                        after.updated_at,
                        before.state(),
                        before.step
                    ),
                );
            }
            continue;
        }
        // Parsed only for the causes judged by it.
        let parsed = std::cell::OnceCell::new();
        let message = || parsed.get_or_init(|| ctx.message.as_deref().map(SchedulerMessage::parse));
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
            // Or a hand-over: the scheduler that let a turn through claims the task noted
            // for its ticket while handling whatever freed the place (a reply, a look,
            // another claim), as the turn's Schedule would; the task may have left the
            // line since (`Scheduling::woken_for`).
            Cause::Claimed { .. } | Cause::NoItems { .. }
                if !(is_schedule_of(message(), id)
                    || (ctx.role == Some(Role::Scheduler) && ever_queued.contains(id))) =>
            {
                add(Invariant::Lifecycle, format!("order {id}: claimed while handling {:?}", ctx.message));
            }
            // A hand-over decides as the turn's Schedule would: a task woken for a ticket
            // it no longer holds hands the turn on, then is decided as it stands (a timer
            // step it moved on to sleeps, wakes or fails as under its own Schedule).
            Cause::Slept { .. }
                if !(ctx.role == Some(Role::Scheduler)
                    && (is_schedule_of(message(), id) || ever_queued.contains(id))) =>
            {
                add(
                    Invariant::Lifecycle,
                    format!("order {id}: put to sleep while handling {:?}", ctx.message),
                );
            }
            Cause::Woke { .. }
                if !(ctx.role == Some(Role::Supervisor)
                    || (ctx.role == Some(Role::Scheduler)
                        && (is_schedule_of(message(), id) || ever_queued.contains(id)))) =>
            {
                add(
                    Invariant::Lifecycle,
                    format!("order {id}: woken by {:?} for {:?}", ctx.role, ctx.message),
                );
            }
            // A timer step whose time cannot be read fails for good when a Schedule comes.
            Cause::Failed { step, action: sas::domain::Action::Do, .. }
                if ctx.role == Some(Role::Scheduler)
                    && (is_schedule_of(message(), id) || ever_queued.contains(id))
                    && before.state() == ProcessState::Pending
                    && *step == before.step
                    && run
                        .workflows
                        .get_version(&before.workflow, before.workflow_version)
                        .and_then(|wf| wf.step(*step))
                        .is_some_and(|s| s.is_timer()) => {}
            // The fence, checked against the very reply the write was made for (a callback
            // step's agent answering success starts the outside's work).
            Cause::Succeeded { .. } | Cause::Failed { .. } | Cause::Started { .. }
                if ctx.role == Some(Role::Scheduler) =>
            {
                let (step, action) = match &after.last_cause {
                    Cause::Succeeded { step, action } | Cause::Failed { step, action, .. } => {
                        (*step, *action)
                    }
                    Cause::Started { step } => (*step, sas::domain::Action::Do),
                    _ => unreachable!("matched above"),
                };
                let Some(Ok(SchedulerMessage::Reply(reply))) = message() else {
                    add(
                        Invariant::Fenced,
                        format!("order {id}: a reply's write made while handling {:?}", ctx.message),
                    );
                    continue;
                };
                let succeeded = matches!(after.last_cause, Cause::Succeeded { .. } | Cause::Started { .. });
                let wf = run.workflows.get_version(&before.workflow, before.workflow_version);
                // A map item's reply: fenced on its own dispatch (`invariants::item_reply_fenced`).
                if let Some(map) =
                    wf.and_then(|wf| wf.map_at(reply.step)).filter(|_| reply.action == Action::Do)
                {
                    if let Some(why) = item_reply_fenced(before, after, reply, (step, action), succeeded) {
                        add(
                            Invariant::Fenced,
                            format!("order {id}: reply of item {:?} of map {}: {why}", reply.index, map.name),
                        );
                    }
                    continue;
                }
                // A branch's reply: fenced on its own dispatch (attempt, complete-by) under the
                // stage's lease; after its stage ended it must change nothing.
                if let Some(stage) =
                    wf.and_then(|wf| wf.stage_of(reply.step)).filter(|_| reply.action == Action::Do)
                {
                    let branch = before.stage().and_then(|r| r.branch(reply.step));
                    let live = reply.order_id.as_str() == id
                        && before.locked_by() == Some(reply.lease)
                        && branch_live(before, reply.step, after.updated_at)
                        && branch.is_some_and(|b| b.attempt == reply.attempt)
                        && (step, action) == (reply.step, reply.action)
                        && succeeded == matches!(reply.outcome, sas::domain::ReplyOutcome::Succeeded { .. });
                    if !live {
                        let ended = wf.and_then(|wf| running_stage(before, wf)) != Some(stage);
                        add(
                            if ended { Invariant::LateBranchReplyChangesNothing } else { Invariant::Fenced },
                            format!(
                                "order {id}: reply of branch {} of stage {} (attempt {}, lease {}) applied to {:?} at step {} lease {:?}, branch {branch:?}, as {:?} at {}",
                                reply.step,
                                stage.name,
                                reply.attempt,
                                reply.lease,
                                before.state(),
                                before.step,
                                before.locked_by(),
                                after.last_cause,
                                after.updated_at
                            ),
                        );
                    }
                    continue;
                }
                let live = reply.order_id.as_str() == id
                    && before.locked_by() == Some(reply.lease)
                    && before.attempt == reply.attempt
                    && before.step == reply.step
                    && before.action() == reply.action
                    && (step, action) == (reply.step, reply.action)
                    && succeeded == matches!(reply.outcome, sas::domain::ReplyOutcome::Succeeded { .. })
                    && before.complete_by().is_some_and(|cb| after.updated_at <= cb);
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
                            before.locked_by(),
                            before.complete_by(),
                            after.updated_at
                        ),
                    );
                }
            }
            Cause::Succeeded { .. } | Cause::Failed { .. } | Cause::Started { .. } => {
                add(Invariant::Fenced, format!("order {id}: a reply's outcome written by {:?}", ctx.role));
            }
            Cause::Completed { .. } | Cause::Heartbeat { .. } => {
                add(
                    Invariant::RefusedCompletionChangesNothing,
                    format!(
                        "order {id}: {:?} written by {:?} for {:?}, no word of the outside",
                        after.last_cause, ctx.role, ctx.message
                    ),
                );
            }
            _ => {}
        }
    }

    // ---- a stage is joined only once every branch took effect, in true time ----
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(wf) = run.workflows.get_version(&after.workflow, after.workflow_version) else { continue };
        for stage in stages_passed(before, after, wf) {
            // Not applied at all is the shared checker's (`invariants/writes.rs`); here, applied
            // only after the write that went past the stage landed.
            let late: Vec<(u32, u64)> = stage
                .branches()
                .filter_map(|b| {
                    match run.ledger.settled.get(&idempotency_key(&after.order_id, b, Action::Do).0) {
                        Some(Settled::Applied { at }) if *at > ctx.at => Some((b, *at)),
                        _ => None,
                    }
                })
                .collect();
            if !late.is_empty() {
                add(
                    Invariant::StageJoinsOnlyWhenAll,
                    format!(
                        "order {}: went past stage {} at {}ms ({:?}), before branches (step, applied at) {late:?} took effect",
                        after.order_id, stage.name, ctx.at, after.last_cause
                    ),
                );
            }
        }
    }

    // ---- timers: never early, and on time once the faults stop ----
    // A wake time is read on the sleeping function's clock and checked on the waking one's;
    // each may be off true time by the run's skew, so true time allows that much.
    let faults = &run.swarm.faults;
    let skew = faults.skew_max_ms;
    let on_time = crate::deployment::SUPERVISOR_PERIOD_MS + skew + faults.overshoot_max_ms + 1_000;
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let Some(before) = w.before.as_ref().filter(|b| b.state() == ProcessState::Waiting) else { continue };
        let (Cause::Woke { .. }, Some(at)) = (&w.after.last_cause, before.wake_at()) else { continue };
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
        let allowed = on_time + cut_short_between(run, from, ctx.at);
        if at.0 + skew >= run.quiet_at && ctx.at > from + allowed {
            add(
                Invariant::TimerOnTime,
                format!("order {id}: timer due at {at} woke at {}ms, more than {allowed}ms late", ctx.at),
            );
        }
    }

    // None is lost: a timer that went to sleep and was never woken (nor cancelled) by the
    // time the run ended, past its wake time by more than the slack, was lost.
    let mut asleep: BTreeMap<&str, sas::domain::Timestamp> = BTreeMap::new();
    for w in &run.writes {
        let id = w.after.order_id.as_str();
        match (w.after.state(), w.after.wake_at()) {
            (ProcessState::Waiting, Some(at)) => asleep.insert(id, at),
            _ => asleep.remove(id),
        };
    }
    for (id, at) in asleep {
        let from = at.0.max(run.resumed_at);
        if run.ended_at > from + on_time + cut_short_between(run, from, run.ended_at) {
            add(
                Invariant::TimerOnTime,
                format!("order {id}: timer due at {at} never woke (the run ended at {}ms)", run.ended_at),
            );
        }
    }

    callbacks(run, &words, &mut add);
    heartbeats_kept(run, skew, &mut add);

    // ---- a paused task holds still: nothing is claimed and no timer starts ----
    for w in &run.writes {
        let Some(before) = w.before.as_ref().filter(|b| b.paused()) else { continue };
        if matches!(w.after.last_cause, Cause::Claimed { .. } | Cause::Slept { .. })
            && w.after.revision > before.revision
        {
            add(
                Invariant::PausedHoldsStill,
                format!("order {}: {:?} while paused", w.after.order_id, w.after.last_cause),
            );
        }
    }

    tickets_handed_back(&run.writes, &run.write_ctx, &run.gates, &mut add);

    // ---- liveness: every order ended within the bound after the faults stopped ----
    let deadline = run.quiet_at + run.bound_ms;
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let entered_terminal =
            w.after.state().is_terminal() && w.before.as_ref().is_none_or(|b| !b.state().is_terminal());
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

/// The outside's words against the writes made for them. The outside party knows which
/// token it sent (`outside::Sent`) and the remote which the pipeline minted, for which
/// attempt (`outside::Handed`), so each write made for a word is judged by docs/DESIGN.md's rules
/// for callback steps, not by the domain's code:
/// - `RefusedCompletionChangesNothing`: a write is made for a word only when the word is
///   well formed, its token is one the pipeline minted, for the attempt the record waits on
///   (same step and attempt, the record's digest being the token's), while the record still
///   waits (Processing or Waiting) and before the callback is due; and it is the move the
///   word asks for (a heartbeat, a completion, or a failure as a refusal; a success whose
///   output cannot be kept gives up with the step in doubt). No write names a completion
///   or heartbeat that no word of the outside was handled for (above).
/// - `CallbackOnce`: an attempt is completed (success or failure) by at most one write,
///   counted both by the attempt the record waited on and by the attempt the token names.
fn callbacks(run: &Outcome, words: &BTreeSet<&str>, add: &mut impl FnMut(Invariant, String)) {
    let mut completions: BTreeMap<(&str, u32, u32), u32> = BTreeMap::new();
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(body) = ctx.message.as_deref().filter(|m| words.contains(m)) else { continue };
        let id = after.order_id.as_str();
        let word = CallbackMessage::parse(body).ok().and_then(|m| Some((m.completion().ok()?, m.token)));
        let Some((completion, token)) = word else {
            add(
                Invariant::RefusedCompletionChangesNothing,
                format!("order {id}: {:?} written for a malformed message {}", after.last_cause, short(body)),
            );
            continue;
        };
        let handed = run.outside.handed.get(&token);
        let digest = CallbackToken::parse(&token).map(|(t, _)| t.digest()).ok();
        let waits = before.callback();
        let live = handed.is_some_and(|h| {
            h.order_id == id
                && waits.is_some_and(|cb| {
                    (cb.step, cb.attempt) == (h.step, h.attempt) && Some(&cb.digest) == digest.as_ref()
                })
        }) && matches!(before.state(), ProcessState::Processing | ProcessState::Waiting)
            && waits.is_some_and(|cb| after.updated_at <= cb.due());
        if !live {
            add(
                Invariant::RefusedCompletionChangesNothing,
                format!(
                    "order {id}: {} with {} token {} (step, attempt {:?}) moved {:?} waiting on {:?} (due {:?}) to {:?} ({:?}) at {}",
                    completion.as_str(),
                    if handed.is_some() { "a minted" } else { "a forged" },
                    CallbackToken::parse(&token).map(|(t, _)| t.redacted()).unwrap_or_default(),
                    handed.map(|h| (h.step, h.attempt)),
                    before.state(),
                    waits.map(|cb| (cb.step, cb.attempt)),
                    waits.map(|cb| cb.due()),
                    after.state(),
                    after.last_cause,
                    after.updated_at
                ),
            );
        }
        let fits = matches!(
            (&completion, &after.last_cause),
            (Completion::Heartbeat, Cause::Heartbeat { .. })
                | (Completion::Success { .. }, Cause::Completed { .. })
                // An output that cannot be kept: the step gives up in doubt.
                | (Completion::Success { .. }, Cause::Failed { in_doubt: true, .. })
                // The outside declined: a refusal.
                | (Completion::Failure { .. }, Cause::Failed { in_doubt: false, .. })
        );
        if !fits {
            add(
                Invariant::RefusedCompletionChangesNothing,
                format!("order {id}: a {} wrote {:?}", completion.as_str(), after.last_cause),
            );
        }
        if completion == Completion::Heartbeat {
            continue;
        }
        let mut attempts = BTreeSet::new();
        attempts.extend(waits.map(|cb| (id, cb.step, cb.attempt)));
        attempts.extend(handed.map(|h| (h.order_id.as_str(), h.step, h.attempt)));
        for attempt in attempts {
            *completions.entry(attempt).or_default() += 1;
        }
    }
    for ((id, step, attempt), n) in completions {
        if n > 1 {
            add(
                Invariant::CallbackOnce,
                format!(
                    "order {id}: step {step} attempt {attempt} completed {n} times; history: {}",
                    crate::invariants::history_of(
                        &run.writes,
                        &sas::domain::OrderId::parse(id).expect("a stored id")
                    )
                ),
            );
        }
    }
}

/// A period for each supervisor run that stopped at its time budget between `from` and
/// `to`: what such a run left waits for the next. A budget the work outgrows makes timers
/// late by periods, as it would on AWS; the seeds that draw short runs draw them so.
fn cut_short_between(run: &Outcome, from: u64, to: u64) -> u64 {
    let runs = run.sweeps_cut_short.iter().filter(|&&at| at > from && at <= to).count() as u64;
    runs * crate::deployment::SUPERVISOR_PERIOD_MS
}

/// `Invariant::HeartbeatsKept`, both halves:
/// - A party that beats at least every interval is never lapsed: a lapse of a callback's
///   wait for a missed heartbeat (not its timeout) lands more than one interval after every
///   heartbeat of that attempt the pipeline acknowledged, written or only noted. Each time
///   is true time and each clock may be off it by the run's skew, so the two decisions' clocks
///   allow twice that (an acknowledgement is timed from when its handling began, a lapse by
///   its write: each no later than the decision's own clock read, and no earlier).
/// - A heartbeating step is written at most once per floor: each heartbeat write lands at
///   least the floor (`heartbeat_floor_ms`) after the last one written, or the claim, on the
///   writers' clocks, where the floor is decided.
fn heartbeats_kept(run: &Outcome, skew: u64, add: &mut impl FnMut(Invariant, String)) {
    // The acknowledged heartbeats of each minted token's attempt, by (order, step, attempt).
    let mut acked: BTreeMap<(&str, u32, u32), Vec<u64>> = BTreeMap::new();
    for a in &run.outside.acked {
        let Some(m) = CallbackMessage::parse(&a.body).ok() else { continue };
        if m.completion().ok() != Some(Completion::Heartbeat) {
            continue;
        }
        let Some(h) = run.outside.handed.get(&m.token) else { continue };
        acked.entry((h.order_id.as_str(), h.step, h.attempt)).or_default().push(a.at);
    }
    for (w, ctx) in run.writes.iter().zip(&run.write_ctx) {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(cb) = before.callback() else { continue };
        let id = after.order_id.as_str();
        match &after.last_cause {
            Cause::DeadlinePassed { state: ProcessState::Waiting, .. } if cb.due() < cb.timeout_at => {
                let Some(interval) = cb.heartbeat_ms else { continue };
                let beats = acked.get(&(id, cb.step, cb.attempt)).map_or(&[][..], Vec::as_slice);
                if let Some(at) = beats.iter().filter(|&&at| ctx.at + 2 * skew <= at + interval).max() {
                    add(
                        Invariant::HeartbeatsKept,
                        format!(
                            "order {id}: step {} attempt {} lapsed for a missed heartbeat at {} ms (due {}), though a heartbeat was acknowledged at {at} ms, within its {interval} ms interval (clock skew allowed: {skew} ms)",
                            cb.step,
                            cb.attempt,
                            ctx.at,
                            cb.due()
                        ),
                    );
                }
            }
            Cause::Heartbeat { .. } => {
                let Some(written) = after.callback().and_then(|a| a.last_heartbeat) else { continue };
                let floor = cb.floor_ms();
                if written < cb.beat_from().plus_ms(floor) {
                    add(
                        Invariant::HeartbeatsKept,
                        format!(
                            "order {id}: step {} attempt {}: a heartbeat written at {written}, {} ms after the last one written (or the claim) at {}, within the {floor} ms floor",
                            cb.step,
                            cb.attempt,
                            written.millis_since(cb.beat_from()),
                            cb.beat_from()
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// `Invariant::TicketsHandedBack`: every landed write that leaves a ticket without its
/// claim (the claim takes its turn with it: a lease appears), against the tickets let
/// through after the writing invocation ended cleanly.
fn tickets_handed_back(
    writes: &[sas::adapters::embedded::WriteRecord],
    ctx: &[crate::world::WriteCtx],
    log: &crate::gate_log::GateLog,
    add: &mut impl FnMut(Invariant, String),
) {
    for (w, ctx) in writes.iter().zip(ctx) {
        let Some(held) = w.before.as_ref().and_then(|b| b.queued()) else { continue };
        if w.after.queued() == Some(held) || w.after.locked_by().is_some() {
            continue;
        }
        let Some(&ended) = log.ended_clean.get(&ctx.invocation) else { continue };
        if let Some(late) =
            log.let_through.iter().find(|l| l.agent == held.agent && l.ticket == held.ticket && l.at > ended)
        {
            add(
                Invariant::TicketsHandedBack,
                format!(
                    "order {} left the line of agent {} (ticket {}) at {} ms, in invocation {} that ended cleanly at {ended} ms; the ticket was let through at {} ms",
                    w.after.order_id, held.agent, held.ticket, ctx.at, ctx.invocation, late.at
                ),
            );
        }
    }
}
