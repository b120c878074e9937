//! A counting proxy in front of an AWS endpoint: every request the functions make passes
//! through it and is tallied by service and operation, outside sas's own code (its
//! adapters' counters are not consulted). `bench traffic` prices what it counts.
//!
//! The operation is read from the wire as AWS's protocols carry it: the `X-Amz-Target`
//! header (DynamoDB, SQS: JSON protocols) or the form body's `Action` (SNS, STS: query
//! protocol), the service from the signature's credential scope. Requests are forwarded
//! byte for byte; the endpoint must not check signatures against its own host (moto and
//! LocalStack do not).
//!
//! Headers are forwarded as they come, `Authorization` included, so the proxy is kept to
//! this machine at both ends: it listens on loopback only, and it forwards over plain http
//! only to a loopback endpoint (an https endpoint may be anywhere). What it forwards is
//! signed with throwaway credentials anyway: its clients see a plain-http endpoint
//! (`crate::endpoint::signing`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use serde::Serialize;

/// What passed through: requests by (service, operation), and what the SQS receives brought.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct RequestCounts {
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// ReceiveMessage requests that returned no message.
    pub empty_receives: u64,
    /// Messages the ReceiveMessage requests returned.
    pub messages_received: u64,
}

impl RequestCounts {
    /// Requests to `service` (all operations).
    pub fn service(&self, service: &str) -> u64 {
        self.requests.get(service).map_or(0, |ops| ops.values().sum())
    }

    pub fn op(&self, service: &str, op: &str) -> u64 {
        self.requests.get(service).and_then(|ops| ops.get(op)).copied().unwrap_or(0)
    }

    /// What happened since `before` was taken.
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        let mut requests = self.requests.clone();
        for (service, ops) in &mut requests {
            for (op, n) in ops.iter_mut() {
                *n -= before.op(service, op);
            }
            ops.retain(|_, n| *n > 0);
        }
        requests.retain(|_, ops| !ops.is_empty());
        RequestCounts {
            requests,
            empty_receives: self.empty_receives - before.empty_receives,
            messages_received: self.messages_received - before.messages_received,
        }
    }
}

struct Proxy {
    upstream: String,
    client: reqwest::Client,
    tally: Mutex<RequestCounts>,
}

/// A running proxy: its URL, and the tally so far.
pub struct CountingProxy {
    pub url: String,
    proxy: Arc<Proxy>,
    server: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards to `upstream` (see [`check_upstream`]).
    pub async fn start(upstream: &str) -> Result<CountingProxy, String> {
        check_upstream(upstream)?;
        // reqwest is built without a crypto provider of its own (the agent installs ring);
        // the proxy speaks plain HTTP but the client wants one installed all the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| format!("cannot build the proxy's HTTP client: {e}"))?;
        let proxy = Arc::new(Proxy {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client,
            tally: Mutex::new(RequestCounts::default()),
        });
        let router = Router::new().fallback(forward).with_state(proxy.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen on loopback: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "counting proxy stopped");
            }
        });
        Ok(CountingProxy { url: format!("http://{addr}"), proxy, server })
    }

    pub fn counts(&self) -> RequestCounts {
        self.proxy.tally.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An endpoint the proxy may forward to: https anywhere, plain http only to loopback
/// (`localhost`, 127.0.0.0/8, `[::1]`), where the signed headers it forwards stay on this
/// machine.
pub fn check_upstream(upstream: &str) -> Result<(), String> {
    let uri: axum::http::Uri = upstream.parse().map_err(|_| format!("{upstream:?} is not an http(s) URL"))?;
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if loopback => Ok(()),
        Some("http") if !host.is_empty() => Err(format!(
            "the counting proxy forwards signed requests over plain http only to a loopback endpoint (moto or LocalStack on this machine), not {upstream}: use https, or run the endpoint here"
        )),
        _ => Err(format!("{upstream:?} is not an http(s) URL with a host")),
    }
}

/// The (service, operation) of one request, as the wire says it.
pub fn classify(headers: &HeaderMap, body: &[u8]) -> (String, String) {
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        let (prefix, op) = target.split_once('.').unwrap_or(("", target));
        let service = match prefix {
            "AmazonSQS" => "sqs".to_owned(),
            p if p.starts_with("DynamoDB") => "dynamodb".to_owned(),
            p => p.to_ascii_lowercase(),
        };
        return (service, op.to_owned());
    }
    let op = std::str::from_utf8(body)
        .ok()
        .and_then(|b| b.split('&').find_map(|kv| kv.strip_prefix("Action=")))
        .unwrap_or("?")
        .to_owned();
    (scope_service(headers).unwrap_or_else(|| "?".to_owned()), op)
}

/// The service named in the SigV4 credential scope: `Credential=KEY/DATE/REGION/SERVICE/aws4_request`.
fn scope_service(headers: &HeaderMap) -> Option<String> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let credential = auth.split("Credential=").nth(1)?;
    let scope = credential.split([',', ' ']).next()?;
    scope.split('/').nth(3).map(str::to_owned)
}

/// How many messages a ReceiveMessage answer (JSON protocol) carries.
fn messages_in(answer: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct Received {
        #[serde(rename = "Messages", default)]
        messages: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Received>(answer).map_or(0, |r| r.messages.len() as u64)
}

async fn forward(
    State(proxy): State<Arc<Proxy>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let (service, op) = classify(&headers, &body);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = proxy.client.request(method, format!("{}{path}", proxy.upstream)).body(body);
    // Hop-by-hop headers belong to each connection, not to the request.
    const HOP: [&str; 7] =
        ["host", "content-length", "connection", "keep-alive", "transfer-encoding", "expect", "upgrade"];
    for (name, value) in &headers {
        if !HOP.contains(&name.as_str()) {
            request = request.header(name, value);
        }
    }
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::from(format!("counting proxy: {e}")))
                .unwrap_or_default();
        }
    };
    let status = answer.status();
    let answer_headers = answer.headers().clone();
    let bytes = answer.bytes().await.unwrap_or_default();
    {
        let mut tally = proxy.tally.lock().unwrap_or_else(|p| p.into_inner());
        if service == "sqs" && op == "ReceiveMessage" && status.is_success() {
            let n = messages_in(&bytes);
            tally.messages_received += n;
            if n == 0 {
                tally.empty_receives += 1;
            }
        }
        *tally.requests.entry(service).or_default().entry(op).or_default() += 1;
    }
    let mut response = Response::builder().status(status);
    for (name, value) in &answer_headers {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            response = response.header(name, value);
        }
    }
    response.body(Body::from(bytes)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_read_from_the_wire() {
        let mut h = HeaderMap::new();
        h.insert("x-amz-target", "AmazonSQS.ReceiveMessage".parse().unwrap());
        assert_eq!(classify(&h, b"{}"), ("sqs".into(), "ReceiveMessage".into()));
        h.insert("x-amz-target", "DynamoDB_20120810.PutItem".parse().unwrap());
        assert_eq!(classify(&h, b"{}"), ("dynamodb".into(), "PutItem".into()));
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKID/20261123/us-east-1/sns/aws4_request, SignedHeaders=host, Signature=x"
                .parse()
                .unwrap(),
        );
        assert_eq!(classify(&h, b"Action=Publish&Version=2010-03-31"), ("sns".into(), "Publish".into()));
        assert_eq!(messages_in(br#"{"Messages":[{"Body":"a"},{"Body":"b"}]}"#), 2);
        assert_eq!(messages_in(b"{}"), 0);
    }

    #[test]
    fn plain_http_goes_only_to_loopback() {
        for ok in [
            "http://127.0.0.1:5000",
            "http://localhost:4566/",
            "http://[::1]:5000",
            "https://sqs.example.com",
        ] {
            assert_eq!(check_upstream(ok), Ok(()), "{ok}");
        }
        for refused in ["http://10.0.0.7:4566", "http://moto:5000", "http://0.0.0.0:5000", "ftp://127.0.0.1"]
        {
            assert!(check_upstream(refused).is_err(), "{refused}");
        }
    }

    #[tokio::test]
    async fn a_proxy_to_a_plain_http_endpoint_elsewhere_does_not_start() {
        let Err(e) = CountingProxy::start("http://192.0.2.10:4566").await else {
            panic!("a proxy that would forward signed requests in clear across the network started")
        };
        assert!(e.contains("only to a loopback endpoint"), "{e}");
        let proxy = CountingProxy::start("http://127.0.0.1:9").await.expect("loopback is fine");
        assert!(proxy.url.starts_with("http://127.0.0.1:"), "listens on loopback only: {}", proxy.url);
    }

    #[test]
    fn a_tally_since_another_is_the_difference() {
        let mut a = RequestCounts::default();
        a.requests.entry("sqs".into()).or_default().insert("SendMessage".into(), 3);
        let mut b = a.clone();
        *b.requests.get_mut("sqs").unwrap().get_mut("SendMessage").unwrap() += 2;
        b.requests.entry("dynamodb".into()).or_default().insert("GetItem".into(), 1);
        b.empty_receives = 4;
        let d = b.since(&a);
        assert_eq!((d.op("sqs", "SendMessage"), d.service("dynamodb"), d.empty_receives), (2, 1, 4));
    }
}
