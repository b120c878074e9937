//! supervisor: on its schedule, recovers every task whose deadline passed.

use std::time::Duration;

use sas::config::SupervisorConfig;
use sas::handlers::{Settings, Supervisor};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SupervisorConfig::from_env())?;
    let aws = Aws::load().await;
    let metrics = Aws::metrics("supervisor", &config.state.metrics_namespace);
    let hold = Duration::from_millis(config.state.send_max_hold_ms);
    let deps = aws.deps(
        &config.state.tables,
        Some((&config.alerts.topic_arn, &config.alerts.deployment)),
        metrics,
        hold,
    );
    lambda::serve_schedule(Supervisor::new(deps, Settings::from_config(&config.state))).await
}
