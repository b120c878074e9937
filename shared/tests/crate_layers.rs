//! The library's layers (docs/ARCHITECTURE.md, "The crate's layers"), lowest first:
//! domain, ports, config, adapters, handlers, lambda; `mutations` beside them all. A
//! module's code (its `#[cfg(test)]` module aside) names only modules of its own layer or
//! lower ones, so that, say, the configuration never reaches up into the handlers.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 6] = ["domain", "ports", "config", "adapters", "handlers", "lambda"];

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

/// The layers `code` names through `crate::`, each with its line.
fn named(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for part in line.split("crate::").skip(1) {
            let module: String =
                part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push((module, i + 1));
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
    // Comments and the test module do not count.
    let text = "// crate::lambda\nuse crate::ports::QueueUrl;\n#[cfg(test)]\nmod tests {\n    use crate::handlers::Settings;\n}\n";
    assert!(upward(src, &config, text).is_empty());
}
