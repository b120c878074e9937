//! Fences: a reply lands only under the live lease, in time, and a branch's only on its
//! running stage; the outside's completion and heartbeat only through the callback token's
//! fence.

use sas::domain::{Action, Cause, ProcessState, TaskRecord, Workflow};

use super::catalogue::Invariant;
use super::transitions::{branch_live, running_stage};

/// A reply lands only on the live lease's own step, in time. A callback step's failure may
/// also be the outside's word, which passes the token's fence instead. A branch's reply
/// lands only on its stage's record, with that branch in flight: after the stage ended it
/// changes nothing.
pub(super) fn replies_fenced(
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
pub(super) fn completions_fenced(
    before: &TaskRecord,
    after: &TaskRecord,
    add: &mut impl FnMut(Invariant, String),
) {
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
