//! The one catalogue of the pipeline's invariants, and the checks that need nothing but
//! what every run leaves behind: the state table's write log, the final records, the
//! operator alerts and the remote service's ledger. The simulation (`check.rs`) and
//! `sasctl dev` (`cli/src/invariants.rs`) both run [`check_records`], then add what
//! only they can see (the simulation: which function wrote each write, for which
//! message, and true time; `dev`: the status queue and real-time progress).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sas::adapters::embedded::WriteRecord;
use sas::domain::workflow::Stage;
use sas::domain::{
    Act, Action, Cause, OperatorAlert, OrderId, Policy, ProcessState, StepKind, TaskRecord, Trigger,
    Workflow, Workflows, idempotency_key, lifecycle,
};

use crate::ledger::Ledger;

/// Every invariant a run is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    AcceptedOrRejected,
    TerminalOnce,
    Absorbing,
    Lifecycle,
    Shape,
    OneLease,
    Fenced,
    Failures,
    Compensation,
    NothingStands,
    PivotGoesForward,
    Outputs,
    Pinned,
    Idempotency,
    RemoteAgrees,
    Liveness,
    Supervised,
    NoPanic,
    BadInputKept,
    NoInternalReject,
    Alerted,
    Status,
    OperatorOnce,
    CancelledStaysOut,
    CancelBySubmitter,
    TimerNotEarly,
    TimerOnTime,
    PausedHoldsStill,
    CallbackOnce,
    RefusedCompletionChangesNothing,
    StageJoinsOnlyWhenAll,
    StageUndoExact,
    LateBranchReplyChangesNothing,
    RemoteWithinLimits,
}

impl Invariant {
    pub const ALL: [Invariant; 34] = [
        Invariant::AcceptedOrRejected,
        Invariant::TerminalOnce,
        Invariant::Absorbing,
        Invariant::Lifecycle,
        Invariant::Shape,
        Invariant::OneLease,
        Invariant::Fenced,
        Invariant::Failures,
        Invariant::Compensation,
        Invariant::NothingStands,
        Invariant::PivotGoesForward,
        Invariant::Outputs,
        Invariant::Pinned,
        Invariant::Idempotency,
        Invariant::RemoteAgrees,
        Invariant::Liveness,
        Invariant::Supervised,
        Invariant::NoPanic,
        Invariant::BadInputKept,
        Invariant::NoInternalReject,
        Invariant::Alerted,
        Invariant::Status,
        Invariant::OperatorOnce,
        Invariant::CancelledStaysOut,
        Invariant::CancelBySubmitter,
        Invariant::TimerNotEarly,
        Invariant::TimerOnTime,
        Invariant::PausedHoldsStill,
        Invariant::CallbackOnce,
        Invariant::RefusedCompletionChangesNothing,
        Invariant::StageJoinsOnlyWhenAll,
        Invariant::StageUndoExact,
        Invariant::LateBranchReplyChangesNothing,
        Invariant::RemoteWithinLimits,
    ];

    /// The invariant in words (docs/ARCHITECTURE.md, "What every run checks", lists them).
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::AcceptedOrRejected => {
                "every order sent is accepted or rejected with a reason, never lost"
            }
            Invariant::TerminalOnce => {
                "every accepted order reaches exactly one terminal state (again only after an operator reopened it)"
            }
            Invariant::Absorbing => "terminal states never change, except Error by an operator's action",
            Invariant::Lifecycle => "every write is a move of the transition table on the latest revision",
            Invariant::Shape => "every record is well-formed (lease, deadline)",
            Invariant::OneLease => "at most one live lease per task",
            Invariant::Fenced => "a stale reply never changes state",
            Invariant::Failures => "FailureCount only grows and each step's failure budget is honoured",
            Invariant::Compensation => {
                "each completed step of an undone task is compensated exactly once, in reverse order"
            }
            Invariant::NothingStands => {
                "a Compensated task left no effect standing at the remote side (no pivot, nothing un-undone)"
            }
            Invariant::PivotGoesForward => "once a pivot took effect, nothing of its task is undone",
            Invariant::Outputs => {
                "each step is handed the outputs of the steps before it, each compensation also the output of the step it undoes"
            }
            Invariant::Pinned => "a task runs only the steps of the workflow version it was accepted under",
            Invariant::Idempotency => "one idempotency key per step, its remote effect applied at most once",
            Invariant::RemoteAgrees => "the remote side agrees with the final state",
            Invariant::Liveness => "every order is terminal within a bound after the faults stop",
            Invariant::Supervised => "a task past its deadline is acted on by the next supervisor run",
            Invariant::NoPanic => "no handler panics",
            Invariant::BadInputKept => "bad input is kept with its reason",
            Invariant::NoInternalReject => "no message the pipeline made itself is rejected or lost",
            Invariant::Alerted => "every give-up (Error, or a spent failure budget) raises an operator alert",
            Invariant::Status => "reply_to receives each order's final status",
            Invariant::OperatorOnce => {
                "an operator's action lands at most once, however often it is sent, and only where it applies"
            }
            Invariant::CancelledStaysOut => "a cancelled task never runs a step forward again",
            Invariant::CancelBySubmitter => "no order is cancelled by a sender other than its submitter",
            Invariant::TimerNotEarly => "a timer never wakes before its time",
            Invariant::TimerOnTime => {
                "a due timer wakes within one supervisor period (plus the run's clock slack) once the faults stop; none is lost"
            }
            Invariant::CallbackOnce => {
                "a callback step's attempt is completed (success or failure) at most once"
            }
            Invariant::RefusedCompletionChangesNothing => {
                "a completion, failure or heartbeat changes a task only with the live attempt's own token, in time"
            }
            Invariant::PausedHoldsStill => {
                "a paused task dispatches nothing: no step is claimed and no timer starts"
            }
            Invariant::StageJoinsOnlyWhenAll => {
                "a task goes past a parallel stage only once every branch of it took effect at the remote side"
            }
            Invariant::StageUndoExact => {
                "undoing a parallel stage compensates exactly its branches that may have taken effect, each once"
            }
            Invariant::LateBranchReplyChangesNothing => {
                "a branch's reply that comes after its stage ended changes nothing"
            }
            Invariant::RemoteWithinLimits => {
                "a limited agent's service never sees more than max_in_flight calls at once, nor more than max_per_second starting in any one second"
            }
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.statement())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: Invariant, detail: impl Into<String>) -> Violation {
        Violation { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

/// What every run leaves behind, whatever ran it.
pub struct Records<'a> {
    pub workflows: &'a Workflows,
    pub policy: &'a Policy,
    /// The final records.
    pub tasks: &'a [TaskRecord],
    /// Every landed write, in the order they landed.
    pub writes: &'a [WriteRecord],
    pub alerts: &'a [OperatorAlert],
    pub ledger: &'a Ledger,
}

/// Whether a give-up leaves the task in Error because a pivot's effect stands or may
/// stand, restated from docs/REFERENCE.md's give-up rule (not from the domain's code) so the
/// checker can tell `ForwardOnly` from `Fail`.
fn forward_only(before: &TaskRecord, after: &TaskRecord, wf: &Workflow) -> bool {
    // In doubt: dispatched and never answered for good, or answered with something that
    // cannot be kept (an agent's output, or the outside's completion, too large).
    let in_doubt = (matches!(after.last_cause, Cause::DeadlinePassed { .. }) && before.step_attempts > 0)
        || matches!(after.last_cause, Cause::Failed { in_doubt: true, .. });
    let redoing = before.redo_until.is_some_and(|u| before.step <= u);
    // At a stage, a pivot among its branches that was dispatched and not refused (the
    // branches as the give-up left them: Error keeps them).
    let pivot_branch_in_doubt = || {
        wf.stage_at(before.step).is_some_and(|stage| {
            stage.branches().any(|i| {
                wf.step(i).is_some_and(|s| s.is_pivot())
                    && after
                        .stage()
                        .as_ref()
                        .and_then(|run| run.branch(i))
                        .is_some_and(|b| b.may_have_taken_effect())
            })
        })
    };
    let current_in_doubt = match wf.stage_at(before.step) {
        Some(_) => pivot_branch_in_doubt(),
        None => in_doubt && wf.step(before.step).is_some_and(|s| s.kind() == StepKind::Pivot),
    };
    before.action() == Action::Do && (redoing || wf.pivot_before(before.step).is_some() || current_in_doubt)
}

/// The trigger a landed write carried out, read back from the record before and after.
pub fn infer_trigger(before: &TaskRecord, after: &TaskRecord, wf: Option<&Workflow>) -> Option<Trigger> {
    use ProcessState::*;
    Some(match &after.last_cause {
        Cause::Submitted => return None,
        Cause::Claimed { .. } => Trigger::Claimed,
        Cause::Slept { .. } => Trigger::Slept,
        Cause::Woke { .. } if after.state() == Processed => Trigger::Finished,
        Cause::Woke { .. } => Trigger::Woke,
        Cause::Succeeded { action: Action::Do, .. } if after.state() == Processed => Trigger::Finished,
        // A branch's success while others of its stage still run: the task stays Processing.
        Cause::Succeeded { action: Action::Do, .. } if after.state() == Processing => Trigger::BranchDone,
        Cause::Succeeded { action: Action::Do, .. } => Trigger::Advanced,
        Cause::Succeeded { action: Action::Undo, .. } if after.state() == Compensated => Trigger::Undone,
        Cause::Succeeded { action: Action::Undo, .. } => Trigger::UndoAdvanced,
        Cause::Started { .. } => Trigger::Started,
        Cause::Heartbeat { .. } => Trigger::Heartbeat,
        Cause::Queued { .. } => Trigger::Queued,
        Cause::Throttled { .. } => Trigger::Throttled,
        Cause::Completed { .. } if after.state() == Processed => Trigger::Finished,
        Cause::Completed { .. } => Trigger::Advanced,
        Cause::Operator { act, .. } => match (act, after.state()) {
            (sas::domain::Act::Resubmit { .. }, _) => Trigger::Resubmit,
            (sas::domain::Act::Compensate, _) => Trigger::OperatorUndo,
            (sas::domain::Act::Cancel, Compensated) => Trigger::CancelUndone,
            (sas::domain::Act::Cancel, _) => Trigger::Cancel,
            (sas::domain::Act::Pause, _) => Trigger::Pause,
            (sas::domain::Act::Resume, _) => Trigger::Resume,
        },
        Cause::Failed { .. } | Cause::DeadlinePassed { .. } => match (before.state(), after.state()) {
            (_, Error) if wf.is_some_and(|wf| forward_only(before, after, wf)) => Trigger::ForwardOnly,
            (_, Error) => Trigger::Fail,
            (_, Compensated) => Trigger::Undone,
            (Compensating, Compensating) => Trigger::Retry,
            (_, Compensating) => Trigger::Undo,
            (_, Pending) => Trigger::Retry,
            _ => return None,
        },
    })
}

/// (state, trigger) of every landed transition.
pub fn coverage(writes: &[WriteRecord], workflows: &Workflows) -> BTreeMap<(ProcessState, Trigger), u64> {
    let mut seen = BTreeMap::new();
    for w in writes {
        if let Some(before) = &w.before
            && let Some(trigger) = infer_trigger(
                before,
                &w.after,
                workflows.get_version(&w.after.workflow, w.after.workflow_version),
            )
        {
            *seen.entry((before.state(), trigger)).or_default() += 1;
        }
    }
    seen
}

/// One order's causes, compactly, for a violation's detail.
pub fn history_of(writes: &[WriteRecord], id: &OrderId) -> String {
    let causes: Vec<String> = writes
        .iter()
        .filter(|w| &w.after.order_id == id)
        .map(|w| format!("{:?}->{:?}", w.after.last_cause, w.after.state()))
        .collect();
    causes.join(", ")
}

/// Every violation the records show; empty means every invariant they can show held.
/// The checks run in a fixed order (each write, then each task, then the operators' and
/// the remote's keys), so the same records always give the same list.
pub fn check_records(r: &Records) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut add = |invariant: Invariant, detail: String| found.push(Violation::new(invariant, detail));
    check_writes(r, &mut add);
    check_tasks(r, &mut add);
    operator_actions_land_once(r.writes, &mut add);
    one_key_per_step_applied_once(r.ledger, &mut add);
    remote_within_limits(r.ledger, &mut add);
    found
}

/// The limits judged where they matter, at the remote service: from the calls its ledger
/// saw (`Ledger::flights`), not from the gates that are meant to keep them. A call is in
/// flight from its start until its end (a call that ended at the instant another started
/// is over); the rate counts the calls started in every window of `RATE_WINDOW_MS`. Both
/// within the clocks' slack (`Ledger::clock_slack_ms`): a place lapsed, or a rate tail
/// ended, by one clock while a call went on by another's.
///
/// Calls are counted by the place they were made under (`Flight::holder`), and a copy's
/// calls not past the place's reply (`Flight::copy`, `Ledger::replied`): SQS delivers a
/// message at least once, and a request delivered twice is performed twice under its one
/// place, one copy perhaps still calling after the other's reply gave the place back. No gate can see that; docs/SIMULATION.md tells it as a limit
/// of flow control, and the run counts those calls (`Ledger::flights`).
fn remote_within_limits(ledger: &Ledger, add: &mut impl FnMut(Invariant, String)) {
    use sas::domain::gate::RATE_WINDOW_MS;
    let slack = ledger.clock_slack_ms;
    let window_ms = RATE_WINDOW_MS.saturating_sub(slack);
    for (agent, limits) in &ledger.limits {
        let Some(flights) = ledger.flights.get(agent) else { continue };
        // A place's calls are over once its reply is sent: a copy's call still open then
        // (or made later) is the copy's, not the place's.
        let flights: Vec<crate::ledger::Flight> = flights
            .iter()
            .filter(|f| !f.copy)
            .map(|f| {
                let end = ledger.replied.get(&f.holder).map_or(f.end, |r| f.end.min(*r));
                crate::ledger::Flight { end, ..f.clone() }
            })
            .collect();
        // One violation per limit and agent is enough to tell the story.
        let mut in_flight_told = false;
        let mut rate_told = false;
        for (i, f) in flights.iter().enumerate() {
            let before = &flights[..i];
            if let Some(max) = limits.max_in_flight
                && !in_flight_told
            {
                let open: BTreeSet<&str> = before
                    .iter()
                    .filter(|g| g.end > f.start + slack)
                    .map(|g| g.holder.as_str())
                    .chain([f.holder.as_str()])
                    .collect();
                if open.len() as u64 > u64::from(max) {
                    in_flight_told = true;
                    add(
                        Invariant::RemoteWithinLimits,
                        format!(
                            "agent {agent} (max_in_flight {max}): call {} of {} started at {} ms with calls of {} places in flight: {open:?}",
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
                    .filter(|g| g.start + window_ms > f.start)
                    .map(|g| g.holder.as_str())
                    .chain([f.holder.as_str()])
                    .collect();
                if window.len() as u64 > u64::from(max) {
                    rate_told = true;
                    let starts: Vec<(u64, &str)> = before
                        .iter()
                        .filter(|g| g.start + window_ms > f.start)
                        .map(|g| (g.start, g.holder.as_str()))
                        .collect();
                    add(
                        Invariant::RemoteWithinLimits,
                        format!(
                            "agent {agent} (max_per_second {max}): call {} of {} started at {} ms, {} places' calls within {window_ms} ms: {starts:?}",
                            f.key,
                            f.holder,
                            f.start,
                            window.len()
                        ),
                    );
                }
            }
        }
    }
}

/// The failure budget of the step `t` is at: the step's own, else the threshold.
fn budget(r: &Records, t: &TaskRecord) -> u32 {
    let threshold = r.policy.failure_threshold;
    let Some(wf) = r.workflows.get_version(&t.workflow, t.workflow_version) else { return threshold };
    // A task that stopped at a stage (and did not move on to undo a step) keeps the most
    // any of its branches used, each against its own budget: the largest of them bounds it.
    match wf.stage_at(t.step) {
        Some(stage) if t.state() != ProcessState::Compensating => {
            stage.branches().map(|b| wf.max_failures(b, threshold)).max().unwrap_or(threshold)
        }
        _ => wf.max_failures(t.step, threshold),
    }
}

/// Whether the remote applied the effect of `step`'s `action` for order `id`.
fn applied(ledger: &Ledger, id: &OrderId, step: u32, action: Action) -> bool {
    ledger.is_applied(&idempotency_key(id, step, action).0)
}

/// Every write, on its own and against the one before it on its order, in the order
/// they landed.
fn check_writes(r: &Records, add: &mut impl FnMut(Invariant, String)) {
    // The latest record of each order, as the writes so far left it: each write must start
    // from it.
    let mut latest: BTreeMap<&str, &TaskRecord> = BTreeMap::new();
    for w in r.writes {
        let after = &w.after;
        let id = after.order_id.as_str();
        if let Some(v) = after.shape_violation() {
            add(Invariant::Shape, format!("order {id} revision {}: {v}", after.revision));
        }
        let Some(before) = &w.before else {
            inserted(&latest, after, add);
            latest.insert(id, after);
            continue;
        };
        if latest.get(id) != Some(&before) {
            add(Invariant::Lifecycle, format!("order {id}: a write did not start from the latest revision"));
        }
        latest.insert(id, after);
        let wf = r.workflows.get_version(&before.workflow, before.workflow_version);
        a_move_of_the_table(r, before, after, add);
        one_live_lease(before, after, add);
        failures_within_budget(r, before, after, add);
        // A timer step whose time cannot be read fails with no reply: there is nothing to fence.
        let timer = wf.and_then(|wf| wf.step(before.step)).is_some_and(|s| s.is_timer());
        if !(timer && before.state() == ProcessState::Pending) {
            replies_fenced(before, after, wf, add);
        }
        completions_fenced(before, after, add);
        if let Some(wf) = wf {
            joins_only_when_all(r.ledger, before, after, wf, add);
        }
    }
}

/// The parallel stage `t` runs going forward: Pending or Processing at its first step.
/// Anything else (past it, undoing it, given up, ended) means the stage ended.
pub fn running_stage<'w>(t: &TaskRecord, wf: &'w Workflow) -> Option<&'w Stage> {
    wf.stage_at(t.step).filter(|_| matches!(t.state(), ProcessState::Pending | ProcessState::Processing))
}

/// Whether branch `step` of the stage `before` runs has a dispatch in flight under the live
/// lease, its reply in time at `at`: the one record a branch's reply may change.
pub fn branch_live(before: &TaskRecord, step: u32, at: sas::domain::Timestamp) -> bool {
    before.state() == ProcessState::Processing
        && before.locked_by().is_some()
        && before.stage().is_some_and(|run| {
            run.at == before.step && run.branch(step).and_then(|b| b.complete_by).is_some_and(|cb| at <= cb)
        })
}

/// How far forward a record stands: its step, or past the last once Processed; `None`
/// while undoing (it goes no further forward).
fn forward_position(t: &TaskRecord, wf: &Workflow) -> Option<u32> {
    match t.state() {
        ProcessState::Processed => Some(wf.len()),
        ProcessState::Compensating | ProcessState::Compensated => None,
        _ => Some(t.step),
    }
}

/// The stages a write takes the task past (from a step before a stage's end to one at or
/// after it, or to Processed).
pub fn stages_passed<'w>(before: &TaskRecord, after: &TaskRecord, wf: &'w Workflow) -> Vec<&'w Stage> {
    let (Some(from), Some(to)) = (forward_position(before, wf), forward_position(after, wf)) else {
        return Vec::new();
    };
    wf.stages.iter().filter(|st| from < st.end() && to >= st.end()).collect()
}

/// A task goes past a stage only when every branch took effect at the remote side: judged
/// from the ledger, not from the record's branches. (The simulation also checks that each
/// was applied before the write landed, in true time: `check.rs`.)
fn joins_only_when_all(
    ledger: &Ledger,
    before: &TaskRecord,
    after: &TaskRecord,
    wf: &Workflow,
    add: &mut impl FnMut(Invariant, String),
) {
    for stage in stages_passed(before, after, wf) {
        let missing: Vec<u32> =
            stage.branches().filter(|b| !applied(ledger, &after.order_id, *b, Action::Do)).collect();
        if !missing.is_empty() {
            add(
                Invariant::StageJoinsOnlyWhenAll,
                format!(
                    "order {}: went past stage {} ({:?} -> {:?} at step {}, {:?}) though branches {missing:?} never took effect at the remote",
                    after.order_id,
                    stage.name,
                    before.state(),
                    after.state(),
                    after.step,
                    after.last_cause
                ),
            );
        }
    }
}

/// A new task: the first of its order, and Pending.
fn inserted(
    latest: &BTreeMap<&str, &TaskRecord>,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    if latest.contains_key(id) {
        add(Invariant::TerminalOnce, format!("order {id} inserted twice"));
    }
    if after.state() != ProcessState::Pending {
        add(Invariant::Lifecycle, format!("order {id} inserted as {:?}", after.state()));
    }
}

/// A write is a row of the transition table, bumps the revision by one, and leaves a
/// terminal state only for an operator's action on Error.
fn a_move_of_the_table(
    r: &Records,
    before: &TaskRecord,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    let operator = matches!(after.last_cause, Cause::Operator { .. });
    if before.state().is_terminal() && !(operator && before.state() == ProcessState::Error) {
        add(
            Invariant::Absorbing,
            format!("order {id} left {:?} for {:?} ({:?})", before.state(), after.state(), after.last_cause),
        );
    }
    if after.revision != before.revision + 1 {
        add(Invariant::Lifecycle, format!("order {id}: revision {} -> {}", before.revision, after.revision));
    }
    match infer_trigger(before, after, r.workflows.get_version(&after.workflow, after.workflow_version)) {
        Some(t) if lifecycle::next(before.state(), t) == Some(after.state()) => {}
        t => add(
            Invariant::Lifecycle,
            format!("order {id}: {:?} --{t:?}--> {:?} is not in the table", before.state(), after.state()),
        ),
    }
}

/// No write replaces a live lease with another, and no claim lands while one is live.
fn one_live_lease(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    let id = after.order_id.as_str();
    if let (Some(old), Some(new)) = (before.locked_by(), after.locked_by())
        && old != new
    {
        add(
            Invariant::OneLease,
            format!("order {id}: live lease {old} replaced by {new} ({:?})", after.last_cause),
        );
    }
    if matches!(after.last_cause, Cause::Claimed { .. }) && before.locked_by().is_some() {
        add(
            Invariant::OneLease,
            format!("order {id}: claimed while lease {:?} was live", before.locked_by()),
        );
    }
    // A stage's branches run under the one lease: none is in flight without it, or past
    // the lease's complete-by; and a claim gives each branch it dispatches an attempt no
    // dispatch had before, so a reply names one dispatch only.
    let Some(run) = after.stage() else { return };
    if run.branches.iter().any(|b| b.in_flight())
        && (after.locked_by().is_none()
            || after.state() != ProcessState::Processing
            || run.latest_complete_by() > after.complete_by())
    {
        add(
            Invariant::OneLease,
            format!(
                "order {id}: a branch in flight outside the lease ({:?}, lease {:?} until {:?}, branches {:?})",
                after.state(),
                after.locked_by(),
                after.complete_by(),
                run.branches
            ),
        );
    }
    if matches!(after.last_cause, Cause::Claimed { .. }) {
        let mut seen = BTreeSet::new();
        for (step, b) in run.each() {
            let was = before.stage().filter(|r| r.at == run.at).and_then(|r| r.branch(step));
            let dispatched = b.dispatches > was.map_or(0, |w| w.dispatches);
            if dispatched && (b.attempt <= before.attempt || !seen.insert(b.attempt)) {
                add(
                    Invariant::OneLease,
                    format!(
                        "order {id}: branch {step} dispatched as attempt {}, not a fresh one (task attempt {} before)",
                        b.attempt, before.attempt
                    ),
                );
            }
        }
    }
}

/// FailureCount only grows, and only a lapse moves it, by one; a lapse retries exactly
/// while the step's failures are below its budget; a new step starts with none.
fn failures_within_budget(
    r: &Records,
    before: &TaskRecord,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    if after.failure_count < before.failure_count {
        add(
            Invariant::Failures,
            format!("order {id}: FailureCount {} -> {}", before.failure_count, after.failure_count),
        );
    }
    let wf = r.workflows.get_version(&after.workflow, after.workflow_version);
    // Going forward at a stage, each branch has a budget of its own (`stage_lapse`); the
    // record's step_failures is the most any branch used.
    let at_stage =
        |t: &TaskRecord| t.action() == Action::Do && wf.is_some_and(|wf| wf.stage_at(t.step).is_some());
    if let Some(wf) = wf
        && let Some(run) = after.stage()
    {
        for (step, b) in run.each() {
            let own = wf.max_failures(step, r.policy.failure_threshold);
            if b.failures > own {
                add(
                    Invariant::Failures,
                    format!("order {id}: {} failures of branch {step}, budget {own}", b.failures),
                );
            }
        }
    }
    if after.step_failures > budget(r, after) && !at_stage(after) {
        add(
            Invariant::Failures,
            format!(
                "order {id}: {} failures of step {}, budget {}",
                after.step_failures,
                after.step,
                budget(r, after)
            ),
        );
    }
    let operator = matches!(after.last_cause, Cause::Operator { .. });
    let same_step = after.step == before.step && after.action() == before.action();
    match &after.last_cause {
        Cause::DeadlinePassed { .. } if wf.and_then(|wf| running_stage(before, wf)).is_some() => {
            if after.failure_count != before.failure_count + 1 {
                add(Invariant::Failures, format!("order {id}: a lapse moved FailureCount by other than one"));
            }
            if let Some(wf) = wf {
                stage_lapse(r, before, after, wf, add);
            }
        }
        Cause::DeadlinePassed { .. } => {
            if after.failure_count != before.failure_count + 1 {
                add(Invariant::Failures, format!("order {id}: a lapse moved FailureCount by other than one"));
            }
            let used = before.step_failures + 1;
            let retried = after.state() == ProcessState::Pending
                || (before.state() == ProcessState::Compensating
                    && after.state() == ProcessState::Compensating);
            if retried != (used < budget(r, before)) {
                add(
                    Invariant::Failures,
                    format!(
                        "order {id}: lapse {used} of step {} (budget {}) went to {:?}",
                        before.step,
                        budget(r, before),
                        after.state()
                    ),
                );
            }
            if retried && after.step_failures != used {
                add(
                    Invariant::Failures,
                    format!("order {id}: a retry counted {} step failures", after.step_failures),
                );
            }
        }
        _ if after.failure_count != before.failure_count => {
            add(Invariant::Failures, format!("order {id}: {:?} changed FailureCount", after.last_cause));
        }
        // An operator's action gives the step a fresh budget.
        _ if same_step && after.step_failures != before.step_failures && !operator => {
            add(
                Invariant::Failures,
                format!("order {id}: {:?} changed the step's failures", after.last_cause),
            );
        }
        _ => {}
    }
    if !same_step && !after.state().is_terminal() && after.step_failures != 0 {
        add(
            Invariant::Failures,
            format!("order {id}: step {} began with {} failures", after.step, after.step_failures),
        );
    }
}

/// A lapse at a stage counts one failure against every branch not yet succeeded, each
/// against its own budget: the stage is retried exactly while every such branch is below
/// its budget, and gives up at the first one that reaches it.
fn stage_lapse(
    r: &Records,
    before: &TaskRecord,
    after: &TaskRecord,
    wf: &Workflow,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    let Some(stage) = running_stage(before, wf) else { return };
    // Before its first claim the stage has no branches on record: none used any budget.
    let was = |step: u32| before.stage().filter(|run| run.at == stage.start).and_then(|run| run.branch(step));
    let succeeded = |step: u32| was(step).is_some_and(|b| b.outcome == sas::domain::Outcome::Succeeded);
    let open: Vec<(u32, u32, u32)> = stage
        .branches()
        .filter(|s| !succeeded(*s))
        .map(|s| (s, was(s).map_or(0, |b| b.failures) + 1, wf.max_failures(s, r.policy.failure_threshold)))
        .collect();
    let spent = open.iter().find(|(_, used, own)| used >= own);
    let retried = after.state() == ProcessState::Pending;
    if retried == spent.is_some() {
        add(
            Invariant::Failures,
            format!(
                "order {id}: a lapse of stage {} (branches' lapses and budgets {open:?}) went to {:?}",
                stage.name,
                after.state()
            ),
        );
    }
    if retried {
        let now = |step: u32| after.stage().and_then(|run| run.branch(step)).map_or(0, |b| b.failures);
        for (step, used, _) in &open {
            if now(*step) != *used {
                add(
                    Invariant::Failures,
                    format!(
                        "order {id}: a retry of stage {} counted {} failures of branch {step}, not {used}",
                        stage.name,
                        now(*step)
                    ),
                );
            }
        }
    }
}

/// A reply lands only on the live lease's own step, in time. A callback step's failure may
/// also be the outside's word, which passes the token's fence instead. A branch's reply
/// lands only on its stage's record, with that branch in flight: after the stage ended it
/// changes nothing.
fn replies_fenced(
    before: &TaskRecord,
    after: &TaskRecord,
    wf: Option<&Workflow>,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    let (step, action) = match &after.last_cause {
        Cause::Succeeded { step, action } | Cause::Failed { step, action, .. } => (*step, *action),
        // The agent's success at a callback step: the work started.
        Cause::Started { step } => (*step, Action::Do),
        _ => return,
    };
    if let Some(stage) = wf.and_then(|wf| wf.stage_of(step)).filter(|_| action == Action::Do) {
        if branch_live(before, step, after.updated_at) {
            return;
        }
        let ended = wf.and_then(|wf| running_stage(before, wf)) != Some(stage);
        add(
            if ended { Invariant::LateBranchReplyChangesNothing } else { Invariant::Fenced },
            format!(
                "order {id}: reply of branch {step} of stage {} applied to {:?} at step {} ({:?}), lease {:?}, branch {:?} at {}",
                stage.name,
                before.state(),
                before.step,
                before.action(),
                before.locked_by(),
                before.stage().and_then(|run| run.branch(step)),
                after.updated_at
            ),
        );
        return;
    }
    let leased = before.locked_by().is_some()
        && matches!(before.state(), ProcessState::Processing | ProcessState::Compensating)
        && before.step == step
        && before.action() == action
        && before.complete_by().is_some_and(|cb| after.updated_at <= cb);
    let by_token = matches!(after.last_cause, Cause::Failed { .. })
        && action == Action::Do
        && token_fenced(before, after, step);
    if !(leased || by_token) {
        add(
            Invariant::Fenced,
            format!(
                "order {id}: reply for step {step} {action:?} applied to step {} {:?} lease {:?} complete-by {:?} at {}",
                before.step,
                before.action(),
                before.locked_by(),
                before.complete_by(),
                after.updated_at
            ),
        );
    }
}

/// The token's fence, restated from docs/DESIGN.md ("Callback steps"): the record still
/// waits on a callback of this step (claimed or started), and the callback is not yet due.
/// Which attempt's token, and whether it was genuine, only the simulation knows (`check.rs`).
fn token_fenced(before: &TaskRecord, after: &TaskRecord, step: u32) -> bool {
    before.callback().is_some_and(|cb| {
        cb.step == step
            && before.step == step
            && before.action() == Action::Do
            && matches!(before.state(), ProcessState::Processing | ProcessState::Waiting)
            && after.updated_at <= cb.due()
    })
}

/// The outside's completion and heartbeat land only through the token's fence.
fn completions_fenced(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    let (Cause::Completed { step } | Cause::Heartbeat { step }) = &after.last_cause else { return };
    if !token_fenced(before, after, *step) {
        add(
            Invariant::RefusedCompletionChangesNothing,
            format!(
                "order {}: {:?} landed on step {} ({:?}, waiting on {:?}, due {:?}) at {}",
                after.order_id,
                after.last_cause,
                before.step,
                before.state(),
                before.callback().map(|cb| (cb.step, cb.attempt)),
                before.callback().map(|cb| cb.due()),
                after.updated_at
            ),
        );
    }
}

/// What one order's writes show of its steps.
#[derive(Default)]
struct Ran {
    /// Steps claimed to run forward.
    claimed_do: BTreeSet<u32>,
    /// Steps that ran forward.
    done: BTreeSet<u32>,
    /// Steps undone, in the order undone.
    undone: Vec<u32>,
    /// Writes that entered a terminal state, and operators' actions that reopened one.
    terminal_entries: u32,
    reopened: u32,
}

impl Ran {
    fn of(history: &[&WriteRecord]) -> Ran {
        let mut ran = Ran::default();
        for w in history {
            match &w.after.last_cause {
                // Not counted as reopening: the table has no cancel from a terminal state,
                // so such a write is already an Absorbing violation.
                Cause::Operator { act: Act::Cancel, .. } => {}
                Cause::Operator { .. } if w.before.as_ref().is_some_and(|b| b.state().is_terminal()) => {
                    ran.reopened += 1;
                }
                // A stage's claim dispatches its branches: each counts as claimed.
                Cause::Claimed { step, action: Action::Do } => match dispatched_branches(w) {
                    Some(branches) => ran.claimed_do.extend(branches),
                    None => {
                        ran.claimed_do.insert(*step);
                    }
                },
                Cause::Succeeded { step, action: Action::Do }
                | Cause::Woke { step, .. }
                | Cause::Completed { step } => {
                    ran.done.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Undo } => ran.undone.push(*step),
                _ => {}
            }
            if w.after.state().is_terminal() && w.before.as_ref().is_none_or(|b| !b.state().is_terminal()) {
                ran.terminal_entries += 1;
            }
        }
        ran
    }
}

/// The branches a write's claim of a parallel stage dispatched (those whose dispatches it
/// counted up), or `None` when the write claimed no stage.
pub fn dispatched_branches(w: &WriteRecord) -> Option<Vec<u32>> {
    let Cause::Claimed { step, action: Action::Do } = w.after.last_cause else { return None };
    let run = w.after.stage().filter(|run| run.at == step)?;
    let was =
        |i: u32| w.before.as_ref().and_then(|b| b.stage()).filter(|r| r.at == step).and_then(|r| r.branch(i));
    Some(
        run.each()
            .filter(|(i, b)| b.dispatches > was(*i).map_or(0, |w| w.dispatches))
            .map(|(i, _)| i)
            .collect(),
    )
}

/// Undoing a parallel stage, judged from the order's history (claims, replies, undo
/// claims), not from the branches the record keeps. A branch *may have taken effect* once
/// a claim dispatched it, unless its service refused that dispatch for good (a refusal
/// applied while it was in flight). A resubmit alone does not undo a refusal; a dispatch
/// after it does, as for a lone step (sas then no longer leans on the refusal). Then:
/// - a compensation is dispatched only for a branch that may have taken effect;
/// - each such branch is undone at most once (per forward dispatch);
/// - a task that ends Compensated undid every one that has a compensation, and none of
///   its pivot branches may have taken effect.
fn stage_undo_exact(
    task: &TaskRecord,
    workflow: &Workflow,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    if workflow.stages.is_empty() {
        return;
    }
    let id = &task.order_id;
    #[derive(Default, Clone, Copy)]
    struct Seen {
        dispatched: bool,
        refused: bool,
        undone: u32,
    }
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    let may_have_taken_effect = |s: &Seen| s.dispatched && !s.refused;
    for w in history {
        let Some(before) = &w.before else { continue };
        let after = &w.after;
        if let Some(branches) = dispatched_branches(w) {
            for b in branches {
                seen.insert(b, Seen { dispatched: true, refused: false, undone: 0 });
            }
        }
        match &after.last_cause {
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. }
                if workflow.stage_of(*step).is_some() && branch_live(before, *step, after.updated_at) =>
            {
                seen.entry(*step).or_default().refused = true;
            }
            Cause::Claimed { step, action: Action::Undo } if workflow.stage_of(*step).is_some() => {
                let s = seen.get(step).copied().unwrap_or_default();
                if !may_have_taken_effect(&s) {
                    add(
                        Invariant::StageUndoExact,
                        format!(
                            "order {id}: compensation of branch {step} dispatched, though it {}; history: {}",
                            if s.dispatched { "was refused" } else { "was never dispatched" },
                            history_of_writes(history)
                        ),
                    );
                }
            }
            Cause::Succeeded { step, action: Action::Undo } if workflow.stage_of(*step).is_some() => {
                let s = seen.entry(*step).or_default();
                s.undone += 1;
                if s.undone > 1 {
                    add(
                        Invariant::StageUndoExact,
                        format!("order {id}: branch {step} undone {} times", s.undone),
                    );
                }
            }
            _ => {}
        }
        if after.state() == ProcessState::Compensated && before.state() != ProcessState::Compensated {
            for (step, s) in seen.iter().filter(|(_, s)| may_have_taken_effect(s)) {
                let Some(def) = workflow.step(*step) else { continue };
                let wrong = match def.kind() {
                    StepKind::Pivot => Some("a pivot branch that may have taken effect"),
                    StepKind::Compensable if s.undone == 0 => {
                        Some("a branch that may have taken effect, never undone")
                    }
                    _ => None,
                };
                if let Some(wrong) = wrong {
                    add(
                        Invariant::StageUndoExact,
                        format!(
                            "order {id} Compensated with branch {step} ({}) {wrong}; history: {}",
                            def.name,
                            history_of_writes(history)
                        ),
                    );
                }
            }
        }
    }
}

fn history_of_writes(history: &[&WriteRecord]) -> String {
    let causes: Vec<String> =
        history.iter().map(|w| format!("{:?}->{:?}", w.after.last_cause, w.after.state())).collect();
    causes.join(", ")
}

/// Each task against its order's writes, its alerts and what the remote did for it.
fn check_tasks(r: &Records, add: &mut impl FnMut(Invariant, String)) {
    let mut histories: BTreeMap<&str, Vec<&WriteRecord>> = BTreeMap::new();
    for w in r.writes {
        histories.entry(w.after.order_id.as_str()).or_default().push(w);
    }
    for task in r.tasks {
        let id = &task.order_id;
        let Some(workflow) = r.workflows.get_version(&task.workflow, task.workflow_version) else {
            add(
                Invariant::Shape,
                format!("order {id}: unknown workflow {} v{}", task.workflow, task.workflow_version),
            );
            continue;
        };
        if task.order.order_id != task.order_id || task.order.workflow != task.workflow {
            add(
                Invariant::Shape,
                format!(
                    "task {id} carries order {} of workflow {}",
                    task.order.order_id, task.order.workflow
                ),
            );
        }
        let history = histories.get(id.as_str()).map(Vec::as_slice).unwrap_or_default();
        cancelled_stays_out(id, history, add);
        let ran = Ran::of(history);
        stage_undo_exact(task, workflow, history, add);
        terminal_once(task, &ran, add);
        alerted(r, task, workflow, history, add);
        compensated_in_the_records(task, workflow, &ran, add);
        let effects = remote_effects(r.ledger, id);
        compensated_at_the_remote(id, &effects, add);
        let declined = declined(history);
        pivot_goes_forward(r.ledger, id, workflow, &effects, &declined, add);
        if task.order.workflow_version.is_some_and(|v| v != task.workflow_version) {
            add(
                Invariant::Pinned,
                format!(
                    "order {id} asked for v{:?} and runs v{}",
                    task.order.workflow_version, task.workflow_version
                ),
            );
        }
        check_outputs_and_pins(r.ledger, id, workflow, add);
        remote_agrees(r, task, workflow, &declined, add);
    }
}

/// Callback steps whose work the outside declined (docs/DESIGN.md: the outside's failure is a
/// refusal: the step had no effect), as the task last heard: a failure of the step while it
/// waited on a callback, not followed by the work starting or completing again. The remote's
/// ledger shows such a step's call applied (the work started), yet nothing of it stands.
fn declined(history: &[&WriteRecord]) -> BTreeSet<u32> {
    let mut declined = BTreeSet::new();
    for w in history {
        let Some(before) = &w.before else { continue };
        match &w.after.last_cause {
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. }
                if before.callback().is_some_and(|cb| cb.step == *step) =>
            {
                declined.insert(*step);
            }
            Cause::Started { step } | Cause::Completed { step } => {
                declined.remove(step);
            }
            _ => {}
        }
    }
    declined
}

/// After a cancel, no write claims a forward step.
fn cancelled_stays_out(id: &OrderId, history: &[&WriteRecord], add: &mut impl FnMut(Invariant, String)) {
    let mut cancelled = false;
    for w in history {
        match &w.after.last_cause {
            Cause::Claimed { step, action: Action::Do } if cancelled => add(
                Invariant::CancelledStaysOut,
                format!("order {id}: step {step} claimed to run forward after the task was cancelled"),
            ),
            Cause::Operator { act: Act::Cancel, .. } => cancelled = true,
            _ => {}
        }
    }
}

/// The task ended terminal, entering a terminal state once, and once more for each time an
/// operator reopened it.
fn terminal_once(task: &TaskRecord, ran: &Ran, add: &mut impl FnMut(Invariant, String)) {
    let id = &task.order_id;
    if !task.state().is_terminal() {
        add(Invariant::TerminalOnce, format!("order {id} ended {:?} at step {}", task.state(), task.step));
    } else if ran.terminal_entries != 1 + ran.reopened {
        add(
            Invariant::TerminalOnce,
            format!(
                "order {id} entered a terminal state {} times, reopened by operators {} times",
                ran.terminal_entries, ran.reopened
            ),
        );
    }
}

/// Giving up tells an operator: every move to Error, and every give-up at a spent budget,
/// has its alert (same state and FailureCount).
fn alerted(
    r: &Records,
    task: &TaskRecord,
    workflow: &Workflow,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    let alerted = |state: ProcessState, failures: u32| {
        r.alerts.iter().any(|a| &a.order_id == id && a.state == state && a.failure_count == failures)
    };
    for w in history {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let gave_up = matches!(after.last_cause, Cause::DeadlinePassed { .. })
            && infer_trigger(before, after, Some(workflow)) != Some(Trigger::Retry);
        if (after.state() == ProcessState::Error || gave_up) && !alerted(after.state(), after.failure_count) {
            add(
                Invariant::Alerted,
                format!("order {id} went to {:?} ({:?}) without an alert", after.state(), after.last_cause),
            );
        }
    }
    if task.state() == ProcessState::Error && !r.alerts.iter().any(|a| &a.order_id == id) {
        add(Invariant::Alerted, format!("order {id} is Error without an alert"));
    }
}

/// Compensation in the records: descending, once each, only what ran forward and can be
/// undone; a Compensated task undid every compensable step it did, a Processed one did
/// every step and undid none.
fn compensated_in_the_records(
    task: &TaskRecord,
    workflow: &Workflow,
    ran: &Ran,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    let Ran { claimed_do, done, undone, .. } = ran;
    if undone.windows(2).any(|p| p[0] <= p[1]) {
        add(Invariant::Compensation, format!("order {id}: compensations in order {undone:?}"));
    }
    for step in undone {
        if !claimed_do.contains(step) || workflow.step(*step).is_none_or(|s| s.compensation.is_none()) {
            add(
                Invariant::Compensation,
                format!("order {id}: undid step {step}, which never ran or cannot be undone"),
            );
        }
    }
    if task.state() == ProcessState::Compensated {
        for step in done.iter().filter(|s| workflow.step(**s).is_some_and(|d| d.compensation.is_some())) {
            if !undone.contains(step) {
                add(
                    Invariant::Compensation,
                    format!("order {id} Compensated but step {step} was done and never undone"),
                );
            }
        }
    }
    if task.state() == ProcessState::Processed && (done.len() as u32 != workflow.len() || !undone.is_empty())
    {
        add(
            Invariant::Compensation,
            format!("order {id} Processed with steps {done:?} done and {undone:?} undone"),
        );
    }
}

/// The effects the remote applied for order `id`, in the order applied: (step, action).
fn remote_effects(ledger: &Ledger, id: &OrderId) -> Vec<(u32, Action)> {
    ledger
        .effects
        .iter()
        .filter(|(_, o, ..)| o == id.as_str())
        .map(|(_, _, step, action)| (*step, *action))
        .collect()
}

/// Compensation at the remote side: newest first, and nothing done after its undo.
fn compensated_at_the_remote(
    id: &OrderId,
    effects: &[(u32, Action)],
    add: &mut impl FnMut(Invariant, String),
) {
    let undo_steps: Vec<u32> = effects.iter().filter(|(_, a)| *a == Action::Undo).map(|(s, _)| *s).collect();
    if undo_steps.windows(2).any(|p| p[0] <= p[1]) {
        add(Invariant::Compensation, format!("order {id}: the remote undid steps in order {undo_steps:?}"));
    }
    for (i, (step, action)) in effects.iter().enumerate() {
        if *action == Action::Do && effects[..i].contains(&(*step, Action::Undo)) {
            add(Invariant::Compensation, format!("order {id}: step {step} took effect after it was undone"));
        }
    }
}

/// Once a pivot's effect was applied, the task only goes forward: no compensation may be
/// applied for it at all, whatever state it ends in.
fn pivot_goes_forward(
    ledger: &Ledger,
    id: &OrderId,
    workflow: &Workflow,
    effects: &[(u32, Action)],
    declined: &BTreeSet<u32>,
    add: &mut impl FnMut(Invariant, String),
) {
    let pivot_applied = (0..workflow.len()).find(|&s| {
        workflow.step(s).is_some_and(|d| d.is_pivot())
            && applied(ledger, id, s, Action::Do)
            && !declined.contains(&s)
    });
    if let Some(pivot) = pivot_applied
        && let Some((step, _)) = effects.iter().find(|(_, a)| *a == Action::Undo)
    {
        add(
            Invariant::PivotGoesForward,
            format!("order {id}: pivot step {pivot} took effect, yet step {step} was undone"),
        );
    }
}

/// The remote side's ledger against the final state: a Processed task has every step
/// applied and none undone; a Compensated one left no effect standing.
fn remote_agrees(
    r: &Records,
    task: &TaskRecord,
    workflow: &Workflow,
    declined: &BTreeSet<u32>,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    // A timer step calls no remote service: the ledger has nothing of it.
    for (step, def) in (0..workflow.len()).zip(&workflow.steps).filter(|(_, d)| !d.is_timer()) {
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

/// Each operator's action (who and why) lands at most once.
fn operator_actions_land_once(writes: &[WriteRecord], add: &mut impl FnMut(Invariant, String)) {
    let mut actions: BTreeMap<(&str, Option<&str>, Option<&str>), usize> = BTreeMap::new();
    for w in writes {
        if matches!(w.after.last_cause, Cause::Operator { .. }) {
            let entry = w.after.timeline.last();
            let key = (
                w.after.order_id.as_str(),
                entry.and_then(|e| e.by.as_deref()),
                entry.and_then(|e| e.note.as_deref()),
            );
            *actions.entry(key).or_default() += 1;
        }
    }
    for ((order, by, why), n) in actions {
        if n > 1 {
            add(
                Invariant::OperatorOnce,
                format!("order {order}: the action of {by:?} ({why:?}) landed {n} times"),
            );
        }
    }
}

/// The remote side: one key per step and action, each effect applied at most once.
fn one_key_per_step_applied_once(ledger: &Ledger, add: &mut impl FnMut(Invariant, String)) {
    for ((order, step, action), keys) in &ledger.keys {
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

/// What the remote side was handed and called as, against the task's pinned version:
/// every call of step `s` carries exactly the outputs the steps before it answered (a
/// compensation also its own step's, once the task went past it), and names that
/// version's agent and step (or compensation).
fn check_outputs_and_pins(
    ledger: &Ledger,
    id: &OrderId,
    workflow: &Workflow,
    add: &mut impl FnMut(Invariant, String),
) {
    let kept = |step: u32| -> Option<&str> {
        let answer = ledger.answer(&idempotency_key(id, step, Action::Do).0);
        (!answer.is_empty() && answer.len() <= sas::domain::MAX_OUTPUT_BYTES).then_some(answer)
    };
    // A callback step's output is the outside's (its completion's), not the agent's answer
    // that the work started: that one is kept only while the step waits.
    let outside = |step: u32| -> Option<&str> {
        let output = ledger.callback_outputs.get(&idempotency_key(id, step, Action::Do).0)?;
        (output.len() <= sas::domain::MAX_OUTPUT_BYTES).then_some(output.as_str())
    };
    let is_callback = |step: u32| workflow.step(step).is_some_and(|s| s.is_callback());
    let called =
        |step: u32, action: Action| ledger.keys.contains_key(&(id.as_str().to_owned(), step, action));
    for step in 0..=workflow.len() {
        for action in [Action::Do, Action::Undo] {
            let key = idempotency_key(id, step, action).0;
            let Some(names) = ledger.called_as.get(&key) else { continue };
            let Some(def) = workflow.step(step) else {
                add(
                    Invariant::Pinned,
                    format!("order {id}: step {step} called, beyond v{}", workflow.version),
                );
                continue;
            };
            let want = match action {
                Action::Do => Some(def.name.as_str()),
                Action::Undo => def.compensation.as_deref(),
            };
            for (agent, name) in names {
                if agent != &def.agent || Some(name.as_str()) != want {
                    add(
                        Invariant::Pinned,
                        format!(
                            "order {id} (v{}): step {step} {action:?} called as {agent}/{name}, not {}/{}",
                            workflow.version,
                            def.agent,
                            want.unwrap_or("-")
                        ),
                    );
                }
            }
            // A branch of a parallel stage is handed what came before its stage; its
            // compensation every output up to the stage's end (its siblings' too).
            let upto = match action {
                Action::Do => workflow.together(step).start,
                Action::Undo => workflow.after(step),
            };
            let first = workflow.together(step).start;
            for handed in ledger.handed.get(&key).into_iter().flatten() {
                let got: BTreeMap<String, serde_json::Value> =
                    serde_json::from_str(handed).unwrap_or_default();
                for name in got.keys() {
                    let position = workflow.steps.iter().position(|s| &s.name == name);
                    if position.is_none_or(|p| p as u32 >= upto) {
                        add(
                            Invariant::Outputs,
                            format!("order {id}: step {step} {action:?} handed {name:?}'s output"),
                        );
                    }
                }
                for below in 0..upto {
                    let name = &workflow.steps[below as usize].name;
                    // Every step before this one's stage was answered for good before it
                    // ran; the undone step's own answer (and its siblings') is known once
                    // the task went past its stage.
                    let must = below < first || called(upto, Action::Do);
                    let handed = got.get(name).map(|v| v.to_string());
                    if is_callback(below) {
                        callback_output_handed(
                            id,
                            (step, action),
                            name,
                            handed,
                            must,
                            kept(below),
                            outside(below),
                            add,
                        );
                        continue;
                    }
                    match (handed, kept(below)) {
                        (Some(g), Some(w)) if g != w => add(
                            Invariant::Outputs,
                            format!("order {id}: step {step} {action:?} handed {name}'s output {g}, not {w}"),
                        ),
                        (Some(g), None) => add(
                            Invariant::Outputs,
                            format!(
                                "order {id}: step {step} {action:?} handed {name}'s output {g}, which it never gave"
                            ),
                        ),
                        (None, Some(w)) if must => add(
                            Invariant::Outputs,
                            format!("order {id}: step {step} {action:?} not handed {name}'s output {w}"),
                        ),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// What a call of `(step, action)` was handed as the output of callback step `name`: once the
/// task went past it, the outside's output from the completion that ended it (or nothing,
/// when the outside answers none); before, only its own compensation sees it, and then
/// either the agent's answer that the work started or the outside's.
#[allow(clippy::too_many_arguments)]
fn callback_output_handed(
    id: &OrderId,
    (step, action): (u32, Action),
    name: &str,
    handed: Option<String>,
    past: bool,
    agents: Option<&str>,
    outsides: Option<&str>,
    add: &mut impl FnMut(Invariant, String),
) {
    match (handed, outsides) {
        (Some(g), w) if past && w != Some(g.as_str()) => add(
            Invariant::Outputs,
            format!(
                "order {id}: step {step} {action:?} handed callback step {name}'s output {g}, not the outside's {w:?}"
            ),
        ),
        (None, Some(w)) if past => add(
            Invariant::Outputs,
            format!("order {id}: step {step} {action:?} not handed callback step {name}'s output {w}"),
        ),
        (Some(g), w) if !past && w != Some(g.as_str()) && agents != Some(g.as_str()) => add(
            Invariant::Outputs,
            format!(
                "order {id}: step {step} {action:?} handed callback step {name}'s output {g}, which neither its agent nor the outside gave"
            ),
        ),
        _ => {}
    }
}
