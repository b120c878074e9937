//! scheduler: claims tasks, dispatches steps to agents, applies fenced replies.

use std::time::Duration;

use sas::config::SchedulerConfig;
use sas::handlers::{Scheduler, Settings};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SchedulerConfig::from_env())?;
    let aws = Aws::load().await;
    let metrics = Aws::metrics("scheduler", &config.state.metrics_namespace);
    let hold = Duration::from_millis(config.state.send_max_hold_ms);
    let deps = aws.deps(
        &config.state.tables,
        Some((&config.alerts.topic_arn, &config.alerts.deployment)),
        metrics,
        hold,
    );
    let dead_letters = Aws::dead_letters(&deps, &config.state.scheduler_queue, &config.scheduler_dlq);
    let handler = Scheduler::new(deps, Settings::from_config(&config.state));
    lambda::serve_sqs(dead_letters, |message| handler.handle(message)).await
}
