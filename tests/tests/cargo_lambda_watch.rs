//! The local path of infra/README.md, end to end: the four function binaries run under
//! `cargo lambda watch` (cargo-lambda's Runtime API emulator, in its `--only-lambda-apis`
//! mode, so the binaries are the test command's own build, not a second compile) with
//! exactly what `infra/bootstrap.sh` printed plus the variables the docs tell a user to add, against
//! the test endpoints (moto under infra/with-moto.sh; DynamoDB Local and LocalStack under
//! infra/with-localstack.sh, each service's endpoint in its own variable). This test stands in for Lambda's
//! event sources: it receives from the orders, scheduler, agent and callback queues,
//! invokes the matching function with an `SqsEvent` through cargo-lambda's invoke
//! endpoint (the scheduler for both of its queues, each record carrying its queue's
//! `eventSourceARN`), deletes the messages not named in the response's
//! `batchItemFailures`, and invokes the supervisor with a scheduled EventBridge event every
//! few seconds. A loopback remote service answers the agent and refuses every
//! `charge-payment`, so single-step orders end Processed and three-step orders end
//! Compensated, as do the orders of a workflow whose reservation and charge are one
//! parallel stage. The definition file (`WORKFLOWS_FILE`, the built-in workflows plus
//! that one and one with a callback step) has an order wait for the outside: a completion with a forged
//! token, sent to the callback queue, is kept in the callback DLQ with its reason by the
//! scheduler binary, and the real one ends the order Processed.
//!
//! cargo-lambda comes from the project venv that `scripts/cargo-lambda-venv.sh` installs
//! (the test command runs it). Without it, or without an emulator, the test fails under
//! `CI=true` and is skipped with a loud line otherwise.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::MessageSystemAttributeName;
use sas::adapters::aws::{DynamoStore, TableNames};
use sas::domain::{Action, OrderId, ProcessState};
use sas::ports::StateStore;
use sas_tests::callbacks::{self, Approvals};
use sasctl::remote_sim::{LoopbackRemote, RemoteFaults};
use serde_json::{Value, json};

const TEST: &str = "orders_end_processed_and_compensated_under_cargo_lambda_watch";
/// The functions, by binary name: cargo-lambda's invoke endpoint names a function by it.
const FUNCTIONS: [&str; 4] = ["submission", "scheduler", "agent", "supervisor"];
const SINGLE: usize = 4;
const THREE: usize = 3;
/// Orders of the workflow with a parallel stage.
const STAGED: usize = 2;
const FAN_OUT: &str = "fan-out";
/// How long the orders may take once the functions run; they need a few seconds.
const ORDERS_WITHIN: Duration = Duration::from_secs(120);
/// The supervisor's schedule, shortened (template.yaml fires it every minute).
const SUPERVISOR_EVERY: Duration = Duration::from_secs(3);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the repository").to_owned()
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The directory holding `cargo-lambda`: the project venv (`scripts/cargo-lambda-venv.sh`,
/// under `SAS_TOOLS_VENV` or `.venv-tools`), else `PATH`. `None` after a loud SKIPPED line;
/// under `CI=true` a missing cargo-lambda fails the test instead.
fn cargo_lambda_dir(root: &Path) -> Option<PathBuf> {
    let venv_root =
        std::env::var_os("SAS_TOOLS_VENV").map_or_else(|| root.join(".venv-tools"), PathBuf::from);
    let venv_bin = venv_root.join("cargo-lambda").join("bin");
    let on_path =
        std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    if let Some(dir) = std::iter::once(venv_bin).chain(on_path).find(|d| d.join("cargo-lambda").is_file()) {
        return Some(dir);
    }
    assert!(
        !ci(),
        "{TEST}: CI=true but cargo-lambda is not installed: run scripts/cargo-lambda-venv.sh \
         (scripts/test.sh does) so this test runs in CI"
    );
    let line = format!(
        "*** SKIPPED: cargo-lambda not installed: {TEST} needs it (run scripts/cargo-lambda-venv.sh) ***\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    None
}

/// A command for a nested cargo (or cargo-lambda): the test's own environment without
/// what cargo sets for this test binary (so the nested build's fingerprints match a build
/// from a shell) and without any AWS or sas variable (so the functions see only the env
/// file: a variable the docs forget must fail this test, not be filled in from ours).
fn clean_command(program: impl AsRef<std::ffi::OsStr>, root: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(root);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let cargo_sets = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref());
        if cargo_sets || name.starts_with("AWS_") || name.starts_with("SAS_") {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

/// Runs a nested cargo build to completion.
fn cargo_build(root: &Path, args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let status =
        clean_command(cargo, root).arg("build").arg("--locked").args(args).status().expect("cargo runs");
    assert!(status.success(), "cargo build {args:?} failed");
    eprintln!("{TEST}: cargo build {} took {:.1} s", args.join(" "), started.elapsed().as_secs_f64());
}

/// `cargo lambda watch`, stopped (with its function processes) when dropped.
struct Watch {
    child: Child,
    /// The functions, in `child`'s process group: stopped with it, reaped here.
    functions: Vec<Child>,
    log: PathBuf,
}

impl Watch {
    /// The end of its log (cargo's and the functions' output) without the functions'
    /// info lines, for failure messages; the whole log stays in the test's work directory.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let quiet = |l: &&str| !l.contains(r#""level":"INFO""#) && !l.contains(r#""level":"DEBUG""#);
        let lines: Vec<&str> = text.lines().filter(quiet).collect();
        format!("{}\n(whole log: {})", lines[lines.len().saturating_sub(40)..].join("\n"), self.log.display())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Its own process group holds cargo-lambda, the `cargo run`s and the functions.
        let group = format!("-{}", self.child.id());
        let kill = |signal: &str| {
            let _ = Command::new("kill").args([signal, "--", &group]).stderr(Stdio::null()).status();
        };
        kill("-TERM");
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        kill("-KILL");
        let _ = self.child.wait();
        for function in &mut self.functions {
            let _ = function.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// What stands in for Lambda: the SQS event source mappings and the EventBridge schedule.
struct EventSources {
    http: reqwest::Client,
    invoke_base: String,
    sqs: aws_sdk_sqs::Client,
    region: String,
    invocations: AtomicU64,
    failed_invocations: AtomicU64,
}

impl EventSources {
    async fn invoke(&self, function: &str, event: &Value) -> Result<Value, String> {
        self.invocations.fetch_add(1, Ordering::Relaxed);
        let url = format!("{}/2015-03-31/functions/{function}/invocations", self.invoke_base);
        let response = self
            .http
            .post(&url)
            .json(event)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .map_err(|e| format!("{function}: {e}"))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| format!("{function}: {e}"))?;
        let value: Value = serde_json::from_str(&body).unwrap_or(Value::String(body.clone()));
        if !status.is_success() || value.get("errorMessage").is_some() || value.get("errorType").is_some() {
            self.failed_invocations.fetch_add(1, Ordering::Relaxed);
            return Err(format!("{function} answered {status}: {body:.500}"));
        }
        Ok(value)
    }

    /// One poll of `queue` for `function`, as an SQS event source mapping does it: a batch
    /// of up to 10, one invocation, then every message deleted except the
    /// `batchItemFailures` (left for redelivery). A failed invocation deletes nothing.
    async fn poll(&self, queue: &str, queue_arn: &str, function: &str) -> usize {
        let received = match self
            .sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{TEST}: receive from {queue}: {}", aws_sdk_sqs::error::DisplayErrorContext(e));
                return 0;
            }
        };
        let messages = received.messages();
        if messages.is_empty() {
            return 0;
        }
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                let attributes: BTreeMap<String, String> = m
                    .attributes()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                    .collect();
                let message_attributes: BTreeMap<String, Value> = m
                    .message_attributes()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| {
                        (k.clone(), json!({"stringValue": v.string_value(), "dataType": v.data_type()}))
                    })
                    .collect();
                json!({
                    "messageId": m.message_id(),
                    "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "md5OfBody": m.md5_of_body(),
                    "attributes": attributes,
                    "messageAttributes": message_attributes,
                    "eventSource": "aws:sqs",
                    "eventSourceARN": queue_arn,
                    "awsRegion": self.region,
                })
            })
            .collect();
        let failures: Vec<String> = match self.invoke(function, &json!({ "Records": records })).await {
            Ok(response) => response["batchItemFailures"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
                .collect(),
            Err(e) => {
                eprintln!("{TEST}: invocation failed, the batch is left for redelivery: {e}");
                return messages.len();
            }
        };
        for m in messages {
            if failures.iter().any(|f| Some(f.as_str()) == m.message_id()) {
                continue;
            }
            if let Some(receipt) = m.receipt_handle() {
                let _ = self.sqs.delete_message().queue_url(queue).receipt_handle(receipt).send().await;
            }
        }
        messages.len()
    }

    /// The supervisor's scheduled invocation: an EventBridge "Scheduled Event".
    async fn tick(&self) -> Result<Value, String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after the epoch").as_secs();
        let event = json!({
            "version": "0",
            "id": uuid::Uuid::new_v4().to_string(),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "123456789012",
            "time": aws_sdk_sqs::primitives::DateTime::from_secs(now as i64)
                .fmt(aws_sdk_sqs::primitives::DateTimeFormat::DateTime)
                .expect("a time EventBridge can carry"),
            "region": self.region,
            "resources": [format!("arn:aws:events:{}:123456789012:rule/sas-supervisor", self.region)],
            "detail": {},
        });
        self.invoke("supervisor", &event).await
    }
}

fn order(id: &str, workflow: &str, reply_to: &str) -> String {
    json!({
        "order_id": id,
        "customer_id": "c-1",
        "items": [{"sku": "A-1", "quantity": 1}],
        "workflow": workflow,
        "reply_to": reply_to,
    })
    .to_string()
}

/// The four functions under `cargo lambda watch` on fresh resources of the test endpoint,
/// with the event sources polling their queues, as a user's local setup runs them.
struct Rig {
    /// Dropped last: the functions stop with it.
    watch: Watch,
    sources: Arc<EventSources>,
    /// infra/bootstrap.sh's output: the resources' names and URLs.
    vars: HashMap<String, String>,
    sqs: aws_sdk_sqs::Client,
    store: DynamoStore,
    /// The work directory: the definition file, the env file and the log.
    dir: PathBuf,
    prefix: String,
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

impl Rig {
    /// Bootstraps the resources, writes `definitions` and the env file the docs describe
    /// (`remote_url` as the remote service), starts cargo-lambda and the four binaries, and
    /// the event sources of the orders, scheduler, agent and callback queues.
    ///
    /// `agents` and `schedulers`: how many agent and scheduler processes run, each with
    /// its own poller of its queue, as Lambda runs a function's concurrent invocations (a
    /// process takes one invocation at a time).
    async fn start(
        endpoints: &sas_tests::Endpoints,
        tools: PathBuf,
        definitions: impl FnOnce(&mut Value),
        remote_url: &str,
        agents: usize,
        schedulers: usize,
    ) -> Rig {
        let root = repo_root();
        // The test command's one build (`--workspace --all-targets`, a no-op here after it)
        // made `sas-bootstrap` and the four functions: this test runs those binaries rather
        // than have cargo-lambda compile the functions a second time for their own features.
        cargo_build(&root, &["--workspace", "--all-targets", "--quiet"]);
        let target = std::env::current_exe().expect("test path");
        let bin_dir = target.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");

        // infra/bootstrap.sh's output, exactly, then what infra/README.md has a user add.
        // Bootstrap finds the endpoints where a user's shell has them after `moto.sh env`
        // or `localstack.sh env`.
        let prefix = sas_tests::unique_prefix("watch");
        let bootstrap = clean_command(bin_dir.join("sas-bootstrap"), &root)
            .args(["--prefix", &prefix, "--visibility-timeout", "30"])
            .envs(endpoints.env_vars())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .stderr(Stdio::inherit())
            .output()
            .expect("sas-bootstrap runs");
        assert!(bootstrap.status.success(), "bootstrap failed");
        let printed = String::from_utf8(bootstrap.stdout).expect("UTF-8");
        let vars: HashMap<String, String> = printed
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();

        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cargo-lambda-watch-{prefix}"));
        std::fs::create_dir_all(&dir).expect("work dir");
        let builtin =
            std::fs::read_to_string(root.join("examples/workflows.json")).expect("built-in workflows");
        let mut file: Value = serde_json::from_str(&builtin).expect("JSON");
        definitions(&mut file);
        let workflows = dir.join("workflows.json");
        std::fs::write(&workflows, file.to_string()).expect("definition file");
        let endpoint_lines: String = endpoints.env_vars().iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let added = format!(
            "REMOTE_SERVICE_URL={remote_url}\nWORKFLOWS_FILE={}\n{endpoint_lines}AWS_REGION=us-east-1\n\
             AWS_ACCESS_KEY_ID=test\nAWS_SECRET_ACCESS_KEY=test\n",
            workflows.display()
        );
        let env_file = dir.join("local.env");
        std::fs::write(&env_file, format!("{printed}{added}")).expect("env file");

        // cargo lambda watch's Runtime API and invoke endpoint, on its own port, in its own
        // process group; `--only-lambda-apis` serves the API without building, and each
        // function binary joins it with the variables cargo-lambda prints for that mode
        // plus the env file's, exactly.
        let port = free_port();
        let log = dir.join("watch.log");
        let out = std::fs::File::create(&log).expect("log file");
        let path = std::env::join_paths(
            std::iter::once(tools)
                .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .expect("PATH");
        let child = {
            use std::os::unix::process::CommandExt;
            clean_command("cargo", &root)
                .args(["lambda", "watch", "--only-lambda-apis"])
                .args(["--invoke-address", "127.0.0.1", "--invoke-port", &port.to_string()])
                .env("PATH", path)
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("log"))
                .stderr(out.try_clone().expect("log"))
                .process_group(0)
                .spawn()
                .expect("cargo lambda watch starts")
        };
        let group = child.id();
        let mut watch = Watch { child, functions: Vec::new(), log };
        let until = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "cargo lambda watch did not listen on {port}:\n{}", watch.tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let env_file_vars: Vec<(String, String)> = std::fs::read_to_string(&env_file)
            .expect("env file")
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        let processes = FUNCTIONS.iter().flat_map(|&f| {
            std::iter::repeat_n(
                f,
                match f {
                    "agent" => agents,
                    "scheduler" => schedulers,
                    _ => 1,
                },
            )
        });
        for function in processes {
            use std::os::unix::process::CommandExt;
            let child = clean_command(bin_dir.join(function), &root)
                .envs(env_file_vars.iter().map(|(k, v)| (k, v)))
                .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt/{function}"))
                .env("AWS_LAMBDA_FUNCTION_NAME", function)
                .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("log"))
                .stderr(out.try_clone().expect("log"))
                // In cargo-lambda's group, so dropping `watch` stops the functions too.
                .process_group(group as i32)
                .spawn()
                .unwrap_or_else(|e| panic!("{function} starts: {e}"));
            watch.functions.push(child);
        }

        let sdk = sas_tests::sdk_config_per_service().await;
        let clients = endpoints.clients(&sdk);
        let sqs = clients.sqs.clone();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let sources = Arc::new(EventSources {
            http: reqwest::Client::new(),
            invoke_base: format!("http://127.0.0.1:{port}"),
            sqs: sqs.clone(),
            region: "us-east-1".into(),
            invocations: AtomicU64::new(0),
            failed_invocations: AtomicU64::new(0),
        });
        let mut pumps = Vec::new();
        let pollers = [("ORDERS_QUEUE_URL", "submission"), ("CALLBACK_QUEUE_URL", "scheduler")]
            .into_iter()
            .chain(std::iter::repeat_n(("SCHEDULER_QUEUE_URL", "scheduler"), schedulers))
            .chain(std::iter::repeat_n(("AGENT_QUEUE_URL", "agent"), agents));
        for (queue, function) in pollers {
            let (sources, url) = (sources.clone(), vars[queue].clone());
            let arn = sas::adapters::aws::provision::queue_arn(&sqs, &url, function)
                .await
                .expect("the queue's ARN");
            pumps.push(tokio::spawn(async move {
                loop {
                    sources.poll(&url, &arn, function).await;
                }
            }));
        }
        let store = DynamoStore::new(clients.dynamodb.clone(), TableNames::new(&vars["STATE_TABLE"]));
        Rig { watch, sources, vars, sqs, store, dir, prefix, pumps }
    }

    /// Sends each order to the orders queue, as an application does.
    async fn send_orders(&self, orders: impl IntoIterator<Item = String>) {
        for body in orders {
            self.sqs
                .send_message()
                .queue_url(&self.vars["ORDERS_QUEUE_URL"])
                .message_body(body)
                .send()
                .await
                .expect("order sent");
        }
    }

    /// Each order's state, read until every one has ended or `within` is up.
    async fn wait_for_ends(
        &self,
        ids: impl Iterator<Item = &String> + Clone,
        within: Duration,
    ) -> BTreeMap<String, Option<ProcessState>> {
        let deadline = Instant::now() + within;
        let mut states = BTreeMap::new();
        loop {
            for id in ids.clone() {
                let task = self.store.task(&OrderId::parse(id).expect("id")).await.expect("state table read");
                states.insert(id.clone(), task.map(|t| t.state()));
            }
            let ended = states.values().all(|s| s.is_some_and(|s| s.is_terminal()));
            if ended || Instant::now() > deadline {
                return states;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn stop_pumps(&mut self) {
        for pump in self.pumps.drain(..) {
            pump.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_end_processed_and_compensated_under_cargo_lambda_watch() {
    let Some(endpoints) = sas_tests::endpoints(TEST) else { return };
    let Some(tools) = cargo_lambda_dir(&repo_root()) else { return };
    let started = Instant::now();

    let remote = LoopbackRemote::start(
        RemoteFaults::default(),
        BTreeMap::from([("payment".to_owned(), RemoteFaults { permanent: 1.0, ..RemoteFaults::default() })]),
        7,
    )
    .await
    .expect("remote service");
    // The definition file: the built-in workflows, and `approve`, whose one step waits for
    // the outside, its agent a loopback service that keeps the token it is handed.
    let approvals = Approvals::serve().await;
    let definitions = |definitions: &mut Value| {
        definitions["agents"][callbacks::AGENT] = approvals.agent();
        definitions["workflows"].as_array_mut().expect("workflows").push(callbacks::workflow());
        // A parallel stage: the scheduler binary dispatches both branches at once, the
        // refused charge stops the stage, and only the reservation is released.
        definitions["workflows"].as_array_mut().expect("workflows").push(json!({
            "name": FAN_OUT,
            "steps": [{"parallel": {"name": "reserve-and-charge", "steps": [
                {"name": "reserve-stock", "agent": "inventory", "compensation": "release-stock"},
                {"name": "charge-payment", "agent": "payment", "compensation": "refund-payment"}]}}]
        }));
        // Flow control: the single-step orders' agent lets one call in at a time; the burst
        // of them waits its turn in the agent's gate, across the scheduler's invocations.
        definitions["agents"]["orders"]["max_in_flight"] = json!(1);
    };
    let mut rig = Rig::start(&endpoints, tools, definitions, &remote.base_url(), 1, 1).await;
    let (prefix, vars, sqs, sources) =
        (rig.prefix.clone(), rig.vars.clone(), rig.sqs.clone(), rig.sources.clone());

    // Orders to the orders queue, as an application sends them, status to the status queue.
    let status_url = vars["STATUS_QUEUE_URL"].clone();
    let mut expected = BTreeMap::new();
    let mut orders = Vec::new();
    for i in 0..SINGLE + THREE + STAGED {
        let (workflow, end) = if i < SINGLE {
            ("single-step", ProcessState::Processed)
        } else if i < SINGLE + THREE {
            ("three-step", ProcessState::Compensated)
        } else {
            (FAN_OUT, ProcessState::Compensated)
        };
        let id = format!("w-{prefix}-{i}");
        orders.push(order(&id, workflow, &status_url));
        expected.insert(id, end);
    }
    let waits = format!("w-{prefix}-cb");
    orders.push(order(&waits, callbacks::STEP, &status_url));
    rig.send_orders(orders).await;

    // The supervisor runs on its schedule until every order has ended (or time is up).
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = {
        let (sources, stop) = (sources.clone(), stop.clone());
        tokio::spawn(async move {
            let mut ok = 0u32;
            while !stop.load(Ordering::Relaxed) {
                match sources.tick().await {
                    Ok(report) if report.get("examined").is_some() => ok += 1,
                    Ok(other) => eprintln!("{TEST}: supervisor answered {other}"),
                    Err(e) => eprintln!("{TEST}: supervisor: {e}"),
                }
                tokio::time::sleep(SUPERVISOR_EVERY).await;
            }
            ok
        })
    };

    // The outside completes the waiting order through the callback queue, which the
    // scheduler binary serves as its second event source: first with a forged token (kept
    // in the callback DLQ with its reason), then with the token its agent was handed.
    let token = approvals.token(&waits, ORDERS_WITHIN).await;
    let (_, claims) = sas::domain::CallbackToken::parse(&token).expect("a token");
    let forged = json!({"token": callbacks::forged(&token), "outcome": "success"}).to_string();
    let send =
        |body: String| sqs.send_message().queue_url(&vars["CALLBACK_QUEUE_URL"]).message_body(body).send();
    send(forged.clone()).await.expect("completion sent");
    let kept = callbacks::take(&sqs, &vars["CALLBACK_DLQ_URL"], 1).await;
    assert_eq!(
        kept.get(&forged).cloned().flatten(),
        Some(format!(
            "callback refused: the token does not match the one issued for step 0 attempt {}",
            claims.attempt
        )),
        "kept by the scheduler binary: {kept:?}\n{}",
        rig.watch.tail()
    );
    send(json!({"token": token, "outcome": "success", "output": {"approved_by": "ops"}}).to_string())
        .await
        .expect("completion sent");
    expected.insert(waits.clone(), ProcessState::Processed);

    let states = rig.wait_for_ends(expected.keys(), ORDERS_WITHIN).await;
    rig.stop_pumps();
    stop.store(true, Ordering::Relaxed);
    let supervisor_runs = tokio::time::timeout(Duration::from_secs(130), ticks).await;

    let want: BTreeMap<String, Option<ProcessState>> =
        expected.iter().map(|(id, end)| (id.clone(), Some(*end))).collect();
    assert_eq!(
        states,
        want,
        "orders did not end as expected within {ORDERS_WITHIN:?} (invocations {}, failed {}); \
         cargo lambda watch's log (cargo's output and the functions' JSON logs) ends:\n{}",
        sources.invocations.load(Ordering::Relaxed),
        sources.failed_invocations.load(Ordering::Relaxed),
        rig.watch.tail()
    );
    let supervisor_runs = supervisor_runs.ok().and_then(Result::ok).unwrap_or(0);
    assert!(supervisor_runs >= 1, "the supervisor ran on its schedule:\n{}", rig.watch.tail());

    // The remote service saw it: each single-step order applied once; each three-step
    // order, and each fan-out order (its branches at once), reserved, was refused its
    // payment, and had its reservation released.
    let ledger = remote.ledger();
    for (id, end) in expected.iter().filter(|(id, _)| **id != waits) {
        let effects: Vec<(u32, Action)> =
            ledger.effects.iter().filter(|e| &e.1 == id).map(|e| (e.2, e.3)).collect();
        let want = match end {
            ProcessState::Processed => vec![(0, Action::Do)],
            _ => vec![(0, Action::Do), (0, Action::Undo)],
        };
        assert_eq!(effects, want, "{id}");
    }

    // The limited agent's gate: every place given back, every ticket's turn come.
    let gate =
        sas::ports::StateStore::gate(&rig.store, "orders").await.expect("gate read").expect("gate written");
    assert!(gate.holds.is_empty() && gate.waiting() == 0, "{gate:?}");

    // Nothing of the callback queue was taken for a scheduler message.
    assert_eq!(sas_tests::depth(&sqs, &vars["SCHEDULER_DLQ_URL"]).await, 0, "the scheduler DLQ is empty");

    // The agent said once why it ignores cargo-lambda's deadline.
    let log = std::fs::read_to_string(&rig.watch.log).unwrap_or_default();
    assert!(log.contains("not a real one"), "the agent logged the ignored deadline");
    eprintln!(
        "{TEST}: {} orders ended as expected in {:.1} s ({} invocations, {} supervisor runs)",
        expected.len(),
        started.elapsed().as_secs_f64(),
        sources.invocations.load(Ordering::Relaxed),
        supervisor_runs
    );
    // Passed: the env file and the log go (a failure keeps them for a look).
    let dir = rig.dir.clone();
    drop(rig);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hand-over's benchmark (docs/BENCHMARKS.md, section 11): a burst of single-step
/// orders through agent `orders` with `max_in_flight: 2`, its service answering each call
/// in 0-1,000 ms (500 on average), the functions on the settings the docs give them (the
/// scheduler's 300 ms send hold among them). Heavy, so it runs only with
/// `SAS_BENCH_HANDOVER=<orders>`, and prints one JSON line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_hand_over_under_cargo_lambda_watch() {
    const BENCH: &str = "bench_hand_over_under_cargo_lambda_watch";
    const PLACES: u64 = 2;
    const LATENCY_MAX_MS: u64 = 1_000;
    let Ok(orders) = std::env::var("SAS_BENCH_HANDOVER") else {
        eprintln!("{BENCH}: a benchmark; set SAS_BENCH_HANDOVER=<orders> to run it");
        return;
    };
    let orders: usize = orders.parse().expect("SAS_BENCH_HANDOVER: a number of orders");
    let Some(endpoints) = sas_tests::endpoints(BENCH) else { return };
    let Some(tools) = cargo_lambda_dir(&repo_root()) else { return };
    let slow = RemoteFaults { latency_max_ms: LATENCY_MAX_MS, ..RemoteFaults::default() };
    let remote =
        LoopbackRemote::start(RemoteFaults::default(), BTreeMap::from([("orders".to_owned(), slow)]), 7)
            .await
            .expect("remote service");
    let limit = |d: &mut Value| d["agents"]["orders"]["max_in_flight"] = json!(PLACES);
    let mut rig =
        Rig::start(&endpoints, tools, limit, &remote.base_url(), PLACES as usize, PLACES as usize).await;
    let ids: Vec<String> = (0..orders).map(|i| format!("h-{}-{i}", rig.prefix)).collect();
    let status_url = rig.vars["STATUS_QUEUE_URL"].clone();
    rig.send_orders(ids.iter().map(|id| order(id, "single-step", &status_url))).await;
    // The intake: until every order has come to the gate (all but the first `PLACES`
    // take a ticket), the scheduler also takes in the burst, and moto serves its calls
    // and the replies' one at a time. Marked on the service's clock, for the figures
    // of the rest of the burst beside the whole.
    let intake_until = Instant::now() + Duration::from_secs(60);
    let intake_us = loop {
        let gate = sas::ports::StateStore::gate(&rig.store, "orders").await.expect("gate read");
        if gate.is_some_and(|g| g.issued + PLACES >= orders as u64) || Instant::now() > intake_until {
            break remote.elapsed_us();
        }
        // Seldom: each read is one more call for moto to serve in turn.
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let within = Duration::from_secs(60 + 2 * orders as u64);
    let states = rig.wait_for_ends(ids.iter(), within).await;
    rig.stop_pumps();
    assert!(states.values().all(|s| *s == Some(ProcessState::Processed)), "{states:?}\n{}", rig.watch.tail());
    let flights = remote.flights().remove("orders").expect("the limited service was called");
    // Against what the places allow with each hand-over costing two hops (the p50 one):
    // places ÷ (the latency the service gave + two hops).
    let mean_latency_s = flights.open_us as f64 / flights.calls as f64 / 1e6;
    let whole = HandOvers::of(&flights, 0, mean_latency_s, PLACES);
    let after_intake = HandOvers::of(&flights, intake_us, mean_latency_s, PLACES);
    let latency_s = LATENCY_MAX_MS as f64 / 2_000.0;
    println!(
        "{}",
        json!({
            "orders": orders,
            "places": PLACES,
            "calls": flights.calls,
            "max_in_flight_seen": flights.max_in_flight,
            "calls_per_second": whole.calls_per_second,
            "of_places_over_latency": whole.calls_per_second / (PLACES as f64 / latency_s),
            "mean_latency_s": mean_latency_s,
            "of_places_over_latency_and_two_hops": whole.ratio,
            "hand_over_p50_s": whole.p50_s,
            "hand_over_p90_s": whole.p90_s,
            "hand_overs_longest_s": whole.longest_s,
            "intake_s": (intake_us.saturating_sub(flights.arrivals_us[0])) as f64 / 1e6,
            "after_intake": {
                "calls": after_intake.calls,
                "calls_per_second": after_intake.calls_per_second,
                "of_places_over_latency_and_two_hops": after_intake.ratio,
                "hand_over_p50_s": after_intake.p50_s,
                "hand_over_p90_s": after_intake.p90_s,
            },
            "invocations": rig.sources.invocations.load(Ordering::Relaxed),
        })
    );
    assert!(flights.max_in_flight <= PLACES, "{flights:?}");
}

/// The hand-over's figures over the calls that arrived from `from_us` on (the service's
/// clock).
struct HandOvers {
    calls: usize,
    calls_per_second: f64,
    /// Calls per second ÷ (places ÷ (mean latency + the p50 hand-over)).
    ratio: f64,
    p50_s: f64,
    p90_s: f64,
    longest_s: Vec<f64>,
}

impl HandOvers {
    fn of(
        flights: &sasctl::remote_sim::Flights,
        from_us: u64,
        mean_latency_s: f64,
        places: u64,
    ) -> HandOvers {
        let arrivals = &flights.arrivals_us;
        let first = arrivals.partition_point(|&a| a < from_us).min(arrivals.len() - 2);
        let span_s = (arrivals[arrivals.len() - 1] - arrivals[first]) as f64 / 1e6;
        let calls_per_second = (arrivals.len() - 1 - first) as f64 / span_s;
        // Between a call's answer and the next call's arrival: the reply's trip, the
        // claim, and the next request's trip. One per arrival after the first `places`.
        let skip = arrivals.len() - flights.hand_overs_us.len();
        let mut hand_overs: Vec<u64> = flights.hand_overs_us[first.saturating_sub(skip)..].to_vec();
        hand_overs.sort_unstable();
        let at = |q: f64| hand_overs[((hand_overs.len() - 1) as f64 * q) as usize] as f64 / 1e6;
        HandOvers {
            calls: arrivals.len() - first,
            calls_per_second,
            ratio: calls_per_second / (places as f64 / (mean_latency_s + at(0.5))),
            p50_s: at(0.5),
            p90_s: at(0.9),
            longest_s: hand_overs.iter().rev().take(3).map(|&us| us as f64 / 1e6).collect(),
        }
    }
}
