//! Every shape error of a definition file that can be found (a missing or unknown field,
//! a value of the wrong type), each naming its agent, or its workflow and step, beside the
//! line and column: what `sasctl workflows validate` lists. Each agent, workflow, parallel
//! stage, map step and step is read on its own, so one's error does not hide another's.
//!
//! The file is valid JSON by then: a small scanner (`object`, `array`) finds each part's
//! bytes, and each part is read from its own slice, the arrays and objects read on their
//! own blanked out (spaces, newlines kept), so positions stay the file's.

use std::ops::Range;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::file::{AgentDef, DefinitionFile};
use super::problem::{Problem, Severity};
use crate::domain::workflow::{StageText, Step, WorkflowText};

fn problems(text: &str) -> Vec<Problem> {
    let mut out = Vec::new();
    let Some(root) = object(text, value_at(text, 0)) else { return out };
    let field = |fields: &[(String, Range<usize>)], name: &str| {
        fields.iter().find(|(k, _)| k == name).map(|(_, r)| r.clone())
    };
    let agents = field(&root.1, "agents");
    let workflows = field(&root.1, "workflows");
    let blanked = blank(text, root.0.clone(), [agents.clone(), workflows.clone()]);
    read::<DefinitionFile>(text, &blanked, root.0.start, &mut out, &|at| at);
    if let Some((_, list)) = agents.and_then(|r| object(text, r)) {
        for (name, r) in list {
            read::<AgentDef>(text, &text[r.clone()], r.start, &mut out, &|at| format!("agent {name} ({at})"));
        }
    }
    let Some(list) = workflows.and_then(|r| array(text, r)) else { return out };
    for (i, r) in list.into_iter().enumerate() {
        let Some((whole, fields)) = object(text, r.clone()) else {
            let at = |at: String| format!("workflow #{} ({at})", i + 1);
            read::<WorkflowText>(text, &text[r.clone()], r.start, &mut out, &at);
            continue;
        };
        // As the file's other problems name it: with its version (1 unless given).
        let version = match field(&fields, "version") {
            Some(v) => serde_json::from_str::<u32>(&text[v]).map(|v| format!(" v{v}")).unwrap_or_default(),
            None => " v1".to_owned(),
        };
        let wf = match name_of(text, &fields) {
            Some(name) => format!("{name}{version}"),
            None => format!("#{}", i + 1),
        };
        let steps = field(&fields, "steps");
        let blanked = blank(text, whole.clone(), [steps.clone(), None]);
        read::<WorkflowText>(text, &blanked, whole.start, &mut out, &|at| format!("workflow {wf} ({at})"));
        for (j, r) in steps.and_then(|r| array(text, r)).unwrap_or_default().into_iter().enumerate() {
            let entry = object(text, r.clone());
            let parallel = entry.as_ref().and_then(|(_, f)| field(f, "parallel"));
            if let Some(map) = entry.as_ref().and_then(|(_, f)| field(f, "map")).and_then(|m| object(text, m))
            {
                map_problems(text, &wf, r.clone(), &map.1, j, &mut out);
                continue;
            }
            let name =
                entry.as_ref().and_then(|(_, f)| name_of(text, f)).unwrap_or_else(|| format!("steps[{j}]"));
            let Some(stage) = parallel.and_then(|p| object(text, p)) else {
                let at = |at: String| format!("workflow {wf}, step {name} ({at})");
                read::<Step>(text, &text[r.clone()], r.start, &mut out, &at);
                continue;
            };
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            #[allow(dead_code)]
            struct Parallel {
                parallel: StageText,
            }
            let branches = field(&stage.1, "steps");
            let stage_name = name_of(text, &stage.1).unwrap_or_else(|| format!("steps[{j}]"));
            let blanked = blank(text, r.clone(), [branches.clone(), None]);
            let at = |at: String| format!("workflow {wf}, stage {stage_name} ({at})");
            read::<Parallel>(text, &blanked, r.start, &mut out, &at);
            for (k, b) in branches.and_then(|b| array(text, b)).unwrap_or_default().into_iter().enumerate() {
                let step = object(text, b.clone())
                    .and_then(|(_, f)| name_of(text, &f))
                    .unwrap_or_else(|| format!("steps[{k}]"));
                let at = |at: String| format!("workflow {wf}, stage {stage_name}, step {step} ({at})");
                read::<Step>(text, &text[b.clone()], b.start, &mut out, &at);
            }
        }
    }
    out
}

/// A map entry as `MapText` reads it, its step unread: the step is read on its own. A test
/// holds it to read every map `MapText` reads.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct MapShape {
    name: String,
    items: String,
    max_concurrency: u32,
    #[serde(default)]
    tolerated_failures: u32,
    step: serde::de::IgnoredAny,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Map {
    map: MapShape,
}

/// The shape errors of the map entry at `entry` (the `j`th of workflow `wf`, its map's
/// fields `fields`): the map's own, named with the map, then its step's, named with both.
fn map_problems(
    text: &str,
    wf: &str,
    entry: Range<usize>,
    fields: &[(String, Range<usize>)],
    j: usize,
    out: &mut Vec<Problem>,
) {
    let map = name_of(text, fields).unwrap_or_else(|| format!("steps[{j}]"));
    read::<Map>(text, &text[entry.clone()], entry.start, out, &|at| {
        format!("workflow {wf}, map {map} ({at})")
    });
    let Some(step) = fields.iter().find(|(k, _)| k == "step").map(|(_, r)| r.clone()) else { return };
    let name =
        object(text, step.clone()).and_then(|(_, f)| name_of(text, &f)).unwrap_or_else(|| "step".into());
    let at = |at: String| format!("workflow {wf}, map {map}, step {name} ({at})");
    read::<Step>(text, &text[step.clone()], step.start, out, &at);
}

/// Reads `part` (starting at byte `start` of `text`) as a `T`, and on failure adds its
/// error, located in `text` and named by `at`.
fn read<T: DeserializeOwned>(
    text: &str,
    part: &str,
    start: usize,
    out: &mut Vec<Problem>,
    at: &dyn Fn(String) -> String,
) {
    if part.is_empty() {
        return;
    }
    let Err(e) = serde_json::from_str::<T>(part) else { return };
    let before = &text[..start];
    let line0 = before.matches('\n').count();
    let col0 = start - before.rfind('\n').map_or(0, |n| n + 1);
    let (line, column) =
        if e.line() <= 1 { (line0 + 1, col0 + e.column()) } else { (line0 + e.line(), e.column()) };
    let message = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = message.strip_suffix(&suffix).unwrap_or(&message).to_owned();
    out.push(Problem {
        severity: Severity::Error,
        at: at(format!("line {line}, column {column}")),
        message: crate::domain::messages::cut_reason(message),
    });
}

/// `whole` of `text` with the interiors of the `inner` spans blanked (every byte but
/// a newline a space), so the part reads as if they were empty.
fn blank<const N: usize>(text: &str, whole: Range<usize>, inner: [Option<Range<usize>>; N]) -> String {
    let mut bytes = text.as_bytes()[whole.clone()].to_vec();
    for r in inner.into_iter().flatten() {
        let opens = matches!(text.as_bytes()[r.start], b'[' | b'{');
        if !opens || r.end - r.start < 2 {
            continue;
        }
        for b in &mut bytes[r.start + 1 - whole.start..r.end - 1 - whole.start] {
            if *b != b'\n' && *b != b'\r' {
                *b = b' ';
            }
        }
    }
    String::from_utf8(bytes).unwrap_or_default()
}

fn name_of(text: &str, fields: &[(String, Range<usize>)]) -> Option<String> {
    let r = fields.iter().find(|(k, _)| k == "name")?.1.clone();
    serde_json::from_str::<String>(&text[r]).ok()
}

/// The span of the value starting at or after byte `i` (after any whitespace).
fn value_at(text: &str, i: usize) -> Range<usize> {
    let b = text.as_bytes();
    let start = skip_ws(b, i);
    start..end_of(b, start)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Where the (valid) JSON value at `i` ends.
fn end_of(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'"') => {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        }
        Some(b'{' | b'[') => {
            let mut j = skip_ws(b, i + 1);
            while j < b.len() && !matches!(b[j], b'}' | b']') {
                j = skip_ws(b, end_of(b, j));
                if b.get(j) == Some(&b':') {
                    j = skip_ws(b, end_of(b, skip_ws(b, j + 1)));
                }
                if b.get(j) == Some(&b',') {
                    j = skip_ws(b, j + 1);
                }
            }
            j + 1
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace() {
                j += 1;
            }
            j
        }
    }
}

/// An object's fields, each key with its value's span.
type Fields = Vec<(String, Range<usize>)>;

/// An object's span and its fields.
fn object(text: &str, r: Range<usize>) -> Option<(Range<usize>, Fields)> {
    let b = text.as_bytes();
    if b.get(r.start) != Some(&b'{') {
        return None;
    }
    let mut fields = Vec::new();
    let mut j = skip_ws(b, r.start + 1);
    while j < r.end && b[j] == b'"' {
        let key_end = end_of(b, j);
        let key = serde_json::from_str::<String>(&text[j..key_end]).ok()?;
        let colon = skip_ws(b, key_end);
        let value = value_at(text, colon + 1);
        j = skip_ws(b, value.end);
        fields.push((key, value));
        if b.get(j) == Some(&b',') {
            j = skip_ws(b, j + 1);
        }
    }
    Some((r, fields))
}

/// An array's elements' spans.
fn array(text: &str, r: Range<usize>) -> Option<Vec<Range<usize>>> {
    let b = text.as_bytes();
    if b.get(r.start) != Some(&b'[') {
        return None;
    }
    let mut items = Vec::new();
    let mut j = skip_ws(b, r.start + 1);
    while j < r.end - 1 {
        let item = value_at(text, j);
        j = skip_ws(b, item.end);
        items.push(item);
        if b.get(j) == Some(&b',') {
            j = skip_ws(b, j + 1);
        }
    }
    Some(items)
}

impl DefinitionFile {
    /// The JSON as typed, or every place it does not fit that can be found: each agent,
    /// workflow, parallel stage, map step and step is read on its own, so one's error does
    /// not hide another's, and each problem names its agent, or its workflow and step,
    /// beside the line and column (`sasctl workflows validate`). A file that is not JSON at
    /// all is one problem, as in [`DefinitionFile::parse`].
    pub fn parse_all(text: &str) -> Result<DefinitionFile, Vec<Problem>> {
        let first = match DefinitionFile::parse(text) {
            Ok(file) => return Ok(file),
            Err(first) => first,
        };
        if serde_json::from_str::<serde::de::IgnoredAny>(text).is_err() {
            return Err(vec![first]);
        }
        let found = problems(text);
        Err(if found.is_empty() { vec![first] } else { found })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> Vec<String> {
        DefinitionFile::parse_all(text).unwrap_err().iter().map(ToString::to_string).collect()
    }

    /// Shape errors in two workflows are both reported, each with its workflow and step
    /// beside the line and column; so are an agent's and a workflow's own.
    #[test]
    fn every_shape_error_names_its_workflow_and_step() {
        let text = r#"{
  "agents": {"a": {"url": "https://a.example", "timeout": 5}},
  "workflows": [
    {"name": "one", "steps": [
      {"name": "s1", "agent": "a", "compensate": "x"},
      {"name": "s2", "agent": "a"}]},
    {"name": "two", "retries": 3, "steps": [
      {"name": "t1", "agent": "a", "timeout_ms": "soon"},
      {"parallel": {"name": "both", "steps": [
        {"name": "b1", "agent": "a"}, {"name": "b2", "agent": "a", "max_failures": -1}]}}]}
  ]
}"#;
        assert_eq!(
            all(text),
            [
                "error: agent a (line 2, column 56): unknown field `timeout`, expected one of `kind`, `queue_url`, `url`, `timeout_ms`, `retry`, `breaker`, `auth`, `max_in_flight`, `max_per_second`, `max_in_flight_per_key`",
                "error: workflow one v1, step s1 (line 5, column 47): unknown field `compensate`, expected one of `name`, `agent`, `wait`, `callback`, `compensation`, `effect`, `max_failures`, `timeout_ms`, `max_throttled_ms`",
                "error: workflow two v1 (line 7, column 29): unknown field `retries`, expected one of `name`, `version`, `on_give_up`, `steps`",
                r#"error: workflow two v1, step t1 (line 8, column 55): invalid type: string "soon", expected u64"#,
                "error: workflow two v1, stage both, step b2 (line 10, column 85): invalid value: integer `-1`, expected u32",
            ]
        );
    }

    /// A map entry is read as a map, not as a step: its own shape errors are named with
    /// the map, its step's with both, and a well-shaped one beside another's error is none.
    #[test]
    fn a_maps_shape_errors_name_the_map_and_its_step() {
        let text = r#"{
  "agents": {"a": {"timeout": 5}},
  "workflows": [
    {"name": "w", "steps": [
      {"map": {"name": "good", "items": "$.order.items", "max_concurrency": 2, "step": {"name": "g", "agent": "a"}}}]},
    {"name": "x", "steps": [
      {"map": {"name": "lines", "items": "$.order.items", "max_concurency": 2,
               "step": {"name": "reserve", "agent": "a", "compensate": "release"}}},
      {"map": {"name": "many", "items": "$.order.items", "max_concurrency": "5", "step": 3}}]}
  ]
}"#;
        assert_eq!(
            all(text),
            [
                "error: agent a (line 2, column 28): unknown field `timeout`, expected one of `kind`, `queue_url`, `url`, `timeout_ms`, `retry`, `breaker`, `auth`, `max_in_flight`, `max_per_second`, `max_in_flight_per_key`",
                "error: workflow x v1, map lines (line 7, column 74): unknown field `max_concurency`, expected one of `name`, `items`, `max_concurrency`, `tolerated_failures`, `step`",
                "error: workflow x v1, map lines, step reserve (line 8, column 69): unknown field `compensate`, expected one of `name`, `agent`, `wait`, `callback`, `compensation`, `effect`, `max_failures`, `timeout_ms`, `max_throttled_ms`",
                r#"error: workflow x v1, map many (line 9, column 79): invalid type: string "5", expected u32"#,
                "error: workflow x v1, map many, step step (line 9, column 90): invalid type: integer `3`, expected struct Step",
            ]
        );
        // Every map `MapText` reads, with or without its defaults, reads here too.
        for tolerated in [0, 3] {
            let map = crate::domain::workflow::MapText {
                name: "m".into(),
                items: "$.order.items".into(),
                max_concurrency: 2,
                tolerated_failures: tolerated,
                step: Step::pivot("s", "a"),
            };
            let value = serde_json::json!({"map": map});
            assert!(serde_json::from_value::<Map>(value).is_ok(), "{tolerated}");
        }
    }

    #[test]
    fn a_file_that_is_not_json_or_is_well_shaped_is_as_parse_says() {
        assert_eq!(all(r#"{"agents": {"#), ["error: line 1, column 12: EOF while parsing an object"]);
        assert_eq!(
            all(r#"{"workflows": 3}"#),
            ["error: line 1, column 15: invalid type: integer `3`, expected a sequence"]
        );
        let ok =
            r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a"}]}]}"#;
        assert!(DefinitionFile::parse_all(ok).is_ok());
    }
}
