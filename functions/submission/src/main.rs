//! submission: validates orders from the orders queue and starts their tasks.

use sas::config::{FunctionName, SubmissionConfig};
use sas::handlers::{Settings, Submission};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SubmissionConfig::from_env())?;
    let aws = Aws::load().await;
    let deps = aws.state_deps(FunctionName::Submission, &config.state, None);
    let dead_letters = Aws::dead_letters(&deps, &config.orders_queue, &config.orders_dlq);
    let handler = Submission::new(deps, Settings::from_config(&config.state));
    lambda::serve_sqs(dead_letters, |message| handler.handle(message)).await
}
