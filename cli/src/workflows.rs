//! `sasctl workflows`: check a definition file, print its JSON Schema.

use std::path::Path;
use std::process::ExitCode;

use sas::domain::definitions::{DefinitionFile, Problem, Severity};

/// Prints every problem of `file`, one line each (or one JSON object each); exit 0 when
/// it has no error, 1 when it has, and an `Err` (exit 2) when it cannot be read.
pub fn validate(file: &Path, json: bool) -> Result<ExitCode, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let problems = match DefinitionFile::parse(&text) {
        Ok(parsed) => parsed.check(),
        Err(problem) => vec![problem],
    };
    let errors = problems.iter().filter(|p| p.severity == Severity::Error).count();
    let warnings = problems.len() - errors;
    for p in &problems {
        if json {
            println!("{}", problem_json(file, p));
        } else {
            println!("{}: {p}", file.display());
        }
    }
    if json {
        let summary = serde_json::json!({"file": file.display().to_string(), "valid": errors == 0, "errors": errors, "warnings": warnings});
        println!("{summary}");
    } else if errors == 0 {
        println!("{}: valid ({warnings} warning{})", file.display(), if warnings == 1 { "" } else { "s" });
    } else {
        eprintln!("{}: {errors} error{}: not valid", file.display(), if errors == 1 { "" } else { "s" });
    }
    Ok(if errors == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn problem_json(file: &Path, p: &Problem) -> serde_json::Value {
    let severity = match p.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    serde_json::json!({"file": file.display().to_string(), "severity": severity, "at": p.at, "message": p.message})
}

/// The definition file's JSON Schema, pretty-printed.
pub fn schema() -> String {
    let schema = schemars::schema_for!(DefinitionFile);
    serde_json::to_string_pretty(&schema).expect("a schema always serializes")
}
