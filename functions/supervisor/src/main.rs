//! supervisor: on its schedule, recovers every task whose deadline passed.

use sas::config::{FunctionName, SupervisorConfig};
use sas::handlers::{Settings, Supervisor};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SupervisorConfig::from_env())?;
    let aws = Aws::load().await;
    let deps = aws.state_deps(FunctionName::Supervisor, &config.state, Some(&config.alerts));
    lambda::serve_schedule(Supervisor::new(deps, Settings::from_config(&config.state))).await
}
