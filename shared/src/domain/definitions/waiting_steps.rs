//! The checks of the steps that wait: a timer step's wait (a length in range, or a path to
//! a time the order or an earlier step gives) and a callback step's timeout and heartbeat.

use crate::domain::callback::{Callback, MAX_CALLBACK_MS, MIN_CALLBACK_MS};
use crate::domain::wait::{MAX_WAIT_MS, MIN_WAIT_MS, Wait, WaitPath};
use crate::domain::workflow::{Step, StepEffect, Workflow};

/// The order's fields, as a `$.order.<key>` path may name them (`messages.rs`'s `Order`;
/// a test holds the two to each other).
pub(super) const ORDER_FIELDS: [&str; 5] =
    ["order_id", "customer_id", "items", "workflow", "workflow_version"];

/// What is wrong with a timer step, by field: a timer calls nothing, undoes nothing and
/// cannot fail, and waits for a length in range or until a time an earlier agent step
/// (or the order) gives.
pub(super) fn timer_problems(wf: &Workflow, step: &Step, wait: &Wait) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let not_for_timer = "does not apply to a timer step: it calls nothing and cannot fail";
    if !step.agent.is_empty() {
        out.push(("agent", "a timer step calls no agent: remove agent or wait".to_owned()));
    }
    if step.compensation.is_some() {
        out.push(("compensation", "a timer step has nothing to undo".to_owned()));
    }
    if step.effect != StepEffect::Writes {
        out.push(("effect", "does not apply to a timer step: it changes nothing".to_owned()));
    }
    if step.timeout_ms.is_some() {
        out.push(("timeout_ms", not_for_timer.to_owned()));
    }
    if step.max_failures.is_some() {
        out.push(("max_failures", not_for_timer.to_owned()));
    }
    if step.max_throttled_ms.is_some() {
        out.push(("max_throttled_ms", not_for_timer.to_owned()));
    }
    if step.callback.is_some() {
        out.push((
            "callback",
            "a timer step waits for its time, not for the outside: remove wait or callback".to_owned(),
        ));
    }
    match (wait.for_ms, &wait.until) {
        (Some(_), Some(_)) => out.push(("wait", "set for_ms or until, not both".to_owned())),
        (None, None) => out.push(("wait", "needs for_ms (how long) or until (a path to a time)".to_owned())),
        (Some(ms), None) if !(MIN_WAIT_MS..=MAX_WAIT_MS).contains(&ms) => out.push((
            "wait.for_ms",
            format!("{ms} is out of range: {MIN_WAIT_MS} (1 s) to {MAX_WAIT_MS} (366 days)"),
        )),
        (Some(_), None) => {}
        (None, Some(path)) => match WaitPath::parse(path) {
            Err(e) => out.push(("wait.until", e.to_string())),
            Ok(WaitPath::Order(keys)) if !ORDER_FIELDS.contains(&keys[0].as_str()) => out.push((
                "wait.until",
                format!("the order has no field {:?}; it has: {}", keys[0], ORDER_FIELDS.join(", ")),
            )),
            Ok(WaitPath::Order(_)) => {}
            Ok(WaitPath::Output { step: named, .. }) => {
                let this = wf.steps.iter().position(|s| s.name == step.name);
                let earlier = wf.steps.iter().position(|s| s.name == named).filter(|&i| Some(i) < this);
                match earlier.map(|i| &wf.steps[i]) {
                    None => out.push((
                        "wait.until",
                        format!("names step {named:?}, which is not an earlier step of this workflow"),
                    )),
                    Some(s) if s.is_timer() => {
                        out.push(("wait.until", format!("names timer step {named:?}, which has no output")))
                    }
                    // A map's items' outputs are kept as one array under the map's name.
                    Some(_) if let Some(map) = earlier.and_then(|i| wf.map_at(i as u32)) => out.push((
                        "wait.until",
                        format!(
                            "names step {named:?}, which runs once per item of map {}: it keeps no output of its own",
                            map.name
                        ),
                    )),
                    Some(_) => {}
                }
            }
        },
    }
    out
}

/// What is wrong with a callback step's timeout and heartbeat, by field.
pub(super) fn callback_problems(cb: &Callback) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let range = |ms: u64| (MIN_CALLBACK_MS..=MAX_CALLBACK_MS).contains(&ms);
    if !range(cb.timeout_ms) {
        out.push((
            "callback.timeout_ms",
            format!(
                "{} is out of range: {MIN_CALLBACK_MS} (1 s) to {MAX_CALLBACK_MS} (366 days)",
                cb.timeout_ms
            ),
        ));
    }
    match cb.heartbeat_ms {
        Some(ms) if !range(ms) => out.push((
            "callback.heartbeat_ms",
            format!("{ms} is out of range: {MIN_CALLBACK_MS} (1 s) to the callback's timeout_ms"),
        )),
        Some(ms) if ms > cb.timeout_ms => out.push((
            "callback.heartbeat_ms",
            format!(
                "{ms} is longer than the callback's timeout_ms ({}): it could never be missed",
                cb.timeout_ms
            ),
        )),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Definitions;
    use crate::domain::definitions::DefinitionFile;
    use crate::domain::workflow::StepKind;

    fn problems(text: &str) -> Vec<String> {
        match DefinitionFile::parse(text) {
            Ok(file) => file.check().iter().map(ToString::to_string).collect(),
            Err(p) => vec![p.to_string()],
        }
    }

    #[test]
    fn timer_steps_wait_for_a_length_or_until_a_time_from_an_earlier_step() {
        let text = r#"{"agents": {"pay": {}, "ship": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "charge", "agent": "pay", "compensation": "refund"},
            {"name": "cool-off", "wait": {"for_ms": 86400000}},
            {"name": "hold", "wait": {"until": "$.steps.charge.output.release_at"}},
            {"name": "by", "wait": {"until": "$.order.customer_id"}},
            {"name": "ship", "agent": "ship"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let wf = d.workflows.get("w").unwrap();
        assert_eq!(wf.step(1).unwrap().wait, Some(Wait::for_ms(86_400_000)));
        assert_eq!(wf.step(1).unwrap().kind(), StepKind::ReadOnly);
        // The longest wait is a year and a day; the shortest a second.
        for ms in [MIN_WAIT_MS, MAX_WAIT_MS] {
            let ok = text.replace("86400000", &ms.to_string());
            assert!(Definitions::parse(&ok).is_ok(), "{ms}");
        }
        const { assert!(MAX_WAIT_MS >= 365 * 24 * 3_600_000) };
    }

    #[test]
    fn callback_steps_need_an_agent_and_a_timeout_in_range() {
        let text = r#"{"agents": {"approvals": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "approve", "agent": "approvals", "compensation": "withdraw",
             "callback": {"timeout_ms": 604800000, "heartbeat_ms": 3600000}}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        let step = d.workflows.get("w").unwrap().step(0).unwrap();
        assert_eq!(step.callback, Some(Callback { timeout_ms: 604_800_000, heartbeat_ms: Some(3_600_000) }));
        let bad = r#"{"agents": {"approvals": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "short", "agent": "approvals", "callback": {"timeout_ms": 999}},
            {"name": "long", "agent": "approvals", "callback": {"timeout_ms": 31622400001}},
            {"name": "beat", "agent": "approvals", "callback": {"timeout_ms": 5000, "heartbeat_ms": 6000}},
            {"name": "tick", "agent": "approvals", "callback": {"timeout_ms": 5000, "heartbeat_ms": 10}},
            {"name": "both", "wait": {"for_ms": 5000}, "callback": {"timeout_ms": 5000}},
            {"name": "nobody", "callback": {"timeout_ms": 5000}}]}]}"#;
        let got = problems(bad);
        let want = [
            "error: workflow w v1, step short, callback.timeout_ms: 999 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step long, callback.timeout_ms: 31622400001 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step beat, callback.heartbeat_ms: 6000 is longer than the callback's timeout_ms (5000): it could never be missed",
            "error: workflow w v1, step tick, callback.heartbeat_ms: 10 is out of range: 1000 (1 s) to the callback's timeout_ms",
            "error: workflow w v1, step both, callback: a timer step waits for its time, not for the outside: remove wait or callback",
            "error: workflow w v1, step nobody, agent: a step needs an agent (or a wait, to be a timer step)",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w:?} in {got:#?}");
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        // A callback with no timeout is one clear line too.
        let none = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "s", "agent": "a", "callback": {"heartbeat_ms": 5000}}]}]}"#;
        let e = Definitions::parse(none).unwrap_err().to_string();
        assert!(e.contains("missing field `timeout_ms`"), "{e}");
    }

    #[test]
    fn every_problem_of_a_timer_step_is_one_located_line() {
        let text = r#"{"agents": {"pay": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "early", "wait": {"until": "$.steps.charge.output.at"}},
            {"name": "charge", "agent": "pay"},
            {"name": "both", "wait": {"for_ms": 5000, "until": "$.order.customer_id"}},
            {"name": "neither", "wait": {}},
            {"name": "short", "wait": {"for_ms": 999}},
            {"name": "long", "wait": {"for_ms": 31622400001}},
            {"name": "agented", "agent": "pay", "compensation": "undo", "timeout_ms": 5000, "max_failures": 2, "effect": "none", "wait": {"for_ms": 5000}},
            {"name": "syntax", "wait": {"until": "$.steps.charge.output[0]"}},
            {"name": "unknown", "wait": {"until": "$.steps.nope.output.at"}},
            {"name": "on-timer", "wait": {"until": "$.steps.short.output.at"}},
            {"map": {"name": "lines", "items": "$.order.items", "max_concurrency": 2, "step": {"name": "line", "agent": "pay"}}},
            {"name": "on-item", "wait": {"until": "$.steps.line.output.at"}},
            {"name": "no-field", "wait": {"until": "$.order.ship_by"}},
            {"name": "nothing"}]}]}"#;
        let got = problems(text);
        let want = [
            r#"error: workflow w v1, step early, wait.until: names step "charge", which is not an earlier step of this workflow"#,
            "error: workflow w v1, step both, wait: set for_ms or until, not both",
            "error: workflow w v1, step neither, wait: needs for_ms (how long) or until (a path to a time)",
            "error: workflow w v1, step short, wait.for_ms: 999 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step long, wait.for_ms: 31622400001 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step agented, agent: a timer step calls no agent: remove agent or wait",
            "error: workflow w v1, step agented, compensation: a timer step has nothing to undo",
            "error: workflow w v1, step agented, effect: does not apply to a timer step: it changes nothing",
            "error: workflow w v1, step agented, timeout_ms: does not apply to a timer step: it calls nothing and cannot fail",
            "error: workflow w v1, step agented, max_failures: does not apply to a timer step: it calls nothing and cannot fail",
            r#"error: workflow w v1, step syntax, wait.until: "$.steps.charge.output[0]" is not a path: write $.order.<key>(.<key>)* or $.steps.<step name>.output.<key>(.<key>)*, each key 1 to 64 of A-Z a-z 0-9 - _"#,
            r#"error: workflow w v1, step unknown, wait.until: names step "nope", which is not an earlier step of this workflow"#,
            r#"error: workflow w v1, step on-timer, wait.until: names timer step "short", which has no output"#,
            r#"error: workflow w v1, step on-item, wait.until: names step "line", which runs once per item of map lines: it keeps no output of its own"#,
            r#"error: workflow w v1, step no-field, wait.until: the order has no field "ship_by"; it has: order_id, customer_id, items, workflow, workflow_version"#,
            "error: workflow w v1, step nothing, agent: a step needs an agent (or a wait, to be a timer step)",
        ];
        assert_eq!(got, want, "{got:#?}");
        // A wait with an unknown key is refused by the parser, located.
        let got = problems(
            r#"{"agents": {}, "workflows": [{"name": "w", "steps": [{"name": "t", "wait": {"for": 5}}]}]}"#,
        );
        assert!(got.len() == 1 && got[0].contains("unknown field `for`"), "{got:?}");
    }

    #[test]
    fn the_order_fields_a_path_may_name_are_the_orders() {
        let order = crate::domain::messages::Order {
            order_id: crate::domain::ids::OrderId::parse("o").unwrap(),
            customer_id: "c".into(),
            items: vec![],
            workflow: "w".into(),
            workflow_version: Some(1),
        };
        let value = serde_json::to_value(order).unwrap();
        let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = ORDER_FIELDS.to_vec();
        want.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, want);
    }
}
