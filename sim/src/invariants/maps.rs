//! Map steps: the cap held in every record, each item under its own key with one effect,
//! and an undo of exactly the items that may have taken effect, once each, newest first.
//! Judged from the order's writes and the remote's ledger, restated from docs/REFERENCE.md
//! ("Map steps"), not from the domain's code.

use std::collections::BTreeMap;

use sas::domain::ReplyOutcome;
use sas::domain::messages::AgentReply;

use sas::adapters::embedded::WriteRecord;
use sas::domain::map::MapStep;
use sas::domain::{Action, Cause, ProcessState, StepKind, TaskRecord, Workflow, item_key};

use super::catalogue::Invariant;
use super::history::history_of_writes;
use crate::ledger::{Ledger, Settled};

/// Whether `key` is the key of an item of map step `at` of order `id` (`<id>:<at>.<i>:<action>`),
/// and which.
pub(super) fn item_of(key: &str, id: &str, at: u32) -> Option<(u32, Action)> {
    let rest = key.strip_prefix(id)?.strip_prefix(':')?.strip_prefix(&format!("{at}."))?;
    let (index, action) = rest.split_once(':')?;
    let action = match action {
        "do" => Action::Do,
        "undo" => Action::Undo,
        _ => return None,
    };
    let canonical = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    canonical.then(|| index.parse().ok().map(|i| (i, action))).flatten()
}

/// Every map check of one order.
pub(super) fn check_maps(
    ledger: &Ledger,
    task: &TaskRecord,
    workflow: &Workflow,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    for map in &workflow.maps {
        cap_held(task, map, history, add);
        through_gate(task, map, history, add);
        items_once(ledger, task, map, history, add);
        undo_exact(ledger, task, workflow, map, history, add);
    }
}

/// No record has more of the map's items in flight than its `max_concurrency`.
fn cap_held(
    task: &TaskRecord,
    map: &MapStep,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    for w in history {
        let Some(run) = w.after.stage().filter(|r| r.map && r.at == map.at) else { continue };
        let in_flight = run.branches.iter().filter(|b| b.complete_by.is_some()).count();
        if in_flight > map.max_concurrency as usize {
            add(
                Invariant::MapCapHeld,
                format!(
                    "order {}: map {} has {in_flight} items in flight, at most {} allowed ({:?})",
                    task.order_id, map.name, map.max_concurrency, w.after.last_cause
                ),
            );
            return;
        }
    }
}

/// A gated map (its agent has limits) has at most one item in flight in any record, and
/// an item goes out only in a write that claims the task under a lease of its own: the
/// claim is what takes the item's place in the agent's gate.
fn through_gate(
    task: &TaskRecord,
    map: &MapStep,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    if !map.gated {
        return;
    }
    let run_of = |t: &TaskRecord| t.stage().filter(|r| r.map && r.at == map.at).cloned();
    for w in history {
        let Some(run) = run_of(&w.after) else { continue };
        let in_flight = run.branches.iter().filter(|b| b.complete_by.is_some()).count();
        let before = w.before.as_deref().and_then(run_of);
        let sent = (0u32..).zip(&run.branches).filter(|(i, b)| {
            b.dispatches
                > before.as_ref().and_then(|r| r.branches.get(*i as usize)).map_or(0, |b| b.dispatches)
        });
        let claimed = matches!(w.after.last_cause, Cause::Claimed { .. })
            && w.after.locked_by().is_some()
            && w.before.as_ref().is_none_or(|b| b.locked_by() != w.after.locked_by());
        let unclaimed: Vec<u32> = sent.filter(|_| !claimed).map(|(i, _)| i).collect();
        if in_flight > 1 || !unclaimed.is_empty() {
            add(
                Invariant::MapItemsThroughGate,
                format!(
                    "order {}: gated map {} has {in_flight} items in flight, and items {unclaimed:?} sent without a claim ({:?})",
                    task.order_id, map.name, w.after.last_cause
                ),
            );
            return;
        }
    }
}

/// Every call of the map's step is under an item's own key; and once the map is done, every
/// item it did not tolerate as refused took effect under its own key.
fn items_once(
    ledger: &Ledger,
    task: &TaskRecord,
    map: &MapStep,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    let id = task.order_id.as_str();
    for action in [Action::Do, Action::Undo] {
        let Some(keys) = ledger.keys.get(&(id.to_owned(), map.at, action)) else { continue };
        for key in keys.iter().filter(|k| item_of(k, id, map.at) != Some((item_index(k), action))) {
            add(
                Invariant::MapItemOnce,
                format!("order {id}: map {} called under key {key}, not an item's", map.name),
            );
        }
    }
    // The write that finished the map: forward from its step to the next (or the end).
    let done = history.iter().find(|w| {
        w.before.as_ref().is_some_and(|b| b.step == map.at && b.action() == Action::Do)
            && matches!(w.after.last_cause, Cause::Succeeded { step, action: Action::Do } if step == map.at)
            && (w.after.step > map.at || w.after.state() == ProcessState::Processed)
    });
    let Some(done) = done else { return };
    let Some(n) = done.after.outputs.get(&map.name).and_then(|o| match o.to_value() {
        serde_json::Value::Array(items) => Some(items.len() as u32),
        _ => None,
    }) else {
        add(Invariant::MapItemOnce, format!("order {id}: map {} went on without its outputs", map.name));
        return;
    };
    for i in (0..n).filter(|i| !done.after.refused_items.contains(i)) {
        if !ledger.is_applied(&item_key(&task.order_id, map.at, i, false).0) {
            add(
                Invariant::MapItemOnce,
                format!(
                    "order {id}: map {} went on, but item {i} of {n} never took effect under its key",
                    map.name
                ),
            );
        }
    }
}

fn item_index(key: &str) -> u32 {
    key.rsplit_once(':')
        .and_then(|(head, _)| head.rsplit_once('.'))
        .and_then(|(_, i)| i.parse().ok())
        .unwrap_or(0)
}

/// Undoing the map, judged from the order's writes (which items were dispatched and which
/// refused) and the remote's ledger (which were undone, and when): an item's compensation
/// is called only for one that may have taken effect (dispatched, and not refused since),
/// each applied after its own effect, newest first; a task that ends Compensated undid
/// every item that may have, and none of a pivot map's may have.
fn undo_exact(
    ledger: &Ledger,
    task: &TaskRecord,
    workflow: &Workflow,
    map: &MapStep,
    history: &[&WriteRecord],
    add: &mut impl FnMut(Invariant, String),
) {
    let id = &task.order_id;
    #[derive(Default, Clone, Copy)]
    struct Seen {
        dispatched: bool,
        refused: bool,
    }
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    for w in history {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(run) = after.stage().filter(|r| r.map && r.at == map.at) else { continue };
        // Going forward, dispatches; in any direction, the refusal that gave the map up.
        let forward = after.action() == Action::Do;
        let was = before.stage().filter(|r| r.map && r.at == map.at);
        for (i, b) in (0u32..).zip(&run.branches) {
            let w = was.and_then(|r| r.branches.get(i as usize));
            let s = seen.entry(i).or_default();
            if forward && b.dispatches > w.map_or(0, |w| w.dispatches) {
                *s = Seen { dispatched: true, refused: false };
            } else if forward && b.dispatches == 0 {
                // A resubmit runs a refused item again from nothing.
                *s = Seen::default();
            }
            if b.outcome == sas::domain::Outcome::Refused
                && w.is_some_and(|w| w.outcome != sas::domain::Outcome::Refused)
            {
                s.refused = true;
            }
        }
    }
    let may = |i: u32| seen.get(&i).is_some_and(|s| s.dispatched && !s.refused);
    let settled_at = |i: u32, undo: bool| match ledger.settled.get(&item_key(id, map.at, i, undo).0) {
        Some(Settled::Applied { at }) => Some(*at),
        _ => None,
    };
    let mut undone: Vec<(u64, u32)> = Vec::new();
    for key in ledger.keys.get(&(id.as_str().to_owned(), map.at, Action::Undo)).into_iter().flatten() {
        let Some((i, _)) = item_of(key, id.as_str(), map.at) else { continue };
        if !may(i) {
            add(
                Invariant::MapUndoExact,
                format!(
                    "order {id}: compensation of item {i} of map {} called, though it {}; history: {}",
                    map.name,
                    if seen.get(&i).is_some_and(|s| s.dispatched) {
                        "was refused"
                    } else {
                        "was never dispatched"
                    },
                    history_of_writes(history)
                ),
            );
        }
        if let Some(at) = settled_at(i, true) {
            undone.push((at, i));
            if settled_at(i, false).is_some_and(|done| done > at) {
                add(
                    Invariant::MapUndoExact,
                    format!("order {id}: item {i} of map {} took effect after its undo", map.name),
                );
            }
        }
    }
    undone.sort_by_key(|(at, _)| *at);
    if undone.windows(2).any(|p| p[0].0 < p[1].0 && p[0].1 <= p[1].1) {
        let order: Vec<u32> = undone.iter().map(|(_, i)| *i).collect();
        add(Invariant::MapUndoExact, format!("order {id}: map {} undone in item order {order:?}", map.name));
    }
    // Judged at the remote: an item that took effect there stands until its undo does.
    if task.state() == ProcessState::Compensated {
        let Some(def) = workflow.step(map.at) else { return };
        for i in seen.keys().copied().filter(|i| settled_at(*i, false).is_some()) {
            let wrong = match def.kind() {
                StepKind::Pivot => Some("an item of a pivot map that took effect"),
                StepKind::Compensable if settled_at(i, true).is_none() => {
                    Some("an item that took effect, never undone")
                }
                _ => None,
            };
            if let Some(wrong) = wrong {
                add(
                    Invariant::MapUndoExact,
                    format!(
                        "order {id} Compensated with item {i} of map {}: {wrong}; history: {}",
                        map.name,
                        history_of_writes(history)
                    ),
                );
            }
        }
    }
}

/// What the run's map steps went through: maps started (`maps`), over no items (`empty`),
/// one (`one`) or a hundred and more (`hundreds`); the items run over (`items`) and the
/// most of one map in flight at once (`max_in_flight`); items refused within tolerance
/// (`tolerated`), maps given up or cancelled (`stopped`), and items undone (`undone`).
pub fn map_coverage(
    writes: &[WriteRecord],
    workflows: &sas::domain::Workflows,
) -> BTreeMap<&'static str, u64> {
    let mut seen = BTreeMap::new();
    for w in writes {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        let Some(wf) = workflows.get_version(&after.workflow, after.workflow_version) else { continue };
        if wf.maps.is_empty() {
            continue;
        }
        let mut count = |kind: &'static str, n: u64| *seen.entry(kind).or_default() += n;
        let started = after.stage().filter(|r| r.map && before.stage().is_none_or(|b| !b.map));
        if let Some(run) = started.filter(|_| after.action() == Action::Do) {
            count("maps", 1);
            count("items", run.branches.len() as u64);
            count(
                if run.branches.len() == 1 {
                    "one"
                } else if run.branches.len() >= 100 {
                    "hundreds"
                } else {
                    "few"
                },
                1,
            );
        }
        if matches!(after.last_cause, Cause::NoItems { .. }) {
            count("maps", 1);
            count("empty", 1);
        }
        if let Some(run) = after.stage().filter(|r| r.map) {
            let in_flight = run.branches.iter().filter(|b| b.in_flight()).count() as u64;
            let most: &mut u64 = seen.entry("max_in_flight").or_default();
            *most = (*most).max(in_flight);
        }
        match &after.last_cause {
            Cause::Failed { step, action: Action::Do, .. }
                if wf.map_at(*step).is_some() && after.state() == ProcessState::Processing =>
            {
                *seen.entry("tolerated").or_default() += 1
            }
            Cause::Succeeded { step, action: Action::Undo } if wf.map_at(*step).is_some() => {
                *seen.entry("undone").or_default() += 1
            }
            _ => {}
        }
        let at_map =
            before.stage().is_some_and(|r| r.map && r.at == before.step) && before.action() == Action::Do;
        if at_map
            && matches!(
                after.state(),
                ProcessState::Compensating | ProcessState::Compensated | ProcessState::Error
            )
        {
            *seen.entry("stopped").or_default() += 1;
        }
    }
    seen
}

/// Why a map item's reply should not have landed, if it should not: it must come for the
/// live lease, at the map's step, from its item's own dispatch (attempt) within that
/// dispatch's complete-by. The last item's answer ends the map as a whole, a success even
/// when it was a tolerated refusal.
pub fn item_reply_fenced(
    before: &TaskRecord,
    after: &TaskRecord,
    reply: &AgentReply,
    (step, action): (u32, Action),
    succeeded: bool,
) -> Option<String> {
    let item = before
        .stage()
        .filter(|r| r.map && r.at == reply.step)
        .and_then(|r| r.branches.get(reply.index.unwrap_or(u32::MAX) as usize));
    let went_on = after.step != before.step || after.state() == ProcessState::Processed;
    let live = reply.order_id == before.order_id
        && before.locked_by() == Some(reply.lease)
        && before.state() == ProcessState::Processing
        && before.step == reply.step
        && item.is_some_and(|b| {
            b.attempt == reply.attempt && b.complete_by.is_some_and(|cb| after.updated_at <= cb)
        })
        && (step, action) == (reply.step, reply.action)
        && (went_on || succeeded == matches!(reply.outcome, ReplyOutcome::Succeeded { .. }));
    (!live).then(|| {
        format!(
            "(attempt {}, lease {}) applied to {:?} at step {} lease {:?}, item {item:?}, as {:?} at {}",
            reply.attempt,
            reply.lease,
            before.state(),
            before.step,
            before.locked_by(),
            after.last_cause,
            after.updated_at
        )
    })
}
