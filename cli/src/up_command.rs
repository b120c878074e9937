//! `sasctl up`'s options, and the command: run until a signal, print the summary.
//!
//! Beside `up`, not inside it, so `up` never imports what uses it.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::args::whole;

#[derive(Args)]
pub struct UpArgs {
    /// The AWS endpoint: moto (infra/moto.sh start prints it) or LocalStack at
    /// http://127.0.0.1:4566 (or, with --dynamodb-endpoint-url, every service's but
    /// DynamoDB's).
    #[arg(long, value_name = "URL", required_unless_present = "emulator", conflicts_with = "emulator")]
    pub endpoint_url: Option<String>,
    /// DynamoDB's own endpoint, e.g. DynamoDB Local's beside LocalStack's --endpoint-url
    /// (infra/localstack.sh env prints both).
    #[arg(long, value_name = "URL", requires = "endpoint_url")]
    pub dynamodb_endpoint_url: Option<String>,
    /// Start an emulator with the repository's own script (infra/moto.sh or
    /// infra/localstack.sh: LocalStack with DynamoDB Local) and run against it; a running
    /// one is reused, and it keeps running after `up` stops (the script's `stop` ends it
    /// and discards the resources). moto starts in about 1 s, LocalStack with DynamoDB
    /// Local in 4 to 6 s.
    #[arg(long, value_enum)]
    pub emulator: Option<Emulator>,
    /// Names the table PREFIX-state, the queues PREFIX-orders, ... and the topic
    /// PREFIX-alerts (1 to 40 of [A-Za-z0-9_-]). `infra/bootstrap.sh --prefix P` makes
    /// the same ones.
    #[arg(long, default_value = crate::up::DEFAULT_PREFIX)]
    pub prefix: String,
    /// Definition file of the workflows and agents (default: the built-in
    /// examples/workflows.json, whose agents have no url: they call the simulated service,
    /// or --remote-service-url).
    #[arg(long, value_name = "FILE")]
    pub workflows: Option<std::path::PathBuf>,
    /// Where agents without a url of their own send their calls: POST
    /// URL/<agent>/<step> (https, or http to a loopback host). Without it, `up` runs a
    /// simulated service on loopback for them (the options under "The simulated
    /// service").
    #[arg(long, value_name = "URL", env = "REMOTE_SERVICE_URL")]
    pub remote_service_url: Option<String>,
    /// Probability a call to the simulated service fails transiently (503), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::rate("--failure-rate"),
          help_heading = "The simulated service (without --remote-service-url)")]
    pub failure_rate: f64,
    /// Probability a call is refused for good (422), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::rate("--permanent-rate"),
          help_heading = "The simulated service (without --remote-service-url)")]
    pub permanent_rate: f64,
    /// Probability a call never answers (the agent's timeout ends it), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::rate("--hang-rate"),
          help_heading = "The simulated service (without --remote-service-url)")]
    pub hang_rate: f64,
    /// Its time per answered call: uniform up to this, in ms (at most 60000).
    #[arg(long, default_value_t = 100, value_parser = whole::<u64>("--latency-ms", 0, 60_000),
          help_heading = "The simulated service (without --remote-service-url)")]
    pub latency_ms: u64,
    /// One agent's service fails differently: NAME=KIND:RATE[,KIND:RATE], kinds fail,
    /// refuse, undo-refuse, hang, bad-output (0 to 1) and latency (ms). Repeatable.
    #[arg(
        long,
        value_name = "NAME=KIND:RATE",
        help_heading = "The simulated service (without --remote-service-url)"
    )]
    pub agent_fault: Vec<crate::agent_fault::AgentFault>,
    /// Callback steps: the simulated service answers a callback step's call at once (the
    /// work started) and keeps the token. Without this option `up` prints
    /// `sasctl tasks complete TOKEN` for you to complete it; with it, the service completes
    /// each one itself with success, up to this long after the call (0 to 3600000 ms).
    #[arg(long, value_name = "MS", value_parser = whole::<u64>("--callback-delay-ms", 0, 3_600_000),
          help_heading = "The simulated service (without --remote-service-url)")]
    pub callback_delay_ms: Option<u64>,
    /// How often the supervisor runs, in ms (100 to 3600000). The deployed one runs on
    /// its EventBridge schedule, rate(1 minute) by default.
    #[arg(long, default_value_t = 10_000,
          value_parser = whole::<u64>("--supervisor-period-ms", 100, 3_600_000))]
    pub supervisor_period_ms: u64,
    /// Batches in flight at once per function (1 to 1000), like Lambda's concurrency.
    #[arg(long, default_value_t = 8, value_parser = whole::<usize>("--concurrency", 1, 1_000))]
    pub concurrency: usize,
    /// Batching windows of the orders, scheduler and agent queues in whole seconds
    /// (ORDERS/SCHEDULER/AGENT), as the stack's *BatchingWindowSeconds parameters set them
    /// (a stack allows 0, 1, 2, 5, 10 or 20 for orders and 0, 1, 2 or 5 for the others; here
    /// any 0 to 300); the default is the deployed one.
    #[arg(long, value_parser = crate::up::Windows::parse, default_value = crate::up::DEPLOYED_WINDOWS)]
    pub windows: crate::up::Windows,
    /// One JSON object per line (the startup block, each event, the summary).
    #[arg(long)]
    pub json: bool,
    /// Do not start the web console. Without this, `up` starts `sasctl console` over its
    /// resources (on 127.0.0.1, a free port) and prints its URL, token included, in the
    /// startup block (with --json, the ready event's "console").
    #[arg(long)]
    pub no_console: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Emulator {
    Moto,
    Localstack,
}

impl Emulator {
    fn script(self) -> &'static str {
        match self {
            Emulator::Moto => "moto.sh",
            Emulator::Localstack => "localstack.sh",
        }
    }
}

/// Starts `emulator` with its script in the repository sasctl was built from (or finds
/// it running) and reads its endpoints from the script's `env`: every service's, and
/// DynamoDB's when it has its own.
pub fn start_emulator(emulator: Emulator) -> Result<(String, Option<String>), String> {
    let repository =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(std::path::Path::new("."));
    let script = repository.join("infra").join(emulator.script());
    let name = format!("infra/{}", emulator.script());
    if !script.is_file() {
        return Err(format!(
            "--emulator: {} is not there (sasctl runs the script of the repository it was built in); start an emulator yourself and give --endpoint-url",
            script.display()
        ));
    }
    // In a process group of its own: the terminal's Ctrl-C, which stops `up`, goes to its
    // foreground group and must not reach the emulator, which stays running.
    let started = std::process::Command::new(&script)
        .arg("start")
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("--emulator: {name} start: {e}"))?;
    if !started.success() {
        return Err(format!("--emulator: {name} start failed (its output is above)"));
    }
    let env = std::process::Command::new(&script)
        .arg("env")
        .output()
        .map_err(|e| format!("--emulator: {name} env: {e}"))?;
    let text = String::from_utf8_lossy(&env.stdout);
    let var = |name: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_owned())
    };
    let endpoints = match emulator {
        Emulator::Moto => var("AWS_ENDPOINT_URL").map(|url| (url, None)),
        Emulator::Localstack => {
            var("AWS_ENDPOINT_URL_SQS").zip(var("AWS_ENDPOINT_URL_DYNAMODB")).map(|(sqs, d)| (sqs, Some(d)))
        }
    };
    let endpoints =
        endpoints.ok_or_else(|| format!("--emulator: {name} env printed no endpoints:\n{text}"))?;
    eprintln!("sasctl up: {name} is running and stays so after up stops (`{name} stop` ends it)");
    Ok(endpoints)
}

pub async fn run_command(args: UpArgs) -> Result<ExitCode, String> {
    let json = args.json;
    // Checked before an emulator is started: bad input starts nothing.
    let simulated = match &args.remote_service_url {
        Some(_) => None,
        None => {
            let faults = crate::remote_sim::RemoteFaults {
                transient: args.failure_rate,
                permanent: args.permanent_rate,
                undo_permanent: 0.0,
                hang: args.hang_rate,
                latency_max_ms: args.latency_ms,
                bad_output: 0.0,
                ignores_undone: false,
            };
            if faults.transient + faults.permanent + faults.hang >= 1.0 {
                return Err(
                    "--failure-rate, --permanent-rate and --hang-rate must add up to less than 1".into()
                );
            }
            let definitions = crate::workflows::load(args.workflows.as_deref()).map_err(|e| e.to_string())?;
            let agents: Vec<&str> = definitions.agents.keys().map(String::as_str).collect();
            let agent_faults = crate::agent_fault::per_agent(&args.agent_fault, faults, &agents)?;
            Some(crate::up::Simulated { faults, agent_faults, callback_delay_ms: args.callback_delay_ms })
        }
    };
    let (endpoint, dynamodb_endpoint) = match (args.emulator, args.endpoint_url) {
        (Some(emulator), _) => start_emulator(emulator)?,
        (None, Some(url)) => {
            if let Some(dynamodb) = &args.dynamodb_endpoint_url
                && crate::endpoint::check_url(dynamodb).is_err()
            {
                return Err(format!(
                    "--dynamodb-endpoint-url {dynamodb:?} is not an http(s) URL such as http://127.0.0.1:8000"
                ));
            }
            (url, args.dynamodb_endpoint_url)
        }
        (None, None) => return Err("give --endpoint-url or --emulator".into()),
    };
    let options = crate::up::UpOptions {
        simulated,
        endpoint,
        dynamodb_endpoint,
        prefix: args.prefix,
        workflows: args.workflows,
        remote_service_url: args.remote_service_url,
        supervisor_period: Duration::from_millis(args.supervisor_period_ms),
        concurrency: args.concurrency,
        windows: args.windows,
        receive_wait_ms: crate::up::RECEIVE_WAIT_MS,
        json,
        console: !args.no_console,
    };
    let stopped = crate::up::run(options).await.map_err(|e| e.to_string())?;
    if json {
        let summary = serde_json::json!({"event": "stopped", "summary": stopped.summary,
                                         "endpoint": stopped.endpoint, "prefix": stopped.prefix});
        println!("{summary}");
    } else {
        print!("{}", stopped.render());
    }
    Ok(ExitCode::SUCCESS)
}
