//! Selecting tasks by state, through the table's indexes only: Error tasks from the
//! sparse error index (it holds nothing else), live ones from the due index (it holds
//! exactly the live tasks) with one consistent read each. Never a Scan, whose cost grows
//! with every task the table keeps.

use std::process::ExitCode;

use sas::domain::{TaskRecord, Timestamp};
use sas::ports::{Clock as _, Listing, TaskListing as _};

use super::{Context, Filter, ListArgs, StateArg, TasksError, render};

/// Live tasks read at most to pick a state from (or --limit, if larger): the due index
/// is ordered by deadline, not by state.
pub const LIVE_WINDOW: usize = 1_000;

/// What a listing selected.
pub struct Selection {
    pub tasks: Vec<TaskRecord>,
    /// More tasks match (or may: the window read was full) than the `limit` selected.
    pub more: bool,
}

pub fn now() -> Timestamp {
    sas::adapters::system::SystemClock.now()
}

/// The tasks in `state` that pass `filter`, at most `filter.limit`, newest first for
/// Error, oldest deadline first for the live states.
pub async fn select(ctx: &Context, state: StateArg, filter: &Filter) -> Result<Selection, TasksError> {
    let now = now();
    let since = filter.since.map(|d| Timestamp(now.0.saturating_sub(d.as_millis() as u64)));
    let narrowed = filter.workflow.is_some() || (state != StateArg::Error && since.is_some());
    // One more than asked for, to tell "that is all" from "more remain".
    let window = if state == StateArg::Error && !narrowed {
        filter.limit + 1
    } else {
        (filter.limit + 1).max(LIVE_WINDOW)
    };
    let listing = match state {
        StateArg::Error => Listing::Errors { since },
        _ => Listing::Live,
    };
    let read = ctx.store.list(&listing, window).await.map_err(|e| ctx.store_error(e))?;
    let read_full = read.len() >= window;
    let mut tasks: Vec<TaskRecord> = read
        .into_iter()
        .filter(|t| match (state, state.state()) {
            (_, Some(s)) => t.state() == s,
            (StateArg::Paused, None) => t.paused() && !t.state().is_terminal(),
            (StateArg::Queued, None) => t.queued().is_some() && !t.state().is_terminal(),
            (_, None) => !t.state().is_terminal() && t.deadline().is_some_and(|d| d < now),
        })
        .filter(|t| filter.workflow.as_ref().is_none_or(|w| *w == t.workflow))
        .filter(|t| since.is_none_or(|s| t.updated_at >= s))
        .collect();
    let more = tasks.len() > filter.limit || read_full;
    tasks.truncate(filter.limit);
    Ok(Selection { tasks, more })
}

/// `sasctl tasks list`.
pub async fn run(args: &ListArgs) -> Result<ExitCode, TasksError> {
    let ctx = Context::connect(&args.common).await?;
    let selection = select(&ctx, args.state, &args.filter).await?;
    let with_wf: Vec<_> =
        selection.tasks.iter().map(|t| (t, render::workflow_of(&ctx.definitions, t))).collect();
    if args.common.json {
        for (task, wf) in &with_wf {
            println!("{}", render::task_summary_json(task, *wf));
        }
    } else {
        if !with_wf.is_empty() {
            print!("{}", render::table_at(&with_wf, now()));
        }
        println!("{} task(s) {}", with_wf.len(), args.state.as_str());
    }
    if selection.more {
        eprintln!(
            "sasctl: more tasks may match than these {}: raise --limit (up to 1000) or narrow with --since",
            selection.tasks.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
