//! What each call was handed and called as: the outputs of the steps before it (a
//! callback step's the outside's), and the agent and step of the task's pinned workflow
//! version.

use std::collections::BTreeMap;

use sas::domain::{Action, OrderId, Workflow, idempotency_key};

use super::catalogue::Invariant;
use crate::ledger::Ledger;

/// What the remote side was handed and called as, against the task's pinned version:
/// every call of step `s` carries exactly the outputs the steps before it answered (a
/// compensation also its own step's, once the task went past it), and names that
/// version's agent and step (or compensation).
pub(super) fn check_outputs_and_pins(
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
