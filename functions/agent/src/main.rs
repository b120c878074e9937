//! agent: performs one step against the remote service and replies to the scheduler.

use std::sync::Arc;
use std::time::Duration;

use sas::adapters::http_remote::HttpRemote;
use sas::adapters::system::{SystemClock, SystemRandom};
use sas::config::AgentConfig;
use sas::handlers::{Agent, AgentDeps, AgentSettings, DeadLetters};
use sas::lambda::{self, Aws, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(AgentConfig::from_env())?;
    let aws = Aws::load().await;
    let queues = aws.queues(Duration::from_millis(config.send_max_hold_ms));
    let metrics = Aws::metrics("agent", &config.metrics_namespace);
    let deps = AgentDeps {
        queues: queues.clone(),
        clock: Arc::new(SystemClock),
        random: Arc::new(SystemRandom::new()),
        metrics: metrics.clone(),
        remote: Arc::new(
            HttpRemote::new(config.remote_service_url.clone())
                .with_agents(&config.definitions.agents)
                .with_secrets(aws.secrets()),
        ),
        scheduler_queue: config.scheduler_queue.clone(),
        call_starts: aws.call_starts(config.state_table.as_deref()),
    };
    let dead_letters =
        DeadLetters { queues, source: config.agent_queue, dead_letter_queue: config.agent_dlq, metrics };
    let handler = Agent::new(deps, AgentSettings::default(), config.definitions.workflows.clone())
        .with_agents(&config.definitions.agents);
    lambda::serve_sqs_until(dead_letters, |message, deadline| handler.handle_until(message, Some(deadline)))
        .await
}
