//! The cold-start bench's stand-in for AWS and for the agent's remote service: HTTPS on
//! loopback, so a function's first invocation pays for its first TLS connection as it
//! would against a real AWS endpoint.
//!
//! - Certificates are made at start (rcgen): a root CA, an intermediate and a leaf for
//!   `localhost` and `127.0.0.1`; the server sends leaf + intermediate, so a client checks
//!   two signatures, as against AWS's endpoints (leaf, Amazon intermediate, Amazon root).
//!   Keys are ECDSA P-256 (ring cannot generate RSA keys; AWS serves RSA 2048 chains).
//! - The root is written to a PEM file after the machine's CA bundle (when there is one),
//!   so a client pointed at it with `SSL_CERT_FILE` parses a production-sized root store.
//!   Both of the functions' TLS clients read their roots through `rustls-native-certs`,
//!   which loads only `SSL_CERT_FILE` (and `SSL_CERT_DIR`) when set: the AWS SDK's
//!   `aws-smithy-http-client` (its `TrustStore` defaults to native roots) and reqwest's
//!   `rustls-platform-verifier` (on Linux, native certs too).
//! - Requests are answered by [`answer`]: DynamoDB and SQS (JSON protocol) by their
//!   `X-Amz-Target`, and `POST /remote/...` (the agent's remote service) with 200. Every
//!   request is recorded with the status it got; anything else gets an error status, so a
//!   run that strayed shows in its record.
//! - The server is TLS 1.2/1.3 with ring, HTTP/1.1 (no ALPN), TCP_NODELAY on every socket.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

// ------------------------------------------------------------------ HTTP/1.1, minimal

/// One HTTP/1.1 request as the stubs see it. Header names are lower-cased.
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Reads one request (Content-Length or chunked body); `None` at a clean end of stream.
pub async fn read_request<R: AsyncBufRead + Unpin>(stream: &mut R) -> io::Result<Option<HttpRequest>> {
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let mut request = HttpRequest {
        method: parts.next().unwrap_or_default().to_owned(),
        path: parts.next().unwrap_or_default().to_owned(),
        ..HttpRequest::default()
    };
    loop {
        let mut header = String::new();
        if stream.read_line(&mut header).await? == 0 || header == "\r\n" {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            request.headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    if request.header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            stream.read_line(&mut size).await?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut chunk = vec![0u8; size + 2]; // data + CRLF
            stream.read_exact(&mut chunk).await?;
            if size == 0 {
                break; // (no trailers from the clients measured here)
            }
            request.body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let length = request.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        request.body = vec![0u8; length];
        stream.read_exact(&mut request.body).await?;
    }
    Ok(Some(request))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Status",
    }
}

pub fn http_response(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         x-amzn-RequestId: 00000000-0000-0000-0000-000000000000\r\n\r\n{body}",
        reason(status),
        body.len()
    )
    .into_bytes()
}

// ------------------------------------------------------------------ the answers

pub const AWS_JSON: &str = "application/x-amz-json-1.0";

/// What the stub answers to one request, and how the request is recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// `dynamodb PutItem bench-state`, `sqs SendMessageBatch bench-scheduler x1`,
    /// `remote POST /remote/orders/process-order`, or `unexpected ...`.
    pub call: String,
}

fn queue_name(body: &Value) -> &str {
    body["QueueUrl"].as_str().and_then(|u| u.rsplit('/').next()).unwrap_or("?")
}

fn tables(body: &Value) -> String {
    if let Some(items) = body["TransactItems"].as_array() {
        let names: Vec<&str> =
            items.iter().filter_map(|i| i.as_object()?.values().next()?["TableName"].as_str()).collect();
        return names.join("+");
    }
    match body["IndexName"].as_str() {
        Some(index) => format!("{}/{index}", body["TableName"].as_str().unwrap_or("?")),
        None => body["TableName"].as_str().unwrap_or("?").to_owned(),
    }
}

/// The answer AWS would give when nothing is in the way: DynamoDB finds nothing and
/// accepts every write; SQS accepts every message; the remote service says 200.
pub fn answer(request: &HttpRequest) -> Answer {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let ok = |call: String, body: Value| Answer {
        status: 200,
        content_type: AWS_JSON,
        body: body.to_string(),
        call,
    };
    let refuse = |status: u16, call: String| Answer {
        status,
        content_type: AWS_JSON,
        body: json!({"__type": "UnknownOperationException", "message": "not served by the bench stub"})
            .to_string(),
        call: format!("unexpected {call}"),
    };
    // Every message id the same: the functions only count them. The Rust SDK does not
    // check MD5OfMessageBody.
    let message = json!({"MessageId": "00000000-0000-0000-0000-000000000001", "MD5OfMessageBody": "-"});
    let Some(target) = request.header("x-amz-target") else {
        return if request.method == "POST" && request.path.starts_with("/remote/") {
            Answer {
                status: 200,
                content_type: "application/json",
                body: "{}".into(),
                call: format!("remote POST {}", request.path),
            }
        } else {
            refuse(404, format!("{} {}", request.method, request.path))
        };
    };
    match target.split_once('.').unwrap_or((target, "")) {
        ("DynamoDB_20120810", op @ "Query") => ok(
            format!("dynamodb {op} {}", tables(&body)),
            json!({"Count": 0, "Items": [], "ScannedCount": 0}),
        ),
        (
            "DynamoDB_20120810",
            op @ ("GetItem" | "PutItem" | "UpdateItem" | "DeleteItem" | "TransactWriteItems"),
        ) => ok(format!("dynamodb {op} {}", tables(&body)), json!({})),
        ("AmazonSQS", op @ "SendMessage") => ok(format!("sqs {op} {}", queue_name(&body)), message),
        ("AmazonSQS", op @ "SendMessageBatch") => {
            let entries = body["Entries"].as_array().cloned().unwrap_or_default();
            let successful: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut m = message.clone();
                    m["Id"] = e["Id"].clone();
                    m
                })
                .collect();
            ok(
                format!("sqs {op} {} x{}", queue_name(&body), entries.len()),
                json!({"Successful": successful, "Failed": []}),
            )
        }
        _ => refuse(400, target.to_owned()),
    }
}

// ------------------------------------------------------------------ certificates

/// A root CA, and a chain (leaf, intermediate) with the leaf's key for the server.
pub struct BenchPki {
    pub root_pem: String,
    pub chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    pub key: rustls::pki_types::PrivateKeyDer<'static>,
}

pub fn make_pki() -> Result<BenchPki, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_params = |name: &str| -> Result<CertificateParams, rcgen::Error> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ok(p)
    };
    let root_key = KeyPair::generate()?;
    let root_params = ca_params("sasctl bench root CA")?;
    let root = root_params.self_signed(&root_key)?;
    let root_issuer = Issuer::new(root_params, root_key);

    let mid_key = KeyPair::generate()?;
    let mid_params = ca_params("sasctl bench intermediate CA")?;
    let mid = mid_params.signed_by(&mid_key, &root_issuer)?;
    let mid_issuer = Issuer::new(mid_params, mid_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    leaf_params.distinguished_name.push(DnType::CommonName, "localhost");
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf_params.signed_by(&leaf_key, &mid_issuer)?;

    Ok(BenchPki {
        root_pem: root.pem(),
        chain: vec![leaf.der().clone(), mid.der().clone()],
        key: rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
    })
}

/// The system CA bundle the stub's root is appended to, so the clients parse as many
/// roots as they would on Lambda (AL2023's bundle has ~140).
pub const SYSTEM_BUNDLES: [&str; 2] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];

// ------------------------------------------------------------------ the server

/// One request the stub answered, in arrival order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StubCall {
    pub call: String,
    pub status: u16,
}

#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<StubCall>>,
    handshakes: AtomicU64,
}

/// The HTTPS stub, listening on 127.0.0.1 until dropped.
pub struct AwsStub {
    pub port: u16,
    /// `SSL_CERT_FILE` for the clients: the system bundle (if any) and the stub's root.
    pub roots_file: PathBuf,
    /// Certificates in `roots_file`.
    pub roots: usize,
    pub root_pem: String,
    seen: Arc<Seen>,
    server: tokio::task::JoinHandle<()>,
}

impl AwsStub {
    /// Starts the stub; the roots file is written into `dir`.
    pub async fn start(dir: &Path) -> io::Result<AwsStub> {
        let pki = make_pki().map_err(io::Error::other)?;
        let mut bundle =
            SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&pki.root_pem);
        let roots = bundle.matches("-----BEGIN CERTIFICATE-----").count();
        let roots_file = dir.join(format!("sasctl-bench-roots-{}.pem", std::process::id()));
        std::fs::write(&roots_file, bundle)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(pki.chain, pki.key))
            .map_err(io::Error::other)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Seen::default());
        let server = {
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else { return };
                    let _ = socket.set_nodelay(true);
                    let (acceptor, seen) = (acceptor.clone(), seen.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(socket).await else { return };
                        seen.handshakes.fetch_add(1, Ordering::SeqCst);
                        let mut stream = tokio::io::BufReader::new(tls);
                        while let Ok(Some(request)) = read_request(&mut stream).await {
                            let a = answer(&request);
                            seen.calls.lock().unwrap().push(StubCall { call: a.call, status: a.status });
                            let out = stream.get_mut();
                            if out.write_all(&http_response(a.status, a.content_type, &a.body)).await.is_err()
                                || out.flush().await.is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            })
        };
        Ok(AwsStub { port, roots_file, roots, root_pem: pki.root_pem, seen, server })
    }

    /// `AWS_ENDPOINT_URL` for the functions.
    pub fn endpoint(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    /// The same stub under its other name (the certificate covers both).
    pub fn endpoint_by_ip(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The calls answered and TLS handshakes completed since the last `take`.
    pub fn take(&self) -> (Vec<StubCall>, u64) {
        let calls = std::mem::take(&mut *self.seen.calls.lock().unwrap());
        (calls, self.seen.handshakes.swap(0, Ordering::SeqCst))
    }
}

impl Drop for AwsStub {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.roots_file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: Option<&str>, path: &str, body: Value) -> HttpRequest {
        HttpRequest {
            method: "POST".into(),
            path: path.into(),
            headers: target.map(|t| vec![("x-amz-target".into(), t.into())]).unwrap_or_default(),
            body: body.to_string().into_bytes(),
        }
    }

    #[test]
    fn batch_sends_echo_every_entry_id() {
        let a = answer(&request(
            Some("AmazonSQS.SendMessageBatch"),
            "/",
            json!({"QueueUrl": "https://x/000000000000/bench-scheduler", "Entries": [
                {"Id": "0", "MessageBody": "a"}, {"Id": "1", "MessageBody": "b"}]}),
        ));
        assert_eq!(a.status, 200);
        assert_eq!(a.call, "sqs SendMessageBatch bench-scheduler x2");
        let body: Value = serde_json::from_str(&a.body).unwrap();
        let ids: Vec<&str> =
            body["Successful"].as_array().unwrap().iter().map(|e| e["Id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["0", "1"]);
        assert_eq!(body["Failed"], json!([]));
    }

    #[test]
    fn calls_are_labelled_by_operation_and_resource() {
        let q = answer(&request(
            Some("DynamoDB_20120810.Query"),
            "/",
            json!({"TableName": "t", "IndexName": "due"}),
        ));
        assert_eq!((q.status, q.call.as_str()), (200, "dynamodb Query t/due"));
        let t = answer(&request(
            Some("DynamoDB_20120810.TransactWriteItems"),
            "/",
            json!({"TransactItems": [{"Put": {"TableName": "o"}}, {"Put": {"TableName": "s"}}]}),
        ));
        assert_eq!(t.call, "dynamodb TransactWriteItems o+s");
        let r = answer(&request(None, "/remote/orders/process-order", json!({})));
        assert_eq!((r.status, r.call.as_str()), (200, "remote POST /remote/orders/process-order"));
    }

    #[test]
    fn anything_else_is_refused_and_marked() {
        let a = answer(&request(Some("DynamoDB_20120810.Scan"), "/", json!({})));
        assert_eq!((a.status, a.call.as_str()), (400, "unexpected DynamoDB_20120810.Scan"));
        let b = answer(&request(None, "/elsewhere", json!({})));
        assert_eq!(b.status, 404);
        assert!(b.call.starts_with("unexpected"));
    }

    #[tokio::test]
    async fn requests_are_read_with_either_body_framing() {
        let raw = b"POST /a HTTP/1.1\r\nX-Amz-Target: T.Op\r\nContent-Length: 3\r\n\r\nabc\
                    POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n";
        let mut r = tokio::io::BufReader::new(&raw[..]);
        let a = read_request(&mut r).await.unwrap().unwrap();
        assert_eq!(
            (a.path.as_str(), a.header("x-amz-target"), a.body.as_slice()),
            ("/a", Some("T.Op"), &b"abc"[..])
        );
        let b = read_request(&mut r).await.unwrap().unwrap();
        assert_eq!((b.path.as_str(), b.body.as_slice()), ("/b", &b"def"[..]));
        assert!(read_request(&mut r).await.unwrap().is_none());
    }
}
