//! The domain reads bottom-up: a file under `shared/src/domain/` imports only files of a
//! lower layer, so each can be read knowing only what is below it, and a new part (waits,
//! branches) goes in at the layer it needs without pulling a circle in behind it.
//!
//! [`DOMAIN`], [`TASK`] and [`DEFINITIONS`] state the layers; `domain/mod.rs`,
//! `domain/task/mod.rs` and `domain/definitions/mod.rs` write the same order as their
//! layout index, and [`the_layout_indexes_match_the_layers`] holds the two to each other.
//! The rules:
//!
//! - An import points strictly down. Files of one layer are peers and do not import each
//!   other either: two peers that need each other belong in different layers.
//! - A folder sits at its layer as a whole (`task/` above `messages.rs`), and its files
//!   are layered inside it. Its `mod.rs` is the index at the top of the folder, so
//!   `super::Name` in `task/claim.rs` (an item of `task/mod.rs`) points up, and so does
//!   `crate::domain::Name` anywhere: name the module the item comes from.
//! - Read: `use` lines and paths in code (`super::x`, `super::super::x`,
//!   `crate::domain::x`, a `mod.rs`'s `use child::...`), including those in string
//!   literals (serde's `default = "super::workflow::first_version"` is a call). Comments
//!   are not read: a doc link is not an import.
//! - Exempt: `#[cfg(test)] mod ... { }` blocks and whole files that a `mod.rs` declares
//!   under `#[cfg(test)]` (`task/fixtures.rs`, `task/invariants.rs`). Tests build their
//!   cases from above: `Workflow::three_step()` is the example file's, parsed by
//!   `definitions/`; the operator's tests run on the task's fixtures, which name an
//!   operator's `Actor`.
//! - Not seen: an inherent `impl` in a higher file needs no import
//!   (`definitions/checked.rs`'s `impl Workflows { fn builtin() }`), so a lower file
//!   calling such a function is not caught by this test; the compiler would accept it. The functions of that kind today
//!   (the built-in workflows) are called only from tests and from outside the domain.

use std::collections::BTreeMap;
use std::path::Path;

/// The domain's layers, lowest first: (file or folder, layer).
const DOMAIN: &[(&str, u32)] = &[
    ("ids.rs", 1),
    ("lifecycle.rs", 1),
    ("output.rs", 1),
    ("retry.rs", 1),
    ("breaker.rs", 1),
    ("secrets.rs", 1),
    ("reply_to.rs", 1),
    ("json_shape.rs", 1),
    ("timeline.rs", 2),
    ("wait.rs", 2),
    ("callback.rs", 2),
    ("gate.rs", 2),
    ("map.rs", 2),
    ("workflow.rs", 3),
    ("messages.rs", 4),
    ("task/", 5),
    ("definitions/", 6),
    ("mod.rs", 7),
];

/// `task/`'s layers, lowest first.
const TASK: &[(&str, u32)] = &[
    ("branches.rs", 1),
    ("outcome.rs", 2),
    ("phase.rs", 3),
    ("record.rs", 4),
    ("draft.rs", 5),
    ("stored.rs", 6),
    ("compensation.rs", 6),
    ("capacity.rs", 6),
    ("recovery.rs", 7),
    ("claim.rs", 8),
    ("reply.rs", 9),
    ("timer.rs", 9),
    ("callback.rs", 9),
    ("operator.rs", 9),
    ("decisions.rs", 10),
    ("scheduling.rs", 11),
    ("fixtures.rs", 12),
    ("invariants.rs", 12),
    ("map_decisions.rs", 12),
    ("mod.rs", 13),
];

/// `definitions/`'s layers, lowest first.
const DEFINITIONS: &[(&str, u32)] = &[
    ("limits.rs", 1),
    ("problem.rs", 1),
    ("urls.rs", 1),
    ("waiting_steps.rs", 1),
    ("file.rs", 2),
    ("check.rs", 3),
    ("previous.rs", 3),
    ("shape.rs", 3),
    ("checked.rs", 4),
    ("mod.rs", 5),
];

/// Each folder under the domain with its layers; "" is the domain itself.
const FOLDERS: &[(&str, &[(&str, u32)])] = &[("", DOMAIN), ("task/", TASK), ("definitions/", DEFINITIONS)];

/// A file's place: its folder's layer in the domain, then its layer in the folder
/// (0 for the domain's own files).
type Rank = (u32, u32);

/// `3` for a domain file, `5.2` for a file of layer 2 in the folder at layer 5.
fn show((outer, inner): Rank) -> String {
    if inner == 0 { outer.to_string() } else { format!("{outer}.{inner}") }
}

fn rank(file: &str) -> Option<Rank> {
    match file.split_once('/') {
        None => DOMAIN.iter().find(|(f, _)| *f == file).map(|&(_, r)| (r, 0)),
        Some((folder, rest)) => {
            let (_, layers) = FOLDERS.iter().find(|(f, _)| f.strip_suffix('/') == Some(folder))?;
            let outer = DOMAIN.iter().find(|(f, _)| f.strip_suffix('/') == Some(folder))?.1;
            layers.iter().find(|(f, _)| *f == rest).map(|&(_, r)| (outer, r))
        }
    }
}

/// The domain's source files, by path relative to `shared/src/domain/`.
fn read_domain() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/domain");
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel =
                    path.strip_prefix(&root).expect("under the root").to_string_lossy().replace('\\', "/");
                files.insert(rel, std::fs::read_to_string(&path).expect("readable source"));
            }
        }
    }
    files
}

/// The source with comments blanked, and separately with string and char literals blanked
/// too (same length, same lines, so offsets and line numbers still match the file).
fn blank_comments(src: &str) -> (Vec<u8>, Vec<u8>) {
    let b = src.as_bytes();
    let mut code = b.to_vec();
    let mut bare = b.to_vec();
    let blank = |v: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut v[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut code, i, end);
            blank(&mut bare, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut code, i, j);
            blank(&mut bare, i, j);
            i = j;
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && !ident_byte(b, i)
        {
            // A raw string: r"...", r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let start = i + 2 + hashes;
            let end = b[start..].windows(close.len()).position(|w| w == close).map_or(b.len(), |p| start + p);
            blank(&mut bare, start, end);
            i = end + close.len();
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut bare, i + 1, j.min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('"', '\'', '{'), or a lifetime ('a), which is left alone.
            let len = if b.get(i + 1) == Some(&b'\\') {
                b.get(i + 3..).and_then(|r| r.iter().position(|&c| c == b'\'')).map(|p| p + 4)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(len) => {
                    blank(&mut bare, i + 1, i + len - 1);
                    i += len;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    (code, bare)
}

fn ident_byte(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The end of the `{ ... }` block opening at or after `from`, braces counted on `bare`.
fn block_end(bare: &[u8], from: usize) -> usize {
    let open = from + bare[from..].iter().position(|&c| c == b'{').expect("a block");
    let mut depth = 0;
    for (i, &c) in bare.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    bare.len()
}

/// `#[cfg(test)]` (other attributes may follow) then `mod name` then `{` or `;`: the
/// position of the attribute, the name, and whether it is inline.
fn test_modules(bare: &[u8]) -> Vec<(usize, String, bool)> {
    let text = String::from_utf8_lossy(bare);
    let mut found = Vec::new();
    for (at, _) in text.match_indices("#[cfg(test)]") {
        let mut rest = text[at + "#[cfg(test)]".len()..].trim_start();
        while rest.starts_with("#[") {
            rest = rest[rest.find(']').map_or(rest.len(), |e| e + 1)..].trim_start();
        }
        if rest.starts_with("pub") {
            rest = rest.trim_start_matches("pub");
            if rest.starts_with('(') {
                rest = &rest[rest.find(')').map_or(rest.len(), |e| e + 1)..];
            }
            rest = rest.trim_start();
        }
        let Some(rest) = rest.strip_prefix("mod ") else { continue };
        let name: String = rest.trim_start().bytes().take_while(|&c| is_ident(c)).map(char::from).collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        found.push((at, name, after.starts_with('{')));
    }
    found
}

/// The module a file is, as segments under the domain: `task/claim.rs` is `[task, claim]`,
/// `task/mod.rs` is `[task]`, `mod.rs` is `[]`.
fn module_of(file: &str) -> Vec<String> {
    let mut segs: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    segs
}

/// The file that is module `segs`, if the domain has one.
fn file_of(segs: &[String], files: &BTreeMap<String, String>) -> Option<String> {
    if segs.is_empty() {
        return Some("mod.rs".to_owned());
    }
    let plain = format!("{}.rs", segs.join("/"));
    let folder = format!("{}/mod.rs", segs.join("/"));
    [plain, folder].into_iter().find(|f| files.contains_key(f))
}

/// The file a path's first segments name, from module `base`: the deepest module the
/// segments reach, or `base` itself when the first one is an item of it.
fn resolve(base: &[String], segs: &[&str], files: &BTreeMap<String, String>) -> Option<String> {
    let mut module = base.to_vec();
    for seg in segs {
        let mut deeper = module.clone();
        deeper.push((*seg).to_owned());
        if file_of(&deeper, files).is_none() {
            break;
        }
        module = deeper;
    }
    file_of(&module, files)
}

/// The leading `ident::ident::...` of `text`.
fn leading_path(text: &str) -> Vec<&str> {
    let mut segs = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let len = rest.bytes().take_while(|&c| is_ident(c)).count();
        if len == 0 {
            break;
        }
        segs.push(&rest[..len]);
        match rest[len..].trim_start().strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    segs
}

/// The entries of a `{ a, b::c, d::{e, f} }` group at the start of `text`.
fn group_entries(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 1);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                out.push(text[start..i].trim());
                start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    out
}

/// Every domain file `text` (one file's code, exempt parts blanked) points at, with the
/// line and the path as written.
fn imports(file: &str, text: &str, files: &BTreeMap<String, String>) -> Vec<(usize, String, String)> {
    let me = module_of(file);
    let b = text.as_bytes();
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_path = !ident_byte(b, i) && (i < 2 || &b[i - 2..i] != b"::");
        let (base, prefix_len) = if starts_path && b[i..].starts_with(b"crate::domain::") {
            (Vec::new(), "crate::domain::".len())
        } else if starts_path && b[i..].starts_with(b"super::") {
            let mut up = 0;
            let mut j = i;
            while b[j..].starts_with(b"super::") {
                up += 1;
                j += "super::".len();
            }
            // `super` from `task/claim.rs` is `task`; from `task/mod.rs` it is the domain.
            match me.len().checked_sub(up) {
                Some(keep) => (me[..keep].to_vec(), j - i),
                None => {
                    i = j;
                    continue;
                }
            }
        } else {
            i += 1;
            continue;
        };
        let rest = &text[i + prefix_len..];
        let written_end =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let written = text[i..i + prefix_len + written_end].to_owned();
        let targets: Vec<Option<String>> = if rest.starts_with('{') {
            group_entries(rest)
                .into_iter()
                .filter(|e| !e.is_empty())
                .map(|e| match leading_path(e).as_slice() {
                    ["self", ..] | [] => file_of(&base, files),
                    segs => resolve(&base, segs, files),
                })
                .collect()
        } else if rest.starts_with('*') {
            vec![file_of(&base, files)]
        } else {
            vec![resolve(&base, &leading_path(rest), files)]
        };
        for target in targets.into_iter().flatten() {
            found.push((line_of(i), written.clone(), target));
        }
        i += prefix_len;
    }
    // A folder's index names its children directly: `pub use record::{...}`.
    if file.ends_with("mod.rs") {
        for (at, _) in text.match_indices("use ") {
            if ident_byte(b, at) {
                continue;
            }
            let segs = leading_path(&text[at + 4..]);
            let Some(first) = segs.first() else { continue };
            let mut child = me.clone();
            child.push((*first).to_owned());
            if let Some(target) = file_of(&child, files) {
                found.push((line_of(at), segs.join("::"), target));
            }
        }
    }
    found
}

/// Every breach of the layers in `files` (path under `domain/` → source), as messages
/// naming the file, the line and the import.
fn check(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files.keys() {
        if rank(file).is_none() {
            problems.push(format!(
                "shared/src/domain/{file} has no layer: add it to DOMAIN, TASK or DEFINITIONS in shared/tests/domain_layers.rs, \
                 and to its folder's layout index (domain/mod.rs, domain/task/mod.rs or domain/definitions/mod.rs)"
            ));
        }
    }
    for (folder, layers) in FOLDERS {
        for (name, _) in *layers {
            let path = format!("{folder}{name}");
            let exists = if name.ends_with('/') {
                files.keys().any(|f| f.starts_with(&path))
            } else {
                files.contains_key(&path)
            };
            if !exists {
                problems.push(format!("the layers name shared/src/domain/{path}, which does not exist"));
            }
        }
    }
    // Files a folder's index declares under #[cfg(test)]: tests only, like a tests block.
    let mut test_only = Vec::new();
    for (file, src) in files.iter().filter(|(f, _)| f.ends_with("mod.rs")) {
        let (_, bare) = blank_comments(src);
        let dir = file.trim_end_matches("mod.rs");
        for (_, name, inline) in test_modules(&bare) {
            if !inline {
                test_only.push(format!("{dir}{name}.rs"));
            }
        }
    }
    for (file, src) in files {
        let Some(mine) = rank(file) else { continue };
        if test_only.contains(file) {
            continue;
        }
        let (mut code, mut bare) = blank_comments(src);
        for (at, _, inline) in test_modules(&bare).into_iter().rev() {
            if inline {
                let end = block_end(&bare, at);
                for v in [&mut code, &mut bare] {
                    for c in &mut v[at..end] {
                        if *c != b'\n' {
                            *c = b' ';
                        }
                    }
                }
            }
        }
        // `super` means the file's parent only outside inline modules: there must be none
        // left once the tests blocks are out.
        let bare_text = String::from_utf8_lossy(&bare).into_owned();
        for (at, _) in bare_text.match_indices("mod ") {
            let after = bare_text[at + 4..].trim_start();
            let name_len = after.bytes().take_while(|&c| is_ident(c)).count();
            if !ident_byte(bare_text.as_bytes(), at) && after[name_len..].trim_start().starts_with('{') {
                let line = bare_text[..at].matches('\n').count() + 1;
                problems.push(format!(
                    "shared/src/domain/{file}:{line}: an inline module outside the tests: move it to a file \
                     of its own, so `super::` keeps meaning this file's folder"
                ));
            }
        }
        let code_text = String::from_utf8_lossy(&code).into_owned();
        let mut seen = Vec::new();
        for (line, written, target) in imports(file, &code_text, files) {
            if target == *file || seen.contains(&(written.clone(), target.clone())) {
                continue;
            }
            seen.push((written.clone(), target.clone()));
            let Some(theirs) = rank(&target) else { continue };
            if theirs >= mine {
                let how = if theirs == mine { "a peer in the same layer" } else { "a higher layer" };
                problems.push(format!(
                    "shared/src/domain/{file}:{line} (layer {}) imports `{written}`, which is {target}, \
                     {how} ({}): a domain file imports only files below it",
                    show(mine),
                    show(theirs)
                ));
            }
        }
    }
    problems
}

/// The files a `mod.rs` lists as its layout index, with their layer: `//! N. \`name\``
/// starts layer N, and `//!    - \`name\`` adds a file to the layer above it.
fn layout_index(src: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut layer = None;
    for line in src.lines().filter_map(|l| l.strip_prefix("//!")) {
        let trimmed = line.trim_start();
        let digits: String = trimmed.chars().take_while(char::is_ascii_digit).collect();
        let item = if !digits.is_empty() && trimmed[digits.len()..].starts_with(". ") {
            layer = digits.parse().ok();
            &trimmed[digits.len() + 2..]
        } else if let Some(rest) = trimmed.strip_prefix("- ") {
            rest
        } else {
            continue;
        };
        let name = item.strip_prefix('`').and_then(|r| r.split_once('`')).map(|(n, _)| n);
        if let (Some(name), Some(layer)) = (name, layer)
            && (name.ends_with(".rs") || name.ends_with('/'))
        {
            out.push((name.to_owned(), layer));
        }
    }
    out
}

#[test]
fn every_domain_file_imports_only_files_below_it() {
    let files = read_domain();
    assert!(files.len() > 10, "the domain's files were not found: {:?}", files.keys());
    let problems = check(&files);
    assert!(problems.is_empty(), "the domain's layers are broken:\n{}", problems.join("\n"));
}

#[test]
fn the_layout_indexes_match_the_layers() {
    let files = read_domain();
    for (folder, layers) in FOLDERS {
        let index = format!("{folder}mod.rs");
        let listed = layout_index(&files[&index]);
        let want: Vec<(String, u32)> = layers.iter().map(|&(f, r)| (f.to_owned(), r)).collect();
        assert_eq!(
            listed, want,
            "shared/src/domain/{index}'s layout index and the layers in shared/tests/domain_layers.rs differ"
        );
    }
}

/// The check itself, on made-up sources: it must fail on what it is there to catch.
#[test]
fn the_check_names_an_upward_import_a_peer_import_and_a_file_with_no_layer() {
    let mut files = read_domain();
    let clean = check(&files);
    assert!(clean.is_empty(), "{clean:?}");

    let plant = |files: &mut BTreeMap<String, String>, file: &str, line: &str| {
        let src = files.get_mut(file).expect("a domain file");
        src.insert_str(0, &format!("{line}\n"));
    };
    let cases: &[(&str, &str, &str)] = &[
        (
            "workflow.rs",
            "use super::definitions::Definitions;",
            "workflow.rs:1 (layer 3) imports `super::definitions::Definitions`, which is definitions/mod.rs, a higher layer (6.5)",
        ),
        (
            "messages.rs",
            "use super::{ids::OrderId, task::TaskRecord};",
            "which is task/mod.rs, a higher layer",
        ),
        (
            "ids.rs",
            "fn f() -> crate::domain::Workflow { todo!() }",
            "imports `crate::domain::Workflow`, which is mod.rs",
        ),
        (
            "task/capacity.rs",
            "use super::compensation::X;",
            "which is task/compensation.rs, a peer in the same layer",
        ),
        ("task/record.rs", "use super::Refusal;", "which is task/mod.rs, a higher layer"),
        (
            "task/record.rs",
            "use super::super::definitions::Definitions;",
            "which is definitions/mod.rs, a higher layer",
        ),
        ("retry.rs", "use super::*;", "which is mod.rs"),
        ("timeline.rs", "#[serde(default = \"super::messages::x\")] struct S;", "which is messages.rs"),
    ];
    for (file, line, want) in cases {
        let mut planted = files.clone();
        plant(&mut planted, file, line);
        let got = check(&planted);
        assert!(got.iter().any(|p| p.contains(want)), "{line:?} in {file}: want {want:?}, got {got:#?}");
    }

    // Comments and tests blocks are not imports.
    for line in [
        "/// [`super::definitions::MAX_STEPS`]",
        "#[cfg(test)]\nmod tests { use super::*; use crate::domain::definitions::Definitions; }",
        "const S: &str = \"https://example.com\"; // super::definitions::X",
    ] {
        let mut planted = files.clone();
        plant(&mut planted, "workflow.rs", line);
        assert_eq!(check(&planted), Vec::<String>::new(), "{line:?}");
    }

    files.insert("waits.rs".to_owned(), String::new());
    let got = check(&files);
    assert!(got.iter().any(|p| p.contains("domain/waits.rs has no layer")), "{got:?}");
}
