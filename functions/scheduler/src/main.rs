//! scheduler: claims tasks, dispatches steps to agents, applies fenced replies, and
//! applies the outside's completions of callback steps from the callback queue.

use sas::config::{FunctionName, SchedulerConfig};
use sas::handlers::{BatchOrder, Callbacks, Scheduler, Settings};
use sas::lambda::{self, Aws, Error, SqsSource};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let config = lambda::require(SchedulerConfig::from_env())?;
    let aws = Aws::load().await;
    let deps = aws.state_deps(FunctionName::Scheduler, &config.state, Some(&config.alerts));
    let settings = Settings::from_config(&config.state);
    let own = Aws::dead_letters(&deps, &config.state.scheduler_queue, &config.scheduler_dlq);
    let callback = Aws::dead_letters(&deps, &config.callback_queue, &config.callback_dlq);
    let scheduler = Scheduler::new(deps.clone(), settings.clone());
    let callbacks = Callbacks::new(deps, settings);
    // The callback queue's records (by their eventSourceARN) go to `callbacks`, the rest here.
    lambda::serve_sqs_routed(
        SqsSource { dead_letters: own, handle: |m| scheduler.handle(m), order: BatchOrder::ByOrder },
        SqsSource { dead_letters: callback, handle: |m| callbacks.handle(m), order: BatchOrder::Concurrent },
    )
    .await
}
