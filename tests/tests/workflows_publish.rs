//! `sasctl workflows publish` against the emulator: a checked file becomes a new version
//! of the Lambda layer the stack's `WorkflowsLayerName` names; a file that changes a
//! version published before is refused and publishes nothing.

use std::process::ExitCode;

use sas_tests::{endpoint, sdk_config, unique_prefix};
use sasctl::workflows::{PublishArgs, publish};

fn args(
    file: &std::path::Path,
    previous: Option<&std::path::Path>,
    layer: &str,
    endpoint: &str,
) -> PublishArgs {
    PublishArgs {
        file: file.to_owned(),
        previous: previous.map(ToOwned::to_owned),
        layer_name: layer.to_owned(),
        endpoint_url: Some(endpoint.to_owned()),
        dry_run: false,
        json: false,
    }
}

#[tokio::test]
async fn a_checked_file_becomes_a_layer_version_and_a_changed_version_is_refused() {
    let Some(endpoint) = endpoint("workflows_publish") else { return };
    let layer = unique_prefix("workflows-layer");
    let example = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fulfil.json"));

    assert_eq!(publish(&args(example, None, &layer, &endpoint)).await, Ok(ExitCode::SUCCESS));

    // v1 of fulfil changed in place: refused against the file published before.
    let dir = std::env::temp_dir().join(&layer);
    std::fs::create_dir_all(&dir).unwrap();
    let changed = dir.join("changed.json");
    let text =
        std::fs::read_to_string(example).unwrap().replacen(r#""max_failures": 5"#, r#""max_failures": 6"#, 1);
    std::fs::write(&changed, text).unwrap();
    assert_eq!(publish(&args(&changed, Some(example), &layer, &endpoint)).await, Ok(ExitCode::FAILURE));

    let lambda = aws_sdk_lambda::Client::new(&sdk_config(&endpoint).await);
    let versions = lambda.list_layer_versions().layer_name(&layer).send().await.unwrap();
    let versions = versions.layer_versions();
    assert_eq!(versions.len(), 1, "only the valid file was published: {versions:?}");
    let description = versions[0].description().unwrap_or_default();
    assert!(description.contains("fulfil v1, fulfil v2"), "{description}");
}
