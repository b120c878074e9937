//! The library's layers (docs/ARCHITECTURE.md, "The crate's layers"), lowest first:
//! domain, ports, adapters, config, handlers, lambda; `mutations` beside them all. A
//! module's code (its `#[cfg(test)]` module aside) names only modules of its own layer or
//! lower ones, so that, say, the configuration never reaches up into the handlers, and the
//! adapters name neither the configuration nor the handlers (re-exports included): what an
//! adapter is built with (`TableNames`, `Deployment`) is the ports'.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 6] = ["domain", "ports", "adapters", "config", "handlers", "lambda"];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == module)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// The code before the file's test module, without comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The layers `code` names through `crate::`, each with its line; in a group
/// (`crate::{config::TableNames, ports}`) each of the group's first segments.
fn named(code: &str) -> Vec<(String, usize)> {
    let ident =
        |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for part in line.split("crate::").skip(1) {
            match part.strip_prefix('{') {
                // A group's entries at its top level; a group over lines counts its first.
                Some(group) => {
                    let mut depth = 0;
                    let mut start = true;
                    for (at, c) in group.char_indices() {
                        if start && depth == 0 {
                            let module = ident(group[at..].trim_start());
                            if !module.is_empty() {
                                out.push((module, i + 1));
                            }
                            start = false;
                        }
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => start = true,
                            _ => {}
                        }
                    }
                }
                None => out.push((ident(part), i + 1)),
            }
        }
    }
    out
}

fn upward(src: &Path, file: &Path, text: &str) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src");
    let top = relative.components().next().and_then(|c| c.as_os_str().to_str()).unwrap_or("");
    let Some(own) = rank(top.trim_end_matches(".rs")) else { return Vec::new() };
    named(&code(text))
        .into_iter()
        .filter(|(module, _)| rank(module).is_some_and(|r| r > own))
        .map(|(module, line)| format!("{}:{line} names crate::{module}", relative.display()))
        .collect()
}

#[test]
fn no_layer_names_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for file in files(&src) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        found.extend(upward(&src, &file, &text));
    }
    assert!(found.is_empty(), "imports that run up the layers {LAYERS:?}:\n  {}", found.join("\n  "));
}

#[test]
fn an_upward_import_is_found() {
    let src = Path::new("src");
    let config = src.join("config/env.rs");
    assert_eq!(
        upward(src, &config, "use crate::domain::Policy;\nuse crate::handlers::Settings;\n"),
        ["config/env.rs:2 names crate::handlers"]
    );
    // The adapters sit below the configuration: naming it, or re-exporting from it, is
    // upward too; so is a group that holds it.
    let dynamodb = src.join("adapters/aws/dynamodb.rs");
    assert_eq!(
        upward(src, &dynamodb, "use crate::ports::StateStore;\npub use crate::config::TableNames;\n"),
        ["adapters/aws/dynamodb.rs:2 names crate::config"]
    );
    assert_eq!(
        upward(src, &dynamodb, "use crate::{domain::OrderId, handlers::batch, ports::{Alerts, Queues}};\n"),
        ["adapters/aws/dynamodb.rs:1 names crate::handlers"]
    );
    // Comments and the test module do not count.
    let text = "// crate::lambda\nuse crate::ports::QueueUrl;\n#[cfg(test)]\nmod tests {\n    use crate::handlers::Settings;\n}\n";
    assert!(upward(src, &config, text).is_empty());
}
