use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sasctl::dev::{self, DevOptions};
use sasctl::remote_sim::RemoteFaults;
use sasctl::report::Report;

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
    Dev(DevArgs),
    /// Benchmarks: throughput, supervisor sweep cost, recovery latency, cost per order.
    Bench(sasctl::bench::BenchArgs),
    /// Workflow definition files: check one, or print their JSON Schema.
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
}

#[derive(Subcommand)]
enum WorkflowsCommand {
    /// Check a definition file: exit 0 when it can run (warnings are printed), 1 with one
    /// line per problem (naming the workflow, step and field) when it cannot.
    Validate {
        /// The definition file (JSON), e.g. examples/workflows.json.
        file: std::path::PathBuf,
        /// One JSON object per problem, then a summary object.
        #[arg(long)]
        json: bool,
    },
    /// Print the definition file's JSON Schema (docs/workflows.schema.json is this output).
    Schema,
}

#[derive(Args)]
struct DevArgs {
    /// Orders to send.
    #[arg(long, default_value_t = 1_000)]
    orders: usize,
    /// Workflow every order runs (a name from the definition file).
    #[arg(long, default_value = "single-step")]
    workflow: String,
    /// Definition file of the workflows and agents (default: the built-in
    /// examples/workflows.json). Every agent calls the simulated remote service.
    #[arg(long, value_name = "FILE")]
    workflows: Option<std::path::PathBuf>,
    /// Probability a remote call fails transiently (503).
    #[arg(long, default_value_t = 0.1)]
    failure_rate: f64,
    /// Probability a remote call is refused for good (422).
    #[arg(long, default_value_t = 0.01)]
    permanent_rate: f64,
    /// Probability a remote call never answers.
    #[arg(long, default_value_t = 0.02)]
    hang_rate: f64,
    /// Remote service time per answered call: uniform up to this, in ms.
    #[arg(long, default_value_t = 2)]
    latency_ms: u64,
    /// Probability a forward step's success answers an output too large to keep (the
    /// task gives up on that step, its outcome in doubt).
    #[arg(long, default_value_t = 0.0)]
    bad_output_rate: f64,
    /// One agent's service fails differently from the rest: NAME=KIND:RATE[,KIND:RATE],
    /// kinds fail, refuse, undo-refuse, hang, bad-output (0 to 1) and latency (ms), e.g.
    /// `--agent-fault payment=fail:0.3`. Repeatable.
    #[arg(long, value_name = "NAME=KIND:RATE")]
    agent_fault: Vec<sasctl::agent_fault::AgentFault>,
    /// Share of orders sent twice.
    #[arg(long, default_value_t = 0.05)]
    duplicate_rate: f64,
    /// Bad messages to send (malformed, invalid, conflicting).
    #[arg(long, default_value_t = 12)]
    malformed: usize,
    /// Probability an internal queue delivers a message twice.
    #[arg(long, default_value_t = 0.01)]
    queue_duplicate_rate: f64,
    /// A claim's complete-by is this far after the claim, in ms.
    #[arg(long, default_value_t = 1_000)]
    step_timeout_ms: u64,
    /// How often the supervisor runs, in ms.
    #[arg(long, default_value_t = 250)]
    supervisor_period_ms: u64,
    /// Failures before a task is given up on.
    #[arg(long, default_value_t = 5)]
    failure_threshold: u32,
    /// Concurrent batches (invocations) per function.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// The longest a send waits to go out in one request with its invocation's others, in ms.
    #[arg(long, default_value_t = sas::config::DEFAULT_SEND_MAX_HOLD_MS)]
    send_max_hold_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop waiting after this many seconds.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Run on the real adapters (DynamoDB, SQS, SNS) against this AWS endpoint, e.g.
    /// moto or LocalStack at http://127.0.0.1:4566, in fresh resources of its own.
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
}

fn check_rate(name: &str, v: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&v) { Ok(()) } else { Err(format!("--{name} must be between 0 and 1, got {v}")) }
}

async fn run_dev(args: DevArgs) -> Result<ExitCode, String> {
    for (name, v) in [
        ("failure-rate", args.failure_rate),
        ("permanent-rate", args.permanent_rate),
        ("hang-rate", args.hang_rate),
        ("duplicate-rate", args.duplicate_rate),
        ("queue-duplicate-rate", args.queue_duplicate_rate),
        ("bad-output-rate", args.bad_output_rate),
    ] {
        check_rate(name, v)?;
    }
    if args.failure_rate + args.permanent_rate + args.hang_rate >= 1.0 {
        return Err("--failure-rate + --permanent-rate + --hang-rate must stay below 1".into());
    }
    let definitions = match &args.workflows {
        None => sas::domain::Definitions::example(),
        Some(file) => {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            sas::domain::Definitions::parse(&text).map_err(|e| {
                format!("{} is not valid (sasctl workflows validate shows why): {e}", file.display())
            })?
        }
    };
    let workflows = &definitions.workflows;
    if workflows.get(&args.workflow).is_none() {
        return Err(format!(
            "unknown workflow {:?}: the file defines {}",
            args.workflow,
            workflows.names().join(", ")
        ));
    }
    if args.step_timeout_ms < 50 || args.concurrency == 0 || args.failure_threshold == 0 {
        return Err("--step-timeout-ms must be >= 50, --concurrency and --failure-threshold >= 1".into());
    }
    let faults = RemoteFaults {
        transient: args.failure_rate,
        permanent: args.permanent_rate,
        undo_permanent: 0.0,
        hang: args.hang_rate,
        latency_max_ms: args.latency_ms,
        bad_output: args.bad_output_rate,
    };
    let agents: Vec<&str> = definitions.agents.keys().map(String::as_str).collect();
    let agent_faults = sasctl::agent_fault::per_agent(&args.agent_fault, faults, &agents)?;
    let options = DevOptions {
        orders: args.orders,
        definitions,
        workflow: args.workflow,
        faults,
        agent_faults,
        duplicate_rate: args.duplicate_rate,
        malformed: args.malformed,
        queue_duplicate_rate: args.queue_duplicate_rate,
        step_timeout_ms: args.step_timeout_ms,
        supervisor_period_ms: args.supervisor_period_ms,
        failure_threshold: args.failure_threshold,
        concurrency: args.concurrency,
        batch_size: 10,
        send_max_hold_ms: args.send_max_hold_ms,
        seed: args.seed,
        max_runtime: Duration::from_secs(args.max_seconds),
    };
    let bar = ProgressBar::new(options.orders as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} terminal  {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let progress = |p: &dev::Progress| {
        bar.set_position(p.terminal as u64);
        let states: Vec<String> = p.by_state.iter().map(|(s, n)| format!("{} {n}", s.as_str())).collect();
        bar.set_message(states.join(" "));
    };
    let outcome = match &args.endpoint_url {
        None => dev::run(options, progress).await.map_err(|e| format!("dev run failed to start: {e}"))?,
        Some(url) => sasctl::endpoint::run(options, url, progress)
            .await
            .map_err(|e| format!("dev run against {url} failed: {e}"))?,
    };
    bar.finish_and_clear();
    let violations = sasctl::invariants::check(&outcome);
    let report = Report::new(&outcome, &violations);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        println!("{}", report.render());
    }
    Ok(if violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[tokio::main]
async fn main() -> ExitCode {
    // Die quietly when the reader of stdout goes away (`sasctl workflows schema | head`),
    // as command-line tools do, instead of panicking on a broken pipe.
    // SAFETY: called before any other thread could be writing to stdout.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SAS_LOG").unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .json()
        .init();
    let result = match Cli::parse().command {
        Command::Dev(args) => run_dev(args).await,
        Command::Bench(args) => sasctl::bench::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Workflows(WorkflowsCommand::Validate { file, json }) => {
            sasctl::workflows::validate(&file, json)
        }
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
