//! Selecting tasks by state, through the table's indexes only: Error tasks from the
//! sparse error index (it holds nothing else), live ones from the due index (it holds
//! exactly the live tasks) with one consistent read each. Never a Scan, whose cost grows
//! with every task the table keeps.

use std::process::ExitCode;

use sas::domain::{Definitions, TaskRecord, Timestamp};
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
    if let Some(agent) = &filter.agent {
        known_agent(&ctx.definitions, &ctx.definitions_from, agent)?;
    }
    let now = now();
    let since = filter.since.map(|d| Timestamp(now.0.saturating_sub(d.as_millis() as u64)));
    let narrowed = narrowed(state, filter);
    // One more than asked for, to tell "that is all" from "more remain".
    let window = if state.from_own_index() && !narrowed {
        filter.limit + 1
    } else {
        (filter.limit + 1).max(LIVE_WINDOW)
    };
    let listing = match state {
        StateArg::Error => Listing::Errors { since },
        StateArg::Finished | StateArg::Processed | StateArg::Compensated => Listing::Finished { since },
        _ => Listing::Live,
    };
    let read = ctx.store.list(&listing, window).await.map_err(|e| ctx.store_error(e))?;
    let read_full = read.len() >= window;
    let mut tasks: Vec<TaskRecord> = read
        .into_iter()
        .filter(|t| match (state, state.state()) {
            (_, Some(s)) => t.state() == s,
            (StateArg::Finished, None) => true,
            (StateArg::Paused, None) => t.paused() && !t.state().is_terminal(),
            (StateArg::Queued, None) => {
                (t.queued().is_some() || render::throttled_until(t).is_some()) && !t.state().is_terminal()
            }
            (_, None) => !t.state().is_terminal() && t.deadline().is_some_and(|d| d < now),
        })
        .filter(|t| filter.workflow.as_ref().is_none_or(|w| *w == t.workflow))
        .filter(|t| {
            filter.agent.as_ref().is_none_or(|a| at_agent(t, render::workflow_of(&ctx.definitions, t), a))
        })
        .filter(|t| since.is_none_or(|s| t.updated_at >= s))
        .collect();
    let more = tasks.len() > filter.limit || read_full;
    tasks.truncate(filter.limit);
    Ok(Selection { tasks, more })
}

/// Whether the listing of `state` picks from what it reads (up to `LIVE_WINDOW`) rather
/// than reading only what it returns: a filter its index cannot apply.
pub fn narrowed(state: StateArg, filter: &Filter) -> bool {
    filter.workflow.is_some()
        || filter.agent.is_some()
        || (!state.from_own_index() && filter.since.is_some())
        || matches!(state, StateArg::Processed | StateArg::Compensated)
}

/// `--agent`'s name checked against the definitions: the steps' agents come from them,
/// so a name they do not hold would select nothing but the tasks in its gate, silently.
fn known_agent(definitions: &Definitions, from: &str, agent: &str) -> Result<(), TasksError> {
    if definitions.agents.contains_key(agent) {
        return Ok(());
    }
    let names: Vec<&str> = definitions.agents.keys().map(String::as_str).collect();
    Err(TasksError::Usage(format!(
        "--agent {agent:?}: no such agent in {from} (its agents: {}); pass the definition file the deployment runs (--workflows FILE or {})",
        names.join(", "),
        super::WORKFLOWS_VAR
    )))
}

/// Whether the task's current step runs on `agent` (at a parallel stage, any branch of
/// it), or the task waits in `agent`'s gate. Without its workflow, only the latter.
pub fn at_agent(task: &TaskRecord, wf: Option<&sas::domain::Workflow>, agent: &str) -> bool {
    task.queued().is_some_and(|q| sas::domain::gate::agent_of_gate(&q.agent) == agent)
        || wf.is_some_and(|wf| wf.together(task.step).any(|i| wf.step(i).is_some_and(|s| s.agent == agent)))
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
        match &args.filter.agent {
            Some(agent) => println!("{} task(s) {} at agent {agent}", with_wf.len(), args.state.as_str()),
            None => println!("{} task(s) {}", with_wf.len(), args.state.as_str()),
        }
    }
    if selection.more {
        eprintln!(
            "sasctl: more tasks may match than these {}: raise --limit (up to 1000) or narrow with --since",
            selection.tasks.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{Policy, ProcessState, Step, Workflow};

    #[test]
    fn a_task_is_at_the_agent_of_its_current_step_or_of_the_gate_it_waits_in() {
        let wf = Workflow::new(
            "w",
            vec![Step::compensable("reserve", "inventory", "release"), Step::pivot("charge", "payment")],
        );
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        assert!(at_agent(&t, Some(&wf), "inventory"));
        assert!(!at_agent(&t, Some(&wf), "payment"));
        assert!(!at_agent(&t, None, "inventory"), "without its workflow, its steps' agents are unknown");
        let queued = t.queue("payment", 3, Timestamp(1), &Policy::default()).unwrap().next;
        assert!(at_agent(&queued, None, "payment"));
    }

    #[test]
    fn an_agent_the_definitions_do_not_name_is_refused_with_the_names_they_do() {
        let d = Definitions::example();
        assert!(known_agent(&d, "x.json", "payment").is_ok());
        assert_eq!(
            known_agent(&d, "x.json", "paymnt").unwrap_err().to_string(),
            "--agent \"paymnt\": no such agent in x.json (its agents: inventory, orders, payment, shipping); pass the definition file the deployment runs (--workflows FILE or SAS_WORKFLOWS)"
        );
    }
}
