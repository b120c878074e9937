//! What each call was handed and called as: the outputs of the steps before it (a
//! callback step's the outside's), and the agent and step of the task's pinned workflow
//! version.

use std::collections::BTreeMap;

use sas::domain::{Action, OrderId, Workflow, idempotency_key, item_key};

use super::catalogue::Invariant;
use crate::ledger::Ledger;

/// What the remote side was handed and called as, against the task's pinned version:
/// every call of step `s` carries exactly the outputs the steps before it answered (a
/// compensation also its own step's, once the task went past it), and names that
/// version's agent and step (or compensation).
/// `lines`: the order's line items, a map's items when it takes them from the order.
pub(super) fn check_outputs_and_pins(
    ledger: &Ledger,
    id: &OrderId,
    workflow: &Workflow,
    lines: usize,
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
    // A map's outputs are kept under its name, as one array (`map_output`).
    let name_at = |step: u32| match workflow.map_at(step) {
        Some(map) => map.name.as_str(),
        None => workflow.steps[step as usize].name.as_str(),
    };
    let expected = |step: u32| -> Option<String> {
        match workflow.map_at(step) {
            Some(_) => map_output(ledger, id, workflow, step, lines),
            None => kept(step).map(str::to_owned),
        }
    };
    check_item_calls(ledger, id, workflow, lines, &kept, add);
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
                    let position = (0..workflow.len()).position(|s| name_at(s) == name);
                    if position.is_none_or(|p| p as u32 >= upto) {
                        add(
                            Invariant::Outputs,
                            format!("order {id}: step {step} {action:?} handed {name:?}'s output"),
                        );
                    }
                }
                for below in 0..upto {
                    let name = name_at(below);
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
                    match (handed, expected(below).as_deref()) {
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

/// The items of map step `at` for order `id`, as the service's answers listed them.
fn map_items(ledger: &Ledger, id: &OrderId, workflow: &Workflow, at: u32, lines: usize) -> Option<usize> {
    let path = workflow.map_at(at)?.items_path().ok()?;
    if path == sas::domain::ItemsPath::OrderItems {
        return Some(lines);
    }
    let step = workflow.step_named(path.step()?)?;
    let mut outputs = sas::domain::Outputs::new();
    let answer: serde_json::Value =
        serde_json::from_str(ledger.answer(&idempotency_key(id, step, Action::Do).0)).ok()?;
    outputs.insert(path.step()?.to_owned(), sas::domain::StepOutput::from_value(&answer).ok()?);
    path.resolve(|| serde_json::Value::Null, &outputs).ok().map(|items| items.len())
}

/// What a finished map keeps under its name: each item's answer in item order, `null` for
/// one that answered none (or was refused), as compact JSON.
fn map_output(ledger: &Ledger, id: &OrderId, workflow: &Workflow, at: u32, lines: usize) -> Option<String> {
    let n = map_items(ledger, id, workflow, at, lines)?;
    let items: Vec<String> = (0..n as u32)
        .map(|i| {
            let answer = ledger.answer(&item_key(id, at, i, false).0);
            if answer.is_empty() { "null".to_owned() } else { answer.to_owned() }
        })
        .collect();
    let text = format!("[{}]", items.join(","));
    // As the request carries it: parsed, so its objects' fields in order.
    serde_json::from_str::<serde_json::Value>(&text).ok().map(|v| v.to_string())
}

/// Every call of a map's item: named as the pinned version's step (or compensation), under
/// a key of an item the map has, and handed the outputs of the steps before the map (a
/// compensation also the item's own answer, under the step's name).
fn check_item_calls<'l>(
    ledger: &'l Ledger,
    id: &OrderId,
    workflow: &Workflow,
    lines: usize,
    kept: &impl Fn(u32) -> Option<&'l str>,
    add: &mut impl FnMut(Invariant, String),
) {
    for map in &workflow.maps {
        let Some(def) = workflow.step(map.at) else { continue };
        let prefix = format!("{id}:{}.", map.at);
        let n = map_items(ledger, id, workflow, map.at, lines);
        for (key, names) in
            ledger.called_as.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix))
        {
            let Some((index, action)) = key[prefix.len()..].split_once(':').and_then(|(i, a)| {
                let action = match a {
                    "do" => Action::Do,
                    "undo" => Action::Undo,
                    _ => return None,
                };
                Some((i.parse::<u32>().ok()?, action))
            }) else {
                add(Invariant::Idempotency, format!("order {id}: map {} called under key {key}", map.name));
                continue;
            };
            if n.is_some_and(|n| index as usize >= n) {
                add(
                    Invariant::Idempotency,
                    format!("order {id}: map {} called for item {index} of {n:?}", map.name),
                );
            }
            let want = match action {
                Action::Do => Some(def.name.as_str()),
                Action::Undo => def.compensation.as_deref(),
            };
            for (agent, name) in names {
                if agent != &def.agent || Some(name.as_str()) != want {
                    add(
                        Invariant::Pinned,
                        format!(
                            "order {id}: item {index} of map {} {action:?} called as {agent}/{name}",
                            map.name
                        ),
                    );
                }
            }
            for handed in ledger.handed.get(key).into_iter().flatten() {
                let got: BTreeMap<String, serde_json::Value> =
                    serde_json::from_str(handed).unwrap_or_default();
                for below in 0..map.at {
                    let name = &workflow.steps[below as usize].name;
                    if workflow.step(below).is_some_and(|s| s.is_callback())
                        || workflow.map_at(below).is_some()
                    {
                        continue;
                    }
                    let g = got.get(name).map(|v| v.to_string());
                    if g.as_deref() != kept(below) {
                        add(
                            Invariant::Outputs,
                            format!(
                                "order {id}: item {index} of map {} {action:?} handed {name}'s output {g:?}, not {:?}",
                                map.name,
                                kept(below)
                            ),
                        );
                    }
                }
                let own = ledger.answer(&item_key(id, map.at, index, false).0);
                let got_own = got.get(&def.name).map(|v| v.to_string());
                // A compensation gets the item's own output when its success was heard: not
                // when the item was given up in doubt.
                let want_own = (action == Action::Undo && !own.is_empty()).then_some(own);
                if got_own.is_some() && got_own.as_deref() != want_own {
                    add(
                        Invariant::Outputs,
                        format!(
                            "order {id}: item {index} of map {} {action:?} handed its own output {got_own:?}, not {want_own:?}",
                            map.name
                        ),
                    );
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
