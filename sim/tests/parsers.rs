//! Property tests for every message parser, on stable Rust so `cargo test` covers what
//! the cargo-fuzz targets (fuzz/, nightly) do: arbitrary strings, byte-level mutations
//! of valid messages, and JSON-level mutations (a value replaced by arbitrary JSON, a
//! field dropped, a field added). Bad input is an error, never a panic; what parses
//! obeys the contract and serializes back to itself. The orders queue's own parser
//! (`Intake::parse`: an order or an app's cancel) runs on every body too.

use proptest::prelude::*;
use sas::domain::{
    AgentRequest, Intake, MAX_FIELD_LEN, MAX_ITEMS, MAX_QUANTITY, OrderRequest, SchedulerMessage, Sender,
    Workflows, sniff_order_id, sniff_reply_to,
};
use serde_json::Value;

const ORDER: &str = r#"{"order_id":"o-1001","customer_id":"c-7","items":[{"sku":"A-1","quantity":2},{"sku":"B","quantity":10000}],"workflow":"three-step","reply_to":"https://sqs.us-east-1.amazonaws.com/123456789012/sas-status"}"#;
const SCHEDULE: &str = r#"{"type":"schedule","order_id":"o-1001"}"#;
const REPLY: &str = r#"{"type":"reply","order_id":"o-1001","step":1,"action":"undo","attempt":3,"lease":"3f2a6c1e-9b7d-4e2a-8c5f-1d2e3f4a5b6c","outcome":{"status":"failed","reason":"card declined"}}"#;
const AGENT: &str = r#"{"order_id":"o-1001","workflow":"three-step","step":1,"step_name":"charge-payment","agent":"payment","action":"do","attempt":3,"lease":"3f2a6c1e-9b7d-4e2a-8c5f-1d2e3f4a5b6c","complete_by":1700000030000,"idempotency_key":"o-1001:1:do","order":{"order_id":"o-1001","customer_id":"c-7","items":[{"sku":"A-1","quantity":2}],"workflow":"three-step"}}"#;
const CANCEL: &str = r#"{"cancel":"o-1001","reason":"the customer changed their mind","requested_by":"crm"}"#;
const VALID: [&str; 5] = [ORDER, SCHEDULE, REPLY, AGENT, CANCEL];

fn text_ok(s: &str) -> bool {
    !s.trim().is_empty() && s.chars().count() <= MAX_FIELD_LEN && !s.chars().any(char::is_control)
}

/// Every parser on one body: never a panic, and every success obeys the contract.
fn check_all(body: &str) -> Result<(), TestCaseError> {
    let _ = sniff_order_id(body);
    let _ = sniff_reply_to(body);
    if let Ok(request) = OrderRequest::parse(body) {
        prop_assert_eq!(OrderRequest::parse(body).ok(), Some(request.clone()), "parsing is a function");
        if let Ok((order, reply_to)) = request.validate(&Workflows::builtin()) {
            let id = order.order_id.as_str();
            prop_assert!(!id.is_empty() && id.len() <= 64);
            prop_assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
            prop_assert!(text_ok(&order.customer_id));
            prop_assert!(!order.items.is_empty() && order.items.len() <= MAX_ITEMS);
            for item in &order.items {
                prop_assert!(text_ok(&item.sku));
                prop_assert!((1..=MAX_QUANTITY).contains(&item.quantity));
            }
            prop_assert!(Workflows::builtin().get(&order.workflow).is_some());
            if let Some(r) = reply_to {
                prop_assert!(!r.trim().is_empty() && !r.chars().any(char::is_control));
            }
            let again: sas::domain::Order = serde_json::from_str(&order.payload()).expect("payload parses");
            prop_assert_eq!(again, order);
        }
    }
    if let Ok(message) = SchedulerMessage::parse(body) {
        prop_assert_eq!(SchedulerMessage::parse(&message.to_body()).ok(), Some(message));
    }
    if let Ok(request) = AgentRequest::parse(body) {
        prop_assert_eq!(AgentRequest::parse(&request.to_body()).ok(), Some(request));
    }
    // The orders queue: a body with a `cancel` field is a cancel or an error, never an
    // order; a cancel obeys the contract and serializes back to itself.
    let names_cancel =
        serde_json::from_str::<serde_json::Map<String, Value>>(body).is_ok_and(|m| m.contains_key("cancel"));
    match Intake::parse(body) {
        Ok(Intake::Order(request)) => {
            prop_assert!(!names_cancel, "a cancel read as an order");
            prop_assert_eq!(OrderRequest::parse(body).ok(), Some(request));
        }
        Ok(Intake::Cancel(cancel)) => {
            prop_assert!(names_cancel);
            prop_assert!(text_ok(&cancel.reason));
            prop_assert!(cancel.requested_by.as_deref().is_none_or(text_ok));
            let again = serde_json::to_string(&cancel).expect("a cancel serializes");
            prop_assert_eq!(Intake::parse(&again).ok(), Some(Intake::Cancel(cancel)));
        }
        Err(_) => {}
    }
    // A sender id of any shape: a sender without its session name, or none.
    if let Some(sender) = Sender::from_sender_id(body) {
        prop_assert!(!sender.as_str().is_empty() && !sender.as_str().contains(':'));
        prop_assert_eq!(Some(sender.as_str()), body.split(':').next().map(str::trim));
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, char),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let interesting = prop_oneof![
        Just("\"".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("[".to_owned()),
        Just(",".to_owned()),
        Just(":".to_owned()),
        Just("\\".to_owned()),
        Just("\\u0000".to_owned()),
        Just("\\ud800".to_owned()),
        Just("-1".to_owned()),
        Just("1e400".to_owned()),
        Just("null".to_owned()),
        Just("18446744073709551616".to_owned()),
        any::<String>(),
    ];
    prop_oneof![
        (any::<usize>(), 1usize..8).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), interesting).prop_map(|(at, s)| Edit::Insert(at, s)),
        (any::<usize>(), any::<char>()).prop_map(|(at, c)| Edit::Replace(at, c)),
        (any::<usize>(), 1usize..40).prop_map(|(at, n)| Edit::Duplicate(at, n)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(body: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = body.chars().collect();
    for e in edits {
        let len = chars.len().max(1);
        match e {
            Edit::Delete(at, n) => {
                let at = at % len;
                let end = (at + n).min(chars.len());
                if at < end {
                    chars.drain(at..end);
                }
            }
            Edit::Insert(at, s) => {
                let at = at % (chars.len() + 1);
                chars.splice(at..at, s.chars());
            }
            Edit::Replace(at, c) => {
                if !chars.is_empty() {
                    let at = at % chars.len();
                    chars[at] = *c;
                }
            }
            Edit::Duplicate(at, n) => {
                let at = at % len;
                let end = (at + n).min(chars.len());
                if at < end {
                    let copy: Vec<char> = chars[at..end].to_vec();
                    chars.splice(end..end, copy);
                }
            }
            Edit::Truncate(at) => chars.truncate(at % len),
        }
    }
    chars.into_iter().collect()
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just(String::new()),
            Just(" ".to_owned()),
            Just("x".repeat(65)),
            Just("a\u{0}b".to_owned()),
            Just("o/1".to_owned()),
            Just("3f2a6c1e-9b7d-4e2a-8c5f-1d2e3f4a5b6c".to_owned()),
            Just("three-step".to_owned()),
            Just("do".to_owned()),
            Just("undo".to_owned()),
            Just("reply".to_owned()),
            Just("schedule".to_owned()),
            any::<String>(),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[derive(Debug, Clone)]
enum JsonEdit {
    /// Replace the value at the chosen path.
    Set(Vec<usize>, Value),
    /// Remove the chosen key (or array element).
    Remove(Vec<usize>),
    /// Add a key next to the chosen one.
    Add(Vec<usize>, String, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let path = prop::collection::vec(any::<usize>(), 0..4);
    prop_oneof![
        (path.clone(), json()).prop_map(|(p, v)| JsonEdit::Set(p, v)),
        path.clone().prop_map(JsonEdit::Remove),
        (path, "[a-z_-]{1,12}", json()).prop_map(|(p, k, v)| JsonEdit::Add(p, k, v)),
    ]
}

/// The container at the end of `path` (indices taken modulo each container's size), and
/// the index of the chosen child in it.
fn walk<'a>(mut v: &'a mut Value, path: &[usize]) -> Option<(&'a mut Value, usize)> {
    for (depth, step) in path.iter().enumerate() {
        let n = match v {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => return None,
        };
        if n == 0 {
            return None;
        }
        let i = step % n;
        if depth + 1 == path.len() {
            return Some((v, i));
        }
        v = match v {
            Value::Object(m) => m.values_mut().nth(i)?,
            Value::Array(a) => &mut a[i],
            _ => return None,
        };
    }
    None
}

fn apply_json(body: &str, e: &JsonEdit) -> String {
    let mut v: Value = serde_json::from_str(body).expect("valid templates");
    match e {
        JsonEdit::Set(path, new) => match walk(&mut v, path) {
            Some((Value::Object(m), i)) => {
                if let Some(slot) = m.values_mut().nth(i) {
                    *slot = new.clone();
                }
            }
            Some((Value::Array(a), i)) => a[i] = new.clone(),
            _ => v = new.clone(),
        },
        JsonEdit::Remove(path) => match walk(&mut v, path) {
            Some((Value::Object(m), i)) => {
                if let Some(k) = m.keys().nth(i).cloned() {
                    m.remove(&k);
                }
            }
            Some((Value::Array(a), i)) => {
                a.remove(i);
            }
            _ => {}
        },
        JsonEdit::Add(path, key, new) => match walk(&mut v, path) {
            Some((Value::Object(m), _)) => {
                m.insert(key.clone(), new.clone());
            }
            _ => {
                if let Value::Object(m) = &mut v {
                    m.insert(key.clone(), new.clone());
                }
            }
        },
    }
    v.to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_strings_are_errors_not_panics(body in any::<String>()) {
        check_all(&body)?;
    }

    #[test]
    fn json_shaped_noise_is_an_error_not_a_panic(body in "[{}\\[\\]\":,0-9a-z_ -]{0,200}") {
        check_all(&body)?;
    }

    #[test]
    fn byte_mutations_of_valid_messages(which in 0usize..5, edits in prop::collection::vec(edit(), 1..5)) {
        check_all(&apply(VALID[which], &edits))?;
    }

    #[test]
    fn json_mutations_of_valid_messages(which in 0usize..5, edits in prop::collection::vec(json_edit(), 1..4)) {
        let mut body = VALID[which].to_owned();
        for e in &edits {
            body = apply_json(&body, e);
        }
        check_all(&body)?;
    }

    #[test]
    fn arbitrary_json_values(v in json()) {
        check_all(&v.to_string())?;
    }

    /// Unknown fields are rejected by every parser, wherever they are added at the top.
    #[test]
    fn an_unknown_top_level_field_is_always_rejected(which in 0usize..5, key in "[a-z]{1,8}x", v in json()) {
        let mut value: Value = serde_json::from_str(VALID[which]).unwrap();
        value.as_object_mut().unwrap().insert(key, v);
        let body = value.to_string();
        match which {
            0 => prop_assert!(OrderRequest::parse(&body).is_err()),
            1 | 2 => prop_assert!(SchedulerMessage::parse(&body).is_err()),
            3 => prop_assert!(AgentRequest::parse(&body).is_err()),
            _ => prop_assert!(Intake::parse(&body).is_err()),
        }
    }
}

#[test]
fn the_templates_are_valid() {
    let (order, _) = OrderRequest::parse(ORDER).unwrap().validate(&Workflows::builtin()).unwrap();
    assert_eq!(order.items.len(), 2);
    assert!(SchedulerMessage::parse(SCHEDULE).is_ok());
    assert!(SchedulerMessage::parse(REPLY).is_ok());
    assert!(AgentRequest::parse(AGENT).is_ok());
    assert!(matches!(Intake::parse(CANCEL), Ok(Intake::Cancel(_))));
    assert!(matches!(Intake::parse(ORDER), Ok(Intake::Order(_))));
}
