//! submission: validates orders from the orders queue and starts their tasks.

use std::time::Duration;

use sas::config::SubmissionConfig;
use sas::handlers::{Settings, Submission};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SubmissionConfig::from_env())?;
    let aws = Aws::load().await;
    let metrics = Aws::metrics("submission", &config.state.metrics_namespace);
    let deps =
        aws.deps(&config.state.tables, None, metrics, Duration::from_millis(config.state.send_max_hold_ms));
    let dead_letters = Aws::dead_letters(&deps, &config.orders_queue, &config.orders_dlq);
    let handler = Submission::new(deps, Settings::from_config(&config.state));
    lambda::serve_sqs(dead_letters, |message| handler.handle(message)).await
}
