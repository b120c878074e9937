//! `sasctl up`'s options, and the command: run until a signal, print the summary.
//!
//! Beside `up`, not inside it, so `up` never imports what uses it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::args::whole;

#[derive(Args)]
pub struct UpArgs {
    /// The AWS endpoint: moto (infra/moto.sh start prints it) or LocalStack at
    /// http://127.0.0.1:4566.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: String,
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

pub async fn run_command(args: UpArgs) -> Result<ExitCode, String> {
    let json = args.json;
    let options = crate::up::UpOptions {
        endpoint: args.endpoint_url,
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
