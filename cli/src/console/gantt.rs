//! A task's history as inline SVG, Gantt-like: one row per step, one bar per attempt of it
//! from its first timeline entry to its last (to now for the attempt still under way), a
//! tick per entry (hover: what, when, who and why). Only what the record's bounded
//! timeline keeps: the page says how many entries were dropped.

use std::collections::BTreeMap;

use sas::domain::{Entry, Happened, TaskRecord, Timestamp, Trigger, Workflow};

use super::html::esc;
use crate::tasks::render::iso;

const LABEL_W: u32 = 170;
const PLOT_W: u32 = 640;
const ROW_H: u32 = 26;
const TOP: u32 = 24;

/// One attempt of one step: from its first entry to its last (or now).
struct Span<'a> {
    step: u32,
    attempt: u32,
    entries: Vec<&'a Entry>,
    end: Timestamp,
}

/// The timeline's length, as the axis says it: `850 ms`, `12.5 s`, `3.2 min`, `1.5 h`.
fn length(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..120_000 => format!("{:.1} s", ms as f64 / 1e3),
        120_000..7_200_000 => format!("{:.1} min", ms as f64 / 6e4),
        _ => format!("{:.1} h", ms as f64 / 3.6e6),
    }
}

fn class(entry: &Entry) -> &'static str {
    match entry.what {
        Happened::Submitted => "submitted",
        Happened::Moved(t) => match t {
            Trigger::Advanced
            | Trigger::Finished
            | Trigger::BranchDone
            | Trigger::NextItem
            | Trigger::Woke => "done",
            Trigger::UndoAdvanced | Trigger::Undone | Trigger::CancelUndone => "undone",
            Trigger::Fail | Trigger::ForwardOnly | Trigger::Undo | Trigger::Retry => "failed",
            _ if entry.by.is_some() => "operator",
            _ => "running",
        },
    }
}

fn spans<'a>(task: &'a TaskRecord, now: Timestamp) -> Vec<Span<'a>> {
    let mut by_key: BTreeMap<(u32, u32), Vec<&Entry>> = BTreeMap::new();
    for e in task.timeline.iter() {
        let attempt = if e.what == Happened::Submitted { 0 } else { e.step_attempt() };
        by_key.entry((e.step, attempt)).or_default().push(e);
    }
    let live = !task.state().is_terminal();
    by_key
        .into_iter()
        .map(|((step, attempt), entries)| {
            let last = entries.last().map_or(Timestamp(0), |e| e.at);
            let current = live && step == task.step && attempt == task.step_attempts && attempt > 0;
            Span { step, attempt, end: if current { now.max(last) } else { last }, entries }
        })
        .collect()
}

/// The timeline as one `<svg>`, drawn to `now`; an empty timeline draws a line saying so.
pub fn svg(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp) -> String {
    let spans = spans(task, now);
    let Some(start) = task.timeline.first().map(|e| e.at) else {
        return "<p class=\"empty\">the timeline holds no entry</p>".into();
    };
    let end = spans.iter().map(|s| s.end).max().unwrap_or(start).max(Timestamp(start.0 + 1));
    let total = (end.0 - start.0) as f64;
    let x_of = |t: Timestamp| LABEL_W as f64 + (t.0.saturating_sub(start.0)) as f64 / total * PLOT_W as f64;
    let rows: Vec<u32> = {
        let mut r: Vec<u32> = spans.iter().map(|s| s.step).collect();
        r.dedup();
        r
    };
    let width = LABEL_W + PLOT_W + 20;
    let height = TOP + rows.len() as u32 * ROW_H + 10;
    let mut out = format!(
        "<svg class=\"gantt\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"timeline\">"
    );
    out.push_str(&format!(
        "<text class=\"axis\" x=\"{LABEL_W}\" y=\"14\">{}</text><text class=\"axis\" x=\"{}\" y=\"14\" text-anchor=\"end\">+{}</text>",
        esc(&iso(start)),
        LABEL_W + PLOT_W,
        esc(&length(end.0 - start.0))
    ));
    for (r, step) in rows.iter().enumerate() {
        let y = TOP + r as u32 * ROW_H;
        let label = crate::tasks::render::step_name(wf, *step)
            .map_or(format!("step {step}"), |n| format!("{step} {n}"));
        out.push_str(&format!(
            "<text class=\"row\" x=\"4\" y=\"{}\">{}</text><line class=\"lane\" x1=\"{LABEL_W}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
            y + 16,
            esc(&label),
            y + ROW_H - 2,
            LABEL_W + PLOT_W,
            y + ROW_H - 2
        ));
        for span in spans.iter().filter(|s| s.step == *step) {
            let first = span.entries.first().map_or(start, |e| e.at);
            let (x1, x2) = (x_of(first), x_of(span.end).max(x_of(first) + 3.0));
            let last = span.entries.last().map_or("running", |e| class(e));
            if span.attempt > 0 {
                out.push_str(&format!(
                    "<g class=\"attempt {last}\"><title>step {step} attempt {a}: {from} to {to}</title><rect x=\"{x1:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" rx=\"3\"/><text x=\"{:.1}\" y=\"{}\">#{a}</text></g>",
                    y + 4,
                    x2 - x1,
                    ROW_H - 10,
                    x1 + 3.0,
                    y + 16,
                    a = span.attempt,
                    from = esc(&iso(first)),
                    to = esc(&iso(span.end)),
                ));
            }
            for e in &span.entries {
                let who = e.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
                let why = e.note.as_deref().map(|n| format!(": {n}")).unwrap_or_default();
                out.push_str(&format!(
                    "<g class=\"tick {}\"><title>{}{}{}</title><circle cx=\"{:.1}\" cy=\"{}\" r=\"4\"/></g>",
                    class(e),
                    esc(&format!("{} at {}", e.what.as_str(), iso(e.at))),
                    esc(&who),
                    esc(&why),
                    x_of(e.at),
                    y + ROW_H / 2 - 1
                ));
            }
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::ProcessState;

    #[test]
    fn each_attempt_is_a_bar_and_each_entry_a_tick() {
        let task = crate::fixtures::task("o-1", ProcessState::Processing);
        let drawn = svg(&task, None, Timestamp(task.created_at.0 + 5_000));
        assert!(drawn.starts_with("<svg class=\"gantt\""), "{drawn}");
        assert_eq!(drawn.matches("<circle").count(), task.timeline.len(), "{drawn}");
        assert_eq!(
            [length(850), length(12_500), length(192_000), length(5_400_000 * 2)],
            ["850 ms", "12.5 s", "3.2 min", "3.0 h"]
        );
    }
}
