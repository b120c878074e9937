//! The remote services over HTTP: `POST {agent's url}/{action-name}` (by default
//! `{REMOTE_SERVICE_URL}/{agent}/{action-name}`) with the order as JSON and the
//! idempotency key in the `Idempotency-Key` header, the outputs of earlier steps, and a
//! callback step's token.
//! 2xx is success, its body the step's output; 3xx (not followed), 408, 409, 429 and 5xx
//! are transient (a 429 or 503 with a Retry-After, in seconds or as an HTTP date, is
//! `Busy`, with its delay, at least [`MIN_RETRY_AFTER_MS`]); any other 4xx is a refusal,
//! except a 401 or 403 to a call with the agent's auth header, which may be a rotated
//! secret ([`RemoteError::AuthRefused`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};

use crate::adapters::system::SystemClock;
use crate::domain::definitions::AgentDef;
use crate::domain::{MAX_OUTPUT_BYTES, SECRET_RETRY_MS, SECRET_TTL_MS, SecretSource, Timestamp, cut_reason};
use crate::ports::{Clock, RemoteCall, RemoteError, RemoteService, Secrets};

pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The most of an error answer's body that is read, for the log line: the rest is never
/// read, however large the remote service makes it.
pub const MAX_ERROR_BODY_BYTES: usize = 1_024;

/// The shortest delay a Retry-After buys, for the agent's own retries too (the domain
/// holds a task's and a gate's pause to the same floor, `gate::pause_ms`). No cap here:
/// the gate cuts a pause to `MAX_PAUSE_MS`, and an agent without limits does not wait
/// past complete-by.
pub const MIN_RETRY_AFTER_MS: u64 = crate::domain::gate::MIN_PAUSE_MS;

/// The client is built on the first call, not in `new`: building it loads the root
/// certificates and sets up TLS (~3.5 ms), which would otherwise sit on the agent's cold
/// start init (docs/BENCHMARKS.md 5).
///
/// What a call's error says is generic (what failed and the status class): it becomes the
/// reply's reason, which reaches the order's `reply_to`. The details (URL without userinfo
/// or query, status, the start of the body) go to this function's log only.
///
/// An agent with `auth` sends its header on every call. The value is read through the
/// [`Secrets`] port on that agent's first call (not at cold start: most invocations never
/// need it before their first call anyway) and kept for [`SECRET_TTL_MS`], then read again
/// (a failed re-read keeps the old value for [`SECRET_RETRY_MS`] more). A first read that
/// fails fails that call as transient and is tried again by the next one. A 401 or 403 to a
/// call that carried the value drops it, so the next call reads the secret afresh.
#[derive(Clone)]
pub struct HttpRemote {
    client: tokio::sync::OnceCell<reqwest::Client>,
    /// `None` when the configured URL does not parse (config refuses that at cold start).
    base_url: Option<url::Url>,
    /// Per agent, from the definition file: its own base URL, call timeout and auth.
    agents: BTreeMap<String, Endpoint>,
    /// Where auth values are read; `None` until [`HttpRemote::with_secrets`].
    secrets: Option<Arc<dyn Secrets>>,
    /// When a value read is due to be read again, and how far off a Retry-After's date is.
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for HttpRemote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRemote")
            .field("base_url", &self.base_url.as_ref().map(redacted))
            .field("agents", &self.agents)
            .field("secrets", &self.secrets.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Default)]
struct Endpoint {
    /// `None`: the default base with the agent's name appended.
    base: Option<url::Url>,
    timeout_ms: Option<u64>,
    /// Shared by clones, so every clone reads the secret once between them.
    auth: Option<Arc<AuthHeader>>,
}

/// One agent's auth header: its name, and its value once read.
struct AuthHeader {
    name: HeaderName,
    prefix: String,
    source: SecretSource,
    /// The value last read, if it is still to be used. An async lock, held across a read:
    /// concurrent calls that find no fresh value wait for one read instead of each making
    /// their own.
    cached: tokio::sync::Mutex<Option<Cached>>,
}

struct Cached {
    /// `prefix + value`, marked sensitive (reqwest and hyper then keep it out of their own
    /// debug output).
    value: HeaderValue,
    /// Until when it is used without reading the secret again.
    fresh_until: Timestamp,
}

impl fmt::Debug for AuthHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = match self.cached.try_lock() {
            Ok(cached) if cached.is_some() => "***",
            Ok(_) => "(not read)",
            Err(_) => "(being read)",
        };
        f.debug_struct("AuthHeader")
            .field("name", &self.name)
            .field("source", &self.source.to_string())
            .field("value", &value)
            .finish()
    }
}

impl HttpRemote {
    pub fn new(base_url: impl Into<String>) -> HttpRemote {
        HttpRemote {
            client: tokio::sync::OnceCell::new(),
            base_url: url::Url::parse(&base_url.into()).ok(),
            agents: BTreeMap::new(),
            secrets: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// The clock that ages the values read and counts down to a Retry-After's date (the
    /// system's by default).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> HttpRemote {
        self.clock = clock;
        self
    }

    /// Each agent's own URL, call timeout and auth header, as its definition gives them.
    /// The definitions were checked (`DefinitionFile::check`); an auth whose header or
    /// source would not parse is left out here, never sent half-formed.
    pub fn with_agents(mut self, agents: &BTreeMap<String, AgentDef>) -> HttpRemote {
        self.agents = agents
            .iter()
            .map(|(name, def)| {
                let base = def.url.as_deref().and_then(|u| url::Url::parse(u).ok());
                let auth = def.auth.as_ref().and_then(|a| {
                    Some(Arc::new(AuthHeader {
                        name: HeaderName::from_bytes(a.header.as_bytes()).ok()?,
                        prefix: a.prefix.clone().unwrap_or_default(),
                        source: a.source()?,
                        cached: tokio::sync::Mutex::new(None),
                    }))
                });
                (name.clone(), Endpoint { base, timeout_ms: def.timeout_ms, auth })
            })
            .collect();
        self
    }

    /// The store auth values are read from. Without one, a call of an agent with `auth`
    /// fails as transient (and says so in the log), rather than go out without its header.
    pub fn with_secrets(mut self, secrets: Arc<dyn Secrets>) -> HttpRemote {
        self.secrets = Some(secrets);
        self
    }

    /// The agent's auth header, or `None` for an agent without auth: the value kept, or
    /// one read now (within `timeout_ms`) when none is kept or it is due to be read again.
    /// The error names the agent only: it becomes the reply's reason; what went wrong is
    /// logged here, without the value.
    async fn auth(
        &self,
        agent: &str,
        timeout_ms: u64,
    ) -> Result<Option<(&HeaderName, HeaderValue)>, RemoteError> {
        let Some(auth) = self.agents.get(agent).and_then(|e| e.auth.as_deref()) else {
            return Ok(None);
        };
        let mut cached = auth.cached.lock().await;
        let now = self.clock.now();
        if let Some(kept) = cached.as_ref().filter(|c| now < c.fresh_until) {
            return Ok(Some((&auth.name, kept.value.clone())));
        }
        match (self.read_header(auth, timeout_ms).await, cached.as_mut()) {
            (Ok(value), _) => {
                tracing::info!(agent, source = %auth.source, ttl_ms = SECRET_TTL_MS, "read the agent's auth secret");
                *cached = Some(Cached { value: value.clone(), fresh_until: now.plus_ms(SECRET_TTL_MS) });
                Ok(Some((&auth.name, value)))
            }
            (Err(why), Some(stale)) => {
                tracing::warn!(agent, source = %auth.source, why, retry_in_ms = SECRET_RETRY_MS, "reading the agent's auth secret again failed; the value read before is still used");
                stale.fresh_until = now.plus_ms(SECRET_RETRY_MS);
                Ok(Some((&auth.name, stale.value.clone())))
            }
            (Err(why), None) => {
                tracing::warn!(agent, source = %auth.source, why, "reading the agent's auth secret failed");
                Err(RemoteError::Transient(format!("the auth secret of agent {agent} could not be read")))
            }
        }
    }

    /// The service refused `sent`: it is not used again (unless a read brings it back).
    /// Another call may have read a newer value meanwhile: that one is kept.
    async fn forget(&self, agent: &str, sent: &HeaderValue) {
        let Some(auth) = self.agents.get(agent).and_then(|e| e.auth.as_deref()) else { return };
        let mut cached = auth.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.value == *sent) {
            *cached = None;
        }
    }

    /// `prefix + value`, marked sensitive, or why not (never the value).
    async fn read_header(&self, auth: &AuthHeader, timeout_ms: u64) -> Result<HeaderValue, String> {
        let secrets = self.secrets.as_ref().ok_or("no secret store is configured")?;
        let secret = tokio::time::timeout(Duration::from_millis(timeout_ms), secrets.get(&auth.source))
            .await
            .map_err(|_| format!("timed out after {timeout_ms} ms"))?
            .map_err(|e| e.to_string())?;
        // An empty value, or one with a line break or control character, is a mistake in
        // the store: said (without the value) and read again by the next call.
        let mut value = match secret.expose() {
            "" => None,
            v => HeaderValue::from_str(&format!("{}{v}", auth.prefix)).ok(),
        }
        .ok_or("the value is empty or not a valid header value (line break or control character?)")?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// The client, built by the first caller; a failed build is retried by the next call.
    async fn client(&self) -> Result<&reqwest::Client, RemoteError> {
        self.client.get_or_try_init(|| async { build_client() }).await.map_err(|e| {
            tracing::warn!(error = %e, "building the HTTP client failed");
            RemoteError::Transient("the HTTP client could not be built".into())
        })
    }

    /// `{base}/{agent}/{step_name}`, each name one percent-encoded path segment: a name
    /// with `/`, `?` or `..` cannot reach another path of the remote service.
    pub fn url(&self, agent: &str, step_name: &str) -> Option<url::Url> {
        if let Some(base) = self.agents.get(agent).and_then(|e| e.base.as_ref()) {
            let mut url = base.clone();
            url.path_segments_mut().ok()?.pop_if_empty().push(step_name);
            return Some(url);
        }
        let mut url = self.base_url.clone()?;
        url.path_segments_mut().ok()?.pop_if_empty().push(agent).push(step_name);
        Some(url)
    }

    /// A call's timeout: what is left of complete-by, or the agent's own if shorter.
    fn timeout_ms(&self, agent: &str, left_ms: u64) -> u64 {
        let own = self.agents.get(agent).and_then(|e| e.timeout_ms).unwrap_or(u64::MAX);
        own.min(left_ms).max(1)
    }
}

/// The agent's HTTP client (the remote services; Parameter Store and Secrets Manager).
/// reqwest is built without a crypto provider (`rustls-no-provider`: its `rustls` feature
/// would link aws-lc-rs), so ring is installed as the process's default first, unless
/// something already installed one. Roots: the platform's, through
/// rustls-platform-verifier (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
///
/// No redirects: a 307/308 would re-send the order, idempotency key and all, to whatever
/// host the answer names.
pub(crate) fn build_client() -> Result<reqwest::Client, reqwest::Error> {
    client_builder().build()
}

/// [`build_client`]'s settings, for a client that adds its own (the secret stores').
pub fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .redirect(reqwest::redirect::Policy::none())
}

/// A URL as it may be logged: no userinfo, query or fragment (where tokens live).
pub fn redacted(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// At most `max` bytes of the body; the rest is left unread.
pub(crate) async fn body_bytes(
    response: &mut reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut bytes = Vec::new();
    while bytes.len() < max {
        match response.chunk().await? {
            Some(chunk) => bytes.extend_from_slice(&chunk[..chunk.len().min(max - bytes.len())]),
            None => break,
        }
    }
    Ok(bytes)
}

/// A Retry-After's delay from `now`, in ms, at least [`MIN_RETRY_AFTER_MS`]: either form
/// HTTP allows (RFC 9110, 10.2.3), delay-seconds or an HTTP date (IMF-fixdate, or the
/// obsolete RFC 850 and asctime forms, which `httpdate` reads too). `None` for anything
/// else: the answer is then what it would be without the header.
fn retry_after_ms(value: &str, now: Timestamp) -> Option<u64> {
    let value = value.trim();
    let ms = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still a delay: the longest there is.
        value.parse::<u64>().unwrap_or(u64::MAX).saturating_mul(1_000)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        let at_ms = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        u64::try_from(at_ms).unwrap_or(u64::MAX).saturating_sub(now.0)
    };
    Some(ms.max(MIN_RETRY_AFTER_MS))
}

fn status_class(status: reqwest::StatusCode) -> &'static str {
    match status.as_u16() {
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

#[derive(serde::Serialize)]
struct CallBody<'a> {
    order_id: &'a str,
    step: u32,
    action: crate::domain::Action,
    order: &'a crate::domain::Order,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    outputs: &'a BTreeMap<String, serde_json::Value>,
    /// Only for a callback step: what completes it (in the body, not a header, which
    /// proxies and access logs keep more often).
    #[serde(skip_serializing_if = "Option::is_none")]
    callback_token: Option<&'a str>,
    /// Only for a map step's item: which one, and the item itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    item: Option<&'a serde_json::Value>,
}

#[async_trait]
impl RemoteService for HttpRemote {
    async fn call(&self, call: &RemoteCall<'_>, timeout_ms: u64) -> Result<Vec<u8>, RemoteError> {
        let Some(url) = self.url(call.agent, call.step_name) else {
            return Err(RemoteError::permanent("the remote service URL is not usable"));
        };
        let body = CallBody {
            order_id: call.order.order_id.as_str(),
            step: call.step,
            action: call.action,
            order: call.order,
            outputs: call.outputs,
            callback_token: call.callback_token,
            index: call.index,
            item: call.item,
        };
        // The secret's first read comes out of the time left until complete-by, not the
        // agent's own call timeout (which is about the remote service); the call gets
        // what is left after it.
        let started = tokio::time::Instant::now();
        let auth = self.auth(call.agent, timeout_ms).await?;
        let left_ms = timeout_ms.saturating_sub(started.elapsed().as_millis() as u64);
        let mut request = self
            .client()
            .await?
            .post(url.clone())
            .header(IDEMPOTENCY_HEADER, &call.idempotency_key.0)
            .timeout(Duration::from_millis(self.timeout_ms(call.agent, left_ms)));
        if let Some((name, value)) = &auth {
            request = request.header(*name, value);
        }
        let mut response = request.json(&body).send().await.map_err(|e| {
            // reqwest's error text carries the full URL: logged without it.
            let what = if e.is_timeout() { "timed out" } else { "could not be reached" };
            tracing::info!(url = %redacted(&url), error = %e.without_url(), "remote service call failed");
            RemoteError::Transient(format!("the remote service {what}"))
        })?;
        let status = response.status();
        // Read before the body. A date counts from this adapter's clock, not the answer's
        // `Date`: the delay is waited out on the functions' clock (the same system clock
        // in a deployment; a test's own where one is set).
        let retry_after_ms = matches!(status.as_u16(), 429 | 503)
            .then(|| response.headers().get(reqwest::header::RETRY_AFTER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after_ms(v, self.clock.now()));
        if status.is_success() {
            // An answer cut off on the way is asked for again: the key brings the same one.
            return body_bytes(&mut response, MAX_OUTPUT_BYTES + 1).await.map_err(|e| {
                tracing::info!(url = %redacted(&url), error = %e.without_url(), "success answer cut off");
                RemoteError::Transient("the remote service's answer was cut off".into())
            });
        }
        let text = match body_bytes(&mut response, MAX_ERROR_BODY_BYTES).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        };
        let class = status_class(status);
        // A refusal tells the scheduler the step had no effect and never will (the
        // remote's contract, docs/REFERENCE.md): only a 4xx that says so is one. A redirect may come
        // after the work was done (303) and a 409 is an idempotency key still in use by a
        // concurrent call: both are retried like outages.
        if let Some((_, sent)) = auth.as_ref().filter(|_| matches!(status.as_u16(), 401 | 403)) {
            // Perhaps the secret was rotated and the value kept here is the old one: the
            // agent retries once with the value read afresh (`handlers::agent`). The body
            // is neither logged nor kept: an answer to bad credentials may quote them.
            self.forget(call.agent, sent).await;
            tracing::warn!(url = %redacted(&url), %status, "remote service refused the agent's credentials; the secret will be read again");
            Err(RemoteError::AuthRefused {
                reason: format!("the remote service refused the agent's credentials (HTTP {class})"),
                detail: Some(cut_reason(format!(
                    "{} answered {status} to the agent's credentials",
                    redacted(&url)
                ))),
            })
        } else if status.is_redirection() {
            tracing::warn!(url = %redacted(&url), %status, "remote service redirected; not followed");
            Err(RemoteError::Transient(format!("the remote service redirected (HTTP {class}, not followed)")))
        } else if let Some(retry_after_ms) = retry_after_ms {
            tracing::info!(url = %redacted(&url), %status, retry_after_ms, "remote service asked to wait");
            Err(RemoteError::Busy {
                reason: format!("the remote service asked to wait (HTTP {class}, Retry-After)"),
                retry_after_ms,
            })
        } else if status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 429) {
            tracing::info!(url = %redacted(&url), %status, body = %text, "remote service answered an error");
            Err(RemoteError::Transient(format!("the remote service is unavailable (HTTP {class})")))
        } else {
            tracing::warn!(url = %redacted(&url), %status, body = %text, "remote service refused");
            Err(RemoteError::Permanent {
                reason: format!("the remote service refused (HTTP {class})"),
                detail: Some(cut_reason(format!("{} answered {status}: {text}", redacted(&url)))),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_with_its_own_url_and_timeout_uses_them() {
        let text = r#"{"agents": {"payment": {"url": "https://pay.internal/sas/", "timeout_ms": 700}, "inventory": {}},
            "workflows": [{"name": "w", "steps": [{"name": "charge", "agent": "payment"}, {"name": "reserve", "agent": "inventory"}]}]}"#;
        let d = crate::domain::Definitions::parse(text).unwrap();
        let remote = HttpRemote::new("https://default.example/api").with_agents(&d.agents);
        assert_eq!(remote.url("payment", "charge").unwrap().as_str(), "https://pay.internal/sas/charge");
        assert_eq!(
            remote.url("inventory", "reserve").unwrap().as_str(),
            "https://default.example/api/inventory/reserve"
        );
        assert_eq!(remote.timeout_ms("payment", 5_000), 700);
        assert_eq!(remote.timeout_ms("payment", 300), 300, "complete-by still bounds the call");
        assert_eq!(remote.timeout_ms("inventory", 5_000), 5_000);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_never_under_the_floor() {
        // Wed, 21 Oct 2015 07:28:00 GMT.
        let now = Timestamp(1_445_412_480_000);
        assert_eq!(retry_after_ms("120", now), Some(120_000));
        assert_eq!(retry_after_ms(" 2 ", now), Some(2_000), "surrounding spaces are not part of it");
        assert_eq!(retry_after_ms("0", now), Some(MIN_RETRY_AFTER_MS), "no tight loop");
        assert_eq!(retry_after_ms("99999999999999999999999", now), Some(u64::MAX));
        // A date, in each of the three forms, 90 s after `now`.
        for date in
            ["Wed, 21 Oct 2015 07:29:30 GMT", "Wednesday, 21-Oct-15 07:29:30 GMT", "Wed Oct 21 07:29:30 2015"]
        {
            assert_eq!(retry_after_ms(date, now), Some(90_000), "{date}");
        }
        assert_eq!(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", now), Some(MIN_RETRY_AFTER_MS), "now");
        assert_eq!(retry_after_ms("Tue, 20 Oct 2015 07:28:00 GMT", now), Some(MIN_RETRY_AFTER_MS), "past");
        for garbage in
            ["", "soon", "-5", "+5", "1.5", "2 s", "Wed, 32 Oct 2015 07:28:00 GMT", "2015-10-21T07:29:30Z"]
        {
            assert_eq!(retry_after_ms(garbage, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn path_segments_are_encoded_and_urls_logged_without_secrets() {
        let remote = HttpRemote::new("https://user:token@remote.example/api/?key=secret");
        let url = remote.url("pay/../ment", "charge?x=1#y").unwrap();
        assert_eq!(url.path(), "/api/pay%2F..%2Fment/charge%3Fx=1%23y");
        assert_eq!(url.query(), Some("key=secret"), "the base's query is still sent");
        let shown = redacted(&url);
        assert_eq!(shown, "https://remote.example/api/pay%2F..%2Fment/charge%3Fx=1%23y");
        assert_eq!(
            HttpRemote::new("https://r.example").url("a", "b").unwrap().as_str(),
            "https://r.example/a/b"
        );
        assert!(HttpRemote::new("not a url").url("a", "b").is_none());
    }
}
