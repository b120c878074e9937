//! The remote service over HTTP: `POST {base}/{agent}/{action-name}` with the order as
//! JSON and the idempotency key in the `Idempotency-Key` header. 2xx is success, 408,
//! 429 and 5xx are transient, any other 4xx is a permanent refusal.

use std::time::Duration;

use async_trait::async_trait;

use crate::ports::{RemoteCall, RemoteError, RemoteService};

pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

#[derive(Debug, Clone)]
pub struct HttpRemote {
    client: reqwest::Client,
    base_url: String,
}

impl HttpRemote {
    pub fn new(base_url: impl Into<String>) -> Result<HttpRemote, reqwest::Error> {
        let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(2)).build()?;
        Ok(HttpRemote { client, base_url: base_url.into().trim_end_matches('/').to_owned() })
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
            .client
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
