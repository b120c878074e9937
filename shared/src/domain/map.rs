//! Map steps: one step run over every item of a list only known at run time (the order's
//! lines, or an array in an earlier step's output), at most `max_concurrency` items at a
//! time, each item a call of its own with its own idempotency key
//! (`<order>:<step>.<index>:<action>`), and the items' outputs kept as one array.
//!
//! This file holds what a map is as data: where its items come from, its bounds, and its
//! items' keys. Running one is the task's (`task/branches.rs` keeps its items' state).

use serde_json::Value;

use super::ids::{IdempotencyKey, OrderId};
use super::output::Outputs;

/// The most items one map runs over: each is a branch of the record (`task/branches.rs`).
pub const MAX_MAP_ITEMS: usize = 1_000;
/// The most items of one map in flight at once: their replies race on one record.
pub const MAX_MAP_CONCURRENCY: u32 = 50;
/// A map's outputs together, as the compact JSON array kept under its name: they travel
/// in every later request, next to the order and up to 19 other outputs of 4 KiB, and
/// must leave both the record (400 KB) and a request (256 KiB) room. 1,000 items may
/// answer 64 bytes each (an id and its field name).
pub const MAX_MAP_OUTPUT_BYTES: usize = 64 * 1024;

/// Where a map's items come from: `$.order.items`, or an array in an earlier step's
/// output, `$.steps.<step>.output` followed by field names (`.lines`, `.a.b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemsPath {
    OrderItems,
    Output { step: String, fields: Vec<String> },
}

/// Why a map's items cannot be read when it starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemsError {
    #[error("step {0} kept no output to take items from")]
    NoOutput(String),
    #[error("{path} is not an array")]
    NotAnArray { path: String },
    #[error("{path} holds {len} items; a map runs over at most {MAX_MAP_ITEMS}")]
    TooMany { path: String, len: usize },
}

impl ItemsPath {
    /// The path as written, or why it is not one.
    pub fn parse(text: &str) -> Result<ItemsPath, String> {
        if text == "$.order.items" {
            return Ok(ItemsPath::OrderItems);
        }
        let usage = || {
            format!(
                "{text:?} is not an items path: write \"$.order.items\" or \"$.steps.<step>.output\" and field names"
            )
        };
        let rest = text.strip_prefix("$.steps.").ok_or_else(usage)?;
        let mut parts = rest.split('.');
        let step = parts.next().filter(|s| !s.is_empty()).ok_or_else(usage)?;
        if parts.next() != Some("output") {
            return Err(usage());
        }
        let fields: Vec<String> = parts.map(str::to_owned).collect();
        if fields.iter().any(String::is_empty) {
            return Err(usage());
        }
        Ok(ItemsPath::Output { step: step.to_owned(), fields })
    }

    /// The step whose output holds the items, if they come from one.
    pub fn step(&self) -> Option<&str> {
        match self {
            ItemsPath::OrderItems => None,
            ItemsPath::Output { step, .. } => Some(step),
        }
    }

    /// The items: `order_items` is the order's lines as JSON.
    pub fn resolve(
        &self,
        order_items: impl FnOnce() -> Value,
        outputs: &Outputs,
    ) -> Result<Vec<Value>, ItemsError> {
        let value = match self {
            ItemsPath::OrderItems => order_items(),
            ItemsPath::Output { step, fields } => {
                let kept = outputs.get(step).ok_or_else(|| ItemsError::NoOutput(step.clone()))?;
                let mut value = kept.to_value();
                for field in fields {
                    value = match value {
                        Value::Object(mut map) => map.remove(field).unwrap_or(Value::Null),
                        _ => Value::Null,
                    };
                }
                value
            }
        };
        match value {
            Value::Array(items) if items.len() > MAX_MAP_ITEMS => {
                Err(ItemsError::TooMany { path: self.to_string(), len: items.len() })
            }
            Value::Array(items) => Ok(items),
            _ => Err(ItemsError::NotAnArray { path: self.to_string() }),
        }
    }
}

impl std::fmt::Display for ItemsPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemsPath::OrderItems => f.write_str("$.order.items"),
            ItemsPath::Output { step, fields } => {
                write!(f, "$.steps.{step}.output")?;
                fields.iter().try_for_each(|field| write!(f, ".{field}"))
            }
        }
    }
}

/// A map's place in its workflow: the step at `at` runs once per item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapStep {
    /// The map's name: its outputs are kept under it, `$.steps.<name>.output`.
    pub name: String,
    pub at: u32,
    /// As written: `validate` holds it to [`ItemsPath::parse`].
    pub items: String,
    pub max_concurrency: u32,
    /// Items that may be refused before the map gives up; more than this gives up.
    pub tolerated_failures: u32,
    /// Its agent has limits (`gate::Limits::any`): each item's call takes a place of its
    /// own in the agent's gate, and a task holds one place at a time, so the map sends
    /// one item at a time, each by a claim through the gate, and hands its lease back
    /// between items (`Trigger::NextItem`). Not written in the file: the deployment's
    /// agents say it (`Workflow::gate_maps`).
    pub gated: bool,
}

impl MapStep {
    pub fn items_path(&self) -> Result<ItemsPath, String> {
        ItemsPath::parse(&self.items)
    }
}

/// The key of one action of one item of the map step `step`: the same for every retry
/// and every attempt of it, and another item's never.
pub fn item_key(order_id: &OrderId, step: u32, index: u32, undo: bool) -> IdempotencyKey {
    let mut key = String::with_capacity(order_id.as_str().len() + 24);
    key.push_str(order_id.as_str());
    key.push(':');
    key.push_str(itoa::Buffer::new().format(step));
    if !crate::mutations::item_keys_shared() {
        key.push('.');
        key.push_str(itoa::Buffer::new().format(index));
    }
    key.push_str(if undo { ":undo" } else { ":do" });
    IdempotencyKey(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_items_path_names_the_orders_lines_or_an_array_in_an_earlier_output() {
        assert_eq!(ItemsPath::parse("$.order.items"), Ok(ItemsPath::OrderItems));
        let lines = ItemsPath::parse("$.steps.quote.output.lines").unwrap();
        assert_eq!(lines, ItemsPath::Output { step: "quote".into(), fields: vec!["lines".into()] });
        assert_eq!(lines.to_string(), "$.steps.quote.output.lines");
        assert_eq!(ItemsPath::parse("$.steps.quote.output").unwrap().step(), Some("quote"));
        for bad in
            ["$.order.lines", "$.steps..output", "$.steps.q.outputs", "$.steps.q.output..x", "order.items"]
        {
            assert!(ItemsPath::parse(bad).unwrap_err().contains("is not an items path"), "{bad}");
        }
    }

    #[test]
    fn items_are_read_from_the_order_or_a_kept_output_and_must_be_an_array() {
        let mut outputs = Outputs::new();
        let kept =
            |text: &str| crate::domain::StepOutput::from_value(&serde_json::from_str(text).unwrap()).unwrap();
        outputs.insert("quote".into(), kept(r#"{"lines": [1, {"a": 2}], "n": 3}"#));
        let order = || serde_json::json!([{"sku": "a", "quantity": 1}]);
        assert_eq!(ItemsPath::OrderItems.resolve(order, &outputs).unwrap().len(), 1);
        let lines = ItemsPath::parse("$.steps.quote.output.lines").unwrap();
        assert_eq!(
            lines.resolve(order, &outputs).unwrap(),
            [serde_json::json!(1), serde_json::json!({"a": 2})]
        );
        let n = ItemsPath::parse("$.steps.quote.output.n").unwrap();
        assert_eq!(
            n.resolve(order, &outputs),
            Err(ItemsError::NotAnArray { path: "$.steps.quote.output.n".into() })
        );
        let gone = ItemsPath::parse("$.steps.other.output").unwrap();
        assert_eq!(gone.resolve(order, &outputs), Err(ItemsError::NoOutput("other".into())));
        outputs.insert("big".into(), kept(&format!("[{}]", vec!["1"; MAX_MAP_ITEMS + 1].join(","))));
        let big = ItemsPath::parse("$.steps.big.output").unwrap();
        assert!(matches!(big.resolve(order, &outputs), Err(ItemsError::TooMany { len: 1001, .. })));
    }

    #[test]
    fn each_item_has_a_key_of_its_own_for_each_action() {
        let id = OrderId::parse("o-1").unwrap();
        assert_eq!(item_key(&id, 2, 17, false).0, "o-1:2.17:do");
        assert_eq!(item_key(&id, 2, 17, true).0, "o-1:2.17:undo");
        assert_ne!(item_key(&id, 2, 1, false), item_key(&id, 2, 11, false));
    }
}
