//! Failure budgets: FailureCount only grows, only a lapse moves it, and a step (or each
//! branch of a parallel stage) is retried exactly while it is below its budget.

use sas::domain::{Action, Cause, ProcessState, TaskRecord, Workflow};

use super::catalogue::{Invariant, Records};
use super::transitions::running_stage;

/// The failure budget of the step `t` is at: the step's own, else the threshold.
pub(super) fn budget(r: &Records, t: &TaskRecord) -> u32 {
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

/// FailureCount only grows, and only a lapse moves it, by one; a lapse retries exactly
/// while the step's failures are below its budget; a new step starts with none.
pub(super) fn failures_within_budget(
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
            // A map's items all run its one step, under its budget.
            let step = if run.map { run.at } else { step };
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
    // An operator's action gives the step a fresh budget; so does each item's undo of a map.
    let item_undone = matches!(after.last_cause, Cause::Succeeded { step, action: Action::Undo }
        if wf.is_some_and(|wf| wf.map_at(step).is_some()));
    let operator = matches!(after.last_cause, Cause::Operator { .. }) || item_undone;
    let same_step = after.step == before.step && after.action() == before.action();
    let map_run =
        before.stage().filter(|r| r.map && r.at == before.step && before.state() == ProcessState::Processing);
    match &after.last_cause {
        Cause::DeadlinePassed { .. } if map_run.is_some() => {
            if after.failure_count != before.failure_count + 1 {
                add(Invariant::Failures, format!("order {id}: a lapse moved FailureCount by other than one"));
            }
            if let (Some(wf), Some(run)) = (wf, map_run) {
                map_lapse(r, before, after, wf, run, add);
            }
        }
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

/// A lapse of a claimed map counts one failure against each item in flight, against the
/// step's budget: the map is retried exactly while each is below it. A paused map with no
/// item in flight counts none against any (the pause stopped it, not a lost reply).
fn map_lapse(
    r: &Records,
    before: &TaskRecord,
    after: &TaskRecord,
    wf: &Workflow,
    run: &sas::domain::StageRun,
    add: &mut impl FnMut(Invariant, String),
) {
    let id = after.order_id.as_str();
    let own = wf.max_failures(before.step, r.policy.failure_threshold);
    let out: Vec<(usize, u32)> = (0..run.branches.len())
        .filter(|i| run.branches[*i].complete_by.is_some())
        .map(|i| (i, run.branches[i].failures + 1))
        .collect();
    let spent = out.iter().any(|(_, used)| *used >= own);
    let retried = after.state() == ProcessState::Pending;
    if retried == spent {
        add(
            Invariant::Failures,
            format!(
                "order {id}: a lapse of a map (items' lapses {out:?}, budget {own}) went to {:?}",
                after.state()
            ),
        );
    }
    if retried {
        let now = |i: usize| after.stage().and_then(|r| r.branches.get(i)).map_or(0, |b| b.failures);
        for (i, used) in &out {
            if now(*i) != *used {
                add(
                    Invariant::Failures,
                    format!(
                        "order {id}: a retry of a map counted {} failures of item {i}, not {used}",
                        now(*i)
                    ),
                );
            }
        }
        if out.is_empty() && after.step_failures != before.step_failures {
            add(Invariant::Failures, format!("order {id}: a paused map's lapse counted step failures"));
        }
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
