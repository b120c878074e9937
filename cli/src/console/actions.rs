//! The console's actions: what a form asks for, its dry run on the task as read now, and
//! the action, each through the code `sasctl tasks` runs (cli/src/tasks/act.rs's
//! `Operator` and `preview`; cli/src/tasks/callback.rs's `ByHand`), so the page can do
//! nothing the command line cannot, and records who acted (the caller's identity) and why
//! in the same way.

use std::collections::HashMap;

use sas::domain::{Act, Policy};

use crate::tasks::act::{Operator, Outcome, preview};
use crate::tasks::callback::{ByHand, CompletionOf, Verb};
use crate::tasks::{TasksError, order_id, render};

/// What an action form asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    /// Why: recorded with who acted (required).
    pub reason: String,
    /// A callback's step name (complete, fail).
    pub step: String,
    /// A completion's output, JSON (complete; optional).
    pub output: Option<String>,
    /// The revision the dry run read: the action is refused if the task moved since.
    pub seen: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Act(Act),
    Callback(Verb),
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Act(act) => act.as_str(),
            Kind::Callback(verb) => verb.as_str(),
        }
    }
}

/// The actions a task page offers, by name.
pub const ACTIONS: [&str; 7] = ["resubmit", "compensate", "cancel", "pause", "resume", "complete", "fail"];

/// The form's fields as a request, or what is wrong with them (one line).
pub fn parse(form: &HashMap<String, String>) -> Result<Request, String> {
    let field = |name: &str| form.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let from_step = match field("from_step") {
        None => None,
        Some(n) => Some(
            n.parse::<u32>()
                .ok()
                .filter(|n| *n <= 999)
                .ok_or_else(|| format!("from_step {n:?} is not a step number from 0 to 999"))?,
        ),
    };
    let kind = match field("action").unwrap_or_default() {
        "resubmit" => Kind::Act(Act::Resubmit { from_step }),
        "compensate" => Kind::Act(Act::Compensate),
        "cancel" => Kind::Act(Act::Cancel),
        "pause" => Kind::Act(Act::Pause),
        "resume" => Kind::Act(Act::Resume),
        "complete" => Kind::Callback(Verb::Complete),
        "fail" => Kind::Callback(Verb::Fail),
        other => return Err(format!("action {other:?} is not one of {}", ACTIONS.join(", "))),
    };
    let reason = field("reason").ok_or("a reason is required: it is recorded with who acted")?.to_owned();
    let step = field("step").unwrap_or_default().to_owned();
    if matches!(kind, Kind::Callback(_)) && step.is_empty() {
        return Err("complete and fail need the callback step's name (step)".into());
    }
    let output = field("output").map(str::to_owned);
    if output.is_some() && kind != Kind::Callback(Verb::Complete) {
        return Err("an output is given only to complete".into());
    }
    let seen = match field("seen") {
        None => None,
        Some(n) => Some(n.parse::<u64>().map_err(|_| format!("seen {n:?} is not a revision"))?),
    };
    Ok(Request { kind, reason, step, output, seen })
}

/// What the dry run, or the action, came to: whether it applies (or applied), and one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub applies: bool,
    pub line: String,
    /// The task's revision as read (the dry run's), to hand to the action.
    pub revision: Option<u64>,
}

impl Request {
    fn by_hand<'a>(&'a self, id: &'a str, verb: Verb, dry_run: bool) -> ByHand<'a> {
        ByHand { verb, order: id, step: &self.step, why: &self.reason, dry_run, seen: self.seen }
    }

    fn completion(&self, verb: Verb) -> Result<sas::domain::Completion, TasksError> {
        match verb {
            Verb::Fail => CompletionOf::Failure { reason: &self.reason },
            _ => CompletionOf::Success { output: self.output.as_deref(), file: None },
        }
        .completion()
    }

    /// The dry run: decided on one consistent read of the task, written nowhere.
    pub async fn dry_run(&self, op: &Operator, policy: &Policy, id: &str) -> Result<Told, TasksError> {
        let order = order_id(id)?;
        let Some(task) = op.ctx.task(&order).await? else {
            return Ok(Told { applies: false, line: format!("no task {id}"), revision: None });
        };
        let revision = Some(task.revision);
        match self.kind {
            Kind::Act(act) => {
                op.ctx.workflow_of(&task)?;
                let (applies, line, _) = preview(&op.ctx, act, &task, &self.reason, policy);
                Ok(Told { applies, line, revision })
            }
            Kind::Callback(verb) => {
                let by_hand = self.by_hand(id, verb, true);
                let wf = by_hand.workflow(&op.ctx, &task)?;
                let completion = self.completion(verb)?;
                let told = by_hand.preview(&task, wf, &completion, policy);
                Ok(Told { applies: told.is_ok(), line: by_hand.line(&told), revision })
            }
        }
    }

    /// The action, by the caller's identity, with the reason.
    pub async fn perform(&self, op: &Operator, id: &str) -> Result<Told, TasksError> {
        match self.kind {
            Kind::Act(act) => {
                let outcome = op.act(id, act, &self.reason, self.seen).await?;
                let applies = matches!(outcome, Outcome::Applied { .. });
                Ok(Told { applies, line: outcome.line(id, &op.by, &self.reason), revision: None })
            }
            Kind::Callback(verb) => {
                order_id(id)?;
                let by_hand = self.by_hand(id, verb, false);
                if let Some(task) = op.ctx.task(&order_id(id)?).await? {
                    by_hand.workflow(&op.ctx, &task)?;
                }
                let completion = self.completion(verb)?;
                let told = by_hand.apply(&op.ctx, &op.deps, &op.settings, &op.by, &completion).await?;
                let line = match &told {
                    Ok(_) => format!(
                        "{}, by {}, why {}",
                        by_hand.line(&told),
                        op.by,
                        render::one_line(&self.reason, 200)
                    ),
                    Err(_) => by_hand.line(&told),
                };
                Ok(Told { applies: told.is_ok(), line, revision: None })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_form_needs_a_known_action_and_a_reason() {
        let r = parse(&form(&[("action", "complete"), ("step", "approve"), ("reason", " phoned ")])).unwrap();
        assert_eq!(
            (r.kind, r.reason.as_str(), r.step.as_str()),
            (Kind::Callback(Verb::Complete), "phoned", "approve")
        );
        let r = parse(&form(&[("action", "resubmit"), ("from_step", "1"), ("reason", "x"), ("seen", "7")]))
            .unwrap();
        assert_eq!((r.kind, r.seen), (Kind::Act(Act::Resubmit { from_step: Some(1) }), Some(7)));
        assert_eq!(
            parse(&form(&[("action", "cancel")])).unwrap_err(),
            "a reason is required: it is recorded with who acted"
        );
        assert!(
            parse(&form(&[("action", "delete"), ("reason", "x")]))
                .unwrap_err()
                .starts_with("action \"delete\"")
        );
        assert!(parse(&form(&[("action", "fail"), ("reason", "x")])).is_err(), "fail needs the step");
        assert!(parse(&form(&[("action", "pause"), ("reason", "x"), ("output", "{}")])).is_err());
        assert!(parse(&form(&[("action", "pause"), ("reason", "x"), ("seen", "-1")])).is_err());
    }
}
