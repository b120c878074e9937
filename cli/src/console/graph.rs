//! A task's workflow drawn as inline SVG: its steps in order left to right, a parallel
//! stage's branches side by side in one column, a map's step framed with how far it is
//! over its items, timer and callback steps and pivots
//! marked, each compensation under its step, and each step's outcome on this task (from
//! the record: its current step and state, its timeline, its outputs).

use sas::domain::{Happened, Outcome, ProcessState, TaskRecord, Trigger, Workflow};

use super::html::esc;
use crate::tasks::render::MapPhase;

const BOX_W: u32 = 170;
const BOX_H: u32 = 54;
const COMP_H: u32 = 24;
const GAP_X: u32 = 40;
const GAP_Y: u32 = 18;
const PAD: u32 = 12;

/// What became of one step on this task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Not reached.
    Ahead,
    /// Where the task is now, in this state.
    Current(ProcessState),
    /// Succeeded.
    Done,
    /// Its compensation ran.
    Undone,
    /// The task gave up at it.
    Failed,
}

impl Mark {
    pub fn class(self) -> &'static str {
        match self {
            Mark::Ahead => "ahead",
            Mark::Current(ProcessState::Error) => "failed",
            Mark::Current(_) => "current",
            Mark::Done => "done",
            Mark::Undone => "undone",
            Mark::Failed => "failed",
        }
    }

    pub fn label(self) -> String {
        match self {
            Mark::Ahead => "not reached".into(),
            Mark::Current(state) => format!("now: {}", state.as_str()),
            Mark::Done => "succeeded".into(),
            Mark::Undone => "undone".into(),
            Mark::Failed => "gave up here".into(),
        }
    }
}

/// Step `index`'s mark: the current step (and its stage's branches) by the task's state,
/// else the last timeline entry about the step, else its output, else where the task is.
pub fn mark(task: &TaskRecord, wf: &Workflow, index: u32) -> Mark {
    let state = task.state();
    let here = wf.together(task.step).contains(&index);
    if here && !matches!(state, ProcessState::Processed | ProcessState::Compensated) {
        return Mark::Current(state);
    }
    let last = task.timeline.iter().rev().find(|e| e.step == index && e.what != Happened::Submitted);
    if let Some(Happened::Moved(trigger)) = last.map(|e| e.what) {
        match trigger {
            Trigger::Advanced
            | Trigger::Finished
            | Trigger::BranchDone
            | Trigger::NextItem
            | Trigger::Woke => return Mark::Done,
            Trigger::UndoAdvanced | Trigger::Undone => return Mark::Undone,
            Trigger::Fail | Trigger::ForwardOnly | Trigger::Undo => return Mark::Failed,
            _ => {}
        }
    }
    let name = wf.step(index).map(|s| s.name.as_str()).unwrap_or_default();
    if task.outputs.contains_key(name) || (index < task.step && state != ProcessState::Compensated) {
        return Mark::Done;
    }
    if state == ProcessState::Processed {
        return Mark::Done;
    }
    Mark::Ahead
}

/// The columns: each a lone step, a stage's branches, or a map's one step, framed with
/// its caption (`parallel: NAME`, `map: NAME`).
fn columns(wf: &Workflow) -> Vec<(Option<String>, Vec<u32>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < wf.len() {
        match (wf.stage_of(i), wf.map_at(i)) {
            (Some(stage), _) => {
                out.push((Some(format!("parallel: {}", stage.name)), stage.branches().collect()));
                i = stage.end();
            }
            (None, Some(map)) => {
                out.push((Some(format!("map: {}", map.name)), vec![i]));
                i += 1;
            }
            (None, None) => {
                out.push((None, vec![i]));
                i += 1;
            }
        }
    }
    out
}

/// A map's caption while the task is at it: how far it is over its items.
fn map_progress(task: &TaskRecord, wf: &Workflow, step: u32) -> Option<String> {
    let view = crate::tasks::render::map_view(task, Some(wf)).filter(|v| v.at == step)?;
    let n = view.items()?;
    Some(match view.phase {
        MapPhase::NotStarted(_) => format!(" · {n} items"),
        MapPhase::Undoing => format!(" · {}/{n} undone", view.count(Outcome::Undone)),
        _ => format!(" · {}/{n} done", view.count(Outcome::Succeeded)),
    })
}

/// The workflow as one `<svg>`, each step's outcome on `task` marked.
pub fn svg(task: &TaskRecord, wf: &Workflow) -> String {
    let cols = columns(wf);
    let tallest = cols.iter().map(|(_, steps)| steps.len() as u32).max().unwrap_or(1);
    let row_h = BOX_H + COMP_H + GAP_Y;
    let width = PAD * 2 + cols.len() as u32 * (BOX_W + GAP_X);
    let height = PAD * 2 + 18 + tallest * row_h;
    let mut out = format!(
        "<svg class=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"workflow {name} v{version}\">",
        name = esc(&wf.name),
        version = wf.version
    );
    out.push_str(
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\"/></marker></defs>",
    );
    let top = PAD + 18;
    for (c, (stage, steps)) in cols.iter().enumerate() {
        let x = PAD + c as u32 * (BOX_W + GAP_X);
        if let Some(caption) = stage {
            let h = steps.len() as u32 * row_h;
            let progress = map_progress(task, wf, steps[0]).unwrap_or_default();
            out.push_str(&format!(
                "<rect class=\"stage\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{h}\" rx=\"8\"/><text class=\"stage-name\" x=\"{}\" y=\"{}\">{}</text>",
                x - 6,
                top - 14,
                BOX_W + 12,
                x,
                top - 2,
                esc(&format!("{caption}{progress}"))
            ));
        }
        for (r, &index) in steps.iter().enumerate() {
            let y = top + r as u32 * row_h;
            out.push_str(&node(task, wf, index, x, y));
        }
        if c + 1 < cols.len() {
            let y = top + BOX_H / 2;
            out.push_str(&format!(
                "<line class=\"edge\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" marker-end=\"url(#arrow)\"/>",
                x + BOX_W + if stage.is_some() { 6 } else { 0 },
                x + BOX_W + GAP_X - 2
            ));
        }
    }
    out.push_str("</svg>");
    out
}

/// One step's box (and its compensation's, under it).
fn node(task: &TaskRecord, wf: &Workflow, index: u32, x: u32, y: u32) -> String {
    let Some(step) = wf.step(index) else { return String::new() };
    let m = mark(task, wf, index);
    let kind = if step.is_timer() {
        "timer".to_owned()
    } else if step.is_callback() {
        format!("callback · {}", step.agent)
    } else if step.is_pivot() {
        format!("pivot · {}", step.agent)
    } else {
        step.agent.clone()
    };
    let badge = if step.is_timer() {
        "⏱ "
    } else if step.is_callback() {
        "☎ "
    } else {
        ""
    };
    let mut out = format!(
        "<g class=\"step {class}\" data-step=\"{name}\"><title>step {index} {name}: {label}</title>\
<rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"6\"/>\
<text class=\"name\" x=\"{tx}\" y=\"{ty1}\">{badge}{name}</text>\
<text class=\"kind\" x=\"{tx}\" y=\"{ty2}\">{kind}</text>\
<text class=\"mark\" x=\"{tx}\" y=\"{ty3}\">{label}</text></g>",
        class = m.class(),
        name = esc(&step.name),
        label = esc(&m.label()),
        kind = esc(&kind),
        tx = x + 8,
        ty1 = y + 17,
        ty2 = y + 32,
        ty3 = y + 47,
    );
    if let Some(comp) = &step.compensation {
        let cy = y + BOX_H + 4;
        out.push_str(&format!(
            "<g class=\"compensation{undone}\"><title>compensation of {name}: {comp}</title>\
<rect x=\"{x}\" y=\"{cy}\" width=\"{BOX_W}\" height=\"{h}\" rx=\"4\"/>\
<text x=\"{tx}\" y=\"{ty}\">↺ {comp}</text></g>",
            undone = if m == Mark::Undone { " ran" } else { "" },
            name = esc(&step.name),
            comp = esc(comp),
            h = COMP_H - 6,
            tx = x + 8,
            ty = cy + 13,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::Step;

    #[test]
    fn every_step_is_drawn_and_the_current_one_marked() {
        let wf = Workflow::new(
            "w",
            vec![Step::compensable("reserve", "inventory", "release"), Step::pivot("charge", "payment")],
        );
        let mut task = crate::fixtures::task("o-1", ProcessState::Pending);
        task.step = 1;
        let drawn = svg(&task, &wf);
        assert!(drawn.starts_with("<svg"), "{drawn}");
        for text in ["reserve", "charge", "↺ release", "pivot · payment", "now: Pending", "succeeded"] {
            assert!(drawn.contains(text), "{text}: {drawn}");
        }
        assert_eq!(mark(&task, &wf, 0), Mark::Done);
        assert_eq!(mark(&task, &wf, 1), Mark::Current(ProcessState::Pending));
    }

    #[test]
    fn a_stage_is_one_column_and_timers_are_marked() {
        let file = include_str!("../../../examples/parallel.json");
        let definitions = sas::domain::Definitions::parse(file).unwrap();
        let wf = definitions.workflows.get("parallel-order").unwrap();
        let stage = wf.stage_of(0).expect("the first steps are a stage");
        let cols = columns(wf);
        assert_eq!(cols[0].1, stage.branches().collect::<Vec<_>>(), "the branches side by side");
        assert_eq!(cols.len() as u32, wf.len() - stage.len + 1);
        let task = crate::fixtures::task("o-1", ProcessState::Pending);
        let drawn = svg(&task, wf);
        assert!(drawn.contains(&format!("parallel: {}", stage.name)), "{drawn}");
        let file = include_str!("../../../examples/cool-off.json");
        let definitions = sas::domain::Definitions::parse(file).unwrap();
        let drawn = svg(&task, definitions.workflows.get("cool-off").unwrap());
        assert!(drawn.contains("⏱ cool-off"), "{drawn}");
    }

    #[test]
    fn a_map_is_framed_with_how_far_its_items_are() {
        let (wf, t) = crate::fixtures::map_under_way();
        assert_eq!(columns(&wf)[1], (Some("map: reserve-lines".to_owned()), vec![1]));
        assert!(svg(&t, &wf).contains(">map: reserve-lines · 1/5 done</text>"));
        // Before its first claim, how many items it will read; past it, the caption alone.
        let waiting = crate::fixtures::at_map(&wf, 4);
        assert!(svg(&waiting, &wf).contains(">map: reserve-lines · 4 items</text>"));
        let fresh = crate::fixtures::task("o-1", ProcessState::Pending);
        assert!(svg(&fresh, &wf).contains(">map: reserve-lines</text>"));
    }
}
