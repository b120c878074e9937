//! docs/ARCHITECTURE.md's code map names every module of `shared/src`, `cli/src` and
//! `sim/src`, in the section of its crate: a module added without a line there fails here.
//!
//! A file counts as named when its crate's section has it in backticks, alone or at the end
//! of a path (`claim.rs`, `task/claim.rs`); a folder's `mod.rs` when the folder is
//! (`task/`). Crate roots (`lib.rs`, `main.rs`) need no line.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_owned()
}

/// Every `.rs` file under `dir`, as paths relative to it.
fn modules(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path.strip_prefix(dir).expect("under dir").to_owned());
            }
        }
    }
    found.sort();
    found
}

/// The part of the code map about one crate: from its `### `heading to the next.
fn section<'a>(map: &'a str, heading: &str) -> &'a str {
    let start = map.find(heading).unwrap_or_else(|| panic!("ARCHITECTURE.md has no {heading:?} section"));
    let rest = &map[start + heading.len()..];
    &rest[..rest.find("\n### ").unwrap_or(rest.len())]
}

/// The code-like words of a text: what stands between backticks.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn unnamed(section: &str, files: &[PathBuf]) -> Vec<String> {
    let words = quoted(section);
    files
        .iter()
        .filter_map(|file| {
            let name = file.file_name()?.to_str()?;
            if matches!(name, "lib.rs" | "main.rs") && file.parent() == Some(Path::new("")) {
                return None;
            }
            let wanted = if name == "mod.rs" {
                format!("{}/", file.parent()?.file_name()?.to_str()?)
            } else {
                name.to_owned()
            };
            let named = words.iter().any(|w| *w == wanted || w.ends_with(&format!("/{wanted}")));
            (!named).then(|| file.display().to_string())
        })
        .collect()
}

#[test]
fn the_code_map_names_every_module() {
    let root = root();
    let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let mut missing = Vec::new();
    for (krate, heading) in [("shared", "### `shared/`"), ("cli", "### `cli/`"), ("sim", "### `sim/`")] {
        let files = modules(&root.join(krate).join("src"));
        assert!(!files.is_empty(), "{krate}/src has no modules");
        for file in unnamed(section(&map, heading), &files) {
            missing.push(format!("{krate}/src/{file}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md's code map does not name these modules (add a line to its crate's section):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn a_module_left_out_is_found() {
    let files =
        [PathBuf::from("lib.rs"), PathBuf::from("a.rs"), PathBuf::from("b/mod.rs"), PathBuf::from("b/c.rs")];
    assert_eq!(unnamed("`a.rs`, `b/` and `b/c.rs`", &files), Vec::<String>::new());
    assert_eq!(unnamed("`a.rs` and `b/`; c.rs unquoted", &files), ["b/c.rs"]);
    assert_eq!(unnamed("`c.rs`", &files), ["a.rs", "b/mod.rs"]);
}
