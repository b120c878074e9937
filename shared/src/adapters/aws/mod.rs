//! The real services through the AWS SDK for Rust: DynamoDB for the state store, SQS
//! for the queues, SNS for operator alerts; and Parameter Store and Secrets Manager for
//! agents' auth values, with the SDK's signing and credentials but not its clients
//! (`secrets` says why). Endpoints and credentials come from the `SdkConfig` (so
//! `AWS_ENDPOINT_URL` points the lot at moto or LocalStack); the only endpoints named
//! here are `secrets`' regional defaults, which the SDK clients would otherwise resolve.

pub mod dynamodb;
pub mod provision;
pub mod secrets;
pub mod sns;
pub mod sqs;

pub use dynamodb::{DynamoStore, TableNames};
pub use secrets::{AwsSecrets, SecretTimeouts};
pub use sns::SnsAlerts;
pub use sqs::SqsQueues;

use aws_config::SdkConfig;

/// The start of every SDK configuration in sas (the functions, `sasctl`, the bootstrap,
/// the tests): the usual environment (region, credentials, `AWS_ENDPOINT_URL`) and one
/// HTTP client, rustls with ring. The SDK's own default client is rustls with aws-lc-rs,
/// whose first TLS connection costs a cold start several times more CPU (docs/BENCHMARKS.md
/// 5), so the workspace builds the SDK without it and every loader must come from here.
/// Root certificates are the platform's (`rustls-native-certs`: `SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set), loaded on the first request, not at init. Plain `http://`
/// endpoints (moto, LocalStack) work too. Unlike the SDK's default client, this one does not
/// read `HTTP(S)_PROXY` from the environment.
pub fn config_loader() -> aws_config::ConfigLoader {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let http =
        aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http)
}

/// One client per service, built once per process from one `SdkConfig`; clients are
/// cheap handles onto a shared connection pool, so clone freely.
#[derive(Debug, Clone)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub sns: aws_sdk_sns::Client,
}

impl Clients {
    pub fn new(sdk: &SdkConfig) -> Clients {
        Clients {
            dynamodb: aws_sdk_dynamodb::Client::new(sdk),
            sqs: aws_sdk_sqs::Client::new(sdk),
            sns: aws_sdk_sns::Client::new(sdk),
        }
    }
}
