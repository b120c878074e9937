//! What the callback tests share: the remote service of a callback step (it starts the
//! work and keeps the token it was handed, as an outside system does), the workflow that
//! waits on it, and reading a dead-letter queue's kept messages with their reasons.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use sas::handlers::REASON_ATTRIBUTE;

/// The agent of the callback step, and the step's name.
pub const AGENT: &str = "approvals";
pub const STEP: &str = "approve";

/// The workflow `approve`: one callback step on agent `approvals`, ten minutes to complete.
pub fn workflow() -> serde_json::Value {
    serde_json::json!({"name": STEP, "steps": [
        {"name": STEP, "agent": AGENT, "callback": {"timeout_ms": 600_000}}]})
}

/// A loopback service answering the callback step's calls: it starts the work (a 200 with
/// a ticket) and keeps each order's token.
#[derive(Clone)]
pub struct Approvals {
    /// The agent's `url` (calls come to `{url}/{step}`).
    pub url: String,
    tokens: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Approvals {
    pub async fn serve() -> Approvals {
        async fn start(
            State(approvals): State<Approvals>,
            Path(step): Path<String>,
            body: axum::Json<serde_json::Value>,
        ) -> (StatusCode, String) {
            let order = body["order_id"].as_str().unwrap_or_default().to_owned();
            match body["callback_token"].as_str() {
                Some(token) if step == STEP => {
                    approvals.tokens.lock().unwrap().insert(order, token.to_owned());
                    (StatusCode::OK, r#"{"ticket":"T-1"}"#.into())
                }
                _ => (StatusCode::BAD_REQUEST, format!("no callback token for step {step}")),
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/{AGENT}", listener.local_addr().expect("addr"));
        let approvals = Approvals { url, tokens: Arc::default() };
        let app =
            Router::new().route(&format!("/{AGENT}/{{step}}"), post(start)).with_state(approvals.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        approvals
    }

    /// The agent's definition: this service as its own url.
    pub fn agent(&self) -> serde_json::Value {
        serde_json::json!({"url": self.url, "timeout_ms": 2000})
    }

    /// The token the service was handed for `order_id`, waiting for it up to `within`.
    pub async fn token(&self, order_id: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(token) = self.tokens.lock().unwrap().get(order_id) {
                return token.clone();
            }
            assert!(Instant::now() < deadline, "no token for {order_id} within {within:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `token` with another secret: its order, step and attempt, so only the digest tells.
pub fn forged(token: &str) -> String {
    let (head, secret) = token.rsplit_once('.').expect("a token");
    let other = if secret.starts_with('0') { "1" } else { "0" };
    format!("{head}.{}", other.repeat(secret.len()))
}

/// The next `n` messages of `queue` (waiting for them up to a minute), each body with its
/// `sas-reason`, removed from the queue.
pub async fn take(sqs: &aws_sdk_sqs::Client, queue: &str, n: usize) -> BTreeMap<String, Option<String>> {
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} messages in {queue}: {got:?}", got.len());
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .expect("receive");
        for m in out.messages() {
            let reason = m
                .message_attributes()
                .and_then(|a| a.get(REASON_ATTRIBUTE))
                .and_then(|v| v.string_value())
                .map(str::to_owned);
            got.insert(m.body().unwrap_or_default().to_owned(), reason);
            if let Some(receipt) = m.receipt_handle() {
                sqs.delete_message().queue_url(queue).receipt_handle(receipt).send().await.expect("delete");
            }
        }
    }
    got
}
