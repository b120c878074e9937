//! How tasks are printed: a table row and a JSON object per listed task, a record with
//! its timeline, and the command lines an operator can paste next.

use sas::domain::workflow::Stage;
use sas::domain::{
    Act, Action, Actor, Awaiting, Definitions, Entry, Happened, Origin, Outcome, Policy, StageRun, StepKind,
    TaskRecord, Timestamp, Trigger, Workflow,
};
use serde_json::{Value, json};

use crate::deployment::DeploymentArgs;

pub use crate::text::one_line;

/// ISO-8601, UTC, to the millisecond.
pub fn iso(t: Timestamp) -> String {
    crate::text::iso_ms(i64::try_from(t.0).unwrap_or(i64::MAX))
}

/// The workflow version the task runs, if the definitions hold it.
pub fn workflow_of<'a>(definitions: &'a Definitions, task: &TaskRecord) -> Option<&'a Workflow> {
    definitions.workflows.get_version(&task.workflow, task.workflow_version)
}

/// The name of step `step`, if known.
pub fn step_name(wf: Option<&Workflow>, step: u32) -> Option<String> {
    wf.and_then(|w| w.step(step)).map(|s| s.name.clone())
}

/// A listed task as one JSON object.
pub fn task_summary_json(task: &TaskRecord, wf: Option<&Workflow>) -> Value {
    let mut v = json!({
        "id": task.order_id.as_str(),
        "state": task.state().as_str(),
        "workflow": task.workflow,
        "version": task.workflow_version,
        "step": task.step,
        "step_name": step_name(wf, task.step),
        "failure_count": task.failure_count,
        "updated_at": iso(task.updated_at),
        "last_error": task.last_error,
    });
    if let Some(at) = task.wake_at() {
        v["wake_at"] = json!(iso(at));
    }
    if task.paused() {
        v["paused"] = json!(true);
    }
    if let Some(kind) = waits_for(task) {
        v["waits_for"] = json!(kind);
    }
    if let Some(q) = task.queued() {
        v["queued"] = json!({"agent": q.agent, "ticket": q.ticket, "since": iso(q.since)});
    }
    if let (Some("callback"), Some(cb)) = (waits_for(task), &task.callback()) {
        v["callback_attempt"] = json!(cb.attempt);
        v["callback_due"] = json!(iso(cb.due()));
    }
    if let Some(view) = stage_view(task, wf).filter(|v| v.going_forward(task)) {
        v["stage"] = json!({
            "name": view.name(),
            "branches": view.run.branches.len(),
            "succeeded": view.count(Outcome::Succeeded),
            "in_flight": view.run.branches.iter().filter(|b| b.in_flight()).count(),
        });
    }
    v
}

/// A parallel stage as a task's record shows it: the stage (when the workflow is known)
/// and its branches, as the record keeps them, or fresh before the stage's first claim.
pub struct StageView<'a> {
    pub stage: Option<&'a Stage>,
    pub run: StageRun,
    /// Whether the record keeps the branches (false: the task waits for the stage's
    /// first claim, and nothing of it ran yet).
    pub kept: bool,
}

impl StageView<'_> {
    /// The stage's name, or where it starts when the workflow is unknown.
    pub fn name(&self) -> String {
        self.stage.map_or_else(|| format!("at step {}", self.run.at), |s| s.name.clone())
    }
    fn count(&self, outcome: Outcome) -> usize {
        self.run.branches.iter().filter(|b| b.outcome == outcome).count()
    }
    /// The task is at the stage going forward (not undoing its branches).
    fn going_forward(&self, task: &TaskRecord) -> bool {
        task.action() == Action::Do && task.step == self.run.at
    }
    fn steps(&self) -> String {
        let last = self.run.at + self.run.branches.len().saturating_sub(1) as u32;
        format!("steps {}-{last}", self.run.at)
    }
}

/// The parallel stage of the task: the branches its record keeps (from the stage's first
/// claim until the task goes past it; in Error, and while undoing after a give-up there),
/// or the stage it waits to claim.
pub fn stage_view<'a>(task: &TaskRecord, wf: Option<&'a Workflow>) -> Option<StageView<'a>> {
    if let Some(run) = task.stage() {
        let stage = wf.and_then(|w| w.stage_at(run.at));
        return Some(StageView { stage, run: run.clone(), kept: true });
    }
    let fresh = task.action() == Action::Do && !task.state().is_terminal();
    let stage = wf.filter(|_| fresh).and_then(|w| w.stage_at(task.step))?;
    Some(StageView { stage: Some(stage), run: StageRun::new(stage), kept: false })
}

/// The stage's branches as `show` prints them: a line saying how far the stage is, then
/// a table of the branches side by side, one a row.
fn stage_lines(view: &StageView, forward: bool, wf: Option<&Workflow>, now: Timestamp) -> Vec<String> {
    let n = view.run.branches.len();
    let in_flight = view.run.branches.iter().filter(|b| b.in_flight()).count();
    let mut summary = format!(
        "{} ({}, {n} branches): {} succeeded",
        view.name(),
        view.steps(),
        view.count(Outcome::Succeeded)
    );
    if in_flight > 0 {
        summary.push_str(&format!(", {in_flight} in flight"));
    }
    if view.count(Outcome::Refused) > 0 {
        summary.push_str(&format!(", {} refused", view.count(Outcome::Refused)));
    }
    if !view.kept {
        summary.push_str("; not claimed yet: its claim dispatches every branch at once");
    }
    let mut rows = vec![[
        "BRANCH".to_owned(),
        "ATTEMPT".to_owned(),
        "DISPATCHES".to_owned(),
        "FAILURES".to_owned(),
        "OUTCOME".to_owned(),
        "COMPLETE BY".to_owned(),
    ]];
    for (step, b) in view.run.each() {
        let name = match step_name(wf, step) {
            Some(name) => format!("{step} {name}"),
            None => step.to_string(),
        };
        let outcome = match b.outcome {
            Outcome::Open if b.in_flight() => "in flight",
            Outcome::Open if b.dispatches == 0 => "not run",
            // Dispatched and unanswered: the stage's next claim sends it again; after a
            // give-up it may have taken effect, and is undone as such.
            Outcome::Open if forward => "to retry",
            // A read has nothing to undo, whatever became of it.
            Outcome::Open
                if wf.and_then(|w| w.step(step)).is_some_and(|s| s.kind() == StepKind::ReadOnly) =>
            {
                "unanswered"
            }
            Outcome::Open => "in doubt",
            Outcome::Succeeded => "succeeded",
            Outcome::Refused => "refused",
        };
        let complete_by = match b.complete_by {
            Some(t) if t <= now => format!("{} (passed)", iso(t)),
            Some(t) => iso(t),
            None => "-".to_owned(),
        };
        let attempt = if b.attempt == 0 { "-".to_owned() } else { b.attempt.to_string() };
        rows.push([
            name,
            attempt,
            b.dispatches.to_string(),
            b.failures.to_string(),
            outcome.to_owned(),
            complete_by,
        ]);
    }
    let mut lines = vec![summary];
    lines.extend(columns(&rows).into_iter().map(|l| format!("  {l}")));
    lines
}

/// Rows of cells as lines, each column padded to its widest cell, the last unpadded.
fn columns<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  "));
                }
            }
            line.trim_end().to_owned()
        })
        .collect()
}

/// The stage's branches as `show --json` gives them: each with its step and name, times
/// in ISO-8601.
pub fn stage_json(view: &StageView, wf: Option<&Workflow>) -> Value {
    let branches: Vec<Value> = view
        .run
        .each()
        .map(|(step, b)| {
            json!({
                "step": step,
                "step_name": step_name(wf, step),
                "attempt": b.attempt,
                "dispatches": b.dispatches,
                "failures": b.failures,
                "outcome": b.outcome,
                "in_flight": b.in_flight(),
                "complete_by": b.complete_by.map(iso),
            })
        })
        .collect();
    json!({
        "name": view.stage.map(|s| s.name.clone()),
        "at": view.run.at,
        "claimed": view.kept,
        "branches": branches,
    })
}

/// Where a timeline entry belongs at a parallel stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane<'a> {
    /// Not at a stage: a lone step's entry.
    Step,
    /// The stage as a whole: its submission, its claim, its retry, an operator's action
    /// on it. The mask has a bit for each branch the entry concerns (bit 0: the first):
    /// a claim dispatches, and a retry counts a lapse against, only the branches that have
    /// not succeeded, as far as the timeline shows.
    Stage(&'a Stage, u32),
    /// One branch's own: its success, its refusal, its give-up, its undoing; `usize` is
    /// its place among the stage's branches.
    Branch(&'a Stage, usize),
}

/// Each entry's lane. An entry names the step its cause is about: a branch's, or the
/// stage's first step for what concerns the whole stage (the task's submission, a forward
/// claim, a retry, an operator's action). Undoing (after an Undo, a cancel or an operator's
/// compensate, until a resubmit) every entry is one branch's, its first too.
pub fn lanes<'a>(timeline: &[Entry], wf: Option<&'a Workflow>) -> Vec<Lane<'a>> {
    let mut undoing = false;
    // The branches of the stage at hand that succeeded (a stage keeps them through a
    // retry and a resubmit; the task leaves the stage with its last one).
    let mut succeeded: u32 = 0;
    timeline
        .iter()
        .map(|e| {
            let trigger = match e.what {
                Happened::Moved(t) => Some(t),
                Happened::Submitted => None,
            };
            let lane = match wf.and_then(|w| w.stage_of(e.step)) {
                None => Lane::Step,
                Some(stage) => {
                    let all = (1u32 << stage.len) - 1;
                    // Submitted (no trigger) too: a workflow may begin with a stage.
                    let open = matches!(trigger, None | Some(Trigger::Claimed | Trigger::Retry));
                    let operator = trigger.is_some_and(Trigger::is_operator) || e.by.is_some();
                    if (open || operator) && !undoing && e.step == stage.start {
                        Lane::Stage(stage, if operator { all } else { all & !succeeded })
                    } else {
                        Lane::Branch(stage, (e.step - stage.start) as usize)
                    }
                }
            };
            match (trigger, lane) {
                (Some(Trigger::BranchDone), Lane::Branch(_, i)) => succeeded |= 1 << i,
                (Some(Trigger::Advanced | Trigger::Finished), _) => succeeded = 0,
                _ => {}
            }
            match trigger {
                Some(Trigger::Undo | Trigger::Cancel | Trigger::OperatorUndo) => undoing = true,
                Some(Trigger::Resubmit) => undoing = false,
                _ => {}
            }
            lane
        })
        .collect()
}

/// The lanes of a stage's branches, `*` in those of the `mask`, `|` in the others', so
/// concurrent branches read side by side.
fn gutter(stage: &Stage, mask: u32) -> String {
    (0..stage.len).map(|i| if mask & (1 << i) != 0 { "*" } else { "|" }).collect::<Vec<_>>().join(" ")
}

/// What a Waiting task waits for: `timer` (its wake time) or `callback` (the outside).
pub fn waits_for(task: &TaskRecord) -> Option<&'static str> {
    if task.state() != sas::domain::ProcessState::Waiting {
        return None;
    }
    match (task.wake_at(), &task.callback()) {
        (Some(_), _) => Some("timer"),
        (None, Some(_)) => Some("callback"),
        (None, None) => None,
    }
}

/// What a task waiting for a place in its agent's gate waits for, and how long it has
/// waited by `now`: `waiting for a place at payment (ticket 41, 3.2 s)`.
pub fn queued_line(task: &TaskRecord, now: Timestamp) -> Option<String> {
    let q = task.queued()?;
    let waited = now.millis_since(q.since) as f64 / 1_000.0;
    Some(format!("waiting for a place at {} (ticket {}, {waited:.1} s)", q.agent, q.ticket))
}

/// The state as a listing shows it: a waiting timer with its wake time, a waiting
/// callback with when its heartbeat or completion is due, a task waiting for a place in
/// its agent's gate with its ticket and how long it has waited.
fn state_cell(task: &TaskRecord, now: Timestamp) -> String {
    let state = match (task.wake_at(), waits_for(task), &task.callback()) {
        (Some(at), ..) => format!("{} until {}", task.state().as_str(), iso(at)),
        (None, Some("callback"), Some(cb)) => {
            format!("{} for callback, due {}", task.state().as_str(), iso(cb.due()))
        }
        _ => match queued_line(task, now) {
            Some(q) => format!("{}, {q}", task.state().as_str()),
            None => task.state().as_str().to_owned(),
        },
    };
    if task.paused() { format!("{state} (paused)") } else { state }
}

/// A length of time as people write it: `90s`, `15m`, `1h`, `1500 ms`.
pub fn span(ms: u64) -> String {
    match ms {
        0 => "0 ms".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}

/// A callback step's wait as `show` prints it, one field a line: what it waits for, and
/// when it started, times out, last heard and is next due. Never its digest.
fn callback_lines(
    task: &TaskRecord,
    cb: &Awaiting,
    wf: Option<&Workflow>,
    now: Timestamp,
) -> Vec<(&'static str, String)> {
    let state = task.state();
    let step = match step_name(wf, cb.step) {
        Some(name) => format!("step {} {name}", cb.step),
        None => format!("step {}", cb.step),
    };
    let mut out = vec![(
        "waits for",
        format!(
            "a callback on {step}, attempt {}: the token sas1.{}.{}.{}.… completes it",
            cb.attempt, task.order_id, cb.step, cb.attempt
        ),
    )];
    out.push((
        "started",
        match cb.started_at {
            Some(at) => format!("{} (the agent began the work; claimed {})", iso(at), iso(cb.since)),
            None if state == sas::domain::ProcessState::Processing => {
                format!("not yet: claimed {}, the agent has not answered", iso(cb.since))
            }
            None => format!("claimed {}", iso(cb.since)),
        },
    ));
    out.push(("times out at", iso(cb.timeout_at)));
    out.push((
        "heartbeat",
        match (cb.heartbeat_ms, cb.last_heartbeat) {
            (None, _) => "none asked for".to_owned(),
            (Some(ms), Some(last)) => format!("every {}, last {}", span(ms), iso(last)),
            (Some(ms), None) => format!("every {}, none yet", span(ms)),
        },
    ));
    let due = cb.due();
    let what = if cb.heartbeat_ms.is_some() && due < cb.timeout_at {
        "a heartbeat or the completion"
    } else {
        "the completion"
    };
    let passed = if due <= now { ", passed: the supervisor fails the attempt" } else { "" };
    out.push(("next due", format!("{} ({what}{passed})", iso(due))));
    out
}

/// A callback step's wait as `show --json` gives it: the record's `callback` with times
/// in ISO-8601, its step's name and when it is next due, without the token's digest.
pub fn callback_json(cb: &Awaiting, wf: Option<&Workflow>) -> Value {
    json!({
        "step": cb.step,
        "step_name": step_name(wf, cb.step),
        "attempt": cb.attempt,
        "since": iso(cb.since),
        "started_at": cb.started_at.map(iso),
        "timeout_at": iso(cb.timeout_at),
        "heartbeat_ms": cb.heartbeat_ms,
        "last_heartbeat": cb.last_heartbeat.map(iso),
        "due": iso(cb.due()),
    })
}

/// The header and rows of a listing's table, columns padded.
pub fn table(tasks: &[(&TaskRecord, Option<&Workflow>)]) -> String {
    table_at(tasks, super::list::now())
}

/// `table`, with waits for a place measured to `now`.
pub fn table_at(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    let mut rows = vec![[
        "ID".to_owned(),
        "STATE".to_owned(),
        "WORKFLOW".to_owned(),
        "STEP".to_owned(),
        "FAILURES".to_owned(),
        "UPDATED".to_owned(),
        "LAST ERROR".to_owned(),
    ]];
    for (task, wf) in tasks {
        let step = match (stage_view(task, *wf).filter(|v| v.going_forward(task)), step_name(*wf, task.step))
        {
            (Some(view), _) => format!(
                "{} {} (stage, {} of {} done)",
                task.step,
                view.name(),
                view.count(Outcome::Succeeded),
                view.run.branches.len()
            ),
            (None, Some(name)) => format!("{} {name}", task.step),
            (None, None) => task.step.to_string(),
        };
        rows.push([
            task.order_id.to_string(),
            state_cell(task, now),
            format!("{} v{}", task.workflow, task.workflow_version),
            step,
            task.failure_count.to_string(),
            iso(task.updated_at),
            task.last_error.as_deref().map_or_else(|| "-".to_owned(), |e| one_line(e, 80)),
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One timeline entry as a line: time, what, step, attempt, why and who. In its lane at a
/// parallel stage (`lanes`): the stage's own entries name the stage; a branch's name its
/// step after the lanes' gutter, without the attempt (the entry keeps the task's newest
/// attempt, not the branch's: the stage's table has each branch's).
pub fn entry_line(entry: &Entry, wf: Option<&Workflow>, lane: Lane) -> String {
    let step = match step_name(wf, entry.step) {
        Some(name) => format!("step {} {name}", entry.step),
        None => format!("step {}", entry.step),
    };
    let subject = match lane {
        Lane::Step => format!("{step}  attempt {}", entry.attempt),
        Lane::Stage(stage, mask) => format!(
            "{}  stage {} (steps {}-{})  attempt {}",
            gutter(stage, mask),
            stage.name,
            stage.start,
            stage.end() - 1,
            entry.attempt
        ),
        Lane::Branch(stage, i) => format!("{}  {step}", gutter(stage, 1 << i)),
    };
    let mut line = format!("{}  {:<12}  {subject}", iso(entry.at), entry.what.as_str());
    match (&entry.note, flow_note(entry, wf)) {
        (Some(note), _) => line.push_str(&format!("  {}", one_line(note, 160))),
        (None, Some(flow)) => line.push_str(&format!("  {flow}")),
        (None, None) => {}
    }
    if let Some(by) = &entry.by {
        line.push_str(&format!("  by {by}"));
    }
    line
}

/// What a flow-control entry meant, when it has no note of its own: a `Queued` entry
/// (the step's agent had no room, or the supervisor asked its gate again) and a
/// `Throttled` one (the remote said it had too many requests).
fn flow_note(entry: &Entry, wf: Option<&Workflow>) -> Option<String> {
    match entry.what {
        Happened::Moved(Trigger::Queued) => Some(match wf.and_then(|w| w.step(entry.step)) {
            Some(step) => format!("waiting for a place at {} (its limits)", step.agent),
            None => "waiting for a place at the step's agent (its limits)".to_owned(),
        }),
        Happened::Moved(Trigger::Throttled) => {
            Some("the remote asked to wait (429 or 503 with Retry-After); no failure counted".to_owned())
        }
        _ => None,
    }
}

/// An entry as JSON; at a parallel stage also the stage's name and, for a branch's own
/// entry, the branch's (null for the stage's own, which has the `branches` it concerns).
pub fn entry_json(entry: &Entry, wf: Option<&Workflow>, lane: Lane) -> Value {
    let mut v = json!({
        "at": iso(entry.at),
        "what": entry.what.as_str(),
        "step": entry.step,
        "step_name": step_name(wf, entry.step),
        "attempt": entry.attempt,
        "note": entry.note,
        "by": entry.by,
    });
    match lane {
        Lane::Step => {}
        Lane::Stage(stage, mask) => {
            v["stage"] = json!(stage.name);
            v["branch"] = Value::Null;
            let of: Vec<Option<String>> = stage
                .branches()
                .filter(|s| mask & (1 << (s - stage.start)) != 0)
                .map(|s| step_name(wf, s))
                .collect();
            v["branches"] = json!(of);
        }
        Lane::Branch(stage, _) => {
            v["stage"] = json!(stage.name);
            v["branch"] = json!(step_name(wf, entry.step));
        }
    }
    v
}

/// `value` as a shell word: as it is when it is plain, else single-quoted.
pub fn shell_word(value: &str) -> String {
    let plain =
        !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
    if plain { value.to_owned() } else { format!("'{}'", value.replace('\'', r"'\''")) }
}

/// The deployment flags as given, to repeat in a suggested command (the environment's
/// SAS_STACK / SAS_PREFIX need no repeating: they still apply).
pub fn deployment_flags(d: &DeploymentArgs, workflows: Option<&std::path::Path>) -> String {
    let mut out = String::new();
    let mut add = |flag: &str, value: Option<&str>| {
        if let Some(v) = value {
            out.push_str(&format!(" --{flag} {}", shell_word(v)));
        }
    };
    add("stack", d.stack.as_deref());
    add("prefix", d.prefix.as_deref());
    add("table", d.table.as_deref());
    add("orders-queue", d.orders_queue.as_deref());
    add("scheduler-queue", d.scheduler_queue.as_deref());
    add("agent-queue", d.agent_queue.as_deref());
    add("alert-topic", d.alert_topic.as_deref());
    add("endpoint-url", d.endpoint_url.as_deref());
    add("workflows", workflows.and_then(|p| p.to_str()));
    out
}

/// The actions that apply to the task as it is (asked of the same decisions the actions
/// make), each as a command line to paste; without its workflow, by state alone.
pub fn next_commands(
    task: &TaskRecord,
    wf: Option<&Workflow>,
    policy: &Policy,
    now: Timestamp,
    flags: &str,
) -> Vec<String> {
    let id = task.order_id.as_str();
    let acts = [Act::Resubmit { from_step: None }, Act::Compensate, Act::Cancel, Act::Pause, Act::Resume];
    let applies = |act: Act| match wf {
        Some(wf) => task
            .act(act, Actor { by: "-", why: "-", seen: None, origin: Origin::Operator }, now, wf, policy)
            .is_ok(),
        None => match act {
            Act::Resubmit { .. } | Act::Compensate => task.state() == sas::domain::ProcessState::Error,
            Act::Cancel => {
                matches!(
                    task.state(),
                    sas::domain::ProcessState::Pending
                        | sas::domain::ProcessState::Processing
                        | sas::domain::ProcessState::Waiting
                )
            }
            Act::Pause => !task.state().is_terminal() && !task.paused(),
            Act::Resume => task.paused(),
        },
    };
    let mut next: Vec<String> = acts
        .into_iter()
        .filter(|a| applies(*a))
        .map(|a| format!("sasctl tasks {} {id} --reason TEXT{flags}", a.as_str()))
        .collect();
    // A callback step's word, for whoever holds its token (the record keeps only its digest).
    if task.callback().is_some()
        && matches!(task.state(), sas::domain::ProcessState::Processing | sas::domain::ProcessState::Waiting)
    {
        next.push(format!("sasctl tasks complete TOKEN --output JSON{flags}"));
        next.push(format!("sasctl tasks fail TOKEN --reason TEXT{flags}"));
        next.push(format!("sasctl tasks heartbeat TOKEN{flags}"));
    }
    next
}

/// The record as lines of text, its timeline last.
pub fn show_text(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp, next: &[String]) -> String {
    let mut lines = Vec::new();
    let version = format!("{} v{}", task.workflow, task.workflow_version);
    lines.push(format!("task {}: {} (workflow {version})", task.order_id, task.state().as_str()));
    let mut field = |name: &str, value: String| lines.push(format!("  {name:<14}{value}"));
    let stage = stage_view(task, wf);
    match stage.as_ref().filter(|v| v.going_forward(task)) {
        Some(view) => {
            field(
                "step",
                format!(
                    "{} {}, a parallel stage of {} ({} at once), claim {} of this stage, attempt {} in all",
                    task.step,
                    view.name(),
                    view.steps(),
                    view.run.branches.len(),
                    task.step_attempts,
                    task.attempt
                ),
            );
            field(
                "failures",
                format!("{} in all; each branch's own below (its budget is its step's)", task.failure_count),
            );
        }
        None => {
            let step = match step_name(wf, task.step) {
                Some(name) => format!("{} {name}", task.step),
                None => format!("{} (its name: pass --workflows FILE with workflow {version})", task.step),
            };
            field(
                "step",
                format!("{step}, attempt {} of this step, {} in all", task.step_attempts, task.attempt),
            );
            field(
                "failures",
                format!(
                    "{} in all, {} of this step in this direction",
                    task.failure_count, task.step_failures
                ),
            );
        }
    }
    match (task.locked_by(), task.complete_by()) {
        (Some(lease), Some(by)) => field("lease", format!("{lease}, complete by {}", iso(by))),
        _ => field("lease", "none".to_owned()),
    }
    field(
        "deadline",
        match task.deadline() {
            Some(d) if d <= now => format!("{} (passed: the supervisor recovers it)", iso(d)),
            Some(d) => iso(d),
            None => "none (ended)".to_owned(),
        },
    );
    if let Some(w) = task.wake_at() {
        field("wakes at", format!("{} (a timer step: nothing runs until then)", iso(w)));
    }
    if let (Some(q), Some(line)) = (&task.queued(), queued_line(task, now)) {
        field("queued", format!("{line}, since {}: the agent has no room; no failure counted", iso(q.since)));
    }
    if let Some(cb) = task.callback() {
        for (name, value) in callback_lines(task, cb, wf, now) {
            field(name, value);
        }
    }
    if let Some(view) = &stage {
        let forward = view.going_forward(task) && !task.state().is_terminal();
        let mut stage_lines = stage_lines(view, forward, wf, now).into_iter();
        if let Some(first) = stage_lines.next() {
            field("stage", first);
        }
        for line in stage_lines {
            field("", line);
        }
    }
    if task.paused() {
        let held = if task.parked() {
            "it waits for a resume, off the supervisor's sweep"
        } else {
            "what runs or waits now goes on; nothing new is dispatched"
        };
        field("paused", format!("yes: {held} (sasctl tasks resume)"));
    }
    if let Some(h) = task.hold_until() {
        let why = if task.stage().is_some() {
            "branches of the stage still out may run until then: the undo waits"
        } else {
            "a cancelled attempt may still run until then"
        };
        field("hold until", format!("{} ({why})", iso(h)));
    }
    if let Some(r) = task.redo_until {
        field(
            "redo until",
            format!("step {r} (resubmitted from an earlier step: nothing is undone before it)"),
        );
    }
    let outputs: Vec<&str> = task.outputs.keys().map(String::as_str).collect();
    field("outputs", if outputs.is_empty() { "none".to_owned() } else { outputs.join(", ") });
    field("last error", task.last_error.as_deref().map_or_else(|| "none".to_owned(), |e| one_line(e, 400)));
    field("reply_to", task.reply_to.clone().unwrap_or_else(|| "none".to_owned()));
    field("created", iso(task.created_at));
    field("updated", format!("{} (revision {})", iso(task.updated_at), task.revision));
    let dropped = if task.timeline_dropped > 0 {
        format!(" ({} older entries not kept)", task.timeline_dropped)
    } else {
        String::new()
    };
    lines.push(format!("timeline, oldest first{dropped}:"));
    for (entry, lane) in task.timeline.iter().zip(lanes(&task.timeline, wf)) {
        lines.push(format!("  {}", entry_line(entry, wf, lane)));
    }
    if next.is_empty() {
        lines.push("next: nothing to do by hand".to_owned());
    } else {
        lines.push("next:".to_owned());
        lines.extend(next.iter().map(|c| format!("  {c}")));
    }
    lines.join("\n") + "\n"
}

/// The record as one JSON object: its fields (times in ISO-8601, the outputs as an object
/// of each step's output by step name), the timeline's entries as objects, and the
/// commands that apply.
pub fn show_json(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp, next: &[String]) -> Value {
    let mut v = serde_json::to_value(task).unwrap_or_else(|_| json!({}));
    let time = |t: Option<Timestamp>| t.map(iso);
    v["id"] = json!(task.order_id.as_str());
    v["step_name"] = json!(step_name(wf, task.step));
    v["created_at"] = json!(iso(task.created_at));
    v["updated_at"] = json!(iso(task.updated_at));
    v["deadline"] = json!(time(task.deadline()));
    v["deadline_passed"] = json!(task.deadline().is_some_and(|d| d <= now));
    v["complete_by"] = json!(time(task.complete_by()));
    v["hold_until"] = json!(time(task.hold_until()));
    if task.wake_at().is_some() {
        v["wake_at"] = json!(time(task.wake_at()));
    }
    if let Some(kind) = waits_for(task) {
        v["waits_for"] = json!(kind);
    }
    match &task.queued() {
        Some(q) => {
            v["queued"] = json!({
                "agent": q.agent,
                "ticket": q.ticket,
                "since": iso(q.since),
                "waited_ms": now.millis_since(q.since),
            });
        }
        None => {
            if let Some(map) = v.as_object_mut() {
                map.remove("queued");
            }
        }
    }
    // Curated as the rest: times in ISO-8601, and no digest (harmless, but nobody's to use).
    if let Some(cb) = task.callback() {
        v["callback"] = callback_json(cb, wf);
    }
    v["redo_until"] = json!(task.redo_until);
    // A stage's branches, curated as the rest (the record's own `stage` keeps bare times).
    match stage_view(task, wf) {
        Some(view) => v["stage"] = stage_json(&view, wf),
        None => {
            if let Some(map) = v.as_object_mut() {
                map.remove("stage");
            }
        }
    }
    // Each output with its value, by step name: what a refund needs of its charge.
    v["outputs"] = Value::Object(task.outputs.iter().map(|(step, o)| (step.clone(), o.to_value())).collect());
    let lanes = lanes(&task.timeline, wf);
    v["timeline"] =
        Value::Array(task.timeline.iter().zip(lanes).map(|(e, lane)| entry_json(e, wf, lane)).collect());
    v["timeline_dropped"] = json!(task.timeline_dropped);
    v["next"] = json!(next);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{Happened, Phase, ProcessState, Step, Trigger};

    fn task(state: ProcessState) -> TaskRecord {
        crate::fixtures::task("o-1", state)
    }

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("reserve", "inv", "release"), Step::pivot("ship", "ship")])
    }

    #[test]
    fn times_are_iso_8601_utc() {
        assert_eq!(iso(Timestamp(1_700_000_000_123)), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso(Timestamp(0)), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn timeline_entries_say_when_what_step_attempt_why_and_who() {
        let e = Entry {
            at: Timestamp(1_700_000_000_000),
            what: Happened::Moved(Trigger::Resubmit),
            step: 1,
            attempt: 3,
            note: Some("remote\nfixed".into()),
            by: Some("arn:aws:sts::1:user/me".into()),
        };
        assert_eq!(
            entry_line(&e, Some(&wf()), Lane::Step),
            "2023-11-14T22:13:20.000Z  Resubmit      step 1 ship  attempt 3  remote fixed  by arn:aws:sts::1:user/me"
        );
        assert_eq!(
            entry_json(&e, None, Lane::Step),
            json!({"at": "2023-11-14T22:13:20.000Z", "what": "Resubmit", "step": 1, "step_name": null,
                   "attempt": 3, "note": "remote\nfixed", "by": "arn:aws:sts::1:user/me"})
        );
    }

    #[test]
    fn the_next_commands_are_those_the_decisions_allow() {
        let flags = deployment_flags(
            &DeploymentArgs {
                prefix: Some("sas".into()),
                endpoint_url: Some("http://127.0.0.1:5000".into()),
                ..Default::default()
            },
            Some(std::path::Path::new("my flows.json")),
        );
        assert_eq!(flags, " --prefix sas --endpoint-url http://127.0.0.1:5000 --workflows 'my flows.json'");
        let now = Timestamp(1_700_000_001_000);
        let policy = Policy::default();
        let mut failed = task(ProcessState::Error);
        // Failed at its first step, which was refused: resubmit applies, and so does
        // compensate only if something may have taken effect.
        let next = next_commands(&failed, Some(&wf()), &policy, now, &flags);
        assert_eq!(
            next,
            [
                "sasctl tasks resubmit o-1 --reason TEXT --prefix sas --endpoint-url http://127.0.0.1:5000 --workflows 'my flows.json'"
            ]
        );
        failed.step = 1;
        let next = next_commands(&failed, Some(&wf()), &policy, now, "");
        assert_eq!(
            next,
            ["sasctl tasks resubmit o-1 --reason TEXT", "sasctl tasks compensate o-1 --reason TEXT"]
        );
        let pending = task(ProcessState::Pending);
        assert_eq!(
            next_commands(&pending, Some(&wf()), &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        let paused = task(ProcessState::Pending);
        let due = paused.deadline().unwrap();
        let paused =
            paused.with_phase(Phase::Pending { due, wait: Default::default(), stage: None, paused: true });
        assert_eq!(
            next_commands(&paused, Some(&wf()), &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks resume o-1 --reason TEXT"]
        );
        assert_eq!(
            next_commands(&pending, None, &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        let done = task(ProcessState::Processed);
        assert!(next_commands(&done, Some(&wf()), &policy, now, "").is_empty());
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }

    #[test]
    fn show_says_how_many_entries_were_let_go_and_what_is_next() {
        let mut t = task(ProcessState::Error);
        t.timeline_dropped = 3;
        t.last_error = Some("do-it: 422\nno such customer".into());
        let text =
            show_text(&t, Some(&wf()), Timestamp(1_700_000_001_000), &["sasctl tasks resubmit o-1".into()]);
        assert!(text.starts_with("task o-1: Error (workflow w v1)\n"), "{text}");
        assert!(text.contains("  step          0 reserve, attempt 0 of this step, 0 in all\n"), "{text}");
        assert!(text.contains("  deadline      none (ended)\n"), "{text}");
        assert!(text.contains("  last error    do-it: 422 no such customer\n"), "{text}");
        assert!(text.contains("timeline, oldest first (3 older entries not kept):\n"), "{text}");
        assert!(
            text.contains("  2023-11-14T22:13:20.000Z  Submitted     step 0 reserve  attempt 0\n"),
            "{text}"
        );
        assert!(text.ends_with("next:\n  sasctl tasks resubmit o-1\n"), "{text}");
        let v = show_json(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[]);
        assert_eq!(v["timeline"][0]["what"], "Submitted");
        assert_eq!(v["timeline_dropped"], 3);
        assert_eq!(v["deadline"], Value::Null);
        assert_eq!(v["updated_at"], "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn show_json_gives_each_output_with_its_value() {
        let mut t = task(ProcessState::Error);
        let charge = json!({"charge_id": "ch_1", "amount": 12});
        t.outputs.insert("charge".into(), sas::domain::StepOutput::from_value(&charge).unwrap());
        let v = show_json(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[]);
        assert_eq!(v["outputs"], json!({"charge": {"charge_id": "ch_1", "amount": 12}}));
        assert!(
            show_text(&t, Some(&wf()), Timestamp(1_700_000_001_000), &[])
                .contains("  outputs       charge\n")
        );
    }
}

#[cfg(test)]
mod waiting_tests {
    use super::*;
    use sas::domain::{Phase, Policy, ProcessState, WaitingFor};

    fn task(state: ProcessState) -> TaskRecord {
        crate::fixtures::task("o-1", state)
    }

    /// A timer's task shows when it wakes, in the listing, `show` and their JSON, and can
    /// be cancelled.
    #[test]
    fn a_waiting_task_shows_its_wake_time() {
        let t = task(ProcessState::Waiting)
            .with_phase(Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(1_700_000_060_000) }));
        let listed = table(&[(&t, None)]);
        assert!(listed.contains("Waiting until 2023-11-14T22:14:20.000Z"), "{listed}");
        assert_eq!(task_summary_json(&t, None)["wake_at"], "2023-11-14T22:14:20.000Z");
        let now = Timestamp(1_700_000_001_000);
        let text = show_text(&t, None, now, &[]);
        assert!(text.contains("  wakes at      2023-11-14T22:14:20.000Z (a timer step"), "{text}");
        assert_eq!(show_json(&t, None, now, &[])["wake_at"], "2023-11-14T22:14:20.000Z");
        assert_eq!(
            next_commands(&t, None, &Policy::default(), now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        // Any other task has no such field.
        let pending = task(ProcessState::Pending);
        assert!(task_summary_json(&pending, None).get("wake_at").is_none());
        assert!(show_json(&pending, None, now, &[]).get("wake_at").is_none());
    }
}

#[cfg(test)]
mod callback_tests {
    use super::*;
    use sas::domain::{Lease, LeaseToken, Phase, Policy, ProcessState, Step, WaitingFor};

    fn wf() -> Workflow {
        let mut approve = Step::compensable("approve", "approvals", "withdraw");
        approve.callback =
            Some(sas::domain::Callback { timeout_ms: 86_400_000, heartbeat_ms: Some(3_600_000) });
        Workflow::new("w", vec![Step::compensable("charge", "payment", "refund"), approve])
    }

    /// A task waiting at a callback step: started, one heartbeat heard.
    fn waiting() -> TaskRecord {
        let mut t = crate::fixtures::task("o-1", ProcessState::Waiting);
        t.step = 1;
        t.attempt = 2;
        let cb = Awaiting {
            step: 1,
            attempt: 2,
            digest: "d1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gest0000".into(),
            timeout_at: Timestamp(1_700_086_400_000),
            heartbeat_ms: Some(3_600_000),
            last_heartbeat: Some(Timestamp(1_700_000_600_000)),
            started_at: Some(Timestamp(1_700_000_000_500)),
            since: Timestamp(1_700_000_000_000),
        };
        t.with_phase(Phase::waiting(WaitingFor::Callback(cb)))
    }

    #[test]
    fn show_says_what_a_callback_waits_for_and_when_it_is_due_never_its_digest() {
        let t = waiting();
        let now = Timestamp(1_700_000_700_000);
        let text = show_text(&t, Some(&wf()), now, &[]);
        for want in [
            "  waits for     a callback on step 1 approve, attempt 2: the token sas1.o-1.1.2.… completes it\n",
            "  started       2023-11-14T22:13:20.500Z (the agent began the work; claimed 2023-11-14T22:13:20.000Z)\n",
            "  times out at  2023-11-15T22:13:20.000Z\n",
            "  heartbeat     every 1h, last 2023-11-14T22:23:20.000Z\n",
            "  next due      2023-11-14T23:23:20.000Z (a heartbeat or the completion)\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let v = show_json(&t, Some(&wf()), now, &[]);
        assert_eq!(v["waits_for"], "callback");
        assert_eq!(
            v["callback"],
            json!({"step": 1, "step_name": "approve", "attempt": 2, "since": "2023-11-14T22:13:20.000Z",
                   "started_at": "2023-11-14T22:13:20.500Z", "timeout_at": "2023-11-15T22:13:20.000Z",
                   "heartbeat_ms": 3_600_000, "last_heartbeat": "2023-11-14T22:23:20.000Z",
                   "due": "2023-11-14T23:23:20.000Z"})
        );
        for shown in [text, v.to_string()] {
            assert!(!shown.contains("d1gest"), "the digest is shown: {shown}");
        }
        // Past its due, the supervisor fails the attempt.
        let late = show_text(&t, Some(&wf()), Timestamp(1_700_005_000_000), &[]);
        assert!(
            late.contains("(a heartbeat or the completion, passed: the supervisor fails the attempt)"),
            "{late}"
        );
    }

    #[test]
    fn a_callback_claimed_but_not_started_says_so() {
        let t = waiting();
        let mut cb = t.callback().unwrap().clone();
        cb.started_at = None;
        cb.last_heartbeat = None;
        cb.heartbeat_ms = None;
        let lease = Lease { token: LeaseToken(uuid::Uuid::from_u128(1)), complete_by: cb.timeout_at };
        let t = t.with_phase(Phase::Processing {
            due: cb.due(),
            lease,
            callback: Some(cb),
            stage: None,
            paused: false,
        });
        let text = show_text(&t, None, Timestamp(1_700_000_001_000), &[]);
        assert!(
            text.contains(
                "  waits for     a callback on step 1, attempt 2: the token sas1.o-1.1.2.… completes it\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  started       not yet: claimed 2023-11-14T22:13:20.000Z, the agent has not answered\n"
            ),
            "{text}"
        );
        assert!(text.contains("  heartbeat     none asked for\n"), "{text}");
        assert!(text.contains("  next due      2023-11-15T22:13:20.000Z (the completion)\n"), "{text}");
        // Not Waiting yet: the listing has nothing to say of it.
        assert!(show_json(&t, None, Timestamp(0), &[]).get("waits_for").is_none());
        assert!(task_summary_json(&t, None).get("waits_for").is_none());
    }

    #[test]
    fn the_listing_says_what_each_waiting_task_waits_for() {
        let cb = waiting();
        let timer = crate::fixtures::task("o-2", ProcessState::Waiting)
            .with_phase(Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(1_700_000_060_000) }));
        let listed = table(&[(&cb, Some(&wf())), (&timer, None)]);
        assert!(listed.contains("Waiting for callback, due 2023-11-14T23:23:20.000Z"), "{listed}");
        assert!(listed.contains("Waiting until 2023-11-14T22:14:20.000Z"), "{listed}");
        let v = task_summary_json(&cb, Some(&wf()));
        assert_eq!((v["waits_for"].as_str(), v["callback_attempt"].as_u64()), (Some("callback"), Some(2)));
        assert_eq!(v["callback_due"], "2023-11-14T23:23:20.000Z");
        assert_eq!(task_summary_json(&timer, None)["waits_for"], "timer");
        // Whoever holds the token is shown how to use it.
        let next =
            next_commands(&cb, Some(&wf()), &Policy::default(), Timestamp(1_700_000_700_000), " --prefix p");
        assert_eq!(
            next,
            [
                "sasctl tasks cancel o-1 --reason TEXT --prefix p",
                "sasctl tasks pause o-1 --reason TEXT --prefix p",
                "sasctl tasks complete TOKEN --output JSON --prefix p",
                "sasctl tasks fail TOKEN --reason TEXT --prefix p",
                "sasctl tasks heartbeat TOKEN --prefix p"
            ]
        );
        assert_eq!(span(1_500), "1500 ms");
        assert_eq!(span(90_000), "90s");
        assert_eq!(span(604_800_000), "168h");
    }
}

#[cfg(test)]
mod stage_tests {
    use super::*;
    use sas::domain::workflow::{Entry as Text, StageText};
    use sas::domain::{AgentReply, LeaseToken, ProcessState, ReplyOutcome, Step};

    const T0: Timestamp = Timestamp(1_700_000_000_000);

    /// charge, then reserve-all (reserve-east, reserve-west, screen) at once, then ship.
    fn wf() -> Workflow {
        Workflow::of_entries(
            "w",
            vec![
                Text::Step(Step::compensable("charge", "payment", "refund")),
                Text::Parallel {
                    parallel: StageText {
                        name: "reserve-all".into(),
                        steps: vec![
                            Step::compensable("reserve-east", "warehouse-east", "release-east"),
                            Step::compensable("reserve-west", "warehouse-west", "release-west"),
                            Step::read_only("screen", "fraud"),
                        ],
                    },
                },
                Text::Step(Step::pivot("ship", "shipping")),
            ],
        )
    }

    fn lease(n: u128) -> LeaseToken {
        LeaseToken(uuid::Uuid::from_u128(n))
    }

    fn reply(t: &TaskRecord, step: u32, outcome: ReplyOutcome, at: u64) -> TaskRecord {
        let (attempt, _) = t.dispatch_of(step);
        let r = AgentReply {
            order_id: t.order_id.clone(),
            step,
            action: t.action(),
            attempt,
            lease: t.locked_by().expect("a live lease"),
            outcome,
        };
        t.apply_reply(&r, T0.plus_ms(at), &wf(), &Policy::default()).expect("applied").next
    }

    fn ok() -> ReplyOutcome {
        ReplyOutcome::Succeeded { output: None }
    }

    /// Charged, then the stage claimed at T0 + 20 ms: every branch in flight.
    fn at_stage() -> TaskRecord {
        let (wf, policy) = (wf(), Policy::default());
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        let t = t.claim(lease(1), T0.plus_ms(10), &wf, &policy).unwrap().next;
        let t = reply(&t, 0, ok(), 15);
        assert_eq!((t.state(), t.step), (ProcessState::Pending, 1));
        t.claim(lease(2), T0.plus_ms(20), &wf, &policy).unwrap().next
    }

    /// reserve-west and screen answered; reserve-east still out.
    fn two_done() -> TaskRecord {
        let t = reply(&at_stage(), 2, ok(), 30);
        reply(&t, 3, ok(), 40)
    }

    #[test]
    fn show_sets_a_stages_branches_side_by_side() {
        let t = two_done();
        assert_eq!((t.state(), t.step), (ProcessState::Processing, 1));
        let now = T0.plus_ms(50);
        let text = show_text(&t, Some(&wf()), now, &[]);
        for want in [
            "  step          1 reserve-all, a parallel stage of steps 1-3 (3 at once), claim 1 of this stage, attempt 4 in all\n",
            "  failures      0 in all; each branch's own below (its budget is its step's)\n",
            "  stage         reserve-all (steps 1-3, 3 branches): 2 succeeded, 1 in flight\n",
            "                  BRANCH          ATTEMPT  DISPATCHES  FAILURES  OUTCOME    COMPLETE BY\n",
            "                  1 reserve-east  2        1           0         in flight  2023-11-14T22:13:50.020Z\n",
            "                  2 reserve-west  3        1           0         succeeded  -\n",
            "                  3 screen        4        1           0         succeeded  -\n",
            // The claim is the stage's; each success sits in its branch's lane.
            "  2023-11-14T22:13:20.020Z  Claimed       * * *  stage reserve-all (steps 1-3)  attempt 4\n",
            "  2023-11-14T22:13:20.030Z  BranchDone    | * |  step 2 reserve-west\n",
            "  2023-11-14T22:13:20.040Z  BranchDone    | | *  step 3 screen\n",
            // Before the stage, a lone step's lines as ever.
            "  2023-11-14T22:13:20.015Z  Advanced      step 0 charge  attempt 1\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Past its complete-by, the branch says so.
        let late = show_text(&t, Some(&wf()), T0.plus_ms(60_000), &[]);
        assert!(late.contains("in flight  2023-11-14T22:13:50.020Z (passed)\n"), "{late}");
    }

    #[test]
    fn show_json_gives_the_stage_and_each_entrys_branch() {
        let t = two_done();
        let v = show_json(&t, Some(&wf()), T0.plus_ms(50), &[]);
        assert_eq!(v["stage"]["name"], "reserve-all");
        assert_eq!(v["stage"]["at"], 1);
        assert_eq!(v["stage"]["claimed"], true);
        assert_eq!(
            v["stage"]["branches"][0],
            json!({"step": 1, "step_name": "reserve-east", "attempt": 2, "dispatches": 1, "failures": 0,
                   "outcome": "open", "in_flight": true, "complete_by": "2023-11-14T22:13:50.020Z"})
        );
        assert_eq!(v["stage"]["branches"][1]["outcome"], "succeeded");
        assert_eq!(v["stage"]["branches"][1]["complete_by"], Value::Null);
        let timeline = v["timeline"].as_array().unwrap();
        let claim = timeline.iter().find(|e| e["what"] == "Claimed" && e["step"] == 1).unwrap();
        assert_eq!((&claim["stage"], &claim["branch"]), (&json!("reserve-all"), &Value::Null));
        assert_eq!(claim["branches"], json!(["reserve-east", "reserve-west", "screen"]));
        let west = timeline.iter().find(|e| e["what"] == "BranchDone" && e["step"] == 2).unwrap();
        assert_eq!((&west["stage"], &west["branch"]), (&json!("reserve-all"), &json!("reserve-west")));
        // A lone step's entry has neither.
        assert!(timeline[0].get("stage").is_none() && timeline[0].get("branch").is_none());
        // Without the stage's workflow, the branches still show, by step.
        let bare = show_json(&t, None, T0.plus_ms(50), &[]);
        assert_eq!(
            (&bare["stage"]["name"], &bare["stage"]["branches"][2]["step"]),
            (&Value::Null, &json!(3))
        );
    }

    #[test]
    fn the_listing_names_the_stage_and_how_far_it_is() {
        let t = two_done();
        let listed = table(&[(&t, Some(&wf()))]);
        assert!(listed.contains("  1 reserve-all (stage, 2 of 3 done)  "), "{listed}");
        let v = task_summary_json(&t, Some(&wf()));
        assert_eq!(v["stage"], json!({"name": "reserve-all", "branches": 3, "succeeded": 2, "in_flight": 1}));
        // Waiting for the stage's first claim: named too, nothing run yet.
        let charged = {
            let t = crate::fixtures::task("o-2", ProcessState::Pending);
            let t = t.claim(lease(1), T0.plus_ms(10), &wf(), &Policy::default()).unwrap().next;
            reply(&t, 0, ok(), 15)
        };
        assert!(table(&[(&charged, Some(&wf()))]).contains("  1 reserve-all (stage, 0 of 3 done)  "));
        let text = show_text(&charged, Some(&wf()), T0.plus_ms(16), &[]);
        assert!(
            text.contains("0 succeeded; not claimed yet: its claim dispatches every branch at once\n"),
            "{text}"
        );
        assert!(text.contains("  1 reserve-east  -        0           0         not run  -\n"), "{text}");
        // A task at a lone step has no stage.
        let lone = crate::fixtures::task("o-3", ProcessState::Pending);
        assert!(task_summary_json(&lone, Some(&wf())).get("stage").is_none());
        assert!(show_json(&lone, Some(&wf()), T0, &[]).get("stage").is_none());
    }

    #[test]
    fn a_refused_branch_undoes_the_others_each_in_its_lane() {
        let refused = ReplyOutcome::Failed { reason: "422: no stock".into(), detail: None };
        let t = reply(&two_done(), 1, refused, 45);
        assert_eq!((t.state(), t.step), (ProcessState::Compensating, 2));
        let text = show_text(&t, Some(&wf()), T0.plus_ms(50), &[]);
        for want in [
            "  2023-11-14T22:13:20.045Z  Undo          * | |  step 1 reserve-east  422: no stock\n",
            "  stage         reserve-all (steps 1-3, 3 branches): 2 succeeded, 1 refused\n",
            "                  1 reserve-east  2        1           0         refused    -\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Refused while the others are still out: they may have taken effect, and the
        // undo waits for them.
        let early = reply(&at_stage(), 1, ReplyOutcome::Failed { reason: "422".into(), detail: None }, 25);
        let text_early = show_text(&early, Some(&wf()), T0.plus_ms(26), &[]);
        for want in [
            "                  2 reserve-west  3        1           0         in doubt    -\n",
            "                  3 screen        4        1           0         unanswered  -\n",
            "  hold until    2023-11-14T22:13:50.020Z (branches of the stage still out may run until then: the undo waits)\n",
        ] {
            assert!(text_early.contains(want), "missing {want:?} in\n{text_early}");
        }
        // Undoing, the step is the branch being undone; the listing names it as such.
        assert!(
            text.contains("  step          2 reserve-west, attempt 0 of this step, 4 in all\n"),
            "{text}"
        );
        assert!(table(&[(&t, Some(&wf()))]).contains("  2 reserve-west  "));
        // The undo's claim of reserve-west is its branch's, not the stage's.
        let policy = Policy::default();
        let undoing = t.claim(lease(3), T0.plus_ms(50), &wf(), &policy).unwrap().next;
        assert_eq!(
            (undoing.state(), undoing.step, undoing.action()),
            (ProcessState::Compensating, 2, Action::Undo)
        );
        let wf = wf();
        let lanes = lanes(&undoing.timeline, Some(&wf));
        assert_eq!(lanes.last(), Some(&Lane::Branch(&wf.stages[0], 1)));
    }

    #[test]
    fn a_stages_retry_is_the_stages_and_a_spent_branchs_give_up_its_own() {
        let (wf, policy) = (wf(), Policy::default());
        let t = reply(&at_stage(), 2, ok(), 30);
        let deadline = t.deadline().unwrap();
        let retried = t.lapse(deadline, &wf, &policy, 0).unwrap().next;
        assert_eq!(retried.state(), ProcessState::Pending);
        let text = show_text(&retried, Some(&wf), deadline, &[]);
        // reserve-west succeeded: the retry (and the claim after it) is the others'.
        assert!(text.contains("  Retry         * | *  stage reserve-all (steps 1-3)  attempt 4"), "{text}");
        assert!(
            text.contains("                  1 reserve-east  2        1           1         to retry   -\n"),
            "{text}"
        );
        let lanes_of = |t: &TaskRecord| lanes(&t.timeline, Some(&wf)).last().copied();
        assert_eq!(lanes_of(&retried), Some(Lane::Stage(&wf.stages[0], 0b101)));
        // Retried until reserve-east's budget is spent: the give-up names that branch.
        let mut t = retried;
        let gave_up = loop {
            let at = t.deadline().unwrap();
            let claimed = t.claim(lease(u128::from(t.attempt) + 10), at, &wf, &policy).unwrap().next;
            let d = claimed.lapse(claimed.deadline().unwrap(), &wf, &policy, 0).unwrap();
            if d.trigger != Trigger::Retry {
                break d.next;
            }
            t = d.next;
        };
        assert_eq!(gave_up.state(), ProcessState::Compensating);
        assert_eq!(lanes_of(&gave_up), Some(Lane::Branch(&wf.stages[0], 0)));
        let text = show_text(&gave_up, Some(&wf), gave_up.updated_at, &[]);
        assert!(
            text.contains("  Undo          * | |  step 1 reserve-east  failure threshold reached"),
            "{text}"
        );
    }

    /// A workflow may begin with its stage: the task's submission is the stage's entry,
    /// not its first branch's.
    #[test]
    fn a_workflow_that_begins_with_a_stage_is_submitted_to_the_stage() {
        let wf = Workflow::of_entries(
            "w",
            vec![Text::Parallel {
                parallel: StageText {
                    name: "both".into(),
                    steps: vec![Step::pivot("a", "a"), Step::pivot("b", "b")],
                },
            }],
        );
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        assert_eq!(lanes(&t.timeline, Some(&wf)), [Lane::Stage(&wf.stages[0], 0b11)]);
        let text = show_text(&t, Some(&wf), T0, &[]);
        assert!(text.contains("  Submitted     * *  stage both (steps 0-1)  attempt 0\n"), "{text}");
    }
}

#[cfg(test)]
mod flow_tests {
    use super::*;
    use sas::domain::{Happened, ProcessState, Step};

    const T0: u64 = 1_700_000_000_000;

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("charge", "payment", "refund")])
    }

    /// A task that found payment's gate full at T0 + 1 s and took ticket 41, through the
    /// domain's own decision (its record and timeline as the scheduler writes them).
    fn queued() -> TaskRecord {
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        t.queue("payment", 41, Timestamp(T0 + 1_000), &Policy::default()).expect("a Pending task queues").next
    }

    #[test]
    fn the_listing_says_which_gate_a_task_waits_at_its_ticket_and_for_how_long() {
        let t = queued();
        let listed = table_at(&[(&t, Some(&wf()))], Timestamp(T0 + 4_200));
        assert!(listed.contains("Pending, waiting for a place at payment (ticket 41, 3.2 s)"), "{listed}");
        let v = task_summary_json(&t, Some(&wf()));
        assert_eq!(
            v["queued"],
            json!({"agent": "payment", "ticket": 41, "since": "2023-11-14T22:13:21.000Z"})
        );
        // A task that does not wait says nothing of it.
        let plain = crate::fixtures::task("o-2", ProcessState::Pending);
        assert!(task_summary_json(&plain, None).get("queued").is_none());
        assert!(!table_at(&[(&plain, None)], Timestamp(T0)).contains("place"));
    }

    #[test]
    fn show_gives_the_wait_and_a_timeline_that_reads_queued_and_throttled() {
        let mut t = queued();
        t.timeline.push(Entry {
            at: Timestamp(T0 + 9_000),
            what: Happened::Moved(Trigger::Throttled),
            step: 0,
            attempt: 1,
            note: None,
            by: None,
        });
        let now = Timestamp(T0 + 2_500);
        let text = show_text(&t, Some(&wf()), now, &[]);
        assert!(
            text.contains(
                "  queued        waiting for a place at payment (ticket 41, 1.5 s), since 2023-11-14T22:13:21.000Z: \
                 the agent has no room; no failure counted\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "Queued        step 0 charge  attempt 0  waiting for a place at payment (its limits)\n"
            ),
            "{text}"
        );
        assert!(text.contains("Throttled     step 0 charge  attempt 1  the remote asked to wait"), "{text}");
        // Without the workflow, the entry still says what it was.
        assert!(show_text(&t, None, now, &[]).contains("waiting for a place at the step's agent"));
        let v = show_json(&t, Some(&wf()), now, &[]);
        assert_eq!(v["queued"]["waited_ms"], 1_500);
        assert_eq!(v["queued"]["ticket"], 41);
        assert_eq!(v["timeline"][1]["what"], "Queued");
        let ended = crate::fixtures::task("o-2", ProcessState::Processed);
        assert!(show_json(&ended, None, now, &[]).get("queued").is_none());
    }
}
