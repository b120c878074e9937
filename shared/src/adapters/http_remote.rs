//! The remote service over HTTP: `POST {base}/{agent}/{action-name}` with the order as
//! JSON and the idempotency key in the `Idempotency-Key` header. 2xx is success, 408,
//! 429 and 5xx are transient, any other 4xx is a permanent refusal.

use std::time::Duration;

use async_trait::async_trait;

use crate::ports::{RemoteCall, RemoteError, RemoteService};

pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The client is built on the first call, not in `new`: building it loads the root
/// certificates and sets up TLS (~3.5 ms), which would otherwise sit on the agent's cold
/// start init (docs/BENCHMARKS.md 5).
#[derive(Debug, Clone)]
pub struct HttpRemote {
    client: tokio::sync::OnceCell<reqwest::Client>,
    base_url: String,
}

impl HttpRemote {
    pub fn new(base_url: impl Into<String>) -> HttpRemote {
        HttpRemote {
            client: tokio::sync::OnceCell::new(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
        }
    }

    /// reqwest is built without a crypto provider (`rustls-no-provider`: its `rustls`
    /// feature would link aws-lc-rs), so ring is installed as the process's default first,
    /// unless something already installed one. Roots: the platform's, through
    /// rustls-platform-verifier (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
    fn build_client() -> Result<reqwest::Client, reqwest::Error> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder().connect_timeout(Duration::from_secs(2)).build()
    }

    /// The client, built by the first caller; a failed build is retried by the next call.
    async fn client(&self) -> Result<&reqwest::Client, RemoteError> {
        self.client
            .get_or_try_init(|| async { Self::build_client() })
            .await
            .map_err(|e| RemoteError::Transient(format!("building the HTTP client: {e}")))
    }
}

#[derive(serde::Serialize)]
struct CallBody<'a> {
    order_id: &'a str,
    step: u32,
    action: crate::domain::Action,
    order: &'a crate::domain::Order,
}

#[async_trait]
impl RemoteService for HttpRemote {
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<(), RemoteError> {
        let url = format!("{}/{}/{}", self.base_url, call.agent, call.step_name);
        let body = CallBody {
            order_id: call.order.order_id.as_str(),
            step: call.step,
            action: call.action,
            order: call.order,
        };
        let response = self
            .client()
            .await?
            .post(&url)
            .header(IDEMPOTENCY_HEADER, &call.idempotency_key.0)
            .timeout(Duration::from_millis(timeout_ms.max(1)))
            .json(&body)
            .send()
            .await
            .map_err(|e| RemoteError::Transient(format!("{url}: {e}")))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        let reason = format!("{url} answered {status}: {}", text.chars().take(200).collect::<String>());
        if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
            Err(RemoteError::Transient(reason))
        } else {
            Err(RemoteError::Permanent(reason))
        }
    }
}
