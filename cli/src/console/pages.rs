//! Each page's body, from what was read: HTML text, nothing read here (the callers pass
//! what they read and the time).

use sas::domain::{Definitions, TaskRecord, Timestamp, Workflow};
use serde_json::Value;

use super::html::{esc, query_value};
use crate::agents::render::{Seen, list_json};
use crate::tasks::StateArg;
use crate::tasks::render::{iso, show_text, span, task_summary_json};

/// The states the task list offers, and what each listing reads.
pub const STATES: [StateArg; 8] = [
    StateArg::Error,
    StateArg::Waiting,
    StateArg::Queued,
    StateArg::Processing,
    StateArg::Pending,
    StateArg::Compensating,
    StateArg::Stuck,
    StateArg::Paused,
];

/// What the listing of `state` reads, said on the page (as `sasctl tasks list --help`
/// says it).
pub fn reads(state: StateArg, narrowed: bool) -> String {
    match state {
        StateArg::Error if !narrowed => {
            "one Query of the sparse error index (it holds only tasks in Error), newest first: it reads only what it shows".into()
        }
        StateArg::Error => {
            "one Query of the sparse error index (only tasks in Error), up to 1000 to pick from, filtered here".into()
        }
        _ => format!(
            "a Query of the due index per shard (it holds exactly the live tasks) and one consistent read per live task (BatchGetItem, 100 a request), oldest deadline first, of at most 1000 live tasks; the {} ones picked from them",
            state.as_str()
        ),
    }
}

/// What the task list was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub state: StateArg,
    pub workflow: Option<String>,
    pub agent: Option<String>,
    pub order: Option<String>,
    pub limit: usize,
}

fn option(value: &str, label: &str, selected: bool) -> String {
    let sel = if selected { " selected" } else { "" };
    format!("<option value=\"{}\"{sel}>{}</option>", esc(value), esc(label))
}

/// The filter form and the tabs of the task list.
pub fn task_filters(asked: &Asked, definitions: &Definitions) -> String {
    let states: String = STATES.iter().map(|s| option(s.as_str(), s.as_str(), *s == asked.state)).collect();
    let mut workflows = option("", "any workflow", asked.workflow.is_none());
    for name in definitions.workflows.names() {
        workflows.push_str(&option(name, name, asked.workflow.as_deref() == Some(name)));
    }
    let mut agents = option("", "any agent", asked.agent.is_none());
    for name in definitions.agents.keys() {
        agents.push_str(&option(name, name, asked.agent.as_deref() == Some(name.as_str())));
    }
    let tabs: String = STATES
        .iter()
        .map(|s| {
            let class = if *s == asked.state { " class=\"current\"" } else { "" };
            format!("<a href=\"/tasks?state={0}\"{class}>{0}</a>", s.as_str())
        })
        .collect();
    format!(
        "<nav class=\"tabs\">{tabs}</nav>\
<form class=\"filters\" method=\"get\" action=\"/tasks\">\
<label>state <select name=\"state\">{states}</select></label>\
<label>workflow <select name=\"workflow\">{workflows}</select></label>\
<label>agent <select name=\"agent\">{agents}</select></label>\
<label>order id <input name=\"order\" value=\"{order}\" placeholder=\"one task by its id\"></label>\
<label>at most <input name=\"limit\" type=\"number\" min=\"1\" max=\"1000\" value=\"{limit}\"></label>\
<button type=\"submit\">list</button></form>",
        order = esc(asked.order.as_deref().unwrap_or_default()),
        limit = asked.limit,
    )
}

fn text(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The state cell: the state, and what a waiting or queued task waits for (as `tasks list`
/// says it).
fn state_cell(task: &TaskRecord, v: &Value, now: Timestamp) -> String {
    let mut cell = format!("<span class=\"state {0}\">{0}</span>", esc(task.state().as_str()));
    if let Some(at) = v["wake_at"].as_str() {
        cell.push_str(&format!(" timer until {}", esc(at)));
    }
    if let Some(due) = v["callback_due"].as_str() {
        cell.push_str(&format!(" for a callback, due {}", esc(due)));
    }
    if let Some(line) = crate::tasks::render::queued_line(task, now) {
        cell.push_str(&format!(", {}", esc(&line)));
    }
    if let Some(at) = v["throttled_until"].as_str() {
        cell.push_str(&format!(" throttled until {}", esc(at)));
    }
    if v["stage"].is_object() {
        cell.push_str(&format!(
            " stage {}: {}/{} done",
            esc(&text(&v["stage"], "name")),
            text(&v["stage"], "succeeded"),
            text(&v["stage"], "branches")
        ));
    }
    if task.paused() {
        cell.push_str(" <em>(paused)</em>");
    }
    cell
}

/// The listed tasks as a table, each id a link to its page.
pub fn task_table(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    if tasks.is_empty() {
        return "<p class=\"empty\">no task</p>".into();
    }
    let mut out = String::from(
        "<table class=\"tasks\"><thead><tr><th>order id</th><th>state</th><th>workflow</th><th>step</th><th>failures</th><th>updated</th><th>last error</th></tr></thead><tbody>",
    );
    for (task, wf) in tasks {
        let v = task_summary_json(task, *wf);
        let id = task.order_id.as_str();
        out.push_str(&format!(
            "<tr data-order=\"{ide}\"><td><a href=\"/tasks/{idq}\">{ide}</a></td><td>{state}</td><td>{wf} v{ver}</td><td>{step} {name}</td><td>{fails}</td><td>{updated}</td><td>{error}</td></tr>",
            ide = esc(id),
            idq = query_value(id),
            state = state_cell(task, &v, now),
            wf = esc(&task.workflow),
            ver = task.workflow_version,
            step = task.step,
            name = esc(&text(&v, "step_name")),
            fails = task.failure_count,
            updated = esc(&text(&v, "updated_at")),
            error = esc(&crate::tasks::render::one_line(&text(&v, "last_error"), 120)),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// The waiting tasks: each timer with its wake time, each callback with its due time and
/// heartbeat.
pub fn waiting_table(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    if tasks.is_empty() {
        return "<p class=\"empty\">no task waits</p>".into();
    }
    let mut out = String::from(
        "<table class=\"waiting\"><thead><tr><th>order id</th><th>step</th><th>waits for</th><th>due</th><th>in</th><th>heartbeat</th></tr></thead><tbody>",
    );
    for (task, wf) in tasks {
        let id = task.order_id.as_str();
        let name = crate::tasks::render::step_name(*wf, task.step).unwrap_or_default();
        let (what, due, beat) = match (task.wake_at(), task.callback()) {
            (Some(at), _) => ("a timer".to_owned(), at, "-".to_owned()),
            (None, Some(cb)) => (
                format!("a callback (times out {})", iso(cb.timeout_at)),
                cb.due(),
                match (cb.heartbeat_ms, cb.last_heartbeat) {
                    (Some(every), Some(last)) => format!("every {}, last {}", span(every), iso(last)),
                    (Some(every), None) => format!("every {}, none yet", span(every)),
                    (None, _) => "none asked".to_owned(),
                },
            ),
            (None, None) => ("-".to_owned(), task.deadline().unwrap_or(now), "-".to_owned()),
        };
        let left = if due > now { span(due.0 - now.0 - (due.0 - now.0) % 1_000) } else { "passed".into() };
        out.push_str(&format!(
            "<tr data-order=\"{ide}\"><td><a href=\"/tasks/{idq}\">{ide}</a></td><td>{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            task.step,
            esc(&name),
            esc(&what),
            esc(&iso(due)),
            esc(&left),
            esc(&beat),
            ide = esc(id),
            idq = query_value(id),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// The limited agents, as `sasctl agents list` computes them.
pub fn agents_table(seen: &[Seen], now: Timestamp) -> String {
    if seen.is_empty() {
        return "<p class=\"empty\">no agent of the definition file has limits (max_in_flight, max_per_second)</p>".into();
    }
    let mut out = String::from(
        "<table class=\"agents\"><thead><tr><th>agent</th><th>max in flight</th><th>max per second</th><th>held</th><th>reserved</th><th>waiting</th><th>paused until</th></tr></thead><tbody>",
    );
    for s in seen {
        let v = list_json(s, now);
        let cell = |k: &str| match text(&v, k).as_str() {
            "" => "-".to_owned(),
            t => esc(t),
        };
        out.push_str(&format!(
            "<tr><td><a href=\"/tasks?state=queued&amp;agent={q}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.agent),
            cell("max_in_flight"),
            cell("max_per_second"),
            cell("held"),
            cell("reserved"),
            cell("waiting"),
            cell("paused_until"),
            q = query_value(&s.agent),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// A task's page, the part read again while it is open: its graph, its timeline, its
/// outputs and its record as `sasctl tasks show` prints it.
pub fn task_live(task: &TaskRecord, wf: Option<&Workflow>, now: Timestamp, next: &[String]) -> String {
    let state = task.state().as_str();
    let mut out = format!(
        "<p class=\"summary\" data-state=\"{state}\">order <strong>{}</strong>: <span class=\"state {state}\">{state}</span> at step {} {}, workflow {} v{}{}</p>",
        esc(task.order_id.as_str()),
        task.step,
        esc(&crate::tasks::render::step_name(wf, task.step).unwrap_or_default()),
        esc(&task.workflow),
        task.workflow_version,
        if task.paused() { " <em>(paused)</em>" } else { "" },
    );
    out.push_str("<h2>Workflow</h2>");
    match wf {
        Some(wf) => out.push_str(&super::graph::svg(task, wf)),
        None => out.push_str(
            "<p class=\"error\">the definition file does not define this workflow version: pass the one the deployment runs (--workflows FILE)</p>",
        ),
    }
    out.push_str("<h2>Timeline</h2>");
    out.push_str(&format!(
        "<p class=\"source\">From the record's bounded timeline: {} entries kept, {} older ones dropped (timeline_dropped). One consistent read (GetItem) of the task's item per refresh.</p>",
        task.timeline.len(),
        task.timeline_dropped
    ));
    out.push_str(&super::gantt::svg(task, wf, now));
    let outputs: serde_json::Map<String, Value> =
        task.outputs.iter().map(|(k, v)| (k.clone(), v.to_value())).collect();
    out.push_str(&format!(
        "<h2>Outputs</h2><pre class=\"outputs\">{}</pre>",
        esc(&serde_json::to_string_pretty(&outputs).unwrap_or_default())
    ));
    out.push_str(&format!(
        "<h2>Record</h2><p class=\"source\">As <code>sasctl tasks show</code> prints it.</p><pre class=\"record\">{}</pre>",
        esc(&show_text(task, wf, now, next))
    ));
    out
}

/// The action form of a task's page: every action with its fields; the dry run comes first.
pub fn action_form(id: &str, token: &str, callback_step: Option<&str>) -> String {
    let actions: String = super::actions::ACTIONS
        .iter()
        .map(|a| {
            let selected = callback_step.is_some() && *a == "complete";
            option(a, a, selected)
        })
        .collect();
    format!(
        "<section class=\"act\"><h2>Act on it</h2>\
<p>Each action shows its dry run first (what it would do to the task as read then), then asks to confirm. Who acts (this console's caller identity) and why are recorded in the task's timeline, as with <code>sasctl tasks</code>.</p>\
<form method=\"post\" action=\"/tasks/{idq}/preview\" id=\"act-form\">\
<input type=\"hidden\" name=\"token\" value=\"{token}\">\
<label>action <select name=\"action\" id=\"action\">{actions}</select></label>\
<label>reason <input name=\"reason\" id=\"reason\" required placeholder=\"why (recorded)\"></label>\
<label>callback step <input name=\"step\" id=\"step\" value=\"{step}\" placeholder=\"complete and fail\"></label>\
<label>output <input name=\"output\" id=\"output\" placeholder=\"complete: JSON, optional\"></label>\
<label>from step <input name=\"from_step\" id=\"from_step\" type=\"number\" min=\"0\" placeholder=\"resubmit: optional\"></label>\
<button type=\"submit\" id=\"dry-run\">dry run</button></form></section>",
        idq = query_value(id),
        token = esc(token),
        step = esc(callback_step.unwrap_or_default()),
    )
}

/// The dry run's page: what it would do, and the button that does it.
pub fn dry_run(
    id: &str,
    token: &str,
    request: &super::actions::Request,
    told: &super::actions::Told,
) -> String {
    let idq = query_value(id);
    let mut out = format!(
        "<p class=\"dry-run {}\" id=\"dry-run-result\">{}</p>{}",
        if told.applies { "would" } else { "refused" },
        esc(&told.line),
        if told.line.contains("nothing changed") { "" } else { "<p>dry run: nothing changed.</p>" }
    );
    if told.applies {
        let from_step = match request.kind {
            super::actions::Kind::Act(sas::domain::Act::Resubmit { from_step: Some(n) }) => n.to_string(),
            _ => String::new(),
        };
        out.push_str(&format!(
            "<form method=\"post\" action=\"/tasks/{idq}/act\"><input type=\"hidden\" name=\"token\" value=\"{}\">\
<input type=\"hidden\" name=\"action\" value=\"{}\"><input type=\"hidden\" name=\"reason\" value=\"{}\">\
<input type=\"hidden\" name=\"step\" value=\"{}\"><input type=\"hidden\" name=\"output\" value=\"{}\">\
<input type=\"hidden\" name=\"from_step\" value=\"{}\"><input type=\"hidden\" name=\"seen\" value=\"{}\">\
<button type=\"submit\" id=\"confirm\">confirm: {} {}</button></form>",
            esc(token),
            esc(request.kind.name()),
            esc(&request.reason),
            esc(&request.step),
            esc(request.output.as_deref().unwrap_or_default()),
            esc(&from_step),
            told.revision.map(|r| r.to_string()).unwrap_or_default(),
            esc(request.kind.name()),
            esc(id),
        ));
    }
    out.push_str(&format!("<p><a href=\"/tasks/{idq}\" id=\"back\">back to {}</a></p>", esc(id)));
    out
}

/// The action's page: what came of it.
pub fn acted(id: &str, told: &super::actions::Told) -> String {
    format!(
        "<p class=\"acted {}\" id=\"act-result\">{}</p><p><a href=\"/tasks/{}\" id=\"back\">back to {}</a></p>",
        if told.applies { "applied" } else { "refused" },
        esc(&told.line),
        query_value(id),
        esc(id)
    )
}

/// One DLQ's messages, as `sasctl dlq list` shows them (callback tokens redacted).
pub fn dlq_table(messages: &[Value]) -> String {
    if messages.is_empty() {
        return "<p class=\"empty\">the DLQ holds no message</p>".into();
    }
    let mut out = String::from(
        "<table class=\"dlq\"><thead><tr><th>message id</th><th>first seen</th><th>receives</th><th>reason (sas-reason)</th><th>kept from</th><th>body</th></tr></thead><tbody>",
    );
    for m in messages {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&text(m, "message_id")),
            esc(&text(m, "first_seen")),
            esc(&text(m, "receive_count")),
            esc(&text(m, "reason")),
            esc(&text(m, "kept_from")),
            esc(&crate::tasks::render::one_line(&text(m, "body"), 300)),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// An error page's body.
pub fn problem(what: &str) -> String {
    format!("<p class=\"error\" id=\"problem\">{}</p><p><a href=\"/tasks\">tasks</a></p>", esc(what))
}
