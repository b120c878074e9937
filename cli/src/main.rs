use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sasctl",
    version,
    about = "Scheduler Agent Supervisor on AWS Lambda: local runs and operations"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole pipeline in-process on the embedded backend against a simulated
    /// remote service with injected faults; exit non-zero if any invariant is violated.
    ///
    /// The simulated service also plays the outside party of callback steps: it answers
    /// their calls at once and completes them later on the callback queue, with faults
    /// of its own (--callback-*). The report gives orders by final state, recoveries,
    /// alerts, the remote service's ledger, timers and callbacks (when the workflow has
    /// them) and latencies, each figure with what it counts (--json: one object).
    Dev(sasctl::dev_command::DevArgs),
    /// Run the four functions continuously against an AWS endpoint (moto, LocalStack)
    /// until Ctrl-C: orders sent to its queue run for real.
    ///
    /// The state table, the orders, scheduler, agent and callback queues (each with its
    /// dead-letter queue, redrive after 5 receives), the status queue and the alerts
    /// topic are created under --prefix if missing, and found if not: a second `up` with the same prefix carries on with them, and `up` never
    /// removes them. Each function is configured as its Lambda binary is (the functions'
    /// tuning variables, e.g. STEP_TIMEOUT_MS and FAILURE_THRESHOLD, are read from the
    /// environment as the functions read them). The orders, scheduler, agent and callback
    /// queues are pumped as Lambda's SQS event source mapping does it: receives of up to 10,
    /// each batch to its handler, the messages it did not report as failed deleted, the
    /// failed ones left to come back after the visibility timeout (the callback queue's to
    /// the scheduler's callback handler, which keeps a refused completion in the callback
    /// DLQ with its reason). The supervisor fires on a timer. HTTP agents call their URLs
    /// for real; `queue` agents' requests go to their queues, for a worker of yours to
    /// serve (docs/WORKERS.md): `up` does not.
    ///
    /// Ctrl-C or SIGTERM stops receiving, lets the batches in flight finish (their
    /// deletes included), prints a summary and exits 0; a second Ctrl-C quits at once,
    /// and what was in flight comes back after its queue's visibility timeout.
    Up(sasctl::up_command::UpArgs),
    /// Benchmarks: throughput, supervisor sweep cost, recovery latency, cost per order.
    Bench(sasctl::bench::BenchArgs),
    /// Workflow definition files: check one, or print their JSON Schema.
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// A deployment's dead-letter queues: list what they keep, move it back to its queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// A deployment's tasks: list them by state, show one with its timeline, resubmit,
    /// compensate or cancel one or a listing's worth (who acts and why are recorded), and
    /// complete, fail or heartbeat a callback step by its token.
    #[command(subcommand)]
    Tasks(sasctl::tasks::TasksCommand),
    /// A deployment's agents with limits (max_in_flight, max_per_second): the places held,
    /// the tickets waiting and any Retry-After pause, for all of them or one.
    #[command(subcommand)]
    Agents(sasctl::agents::AgentsCommand),
    /// A local web console over a deployment: its tasks by state, each task's workflow
    /// drawn with its steps' outcomes and its timeline, the waiting tasks, the limited
    /// agents and the DLQs, and the operator actions with a dry run first.
    ///
    /// Takes the flags and environment of `sasctl tasks` (--stack or --prefix,
    /// --endpoint-url, --workflows, ...), reads what `tasks list|show`, `agents list` and
    /// `dlq list` read, and acts as `tasks resubmit|compensate|cancel|pause|resume` and
    /// `tasks complete|fail --order --step` do: each action needs a reason and is recorded
    /// with your caller identity. Listens on 127.0.0.1 only (--port, default a free one)
    /// and prints the URL, http://127.0.0.1:PORT/?token=..., with --json as {"url": ...}:
    /// every request must carry that token (the first visit sets a cookie; an action's
    /// form carries it), anything else is 403. A page reads the deployment only when it is
    /// asked for; an open page asks again every 2 s while it is visible. A DLQ is read
    /// (received, as `dlq list` does) only when its page is opened. Ctrl-C stops it.
    Console(sasctl::console::ConsoleArgs),
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Show the messages a DLQ keeps (id, first seen, receives, sas-reason, body), leaving
    /// them in it.
    ///
    /// Reading a queue means receiving: each message listed is hidden from other
    /// consumers for a few seconds at most (it is made visible again as soon as the
    /// listing ends) and its receive count goes up by one.
    List(sasctl::dlq::ListArgs),
    /// Move a DLQ's messages back to the queue they came from (after fixing the cause).
    ///
    /// The scheduler, agent and callback DLQs go back by SQS's message move task where the
    /// endpoint has it. Otherwise (moto), and for the orders DLQ (or one named by URL) unless
    /// --include-cancels, by hand: receive, send to the source queue and delete from the
    /// DLQ, 10 at a time, a message deleted only after its send succeeded, so that
    /// apps' cancels can stay behind. Messages kept with a sas-reason (rejected input)
    /// are rejected again unless that cause was fixed; by hand the sas-reason and
    /// sas-source attributes are dropped (a move task keeps every attribute). A
    /// redriven order arrives under the identity that sent it again, not its app's.
    /// Moves about as many messages as the DLQ holds when it starts.
    Redrive(sasctl::dlq::RedriveArgs),
}

#[derive(Subcommand)]
enum WorkflowsCommand {
    /// Check a definition file: exit 0 when it can run (warnings are printed), 1 with one
    /// line per problem (naming the workflow, step and field) when it cannot.
    Validate {
        /// The definition file (JSON), e.g. examples/workflows.json.
        file: std::path::PathBuf,
        /// The file published before it: versions it holds must not change, new versions
        /// must come after its last.
        #[arg(long, value_name = "FILE")]
        previous: Option<std::path::PathBuf>,
        /// One JSON object per problem, then a summary object.
        #[arg(long)]
        json: bool,
    },
    /// Check a definition file (against --previous) and publish it as a new version of a
    /// Lambda layer; then point the stack's WorkflowsLayerName and WorkflowsLayerVersion at it (no rebuild).
    Publish(sasctl::workflows::PublishArgs),
    /// Print the definition file's JSON Schema (docs/workflows.schema.json is this output).
    Schema,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Die quietly when the reader of stdout goes away (`sasctl workflows schema | head`),
    // as command-line tools do, instead of panicking on a broken pipe.
    // SAFETY: called before any other thread could be writing to stdout.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    {
        use tracing_subscriber::prelude::*;
        let stderr = tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).with_filter(
            tracing_subscriber::EnvFilter::try_from_env("SAS_LOG").unwrap_or_else(|_| "off".into()),
        );
        // `up`'s history file (`sasctl::history`): off until `up` opens it.
        tracing_subscriber::registry().with(stderr).with(sasctl::history::layer()).init();
    }
    let command = sasctl::args::without_blank_env(Cli::command(), &|name| std::env::var_os(name));
    let cli = match command.try_get_matches().and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => match sasctl::args::validation_message(&e).or_else(|| sasctl::args::usage_message(&e)) {
            Some(line) => {
                eprintln!("sasctl: {line}");
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    let result = match cli.command {
        Command::Dev(args) => sasctl::dev_command::run_command(args).await,
        Command::Up(args) => sasctl::up_command::run_command(args).await,
        Command::Bench(args) => sasctl::bench::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Workflows(WorkflowsCommand::Validate { file, previous, json }) => {
            sasctl::workflows::validate(&file, previous.as_deref(), json)
        }
        Command::Workflows(WorkflowsCommand::Publish(args)) => sasctl::workflows::publish(&args).await,
        Command::Dlq(DlqCommand::List(args)) => sasctl::dlq::list(&args).await.map_err(|e| e.to_string()),
        Command::Dlq(DlqCommand::Redrive(args)) => {
            sasctl::dlq::redrive(&args).await.map_err(|e| e.to_string())
        }
        Command::Tasks(command) => sasctl::tasks::run(command).await.map_err(|e| e.to_string()),
        Command::Agents(command) => sasctl::agents::run(command).await.map_err(|e| e.to_string()),
        Command::Console(args) => sasctl::console::run_command(args).await.map_err(|e| e.to_string()),
        Command::Workflows(WorkflowsCommand::Schema) => {
            println!("{}", sasctl::workflows::schema());
            Ok(ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("sasctl: {e}");
        ExitCode::from(2)
    })
}
