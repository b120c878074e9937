//! `bench traffic` against moto: the proxy sees what the functions send, and what it
//! counts agrees with the cost model where arrival cannot change it (DynamoDB's requests
//! per order). Needs moto (infra/with-moto.sh); without it, a loud SKIPPED line, except
//! under CI=true (`support::endpoint`).

mod support;

use sasctl::bench::{TrafficOptions, traffic};
use sasctl::up::Windows;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_is_counted_at_the_proxy_and_every_order_ends() {
    let test = "a_trickle_is_counted_at_the_proxy_and_every_order_ends";
    let Some(endpoint) = support::endpoint(test) else { return };
    let orders = 12;
    let o = TrafficOptions {
        endpoint,
        workflow: "single-step".into(),
        workflows: None,
        orders,
        rate: Some(10.0),
        windows: vec![Windows::default(), Windows { orders_ms: 2_000, ..Windows::default() }],
        concurrency: 2,
    };
    let report = traffic(&o).await.expect("the benchmark runs");
    assert_eq!(report.rows.len(), 2);
    for row in &report.rows {
        assert_eq!(row.ended, orders, "{row:?}");
        let ddb: f64 = row.per_order["dynamodb"].values().sum();
        assert_eq!(ddb, report.model.dynamodb_requests_per_order, "{row:?}");
        let sqs = &row.per_order["sqs"];
        // The pumps delete in batches, as the event source mapping does.
        assert!(sqs.get("DeleteMessageBatch").is_some_and(|n| *n > 0.0), "{sqs:?}");
        assert!(!sqs.contains_key("DeleteMessage"), "{sqs:?}");
        assert!(row.latency_p50_ms > 0 && row.latency_p50_ms <= row.latency_max_ms, "{row:?}");
    }
    // A window on the orders queue gathers what a trickle spreads out: fewer submission
    // invocations than orders.
    let (plain, gathered) = (&report.rows[0], &report.rows[1]);
    assert!(
        gathered.invocations_per_order["orders"] < plain.invocations_per_order["orders"],
        "{:?} vs {:?}",
        gathered.invocations_per_order,
        plain.invocations_per_order
    );
}
