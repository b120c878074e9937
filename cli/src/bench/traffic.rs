//! `bench traffic`: cost per order and latency as real traffic meets them, counted from
//! outside. The four functions run as `sasctl up` runs them (real adapters, each queue
//! pumped as Lambda's event source mapping does, with its batching window) against an
//! endpoint (moto) through a counting proxy (`proxy.rs`); an application sends orders
//! straight to the endpoint (not counted, priced as one SendMessage each), all at once
//! (bulk) or at a steady rate (a trickle), and reads their final status from the status
//! queue for the latency. `bench idle` instead runs with no orders and prices a quiet month.
//!
//! Like `sasctl up`, the functions read their tuning variables (`SEND_MAX_HOLD_MS`, ...)
//! from the environment when set: a measurement of the defaults runs without them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
use serde::Serialize;
use tokio::sync::watch;

use super::cost::{CostAssumptions, cost, prices};
use super::measure::percentile;
use super::proxy::{CountingProxy, RequestCounts};
use crate::remote_sim::{LoopbackRemote, RemoteFaults};
use crate::up::{self, EventLog, UpOptions, Windows};

/// Lambda's pollers wait this long on an empty queue (SQS's longest long poll).
const POLL_WAIT_MS: u64 = 20_000;
/// Pollers per event source mapping while a queue is idle: Lambda keeps five, and only
/// optimises down to two when the mapping sets no maximum concurrency; the template sets
/// one on each queue (docs/BENCHMARKS.md, section 8).
pub const IDLE_POLLERS: u64 = 5;
/// The queues with an event source mapping, each polled while idle: orders, scheduler,
/// agent, and the callback queue (the scheduler's second event source).
pub const POLLED_QUEUES: f64 = 4.0;
const MINUTES_PER_MONTH: f64 = 30.0 * 24.0 * 60.0;

#[derive(Debug, Clone)]
pub struct TrafficOptions {
    pub endpoint: String,
    pub workflow: String,
    /// The definition file the functions run (the built-in one when `None`).
    pub workflows: Option<std::path::PathBuf>,
    pub orders: usize,
    /// Orders per second; `None`: all at once, in SendMessageBatch requests of 10.
    pub rate: Option<f64>,
    pub windows: Vec<Windows>,
    /// Batches in flight per function.
    pub concurrency: usize,
}

/// One run: one arrival pattern, one set of batching windows.
#[derive(Debug, Clone, Serialize)]
pub struct TrafficRow {
    pub arrival: String,
    pub windows: Windows,
    pub orders: usize,
    /// Orders whose final status arrived.
    pub ended: usize,
    /// From the application's send to the final status on its `reply_to`, ms.
    pub latency_p50_ms: u64,
    pub latency_p90_ms: u64,
    pub latency_max_ms: u64,
    /// Requests per order through the proxy, by service and operation.
    pub per_order: BTreeMap<String, BTreeMap<String, f64>>,
    /// SQS requests per order: the functions' (counted) plus the application's send.
    pub sqs_per_order: f64,
    pub empty_receives_per_order: f64,
    /// Invocations (batches handled) per order, by queue.
    pub invocations_per_order: BTreeMap<String, f64>,
    /// Dollars per million orders, by service, and the total.
    pub dollars_per_million: BTreeMap<String, f64>,
    pub total: f64,
}

/// What the in-process cost model says for the same workflow (bulk, full batches):
/// DynamoDB's bill does not depend on how orders arrive, so it is taken from there and
/// its request count compared with the proxy's.
#[derive(Debug, Clone, Serialize)]
pub struct Model {
    pub dynamodb_dollars_per_million: f64,
    pub dynamodb_requests_per_order: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrafficReport {
    pub workflow: String,
    pub model: Model,
    pub rows: Vec<TrafficRow>,
}

/// An idle deployment over a month.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub seconds: f64,
    /// ReceiveMessage requests per minute per queue of one poller, measured.
    pub receives_per_poller_minute: f64,
    pub supervisor_runs: u64,
    /// Requests per supervisor run, measured, by service and operation.
    pub per_supervisor_run: BTreeMap<String, BTreeMap<String, f64>>,
    /// The month: requests and dollars, by item.
    pub month_requests: BTreeMap<String, f64>,
    pub month_dollars: BTreeMap<String, f64>,
    pub month_total: f64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn per(tally: &RequestCounts, n: f64) -> BTreeMap<String, BTreeMap<String, f64>> {
    tally
        .requests
        .iter()
        .map(|(s, ops)| (s.clone(), ops.iter().map(|(o, c)| (o.clone(), *c as f64 / n)).collect()))
        .collect()
}

/// Lambda's bill for one invocation under the cost model's assumptions.
fn invocation_dollars(a: &CostAssumptions) -> f64 {
    prices::LAMBDA_PER_MILLION_REQUESTS / 1e6
        + (a.memory_mb as f64 / 1024.0) * (a.invocation_ms as f64 / 1000.0) * prices::LAMBDA_ARM_PER_GB_SECOND
}

/// The functions of one run, up and counted.
struct Running {
    ready: up::Ready,
    options: UpOptions,
    events: Arc<EventLog>,
    stop: watch::Sender<bool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    #[allow(clippy::too_many_arguments)]
    async fn start(
        proxy: &CountingProxy,
        remote: &LoopbackRemote,
        workflows: Option<std::path::PathBuf>,
        windows: Windows,
        concurrency: usize,
        supervisor_period: Duration,
        run: usize,
    ) -> Result<Running, String> {
        let options = UpOptions {
            endpoint: proxy.url.clone(),
            dynamodb_endpoint: None,
            prefix: format!("sas-traffic-{}-{run}", std::process::id()),
            workflows,
            remote_service_url: Some(remote.base_url()),
            simulated: None,
            supervisor_period,
            concurrency,
            windows,
            receive_wait_ms: POLL_WAIT_MS,
            json: false,
            console: false,
        };
        let ready = up::prepare(&options).await.map_err(|e| e.to_string())?;
        let events = Arc::new(EventLog::quiet());
        let (stop, stopped) = watch::channel(false);
        let workers = up::start(&ready, &options, events.clone(), stopped);
        Ok(Running { ready, options, events, stop, workers })
    }

    /// Stops the pumps (each finishes its long poll first) and removes what `prepare` made.
    async fn finish(self) -> Result<(), String> {
        let _ = self.stop.send(true);
        for w in self.workers {
            let _ = w.await;
        }
        let failed = crate::resources::remove(&self.ready.clients, &self.ready.created).await;
        match failed.first() {
            None => Ok(()),
            Some((r, why)) => {
                Err(format!("could not remove {} under {}: {why}", r.name, self.options.prefix))
            }
        }
    }
}

fn order_body(i: usize, workflow: &str, reply_to: &str) -> String {
    format!(
        r#"{{"order_id":"t-{i:07}","customer_id":"c-1","items":[{{"sku":"A-1","quantity":1}}],"workflow":"{workflow}","reply_to":"{reply_to}"}}"#
    )
}

/// Sends the orders straight to the endpoint: at `rate` per second one SendMessage each,
/// or all at once ten to a SendMessageBatch. Returns when each was sent (epoch ms).
async fn send_orders(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    o: &TrafficOptions,
    reply_to: &str,
) -> Result<HashMap<String, u64>, String> {
    let mut sent = HashMap::new();
    let fail = |e: aws_sdk_sqs::error::SdkError<_>| {
        format!("sending an order: {}", crate::resources::sdk_reason(&e))
    };
    match o.rate {
        Some(rate) => {
            let start = tokio::time::Instant::now();
            for i in 0..o.orders {
                tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                sent.insert(format!("t-{i:07}"), now_ms());
                sqs.send_message()
                    .queue_url(queue)
                    .message_body(order_body(i, &o.workflow, reply_to))
                    .send()
                    .await
                    .map_err(fail)?;
            }
        }
        None => {
            for chunk in (0..o.orders).collect::<Vec<_>>().chunks(10) {
                let entries = chunk
                    .iter()
                    .filter_map(|i| {
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(order_body(*i, &o.workflow, reply_to))
                            .build()
                            .ok()
                    })
                    .collect();
                let at = now_ms();
                sqs.send_message_batch()
                    .queue_url(queue)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| format!("sending orders: {}", crate::resources::sdk_reason(&e)))?;
                for i in chunk {
                    sent.insert(format!("t-{i:07}"), at);
                }
            }
        }
    }
    Ok(sent)
}

#[derive(serde::Deserialize)]
struct Status {
    order_id: String,
    status: String,
    at: u64,
}

/// Reads the status queue straight from the endpoint until every order sent has a final
/// status or `give_up` passes; returns each final status's time (epoch ms) by order.
async fn collect_final(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    expected: usize,
    give_up: Instant,
) -> Result<HashMap<String, u64>, String> {
    let mut ended = HashMap::new();
    while ended.len() < expected && Instant::now() < give_up {
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| format!("reading the status queue: {}", crate::resources::sdk_reason(&e)))?;
        let messages = out.messages.unwrap_or_default();
        let mut deletes = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if let Some(s) = m.body().and_then(|b| serde_json::from_str::<Status>(b).ok())
                && matches!(s.status.as_str(), "processed" | "compensated" | "failed")
            {
                ended.entry(s.order_id).or_insert(s.at);
            }
            if let Some(r) = m.receipt_handle() {
                deletes.extend(
                    DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(r).build(),
                );
            }
        }
        if !deletes.is_empty() {
            let _ = sqs.delete_message_batch().queue_url(queue).set_entries(Some(deletes)).send().await;
        }
    }
    Ok(ended)
}

async fn one_run(
    o: &TrafficOptions,
    windows: Windows,
    proxy: &CountingProxy,
    remote: &LoopbackRemote,
    app: &aws_sdk_sqs::Client,
    model: &Model,
    run: usize,
) -> Result<TrafficRow, String> {
    let running = Running::start(
        proxy,
        remote,
        o.workflows.clone(),
        windows,
        o.concurrency,
        Duration::from_secs(3_600),
        run,
    )
    .await?;
    // Whatever happens, the run's resources go.
    let measured = measure(o, windows, proxy, app, &running).await;
    running.finish().await?;
    let (counted, invocations, sent, ended) = measured?;
    if ended.len() < o.orders {
        return Err(format!(
            "only {} of {} orders ended (windows {} s): the endpoint may be too slow for this many at once \
             (try fewer --orders), or the orders were rejected (their reply_to is the status queue at {})",
            ended.len(),
            o.orders,
            windows.label(),
            proxy.url
        ));
    }
    Ok(row(o, windows, model, &counted, &invocations, &sent, &ended))
}

type Measured = (RequestCounts, BTreeMap<String, u64>, HashMap<String, u64>, HashMap<String, u64>);

/// Sends the orders and waits for their final statuses: the requests counted meanwhile,
/// the invocations by queue, when each order was sent and when it ended.
async fn measure(
    o: &TrafficOptions,
    windows: Windows,
    proxy: &CountingProxy,
    app: &aws_sdk_sqs::Client,
    running: &Running,
) -> Result<Measured, String> {
    // The supervisor's first run (at start) is not the orders' cost: count from after it.
    let settle_by = Instant::now() + Duration::from_secs(30);
    while running.events.summary().supervisor_runs == 0 && Instant::now() < settle_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (before, invoked_before) = (proxy.counts(), running.events.summary().invocations);
    let p = &running.ready.provisioned;
    // The endpoint names its queues by its own address (moto: the URL given; LocalStack: a
    // host of its own); the functions know the endpoint as the proxy, and accept a local
    // reply_to only at that address.
    let path = reqwest::Url::parse(&p.status_queue).map_err(|e| format!("status queue URL: {e}"))?;
    let reply_to = format!("{}{}", proxy.url, path.path());
    let sent = send_orders(app, &p.orders_queue, o, &reply_to).await?;
    // A minute past the last send, plus what a one-request-at-a-time moto needs for a bulk
    // of orders (about 20 requests each) and a window per step.
    let slowest = Duration::from_millis(
        60_000
            + 150 * o.orders as u64
            + 10 * windows.orders_ms.max(windows.scheduler_ms).max(windows.agent_ms),
    );
    let ended = collect_final(app, &p.status_queue, o.orders, Instant::now() + slowest).await?;
    // The last batches' deletes land after their statuses were sent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counted = proxy.counts().since(&before);
    let invocations: BTreeMap<String, u64> = running
        .events
        .summary()
        .invocations
        .into_iter()
        .map(|(q, c)| {
            let since = c - invoked_before.get(&q).copied().unwrap_or(0);
            (q, since)
        })
        .collect();
    Ok((counted, invocations, sent, ended))
}

/// One run's row: the counts per order, priced.
fn row(
    o: &TrafficOptions,
    windows: Windows,
    model: &Model,
    counted: &RequestCounts,
    invocations: &BTreeMap<String, u64>,
    sent: &HashMap<String, u64>,
    ended: &HashMap<String, u64>,
) -> TrafficRow {
    let n = o.orders.max(1) as f64;
    let mut latencies: Vec<u64> =
        ended.iter().filter_map(|(id, at)| sent.get(id).map(|s| at.saturating_sub(*s))).collect();
    latencies.sort_unstable();
    let invocations_per_order: BTreeMap<String, f64> = invocations
        .iter()
        .map(|(q, c)| (q.rsplit('-').next().unwrap_or(q).to_owned(), *c as f64 / n))
        .collect();
    let a = CostAssumptions::default();
    let sqs_per_order = counted.service("sqs") as f64 / n + 1.0;
    let dollars: BTreeMap<String, f64> = [
        ("sqs", sqs_per_order * prices::SQS_PER_MILLION_REQUESTS),
        ("dynamodb", model.dynamodb_dollars_per_million),
        ("sns", counted.service("sns") as f64 / n * prices::SNS_PER_MILLION_PUBLISHES),
        ("lambda", invocations_per_order.values().sum::<f64>() * invocation_dollars(&a) * 1e6),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    TrafficRow {
        arrival: o.rate.map_or("bulk".to_owned(), |r| format!("{r}/s")),
        windows,
        orders: o.orders,
        ended: ended.len(),
        latency_p50_ms: percentile(&latencies, 50.0),
        latency_p90_ms: percentile(&latencies, 90.0),
        latency_max_ms: latencies.last().copied().unwrap_or(0),
        per_order: per(counted, n),
        sqs_per_order,
        empty_receives_per_order: counted.empty_receives as f64 / n,
        invocations_per_order,
        total: dollars.values().sum(),
        dollars_per_million: dollars,
    }
}

async fn proxy_and_remote(endpoint: &str) -> Result<(CountingProxy, LoopbackRemote), String> {
    crate::endpoint::check_url(endpoint).map_err(|e| e.to_string())?;
    let proxy = CountingProxy::start(endpoint).await?;
    let remote = LoopbackRemote::start(RemoteFaults::default(), BTreeMap::new(), 1)
        .await
        .map_err(|e| format!("cannot start the simulated remote service: {e}"))?;
    Ok((proxy, remote))
}

pub async fn traffic(o: &TrafficOptions) -> Result<TrafficReport, String> {
    let (proxy, remote) = proxy_and_remote(&o.endpoint).await?;
    let app_sdk = crate::endpoint::sdk_config(&o.endpoint).await;
    crate::endpoint::probe(&app_sdk, &o.endpoint).await.map_err(|e| e.to_string())?;
    let app = aws_sdk_sqs::Client::new(&app_sdk);
    let bulk = cost(&o.workflow, 1_000, false, &CostAssumptions::default()).await;
    let model = Model {
        dynamodb_dollars_per_million: bulk.dollars_per_million.get("dynamodb").copied().unwrap_or(0.0),
        dynamodb_requests_per_order: bulk.per_order.get("ddb_requests").copied().unwrap_or(0.0),
    };
    let mut rows = Vec::new();
    for (run, windows) in o.windows.iter().enumerate() {
        rows.push(one_run(o, *windows, &proxy, &remote, &app, &model, run).await?);
    }
    Ok(TrafficReport { workflow: o.workflow.clone(), model, rows })
}

/// Runs the functions with no orders for `seconds`, the supervisor every 20 s, and
/// prices a month of it: every queue's idle pollers and the supervisor's runs.
pub async fn idle(endpoint: &str, seconds: u64) -> Result<IdleReport, String> {
    let (proxy, remote) = proxy_and_remote(endpoint).await?;
    let period = Duration::from_secs(20);
    let running = Running::start(&proxy, &remote, None, Windows::default(), 1, period, 0).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, runs_before) = (proxy.counts(), running.events.summary().supervisor_runs);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let counted = proxy.counts().since(&before);
    let elapsed = started.elapsed().as_secs_f64();
    let runs = running.events.summary().supervisor_runs - runs_before;
    running.finish().await?;

    let minutes = elapsed / 60.0;
    let receives_per_poller_minute = counted.op("sqs", "ReceiveMessage") as f64 / POLLED_QUEUES / minutes;
    let mut without_receives = counted.clone();
    if let Some(sqs) = without_receives.requests.get_mut("sqs") {
        sqs.remove("ReceiveMessage");
    }
    without_receives.requests.retain(|_, ops| !ops.is_empty());
    let per_run = per(&without_receives, runs.max(1) as f64);
    let ddb_per_run: f64 = per_run.get("dynamodb").map_or(0.0, |ops| ops.values().sum());
    // At rate(1 minute): one supervisor run a minute.
    let receives = receives_per_poller_minute * POLLED_QUEUES * IDLE_POLLERS as f64 * MINUTES_PER_MONTH;
    let runs_month = MINUTES_PER_MONTH;
    let queries = ddb_per_run * runs_month;
    let a = CostAssumptions::default();
    let month_requests: BTreeMap<String, f64> =
        [("sqs_receives", receives), ("supervisor_invocations", runs_month), ("dynamodb_queries", queries)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
    // An empty eventually consistent Query reads the 0.5-unit minimum.
    let month_dollars: BTreeMap<String, f64> = [
        ("sqs", receives * prices::SQS_PER_MILLION_REQUESTS / 1e6),
        ("lambda", runs_month * invocation_dollars(&a)),
        ("dynamodb", queries * 0.5 * prices::DDB_PER_MILLION_RRU / 1e6),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Ok(IdleReport {
        seconds: elapsed,
        receives_per_poller_minute,
        supervisor_runs: runs,
        per_supervisor_run: per_run,
        month_requests,
        month_total: month_dollars.values().sum(),
        month_dollars,
    })
}

impl fmt::Display for TrafficReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: requests counted at a proxy in front of the endpoint; DynamoDB priced by the cost model \
             (${:.2}/M, {:.1} requests/order)",
            self.workflow, self.model.dynamodb_dollars_per_million, self.model.dynamodb_requests_per_order
        )?;
        writeln!(
            f,
            "| arrival | window s (orders/scheduler/agent) | ended | latency p50 / p90 / max ms | SQS req/order | \
             DynamoDB req/order | invocations/order | $/M SQS | $/M Lambda | $/M total |"
        )?;
        writeln!(f, "|---|---|---:|---|---:|---:|---:|---:|---:|---:|")?;
        for r in &self.rows {
            let ddb: f64 = r.per_order.get("dynamodb").map_or(0.0, |ops| ops.values().sum());
            writeln!(
                f,
                "| {} | {} | {}/{} | {} / {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.arrival,
                r.windows.label(),
                r.ended,
                r.orders,
                r.latency_p50_ms,
                r.latency_p90_ms,
                r.latency_max_ms,
                r.sqs_per_order,
                ddb,
                r.invocations_per_order.values().sum::<f64>(),
                r.dollars_per_million.get("sqs").copied().unwrap_or(0.0),
                r.dollars_per_million.get("lambda").copied().unwrap_or(0.0),
                r.total
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for IdleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "idle for {:.0} s: {:.2} receives per poller per minute on each queue; {} supervisor runs, each {:?}",
            self.seconds, self.receives_per_poller_minute, self.supervisor_runs, self.per_supervisor_run
        )?;
        writeln!(f, "a month at {IDLE_POLLERS} pollers per queue and the supervisor at rate(1 minute):")?;
        for (k, v) in &self.month_requests {
            writeln!(f, "  {k}: {v:.0}")?;
        }
        let d: Vec<String> = self.month_dollars.iter().map(|(k, v)| format!("{k} ${v:.3}")).collect();
        writeln!(f, "  {} = ${:.2} a month", d.join(", "), self.month_total)
    }
}
