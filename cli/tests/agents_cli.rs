//! `sasctl agents` and `tasks list --agent`, as an operator runs them: the built binary
//! against moto (infra/with-moto.sh sets SAS_TEST_ENDPOINT; without it a test prints a
//! loud SKIPPED line and passes, except under CI=true), the gates and tasks written
//! through the store the functions use, as the scheduler leaves them.

use std::process::Command;

use sas::adapters::aws::DynamoStore;
use sas::adapters::aws::provision::{Layout, provision};
use sas::domain::gate::{Gate, Limits};
use sas::domain::{Action, Cause, LineItem, Order, OrderId, Policy, TaskRecord, Timestamp};
use sas::ports::{Clock as _, StateStore};

mod support;

const DEFINITIONS: &str = r#"{
  "agents": {"inventory": {}, "payment": {"max_in_flight": 2}, "warehouse": {"max_per_second": 5}},
  "workflows": [
    {"name": "pay", "steps": [{"name": "charge", "agent": "payment", "compensation": "refund"}]},
    {"name": "stock", "steps": [{"name": "reserve", "agent": "inventory", "compensation": "release"}]}
  ]
}"#;

/// `sasctl ARGS`: exit code, stdout, stderr.
fn sasctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args(args)
        .env_remove("SAS_STACK")
        .env_remove("SAS_PREFIX")
        .env_remove("SAS_WORKFLOWS")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("sasctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The definition file, written for one test and removed after it.
struct DefinitionsFile(std::path::PathBuf);

impl DefinitionsFile {
    fn to_str(&self) -> Option<&str> {
        self.0.to_str()
    }
}

impl Drop for DefinitionsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn definitions_file() -> DefinitionsFile {
    let path = std::env::temp_dir().join(format!("sas-agents-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, DEFINITIONS).expect("written");
    DefinitionsFile(path)
}

/// A Pending task of `workflow`, nothing done yet.
fn task(id: &str, workflow: &str, now: Timestamp) -> TaskRecord {
    let order = Order {
        order_id: OrderId::parse(id).unwrap(),
        customer_id: "c-1".into(),
        items: vec![LineItem { sku: "A-1".into(), quantity: 1 }],
        workflow: workflow.into(),
        workflow_version: None,
    };
    TaskRecord::new(&order, None, now, &Policy::default())
}

/// An agent name the definition file does not give, or gives without limits: one line on
/// stderr, exit 1, before any AWS call (so no emulator is needed).
#[test]
fn an_agent_without_a_gate_is_one_line_and_exit_1() {
    let file = definitions_file();
    let file = file.to_str().unwrap();
    for (name, want) in [
        ("nope", "sasctl: no agent \"nope\" in "),
        ("inventory", "sasctl: agent \"inventory\" has no limits in "),
    ] {
        for json in [false, true] {
            let mut args = vec!["agents", "show", name, "--prefix", "p", "--workflows", file];
            if json {
                args.push("--json");
            }
            let (code, out, err) = sasctl(&args);
            assert_eq!(code, 1, "{args:?}: {out}{err}");
            assert!(out.is_empty(), "{args:?}: stdout {out:?}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with(want) && err.contains("payment, warehouse"), "{args:?}: {err}");
        }
    }
    // The built-in definitions name no agent with limits: said so, not an empty surprise.
    let (code, _, err) = sasctl(&["agents", "show", "payment", "--prefix", "p"]);
    assert_eq!(code, 1);
    assert!(err.contains("agent \"payment\" has no limits in the built-in examples/workflows.json"), "{err}");
}

#[tokio::test]
async fn agents_show_places_held_tickets_waiting_and_a_pause_and_tasks_list_filters_by_agent() {
    let test = "agents_show_places_held_tickets_waiting_and_a_pause_and_tasks_list_filters_by_agent";
    let Some(endpoint) = support::endpoint(test) else { return };
    let prefix = format!("ag-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let provisioned = provision(&sdk, &Layout::standard(&prefix)).await.expect("provisioned");
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), provisioned.tables.clone());
    let now = sas::adapters::system::SystemClock.now();
    let policy = Policy::default();

    // payment (2 places): o-a and o-b hold them; o-c and o-d wait with tickets 0 and 1.
    let two = Limits { max_in_flight: Some(2), max_per_second: None, places_per_gate: None, per_key: None };
    let mut gate = Gate::new("payment");
    for (holder, ticket) in [
        ("o-a#1.0000000a", None),
        ("o-b#2.0000000b", None),
        ("o-c#1.0000000c", Some(0)),
        ("o-d#1.0000000d", Some(1)),
    ] {
        let passage = gate.arrive(now, &two, holder, now.plus_ms(120_000), None);
        if let Some(t) = ticket {
            assert_eq!(passage.outcome, sas::domain::gate::Admission::Queued { ticket: t });
        }
        gate = passage.next;
    }
    store.replace_gate(&gate, 0).await.expect("gate written");
    let since = Timestamp(now.0 - 5_000);
    for (id, ticket) in [("o-c", 0), ("o-d", 1)] {
        let queued = task(id, "pay", since).queue("payment", ticket, since, &policy).expect("queues").next;
        store.insert(&queued).await.expect("task written");
        store.put_waiter("payment", ticket, &queued.order_id, now).await.expect("waiter noted");
    }
    // warehouse: its service asked for a pause (Retry-After) of 30 s.
    let paused = Gate::new("warehouse").pause(now, now.plus_ms(30_000));
    store.replace_gate(&paused, 0).await.expect("gate written");
    // Throttled at payment, waiting for its retry; and a task at inventory.
    let mut throttled = task("o-t", "pay", now);
    throttled.last_cause = Cause::Throttled { step: 0, action: Action::Do, retry_after_ms: 20_000 };
    store.insert(&throttled).await.expect("task written");
    store.insert(&task("o-e", "stock", now)).await.expect("task written");

    let file = definitions_file();
    let at = ["--prefix", &prefix, "--endpoint-url", &endpoint, "--workflows", file.to_str().unwrap()];
    let run = |args: &[&str]| {
        let all: Vec<&str> = args.iter().chain(at.iter()).copied().collect();
        let (code, out, err) = sasctl(&all);
        assert_eq!(code, 0, "sasctl {all:?}: {out}{err}");
        out
    };

    let listed = run(&["agents", "list"]);
    let row = |agent: &str| listed.lines().find(|l| l.starts_with(agent)).unwrap_or_default().to_owned();
    let payment = row("payment ");
    let cells: Vec<&str> = payment.split_whitespace().collect();
    assert_eq!(cells, ["payment", "2", "-", "2", "2", "-"], "{listed}");
    assert!(row("warehouse").contains("paused until "), "{listed}");
    assert!(!listed.contains("inventory"), "an agent without limits has no gate: {listed}");
    assert!(listed.ends_with("2 agent(s) with limits\n"), "{listed}");

    let json: serde_json::Value =
        serde_json::from_str(&run(&["agents", "list", "--json"])).expect("one JSON array");
    let all = json.as_array().expect("an array");
    assert_eq!(all.len(), 2, "{json}");
    assert_eq!(
        (all[0]["agent"].as_str(), all[0]["held"].as_u64(), all[0]["waiting"].as_u64()),
        (Some("payment"), Some(2), Some(2))
    );
    assert!(all[0]["paused_until"].is_null(), "{json}");
    assert_eq!((all[1]["agent"].as_str(), all[1]["held"].as_u64()), (Some("warehouse"), Some(0)));
    assert!(all[1]["paused_until"].is_string(), "{json}");

    let shown: serde_json::Value =
        serde_json::from_str(&run(&["agents", "show", "payment", "--json"])).expect("one JSON object");
    let calls: Vec<&str> =
        shown["calls"].as_array().unwrap().iter().map(|c| c["order_id"].as_str().unwrap()).collect();
    assert_eq!(calls, ["o-a", "o-b"], "{shown}");
    assert_eq!(shown["calls"][1]["attempt"], 2);
    assert_eq!(shown["first_in_line"]["order_id"], "o-c", "{shown}");
    assert!(shown["first_in_line"]["waited_ms"].as_u64().unwrap() >= 5_000, "{shown}");
    let text = run(&["agents", "show", "payment"]);
    assert!(text.contains("held            2 of 2 (2 in calls, 0 reserved)"), "{text}");
    assert!(text.contains("waiting         2 ticket(s), tickets 0 to 1"), "{text}");
    assert!(text.contains("first in line   ticket 0, task o-c, waiting since "), "{text}");
    assert!(text.contains("sasctl tasks list --state queued --agent payment --prefix "), "{text}");
    let warehouse = run(&["agents", "show", "warehouse"]);
    assert!(warehouse.contains("paused          paused until "), "{warehouse}");

    // `--state queued` holds the tasks in the gate's line and the throttled one.
    let ids = |out: String| -> Vec<String> {
        let mut ids: Vec<String> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("a JSON object a line")["id"].to_string()
            })
            .collect();
        ids.sort();
        ids
    };
    let queued = ids(run(&["tasks", "list", "--state", "queued", "--agent", "payment", "--json"]));
    assert_eq!(queued, ["\"o-c\"", "\"o-d\"", "\"o-t\""]);
    let at_inventory = ids(run(&["tasks", "list", "--state", "pending", "--agent", "inventory", "--json"]));
    assert_eq!(at_inventory, ["\"o-e\""]);
    let table = run(&["tasks", "list", "--state", "queued"]);
    assert!(table.contains("Pending, throttled until "), "{table}");
    let (code, out, err) = sasctl(&[&["tasks", "list", "--agent", "paymnt"][..], &at[..]].concat());
    assert_eq!((code, out.as_str(), err.lines().count()), (2, "", 1), "{err}");
    assert!(err.starts_with("sasctl: --agent \"paymnt\": no such agent in "), "{err}");

    let clients = sas::adapters::aws::Clients::new(&sdk);
    let made = sasctl::resources::existing(&clients, &Layout::standard(&prefix)).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &made).await.is_empty(), "tidied up after the test");
}
