//! The one catalogue of the pipeline's invariants, and the checks that need nothing but
//! what every run leaves behind: the state table's write log, the final records, the
//! operator alerts and the remote service's ledger. The simulation (`check.rs`) and
//! `sasctl dev` (`cli/src/invariants.rs`) both run [`check_records`], then add what
//! only they can see (the simulation: which function wrote each write, for which
//! message, and true time; `dev`: the status queue and real-time progress).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sas::adapters::embedded::WriteRecord;
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
}

impl Invariant {
    pub const ALL: [Invariant; 30] = [
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
    ];

    /// The invariant in words, as the README states it.
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
/// stand, restated from the README's lifecycle (not from the domain's code) so the
/// checker can tell `ForwardOnly` from `Fail`.
fn forward_only(before: &TaskRecord, after: &TaskRecord, wf: &Workflow) -> bool {
    // In doubt: dispatched and never answered for good, or answered with something that
    // cannot be kept (an agent's output, or the outside's completion, too large).
    let in_doubt = (matches!(after.last_cause, Cause::DeadlinePassed { .. }) && before.step_attempts > 0)
        || matches!(after.last_cause, Cause::Failed { in_doubt: true, .. });
    let redoing = before.redo_until.is_some_and(|u| before.step <= u);
    before.action() == Action::Do
        && (redoing
            || wf.pivot_before(before.step).is_some()
            || (in_doubt && wf.step(before.step).is_some_and(|s| s.kind() == StepKind::Pivot)))
}

/// The trigger a landed write carried out, read back from the record before and after.
pub fn infer_trigger(before: &TaskRecord, after: &TaskRecord, wf: Option<&Workflow>) -> Option<Trigger> {
    use ProcessState::*;
    Some(match &after.last_cause {
        Cause::Submitted => return None,
        Cause::Claimed { .. } => Trigger::Claimed,
        Cause::Slept { .. } => Trigger::Slept,
        Cause::Woke { .. } if after.state == Processed => Trigger::Finished,
        Cause::Woke { .. } => Trigger::Woke,
        Cause::Succeeded { action: Action::Do, .. } if after.state == Processed => Trigger::Finished,
        Cause::Succeeded { action: Action::Do, .. } => Trigger::Advanced,
        Cause::Succeeded { action: Action::Undo, .. } if after.state == Compensated => Trigger::Undone,
        Cause::Succeeded { action: Action::Undo, .. } => Trigger::UndoAdvanced,
        Cause::Started { .. } => Trigger::Started,
        Cause::Heartbeat { .. } => Trigger::Heartbeat,
        Cause::Completed { .. } if after.state == Processed => Trigger::Finished,
        Cause::Completed { .. } => Trigger::Advanced,
        Cause::Operator { act, .. } => match (act, after.state) {
            (sas::domain::Act::Resubmit { .. }, _) => Trigger::Resubmit,
            (sas::domain::Act::Compensate, _) => Trigger::OperatorUndo,
            (sas::domain::Act::Cancel, Compensated) => Trigger::CancelUndone,
            (sas::domain::Act::Cancel, _) => Trigger::Cancel,
            (sas::domain::Act::Pause, _) => Trigger::Pause,
            (sas::domain::Act::Resume, _) => Trigger::Resume,
        },
        Cause::Failed { .. } | Cause::DeadlinePassed { .. } => match (before.state, after.state) {
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
            *seen.entry((before.state, trigger)).or_default() += 1;
        }
    }
    seen
}

/// One order's causes, compactly, for a violation's detail.
pub fn history_of(writes: &[WriteRecord], id: &OrderId) -> String {
    let causes: Vec<String> = writes
        .iter()
        .filter(|w| &w.after.order_id == id)
        .map(|w| format!("{:?}->{:?}", w.after.last_cause, w.after.state))
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
    found
}

/// The failure budget of the step `t` is at: the step's own, else the threshold.
fn budget(r: &Records, t: &TaskRecord) -> u32 {
    let threshold = r.policy.failure_threshold;
    r.workflows
        .get_version(&t.workflow, t.workflow_version)
        .map_or(threshold, |wf| wf.max_failures(t.step, threshold))
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
        a_move_of_the_table(r, before, after, add);
        one_live_lease(before, after, add);
        failures_within_budget(r, before, after, add);
        // A timer step whose time cannot be read fails with no reply: there is nothing to fence.
        let timer = r
            .workflows
            .get_version(&before.workflow, before.workflow_version)
            .and_then(|wf| wf.step(before.step))
            .is_some_and(|s| s.is_timer());
        if !(timer && before.state == ProcessState::Pending) {
            replies_fenced(before, after, add);
        }
        completions_fenced(before, after, add);
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
    if after.state != ProcessState::Pending {
        add(Invariant::Lifecycle, format!("order {id} inserted as {:?}", after.state));
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
    if before.state.is_terminal() && !(operator && before.state == ProcessState::Error) {
        add(
            Invariant::Absorbing,
            format!("order {id} left {:?} for {:?} ({:?})", before.state, after.state, after.last_cause),
        );
    }
    if after.revision != before.revision + 1 {
        add(Invariant::Lifecycle, format!("order {id}: revision {} -> {}", before.revision, after.revision));
    }
    match infer_trigger(before, after, r.workflows.get_version(&after.workflow, after.workflow_version)) {
        Some(t) if lifecycle::next(before.state, t) == Some(after.state) => {}
        t => add(
            Invariant::Lifecycle,
            format!("order {id}: {:?} --{t:?}--> {:?} is not in the table", before.state, after.state),
        ),
    }
}

/// No write replaces a live lease with another, and no claim lands while one is live.
fn one_live_lease(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    let id = after.order_id.as_str();
    if let (Some(old), Some(new)) = (before.locked_by, after.locked_by)
        && old != new
    {
        add(
            Invariant::OneLease,
            format!("order {id}: live lease {old} replaced by {new} ({:?})", after.last_cause),
        );
    }
    if matches!(after.last_cause, Cause::Claimed { .. }) && before.locked_by.is_some() {
        add(Invariant::OneLease, format!("order {id}: claimed while lease {:?} was live", before.locked_by));
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
    if after.step_failures > budget(r, after) {
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
        Cause::DeadlinePassed { .. } => {
            if after.failure_count != before.failure_count + 1 {
                add(Invariant::Failures, format!("order {id}: a lapse moved FailureCount by other than one"));
            }
            let used = before.step_failures + 1;
            let retried = after.state == ProcessState::Pending
                || (before.state == ProcessState::Compensating && after.state == ProcessState::Compensating);
            if retried != (used < budget(r, before)) {
                add(
                    Invariant::Failures,
                    format!(
                        "order {id}: lapse {used} of step {} (budget {}) went to {:?}",
                        before.step,
                        budget(r, before),
                        after.state
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
    if !same_step && !after.state.is_terminal() && after.step_failures != 0 {
        add(
            Invariant::Failures,
            format!("order {id}: step {} began with {} failures", after.step, after.step_failures),
        );
    }
}

/// A reply lands only on the live lease's own step, in time. A callback step's failure may
/// also be the outside's word, which passes the token's fence instead.
fn replies_fenced(before: &TaskRecord, after: &TaskRecord, add: &mut impl FnMut(Invariant, String)) {
    let id = after.order_id.as_str();
    let (step, action) = match &after.last_cause {
        Cause::Succeeded { step, action } | Cause::Failed { step, action, .. } => (*step, *action),
        // The agent's success at a callback step: the work started.
        Cause::Started { step } => (*step, Action::Do),
        _ => return,
    };
    let leased = before.locked_by.is_some()
        && matches!(before.state, ProcessState::Processing | ProcessState::Compensating)
        && before.step == step
        && before.action() == action
        && before.complete_by.is_some_and(|cb| after.updated_at <= cb);
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
                before.locked_by,
                before.complete_by,
                after.updated_at
            ),
        );
    }
}

/// The token's fence, restated from ARCHITECTURE.md ("Callback steps"): the record still
/// waits on a callback of this step (claimed or started), and the callback is not yet due.
/// Which attempt's token, and whether it was genuine, only the simulation knows (`check.rs`).
fn token_fenced(before: &TaskRecord, after: &TaskRecord, step: u32) -> bool {
    before.callback.as_ref().is_some_and(|cb| {
        cb.step == step
            && before.step == step
            && before.action() == Action::Do
            && matches!(before.state, ProcessState::Processing | ProcessState::Waiting)
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
                before.state,
                before.callback.as_ref().map(|cb| (cb.step, cb.attempt)),
                before.callback.as_ref().map(|cb| cb.due()),
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
                Cause::Operator { .. } if w.before.as_ref().is_some_and(|b| b.state.is_terminal()) => {
                    ran.reopened += 1;
                }
                Cause::Claimed { step, action: Action::Do } => {
                    ran.claimed_do.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Do }
                | Cause::Woke { step, .. }
                | Cause::Completed { step } => {
                    ran.done.insert(*step);
                }
                Cause::Succeeded { step, action: Action::Undo } => ran.undone.push(*step),
                _ => {}
            }
            if w.after.state.is_terminal() && w.before.as_ref().is_none_or(|b| !b.state.is_terminal()) {
                ran.terminal_entries += 1;
            }
        }
        ran
    }
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

/// Callback steps whose work the outside declined (README: the outside's failure is a
/// refusal: the step had no effect), as the task last heard: a failure of the step while it
/// waited on a callback, not followed by the work starting or completing again. The remote's
/// ledger shows such a step's call applied (the work started), yet nothing of it stands.
fn declined(history: &[&WriteRecord]) -> BTreeSet<u32> {
    let mut declined = BTreeSet::new();
    for w in history {
        let Some(before) = &w.before else { continue };
        match &w.after.last_cause {
            Cause::Failed { step, action: Action::Do, in_doubt: false, .. }
                if before.callback.as_ref().is_some_and(|cb| cb.step == *step) =>
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
    if !task.state.is_terminal() {
        add(Invariant::TerminalOnce, format!("order {id} ended {:?} at step {}", task.state, task.step));
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
        if (after.state == ProcessState::Error || gave_up) && !alerted(after.state, after.failure_count) {
            add(
                Invariant::Alerted,
                format!("order {id} went to {:?} ({:?}) without an alert", after.state, after.last_cause),
            );
        }
    }
    if task.state == ProcessState::Error && !r.alerts.iter().any(|a| &a.order_id == id) {
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
    if task.state == ProcessState::Compensated {
        for step in done.iter().filter(|s| workflow.step(**s).is_some_and(|d| d.compensation.is_some())) {
            if !undone.contains(step) {
                add(
                    Invariant::Compensation,
                    format!("order {id} Compensated but step {step} was done and never undone"),
                );
            }
        }
    }
    if task.state == ProcessState::Processed && (done.len() as u32 != workflow.len() || !undone.is_empty()) {
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
        match task.state {
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
            let upto = match action {
                Action::Do => step,
                Action::Undo => step + 1,
            };
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
                    // Every step below was answered for good before this one ran; the
                    // undone step's own answer is known once the task went past it.
                    let must = below < step || called(step + 1, Action::Do);
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
