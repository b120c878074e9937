//! `bench cold-start`: function binaries launched against a stub Lambda Runtime API and
//! an HTTPS stub of AWS (`aws_stub`): init, first invocation with its TLS connection, CPU
//! time and peak RSS.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;

use sas::adapters::system::SystemClock;
use sas::domain::{LineItem, Order, OrderId};
use sas::ports::Clock;

use super::measure::median;
use crate::aws_stub::{AwsStub, StubCall, read_request};

#[derive(Debug, Clone, Serialize)]
pub struct ColdStartRun {
    /// Process launch to its first `GET .../invocation/next`.
    pub init_ms: f64,
    /// Launch to the first invocation's response (or error) POST: init, then the event's
    /// work, with every AWS call (and the agent's remote call) over a first TLS connection.
    pub first_invocation_ms: f64,
    /// Peak RSS (VmHWM) after the first invocation, KiB.
    pub peak_rss_kib: u64,
    /// CPU time of all the process's threads up to the first invocation's response
    /// (`/proc/PID/task/*/schedstat`). On Lambda a function gets CPU in proportion to its
    /// memory (1 vCPU at 1,769 MB), so this is the part of the cold start that stretches.
    pub cpu_ms: f64,
    /// TLS handshakes the HTTPS stub completed during the run.
    pub tls_connections: u64,
    /// The requests the HTTPS stub answered, in order.
    pub calls: Vec<StubCall>,
    /// `ok`, or what went wrong (see [`judge`]).
    pub outcome: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColdStartReport {
    pub binary: String,
    pub binary_bytes: u64,
    /// Which function's first event the binary got (from its file name), if any.
    pub function: Option<String>,
    /// Certificates in the root store the binary was given (`SSL_CERT_FILE`).
    pub root_certificates: usize,
    pub runs: Vec<ColdStartRun>,
    pub ok_runs: usize,
    pub median_init_ms: f64,
    pub median_first_invocation_ms: f64,
    pub median_peak_rss_kib: f64,
    pub median_cpu_ms: f64,
}

/// A function's first event and the calls that event must make. Each requirement is a
/// list of alternatives; one of the stub's call labels must equal an alternative or
/// extend it (`sqs SendMessageBatch bench-scheduler` matches `... bench-scheduler x1`).
#[derive(Debug, Clone)]
pub struct ColdStartCase {
    pub function: Option<&'static str>,
    pub event: String,
    pub required: Vec<Vec<&'static str>>,
}

pub const BENCH_STATE_TABLE: &str = "bench-state";

fn bench_queue_url(name: &str) -> String {
    format!("https://sqs.us-east-1.amazonaws.com/000000000000/bench-{name}")
}

fn sqs_event(queue: &str, body: String) -> String {
    let now = SystemClock.now().0.to_string();
    serde_json::json!({"Records": [{
        "messageId": "00000000-0000-0000-0000-00000000000a",
        "receiptHandle": "bench-receipt",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now,
            "SenderId": "000000000000",
            "ApproximateFirstReceiveTimestamp": now,
        },
        "messageAttributes": {},
        "md5OfBody": "-",
        "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:us-east-1:000000000000:bench-{queue}"),
        "awsRegion": "us-east-1",
    }]})
    .to_string()
}

/// The first event each function gets, chosen by the binary's file name, so that the
/// invocation does its real work against the HTTPS stub:
///
/// - submission: one valid order -> the task (and order) write, `Schedule` to the
///   scheduler's queue;
/// - scheduler: `Schedule` for an order the stub's GetItem does not find -> the message
///   is rejected and kept in the scheduler's DLQ (a GetItem and a send);
/// - agent: a request for the single-step workflow's step -> the remote POST (200), the
///   reply to the scheduler's queue;
/// - supervisor: a scheduled event -> the sweep's queries of the due index (empty).
///
/// Any other binary gets an empty SQS batch and is only checked to answer it.
pub fn cold_start_case(binary: &std::path::Path) -> ColdStartCase {
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let order_id = OrderId::parse("bench-order-1").expect("a valid id");
    let scheduler_send = vec!["sqs SendMessageBatch bench-scheduler", "sqs SendMessage bench-scheduler"];
    match name {
        "submission" => {
            let order = sas::domain::OrderRequest {
                order_id,
                customer_id: "bench-customer".into(),
                items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
                workflow: None,
                workflow_version: None,
                reply_to: None,
            };
            ColdStartCase {
                function: Some("submission"),
                event: sqs_event("orders", serde_json::to_string(&order).expect("serializes")),
                required: vec![vec!["dynamodb PutItem", "dynamodb TransactWriteItems"], scheduler_send],
            }
        }
        "scheduler" => ColdStartCase {
            function: Some("scheduler"),
            event: sqs_event("scheduler", sas::domain::SchedulerMessage::Schedule { order_id, turn: None, throttled: 0 }.to_body()),
            required: vec![
                vec!["dynamodb GetItem"],
                vec!["sqs SendMessageBatch bench-scheduler-dlq", "sqs SendMessage bench-scheduler-dlq"],
            ],
        },
        "agent" => {
            let order = Order {
                order_id: order_id.clone(),
                customer_id: "bench-customer".into(),
                items: vec![LineItem { sku: "sku-1".into(), quantity: 1 }],
                workflow: "single-step".into(),
                workflow_version: None,
            };
            // A request the scheduler could have sent: the agent checks it against its
            // workflows (key included) before calling anything.
            let idempotency_key = sas::domain::idempotency_key(&order_id, 0, sas::domain::Action::Do);
            let request = sas::domain::AgentRequest {
                order_id,
                workflow: "single-step".into(),
                workflow_version: 1,
                step: 0,
                step_name: "process-order".into(),
                agent: "orders".into(),
                action: sas::domain::Action::Do,
                attempt: 1,
                lease: sas::domain::LeaseToken(uuid::Uuid::new_v4()),
                complete_by: SystemClock.now().plus_ms(60_000),
                idempotency_key,
                order,
                outputs: Default::default(),
                reply_queue: None,
                callback_token: None,
                index: None,
                item: None,
            };
            ColdStartCase {
                function: Some("agent"),
                event: sqs_event("agent", request.to_body()),
                required: vec![vec!["remote POST /remote/orders/process-order"], scheduler_send],
            }
        }
        "supervisor" => ColdStartCase {
            function: Some("supervisor"),
            event: r#"{"version":"0","id":"e-1","detail-type":"Scheduled Event","source":"aws.events","account":"000000000000","time":"2026-11-21T00:00:00Z","region":"us-east-1","resources":[],"detail":{}}"#.into(),
            required: vec![vec!["dynamodb Query"]],
        },
        _ => ColdStartCase { function: None, event: r#"{"Records":[]}"#.into(), required: vec![] },
    }
}

/// `ok` when the invocation answered with a success, reported no failed batch item (SQS)
/// or sweep error (supervisor), every request the stub saw was one it serves, and every
/// required call was made; otherwise what went wrong.
pub fn judge(case: &ColdStartCase, response: Option<&(String, String)>, calls: &[StubCall]) -> String {
    let Some((path, body)) = response else { return "no response".into() };
    if path.ends_with("/init/error") {
        return format!("init error: {}", body.chars().take(300).collect::<String>());
    }
    if !path.ends_with("/response") {
        return format!("error response: {}", body.chars().take(300).collect::<String>());
    }
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    if let Some(failures) = json.get("batchItemFailures").and_then(|f| f.as_array())
        && !failures.is_empty()
    {
        return format!("{} failed batch item(s)", failures.len());
    }
    if let Some(errors) = json.get("errors").and_then(|e| e.as_u64())
        && errors > 0
    {
        return format!("sweep reported {errors} error(s)");
    }
    if let Some(bad) = calls.iter().find(|c| c.status >= 300) {
        return format!("refused by the stub: {} ({})", bad.call, bad.status);
    }
    for alternatives in &case.required {
        let made = calls.iter().any(|c| {
            alternatives
                .iter()
                .any(|a| c.call == *a || c.call.strip_prefix(a).is_some_and(|r| r.starts_with(' ')))
        });
        if !made {
            return format!("missing call: {}", alternatives.join(" or "));
        }
    }
    "ok".into()
}

/// Launches `binary` against a stub Lambda Runtime API on loopback (TCP_NODELAY), hands
/// it one event, and times init and the first invocation; the binary's AWS endpoint and
/// remote service are `stub`, trusted through `SSL_CERT_FILE`.
pub async fn cold_start_once(
    binary: &std::path::Path,
    case: &ColdStartCase,
    stub: &AwsStub,
) -> std::io::Result<ColdStartRun> {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let _ = stub.take();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_MAX_ATTEMPTS", "1")
        // One stub, two host names, so DynamoDB and SQS get a connection each, as on AWS
        // (where they are different hosts); SNS (unused by these events) falls back to
        // AWS_ENDPOINT_URL.
        .env("AWS_ENDPOINT_URL", stub.endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", stub.endpoint())
        .env("AWS_ENDPOINT_URL_SQS", stub.endpoint_by_ip())
        // The only roots the binary's TLS clients load (no SSL_CERT_DIR: env cleared).
        .env("SSL_CERT_FILE", &stub.roots_file)
        .env("STATE_TABLE", BENCH_STATE_TABLE)
        .env("ORDERS_QUEUE_URL", bench_queue_url("orders"))
        .env("ORDERS_DLQ_URL", bench_queue_url("orders-dlq"))
        .env("SCHEDULER_QUEUE_URL", bench_queue_url("scheduler"))
        .env("SCHEDULER_DLQ_URL", bench_queue_url("scheduler-dlq"))
        .env("AGENT_QUEUE_URL", bench_queue_url("agent"))
        .env("AGENT_DLQ_URL", bench_queue_url("agent-dlq"))
        // The scheduler serves the callback queue too and will not start without it.
        .env("CALLBACK_QUEUE_URL", bench_queue_url("callbacks"))
        .env("CALLBACK_DLQ_URL", bench_queue_url("callbacks-dlq"))
        .env("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:bench")
        .env("STATUS_QUEUE_ARN", "arn:aws:sqs:us-east-1:000000000000:bench-status")
        .env("REMOTE_SERVICE_URL", format!("{}/remote", stub.endpoint()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    // (what, ms since launch, body): "next" or the path of a POST.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, f64, String)>();
    let event: Arc<str> = case.event.as_str().into();
    let server = tokio::spawn(async move {
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        loop {
            let Ok((socket, _)) = listener.accept().await else { return };
            let _ = socket.set_nodelay(true);
            let (tx, first, event) = (tx.clone(), first.clone(), event.clone());
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(socket);
                while let Ok(Some(request)) = read_request(&mut stream).await {
                    let at = started.elapsed().as_secs_f64() * 1e3;
                    if request.method == "GET" && request.path.ends_with("/invocation/next") {
                        let _ = tx.send(("next".into(), at, String::new()));
                        if !first.swap(false, Ordering::SeqCst) {
                            return; // second `next`: never answered
                        }
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nLambda-Runtime-Aws-Request-Id: req-1\r\n\
                             Lambda-Runtime-Deadline-Ms: {}\r\nLambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:000000000000:function:bench\r\n\
                             Lambda-Runtime-Trace-Id: Root=1-0-0\r\nContent-Length: {}\r\n\r\n",
                            std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap_or_default()
                                .as_millis()
                                + 60_000,
                            event.len()
                        );
                        let _ = stream.get_mut().write_all(head.as_bytes()).await;
                        let _ = stream.get_mut().write_all(event.as_bytes()).await;
                    } else {
                        let _ = stream
                            .get_mut()
                            .write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        let _ =
                            tx.send((request.path, at, String::from_utf8_lossy(&request.body).into_owned()));
                    }
                }
            });
        }
    });
    let mut init_ms = None;
    let mut first_ms = None;
    let mut response = None;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some((what, at, body)) = rx.recv().await {
            if what == "next" {
                if init_ms.is_none() {
                    init_ms = Some(at);
                } else {
                    return;
                }
            } else if what.ends_with("/init/error") {
                response = Some((what, body));
                return;
            } else if first_ms.is_none() && what.contains("/invocation/") {
                first_ms = Some(at);
                response = Some((what, body));
            }
        }
    })
    .await;
    server.abort();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cpu_ms = process_cpu_ms(pid);
    let _ = child.kill().await;
    let (calls, tls_connections) = stub.take();
    Ok(ColdStartRun {
        init_ms: init_ms.unwrap_or(f64::NAN),
        first_invocation_ms: first_ms.unwrap_or(f64::NAN),
        peak_rss_kib,
        cpu_ms,
        tls_connections,
        outcome: judge(case, response.as_ref(), &calls),
        calls,
    })
}

/// The file name and its directory's (`ring/agent`): enough to tell builds apart.
fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// CPU time of every thread of process `pid` so far, from the scheduler's statistics
/// (nanoseconds, unlike `/proc/PID/stat`'s 10 ms ticks); NaN where they are not available.
fn process_cpu_ms(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return f64::NAN };
    let mut ns = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else { return f64::NAN };
        ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    ns as f64 / 1e6
}

pub async fn cold_start(binary: &std::path::Path, repeats: usize) -> std::io::Result<ColdStartReport> {
    let case = cold_start_case(binary);
    let stub = AwsStub::start(&std::env::temp_dir()).await?;
    let mut runs = Vec::new();
    for _ in 0..repeats.max(1) {
        runs.push(cold_start_once(binary, &case, &stub).await?);
    }
    let med = |f: &dyn Fn(&ColdStartRun) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    Ok(ColdStartReport {
        binary: binary.display().to_string(),
        binary_bytes: std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0),
        function: case.function.map(str::to_owned),
        root_certificates: stub.roots,
        ok_runs: runs.iter().filter(|r| r.outcome == "ok").count(),
        median_init_ms: med(&|r| r.init_ms),
        median_first_invocation_ms: med(&|r| r.first_invocation_ms),
        median_peak_rss_kib: med(&|r| r.peak_rss_kib as f64),
        median_cpu_ms: med(&|r| r.cpu_ms),
        runs,
    })
}

/// One report per binary: a table in text, an array of reports in JSON.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct ColdStartTable(pub Vec<ColdStartReport>);

impl fmt::Display for ColdStartTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "binary                  bytes  init ms  init+first ms  CPU ms  peak RSS MB  TLS conns  ok runs"
        )?;
        for r in &self.0 {
            writeln!(
                f,
                "{:<18} {:>10}  {:>7.2}  {:>13.2}  {:>6.2}  {:>11.1}  {:>9}  {}/{}",
                short_path(&r.binary),
                r.binary_bytes,
                r.median_init_ms,
                r.median_first_invocation_ms,
                r.median_cpu_ms,
                r.median_peak_rss_kib / 1024.0,
                r.runs.first().map_or(0, |x| x.tls_connections),
                r.ok_runs,
                r.runs.len(),
            )?;
            if let Some(first) = r.runs.first() {
                let calls: Vec<&str> = first.calls.iter().map(|c| c.call.as_str()).collect();
                writeln!(f, "  run 1: {}; calls: {}", first.outcome, calls.join(", "))?;
            }
            for (i, run) in r.runs.iter().enumerate().skip(1).filter(|(_, x)| x.outcome != "ok") {
                writeln!(f, "  run {}: {}", i + 1, run.outcome)?;
            }
            let firsts: Vec<String> =
                r.runs.iter().map(|x| format!("{:.1}", x.first_invocation_ms)).collect();
            writeln!(f, "  init+first per run (ms): {}", firsts.join(" "))?;
        }
        if let Some(r) = self.0.first() {
            writeln!(f, "root store: {} certificates (SSL_CERT_FILE)", r.root_certificates)?;
        }
        Ok(())
    }
}
