//! scheduler: claims tasks, dispatches steps to agents, applies fenced replies.

use sas::config::{FunctionName, SchedulerConfig};
use sas::handlers::{Scheduler, Settings};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SchedulerConfig::from_env())?;
    let aws = Aws::load().await;
    let deps = aws.state_deps(FunctionName::Scheduler, &config.state, Some(&config.alerts));
    let dead_letters = Aws::dead_letters(&deps, &config.state.scheduler_queue, &config.scheduler_dlq);
    let handler = Scheduler::new(deps, Settings::from_config(&config.state));
    lambda::serve_sqs(dead_letters, |message| handler.handle(message)).await
}
