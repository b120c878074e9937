//! The console's HTTP side: its routes, the token every request must present, and the
//! reads each page makes (only when it is asked for; each page says what it read).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::ValueEnum as _;
use sas::domain::Policy;

use super::actions;
use super::html::{Frame, Live, esc, page};
use super::pages::{self, Asked};
use crate::deployment::{DeploymentArgs, WorkQueue};
use crate::tasks::act::Operator;
use crate::tasks::{Filter, StateArg, TasksError, now, order_id, render, select};

/// The largest POST body read (an action's form).
const MAX_FORM: usize = 64 * 1024;

/// What every request is served with.
pub struct Console {
    op: Operator,
    policy: Policy,
    deployment: DeploymentArgs,
    token: String,
    /// The cookie's name: per port, as cookies are per host, not per port.
    cookie: String,
}

impl Console {
    pub fn new(
        op: Operator,
        policy: Policy,
        deployment: DeploymentArgs,
        token: String,
        port: u16,
    ) -> Arc<Console> {
        Arc::new(Console { op, policy, deployment, token, cookie: format!("sas_console_{port}") })
    }

    /// Whether `given` is the token.
    fn is_token(&self, given: &str) -> bool {
        same(&self.token, given)
    }

    fn frame(&self) -> Frame<'_> {
        Frame {
            at: self.op.ctx.deployment.at(),
            table: &self.op.ctx.table,
            by: &self.op.by,
            definitions_from: &self.op.ctx.definitions_from,
        }
    }

    fn page(&self, title: &str, current: &str, live: Live, body: &str) -> Response {
        html(StatusCode::OK, page(&self.frame(), title, current, live, body))
    }

    fn problem(&self, status: StatusCode, what: &str) -> Response {
        html(status, page(&self.frame(), "Error", "", Live::No, &pages::problem(what)))
    }

    /// A command's error as a page: bad input is 400, trouble with the deployment 502.
    fn failed(&self, e: &TasksError) -> Response {
        let status = match e {
            TasksError::Usage(_) | TasksError::BadId { .. } | TasksError::UnknownWorkflow { .. } => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::BAD_GATEWAY,
        };
        self.problem(status, &e.to_string())
    }
}

/// `a == b` in time that depends only on their lengths (the token's is public: 64).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], body)
        .into_response()
}

/// Name and value pairs of a query string or a form body (the last of a name wins).
fn pairs(bytes: &[u8]) -> HashMap<String, String> {
    url::form_urlencoded::parse(bytes).into_owned().collect()
}

fn query(uri: &Uri) -> HashMap<String, String> {
    pairs(uri.query().unwrap_or_default().as_bytes())
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn forbidden() -> Response {
    let body = "<!doctype html><html><head><meta charset=\"utf-8\"><title>403 · sas console</title></head><body>\
<h1>403: no token</h1><p>This console needs its token: open the URL <code>sasctl console</code> (or <code>sasctl up</code>) printed, \
<code>http://127.0.0.1:PORT/?token=...</code>. An action must carry it in its form.</p></body></html>";
    html(StatusCode::FORBIDDEN, body.into())
}

/// Every request presents the token: a GET in its query (which sets the cookie) or the
/// cookie; a POST in its form or query (never the cookie alone, so no other page can post
/// here through the browser). Anything else is 403 (or 405 for another method).
async fn guard(State(c): State<Arc<Console>>, req: Request, next: Next) -> Response {
    let in_query = query(req.uri()).get("token").is_some_and(|t| c.is_token(t));
    match *req.method() {
        Method::GET | Method::HEAD => {
            let in_cookie = cookie(req.headers(), &c.cookie).is_some_and(|t| c.is_token(t));
            if !in_query && !in_cookie {
                return forbidden();
            }
            let mut response = next.run(req).await;
            if in_query
                && let Ok(v) = HeaderValue::from_str(&format!(
                    "{}={}; Path=/; HttpOnly; SameSite=Strict",
                    c.cookie, c.token
                ))
            {
                response.headers_mut().append(header::SET_COOKIE, v);
            }
            response
        }
        Method::POST => {
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
                return (StatusCode::PAYLOAD_TOO_LARGE, "a form of at most 64 KiB\n").into_response();
            };
            if !in_query && !pairs(&bytes).get("token").is_some_and(|t| c.is_token(t)) {
                return forbidden();
            }
            next.run(Request::from_parts(parts, Body::from(bytes))).await
        }
        _ => (StatusCode::METHOD_NOT_ALLOWED, "GET or POST\n").into_response(),
    }
}

/// Serves until Ctrl-C or SIGTERM.
pub async fn serve(listener: tokio::net::TcpListener, console: Arc<Console>) -> std::io::Result<()> {
    let app = Router::new()
        // The URL printed: the task list itself (a redirect would lose the token for a
        // client without cookies, such as curl).
        .route("/", get(tasks))
        .route("/tasks", get(tasks))
        .route("/tasks/{id}", get(task))
        .route("/tasks/{id}/history", get(history))
        .route("/tasks/{id}/preview", post(preview))
        .route("/tasks/{id}/act", post(act))
        .route("/waiting", get(waiting))
        .route("/agents", get(agents))
        .route("/dlq", get(dlq))
        .route("/assets/console.css", get(|| async { asset("text/css", include_str!("assets/console.css")) }))
        .route(
            "/assets/console.js",
            get(|| async { asset("text/javascript", include_str!("assets/console.js")) }),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console);
    axum::serve(listener, app).with_graceful_shutdown(stopped()).await
}

async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

fn asset(kind: &'static str, text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], text).into_response()
}

async fn not_found(State(c): State<Arc<Console>>, uri: Uri) -> Response {
    c.problem(StatusCode::NOT_FOUND, &format!("no page {}", uri.path()))
}

/// The task list's query, checked.
fn asked(q: &HashMap<String, String>) -> Result<Asked, String> {
    let field = |k: &str| q.get(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let state = match field("state") {
        None => StateArg::Error,
        Some(s) => StateArg::from_str(&s, true).map_err(|_| {
            let names: Vec<&str> = pages::STATES.iter().map(|s| s.as_str()).collect();
            format!("state {s:?} is not one of {}", names.join(", "))
        })?,
    };
    let limit = match field("limit") {
        None => 50,
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| format!("limit {n:?} is not a whole number from 1 to 1000"))?,
    };
    let since = field("since");
    if let Some(s) = &since {
        crate::args::duration("changed within")(s)?;
    }
    Ok(Asked {
        state,
        workflow: field("workflow"),
        agent: field("agent"),
        order: field("order"),
        since,
        limit,
    })
}

async fn tasks(State(c): State<Arc<Console>>, uri: Uri) -> Response {
    let asked = match asked(&query(&uri)) {
        Ok(a) => a,
        Err(why) => return c.problem(StatusCode::BAD_REQUEST, &why),
    };
    let ctx = &c.op.ctx;
    let mut body = pages::task_filters(&asked, &ctx.definitions);
    let (read, more, tasks) = if let Some(order) = &asked.order {
        let id = match order_id(order) {
            Ok(id) => id,
            Err(e) => return c.failed(&e),
        };
        match ctx.task(&id).await {
            Ok(task) => (
                "one consistent read (GetItem) of that order's item: any state, finished ones (Processed, Compensated) included".to_owned(),
                false,
                task.into_iter().collect(),
            ),
            Err(e) => return c.failed(&e),
        }
    } else {
        let filter = Filter {
            workflow: asked.workflow.clone(),
            agent: asked.agent.clone(),
            since: asked.since.as_deref().and_then(|s| crate::args::duration("changed within")(s).ok()),
            limit: asked.limit,
        };
        match select(ctx, asked.state, &filter).await {
            Ok(s) => {
                (pages::reads(asked.state, crate::tasks::narrowed(asked.state, &filter)), s.more, s.tasks)
            }
            Err(e) => return c.failed(&e),
        }
    };
    let with_wf: Vec<_> = tasks.iter().map(|t| (t, render::workflow_of(&ctx.definitions, t))).collect();
    body.push_str(&format!(
        "<div id=\"live\"><p class=\"source\">Read: {}. Finished tasks (Processed, Compensated) are listed under finished where the deployment keeps that index (ListFinished; <code>sasctl up</code> does); any task can be looked up by its order id.</p>{}<p class=\"count\">{} task(s){}</p></div>",
        esc(&read),
        pages::task_table(&with_wf, now()),
        with_wf.len(),
        if more { "; more may match: raise the limit" } else { "" }
    ));
    c.page("Tasks", "Tasks", Live::Yes, &body)
}

async fn task(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let order = match order_id(&id) {
        Ok(o) => o,
        Err(e) => return c.failed(&e),
    };
    let ctx = &c.op.ctx;
    let task = match ctx.task(&order).await {
        Ok(Some(task)) => task,
        Ok(None) => return c.problem(StatusCode::NOT_FOUND, &format!("no task {id} in table {}", ctx.table)),
        Err(e) => return c.failed(&e),
    };
    let wf = render::workflow_of(&ctx.definitions, &task);
    let now = now();
    let flags = render::deployment_flags(&c.deployment, ctx.common.workflows.as_deref());
    let next = render::next_commands(&task, wf, &c.policy, now, &flags);
    let callback_step =
        task.callback().and_then(|cb| render::step_name(wf, cb.step)).filter(|_| !task.state().is_terminal());
    let body = format!(
        "<div id=\"live\">{}</div>{}<p><a href=\"/tasks/{}/history\">Whole history</a>: the functions' log lines of this order, beyond the record's bounded timeline.</p>",
        pages::task_live(&task, wf, now, &next),
        pages::action_form(&id, &c.token, callback_step.as_deref()),
        esc(&id)
    );
    c.page(&format!("Task {id}"), "Tasks", Live::Yes, &body)
}

/// An order's whole history: a page of its own, read once per visit (the task page
/// refreshes itself while open, and the file only grows).
async fn history(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    if let Err(e) = order_id(&id) {
        return c.failed(&e);
    }
    let prefix = c.op.ctx.table.strip_suffix("-state").filter(|p| !p.is_empty()).map(str::to_owned);
    let Some(prefix) = prefix else {
        let body = pages::history(&id, None, Err("no prefix to name its log groups by"));
        return c.page(&format!("History of {id}"), "Tasks", Live::No, &body);
    };
    let path = crate::history::path(&prefix);
    let (file, order) = (path.clone(), id.clone());
    let local = tokio::task::spawn_blocking(move || crate::history::lines_of(&file, &order))
        .await
        .unwrap_or_default();
    let (kept, lines) = match local {
        Some(lines) => (pages::Kept::File(path), Ok(lines)),
        None => {
            let sdk = c.op.ctx.deployment.sdk_config();
            let read = crate::history::from_cloudwatch(sdk, &prefix, &id).await;
            (pages::Kept::Logs(crate::history::log_groups(&prefix)), read)
        }
    };
    let body = pages::history(&id, Some(&kept), lines.as_deref().map_err(String::as_str));
    c.page(&format!("History of {id}"), "Tasks", Live::No, &body)
}

async fn preview(State(c): State<Arc<Console>>, Path(id): Path<String>, body: Bytes) -> Response {
    let request = match actions::parse(&pairs(&body)) {
        Ok(r) => r,
        Err(why) => return c.problem(StatusCode::BAD_REQUEST, &why),
    };
    match request.dry_run(&c.op, &c.policy, &id).await {
        Ok(told) => c.page(
            &format!("Dry run: {} {id}", request.kind.name()),
            "Tasks",
            Live::No,
            &pages::dry_run(&id, &c.token, &request, &told),
        ),
        Err(e) => c.failed(&e),
    }
}

async fn act(State(c): State<Arc<Console>>, Path(id): Path<String>, body: Bytes) -> Response {
    let request = match actions::parse(&pairs(&body)) {
        Ok(r) => r,
        Err(why) => return c.problem(StatusCode::BAD_REQUEST, &why),
    };
    match request.perform(&c.op, &id).await {
        Ok(told) => {
            let status = if told.applies { StatusCode::OK } else { StatusCode::CONFLICT };
            let title = format!("{} {id}", request.kind.name());
            html(status, page(&c.frame(), &title, "Tasks", Live::No, &pages::acted(&id, &told)))
        }
        Err(e) => c.failed(&e),
    }
}

async fn waiting(State(c): State<Arc<Console>>) -> Response {
    let ctx = &c.op.ctx;
    let filter = Filter { workflow: None, agent: None, since: None, limit: 1000 };
    let selection = match select(ctx, StateArg::Waiting, &filter).await {
        Ok(s) => s,
        Err(e) => return c.failed(&e),
    };
    let with_wf: Vec<_> =
        selection.tasks.iter().map(|t| (t, render::workflow_of(&ctx.definitions, t))).collect();
    let body = format!(
        "<div id=\"live\"><p class=\"source\">Read: {}.</p>{}</div>",
        esc(&pages::reads(StateArg::Waiting, false)),
        pages::waiting_table(&with_wf, now())
    );
    c.page("Waiting tasks", "Waiting", Live::Yes, &body)
}

async fn agents(State(c): State<Arc<Console>>) -> Response {
    match crate::agents::seen_all(&c.op.ctx).await {
        Ok(seen) => {
            let body = format!(
                "<div id=\"live\"><p class=\"source\">Read: one consistent read of each limited agent's gate (the gate#AGENT items), as <code>sasctl agents list</code>.</p>{}</div>",
                pages::agents_table(&seen, now())
            );
            c.page("Limited agents", "Agents", Live::Yes, &body)
        }
        Err(e) => c.failed(&e),
    }
}

async fn dlq(State(c): State<Arc<Console>>, uri: Uri) -> Response {
    let links: String = WorkQueue::ALL
        .iter()
        .map(|q| format!("<a href=\"/dlq?queue={0}\">{0}</a>", q.as_str()))
        .collect::<Vec<_>>()
        .join(" · ");
    let mut body = format!(
        "<p>The dead-letter queues: {links}.</p><p class=\"source\">Reading a DLQ means receiving, as <code>sasctl dlq list</code> does: each message listed is hidden from other consumers for a few seconds at most and its receive count goes up by one. So a DLQ is read only when you open it here, and this page does not refresh itself.</p>"
    );
    let Some(name) = query(&uri).get("queue").cloned() else {
        return c.page("DLQs", "DLQs", Live::No, &body);
    };
    let Some(queue) = WorkQueue::parse(&name) else {
        return c.problem(
            StatusCode::BAD_REQUEST,
            &format!("queue {name:?} is not orders, scheduler, agent or callbacks"),
        );
    };
    let read = async {
        let target = crate::dlq::target(&crate::dlq::QueueArg::Work(queue), &c.deployment, false).await?;
        let (kept, _) = crate::dlq::peek(&target, 50).await?;
        Ok::<_, crate::dlq::DlqError>((target, kept))
    };
    match read.await {
        Ok((target, kept)) => {
            let messages: Vec<_> = kept.iter().map(|m| m.json()).collect();
            body.push_str(&format!(
                "<h2>{} DLQ</h2><p class=\"source\">{}: about {} held ({} in flight); up to 50 shown.</p>{}",
                esc(queue.as_str()),
                esc(&target.dlq),
                target.visible + target.in_flight,
                target.in_flight,
                pages::dlq_table(&messages)
            ));
            c.page("DLQs", "DLQs", Live::No, &body)
        }
        Err(e) => c.problem(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_list_query_is_checked() {
        let q = |s: &str| pairs(s.as_bytes());
        let a = asked(&q("state=waiting&workflow=w&limit=5&order=")).unwrap();
        assert_eq!(
            (a.state, a.workflow.as_deref(), a.limit, a.order),
            (StateArg::Waiting, Some("w"), 5, None)
        );
        assert_eq!(asked(&q("")).unwrap().state, StateArg::Error);
        assert!(
            asked(&q("state=done")).unwrap_err().starts_with("state \"done\" is not one of error, waiting")
        );
        assert_eq!(asked(&q("limit=0")).unwrap_err(), "limit \"0\" is not a whole number from 1 to 1000");
        assert_eq!(asked(&q("state=finished&since=2h")).unwrap().since.as_deref(), Some("2h"));
        assert!(
            asked(&q("since=2hours"))
                .unwrap_err()
                .starts_with("changed within must be a whole number and a unit")
        );
    }

    #[test]
    fn tokens_are_compared_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("abc", ""));
    }

    #[test]
    fn the_cookie_is_found_by_its_name() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; sas_console_80=tok; b=2"));
        assert_eq!(cookie(&h, "sas_console_80"), Some("tok"));
        assert_eq!(cookie(&h, "sas_console_81"), None);
    }
}
