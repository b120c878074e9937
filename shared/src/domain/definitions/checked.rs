//! A checked file, ready to run (`Definitions`): parsed and checked, every error at once;
//! and the example file compiled in, whose workflows are the built-in ones.

use std::collections::BTreeMap;

use super::file::{AgentDef, DefinitionFile};
use super::problem::{Invalid, Problem, Severity};
use crate::domain::workflow::{Workflow, Workflows};

/// A checked file, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definitions {
    pub agents: BTreeMap<String, AgentDef>,
    pub workflows: Workflows,
    /// What `check` warned about: the file runs, but probably not as meant.
    pub warnings: Vec<Problem>,
}

impl Definitions {
    /// Parses and checks a file; every error is returned at once.
    pub fn parse(text: &str) -> Result<Definitions, Invalid> {
        let file = DefinitionFile::parse(text).map_err(|p| Invalid(vec![p]))?;
        let problems = file.check();
        let (errors, warnings): (Vec<Problem>, Vec<Problem>) =
            problems.into_iter().partition(|p| p.severity == Severity::Error);
        if !errors.is_empty() {
            return Err(Invalid(errors));
        }
        let mut workflows = file.workflows;
        for wf in &mut workflows {
            wf.gate_maps(|agent| file.agents.get(agent).is_some_and(|a| a.limits().any()));
        }
        Ok(Definitions { agents: file.agents, workflows: Workflows::new(workflows), warnings })
    }

    /// `examples/workflows.json`: the built-in workflows.
    pub fn example() -> Definitions {
        Definitions::parse(EXAMPLE).expect("examples/workflows.json is valid (tested)")
    }
}

/// The example file, compiled in: the default definitions.
pub const EXAMPLE: &str = include_str!("../../../../examples/workflows.json");

// The built-in workflows are the example file's: they live here, above `workflow.rs`,
// so the types stay free of the parser that reads them.
impl Workflows {
    /// The example definition file's workflows (`examples/workflows.json`), the default
    /// when a deployment names no file of its own.
    pub fn builtin() -> Workflows {
        Definitions::example().workflows
    }
}

impl Default for Workflows {
    fn default() -> Self {
        Workflows::builtin()
    }
}

impl Workflow {
    /// The example definition file's single-step workflow (`Workflows::builtin`).
    pub fn single_step() -> Workflow {
        Workflows::builtin().get("single-step").expect("the example file defines single-step").clone()
    }

    /// The example definition file's three-step workflow: reserve, charge, then the pivot
    /// ship (`Workflows::builtin`).
    pub fn three_step() -> Workflow {
        Workflows::builtin().get("three-step").expect("the example file defines three-step").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::workflow::StepKind;

    #[test]
    fn the_example_file_is_valid_and_holds_the_built_in_workflows() {
        let d = Definitions::example();
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert_eq!(d.workflows.names(), ["single-step", "three-step"]);
        assert_eq!(d.workflows.default_workflow().name, "single-step");
        let three = d.workflows.get("three-step").unwrap();
        let kinds: Vec<StepKind> = three.steps.iter().map(|s| s.kind()).collect();
        assert_eq!(kinds, [StepKind::Compensable, StepKind::Compensable, StepKind::Pivot]);
    }

    #[test]
    fn the_issues_own_example_is_valid() {
        let text = r#"{"agents": {
            "inventory": {"url": "https://inventory.internal/sas", "timeout_ms": 2000,
                          "retry": {"base_ms": 100, "cap_ms": 2000},
                          "breaker": {"failures": 5, "open_ms": 1000}},
            "payment":   {"url": "https://pay.internal/sas"}},
          "workflows": [
            {"name": "fulfil", "version": 1, "on_give_up": "compensate",
             "steps": [
               {"name": "reserve", "agent": "inventory", "compensation": "release", "timeout_ms": 30000, "max_failures": 5},
               {"name": "charge", "agent": "payment", "compensation": "refund"},
               {"name": "ship", "agent": "inventory"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        let wf = d.workflows.get("fulfil").unwrap();
        assert_eq!((wf.timeout_ms(0, 9), wf.max_failures(0, 9), wf.timeout_ms(1, 9)), (30_000, 5, 9));
        assert_eq!(d.agents["inventory"].breaker.unwrap().policy().failure_threshold, 5);
    }
}
