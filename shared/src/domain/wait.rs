//! Timer steps: a step that calls no agent and waits, for a length of time or until a time
//! named by a path into the order or an earlier step's output.
//!
//! The path syntax, the one place it is defined (docs/DEPLOY.md, "Your own workflows",
//! shows it to users): `$.order.<key>(.<key>)*` or
//! `$.steps.<step name>.output.<key>(.<key>)*`, each key 1 to 64 of `A-Z a-z 0-9 - _`:
//! dotted object keys only, no array indexes, no quoting, no wildcards. What it names
//! must be an RFC 3339 time (`ids.rs`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ids::{TimeError, Timestamp};

/// The shortest wait: a shorter one is a step that should not wait at all.
pub const MIN_WAIT_MS: u64 = 1_000;
/// The longest wait: 366 days, so a wait "a year from now" fits in a leap year too. A
/// waiting task is one item in the due index; nothing bounds it but what an operator can
/// still reason about.
pub const MAX_WAIT_MS: u64 = 366 * 24 * 60 * 60 * 1_000;
/// SQS's longest message delay (15 minutes): a wake at most this far off is also sent as
/// a delayed Schedule; a later one is the supervisor's alone.
pub const MAX_DELAYED_WAKE_MS: u64 = 900_000;
/// A path's longest text.
pub const MAX_PATH_LEN: usize = 256;
const MAX_KEY_LEN: usize = 64;

/// `{"for_ms": 86400000}` or `{"until": "$.steps.charge.output.release_at"}`: exactly one
/// of the two (`definitions/waiting_steps.rs` checks it).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    /// Wait this long after the step starts, in milliseconds: 1000 (1 s) to 31622400000
    /// (366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1_000, max = 31_622_400_000u64)))]
    pub for_ms: Option<u64>,
    /// Wait until the RFC 3339 time this path names: `$.order.<key>(.<key>)*` or
    /// `$.steps.<earlier step>.output.<key>(.<key>)*`. A time already past wakes at once;
    /// a missing value, one that is not such a time, or one more than 366 days away fails
    /// the step (giving up as for a refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(
            pattern = r"^\$\.(order|steps\.[A-Za-z0-9_-]{1,64}\.output)(\.[A-Za-z0-9_-]{1,64})+$"
        ))
    )]
    pub until: Option<String>,
}

impl Wait {
    pub fn for_ms(ms: u64) -> Wait {
        Wait { for_ms: Some(ms), until: None }
    }
    pub fn until(path: &str) -> Wait {
        Wait { for_ms: None, until: Some(path.to_owned()) }
    }

    /// When a step that starts waiting at `now` wakes. `order` is the order as JSON;
    /// `output` gives an earlier step's output by name.
    pub fn wake_at(
        &self,
        now: Timestamp,
        order: &Value,
        output: impl Fn(&str) -> Option<Value>,
    ) -> Result<Timestamp, WakeError> {
        let path = match (self.for_ms, &self.until) {
            (Some(ms), None) => return Ok(now.plus_ms(ms)),
            (None, Some(path)) => path,
            _ => return Err(WakeError::NotOne),
        };
        let parsed = WaitPath::parse(path)?;
        let value = match &parsed {
            WaitPath::Order(keys) => find(order, keys).cloned(),
            WaitPath::Output { step, keys } => output(step).and_then(|o| find(&o, keys).cloned()),
        };
        let path = path.clone();
        let text = match value {
            None => return Err(WakeError::Missing { path }),
            Some(Value::String(text)) => text,
            Some(_) => return Err(WakeError::NotText { path }),
        };
        let at = Timestamp::parse_rfc3339(&text).map_err(|e| WakeError::BadTime { path: path.clone(), e })?;
        if at.millis_since(now) > MAX_WAIT_MS {
            return Err(WakeError::TooFar { path, at: text });
        }
        Ok(at)
    }
}

/// Why a timer cannot wait: the step fails for good, as a refusal would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WakeError {
    #[error("a wait needs exactly one of for_ms and until")]
    NotOne,
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("wait until {path}: there is no such value")]
    Missing { path: String },
    #[error("wait until {path}: the value is not a string")]
    NotText { path: String },
    #[error("wait until {path}: {e}")]
    BadTime { path: String, e: TimeError },
    #[error("wait until {path}: {at} is more than 366 days away")]
    TooFar { path: String, at: String },
}

/// A parsed `until` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitPath {
    /// `$.order.<keys>`: a field of the order as accepted.
    Order(Vec<String>),
    /// `$.steps.<step>.output.<keys>`: a field of an earlier step's output.
    Output { step: String, keys: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is longer than {MAX_PATH_LEN} characters")]
    TooLong,
    #[error(
        "{0:?} is not a path: write $.order.<key>(.<key>)* or $.steps.<step name>.output.<key>(.<key>)*, each key 1 to 64 of A-Z a-z 0-9 - _"
    )]
    Syntax(String),
}

impl WaitPath {
    pub fn parse(text: &str) -> Result<WaitPath, PathError> {
        if text.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong);
        }
        let syntax = || PathError::Syntax(text.to_owned());
        let parts: Vec<&str> = text.split('.').collect();
        if !parts.iter().skip(1).all(|k| key_ok(k)) {
            return Err(syntax());
        }
        let owned = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        match parts.as_slice() {
            ["$", "order", keys @ ..] if !keys.is_empty() => Ok(WaitPath::Order(owned(keys))),
            ["$", "steps", step, "output", keys @ ..] if !keys.is_empty() => {
                Ok(WaitPath::Output { step: (*step).to_owned(), keys: owned(keys) })
            }
            _ => Err(syntax()),
        }
    }
}

fn key_ok(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn find<'a>(mut value: &'a Value, keys: &[String]) -> Option<&'a Value> {
    for key in keys {
        value = value.as_object()?.get(key)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: Timestamp = Timestamp(1_772_355_600_000); // 2026-03-01T09:00:00Z

    fn outputs(step: &str) -> Option<Value> {
        (step == "charge").then(
            || json!({"release_at": "2026-03-02T09:00:00Z", "n": 3, "deep": {"at": "2026-03-01T08:00:00Z"}}),
        )
    }

    #[test]
    fn paths_parse_into_the_order_or_an_earlier_steps_output() {
        assert_eq!(WaitPath::parse("$.order.ship_by"), Ok(WaitPath::Order(vec!["ship_by".into()])));
        assert_eq!(
            WaitPath::parse("$.steps.charge.output.hold.release_at"),
            Ok(WaitPath::Output { step: "charge".into(), keys: vec!["hold".into(), "release_at".into()] })
        );
        for bad in [
            "",
            "$",
            "$.order",
            "$.order.",
            "order.x",
            "$.steps.charge.output",
            "$.steps.charge.x",
            "$.steps..output.x",
            "$.order.items[0]",
            "$.order.a b",
            "$.order.*",
            "$.other.x",
            "$.order..x",
        ] {
            assert_eq!(WaitPath::parse(bad), Err(PathError::Syntax(bad.into())), "{bad:?}");
        }
        assert_eq!(WaitPath::parse(&format!("$.order.{}", "a.".repeat(200))), Err(PathError::TooLong));
    }

    #[test]
    fn a_wait_for_a_length_wakes_that_long_after_it_starts() {
        assert_eq!(Wait::for_ms(5_000).wake_at(NOW, &json!({}), outputs), Ok(NOW.plus_ms(5_000)));
    }

    #[test]
    fn a_wait_until_reads_the_time_at_its_path() {
        let order = json!({"order_id": "o-1", "ship_by": "2026-03-01T10:00:00+01:00"});
        assert_eq!(Wait::until("$.order.ship_by").wake_at(NOW, &order, outputs), Ok(NOW));
        let wake = Wait::until("$.steps.charge.output.release_at").wake_at(NOW, &order, outputs);
        assert_eq!(wake, Ok(NOW.plus_ms(86_400_000)));
        // A time past is returned as it is: the caller wakes the step at once.
        let past = Wait::until("$.steps.charge.output.deep.at").wake_at(NOW, &order, outputs);
        assert_eq!(past, Ok(Timestamp(NOW.0 - 3_600_000)));
    }

    #[test]
    fn a_missing_or_bad_time_is_an_error_naming_its_path() {
        let order = json!({"ship_by": "next tuesday", "far": "2030-01-01T00:00:00Z"});
        let err = |w: Wait| w.wake_at(NOW, &order, outputs).unwrap_err().to_string();
        assert_eq!(err(Wait::until("$.order.nope")), "wait until $.order.nope: there is no such value");
        assert_eq!(
            err(Wait::until("$.steps.other.output.x")),
            "wait until $.steps.other.output.x: there is no such value"
        );
        assert_eq!(
            err(Wait::until("$.steps.charge.output.n")),
            "wait until $.steps.charge.output.n: the value is not a string"
        );
        assert_eq!(
            err(Wait::until("$.steps.charge.output.n.deeper")),
            "wait until $.steps.charge.output.n.deeper: there is no such value"
        );
        assert!(err(Wait::until("$.order.ship_by")).contains("\"next tuesday\" is not an RFC 3339 time"));
        assert!(err(Wait::until("$.order.far")).contains("more than 366 days away"));
        assert!(err(Wait::until("$.order")).contains("is not a path"));
        assert_eq!(err(Wait { for_ms: None, until: None }), "a wait needs exactly one of for_ms and until");
        assert_eq!(
            err(Wait { for_ms: Some(1_000), until: Some("$.order.x".into()) }),
            WakeError::NotOne.to_string()
        );
    }
}
