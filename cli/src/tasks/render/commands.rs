//! The command lines an operator can paste next: the actions that apply to a task as it
//! is, with the deployment flags as given.

use sas::domain::{Act, Actor, Origin, Policy, TaskRecord, Timestamp, Workflow};

use crate::deployment::DeploymentArgs;

/// `value` as a shell word: as it is when it is plain, else single-quoted.
pub fn shell_word(value: &str) -> String {
    let plain =
        !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
    if plain { value.to_owned() } else { format!("'{}'", value.replace('\'', r"'\''")) }
}

/// The deployment flags as given, to repeat in a suggested command (the environment's
/// SAS_STACK / SAS_PREFIX need no repeating: they still apply).
pub fn deployment_flags(d: &DeploymentArgs, workflows: Option<&std::path::Path>) -> String {
    let mut out = String::new();
    let mut add = |flag: &str, value: Option<&str>| {
        if let Some(v) = value {
            out.push_str(&format!(" --{flag} {}", shell_word(v)));
        }
    };
    add("stack", d.stack.as_deref());
    add("prefix", d.prefix.as_deref());
    add("table", d.table.as_deref());
    add("orders-queue", d.orders_queue.as_deref());
    add("scheduler-queue", d.scheduler_queue.as_deref());
    add("agent-queue", d.agent_queue.as_deref());
    add("alert-topic", d.alert_topic.as_deref());
    add("endpoint-url", d.endpoint_url.as_deref());
    add("workflows", workflows.and_then(|p| p.to_str()));
    out
}

/// The actions that apply to the task as it is (asked of the same decisions the actions
/// make), each as a command line to paste; without its workflow, by state alone.
pub fn next_commands(
    task: &TaskRecord,
    wf: Option<&Workflow>,
    policy: &Policy,
    now: Timestamp,
    flags: &str,
) -> Vec<String> {
    let id = task.order_id.as_str();
    let acts = [Act::Resubmit { from_step: None }, Act::Compensate, Act::Cancel, Act::Pause, Act::Resume];
    let applies = |act: Act| match wf {
        Some(wf) => task
            .act(act, Actor { by: "-", why: "-", seen: None, origin: Origin::Operator }, now, wf, policy)
            .is_ok(),
        None => match act {
            Act::Resubmit { .. } | Act::Compensate => task.state() == sas::domain::ProcessState::Error,
            Act::Cancel => {
                matches!(
                    task.state(),
                    sas::domain::ProcessState::Pending
                        | sas::domain::ProcessState::Processing
                        | sas::domain::ProcessState::Waiting
                )
            }
            Act::Pause => !task.state().is_terminal() && !task.paused(),
            Act::Resume => task.paused(),
        },
    };
    let mut next: Vec<String> = acts
        .into_iter()
        .filter(|a| applies(*a))
        .map(|a| format!("sasctl tasks {} {id} --reason TEXT{flags}", a.as_str()))
        .collect();
    // A callback step's word, for whoever holds its token (the record keeps only its digest).
    if task.callback().is_some()
        && matches!(task.state(), sas::domain::ProcessState::Processing | sas::domain::ProcessState::Waiting)
    {
        next.push(format!("sasctl tasks complete TOKEN --output JSON{flags}"));
        next.push(format!("sasctl tasks fail TOKEN --reason TEXT{flags}"));
        next.push(format!("sasctl tasks heartbeat TOKEN{flags}"));
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{Phase, ProcessState, Step};

    fn task(state: ProcessState) -> TaskRecord {
        crate::fixtures::task("o-1", state)
    }

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("reserve", "inv", "release"), Step::pivot("ship", "ship")])
    }

    #[test]
    fn the_next_commands_are_those_the_decisions_allow() {
        let flags = deployment_flags(
            &DeploymentArgs {
                prefix: Some("sas".into()),
                endpoint_url: Some("http://127.0.0.1:5000".into()),
                ..Default::default()
            },
            Some(std::path::Path::new("my flows.json")),
        );
        assert_eq!(flags, " --prefix sas --endpoint-url http://127.0.0.1:5000 --workflows 'my flows.json'");
        let now = Timestamp(1_700_000_001_000);
        let policy = Policy::default();
        let mut failed = task(ProcessState::Error);
        // Failed at its first step, which was refused: resubmit applies, and so does
        // compensate only if something may have taken effect.
        let next = next_commands(&failed, Some(&wf()), &policy, now, &flags);
        assert_eq!(
            next,
            [
                "sasctl tasks resubmit o-1 --reason TEXT --prefix sas --endpoint-url http://127.0.0.1:5000 --workflows 'my flows.json'"
            ]
        );
        failed.step = 1;
        let next = next_commands(&failed, Some(&wf()), &policy, now, "");
        assert_eq!(
            next,
            ["sasctl tasks resubmit o-1 --reason TEXT", "sasctl tasks compensate o-1 --reason TEXT"]
        );
        let pending = task(ProcessState::Pending);
        assert_eq!(
            next_commands(&pending, Some(&wf()), &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        let paused = task(ProcessState::Pending);
        let due = paused.deadline().unwrap();
        let paused =
            paused.with_phase(Phase::Pending { due, wait: Default::default(), stage: None, paused: true });
        assert_eq!(
            next_commands(&paused, Some(&wf()), &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks resume o-1 --reason TEXT"]
        );
        assert_eq!(
            next_commands(&pending, None, &policy, now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        let done = task(ProcessState::Processed);
        assert!(next_commands(&done, Some(&wf()), &policy, now, "").is_empty());
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
