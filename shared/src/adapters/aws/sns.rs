//! Operator alerts on SNS: one message per alert, JSON body, with the fields operators
//! filter on (order id, step, failure count) as message attributes. The body adds
//! `show`, the `sasctl` command that shows the task, so every alert says where to look.

use async_trait::async_trait;
use aws_sdk_sns::Client;
use aws_sdk_sns::error::DisplayErrorContext;
use aws_sdk_sns::types::MessageAttributeValue;

use crate::domain::{OperatorAlert, OrderId};
pub use crate::ports::Deployment;
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

/// One shell word: as it is when every character is safe unquoted, else single-quoted.
fn shell_word(value: &str) -> String {
    let safe =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '@' | '+' | '=');
    if !value.is_empty() && value.chars().all(safe) {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// An option and its value; `--name=value` when the value starts with `-`, which would
/// otherwise read as an option of its own.
fn option(name: &str, value: &str) -> String {
    if value.starts_with('-') {
        shell_word(&format!("--{name}={value}"))
    } else {
        format!("--{name} {}", shell_word(value))
    }
}

/// The command that shows one task, ready to paste into a shell. Order ids are
/// `[A-Za-z0-9_-]` (`OrderId::parse`), safe unquoted; one starting with `-` comes last,
/// after `--`, so it is not read as an option.
pub fn show_command(order_id: &OrderId, deployment: &Deployment) -> String {
    let id = order_id.as_str();
    let options = match deployment {
        Deployment::Stack(stack) => option("stack", stack),
        Deployment::Prefix(prefix) => option("prefix", prefix),
        Deployment::Unnamed => String::new(),
    };
    let words: Vec<&str> = if id.starts_with('-') {
        vec!["sasctl tasks show", &options, "--", id]
    } else {
        vec!["sasctl tasks show", id, &options]
    };
    words.into_iter().filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The message body: the alert's own fields and `show`.
#[derive(serde::Serialize)]
struct Body<'a> {
    #[serde(flatten)]
    alert: &'a OperatorAlert,
    show: String,
}

#[derive(Debug, Clone)]
pub struct SnsAlerts {
    client: Client,
    topic_arn: String,
    deployment: Deployment,
}

impl SnsAlerts {
    /// `deployment` is what each alert's `show` command names.
    pub fn new(client: Client, topic_arn: impl Into<String>, deployment: Deployment) -> SnsAlerts {
        SnsAlerts { client, topic_arn: topic_arn.into(), deployment }
    }
}

/// The JSON body published for `alert`.
pub fn body(alert: &OperatorAlert, deployment: &Deployment) -> Result<String, AlertError> {
    let show = show_command(&alert.order_id, deployment);
    serde_json::to_string(&Body { alert, show }).map_err(|e| AlertError(format!("encoding alert: {e}")))
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
        let body = body(alert, &self.deployment)?;
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

    #[test]
    fn show_commands_paste_into_a_shell() {
        let id = |s: &str| OrderId::parse(s).unwrap();
        let stack = Deployment::Stack("shop-prod".into());
        assert_eq!(show_command(&id("o-1"), &stack), "sasctl tasks show o-1 --stack shop-prod");
        assert_eq!(show_command(&id("-rf"), &stack), "sasctl tasks show --stack shop-prod -- -rf");
        let prefix = Deployment::Prefix("dev-1a2b".into());
        assert_eq!(show_command(&id("A_9"), &prefix), "sasctl tasks show A_9 --prefix dev-1a2b");
        assert_eq!(show_command(&id("o-1"), &Deployment::Unnamed), "sasctl tasks show o-1");
        assert_eq!(show_command(&id("-1"), &Deployment::Unnamed), "sasctl tasks show -- -1");
        // Names outside the safe set are quoted, a leading dash kept off the option.
        let odd = Deployment::Prefix("it's $HOME".into());
        assert_eq!(show_command(&id("o"), &odd), r"sasctl tasks show o --prefix 'it'\''s $HOME'");
        assert_eq!(
            show_command(&id("o"), &Deployment::Prefix("-x".into())),
            "sasctl tasks show o --prefix=-x"
        );
    }

    #[test]
    fn the_body_is_the_alert_and_its_show_command() {
        let alert = OperatorAlert {
            order_id: OrderId::parse("o-7").unwrap(),
            workflow: "w".into(),
            step: 0,
            step_name: "s".into(),
            state: ProcessState::Error,
            failure_count: 1,
            reason: "r".into(),
            idempotency_key: None,
            at: Timestamp(1),
        };
        let json = body(&alert, &Deployment::Stack("st".into())).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["show"], "sasctl tasks show o-7 --stack st");
        // Consumers that read the alert alone still can.
        assert_eq!(serde_json::from_str::<OperatorAlert>(&json).unwrap(), alert);
    }
}
