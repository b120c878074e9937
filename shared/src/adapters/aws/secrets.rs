//! Agents' auth values from Parameter Store (GetParameter, decrypted) and Secrets Manager
//! (GetSecretValue), each one signed JSON request (the services' `awsJson1_1` protocol)
//! with the `SdkConfig`'s credentials and region, sent over the agent's own HTTP client.
//!
//! Not through `aws-sdk-ssm` and `aws-sdk-secretsmanager`: linked into the agent at
//! opt-level "s" they took its zip from 3,976,185 to 4,302,688 bytes (binary +1.26 MB),
//! past the 4 MB ceiling (docs/BENCHMARKS.md, Package sizes). Every operation of those
//! crates links its service's whole error registry, and SSM models some 200 errors. The
//! signing (`aws-sigv4`), the credentials chain and the HTTP client here are already in
//! the agent for SQS and the remote services; this file adds two requests and their
//! answers, parsed as `serde_json::Value` (whose parser the agent has for step outputs).
//!
//! Region: the one a secret's ARN names (a secret lives in one region, and an agent may
//! name one in another), else the configuration's. Endpoint: `AWS_ENDPOINT_URL_SSM` /
//! `AWS_ENDPOINT_URL_SECRETS_MANAGER`, else the configuration's `AWS_ENDPOINT_URL` (moto,
//! LocalStack), else that region's own endpoint in the `aws` and `aws-cn` partitions. One
//! HTTP client serves every region (it holds no region: the endpoint and the signature
//! do), built on the first read, so a deployment without auth never pays for it.
//!
//! Every read is bounded: [`SecretTimeouts`] (connect, and the whole read: credentials,
//! request and answer), so a store that does not answer fails the read with a clear reason
//! instead of holding the call.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_credential_types::provider::ProvideCredentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

use crate::domain::{SecretSource, SecretValue};
use crate::ports::{SecretError, Secrets};

/// A SecureString holds at most 8 KB and a SecretString 64 KB; the rest of the answer is
/// metadata. Anything larger is not an answer to these requests.
const MAX_ANSWER_BYTES: usize = 128 * 1024;
const JSON_1_1: &str = "application/x-amz-json-1.1";

/// How long one read may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretTimeouts {
    /// To open the connection to the store's endpoint.
    pub connect: Duration,
    /// The whole read: credentials, request and answer.
    pub operation: Duration,
}

impl Default for SecretTimeouts {
    /// Both stores answer a read in tens of milliseconds; the agent's call waits for the
    /// read (within its complete-by), so a store that hangs must fail well before that.
    fn default() -> Self {
        SecretTimeouts { connect: Duration::from_secs(2), operation: Duration::from_secs(5) }
    }
}

/// One of the two services, with what its request and answer look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Ssm,
    SecretsManager,
}

impl Service {
    /// The signing name, also the endpoint's first label.
    fn name(self) -> &'static str {
        match self {
            Service::Ssm => "ssm",
            Service::SecretsManager => "secretsmanager",
        }
    }

    fn endpoint_variable(self) -> &'static str {
        match self {
            Service::Ssm => "AWS_ENDPOINT_URL_SSM",
            Service::SecretsManager => "AWS_ENDPOINT_URL_SECRETS_MANAGER",
        }
    }

    fn target(self) -> &'static str {
        match self {
            Service::Ssm => "AmazonSSM.GetParameter",
            Service::SecretsManager => "secretsmanager.GetSecretValue",
        }
    }

    fn body(self, id: &str) -> String {
        match self {
            // Decrypted: a SecureString is answered encrypted without it; a String is
            // unaffected.
            Service::Ssm => serde_json::json!({"Name": id, "WithDecryption": true}),
            Service::SecretsManager => serde_json::json!({"SecretId": id}),
        }
        .to_string()
    }

    /// The value in a 2xx answer. Read as a `serde_json::Value`, whose parser the agent
    /// links already (step outputs): typed answers would add their own.
    fn value(self, body: &[u8]) -> Result<Option<String>, String> {
        // serde's message could quote a piece of the answer: not passed on.
        let unexpected = || "the answer is not the JSON the service documents".to_owned();
        let mut answer: serde_json::Value = serde_json::from_slice(body).map_err(|_| unexpected())?;
        let at = match self {
            Service::Ssm => "/Parameter/Value",
            // A binary-only secret has SecretBinary instead.
            Service::SecretsManager => "/SecretString",
        };
        match answer.pointer_mut(at).map(serde_json::Value::take) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(value)) => Ok(Some(value)),
            Some(_) => Err(unexpected()),
        }
    }
}

/// The region's endpoint in the partitions sas is deployed to: China's domain, else
/// `amazonaws.com` (the commercial regions and GovCloud).
fn regional_endpoint(service: Service, region: &str) -> String {
    let domain = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
    format!("https://{}.{region}.{domain}", service.name())
}

/// An error answer's code and message (`{"__type": "...#ParameterNotFound", "message":
/// "..."}`): they name the parameter or secret, never a value.
fn error_text(status: reqwest::StatusCode, body: &[u8]) -> String {
    let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |key: &str| parsed.get(key).and_then(serde_json::Value::as_str);
    let kind = text("__type").map(|k| k.rsplit('#').next().unwrap_or(k));
    let said = match (kind, text("message").or_else(|| text("Message"))) {
        (Some(k), Some(m)) => format!("{k}: {m}"),
        (Some(k), None) => k.to_owned(),
        (None, Some(m)) => m.to_owned(),
        (None, None) => "no error code".to_owned(),
    };
    crate::domain::cut_reason(format!("HTTP {status}: {said}"))
}

/// The headers of a JSON 1.1 POST of `body` to `url` (an AWS service's `target`
/// operation), signed with SigV4 for `service` in `region` with the configuration's
/// credentials: `content-type` and `x-amz-target` with the signature's own.
pub async fn signed_json_headers(
    sdk: &SdkConfig,
    service: &str,
    region: &str,
    url: &str,
    target: &str,
    body: &str,
) -> Result<Vec<(String, String)>, String> {
    let provider = sdk.credentials_provider().ok_or("no AWS credentials configured")?;
    let credentials = provider.provide_credentials().await.map_err(|e| format!("no AWS credentials: {e}"))?;
    let identity = Identity::from(credentials);
    let headers = [("content-type", JSON_1_1), ("x-amz-target", target)];
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("signing: {e}"))?
        .into();
    let signable =
        SignableRequest::new("POST", url, headers.into_iter(), SignableBody::Bytes(body.as_bytes()))
            .map_err(|e| format!("signing: {e}"))?;
    let (instructions, _signature) =
        sign(signable, &params).map_err(|e| format!("signing: {e}"))?.into_parts();
    Ok(headers.into_iter().chain(instructions.headers()).map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}

pub struct AwsSecrets {
    sdk: SdkConfig,
    timeouts: SecretTimeouts,
    client: tokio::sync::OnceCell<reqwest::Client>,
}

impl std::fmt::Debug for AwsSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsSecrets")
            .field("region", &self.sdk.region())
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl AwsSecrets {
    pub fn new(sdk: &SdkConfig) -> AwsSecrets {
        AwsSecrets {
            sdk: sdk.clone(),
            timeouts: SecretTimeouts::default(),
            client: tokio::sync::OnceCell::new(),
        }
    }

    pub fn with_timeouts(mut self, timeouts: SecretTimeouts) -> AwsSecrets {
        self.timeouts = timeouts;
        self
    }

    pub fn timeouts(&self) -> SecretTimeouts {
        self.timeouts
    }

    /// The region `source` is read in: its ARN's, else the configuration's.
    fn region_of(&self, source: &SecretSource) -> Result<String, String> {
        match source.region() {
            Some(region) => Ok(region.to_owned()),
            None => Ok(self.sdk.region().ok_or("no AWS region configured")?.as_ref().to_owned()),
        }
    }

    fn endpoint(&self, service: Service, region: &str) -> String {
        std::env::var(service.endpoint_variable())
            .ok()
            .filter(|e| !e.trim().is_empty())
            .or_else(|| self.sdk.endpoint_url().map(str::to_owned))
            .unwrap_or_else(|| regional_endpoint(service, region))
    }

    /// The value, or why not (never the value itself), within the operation timeout.
    async fn read(&self, service: Service, source: &SecretSource) -> Result<Option<String>, String> {
        let limit = self.timeouts.operation;
        tokio::time::timeout(limit, self.read_unbounded(service, source)).await.unwrap_or_else(|_| {
            Err(format!(
                "{} did not answer within {} ms (the read's time limit)",
                service.name(),
                limit.as_millis()
            ))
        })
    }

    async fn read_unbounded(
        &self,
        service: Service,
        source: &SecretSource,
    ) -> Result<Option<String>, String> {
        let (id, region) = (source.id(), self.region_of(source)?);
        let url = format!("{}/", self.endpoint(service, &region).trim_end_matches('/'));
        let body = service.body(id);
        let headers =
            signed_json_headers(&self.sdk, service.name(), &region, &url, service.target(), &body).await?;

        let client = self
            .client
            .get_or_try_init(|| async {
                crate::adapters::http_remote::client_builder()
                    .connect_timeout(self.timeouts.connect)
                    .timeout(self.timeouts.operation)
                    .build()
            })
            .await
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let mut request = client.post(&url).body(body);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let mut response = request.send().await.map_err(|e| {
            let what = if e.is_connect() && e.is_timeout() {
                format!("could not be connected to within {} ms", self.timeouts.connect.as_millis())
            } else if e.is_timeout() {
                format!("did not answer within {} ms", self.timeouts.operation.as_millis())
            } else {
                "could not be reached".to_owned()
            };
            format!("{} at {url} {what}: {}", service.name(), e.without_url())
        })?;
        let status = response.status();
        let answer = crate::adapters::http_remote::body_bytes(&mut response, MAX_ANSWER_BYTES + 1)
            .await
            .map_err(|e| format!("{} answer cut off: {}", service.name(), e.without_url()))?;
        if !status.is_success() {
            return Err(error_text(status, &answer));
        }
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(format!("the answer is over {MAX_ANSWER_BYTES} bytes"));
        }
        service.value(&answer)
    }
}

#[async_trait]
impl Secrets for AwsSecrets {
    async fn get(&self, source: &SecretSource) -> Result<SecretValue, SecretError> {
        let read = match source {
            SecretSource::Ssm(_) => self.read(Service::Ssm, source).await,
            SecretSource::SecretsManager(_) => self.read(Service::SecretsManager, source).await,
        };
        let error = |reason: String| SecretError { source_name: source.to_string(), reason };
        match read {
            Ok(Some(value)) => Ok(SecretValue::new(value)),
            // A binary-only secret has no SecretString.
            Ok(None) => Err(error("the store answered without a text value".into())),
            Err(reason) => Err(error(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_of_both_services() {
        assert_eq!(regional_endpoint(Service::Ssm, "eu-west-1"), "https://ssm.eu-west-1.amazonaws.com");
        assert_eq!(
            regional_endpoint(Service::SecretsManager, "cn-north-1"),
            "https://secretsmanager.cn-north-1.amazonaws.com.cn"
        );
        assert_eq!(Service::Ssm.body("/sas/t"), r#"{"Name":"/sas/t","WithDecryption":true}"#);
        assert_eq!(Service::SecretsManager.body("k"), r#"{"SecretId":"k"}"#);
        let ssm =
            br#"{"Parameter": {"Name": "/sas/t", "Type": "SecureString", "Value": "v1", "Version": 3}}"#;
        assert_eq!(Service::Ssm.value(ssm), Ok(Some("v1".into())));
        let sm = br#"{"ARN": "arn:...", "Name": "k", "SecretString": "v2", "VersionStages": ["AWSCURRENT"]}"#;
        assert_eq!(Service::SecretsManager.value(sm), Ok(Some("v2".into())));
        assert_eq!(Service::SecretsManager.value(br#"{"SecretBinary": "AAEC"}"#), Ok(None));
        // A malformed answer says so without quoting it.
        for bad in [&br#"{"SecretString": ["s3cr3t"]}"#[..], br#"{"SecretString": "s3cr3t""#] {
            let err = Service::SecretsManager.value(bad).unwrap_err();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }

    /// A config as the functions' (static credentials, a region) pointed at `endpoint`.
    fn sdk_at(endpoint: &str, region: &'static str) -> SdkConfig {
        use aws_credential_types::{Credentials, provider::SharedCredentialsProvider};
        SdkConfig::builder()
            .region(aws_config::Region::from_static(region))
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "AKIDTEST", "s", None, None, "test",
            )))
            .endpoint_url(endpoint)
            .build()
    }

    /// Accepts connections on loopback; each request's head goes to the list and is
    /// answered `answer`, or never, with `None`.
    async fn serve(answer: Option<&'static str>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    kept.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase());
                    match answer {
                        Some(body) => {
                            let reply = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = socket.write_all(reply.as_bytes()).await;
                        }
                        // Holds the connection open, answering nothing.
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        (base, heads)
    }

    /// Issue 24, finding 6: a secret named by ARN is read, and its request signed, in the
    /// ARN's region; a name in the configuration's.
    #[tokio::test]
    async fn a_secret_named_by_arn_is_read_in_the_arns_region() {
        let (base, heads) = serve(Some(r#"{"SecretString": "v", "Parameter": {"Value": "v"}}"#)).await;
        let secrets = AwsSecrets::new(&sdk_at(&base, "us-east-1"));
        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:pay-AbCdEf";
        for (source, scope) in [
            (format!("secretsmanager:{arn}"), "/eu-west-1/secretsmanager/aws4_request"),
            ("secretsmanager:pay".to_owned(), "/us-east-1/secretsmanager/aws4_request"),
            (
                "ssm:arn:aws:ssm:ap-south-2:123456789012:parameter/sas/pay".to_owned(),
                "/ap-south-2/ssm/aws4_request",
            ),
            ("ssm:/sas/pay".to_owned(), "/us-east-1/ssm/aws4_request"),
        ] {
            let value = secrets.get(&SecretSource::parse(&source).unwrap()).await.unwrap();
            assert_eq!(value.expose(), "v");
            let head = heads.lock().unwrap().pop().unwrap();
            assert!(head.contains(scope), "{source}: {head}");
        }
        // Without an endpoint of its own, that region's.
        assert_eq!(
            regional_endpoint(
                Service::SecretsManager,
                SecretSource::parse(&format!("secretsmanager:{arn}")).unwrap().region().unwrap()
            ),
            "https://secretsmanager.eu-west-1.amazonaws.com"
        );
    }

    /// Issue 24, finding 6: every read has a time limit, and a store that does not answer
    /// fails the read saying so. The runtime's clock is paused: the limit passes without
    /// waiting for it.
    #[tokio::test(start_paused = true)]
    async fn a_store_that_does_not_answer_fails_the_read_within_its_time_limit() {
        assert_eq!(
            SecretTimeouts::default(),
            SecretTimeouts { connect: Duration::from_secs(2), operation: Duration::from_secs(5) }
        );
        let (base, heads) = serve(None).await;
        let secrets = AwsSecrets::new(&sdk_at(&base, "us-east-1"));
        assert_eq!(secrets.timeouts(), SecretTimeouts::default(), "every client has them");
        let started = tokio::time::Instant::now();
        let err = secrets.get(&SecretSource::parse("ssm:/sas/pay").unwrap()).await.unwrap_err();
        let took = started.elapsed();
        assert!((Duration::from_secs(5)..Duration::from_millis(5_100)).contains(&took), "{took:?}");
        assert_eq!(err.source_name, "ssm:/sas/pay");
        assert!(err.reason.contains("did not answer within 5000 ms"), "{err}");
        assert_eq!(heads.lock().unwrap().len(), 1, "the request was sent, and never answered");
    }

    #[test]
    fn error_answers_give_their_code_and_message() {
        let status = reqwest::StatusCode::BAD_REQUEST;
        let body =
            br#"{"__type": "com.amazonaws.ssm#ParameterNotFound", "message": "Parameter /x not found."}"#;
        assert_eq!(
            error_text(status, body),
            "HTTP 400 Bad Request: ParameterNotFound: Parameter /x not found."
        );
        let body = br#"{"__type": "AccessDeniedException", "Message": "not authorized"}"#;
        assert_eq!(error_text(status, body), "HTTP 400 Bad Request: AccessDeniedException: not authorized");
        assert_eq!(
            error_text(reqwest::StatusCode::BAD_GATEWAY, b"<html>"),
            "HTTP 502 Bad Gateway: no error code"
        );
    }
}
