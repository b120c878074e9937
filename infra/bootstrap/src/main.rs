//! Creates what the functions expect (see `sas::adapters::aws::provision`) and prints
//! their configuration as `NAME=value` lines, ready for `export` or an env file.
//!
//!     AWS_ENDPOINT_URL=http://127.0.0.1:4566 cargo run -p sas-bootstrap -- --prefix sas
//!
//! Endpoint, region and credentials come from the usual AWS environment variables;
//! `--endpoint-url` overrides the endpoint. Safe to re-run: existing resources are kept.

use std::process::ExitCode;

use clap::Parser;
use sas::adapters::aws::provision::{Layout, provision};

#[derive(Parser)]
#[command(name = "sas-bootstrap", version, about = "Create the sas state table, queues and topic")]
struct Args {
    /// Name prefix: table PREFIX-state, queues PREFIX-orders, ...
    #[arg(long, default_value = "sas")]
    prefix: String,
    /// The AWS endpoint, e.g. http://127.0.0.1:4566 (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
    /// Every queue's visibility timeout in seconds, instead of the template's (short
    /// ones make redelivery quick in local runs).
    #[arg(long, value_name = "SECONDS")]
    visibility_timeout: Option<u32>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let valid = !args.prefix.is_empty()
        && args.prefix.len() <= 40
        && args.prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        eprintln!("sas-bootstrap: --prefix must be 1 to 40 of [A-Za-z0-9_-] (it names tables and queues)");
        return ExitCode::from(2);
    }
    let mut loader = sas::adapters::aws::config_loader();
    if let Some(url) = &args.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    let sdk = loader.load().await;
    let mut layout = Layout::standard(&args.prefix);
    if let Some(seconds) = args.visibility_timeout {
        layout = layout.with_visibility_timeout(seconds);
    }
    match provision(&sdk, &layout).await {
        Ok(done) => {
            let lines: String = done.env().iter().map(|(name, value)| format!("{name}={value}\n")).collect();
            // A closed pipe (`| head`) is the reader's choice, not a failure worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), lines.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sas-bootstrap: {e}");
            ExitCode::FAILURE
        }
    }
}
