use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sasctl::args::{rate, whole};
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
    /// Run the four functions continuously against an AWS endpoint (moto, LocalStack)
    /// until Ctrl-C: orders sent to its queue run for real.
    ///
    /// The state table, the orders, scheduler and agent queues (each with its
    /// dead-letter queue, redrive after 5 receives), the status queue and the alerts
    /// topic are created under --prefix if missing, and found if not: a second `up` with the same prefix carries on with them, and `up` never
    /// removes them. Each function is configured as its Lambda binary is (the functions'
    /// tuning variables, e.g. STEP_TIMEOUT_MS and FAILURE_THRESHOLD, are read from the
    /// environment as the functions read them). The orders, scheduler and agent queues
    /// are pumped as Lambda's SQS event source mapping does it: receives of up to 10,
    /// each batch to its handler, the messages it did not report as failed deleted, the
    /// failed ones left to come back after the visibility timeout. The supervisor fires
    /// on a timer. HTTP agents call their URLs for real; `queue` agents' requests go to
    /// their queues, for a worker of yours to serve (docs/WORKERS.md): `up` does not.
    ///
    /// Ctrl-C or SIGTERM stops receiving, lets the batches in flight finish (their
    /// deletes included), prints a summary and exits 0; a second Ctrl-C quits at once,
    /// and what was in flight comes back after its queue's visibility timeout.
    Up(UpArgs),
    /// Benchmarks: throughput, supervisor sweep cost, recovery latency, cost per order.
    Bench(sasctl::bench::BenchArgs),
    /// Workflow definition files: check one, or print their JSON Schema.
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// A deployment's dead-letter queues: list what they keep, move it back to its queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// A deployment's tasks: list them by state, show one with its timeline, resubmit,
    /// compensate or cancel one or a listing's worth (who acts and why are recorded).
    #[command(subcommand)]
    Tasks(sasctl::tasks::TasksCommand),
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
    /// Uses SQS's message move task where the endpoint has it, and otherwise (moto)
    /// receives, sends to the source queue and deletes from the DLQ, 10 at a time: a
    /// message is deleted only after its send succeeded. Messages kept with a sas-reason
    /// (rejected input) are rejected again unless that cause was fixed; by hand the
    /// sas-reason and sas-source attributes are dropped (a move task keeps every
    /// attribute). Moves about as many messages as the DLQ holds when it starts.
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
    /// Lambda layer; then point the stack's WorkflowsLayerArn at it (no rebuild).
    Publish(sasctl::workflows::PublishArgs),
    /// Print the definition file's JSON Schema (docs/workflows.schema.json is this output).
    Schema,
}

#[derive(Args)]
#[command(allow_negative_numbers = true)]
struct DevArgs {
    /// Orders to send (1 to 10,000,000).
    #[arg(long, default_value_t = 1_000, value_parser = whole::<usize>("--orders", 1, 10_000_000))]
    orders: usize,
    /// Workflow every order runs (a name from the definition file); several, comma
    /// separated, are taken in turn.
    #[arg(long, default_value = "single-step")]
    workflow: String,
    /// Definition file of the workflows and agents (default: the built-in
    /// examples/workflows.json). Every agent calls the simulated remote service.
    #[arg(long, value_name = "FILE")]
    workflows: Option<std::path::PathBuf>,
    /// Orders per second, sent as a steady trickle (default: all at once).
    #[arg(long, value_name = "N", value_parser = whole::<u32>("--rate", 1, 100_000))]
    rate: Option<u32>,
    /// Probability a remote call fails transiently (503), 0 to 1.
    #[arg(long, default_value_t = 0.1, value_parser = rate("--failure-rate"))]
    failure_rate: f64,
    /// Probability a remote call is refused for good (422), 0 to 1.
    #[arg(long, default_value_t = 0.01, value_parser = rate("--permanent-rate"))]
    permanent_rate: f64,
    /// Probability a remote call never answers, 0 to 1. The three rates must add up to
    /// less than 1.
    #[arg(long, default_value_t = 0.02, value_parser = rate("--hang-rate"))]
    hang_rate: f64,
    /// Remote service time per answered call: uniform up to this, in ms (at most 60000).
    #[arg(long, default_value_t = 2, value_parser = whole::<u64>("--latency-ms", 0, 60_000))]
    latency_ms: u64,
    /// Probability a forward step's success answers an output too large to keep (the
    /// task gives up on that step, its outcome in doubt).
    #[arg(long, default_value_t = 0.0, value_parser = rate("--bad-output-rate"))]
    bad_output_rate: f64,
    /// One agent's service fails differently from the rest: NAME=KIND:RATE[,KIND:RATE],
    /// kinds fail, refuse, undo-refuse, hang, bad-output (0 to 1) and latency (ms), e.g.
    /// `--agent-fault payment=fail:0.3`. Repeatable.
    #[arg(long, value_name = "NAME=KIND:RATE")]
    agent_fault: Vec<sasctl::agent_fault::AgentFault>,
    /// Share of orders sent twice, 0 to 1.
    #[arg(long, default_value_t = 0.05, value_parser = rate("--duplicate-rate"))]
    duplicate_rate: f64,
    /// Bad messages to send (malformed, invalid, conflicting), 0 to 1000.
    #[arg(long, default_value_t = 12, value_parser = whole::<usize>("--malformed", 0, 1_000))]
    malformed: usize,
    /// Probability an internal queue delivers a message twice, 0 to 1.
    #[arg(long, default_value_t = 0.01, value_parser = rate("--queue-duplicate-rate"))]
    queue_duplicate_rate: f64,
    /// A claim's complete-by is this far after the claim, in ms (50 to 50000).
    #[arg(long, default_value_t = 1_000,
          value_parser = whole::<u64>("--step-timeout-ms", 50, sas::config::MAX_STEP_TIMEOUT_MS.into()))]
    step_timeout_ms: u64,
    /// How often the supervisor runs, in ms (1 to 60000).
    #[arg(long, default_value_t = 250, value_parser = whole::<u64>("--supervisor-period-ms", 1, 60_000))]
    supervisor_period_ms: u64,
    /// Failures of a step before its task is given up on (1 to 1000).
    #[arg(long, default_value_t = 5, value_parser = whole::<u32>("--failure-threshold", 1, 1_000))]
    failure_threshold: u32,
    /// Concurrent batches (invocations) per function (1 to 10000).
    #[arg(long, default_value_t = 64, value_parser = whole::<usize>("--concurrency", 1, 10_000))]
    concurrency: usize,
    /// The longest a send waits to go out in one request with its invocation's others,
    /// in ms (0 to 1000); one hold serves all four functions here, the agent's deployed one
    /// by default.
    #[arg(long, default_value_t = sas::config::DEFAULT_AGENT_SEND_MAX_HOLD_MS,
          value_parser = whole::<u64>("--send-max-hold-ms", 0, sas::config::MAX_SEND_MAX_HOLD_MS.into()))]
    send_max_hold_ms: u64,
    /// Seed: the same seed sends the same orders and gives each remote call the same
    /// answer; timing still varies (--help says what that changes).
    ///
    /// The seed fixes the orders sent (bodies, which are sent twice, the bad messages)
    /// and the simulated remote service's answer to each call, chosen by the call's
    /// idempotency key and how many calls that key had before: the same orders are
    /// refused, and the same calls fail, hang or succeed. It cannot fix timing: how many
    /// calls fit before a step's deadline, retry jitter, which internal message is
    /// delivered twice. So supervisor recoveries, stale replies, lost claims, retries,
    /// the hangs counted and latencies vary from run to run; final states repeat unless
    /// supervisor give-ups decide them (a high --hang-rate, a low --failure-threshold).
    /// For replays exact to every write, see docs/SIMULATION.md.
    #[arg(long, default_value_t = 1, value_parser = whole::<u64>("--seed", 0, u64::MAX.into()))]
    seed: u64,
    /// Stop waiting after this many seconds (1 to 86400).
    #[arg(long, default_value_t = 300, value_parser = whole::<u64>("--max-seconds", 1, 86_400))]
    max_seconds: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Run on the real adapters (DynamoDB, SQS, SNS) against this AWS endpoint, e.g.
    /// moto or LocalStack at http://127.0.0.1:4566. The run creates a table, seven
    /// queues and a topic under a fresh dev-xxxxxxxx prefix, lists them at the end and
    /// removes them (even on Ctrl-C), unless --keep.
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
    /// With --endpoint-url: leave the run's resources in place (the report names them).
    #[arg(long, requires = "endpoint_url")]
    keep: bool,
}

#[derive(Args)]
struct UpArgs {
    /// The AWS endpoint: moto (infra/moto.sh start prints it) or LocalStack at
    /// http://127.0.0.1:4566.
    #[arg(long, value_name = "URL")]
    endpoint_url: String,
    /// Names the table PREFIX-state, the queues PREFIX-orders, ... and the topic
    /// PREFIX-alerts (1 to 40 of [A-Za-z0-9_-]). `infra/bootstrap.sh --prefix P` makes
    /// the same ones.
    #[arg(long, default_value = sasctl::up::DEFAULT_PREFIX)]
    prefix: String,
    /// Definition file of the workflows and agents (default: the built-in
    /// examples/workflows.json, whose agents have no url and so need
    /// --remote-service-url).
    #[arg(long, value_name = "FILE")]
    workflows: Option<std::path::PathBuf>,
    /// Where agents without a url of their own send their calls: POST
    /// URL/<agent>/<step> (https, or http to a loopback host).
    #[arg(long, value_name = "URL", env = "REMOTE_SERVICE_URL")]
    remote_service_url: Option<String>,
    /// How often the supervisor runs, in ms (100 to 3600000). The deployed one runs on
    /// its EventBridge schedule, rate(1 minute) by default.
    #[arg(long, default_value_t = 10_000,
          value_parser = whole::<u64>("--supervisor-period-ms", 100, 3_600_000))]
    supervisor_period_ms: u64,
    /// Batches in flight at once per function (1 to 1000), like Lambda's concurrency.
    #[arg(long, default_value_t = 8, value_parser = whole::<usize>("--concurrency", 1, 1_000))]
    concurrency: usize,
    /// Batching windows of the orders, scheduler and agent queues in whole seconds
    /// (ORDERS/SCHEDULER/AGENT), as the stack's *BatchingWindowSeconds parameters set them
    /// (a stack allows 0, 1, 2, 5, 10 or 20 for orders and 0, 1, 2 or 5 for the others; here
    /// any 0 to 300); the default is the deployed one.
    #[arg(long, value_parser = sasctl::up::Windows::parse, default_value = sasctl::up::DEPLOYED_WINDOWS)]
    windows: sasctl::up::Windows,
    /// One JSON object per line (the startup block, each event, the summary).
    #[arg(long)]
    json: bool,
}

async fn run_up(args: UpArgs) -> Result<ExitCode, String> {
    let json = args.json;
    let options = sasctl::up::UpOptions {
        endpoint: args.endpoint_url,
        prefix: args.prefix,
        workflows: args.workflows,
        remote_service_url: args.remote_service_url,
        supervisor_period: Duration::from_millis(args.supervisor_period_ms),
        concurrency: args.concurrency,
        windows: args.windows,
        receive_wait_ms: sasctl::up::RECEIVE_WAIT_MS,
        json,
    };
    let stopped = sasctl::up::run(options).await.map_err(|e| e.to_string())?;
    if json {
        let summary = serde_json::json!({"event": "stopped", "summary": stopped.summary,
                                         "endpoint": stopped.endpoint, "prefix": stopped.prefix});
        println!("{summary}");
    } else {
        print!("{}", stopped.render());
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_dev(args: DevArgs) -> Result<ExitCode, String> {
    if let Some(url) = &args.endpoint_url {
        sasctl::endpoint::check_url(url).map_err(|e| e.to_string())?;
    }
    let sum = args.failure_rate + args.permanent_rate + args.hang_rate;
    if sum >= 1.0 {
        return Err(format!(
            "--failure-rate + --permanent-rate + --hang-rate must add up to less than 1 (got {sum})"
        ));
    }
    let definitions = sasctl::workflows::load(args.workflows.as_deref())?;
    let workflows = &definitions.workflows;
    for name in args.workflow.split(',') {
        if workflows.get(name).is_none() {
            return Err(format!(
                "unknown workflow {name:?}: the file defines {}",
                workflows.names().join(", ")
            ));
        }
    }
    let faults = RemoteFaults {
        transient: args.failure_rate,
        permanent: args.permanent_rate,
        undo_permanent: 0.0,
        hang: args.hang_rate,
        latency_max_ms: args.latency_ms,
        bad_output: args.bad_output_rate,
        ignores_undone: false,
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
        arrival_per_s: args.rate,
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
    if args.endpoint_url.is_some() && !options.queue_agents().is_empty() {
        return Err(format!(
            "queue agents ({}) run in `sasctl dev` on the embedded backend only: drop --endpoint-url, or run their workers yourself",
            options.queue_agents().join(", ")
        ));
    }
    let (outcome, resources) = match &args.endpoint_url {
        None => (
            dev::run(options, progress).await.map_err(|e| (format!("dev run failed to start: {e}"), 2)),
            None,
        ),
        Some(url) => {
            let run = sasctl::endpoint::run_and_clean_up(options, url, args.keep, progress).await;
            let outcome = run.outcome.map_err(|e| {
                let code =
                    if matches!(e, sasctl::endpoint::EndpointError::Interrupted { .. }) { 130 } else { 2 };
                (e.to_string(), code)
            });
            (outcome, run.resources)
        }
    };
    bar.finish_and_clear();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err((e, code)) => {
            eprintln!("sasctl: {e}");
            if let Some(r) = &resources {
                eprint!("{}", sasctl::report::render_resources(r));
            }
            return Ok(ExitCode::from(code));
        }
    };
    let violations = sasctl::invariants::check(&outcome);
    let report = Report::new(&outcome, &violations).with_resources(resources);
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
    let cli = match Cli::try_parse() {
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
        Command::Dev(args) => run_dev(args).await,
        Command::Up(args) => run_up(args).await,
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
