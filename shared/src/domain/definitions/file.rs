//! The file as written: its agents (remote services) and workflows, as a team writes them
//! in JSON (its schema, `docs/workflows.schema.json`, is generated from these types), and
//! the strict parse that reads it (unknown keys are errors, so a typo is not a silent
//! default).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::problem::{Problem, Severity};
use crate::domain::breaker::BreakerPolicy;
use crate::domain::retry::Backoff;
use crate::domain::secrets::SecretSource;
use crate::domain::workflow::Workflow;

/// The file as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DefinitionFile {
    /// For editors: the path or URL of the JSON Schema.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The remote services, by name.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentDef>,
    /// The first is the default for orders that name none.
    pub workflows: Vec<Workflow>,
}

/// How a step reaches its remote service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// The agent function calls `POST {url}/{step name}` with retries and a breaker.
    #[default]
    Http,
    /// The scheduler puts the agent request on `queue_url`; a worker of the team's own
    /// (any language) does the step and sends the fenced reply to the scheduler's queue
    /// (docs/WORKERS.md).
    Queue,
}

/// One remote service. Every field is optional: an empty object is the deployment's
/// `REMOTE_SERVICE_URL` with the agent's name appended, and the deployment's timing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    /// `http` (the default) or `queue`.
    #[serde(default, skip_serializing_if = "is_http")]
    pub kind: AgentKind,
    /// A `queue` agent's SQS queue URL, where its worker takes requests from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_url: Option<String>,
    /// Base URL: a step is `POST {url}/{step name}`. https (plain http only to a
    /// loopback host, and never for an agent with `auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// One call's timeout (each call is also bounded by the step's complete-by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Backoff between the calls of one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerDef>,
    /// A header sent on every call, its value read from Parameter Store or Secrets
    /// Manager and kept for 5 minutes. Needs the agent's own https `url`, and a secret
    /// goes to one host only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthDef>,
    /// At most this many calls in progress at once, across every container and every
    /// workflow that uses the agent (1 to 1,000). Work over it waits its turn, in arrival
    /// order, and counts no failure (`gate.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// At most this many calls started in any one-second window (1 to 1,000). An agent with
    /// it makes one request per dispatch: a transient failure is retried by the
    /// supervisor, through the gate, not in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<u32>,
    /// At most `limit` calls in progress at once for orders whose `key` field holds one
    /// value (one customer's flood must not starve the others'). Needs `max_in_flight` or
    /// `max_per_second` on the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_key: Option<PerKeyDef>,
}

/// `{"key": "$.order.customer_id", "limit": 2}`: orders with one value of the field share
/// `limit` places, waiting in a line of their own, before they take the agent's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PerKeyDef {
    /// A scalar field of the order: `$.order.customer_id`, `$.order.workflow`,
    /// `$.order.workflow_version` or `$.order.order_id`. An order without the field (a
    /// `workflow_version` not asked for) is of the key `""`.
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^\$\.order\.(customer_id|workflow|workflow_version|order_id)$"))
    )]
    pub key: String,
    /// 1 to 1,000.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000)))]
    pub limit: u32,
}

impl AgentDef {
    /// The agent's flow-control limits; none set is an agent without a gate.
    pub fn limits(&self) -> crate::domain::gate::Limits {
        crate::domain::gate::Limits {
            max_in_flight: self.max_in_flight,
            max_per_second: self.max_per_second,
            places_per_gate: None,
            per_key: self.max_in_flight_per_key.as_ref().and_then(|p| {
                Some(crate::domain::gate::PerKey {
                    key: crate::domain::gate::OrderKey::parse(&p.key)?,
                    limit: p.limit,
                })
            }),
        }
    }
}

/// `{"header": "Authorization", "secret": "ssm:/sas/payment/token", "prefix": "Bearer "}`:
/// every call of the agent carries `header: prefix + value`, the value read from where
/// `secret` says. The file names the secret, never holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AuthDef {
    /// The header's name, e.g. `Authorization` or `X-Api-Key`; not one sas sets itself
    /// (`Idempotency-Key`, `Content-Type`, `Content-Length`, `Host`, `Transfer-Encoding`,
    /// `Connection`).
    pub header: String,
    /// `ssm:NAME` (a Parameter Store parameter by name or ARN; a SecureString is read
    /// decrypted) or `secretsmanager:NAME-or-ARN` (a Secrets Manager secret's
    /// SecretString).
    pub secret: String,
    /// Put before the value, e.g. `Bearer ` (with its space); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

impl AuthDef {
    /// Where the value lives; `None` when `secret` does not parse (`check` reports it).
    pub fn source(&self) -> Option<SecretSource> {
        SecretSource::parse(&self.secret).ok()
    }
}

fn is_http(kind: &AgentKind) -> bool {
    *kind == AgentKind::Http
}

impl AgentDef {
    /// The queue a `queue` agent's requests go to.
    pub fn queue(&self) -> Option<&str> {
        match self.kind {
            AgentKind::Queue => self.queue_url.as_deref(),
            AgentKind::Http => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RetryDef {
    pub base_ms: u64,
    pub cap_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BreakerDef {
    /// Consecutive transient failures that open the circuit.
    pub failures: u32,
    /// How long it stays open before one probe call.
    pub open_ms: u64,
}

impl RetryDef {
    pub fn backoff(self) -> Backoff {
        Backoff { base_ms: self.base_ms, cap_ms: self.cap_ms }
    }
}

impl BreakerDef {
    pub fn policy(self) -> BreakerPolicy {
        BreakerPolicy { failure_threshold: self.failures, open_ms: self.open_ms }
    }
}

impl DefinitionFile {
    /// The JSON as typed, or the first place it does not fit (serde's own message, cut:
    /// it may echo a long key).
    pub fn parse(text: &str) -> Result<DefinitionFile, Problem> {
        serde_json::from_str(text).map_err(|e| {
            // serde's text ends with the position `at` already gives.
            let text = e.to_string();
            let position = format!(" at line {} column {}", e.line(), e.column());
            let message = text.strip_suffix(&position).unwrap_or(&text).to_owned();
            Problem {
                severity: Severity::Error,
                at: format!("line {}, column {}", e.line(), e.column()),
                message: crate::domain::messages::cut_reason(message),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Definitions;

    fn problems(text: &str) -> Vec<String> {
        match DefinitionFile::parse(text) {
            Ok(file) => file.check().iter().map(ToString::to_string).collect(),
            Err(p) => vec![p.to_string()],
        }
    }

    #[test]
    fn unknown_keys_and_bad_json_are_one_located_error() {
        let got = problems(
            r#"{"agents": {}, "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a", "compensate": "x"}]}]}"#,
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with("error: line 1, column "), "{got:?}");
        assert!(got[0].contains("unknown field `compensate`"), "{got:?}");
        let got = problems("{");
        assert!(got[0].contains("EOF"), "{got:?}");
    }

    /// serde's message carries the position itself; the problem names it once, in `at`.
    #[test]
    fn a_json_error_gives_its_position_once() {
        assert_eq!(problems(r#"{"agents": {"#), ["error: line 1, column 12: EOF while parsing an object"]);
        let unknown = problems("{\n  \"agents\": {},\n  \"workflow\": []\n}");
        assert_eq!(
            unknown,
            [
                "error: line 3, column 12: unknown field `workflow`, expected one of `$schema`, `agents`, `workflows`"
            ]
        );
    }

    #[test]
    fn an_agents_auth_names_a_header_and_where_its_value_lives() {
        let text = r#"{"agents": {
            "payment": {"url": "https://pay.internal/sas",
                        "auth": {"header": "Authorization", "secret": "ssm:/sas/payment/token", "prefix": "Bearer "}},
            "inventory": {"url": "https://inventory.internal/sas",
                          "auth": {"header": "X-Api-Key", "secret": "secretsmanager:inventory-key"}}},
          "workflows": [{"name": "w", "steps": [{"name": "charge", "agent": "payment"}, {"name": "reserve", "agent": "inventory"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        let auth = d.agents["payment"].auth.as_ref().unwrap();
        assert_eq!(auth.source(), Some(SecretSource::Ssm("/sas/payment/token".into())));
        assert_eq!(auth.prefix.as_deref(), Some("Bearer "));
        let auth = d.agents["inventory"].auth.as_ref().unwrap();
        assert_eq!(auth.source(), Some(SecretSource::SecretsManager("inventory-key".into())));
        assert_eq!(auth.prefix, None);
    }

    #[test]
    fn on_give_up_fail_never_compensates() {
        let text = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "on_give_up": "fail", "steps": [
            {"name": "s", "agent": "a", "compensation": "undo-s"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert!(!d.workflows.get("w").unwrap().compensates());
    }
}
