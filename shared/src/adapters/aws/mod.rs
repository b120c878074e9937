//! The real services through the AWS SDK for Rust: DynamoDB for the state store, SQS
//! for the queues, SNS for operator alerts. Endpoints and credentials come from the
//! `SdkConfig` (so `AWS_ENDPOINT_URL` points the lot at moto or LocalStack); nothing
//! here names an endpoint.

pub mod dynamodb;
pub mod provision;
pub mod sns;
pub mod sqs;

pub use dynamodb::{DynamoStore, TableNames};
pub use sns::SnsAlerts;
pub use sqs::SqsQueues;

use aws_config::SdkConfig;

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
