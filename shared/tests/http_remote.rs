//! HttpRemote against a loopback HTTP server: what a refusal tells the sender, what it
//! reads, and that it follows no redirect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sas::adapters::http_remote::HttpRemote;
use sas::domain::{Action, IdempotencyKey, Order, OrderId};
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
