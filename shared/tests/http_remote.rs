//! HttpRemote against a loopback HTTP server: what a refusal tells the sender, what it
//! reads, and that it follows no redirect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sas::adapters::embedded::ManualClock;
use sas::adapters::http_remote::{HttpRemote, MIN_RETRY_AFTER_MS};
use sas::domain::{Action, IdempotencyKey, Order, OrderId, SECRET_RETRY_MS, SECRET_TTL_MS};
use sas::ports::{RemoteCall, RemoteError, RemoteService};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `answer` to every request and counts the requests; returns its base URL.
async fn serve(answer: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(&answer).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, hits)
}

fn order() -> Order {
    Order {
        order_id: OrderId::parse("o-1").unwrap(),
        customer_id: "c-1".into(),
        items: vec![],
        workflow: "single-step".into(),
        workflow_version: None,
    }
}

async fn call(base: &str) -> Result<Vec<u8>, RemoteError> {
    let order = order();
    let key = IdempotencyKey("o-1:0:do".into());
    let outputs =
        std::collections::BTreeMap::from([("reserve".to_owned(), serde_json::json!({"id": "r-1"}))]);
    let call = RemoteCall {
        agent: "orders",
        action: Action::Do,
        step: 0,
        step_name: "process-order",
        idempotency_key: &key,
        order: &order,
        outputs: &outputs,
        callback_token: None,
        index: None,
        item: None,
    };
    HttpRemote::new(base).call(&call, 5_000).await
}

#[tokio::test]
async fn a_success_answers_its_body_read_only_as_far_as_the_output_limit() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"charge\":\"c1\"}".to_vec();
    let (base, _) = serve(answer).await;
    assert_eq!(call(&base).await.unwrap(), br#"{"charge":"c1"}"#.to_vec());

    let body = "x".repeat(1_000_000);
    let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let (base, _) = serve(answer.into_bytes()).await;
    let got = call(&base).await.unwrap();
    assert_eq!(got.len(), sas::domain::MAX_OUTPUT_BYTES + 1, "enough to tell it is too large, no more");
    assert!(matches!(
        sas::domain::StepOutput::from_body(&got),
        Err(sas::domain::OutputError::TooLarge { .. })
    ));
}

#[tokio::test]
async fn a_refusal_says_only_the_status_class() {
    // A huge body, a secret in the URL: neither reaches the reason.
    let body = "secret-detail ".repeat(100_000);
    let answer = format!("HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let (base, _) = serve(answer.into_bytes()).await;
    let with_token = base.replace("http://", "http://user:token@") + "/?key=secret";
    let err = call(&with_token).await.unwrap_err();
    let RemoteError::Permanent { reason, detail } = err else { panic!("{err:?}") };
    assert_eq!(reason, "the remote service refused (HTTP 4xx)");
    // The operator's detail: the service's answer, bounded, and the URL without secrets.
    let detail = detail.expect("a refusal keeps its detail for operators");
    assert!(detail.len() <= sas::domain::MAX_REASON_BYTES, "{} bytes", detail.len());
    assert!(detail.contains("403") && detail.contains("secret-detail"), "{detail}");
    assert!(!detail.contains("token") && !detail.contains("key=secret"), "{detail}");

    let answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy".to_vec();
    let (base, _) = serve(answer).await;
    assert_eq!(
        call(&base).await.unwrap_err(),
        RemoteError::Transient("the remote service is unavailable (HTTP 5xx)".into())
    );
}

/// A 429 or 503 with Retry-After is `Busy` with its delay: seconds, or an HTTP date counted
/// from the adapter's clock, and never under a second; a value of neither form is no
/// Retry-After at all.
#[tokio::test]
async fn retry_after_in_seconds_or_as_a_date_is_busy_with_its_delay() {
    // Wed, 21 Oct 2015 07:28:00 GMT.
    let now = 1_445_412_480_000;
    let answers = [
        ("503 Service Unavailable", "Wed, 21 Oct 2015 07:28:30 GMT", Some(30_000)),
        ("429 Too Many Requests", "2", Some(2_000)),
        ("503 Service Unavailable", "0", Some(MIN_RETRY_AFTER_MS)),
        ("429 Too Many Requests", "Tue, 20 Oct 2015 07:28:00 GMT", Some(MIN_RETRY_AFTER_MS)),
        ("503 Service Unavailable", "in a while", None),
    ];
    for (status, retry_after, delay) in answers {
        let answer =
            format!("HTTP/1.1 {status}\r\nRetry-After: {retry_after}\r\nContent-Length: 4\r\n\r\nbusy");
        let (base, _) = serve(answer.into_bytes()).await;
        let remote =
            HttpRemote::new(&base).with_agents(&agents_at(&base)).with_clock(Arc::new(ManualClock::at(now)));
        let err = call_agent(&remote, "plain").await.unwrap_err();
        let class = if status.starts_with('5') { "5xx" } else { "4xx" };
        match delay {
            Some(retry_after_ms) => assert_eq!(
                err,
                RemoteError::Busy {
                    reason: format!("the remote service asked to wait (HTTP {class}, Retry-After)"),
                    retry_after_ms
                },
                "{retry_after}"
            ),
            None => assert_eq!(
                err,
                RemoteError::Transient(format!("the remote service is unavailable (HTTP {class})")),
                "{retry_after}"
            ),
        }
    }
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let (elsewhere, hits) = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec()).await;
    let answer = format!(
        "HTTP/1.1 308 Permanent Redirect\r\nLocation: {elsewhere}/steal\r\nContent-Length: 0\r\n\r\n"
    );
    let (base, _) = serve(answer.into_bytes()).await;
    let err = call(&base).await.unwrap_err();
    // Not followed, and not a refusal: the work may have been done before the redirect.
    assert_eq!(err, RemoteError::Transient("the remote service redirected (HTTP 3xx, not followed)".into()));
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the order was not re-sent to the redirect's target");
}

#[tokio::test]
async fn an_unreachable_service_is_transient_and_its_url_is_not_in_the_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://user:token@{}/?key=secret", listener.local_addr().unwrap());
    drop(listener);
    let err = call(&base).await.unwrap_err();
    assert_eq!(err, RemoteError::Transient("the remote service could not be reached".into()));
}

/// Answers 200 to every request and keeps each request's head (request line and
/// headers); returns its base URL.
async fn serve_recording() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    serve_answering(|_| OK).await
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const UNAUTHORIZED: &[u8] =
    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 13\r\nConnection: close\r\n\r\nbad token xyz";

/// Answers each request as `answer` says from its head (lower-cased), and keeps the heads.
async fn serve_answering(
    answer: impl Fn(&str) -> &'static [u8] + Send + Sync + 'static,
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let answer = Arc::new(answer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let kept = kept.clone();
            let answer = answer.clone();
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
                let head = text.split("\r\n\r\n").next().unwrap_or_default().to_owned();
                let reply = answer(&head.to_ascii_lowercase());
                kept.lock().unwrap().push(head);
                let _ = socket.write_all(reply).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, heads)
}

/// A secret store holding values by source, counting reads; a source not (yet) held
/// fails as the real store does for a missing parameter.
#[derive(Default)]
struct CountingSecrets {
    values: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    reads: AtomicUsize,
}

#[async_trait::async_trait]
impl sas::ports::Secrets for CountingSecrets {
    async fn get(
        &self,
        source: &sas::domain::SecretSource,
    ) -> Result<sas::domain::SecretValue, sas::ports::SecretError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        // Suspend as a network read does, so concurrent first calls overlap.
        tokio::task::yield_now().await;
        match self.values.lock().unwrap().get(&source.to_string()) {
            Some(v) => Ok(sas::domain::SecretValue::new(v.clone())),
            None => Err(sas::ports::SecretError {
                source_name: source.to_string(),
                reason: "ParameterNotFound".into(),
            }),
        }
    }
}

/// Auth to a loopback http service, which `Definitions::parse` refuses (a secret goes only
/// over https): parsed unchecked, to test the adapter on its own.
fn agents_at(base: &str) -> std::collections::BTreeMap<String, sas::domain::definitions::AgentDef> {
    let text = format!(
        r#"{{"agents": {{
            "payment": {{"url": "{base}/pay", "auth": {{"header": "Authorization", "secret": "ssm:/sas/pay", "prefix": "Bearer "}}}},
            "plain": {{"url": "{base}/plain"}}}},
          "workflows": [{{"name": "w", "steps": [{{"name": "charge", "agent": "payment"}}, {{"name": "read", "agent": "plain"}}]}}]}}"#
    );
    sas::domain::definitions::DefinitionFile::parse(&text).unwrap().agents
}

async fn call_agent(remote: &HttpRemote, agent: &str) -> Result<Vec<u8>, RemoteError> {
    let order = order();
    let key = IdempotencyKey("o-1:0:do".into());
    let outputs = std::collections::BTreeMap::new();
    let call = RemoteCall {
        agent,
        action: Action::Do,
        step: 0,
        step_name: "charge",
        idempotency_key: &key,
        order: &order,
        outputs: &outputs,
        callback_token: None,
        index: None,
        item: None,
    };
    remote.call(&call, 5_000).await
}

#[tokio::test]
async fn an_agents_auth_header_is_read_once_and_sent_on_every_call() {
    let (base, heads) = serve_recording().await;
    let secrets = Arc::new(CountingSecrets::default());
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "t0ken-abc".into());
    let remote = HttpRemote::new(&base).with_agents(&agents_at(&base)).with_secrets(secrets.clone());

    // Ten calls at once, as a batch makes them, then ten more: one read between them.
    let calls: Vec<_> = (0..10).map(|_| call_agent(&remote, "payment")).collect();
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    for _ in 0..10 {
        call_agent(&remote, "payment").await.unwrap();
    }
    call_agent(&remote, "plain").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 1, "read once, then kept");

    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 21);
    let (pay, plain): (Vec<&String>, Vec<&String>) = heads.iter().partition(|h| h.starts_with("POST /pay/"));
    assert_eq!(pay.len(), 20);
    for head in pay {
        assert!(head.to_ascii_lowercase().contains("\r\nauthorization: bearer t0ken-abc"), "{head}");
    }
    assert!(!plain[0].to_ascii_lowercase().contains("authorization"), "{}", plain[0]);
    assert!(!format!("{remote:?}").contains("t0ken"), "{remote:?}");
}

#[tokio::test]
async fn a_failed_read_fails_that_call_as_transient_and_the_next_call_reads_again() {
    let (base, heads) = serve_recording().await;
    let secrets = Arc::new(CountingSecrets::default());
    let remote = HttpRemote::new(&base).with_agents(&agents_at(&base)).with_secrets(secrets.clone());

    let err = call_agent(&remote, "payment").await.unwrap_err();
    assert_eq!(err, RemoteError::Transient("the auth secret of agent payment could not be read".into()));
    assert!(heads.lock().unwrap().is_empty(), "nothing is sent without the header");

    // An empty value and one that cannot be a header value are mistakes in the store: the
    // call fails the same way, and neither the value nor its start reaches the reason.
    for bad in ["", "t0ken\r\nX-Evil: 1"] {
        secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), bad.into());
        let err = call_agent(&remote, "payment").await.unwrap_err();
        assert_eq!(err, RemoteError::Transient("the auth secret of agent payment could not be read".into()));
    }
    assert!(heads.lock().unwrap().is_empty());

    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "t0ken-late".into());
    call_agent(&remote, "payment").await.unwrap();
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 4, "three failed reads, then one that is kept");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    assert!(heads.iter().all(|h| h.to_ascii_lowercase().contains("\r\nauthorization: bearer t0ken-late")));

    // Without a store the header is never sent half-formed: the call fails.
    let remote = HttpRemote::new(&base).with_agents(&agents_at(&base));
    assert!(matches!(call_agent(&remote, "payment").await, Err(RemoteError::Transient(_))));
    assert_eq!(call_agent(&remote, "plain").await, Ok(Vec::new()));
}

/// Issue 24, finding 3: a value is kept for its TTL, then read again, so a rotated secret
/// is picked up without a call being refused first. Time is a manual clock.
#[tokio::test]
async fn a_value_is_read_again_once_its_ttl_has_passed() {
    let (base, heads) = serve_recording().await;
    let secrets = Arc::new(CountingSecrets::default());
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "v1".into());
    let clock = Arc::new(ManualClock::at(1_000_000));
    let remote = HttpRemote::new(&base)
        .with_agents(&agents_at(&base))
        .with_secrets(secrets.clone())
        .with_clock(clock.clone());

    call_agent(&remote, "payment").await.unwrap();
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "v2".into());
    clock.advance(SECRET_TTL_MS - 1);
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 1, "still fresh");
    clock.advance(1);
    call_agent(&remote, "payment").await.unwrap();
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 2, "read again at its TTL, then kept");
    let sent: Vec<bool> =
        heads.lock().unwrap().iter().map(|h| h.to_ascii_lowercase().contains("bearer v2")).collect();
    assert_eq!(sent, [false, false, true, true]);

    // The store out when the value is due: the value read before is used, and the store
    // is tried again SECRET_RETRY_MS later, not on every call.
    secrets.values.lock().unwrap().clear();
    clock.advance(SECRET_TTL_MS);
    call_agent(&remote, "payment").await.expect("the value read before is still used");
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 3);
    clock.advance(SECRET_RETRY_MS);
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "v3".into());
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 4);
    assert!(heads.lock().unwrap().last().unwrap().to_ascii_lowercase().contains("bearer v3"));
}

/// Issue 24, finding 3: a 401 or 403 to a call with auth drops the value sent, so the next
/// call reads the secret afresh, and says it was the credentials; without auth it stays a
/// refusal.
#[tokio::test]
async fn a_401_or_403_with_auth_drops_the_value_and_the_next_call_reads_it_afresh() {
    const FORBIDDEN: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let (base, heads) = serve_answering(|head| match head {
        h if h.starts_with("post /plain/") => UNAUTHORIZED,
        h if h.contains("\r\nauthorization: bearer new") => OK,
        h if h.contains("\r\nauthorization: bearer revoked") => FORBIDDEN,
        _ => UNAUTHORIZED,
    })
    .await;
    let secrets = Arc::new(CountingSecrets::default());
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "old".into());
    let remote = HttpRemote::new(&base)
        .with_agents(&agents_at(&base))
        .with_secrets(secrets.clone())
        .with_clock(Arc::new(ManualClock::at(1_000_000)));

    let err = call_agent(&remote, "payment").await.unwrap_err();
    let RemoteError::AuthRefused { reason, detail } = err else { panic!("{err:?}") };
    assert_eq!(reason, "the remote service refused the agent's credentials (HTTP 4xx)");
    let detail = detail.unwrap();
    // The answer's body is not kept: an answer to bad credentials may quote them.
    assert!(detail.contains("401") && !detail.contains("bad token xyz"), "{detail}");
    // Rotated meanwhile: the next call reads it, within the TTL.
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "new".into());
    call_agent(&remote, "payment").await.unwrap();
    call_agent(&remote, "payment").await.unwrap();
    assert_eq!(secrets.reads.load(Ordering::SeqCst), 2, "read again after the refusal only");

    // A 403 counts the same; the value read afresh is refused again the same way (the
    // agent decides what a second refusal means).
    secrets.values.lock().unwrap().insert("ssm:/sas/pay".into(), "revoked".into());
    let (remote, reads) = (
        HttpRemote::new(&base).with_agents(&agents_at(&base)).with_secrets(secrets.clone()),
        secrets.reads.load(Ordering::SeqCst),
    );
    for _ in 0..2 {
        let err = call_agent(&remote, "payment").await.unwrap_err();
        assert!(matches!(err, RemoteError::AuthRefused { .. }), "{err:?}");
    }
    assert_eq!(secrets.reads.load(Ordering::SeqCst), reads + 2, "each refusal drops the value");

    // No auth sent: a 401 is the service's refusal of the step, as before.
    let err = call_agent(&remote, "plain").await.unwrap_err();
    assert!(
        matches!(&err, RemoteError::Permanent { reason, .. } if reason == "the remote service refused (HTTP 4xx)"),
        "{err:?}"
    );
    assert_eq!(heads.lock().unwrap().len(), 6);
}

/// A call printed with `{:?}` (a log line someone may add) shows a callback token only up
/// to its secret.
#[test]
fn a_calls_debug_never_shows_a_callback_tokens_secret() {
    let order = order();
    let key = IdempotencyKey("o-1:0:do".into());
    let outputs = std::collections::BTreeMap::new();
    let secret = "ab".repeat(32);
    let token = format!("sas1.o-1.0.1.{secret}");
    let call = RemoteCall {
        agent: "approvals",
        action: Action::Do,
        step: 0,
        step_name: "approve",
        idempotency_key: &key,
        order: &order,
        outputs: &outputs,
        callback_token: Some(&token),
        index: None,
        item: None,
    };
    let shown = format!("{call:?}");
    assert!(!shown.contains(&secret), "{shown}");
    assert!(shown.contains("sas1.o-1.0.1.…"), "{shown}");
}
