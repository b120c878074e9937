//! Workflow definitions: N ordered steps, each naming the agent that performs it and,
//! optionally, the compensating action that undoes it.

use serde::{Deserialize, Serialize};

/// Which way a step runs: its forward action or its compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Do,
    Undo,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Do => "do",
            Action::Undo => "undo",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The step's name, e.g. `charge-payment`.
    pub name: String,
    /// The remote service (agent) that performs it, e.g. `payment`.
    pub agent: String,
    /// The compensating action's name, e.g. `refund-payment`; `None` when the step
    /// has nothing to undo.
    pub compensation: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workflow {
    pub name: String,
    pub steps: Vec<Step>,
}

impl Workflow {
    pub fn len(&self) -> u32 {
        self.steps.len() as u32
    }
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
    pub fn step(&self, index: u32) -> Option<&Step> {
        self.steps.get(index as usize)
    }
    /// Whether giving up on this workflow means undoing rather than stopping for an operator.
    pub fn compensates(&self) -> bool {
        self.steps.iter().any(|s| s.compensation.is_some())
    }
    /// The highest step at or below `from` that has a compensation: where undoing starts,
    /// and (with `from = done - 1`) where it goes next. Reverse order by construction.
    pub fn compensable_at_or_below(&self, from: Option<u32>) -> Option<u32> {
        let from = from?;
        (0..=from.min(self.len().saturating_sub(1)))
            .rev()
            .find(|&i| self.steps[i as usize].compensation.is_some())
    }

    /// The single-step order flow: one agent processes the whole order.
    pub fn single_step() -> Workflow {
        Workflow {
            name: "single-step".into(),
            steps: vec![Step { name: "process-order".into(), agent: "orders".into(), compensation: None }],
        }
    }

    /// Reserve, charge, ship; a failure undoes what was done, newest first.
    pub fn three_step() -> Workflow {
        Workflow {
            name: "three-step".into(),
            steps: vec![
                Step {
                    name: "reserve-inventory".into(),
                    agent: "inventory".into(),
                    compensation: Some("release-inventory".into()),
                },
                Step {
                    name: "charge-payment".into(),
                    agent: "payment".into(),
                    compensation: Some("refund-payment".into()),
                },
                Step { name: "ship-order".into(), agent: "shipping".into(), compensation: None },
            ],
        }
    }
}

/// The workflows a deployment knows, by name; the first is the default for orders
/// that name none.
#[derive(Debug, Clone)]
pub struct Workflows {
    all: Vec<Workflow>,
}

impl Workflows {
    pub fn new(all: Vec<Workflow>) -> Workflows {
        assert!(!all.is_empty(), "at least one workflow");
        assert!(all.iter().all(|w| !w.is_empty()), "workflows need steps");
        Workflows { all }
    }
    pub fn builtin() -> Workflows {
        Workflows::new(vec![Workflow::single_step(), Workflow::three_step()])
    }
    pub fn default_workflow(&self) -> &Workflow {
        &self.all[0]
    }
    pub fn get(&self, name: &str) -> Option<&Workflow> {
        self.all.iter().find(|w| w.name == name)
    }
    pub fn names(&self) -> Vec<&str> {
        self.all.iter().map(|w| w.name.as_str()).collect()
    }
}

impl Default for Workflows {
    fn default() -> Self {
        Workflows::builtin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensation_walks_down_skipping_steps_without_one() {
        let w = Workflow::three_step();
        assert_eq!(w.compensable_at_or_below(Some(2)), Some(1));
        assert_eq!(w.compensable_at_or_below(Some(1)), Some(1));
        assert_eq!(w.compensable_at_or_below(Some(0)), Some(0));
        assert_eq!(w.compensable_at_or_below(None), None);
        assert_eq!(w.compensable_at_or_below(Some(99)), Some(1));
        assert!(!Workflow::single_step().compensates());
        assert_eq!(Workflow::single_step().compensable_at_or_below(Some(0)), None);
    }
}
