//! `sasctl console`: a local web page over a deployment, on the same flags and
//! environment as `sasctl tasks` (`Common`, `Context::connect`), reading only what the
//! text commands read and acting only as they act.
//!
//! Files, each using only those listed before it: `html.rs` (escaping, the page frame),
//! `graph.rs` (a workflow drawn as SVG, each step's outcome marked), `gantt.rs` (a task's
//! timeline as SVG, one bar per attempt), `pages.rs` (each page's body, from what was
//! read), `actions.rs` (an action's dry run and the action, through
//! cli/src/tasks/act.rs and cli/src/tasks/callback.rs), `server.rs` (the routes, the
//! token, the reads). The page's CSS and script are `assets/`, embedded in the binary.
//!
//! It listens on 127.0.0.1 only, and every request must carry the token the URL it
//! prints holds (`?token=...`, or the cookie the first visit sets; a POST in its form).
//! The store is read only when a page is asked for: the page asks again every 2 s while
//! it is visible, and never while its tab is hidden.

mod actions;
mod gantt;
mod graph;
mod html;
mod pages;
mod server;

use std::process::ExitCode;

use crate::tasks::{Common, Context, TasksError};

/// `sasctl console`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleArgs {
    /// The port to listen on, on 127.0.0.1 only (0: a free one, said in the URL printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    #[command(flatten)]
    pub common: Common,
}

/// A fresh random token: 256 bits from the operating system, as 64 hex digits.
fn new_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Runs the console until Ctrl-C or SIGTERM: connects (as `sasctl tasks` does, and
/// finds who acts), binds, prints the URL (with --json, `{"url": ...}`), serves.
pub async fn run_command(args: ConsoleArgs) -> Result<ExitCode, TasksError> {
    let policy = crate::tasks::policy()?;
    let ctx = Context::connect(&args.common).await?;
    let operator = crate::tasks::act::Operator::new(ctx, policy).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| TasksError::Usage(format!("--port {}: cannot listen on 127.0.0.1: {e}", args.port)))?;
    let port = listener.local_addr().map_err(|e| TasksError::Usage(e.to_string()))?.port();
    let token = new_token();
    let url = format!("http://127.0.0.1:{port}/?token={token}");
    if args.common.json {
        println!("{}", serde_json::json!({"url": url}));
    } else {
        println!("sasctl console: {url}");
        println!(
            "  over {} (table {}), acting as {}",
            operator.ctx.deployment.at(),
            operator.ctx.table,
            operator.by
        );
        println!("  open the URL (it holds the token every request needs); Ctrl-C stops");
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let state = server::Console::new(operator, policy, args.common.deployment.clone(), token, port);
    server::serve(listener, state).await.map_err(|e| TasksError::Usage(format!("serving: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
