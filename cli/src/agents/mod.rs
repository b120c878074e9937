//! `sasctl agents`: the limited agents of a deployment (`max_in_flight`,
//! `max_per_second`) and their gates, as a person needs them to see why work waits.
//!
//! The agents come from the definition file the deployment runs (`--workflows`, as for
//! `sasctl tasks`); each gate is one consistent read of its item (`StateStore::gate`).
//! `show` also finds the task first in line through the waiter note of the lowest waiting
//! ticket and that task's record (a few reads, never a Scan). Text and JSON: `render.rs`.

pub mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use sas::domain::Definitions;
use sas::domain::gate::{Gate, Limits, gates_of};
use sas::ports::StateStore as _;

use crate::deployment::DeploymentArgs;
use crate::tasks::{Common, Context, TasksError, WORKFLOWS_VAR};
use render::{FirstInLine, Seen};

/// Waiting tickets tried, lowest first, to find the task first in line: a ticket whose
/// note has expired or whose task has moved on is passed over.
const FIRST_IN_LINE_TRIES: u64 = 3;

/// `sasctl agents ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AgentsCommand {
    /// One line per agent with limits: its limits, places held, tickets waiting, and any
    /// Retry-After pause.
    ///
    /// For each: max_in_flight and max_per_second, the places held now (calls in flight
    /// and places reserved for tasks let through), the tickets waiting (the queue's
    /// length) and "paused until T" while a Retry-After pause is on. One consistent read of each agent's gate (the state table's `gate#<agent>` item, or
    /// `gate#<agent>@<k>` for each 10 places past 10, added up).
    /// An agent whose gate was never written shows 0 held, 0 waiting. The agents are
    /// those of the definition file (--workflows): pass the one the deployment runs.
    /// With --json, one JSON array of objects.
    List(AgentsArgs),
    /// One agent with limits: who holds its places, the tickets waiting, the task first in
    /// line, any pause.
    ///
    /// Its limits; who holds each place (the task, its attempt and lease, and until when:
    /// a call's place lasts until its complete-by plus the reply grace, so when it began
    /// is not shown); the places reserved for tickets let through and not yet claimed
    /// (since when, and until when); the tickets waiting; the task first in line and how
    /// long it has waited; a pause ("paused until T"). A place whose time has passed is not shown: it holds nothing back. The task first
    /// in line is found through the lowest waiting ticket's waiter note and its record,
    /// never a Scan. An agent the definition file does not name, or names without limits,
    /// is one line on stderr and exit 1.
    Show(ShowAgentArgs),
}

/// What every `agents` command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentsArgs {
    /// JSON on stdout (`list`: one array; `show`: one object).
    #[arg(long)]
    pub json: bool,
    /// The definition file the deployment runs: it names the agents and their limits.
    /// Default: the built-in examples/workflows.json (whose agents have none).
    #[arg(long, value_name = "FILE", env = WORKFLOWS_VAR)]
    pub workflows: Option<PathBuf>,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// `sasctl agents show`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowAgentArgs {
    /// The agent's name, as the definition file's `agents` names it.
    pub name: String,
    #[command(flatten)]
    pub args: AgentsArgs,
}

impl AgentsArgs {
    fn common(&self) -> Common {
        Common {
            json: self.json,
            workflows: self.workflows.clone(),
            due_shards: sas::config::DEFAULT_DUE_SHARDS,
            deployment: self.deployment.clone(),
        }
    }
}

/// The agents of `definitions` that have limits, by name.
pub fn limited(definitions: &Definitions) -> Vec<(String, Limits)> {
    definitions
        .agents
        .iter()
        .filter(|(_, def)| def.limits().any())
        .map(|(name, def)| (name.clone(), def.limits()))
        .collect()
}

/// Why `name` has no gate to show, as one line; `None` when it has limits.
pub fn not_limited(definitions: &Definitions, from: &str, name: &str) -> Option<String> {
    let names: Vec<String> = limited(definitions).into_iter().map(|(n, _)| n).collect();
    let those = if names.is_empty() { "none".to_owned() } else { names.join(", ") };
    match definitions.agents.get(name) {
        Some(def) if def.limits().any() => None,
        Some(_) => Some(format!(
            "agent {name:?} has no limits in {from} (max_in_flight, max_per_second), so no gate; agents with limits: {those}"
        )),
        None => Some(format!(
            "no agent {name:?} in {from} (agents with limits: {those}); pass the definition file the deployment runs (--workflows FILE or {WORKFLOWS_VAR})"
        )),
    }
}

/// The agent's gates that were ever written: one consistent read of each
/// (`gate::gates_of`: one, or one per 10 places).
async fn gates(ctx: &Context, agent: &str, limits: &Limits) -> Result<Vec<Gate>, TasksError> {
    let mut written = Vec::new();
    for name in gates_of(agent, limits) {
        written.extend(ctx.store.gate(&name).await.map_err(|e| ctx.store_error(e))?);
    }
    Ok(written)
}

/// The task holding the lowest waiting ticket whose waiter note and record agree.
async fn first_in_line(ctx: &Context, gate: &Gate) -> Result<Option<FirstInLine>, TasksError> {
    let waiting = (gate.admitted..gate.issued).filter(|t| gate.withdrawn.binary_search(t).is_err());
    for ticket in waiting.take(FIRST_IN_LINE_TRIES as usize) {
        let Some(order) = ctx.store.waiter(&gate.agent, ticket).await.map_err(|e| ctx.store_error(e))? else {
            continue;
        };
        let Some(task) = ctx.task(&order).await? else { continue };
        if let Some(q) = task.queued().filter(|q| q.agent == gate.agent && q.ticket == ticket) {
            return Ok(Some(FirstInLine { ticket, order_id: order.to_string(), since: q.since }));
        }
    }
    Ok(None)
}

/// Every agent with limits and its gates, as `list` shows them (one consistent read of
/// each gate; `sasctl console` shows the same).
pub async fn seen_all(ctx: &Context) -> Result<Vec<Seen>, TasksError> {
    let mut seen = Vec::new();
    for (agent, limits) in limited(&ctx.definitions) {
        let gates = gates(ctx, &agent, &limits).await?;
        seen.push(Seen { agent, limits, gates, first: None });
    }
    Ok(seen)
}

async fn list(args: &AgentsArgs) -> Result<ExitCode, TasksError> {
    let ctx = Context::connect(&args.common()).await?;
    let seen = seen_all(&ctx).await?;
    let now = crate::tasks::now();
    if args.json {
        let all: Vec<_> = seen.iter().map(|s| render::list_json(s, now)).collect();
        println!("{}", serde_json::Value::Array(all));
    } else {
        if !seen.is_empty() {
            print!("{}", render::list_text(&seen, now));
        }
        println!("{} agent(s) with limits", seen.len());
    }
    if seen.is_empty() {
        eprintln!(
            "sasctl: no agent of {} has limits: pass the definition file the deployment runs (--workflows FILE or {WORKFLOWS_VAR})",
            ctx.definitions_from
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(args: &ShowAgentArgs) -> Result<ExitCode, TasksError> {
    let common = args.args.common();
    // Checked before the deployment is looked for: a mistyped name needs no AWS call.
    let definitions = crate::workflows::load(common.workflows.as_deref()).map_err(TasksError::Definitions)?;
    let from = crate::workflows::source_name(common.workflows.as_deref());
    if let Some(why) = not_limited(&definitions, &from, &args.name) {
        eprintln!("sasctl: {why}");
        return Ok(ExitCode::FAILURE);
    }
    let limits = definitions.agents[&args.name].limits();
    let ctx = Context::connect(&common).await?;
    let gates = gates(&ctx, &args.name, &limits).await?;
    // The longest waiting of each gate's first in line.
    let mut first: Option<FirstInLine> = None;
    for g in gates.iter().filter(|g| g.waiting() > 0) {
        if let Some(f) = first_in_line(&ctx, g).await?
            && first.as_ref().is_none_or(|b| f.since < b.since)
        {
            first = Some(f);
        }
    }
    let seen = Seen { agent: args.name.clone(), limits, gates, first };
    let flags = crate::tasks::render::deployment_flags(&common.deployment, common.workflows.as_deref());
    let name = crate::tasks::render::shell_word(&args.name);
    let next = vec![
        format!("sasctl tasks list --state queued --agent {name}{flags}"),
        format!("sasctl tasks list --state processing --agent {name}{flags}"),
    ];
    let now = crate::tasks::now();
    if args.args.json {
        println!("{}", render::show_json(&seen, now, &next));
    } else {
        print!("{}", render::show_text(&seen, now, &next));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs an `agents` command.
pub async fn run(command: AgentsCommand) -> Result<ExitCode, TasksError> {
    match command {
        AgentsCommand::List(args) => list(&args).await,
        AgentsCommand::Show(args) => show(&args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{
      "agents": {"inventory": {}, "payment": {"max_in_flight": 10}, "warehouse": {"max_per_second": 50}},
      "workflows": [{"name": "w", "steps": [
        {"name": "reserve", "agent": "inventory", "compensation": "release"},
        {"name": "charge", "agent": "payment", "compensation": "refund"},
        {"name": "pick", "agent": "warehouse"}]}]
    }"#;

    #[test]
    fn only_agents_with_limits_have_a_gate_to_show() {
        let d = Definitions::parse(FILE).unwrap();
        let names: Vec<_> =
            limited(&d).into_iter().map(|(n, l)| (n, l.max_in_flight, l.max_per_second)).collect();
        assert_eq!(
            names,
            vec![("payment".to_owned(), Some(10), None), ("warehouse".to_owned(), None, Some(50))]
        );
        assert_eq!(not_limited(&d, "f.json", "payment"), None);
        assert_eq!(
            not_limited(&d, "f.json", "inventory").unwrap(),
            "agent \"inventory\" has no limits in f.json (max_in_flight, max_per_second), so no gate; agents with limits: payment, warehouse"
        );
        assert_eq!(
            not_limited(&d, "f.json", "x").unwrap(),
            "no agent \"x\" in f.json (agents with limits: payment, warehouse); pass the definition file the deployment runs (--workflows FILE or SAS_WORKFLOWS)"
        );
    }
}
