//! `sasctl workflows`: the committed schema is the generated one, and `validate` exits
//! 0 for every example file, 1 with one line per problem for a bad one, 2 when unreadable.

use std::process::Command;

fn sasctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sasctl")).args(args).output().expect("sasctl runs")
}

fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_committed_schema_is_the_generated_one() {
    let committed =
        std::fs::read_to_string(repo("docs/workflows.schema.json")).expect("docs/workflows.schema.json");
    assert_eq!(
        committed.trim_end(),
        sasctl::workflows::schema(),
        "docs/workflows.schema.json is stale: run `sasctl workflows schema > docs/workflows.schema.json`"
    );
}

/// Every file of examples/ is one a user may copy: each validates with no warning, and
/// each kind of entry (a parallel stage, a map step) has one.
#[test]
fn every_example_validates_without_a_warning() {
    let mut names: Vec<String> = std::fs::read_dir(repo("examples"))
        .expect("examples/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    for name in ["map.json", "parallel.json", "workflows.json"] {
        assert!(names.iter().any(|n| n == name), "examples/{name} is missing from {names:?}");
    }
    for name in &names {
        let out = sasctl(&["workflows", "validate", &repo(&format!("examples/{name}"))]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "examples/{name}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("valid (0 warnings)"), "examples/{name}: {stdout}");
    }
    // The map example: a map over the order's lines, at most 5 at a time, released on failure.
    let text = std::fs::read_to_string(repo("examples/map.json")).unwrap();
    let definitions = sas::domain::Definitions::parse(&text).unwrap();
    let workflow = definitions.workflows.get("map-order").unwrap();
    let map = &workflow.maps[0];
    assert_eq!(
        (map.name.as_str(), map.items.as_str(), map.max_concurrency),
        ("reserve-lines", "$.order.items", 5)
    );
    assert_eq!(workflow.steps[map.at as usize].compensation.as_deref(), Some("release-line"));
}

#[test]
fn validate_exits_by_what_it_found() {
    let ok = sasctl(&["workflows", "validate", &repo("examples/workflows.json")]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("valid (0 warnings)"));

    let dir = std::env::temp_dir().join(format!("sasctl-workflows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "b"}, {"name": "s", "agent": "a"}]}]}"#,
    )
    .unwrap();
    let out = sasctl(&["workflows", "validate", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let errors: Vec<&str> = stdout.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(errors.len(), 2, "{stdout}");
    assert!(
        errors[0].ends_with(r#"workflow w v1, step s, agent: unknown agent "b"; the file defines: a"#),
        "{stdout}"
    );

    let json = sasctl(&["workflows", "validate", bad.to_str().unwrap(), "--json"]);
    assert_eq!(json.status.code(), Some(1));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.last().unwrap()["valid"], false);
    assert_eq!(lines.last().unwrap()["errors"], 2);

    let missing = sasctl(&["workflows", "validate", dir.join("none.json").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).starts_with("sasctl: cannot read "));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Shape errors in two workflows of the example: both reported, each naming its workflow
/// and step beside the line and column.
#[test]
fn validate_names_every_shape_error_with_its_workflow_and_step() {
    let example = std::fs::read_to_string(repo("examples/fulfil.json")).unwrap();
    let charge = r#"{"name": "charge", "agent": "payment", "compensation": "refund"}"#;
    let text = example.replacen(charge, &charge.replace("compensation", "compensate"), 1);
    let v2 = text.find(r#""version": 2"#).unwrap();
    let ship = r#"{"name": "ship", "agent": "inventory"}"#;
    let text = format!(
        "{}{}",
        &text[..v2],
        text[v2..].replacen(ship, &ship.replace('}', r#", "max_failures": "3"}"#), 1)
    );
    let dir = std::env::temp_dir().join(format!("sasctl-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two.json");
    std::fs::write(&file, text).unwrap();
    let out = sasctl(&["workflows", "validate", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let errors: Vec<&str> = stdout.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(errors.len(), 2, "{stdout}");
    assert!(
        errors[0].contains(
            ": error: workflow fulfil v1, step charge (line 24, column 59): unknown field `compensate`"
        ),
        "{stdout}"
    );
    assert!(errors[1].contains(": error: workflow fulfil v2, step ship (line 36, column 66): invalid type: string \"3\", expected u32"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
