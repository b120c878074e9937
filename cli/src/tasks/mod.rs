//! `sasctl tasks`: an operator's view of a deployment's tasks and the actions on them.
//!
//! - `list` selects tasks through the table's indexes, never a Scan (`list.rs`);
//! - `show` prints one task's record and timeline, and what can be done with it (`show.rs`);
//! - `resubmit`, `compensate`, `cancel`, `pause` and `resume` act on one task, or on a listing's tasks in
//!   bulk (`act.rs`), each through the same handler the functions use
//!   (`sas::handlers::operate`): a decision on a fresh read and one conditional write, so
//!   an action that raced anything else changes the task at most once;
//! - `complete`, `fail` and `heartbeat` give a callback step the outside's word with its
//!   token (`callback.rs`), through the callback queue's own handler
//!   (`sas::handlers::complete`).
//!
//! Text and JSON output: `render/` (its `mod.rs` lists its files), which depends on none
//! of the commands: they pass it what they read, and the time.

pub(crate) mod act;
pub mod callback;
mod list;
pub(crate) mod render;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sas::adapters::aws::DynamoStore;
use sas::config::TableNames;
use sas::domain::{Definitions, OrderId, Policy, ProcessState};

use crate::args::{duration, non_empty, whole};
use crate::deployment::{Deployment, DeploymentArgs, DeploymentError, aws_reason};

pub use list::{Selection, narrowed, now, select};

/// Read when --workflows is not given.
pub const WORKFLOWS_VAR: &str = "SAS_WORKFLOWS";
/// Read when --due-shards is not given.
pub const DUE_SHARDS_VAR: &str = "SAS_DUE_SHARDS";

/// `sasctl tasks ...`.
#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// List tasks in a state: a table, or one JSON object per task.
    ///
    /// Never scans the table. `--state error` (the default) is one Query of the sparse
    /// error index, which holds only tasks in Error, newest first: it reads only what it
    /// shows (with --workflow, up to 1000 to pick from). The live states (pending,
    /// processing, waiting, compensating, stuck) are Queries of the due index (one per
    /// shard) and one consistent read per live task (BatchGetItem, 100 a request), oldest
    /// deadline first, of at most 1000 live tasks; `stuck` is a
    /// live task whose deadline has passed (the supervisor has not recovered it yet).
    /// A waiting task's STATE says what it waits for: a timer until its wake time, or a
    /// callback and when its heartbeat or completion is due (with --json, `waits_for`).
    /// A task at a parallel stage has the stage's name as its STEP, and how many of its
    /// branches are done (with --json, `stage`); one at a map step, the map's name and
    /// how many of its items are done, or undone while it undoes them (with --json, `map`).
    ///
    /// `--agent NAME` keeps the tasks whose current step (or a branch of its stage) runs
    /// on agent NAME, by the definition file, or that wait in NAME's gate: a filter on
    /// what the index read gives, like --workflow, not a query of its own.
    List(ListArgs),
    /// Show one task: its state, step, lease and deadline, what a waiting task waits for
    /// (a timer's wake time; a callback's attempt, start, timeout, heartbeats and next
    /// due), failures, outputs (with --json, each with its value), last error, its
    /// timeline (who did what, when and why) and the commands that apply to it.
    ///
    /// At a parallel stage (and in Error or undoing after one), the stage and its
    /// branches side by side: each branch's step, attempt, dispatches, failures, outcome
    /// and complete-by. In the timeline a stage's entries have a lane per branch: `*`
    /// marks the branches an entry is about (a branch's own success, refusal or undo; the
    /// stage's claim and retry, of the branches not yet succeeded; an operator's action,
    /// of all), `|` the others.
    ///
    /// At a map step (and in Error or undoing after one), how far the map is: its items,
    /// cap, how many are done, refused, in flight and undone; then only the items worth a
    /// look (in flight, to retry, in doubt, refused, undone, the one being undone), at
    /// most 20 rows, and how many succeeded or not yet run are not listed (with --json,
    /// `map`, listing every such item).
    Show(ShowArgs),
    /// Send a task in Error forward again from its failed step (or an earlier one, with
    /// --from-step), keeping what is done; or every task of a listing (--state error).
    ///
    /// Each action is a decision on a fresh read of the task and one conditional write,
    /// then a Schedule message to the scheduler queue and a status to the order's
    /// reply_to: exactly what the deployment's own functions do.
    Resubmit(ResubmitArgs),
    /// Undo the completed steps of a task in Error, newest first (or resume an undo that
    /// stopped); or of every task of a listing (--state error).
    Compensate(ActArgs),
    /// Stop a live task and undo what it may have done; or every task of a listing (a
    /// live --state). An attempt in flight loses its lease; the undo waits until it is over.
    Cancel(ActArgs),
    /// Hold a live task where it is; or every task of a listing (a live --state). Nothing
    /// new is dispatched, forward or undo: a step already running finishes and its reply
    /// is applied, a timer still wakes and a callback's completion still lands, and then
    /// the task waits, off the supervisor's sweep, counting no failure, until resumed.
    Pause(ActArgs),
    /// Let a paused task go on from where it stopped; or every paused task of a listing
    /// (--state paused).
    Resume(ActArgs),
    /// Complete a callback step with success, by its token: the step's output is
    /// --output (or --output-file) and the task goes on to its next step.
    ///
    /// TOKEN is the callback token the step's agent request carried (give - to read it
    /// from stdin, out of shell history); it is never printed whole. The completion goes
    /// through the callback queue's own handler: the token's fence on a fresh read (the
    /// task still waits on the token's step and attempt, the token is the one issued, the
    /// callback is not yet due), then one conditional write. So a token completes its
    /// attempt at most once, and an old, forged or late one changes nothing. Prints one
    /// line (the order, step and attempt, and the move); a refusal is one line on stderr
    /// with its reason (with --json, one object on stdout either way).
    ///
    /// Without the token, an operator names the step: --order ORDER --step NAME --reason
    /// TEXT. The same decision, fenced on the record (the task waits on that step's
    /// callback, not yet due) and recorded in its timeline with your identity and the
    /// reason; --dry-run says what it would do first.
    Complete(callback::CompleteArgs),
    /// Fail a callback step by its token, with --reason: as the step's agent refusing it
    /// (the step had no effect); the task's failure rules decide what follows
    /// (compensation, or Error and an operator alert).
    ///
    /// TOKEN as for `complete` (- reads it from stdin), or --order and --step as for
    /// `complete` (the reason is then also the timeline's note). One conditional write
    /// (through the callback queue's own handler, by token; as an operator's act, by
    /// hand); a step's wait ends at most once.
    Fail(callback::FailArgs),
    /// Tell a callback step its outside party is still working, by its token: the step's
    /// next heartbeat is due one heartbeat interval from now (never past its timeout).
    ///
    /// TOKEN as for `complete` (- reads it from stdin). Prints when the next heartbeat or
    /// the completion is due.
    Heartbeat(callback::HeartbeatArgs),
}

/// What every `tasks` command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// The definition file the deployment runs (step names, and the decisions of the
    /// actions need the task's workflow). Default: the built-in examples/workflows.json.
    #[arg(long, value_name = "FILE", env = WORKFLOWS_VAR)]
    pub workflows: Option<PathBuf>,
    /// Shards of the due index: the stack's DueShards parameter, which no stack output
    /// tells (1 to 1000; default 4, the template's and the functions' default). Only the
    /// live listings use it.
    #[arg(long, value_name = "N", env = DUE_SHARDS_VAR, default_value_t = sas::config::DEFAULT_DUE_SHARDS,
          value_parser = whole::<u32>("--due-shards", 1, sas::config::MAX_DUE_SHARDS.into()))]
    pub due_shards: u32,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// The states `--state` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateArg {
    Error,
    Compensating,
    Processing,
    Pending,
    /// A timer step waiting for its time, or a callback step for its outside party.
    Waiting,
    /// Live, with its deadline passed.
    Stuck,
    /// Live and paused by an operator (in any live state).
    Paused,
    /// Pending or Compensating, waiting for a place in its agent's gate (flow control),
    /// or for the end of a Retry-After pause its agent's service asked for (throttled).
    Queued,
    /// Processed or Compensated, newest first: from the finished index of a deployment
    /// that keeps one (template parameter ListFinished; `sasctl up` always does).
    Finished,
    Processed,
    Compensated,
}

impl StateArg {
    pub fn as_str(self) -> &'static str {
        match self {
            StateArg::Error => "error",
            StateArg::Compensating => "compensating",
            StateArg::Processing => "processing",
            StateArg::Pending => "pending",
            StateArg::Waiting => "waiting",
            StateArg::Stuck => "stuck",
            StateArg::Paused => "paused",
            StateArg::Queued => "queued",
            StateArg::Finished => "finished",
            StateArg::Processed => "processed",
            StateArg::Compensated => "compensated",
        }
    }

    fn state(self) -> Option<ProcessState> {
        match self {
            StateArg::Error => Some(ProcessState::Error),
            StateArg::Compensating => Some(ProcessState::Compensating),
            StateArg::Processing => Some(ProcessState::Processing),
            StateArg::Pending => Some(ProcessState::Pending),
            StateArg::Waiting => Some(ProcessState::Waiting),
            StateArg::Processed => Some(ProcessState::Processed),
            StateArg::Compensated => Some(ProcessState::Compensated),
            StateArg::Stuck | StateArg::Paused | StateArg::Queued | StateArg::Finished => None,
        }
    }

    /// Listed from an index that holds nothing else, newest first (Error's, or the
    /// finished one), rather than picked from the live tasks.
    pub fn from_own_index(self) -> bool {
        matches!(self, StateArg::Error | StateArg::Finished | StateArg::Processed | StateArg::Compensated)
    }
}

/// `sasctl tasks list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// Which tasks.
    #[arg(long, value_enum, default_value = "error")]
    pub state: StateArg,
    #[command(flatten)]
    pub filter: Filter,
    #[command(flatten)]
    pub common: Common,
}

/// Narrowing a listing.
#[derive(Debug, Clone, clap::Args)]
pub struct Filter {
    /// Only tasks of this workflow.
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,
    /// Only tasks whose current step runs on this agent, or that wait in its gate.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Only tasks changed this recently: 90s, 15m, 2h, 3d.
    #[arg(long, value_name = "AGE", value_parser = duration("--since"))]
    pub since: Option<Duration>,
    /// Tasks at most (1 to 1000).
    #[arg(long, default_value_t = 50, value_parser = whole::<usize>("--limit", 1, 1_000))]
    pub limit: usize,
}

/// `sasctl tasks show`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// The task's id (its order's order_id).
    pub id: String,
    #[command(flatten)]
    pub common: Common,
}

/// `sasctl tasks resubmit`.
#[derive(Debug, Clone, clap::Args)]
pub struct ResubmitArgs {
    /// Start again at this step (0 is the first) instead of the failed one: the steps
    /// from it on run again. Never after the failed step.
    #[arg(long, value_name = "N", value_parser = whole::<u32>("--from-step", 0, 999))]
    pub from_step: Option<u32>,
    #[command(flatten)]
    pub act: ActArgs,
}

/// One task by its id, or the tasks of a listing (`--state`), and why.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["id", "state"])))]
pub struct ActArgs {
    /// The task's id (its order's order_id). Or give --state to act on a listing's tasks.
    pub id: Option<String>,
    /// Act on every task `tasks list --state STATE` selects (with --workflow, --agent,
    /// --since, --limit), at most --rate a second, with a progress bar and a summary.
    #[arg(long, value_enum, conflicts_with = "id")]
    pub state: Option<StateArg>,
    /// Why: recorded in each task's timeline with who acted (required).
    #[arg(long, value_name = "TEXT", required = true, value_parser = non_empty("--reason"))]
    pub reason: String,
    /// Change nothing: print what the task would come to (exit 1 if the action would be
    /// refused), or with --state what each task would come to, and the count.
    #[arg(long)]
    pub dry_run: bool,
    /// With --state: tasks acted on per second at most (1 to 100).
    #[arg(long, value_name = "N", default_value_t = 10, requires = "state",
          value_parser = whole::<u32>("--rate", 1, 100))]
    pub rate: u32,
    #[command(flatten)]
    pub filter: Filter,
    #[command(flatten)]
    pub common: Common,
}

/// Why a `tasks` command stopped. Each displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TasksError {
    #[error(transparent)]
    Deployment(#[from] DeploymentError),
    #[error("{0}")]
    Definitions(String),
    #[error("ID {id:?}: {why}")]
    BadId { id: String, why: String },
    #[error("table {table} does not exist at {at}: check --stack or --prefix (or --table), and the region")]
    NoTable { table: String, at: String },
    #[error("{doing} at {at} failed: {reason}")]
    Aws { doing: String, at: String, reason: String },
    #[error("reading the state table {table}: {reason}")]
    Store { table: String, reason: String },
    #[error(
        "task {id} runs workflow {workflow:?} v{version}, which {file} does not define: pass the definition file the deployment runs (--workflows FILE or {WORKFLOWS_VAR})"
    )]
    UnknownWorkflow { id: String, workflow: String, version: u32, file: String },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Config(String),
}

/// A deployment's table, read through the store the functions use.
pub struct Context {
    pub deployment: Deployment,
    pub store: Arc<DynamoStore>,
    pub table: String,
    pub definitions: Definitions,
    /// Where the definitions came from, for messages.
    pub definitions_from: String,
    pub common: Common,
}

impl Context {
    /// Finds the deployment and checks its table is there (one DescribeTable), so a
    /// wrong name is one line naming it rather than a failed query.
    pub async fn connect(common: &Common) -> Result<Context, TasksError> {
        let definitions =
            crate::workflows::load(common.workflows.as_deref()).map_err(TasksError::Definitions)?;
        let definitions_from = crate::workflows::source_name(common.workflows.as_deref());
        let deployment = common.deployment.resolve().await?;
        let table = deployment.table()?.to_owned();
        let dynamodb = aws_sdk_dynamodb::Client::new(deployment.sdk_config());
        let described = match dynamodb.describe_table().table_name(&table).send().await {
            Ok(d) => d,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
                return Err(TasksError::NoTable { table, at: deployment.at().to_owned() });
            }
            Err(e) => {
                return Err(TasksError::Aws {
                    doing: format!("reading table {table} (DynamoDB DescribeTable)"),
                    at: deployment.at().to_owned(),
                    reason: aws_reason(&e),
                });
            }
        };
        // A deployment lists finished orders exactly when its table has the finished
        // index (template.yaml's ListFinished creates both): a task an action ends then
        // goes into it, as the functions' own finished tasks do.
        let list_finished = described.table().map(|t| t.global_secondary_indexes()).is_some_and(|gsis| {
            gsis.iter().any(|g| g.index_name() == Some(sas::config::DEFAULT_FINISHED_INDEX))
        });
        // The index names are the template's (its DueIndexName and ErrorIndexName
        // outputs say so too); the shard count is a parameter no output tells.
        // A task an action ends (a cancel with nothing to undo) expires as the
        // functions' own finished tasks do: the stack's RetentionDays, else
        // SAS_RETENTION_DAYS, else the template's default.
        let retention_days = deployment
            .parameter("RetentionDays")
            .map(str::to_owned)
            .or_else(|| std::env::var("SAS_RETENTION_DAYS").ok())
            .and_then(|d| d.trim().parse::<u32>().ok())
            .unwrap_or(sas::config::DEFAULT_RETENTION_DAYS);
        let mut tables = TableNames::new(table.clone())
            .with_retention_days(retention_days)
            .with_list_finished(list_finished);
        tables.due_shards = common.due_shards;
        let store = Arc::new(DynamoStore::new(dynamodb, tables));
        Ok(Context { deployment, store, table, definitions, definitions_from, common: common.clone() })
    }

    pub fn store_error(&self, e: sas::ports::StoreError) -> TasksError {
        if let sas::ports::StoreError::NotIndexed(why) = e {
            return TasksError::Usage(format!("table {}: {why}", self.table));
        }
        TasksError::Store { table: self.table.clone(), reason: crate::endpoint::one_line(&e.to_string()) }
    }

    /// The task's workflow in these definitions, or the error that asks for the file the
    /// deployment runs.
    pub fn workflow_of(&self, task: &sas::domain::TaskRecord) -> Result<&sas::domain::Workflow, TasksError> {
        render::workflow_of(&self.definitions, task).ok_or_else(|| TasksError::UnknownWorkflow {
            id: task.order_id.to_string(),
            workflow: task.workflow.clone(),
            version: task.workflow_version,
            file: self.definitions_from.clone(),
        })
    }

    /// One task, read consistently.
    pub async fn task(&self, id: &OrderId) -> Result<Option<sas::domain::TaskRecord>, TasksError> {
        use sas::ports::StateStore as _;
        self.store.task(id).await.map_err(|e| self.store_error(e))
    }
}

/// An order id as typed.
pub fn order_id(id: &str) -> Result<OrderId, TasksError> {
    OrderId::parse(id).map_err(|e| TasksError::BadId { id: id.to_owned(), why: e.to_string() })
}

/// The policy the decisions are made with: the functions' defaults, or their tuning
/// variables when set here as the deployment sets them (REPLY_GRACE_MS decides how long a
/// cancelled attempt's undo waits; PENDING_TIMEOUT_MS when the supervisor looks again).
pub fn policy() -> Result<Policy, TasksError> {
    policy_from(&|name| std::env::var(name).ok())
}

fn policy_from(env: &dyn Fn(&str) -> Option<String>) -> Result<Policy, TasksError> {
    let mut policy = Policy::default();
    let day = 24 * 3600 * 1000;
    for (name, field, min) in [
        ("REPLY_GRACE_MS", &mut policy.reply_grace_ms, 0),
        ("PENDING_TIMEOUT_MS", &mut policy.pending_timeout_ms, 1),
    ] {
        if let Some(raw) = env(name).filter(|v| !v.trim().is_empty()) {
            *field = raw.trim().parse::<u64>().ok().filter(|v| (min..=day).contains(v)).ok_or_else(|| {
                TasksError::Config(format!("{name}={raw:?} is not a whole number from {min} to {day}"))
            })?;
        }
    }
    Ok(policy)
}

/// Runs a `tasks` command.
pub async fn run(command: TasksCommand) -> Result<ExitCode, TasksError> {
    match command {
        TasksCommand::List(args) => list::run(&args).await,
        TasksCommand::Show(args) => show::run(&args).await,
        TasksCommand::Resubmit(args) => {
            act::run(sas::domain::Act::Resubmit { from_step: args.from_step }, &args.act).await
        }
        TasksCommand::Compensate(args) => act::run(sas::domain::Act::Compensate, &args).await,
        TasksCommand::Cancel(args) => act::run(sas::domain::Act::Cancel, &args).await,
        TasksCommand::Pause(args) => act::run(sas::domain::Act::Pause, &args).await,
        TasksCommand::Resume(args) => act::run(sas::domain::Act::Resume, &args).await,
        TasksCommand::Complete(args) => {
            let of = callback::CompletionOf::Success {
                output: args.output.as_deref(),
                file: args.output_file.as_deref(),
            };
            callback::run_step(callback::Verb::Complete, of, args.reason.as_deref(), &args.step).await
        }
        TasksCommand::Fail(args) => {
            let of = callback::CompletionOf::Failure { reason: &args.reason };
            callback::run_step(callback::Verb::Fail, of, Some(&args.reason), &args.step).await
        }
        TasksCommand::Heartbeat(args) => {
            callback::run(callback::Verb::Heartbeat, callback::CompletionOf::Heartbeat, &args.token).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_takes_the_functions_tuning_variables() {
        let none = |_: &str| None;
        assert_eq!(policy_from(&none).unwrap(), Policy::default());
        let set = |name: &str| (name == "REPLY_GRACE_MS").then(|| "500".to_owned());
        assert_eq!(policy_from(&set).unwrap().reply_grace_ms, 500);
        let bad = |name: &str| (name == "PENDING_TIMEOUT_MS").then(|| "soon".to_owned());
        assert_eq!(
            policy_from(&bad).unwrap_err().to_string(),
            "PENDING_TIMEOUT_MS=\"soon\" is not a whole number from 1 to 86400000"
        );
    }
}
