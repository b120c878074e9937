//! Publishing a file in place of the one published last: what it would break (a
//! published version changed, versions not increasing, a version removed).

use std::collections::BTreeMap;

use super::file::DefinitionFile;
use super::problem::{Problem, Severity};

impl DefinitionFile {
    /// What publishing this file in place of `previous` (the file published last) would
    /// break: a version published before must never change (tasks are pinned to it), new
    /// versions come after the last published one, and a version removed stops the tasks
    /// still pinned to it (a warning: removing one nobody runs any more is how old
    /// versions go).
    pub fn against_previous(&self, previous: &DefinitionFile) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut last: BTreeMap<&str, u32> = BTreeMap::new();
        for old in &previous.workflows {
            let at = format!("workflow {} v{}", old.name, old.version);
            let entry = last.entry(old.name.as_str()).or_default();
            *entry = (*entry).max(old.version);
            match self.workflows.iter().find(|w| w.name == old.name && w.version == old.version) {
                None => out.push(Problem {
                    severity: Severity::Warning,
                    at,
                    message: "published before and removed: tasks still pinned to it stop (their messages are kept in the DLQ)".into(),
                }),
                Some(new) if new != old => out.push(Problem {
                    severity: Severity::Error,
                    at: format!("{at}, steps"),
                    message: format!(
                        "changed since it was published: tasks are pinned to it; publish the change as v{}",
                        previous.workflows.iter().filter(|w| w.name == old.name).map(|w| w.version).max().unwrap_or(0)
                            + 1
                    ),
                }),
                Some(_) => {}
            }
        }
        for new in &self.workflows {
            let published = previous.workflows.iter().any(|w| w.name == new.name && w.version == new.version);
            if let Some(&before) = last.get(new.name.as_str())
                && !published
                && new.version <= before
            {
                out.push(Problem {
                    severity: Severity::Error,
                    at: format!("workflow {} v{}, version", new.name, new.version),
                    message: format!("not increasing: v{before} was published before"),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_keeps_what_was_published_and_adds_only_newer_versions() {
        let previous = DefinitionFile::parse(
            r#"{"agents": {"a": {}}, "workflows": [
                {"name": "w", "version": 1, "steps": [{"name": "s", "agent": "a"}]},
                {"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "a"}]},
                {"name": "old", "steps": [{"name": "s", "agent": "a"}]}]}"#,
        )
        .unwrap();
        let next = DefinitionFile::parse(
            r#"{"agents": {"a": {}}, "workflows": [
                {"name": "w", "version": 1, "steps": [{"name": "s", "agent": "a"}]},
                {"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "u", "agent": "a"}]},
                {"name": "new", "version": 7, "steps": [{"name": "s", "agent": "a"}]}]}"#,
        )
        .unwrap();
        let got: Vec<String> = next.against_previous(&previous).iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "error: workflow w v2, steps: changed since it was published: tasks are pinned to it; publish the change as v3",
                "warning: workflow old v1: published before and removed: tasks still pinned to it stop (their messages are kept in the DLQ)",
            ]
        );
        let backwards = DefinitionFile::parse(
            r#"{"agents": {"a": {}}, "workflows": [
                {"name": "w", "version": 1, "steps": [{"name": "s", "agent": "a"}]},
                {"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "a"}]}]}"#,
        )
        .unwrap();
        let older_only = DefinitionFile::parse(
            r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "a"}]}]}"#,
        )
        .unwrap();
        assert!(backwards.against_previous(&backwards).is_empty(), "the same file again is fine");
        let re_added = DefinitionFile::parse(
            r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "version": 1, "steps": [{"name": "x", "agent": "a"}]},
                {"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "a"}]}]}"#,
        )
        .unwrap();
        let got: Vec<String> =
            re_added.against_previous(&older_only).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["error: workflow w v1, version: not increasing: v2 was published before"]);
    }
}
