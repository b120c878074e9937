//! Creates what the functions expect (see `sas::adapters::aws::provision`) and prints
//! their configuration as `NAME=value` lines, ready for `export` or an env file.
//!
//!     AWS_ENDPOINT_URL=http://127.0.0.1:4566 cargo run -p sas-bootstrap -- --prefix sas
//!
//! Endpoint, region and credentials come from the usual AWS environment variables;
//! `--endpoint-url` overrides the endpoint. Safe to re-run: existing resources are kept.
//!
//! `--variables` prints the functions' whole variable list instead (`sas::config::variables`):
//! which function reads each and who sets it, so a user sees what to add to bootstrap's
//! output, and `scripts/check-template-contract.py` checks the template against it.

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
    /// Create nothing; list every variable the functions read: who sets it (what
    /// bootstrap prints, what you add, what has a default), which functions read it and
    /// what it is.
    #[arg(long)]
    variables: bool,
    /// With --variables: the list as JSON.
    #[arg(long, requires = "variables")]
    json: bool,
}

/// The list for people: one line per variable.
fn variables_table() -> String {
    use sas::config::{FunctionName, Need, Source, VARIABLES};
    let mut out = String::new();
    for v in VARIABLES {
        let who = match v.source {
            Source::Resource => "bootstrap prints it",
            Source::Tuning => "optional, has a default",
            Source::Deployer => "you set it",
            Source::Platform => "Lambda or your local environment",
        };
        let read_by: Vec<String> = FunctionName::ALL
            .iter()
            .filter_map(|f| {
                v.need(*f).map(|n| match n {
                    Need::Required => f.as_str().to_owned(),
                    Need::Optional => format!("{} (optional)", f.as_str()),
                })
            })
            .collect();
        out.push_str(&format!(
            "{:<26} {:<32} read by {}\n    {}\n",
            v.name,
            who,
            read_by.join(", "),
            v.about
        ));
    }
    out
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.variables {
        let text = if args.json { sas::config::variables::to_json() + "\n" } else { variables_table() };
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
        return ExitCode::SUCCESS;
    }
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

#[cfg(test)]
mod tests {
    use sas::adapters::aws::TableNames;
    use sas::adapters::aws::provision::Provisioned;
    use sas::config::{Source, VARIABLES};

    /// What bootstrap prints is every resource variable of the functions' list, so the
    /// functions start on its output plus what the deployer adds (docs/DEPLOY.md), and
    /// `STATUS_QUEUE_URL` for clients.
    #[test]
    fn prints_every_resource_variable_of_the_list() {
        let url = |name: &str| format!("http://127.0.0.1:5000/000000000000/{name}");
        let provisioned = Provisioned {
            tables: TableNames::new("sas-state"),
            orders_queue: url("sas-orders"),
            orders_dlq: url("sas-orders-dlq"),
            scheduler_queue: url("sas-scheduler"),
            scheduler_dlq: url("sas-scheduler-dlq"),
            agent_queue: url("sas-agent"),
            agent_dlq: url("sas-agent-dlq"),
            callback_queue: url("sas-callbacks"),
            callback_dlq: url("sas-callbacks-dlq"),
            status_queue: url("sas-status"),
            status_queue_arn: "arn:aws:sqs:us-east-1:000000000000:sas-status".into(),
            alert_topic_arn: "arn:aws:sns:us-east-1:000000000000:sas-alerts".into(),
        };
        let printed: Vec<&str> = provisioned.env().into_keys().filter(|k| *k != "STATUS_QUEUE_URL").collect();
        let mut listed: Vec<&str> =
            VARIABLES.iter().filter(|v| v.source == Source::Resource).map(|v| v.name).collect();
        listed.sort_unstable();
        assert_eq!(printed, listed);
    }
}
