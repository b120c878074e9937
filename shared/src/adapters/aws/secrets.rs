//! Agents' auth values from Parameter Store (GetParameter, decrypted) and Secrets Manager
//! (GetSecretValue). Only the agent function reads secrets, and only for agents with
//! `auth`: each client is built on its first read, so a deployment without auth never
//! builds one and no cold start pays for it.

use std::sync::OnceLock;

use async_trait::async_trait;
use aws_config::SdkConfig;

use crate::domain::{SecretSource, SecretValue};
use crate::ports::{SecretError, Secrets};

#[derive(Debug)]
pub struct AwsSecrets {
    sdk: SdkConfig,
    ssm: OnceLock<aws_sdk_ssm::Client>,
    secretsmanager: OnceLock<aws_sdk_secretsmanager::Client>,
}

impl AwsSecrets {
    pub fn new(sdk: &SdkConfig) -> AwsSecrets {
        AwsSecrets { sdk: sdk.clone(), ssm: OnceLock::new(), secretsmanager: OnceLock::new() }
    }

    async fn parameter(&self, name: &str) -> Result<Option<String>, String> {
        let client = self.ssm.get_or_init(|| aws_sdk_ssm::Client::new(&self.sdk));
        let out = client
            .get_parameter()
            .name(name)
            // A SecureString is returned encrypted without it; a String is unaffected.
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| aws_sdk_ssm::error::DisplayErrorContext(e).to_string())?;
        Ok(out.parameter.and_then(|p| p.value))
    }

    async fn secret_string(&self, id: &str) -> Result<Option<String>, String> {
        let client = self.secretsmanager.get_or_init(|| aws_sdk_secretsmanager::Client::new(&self.sdk));
        let out = client
            .get_secret_value()
            .secret_id(id)
            .send()
            .await
            .map_err(|e| aws_sdk_secretsmanager::error::DisplayErrorContext(e).to_string())?;
        Ok(out.secret_string)
    }
}

#[async_trait]
impl Secrets for AwsSecrets {
    async fn get(&self, source: &SecretSource) -> Result<SecretValue, SecretError> {
        // The SDKs' errors carry the service's code and message (not found, access
        // denied, KMS, throttling), never a value.
        let read = match source {
            SecretSource::Ssm(name) => self.parameter(name).await,
            SecretSource::SecretsManager(id) => self.secret_string(id).await,
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
