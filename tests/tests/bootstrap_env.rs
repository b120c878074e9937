//! `infra/bootstrap.sh` prints `Provisioned::env()`: it must hold every variable the
//! functions require that the resources name, so that bootstrap's output, plus only what
//! infra/README.md tells a user to add for a local endpoint (`REMOTE_SERVICE_URL`, the
//! endpoint, region and credentials), starts all four functions
//! (shared/src/config/variables.rs, the list of what each reads).

use std::collections::BTreeMap;

use sas::adapters::aws::provision::{Layout, provision};
use sas::config::{AgentConfig, SchedulerConfig, SubmissionConfig, SupervisorConfig};

/// Every function's configuration problems when its environment is `vars` alone.
fn problems(vars: &BTreeMap<&str, String>) -> BTreeMap<&'static str, Vec<String>> {
    let lookup = |name: &str| vars.get(name).cloned();
    let of = |r: Result<(), sas::config::ConfigError>| r.err().map(|e| e.problems).unwrap_or_default();
    BTreeMap::from([
        ("submission", of(SubmissionConfig::from_lookup(&lookup).map(drop))),
        ("scheduler", of(SchedulerConfig::from_lookup(&lookup).map(drop))),
        ("agent", of(AgentConfig::from_lookup(&lookup).map(drop))),
        ("supervisor", of(SupervisorConfig::from_lookup(&lookup).map(drop))),
    ])
}

#[tokio::test]
async fn bootstrap_output_configures_every_function() {
    let test = "bootstrap_output_configures_every_function";
    let Some(endpoint) = sas_tests::endpoint(test) else { return };
    let sdk = sas_tests::sdk_config(&endpoint).await;
    let made = provision(&sdk, &Layout::standard(&sas_tests::unique_prefix(test)))
        .await
        .unwrap_or_else(|e| panic!("provisioning at {endpoint}: {e}"));
    let mut vars = made.env();

    // The status queue's ARN is the endpoint's own, not one pieced together from its URL.
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(&made.status_queue)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("status queue attributes");
    let arn = attributes.attributes().and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn));
    assert_eq!(vars.get("STATUS_QUEUE_ARN"), arn);

    // Bootstrap's output alone: submission, scheduler and supervisor start; the agent
    // lacks only its remote service, which no resource names.
    let alone = problems(&vars);
    assert_eq!(alone["agent"], ["REMOTE_SERVICE_URL is not set"], "{alone:#?}");
    for function in ["submission", "scheduler", "supervisor"] {
        assert!(alone[function].is_empty(), "{function}: {alone:#?}");
    }

    // Plus what the docs add for a local endpoint: all four start.
    vars.insert("REMOTE_SERVICE_URL", "http://127.0.0.1:3000".into());
    vars.insert("AWS_ENDPOINT_URL", endpoint.clone());
    vars.insert("AWS_REGION", "us-east-1".into());
    let added = problems(&vars);
    assert!(added.values().all(Vec::is_empty), "{added:#?}");
}

/// A table made before the finished index (an older `sasctl up` on the same prefix) gets
/// it when provisioned again, so `up`'s finished listing works on a prefix carried on.
#[tokio::test]
async fn provisioning_again_adds_the_finished_index_to_an_older_table() {
    use sas::adapters::aws::dynamodb::DynamoStore;
    use sas::ports::{Listing, StoreError, TaskListing};
    let test = "provisioning_again_adds_the_finished_index_to_an_older_table";
    let Some(endpoint) = sas_tests::endpoint(test) else { return };
    let sdk = sas_tests::sdk_config(&endpoint).await;
    let mut older = Layout::standard(&sas_tests::unique_prefix(test));
    older.tables = older.tables.clone().with_list_finished(false);
    let made = provision(&sdk, &older).await.unwrap_or_else(|e| panic!("provisioning at {endpoint}: {e}"));
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let store = DynamoStore::new(client.clone(), made.tables.clone().with_list_finished(true));
    let refused = store.list(&Listing::Finished { since: None }, 10).await;
    assert!(matches!(refused, Err(StoreError::NotIndexed(_))), "{refused:?}");

    let mut again = older.clone();
    again.tables = again.tables.clone().with_list_finished(true);
    provision(&sdk, &again).await.unwrap_or_else(|e| panic!("provisioning again at {endpoint}: {e}"));
    assert_eq!(store.list(&Listing::Finished { since: None }, 10).await, Ok(Vec::new()));
}
