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
    /// examples/workflows.json, whose agents have no url and so need
    /// --remote-service-url).
    #[arg(long, value_name = "FILE")]
    pub workflows: Option<std::path::PathBuf>,
    /// Where agents without a url of their own send their calls: POST
    /// URL/<agent>/<step> (https, or http to a loopback host).
    #[arg(long, value_name = "URL", env = "REMOTE_SERVICE_URL")]
    pub remote_service_url: Option<String>,
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
