//! Operator alerts on SNS: one message per alert, JSON body, with the fields operators
//! filter on (order id, step, failure count) as message attributes.

use async_trait::async_trait;
use aws_sdk_sns::Client;
use aws_sdk_sns::error::DisplayErrorContext;
use aws_sdk_sns::types::MessageAttributeValue;

use crate::domain::OperatorAlert;
use crate::ports::{AlertError, Alerts};

/// SNS's limit on a subject.
pub const MAX_SUBJECT_CHARS: usize = 100;

/// A subject SNS accepts: printable ASCII only (it refuses control characters and
/// line breaks, and e-mail subscribers see it as a header), at most 100 characters.
pub fn subject(alert: &OperatorAlert) -> String {
    let printable: String =
        alert.subject().chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
    let trimmed = printable.trim();
    match trimmed.char_indices().nth(MAX_SUBJECT_CHARS) {
        Some((cut, _)) => trimmed[..cut].to_owned(),
        None => trimmed.to_owned(),
    }
}

#[derive(Debug, Clone)]
pub struct SnsAlerts {
    client: Client,
    topic_arn: String,
}

impl SnsAlerts {
    pub fn new(client: Client, topic_arn: impl Into<String>) -> SnsAlerts {
        SnsAlerts { client, topic_arn: topic_arn.into() }
    }
}

fn attribute(data_type: &str, value: String) -> Result<MessageAttributeValue, AlertError> {
    MessageAttributeValue::builder()
        .data_type(data_type)
        .string_value(value)
        .build()
        .map_err(|e| AlertError(e.to_string()))
}

#[async_trait]
impl Alerts for SnsAlerts {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        let body = serde_json::to_string(alert).map_err(|e| AlertError(format!("encoding alert: {e}")))?;
        self.client
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(subject(alert))
            .message(body)
            .message_attributes("order_id", attribute("String", alert.order_id.to_string())?)
            .message_attributes("step", attribute("Number", alert.step.to_string())?)
            .message_attributes("failure_count", attribute("Number", alert.failure_count.to_string())?)
            .send()
            .await
            .map_err(|e| {
                AlertError(format!("publishing to {}: {}", self.topic_arn, DisplayErrorContext(e)))
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{OrderId, ProcessState, Timestamp};

    #[test]
    fn subjects_are_printable_and_short() {
        let alert = OperatorAlert {
            order_id: OrderId::parse(&"o".repeat(64)).unwrap(),
            workflow: "w".into(),
            step: 2,
            step_name: "charge\npayment-é".repeat(4),
            state: ProcessState::Error,
            failure_count: 5,
            reason: "r".into(),
            idempotency_key: None,
            at: Timestamp(1),
        };
        let s = subject(&alert);
        assert_eq!(s.chars().count(), MAX_SUBJECT_CHARS);
        assert!(s.chars().all(|c| c.is_ascii_graphic() || c == ' '), "{s}");
        assert!(s.starts_with("sas: order ooo"));
    }
}
