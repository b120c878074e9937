//! Each page's body, from what was read: HTML text, nothing read here (the callers pass
//! what they read and the time).

use sas::domain::{Definitions, TaskRecord, Timestamp, Workflow};
use serde_json::Value;

use super::html::{esc, query_value};
use crate::agents::render::{Seen, list_json};
use crate::tasks::StateArg;
use crate::tasks::render::{iso, show_text, span, task_summary_json};

/// The states the task list offers, and what each listing reads.
pub const STATES: [StateArg; 9] = [
    StateArg::Error,
    StateArg::Waiting,
    StateArg::Queued,
    StateArg::Processing,
    StateArg::Pending,
    StateArg::Compensating,
    StateArg::Stuck,
    StateArg::Paused,
    StateArg::Finished,
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
        StateArg::Finished | StateArg::Processed | StateArg::Compensated if !narrowed => {
            "a Query of the finished index per shard (it holds only Processed and Compensated tasks, when the deployment keeps it: ListFinished) and one read per task shown, newest first: it reads only what it shows".into()
        }
        StateArg::Finished | StateArg::Processed | StateArg::Compensated => {
            "a Query of the finished index per shard (only Processed and Compensated tasks) and one read per task, up to 1000 to pick from, filtered here".into()
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
    /// Changed within this long (`tasks list --since`), as written (`2h`).
    pub since: Option<String>,
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
<label>changed within <input name=\"since\" value=\"{since}\" placeholder=\"e.g. 2h, 3d\" size=\"6\"></label>\
<label>at most <input name=\"limit\" type=\"number\" min=\"1\" max=\"1000\" value=\"{limit}\"></label>\
<button type=\"submit\">list</button></form>",
        order = esc(asked.order.as_deref().unwrap_or_default()),
        since = esc(asked.since.as_deref().unwrap_or_default()),
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
    if let Some(m) = v["map"].as_object() {
        let n = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
        let items = m.get("items").and_then(Value::as_u64).map_or_else(|| "?".to_owned(), |n| n.to_string());
        let mut progress = format!(
            " map {}: {}/{items} done, {} refused, {} in flight",
            esc(m.get("name").and_then(Value::as_str).unwrap_or_default()),
            n("succeeded"),
            n("refused"),
            n("in_flight")
        );
        if m.get("undoing").and_then(Value::as_bool) == Some(true) {
            progress.push_str(&format!(", {} undone", n("undone")));
        }
        cell.push_str(&progress);
    }
    if task.paused() {
        cell.push_str(" <em>(paused)</em>");
    }
    cell
}

/// A table: its header (text), then each row's cells (HTML), with the `data-order` of the
/// task a row is about; or `empty` when there is no row.
fn table(class: &str, head: &[&str], rows: Vec<(Option<&str>, Vec<String>)>, empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\">{}</p>", esc(empty));
    }
    let head: String = head.iter().map(|h| format!("<th>{}</th>", esc(h))).collect();
    let mut out = format!("<table class=\"{class}\"><thead><tr>{head}</tr></thead><tbody>");
    for (order, cells) in rows {
        let attr = order.map(|o| format!(" data-order=\"{}\"", esc(o))).unwrap_or_default();
        let cells: String = cells.iter().map(|c| format!("<td>{c}</td>")).collect();
        out.push_str(&format!("<tr{attr}>{cells}</tr>"));
    }
    out.push_str("</tbody></table>");
    out
}

/// A task's order id, as a link to its page.
fn task_link(id: &str) -> String {
    format!("<a href=\"/tasks/{}\">{}</a>", query_value(id), esc(id))
}

/// The listed tasks as a table, each id a link to its page.
pub fn task_table(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    let rows = tasks
        .iter()
        .map(|(task, wf)| {
            let v = task_summary_json(task, *wf);
            let id = task.order_id.as_str();
            let cells = vec![
                task_link(id),
                state_cell(task, &v, now),
                format!("{} v{}", esc(&task.workflow), task.workflow_version),
                format!("{} {}", task.step, esc(&text(&v, "step_name"))),
                task.failure_count.to_string(),
                esc(&text(&v, "updated_at")),
                esc(&crate::tasks::render::one_line(&text(&v, "last_error"), 120)),
            ];
            (Some(id), cells)
        })
        .collect();
    let head = ["order id", "state", "workflow", "step", "failures", "updated", "last error"];
    table("tasks", &head, rows, "no task")
}

/// What a waiting task waits for, when that is due, and its heartbeat.
fn waits(task: &TaskRecord, now: Timestamp) -> (String, Timestamp, String) {
    match (task.wake_at(), task.callback()) {
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
    }
}

/// The waiting tasks: each timer with its wake time, each callback with its due time and
/// heartbeat.
pub fn waiting_table(tasks: &[(&TaskRecord, Option<&Workflow>)], now: Timestamp) -> String {
    let rows = tasks
        .iter()
        .map(|(task, wf)| {
            let id = task.order_id.as_str();
            let name = crate::tasks::render::step_name(*wf, task.step).unwrap_or_default();
            let (what, due, beat) = waits(task, now);
            let left =
                if due > now { span(due.0 - now.0 - (due.0 - now.0) % 1_000) } else { "passed".into() };
            let cells = vec![
                task_link(id),
                format!("{} {}", task.step, esc(&name)),
                esc(&what),
                esc(&iso(due)),
                esc(&left),
                esc(&beat),
            ];
            (Some(id), cells)
        })
        .collect();
    table("waiting", &["order id", "step", "waits for", "due", "in", "heartbeat"], rows, "no task waits")
}

/// The limited agents, as `sasctl agents list` computes them.
pub fn agents_table(seen: &[Seen], now: Timestamp) -> String {
    let rows = seen
        .iter()
        .map(|s| {
            let v = list_json(s, now);
            let link = format!(
                "<a href=\"/tasks?state=queued&amp;agent={}\">{}</a>",
                query_value(&s.agent),
                esc(&s.agent)
            );
            let mut cells = vec![link];
            for k in ["max_in_flight", "max_per_second", "held", "reserved", "waiting", "paused_until"] {
                cells.push(match text(&v, k).as_str() {
                    "" => "-".to_owned(),
                    t => esc(t),
                });
            }
            (None, cells)
        })
        .collect();
    let head = ["agent", "max in flight", "max per second", "held", "reserved", "waiting", "paused until"];
    let empty = "no agent of the definition file has limits (max_in_flight, max_per_second)";
    table("agents", &head, rows, empty)
}

/// Where an order's whole history was read from (`crate::history`).
pub enum Kept {
    /// A local run's file (`sasctl up` writes it).
    File(std::path::PathBuf),
    /// A deployed stack's log groups in CloudWatch Logs.
    Logs(Vec<String>),
}

/// A task's whole history, beyond the record's bounded timeline: the functions' log lines
/// of the order, from where they are kept (`kept`; none when the table's name does not
/// say), or why they could not be read.
pub fn history(order: &str, kept: Option<&Kept>, lines: Result<&[Value], &str>) -> String {
    let mut out = String::from("<h2>Whole history</h2>");
    let from = match kept {
        Some(Kept::File(path)) => {
            format!(
                "from <code>{}</code>, where <code>sasctl up</code> writes them",
                esc(&path.display().to_string())
            )
        }
        Some(Kept::Logs(groups)) => format!(
            "from CloudWatch Logs (FilterLogEvents on the order id): {}",
            groups.iter().map(|g| format!("<code>{}</code>", esc(g))).collect::<Vec<_>>().join(", ")
        ),
        None => "from the functions' logs: this table's name does not say which".to_owned(),
    };
    match lines {
        Ok(lines) => {
            out.push_str(&format!(
                "<p class=\"source\">The functions' log lines of this order, {from} ({} shown, at most the newest {}). Read when this page opened.</p>",
                lines.len(),
                crate::history::MAX_LINES
            ));
            let rows: Vec<(Option<&str>, Vec<String>)> = lines
                .iter()
                .map(|l| {
                    let (at, function, what) = crate::history::describe(l);
                    (None, vec![esc(&at), esc(&function), esc(&what)])
                })
                .collect();
            out.push_str(&table("history", &["at", "function", "what"], rows, "no line of this order yet"));
        }
        Err(why) => out.push_str(&format!(
            "<p class=\"error\">The functions' log lines of this order, {from}, could not be read: {}</p>",
            esc(why)
        )),
    }
    if let Some(Kept::Logs(_)) = kept {
        let id = esc(&Value::from(order).to_string());
        out.push_str(&format!(
            "<p class=\"source\">The same in Logs Insights, over those groups:</p><pre class=\"query\">fields @timestamp, @message\n| filter span.order_id = {id} or fields.order_id = {id}\n| sort @timestamp asc</pre>"
        ));
    }
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
    let rows = messages
        .iter()
        .map(|m| {
            let mut cells: Vec<String> = ["message_id", "first_seen", "receive_count", "reason", "kept_from"]
                .iter()
                .map(|k| esc(&text(m, k)))
                .collect();
            cells.push(format!(
                "<code>{}</code>",
                esc(&crate::tasks::render::one_line(&text(m, "body"), 300))
            ));
            (None, cells)
        })
        .collect();
    let head = ["message id", "first seen", "receives", "reason (sas-reason)", "kept from", "body"];
    table("dlq", &head, rows, "the DLQ holds no message")
}

/// An error page's body.
pub fn problem(what: &str) -> String {
    format!("<p class=\"error\" id=\"problem\">{}</p><p><a href=\"/tasks\">tasks</a></p>", esc(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::ProcessState;

    #[test]
    fn tables_link_each_task_and_say_when_there_is_none() {
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        let now = Timestamp(t.created_at.0 + 1_000);
        let listed = task_table(&[(&t, None)], now);
        assert!(
            listed.contains("<tr data-order=\"o-1\"><td><a href=\"/tasks/o-1\">o-1</a></td>"),
            "{listed}"
        );
        assert!(listed.contains("<span class=\"state Pending\">Pending</span>"), "{listed}");
        assert_eq!(task_table(&[], now), "<p class=\"empty\">no task</p>");
        assert_eq!(waiting_table(&[], now), "<p class=\"empty\">no task waits</p>");
        let kept = serde_json::json!({"message_id": "m-1", "reason": "<bad>", "body": "{}"});
        assert!(dlq_table(&[kept]).contains("<td>&lt;bad&gt;</td>"));
    }

    #[test]
    fn a_task_at_a_map_says_how_far_its_items_are_as_the_listing_does() {
        let (wf, t) = crate::fixtures::map_under_way();
        let now = Timestamp(t.updated_at.0 + 10);
        let listed = task_table(&[(&t, Some(&wf))], now);
        assert!(
            listed.contains(
                "<span class=\"state Processing\">Processing</span> map reserve-lines: 1/5 done, 1 refused, 2 in flight</td>"
            ),
            "{listed}"
        );
        let page = task_live(&t, Some(&wf), now, &[]);
        assert!(page.contains("map: reserve-lines · 1/5 done</text>"), "{page}");
        assert!(
            page.contains("  map           reserve-lines (step 1, 5 items, at most 2 at a time)"),
            "{page}"
        );
    }
}
