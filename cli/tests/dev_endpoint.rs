//! `sasctl dev --endpoint-url` and its resources, against moto (infra/with-moto.sh sets
//! SAS_TEST_ENDPOINT): a run names what it made and removes it unless `--keep`, and
//! never removes a resource it did not make. Without an endpoint these tests print a
//! loud SKIPPED line and pass, except under CI=true, where that is a failure
//! (`support::endpoint`).

use std::process::Command;

use sas::adapters::aws::Clients;
use sas::adapters::aws::provision::{self, Layout};
use sasctl::resources::{self, Kind, Resource};

mod support;
use support::endpoint;

/// A short run against `endpoint`; returns stdout (the report) after checking it passed.
fn dev_run(endpoint: &str, extra: &[&str]) -> String {
    let args = [
        "dev",
        "--endpoint-url",
        endpoint,
        "--orders",
        "8",
        "--malformed",
        "3",
        "--step-timeout-ms",
        "3000",
        "--supervisor-period-ms",
        "500",
        "--concurrency",
        "8",
        "--max-seconds",
        "120",
    ];
    let out =
        Command::new(env!("CARGO_BIN_EXE_sasctl")).args(args).args(extra).output().expect("sasctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The report's resources section: its first line, and the prefix its names share.
fn resources_section(report: &str) -> (String, String, Vec<String>) {
    let mut lines = report.lines().skip_while(|l| !l.starts_with("resources made at "));
    let head = lines.next().unwrap_or_else(|| panic!("no resources section in {report}")).to_owned();
    let names: Vec<String> = lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().nth(1).expect("kind and name").to_owned())
        .collect();
    let prefix =
        names.iter().find_map(|n| n.strip_suffix("-state")).expect("the state table is named").to_owned();
    (head, prefix, names)
}

fn all_names(layout: &Layout) -> Vec<String> {
    resources::names(layout).into_iter().map(|(_, n)| n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_run_names_the_resources_it_made_and_removes_them() {
    let Some(endpoint) = endpoint("a_dev_run_names_the_resources_it_made_and_removes_them") else { return };
    let report = dev_run(&endpoint, &[]);
    let (head, prefix, names) = resources_section(&report);
    assert_eq!(head, format!("resources made at {endpoint}: 11, removed at the end (--keep keeps them)"));
    let layout = Layout::standard(&prefix);
    assert_eq!(names, all_names(&layout), "a table, nine queues and a topic, each named");

    let clients = Clients::new(&sasctl::endpoint::sdk_config(&endpoint).await);
    let left = resources::existing(&clients, &layout).await.expect("the endpoint answers");
    assert!(left.is_empty(), "still there after the run: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_leaves_the_resources_and_names_them() {
    let Some(endpoint) = endpoint("keep_leaves_the_resources_and_names_them") else { return };
    let report = dev_run(&endpoint, &["--keep"]);
    let (head, prefix, names) = resources_section(&report);
    assert_eq!(head, format!("resources made at {endpoint}: 11, kept (--keep)"));
    let layout = Layout::standard(&prefix);
    assert_eq!(names, all_names(&layout));

    let clients = Clients::new(&sasctl::endpoint::sdk_config(&endpoint).await);
    let kept = resources::existing(&clients, &layout).await.expect("the endpoint answers");
    let kept_names: Vec<&str> = kept.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(kept_names, names.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(resources::remove(&clients, &kept).await.is_empty(), "tidied up after the test");
}

/// What a run made is what exists after provisioning and did not before: a table and a
/// queue that were there already (another run's, or made by hand under the same
/// names) are not among them and survive the removal, and removing twice is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_was_made_is_removed_and_removing_is_tolerant() {
    let test = "only_what_was_made_is_removed_and_removing_is_tolerant";
    let Some(endpoint) = endpoint(test) else { return };
    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let clients = Clients::new(&sdk);
    let prefix = format!("t-keep-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let layout = Layout::standard(&prefix);

    // Someone else's table and status queue, under the run's names.
    provision::create_tables(&clients.dynamodb, &layout.tables).await.expect("table");
    provision::create_queue(&clients.sqs, &layout.status).await.expect("queue");
    let before = resources::existing(&clients, &layout).await.expect("listed");
    let theirs = [(Kind::Table, layout.tables.state.clone()), (Kind::Queue, layout.status.name.clone())];
    let before_names: Vec<(Kind, String)> = before.iter().map(|r| (r.kind, r.name.clone())).collect();
    assert_eq!(before_names, theirs);

    provision::provision(&sdk, &layout).await.expect("provisioned");
    let made: Vec<Resource> = resources::made(&before, resources::existing(&clients, &layout).await.unwrap());
    assert_eq!(made.len(), 9, "nine of eleven were made: {made:?}");
    assert!(made.iter().all(|r| !theirs.iter().any(|(_, n)| *n == r.name)), "{made:?}");

    assert!(resources::remove(&clients, &made).await.is_empty());
    assert!(resources::remove(&clients, &made).await.is_empty(), "already gone is fine");
    let after = resources::existing(&clients, &layout).await.expect("listed");
    assert_eq!(after, before, "what was there before is there still, and nothing else");
    assert!(resources::remove(&clients, &after).await.is_empty(), "tidied up after the test");
}
