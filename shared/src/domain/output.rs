//! Step outputs: what a remote service answered a step with (its 2xx body, JSON), kept
//! with the task and handed to every later step and to every compensation: a refund
//! needs the charge's id.
//!
//! The task record keeps each output as compact JSON text under its step's name; the
//! agent request carries them as JSON values. Each is at most [`MAX_OUTPUT_BYTES`], so
//! a task of [`super::definitions::MAX_STEPS`] steps keeps at most 80 KiB of outputs,
//! with the order (at most about 20 KiB) well under DynamoDB's 400 KB item limit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The largest output kept for one step, as compact JSON.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024;

/// The deepest nesting an output may have. Outputs travel inside every later request
/// (a few levels down) and are parsed again there, where serde_json stops at 128 levels:
/// an output kept at 126 would make every later request of its task unreadable. 32 is
/// far more than a business answer needs and far from that limit.
pub const MAX_OUTPUT_DEPTH: usize = 32;

/// One step's output: compact JSON text of at most [`MAX_OUTPUT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StepOutput(String);

/// Outputs by the name of the step that produced them.
pub type Outputs = BTreeMap<String, StepOutput>;

/// Why an answer cannot be kept as an output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("the output is {bytes} bytes of JSON; at most {MAX_OUTPUT_BYTES} are kept")]
    TooLarge { bytes: usize },
    #[error("the answer is not JSON: {0}")]
    NotJson(String),
    #[error("the output nests {depth} levels deep; at most {MAX_OUTPUT_DEPTH} are kept")]
    TooDeep { depth: usize },
}

/// How deeply `value` nests (a scalar is 0, `[1]` is 1).
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(fields) => 1 + fields.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

impl StepOutput {
    /// A 2xx body as a step's output: nothing for an empty (or blank) body, else JSON
    /// within the limit. `body` may be cut short by the reader at `MAX_OUTPUT_BYTES + 1`:
    /// a body that long is too large whatever follows.
    pub fn from_body(body: &[u8]) -> Result<Option<serde_json::Value>, OutputError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if body.len() > MAX_OUTPUT_BYTES {
            return Err(OutputError::TooLarge { bytes: body.len() });
        }
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| OutputError::NotJson(e.to_string()))?;
        Self::from_value(&value)?;
        Ok(Some(value))
    }

    /// A value as it is kept, or why it cannot be (a reply from a queue worker is checked
    /// here too: it did not come through an agent's reader).
    pub fn from_value(value: &serde_json::Value) -> Result<StepOutput, OutputError> {
        let depth = depth(value);
        if depth > MAX_OUTPUT_DEPTH {
            return Err(OutputError::TooDeep { depth });
        }
        let text = value.to_string();
        if text.len() > MAX_OUTPUT_BYTES {
            return Err(OutputError::TooLarge { bytes: text.len() });
        }
        Ok(StepOutput(text))
    }

    /// A map step's outputs as one array, in item order, `null` for an item that kept
    /// none. Each item's was kept by `from_value`; the array is bounded by the map's own
    /// limit (`map.rs`), not by one output's.
    pub fn array<'a>(items: impl IntoIterator<Item = Option<&'a StepOutput>>) -> StepOutput {
        let mut text = String::from("[");
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(item.map_or("null", |o| o.0.as_str()));
        }
        text.push(']');
        StepOutput(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The output as the agent request carries it. A record holds only text that
    /// `from_value` produced; anything else (a hand-edited item) is carried as a string.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_else(|_| serde_json::Value::String(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_nothing_json_or_refused_with_its_reason() {
        assert_eq!(StepOutput::from_body(b""), Ok(None));
        assert_eq!(StepOutput::from_body(b" \n"), Ok(None));
        let v = StepOutput::from_body(br#"{"charge_id": "ch_1", "amount": 12}"#).unwrap().unwrap();
        assert_eq!(StepOutput::from_value(&v).unwrap().as_str(), r#"{"amount":12,"charge_id":"ch_1"}"#);
        assert!(matches!(StepOutput::from_body(b"ok"), Err(OutputError::NotJson(_))));
        let big = format!("\"{}\"", "x".repeat(MAX_OUTPUT_BYTES));
        assert_eq!(
            StepOutput::from_body(big.as_bytes()),
            Err(OutputError::TooLarge { bytes: MAX_OUTPUT_BYTES + 2 })
        );
        let at_limit = format!("\"{}\"", "x".repeat(MAX_OUTPUT_BYTES - 2));
        assert!(StepOutput::from_body(at_limit.as_bytes()).unwrap().is_some());
    }

    #[test]
    fn the_limit_is_on_compact_json_so_whitespace_does_not_count_twice() {
        let spaced = format!("{{ \"a\" : \"{}\" }}", "y".repeat(MAX_OUTPUT_BYTES - 20));
        assert!(spaced.len() <= MAX_OUTPUT_BYTES);
        let v = StepOutput::from_body(spaced.as_bytes()).unwrap().unwrap();
        assert!(StepOutput::from_value(&v).unwrap().as_str().len() < spaced.len());
    }

    /// A remote (or a worker) that answers with deeply nested JSON must not poison the
    /// task: such an output is refused where it comes in, and what is kept still reads
    /// back inside a request.
    #[test]
    fn deep_nesting_is_refused_at_the_boundary() {
        let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        assert_eq!(StepOutput::from_body(nested(126).as_bytes()), Err(OutputError::TooDeep { depth: 126 }));
        assert_eq!(
            StepOutput::from_body(nested(MAX_OUTPUT_DEPTH + 1).as_bytes()),
            Err(OutputError::TooDeep { depth: MAX_OUTPUT_DEPTH + 1 })
        );
        let kept = StepOutput::from_body(nested(MAX_OUTPUT_DEPTH).as_bytes()).unwrap().unwrap();
        let kept = StepOutput::from_value(&kept).unwrap();
        let request = format!(r#"{{"outputs": {{"charge": {}}}}}"#, kept.as_str());
        assert!(serde_json::from_str::<serde_json::Value>(&request).is_ok());
        // A worker's reply is checked the same way, as a value.
        let deep: serde_json::Value = serde_json::from_str(&nested(40)).unwrap();
        assert_eq!(StepOutput::from_value(&deep), Err(OutputError::TooDeep { depth: 40 }));
    }
}
