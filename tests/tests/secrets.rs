//! Agents' auth against the test endpoint: the Parameter Store and Secrets Manager adapter
//! reads what the SDK put there, `HttpRemote` sends it as the agent's header on every
//! call to a loopback service, each secret is read once for many calls, a secret that
//! appears late is read on the next call, and no log line (at TRACE, SDK included) holds
//! a value.

use sas_tests::Lines;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sas::adapters::aws::AwsSecrets;
use sas::adapters::http_remote::HttpRemote;
use sas::domain::definitions::DefinitionFile;
use sas::domain::{Action, IdempotencyKey, Order, OrderId, SecretSource, SecretValue};
use sas::ports::{RemoteCall, RemoteError, RemoteService, SecretError, Secrets};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The real adapter, with its reads counted.
struct Counted {
    inner: AwsSecrets,
    reads: Mutex<BTreeMap<String, usize>>,
}

#[async_trait]
impl Secrets for Counted {
    async fn get(&self, source: &SecretSource) -> Result<SecretValue, SecretError> {
        *self.reads.lock().unwrap().entry(source.to_string()).or_default() += 1;
        self.inner.get(source).await
    }
}

/// Answers 200 to every request and keeps each request's head; returns its base URL.
async fn serve_recording() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                kept.lock().unwrap().push(text.split("\r\n\r\n").next().unwrap_or_default().to_owned());
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, heads)
}

/// This thread's log lines, in the functions' format at the most verbose level a
/// deployment may set, go to `lines` until the guard is dropped.
fn log_into(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_default(subscriber)
}

async fn call(remote: &HttpRemote, agent: &str) -> Result<Vec<u8>, RemoteError> {
    let order = Order {
        order_id: OrderId::parse("o-1").unwrap(),
        customer_id: "c-1".into(),
        items: vec![],
        workflow: "w".into(),
        workflow_version: None,
    };
    let key = IdempotencyKey("o-1:0:do".into());
    let outputs = BTreeMap::new();
    let call = RemoteCall {
        agent,
        action: Action::Do,
        step: 0,
        step_name: "s",
        idempotency_key: &key,
        order: &order,
        outputs: &outputs,
        callback_token: None,
        index: None,
        item: None,
    };
    remote.call(&call, 5_000).await
}

// Current-thread runtime: the log subscriber below is this thread's default, and every
// task (the SDK's, hyper's, the server's) runs on this thread.
#[tokio::test]
async fn auth_headers_come_from_parameter_store_and_secrets_manager_once_each() {
    let Some(endpoint) =
        sas_tests::endpoint("auth_headers_come_from_parameter_store_and_secrets_manager_once_each")
    else {
        return;
    };
    let sdk = sas_tests::sdk_config(&endpoint).await;
    let prefix = sas_tests::unique_prefix("secrets");
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let secretsmanager = aws_sdk_secretsmanager::Client::new(&sdk);
    let nonce = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (ssm_value, sm_value, late_value) =
        (format!("ssm-{nonce}"), format!("sm-{nonce}"), format!("late-{nonce}"));
    let parameter = format!("/{prefix}/payment/token");
    ssm.put_parameter()
        .name(&parameter)
        .value(&ssm_value)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("put SecureString");
    let by_name = format!("{prefix}-inventory-key");
    secretsmanager
        .create_secret()
        .name(&by_name)
        .secret_string(&sm_value)
        .send()
        .await
        .expect("create secret");
    let by_arn = secretsmanager
        .create_secret()
        .name(format!("{prefix}-shipping-key"))
        .secret_string(&sm_value)
        .send()
        .await
        .expect("create secret")
        .arn
        .expect("the new secret's ARN");
    // In another region than the agent's (issue 24, finding 6): read there, by its ARN.
    let abroad = aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::config::Builder::from(&sdk)
            .region(aws_config::Region::new("eu-west-2"))
            .build(),
    )
    .create_secret()
    .name(format!("{prefix}-abroad-key"))
    .secret_string(&sm_value)
    .send()
    .await
    .expect("create secret in eu-west-2")
    .arn
    .expect("the new secret's ARN");
    assert!(abroad.contains(":eu-west-2:"), "{abroad}");

    // Logged from here on, except the test's own writes (the SDK may trace a request's
    // body, and a PutParameter's body is the value).
    let lines = Lines::default();
    let mut logging = Some(log_into(&lines));

    let (base, heads) = serve_recording().await;
    let text = format!(
        r#"{{"agents": {{
            "payment": {{"url": "{base}/payment", "auth": {{"header": "Authorization", "secret": "ssm:{parameter}", "prefix": "Bearer "}}}},
            "inventory": {{"url": "{base}/inventory", "auth": {{"header": "X-Api-Key", "secret": "secretsmanager:{by_name}"}}}},
            "shipping": {{"url": "{base}/shipping", "auth": {{"header": "X-Api-Key", "secret": "secretsmanager:{by_arn}"}}}},
            "abroad": {{"url": "{base}/abroad", "auth": {{"header": "X-Api-Key", "secret": "secretsmanager:{abroad}"}}}},
            "late": {{"url": "{base}/late", "auth": {{"header": "X-Api-Key", "secret": "ssm:/{prefix}/late"}}}}}},
          "workflows": [{{"name": "w", "steps": [
            {{"name": "a", "agent": "payment"}}, {{"name": "b", "agent": "inventory"}},
            {{"name": "c", "agent": "shipping"}}, {{"name": "d", "agent": "late"}}, {{"name": "e", "agent": "abroad"}}]}}]}}"#
    );
    // Auth to a loopback http service, which `Definitions::parse` refuses (a secret goes
    // only over https): parsed unchecked, to test the adapters against a local service.
    let definitions = DefinitionFile::parse(&text).expect("definitions that parse");
    let secrets = Arc::new(Counted { inner: AwsSecrets::new(&sdk), reads: Mutex::default() });
    let remote = HttpRemote::new(&base).with_agents(&definitions.agents).with_secrets(secrets.clone());

    for _ in 0..5 {
        let batch = ["payment", "inventory", "shipping"].map(|agent| call(&remote, agent));
        for result in futures::future::join_all(batch).await {
            result.expect("call with auth");
        }
    }
    let reads = secrets.reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert!(reads.values().all(|&n| n == 1), "each secret read once for 5 calls: {reads:?}");
    let heads_now = heads.lock().unwrap().clone();
    assert_eq!(heads_now.len(), 15);
    let lower = |h: &String| h.to_ascii_lowercase();
    let of = |agent: &str| -> Vec<String> {
        heads_now.iter().filter(|h| h.starts_with(&format!("POST /{agent}/"))).map(lower).collect()
    };
    assert!(of("payment").iter().all(|h| h.contains(&format!("\r\nauthorization: bearer {ssm_value}"))));
    assert!(of("inventory").iter().all(|h| h.contains(&format!("\r\nx-api-key: {sm_value}"))));
    assert!(of("shipping").iter().all(|h| h.contains(&format!("\r\nx-api-key: {sm_value}"))));
    assert_eq!(of("payment").len() + of("inventory").len() + of("shipping").len(), 15);

    call(&remote, "abroad").await.expect("read in the ARN's region, not the agent's");
    let last = heads.lock().unwrap().last().cloned().unwrap();
    assert!(
        lower(&last).starts_with("post /abroad/")
            && lower(&last).contains(&format!("\r\nx-api-key: {sm_value}"))
    );

    // Not there yet: the call fails as transient, naming the agent only; once the
    // parameter exists, the next call reads it.
    let err = call(&remote, "late").await.unwrap_err();
    assert_eq!(err, RemoteError::Transient("the auth secret of agent late could not be read".into()));
    drop(logging.take());
    ssm.put_parameter()
        .name(format!("/{prefix}/late"))
        .value(&late_value)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("put SecureString");
    logging = Some(log_into(&lines));
    call(&remote, "late").await.expect("the next call reads it");
    call(&remote, "late").await.expect("and keeps it");
    assert_eq!(secrets.reads.lock().unwrap()[&format!("ssm:/{prefix}/late")], 2);
    let last = heads.lock().unwrap().last().cloned().unwrap();
    assert!(lower(&last).contains(&format!("\r\nx-api-key: {late_value}")), "{last}");

    assert!(!format!("{remote:?}").contains(nonce), "Debug shows no value: {remote:?}");
    drop(logging);
    let logged = String::from_utf8_lossy(&lines.0.lock().unwrap()).into_owned();
    assert!(logged.contains("read the agent's auth secret"), "the reads are logged");
    assert!(logged.contains("reading the agent's auth secret failed"), "the failed read is logged");
    assert!(!logged.contains(nonce), "a value reached the log:\n{logged}");
}
