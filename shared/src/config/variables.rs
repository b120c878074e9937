//! The one list of the functions' environment variables.
//!
//! Every name a function's configuration reads is here, with the functions that read it
//! and where its value comes from. In debug builds (every test) the readers refuse a name
//! that is not listed for their function, and a test reads each function's configuration
//! and compares what it read with the list;
//! `sas-bootstrap` prints exactly the variables whose source is [`Source::Resource`],
//! `sasctl up` passes the [`Source::Tuning`] ones through from its own environment, and
//! `scripts/check-template-contract.py` compares the list (`sas-bootstrap --variables`)
//! with each function's environment in `template.yaml`.

/// One of the four Lambda functions, as the list names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FunctionName {
    Submission,
    Scheduler,
    Agent,
    Supervisor,
}

impl FunctionName {
    pub const ALL: [FunctionName; 4] =
        [FunctionName::Submission, FunctionName::Scheduler, FunctionName::Agent, FunctionName::Supervisor];

    pub fn as_str(self) -> &'static str {
        match self {
            FunctionName::Submission => "submission",
            FunctionName::Scheduler => "scheduler",
            FunctionName::Agent => "agent",
            FunctionName::Supervisor => "supervisor",
        }
    }
}

/// Where a variable's value comes from, which decides who sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A resource's name, URL or ARN: `template.yaml` sets it, `sas-bootstrap` prints it.
    Resource,
    /// A setting with a default: `template.yaml` sets it from a parameter; local runs leave
    /// it unset or set it themselves (`sasctl up` passes these through).
    Tuning,
    /// Chosen by whoever deploys: `template.yaml` sets it from a parameter or the stack; a
    /// local run adds it by hand (docs/DEPLOY.md, "LocalStack").
    Deployer,
    /// Set by Lambda itself (the region), or by a local run to reach its endpoint; never in
    /// the template.
    Platform,
}

/// Whether a function refuses to start without the variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Required,
    Optional,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    /// The functions that read it, and whether each requires it.
    pub read_by: &'static [(FunctionName, Need)],
    pub source: Source,
    /// What it is, and its default when optional.
    pub about: &'static str,
}

impl Variable {
    pub fn is_read_by(&self, function: FunctionName) -> bool {
        self.read_by.iter().any(|(f, _)| *f == function)
    }
    pub fn need(&self, function: FunctionName) -> Option<Need> {
        self.read_by.iter().find(|(f, _)| *f == function).map(|(_, n)| *n)
    }
}

use FunctionName::{Agent as A, Scheduler as C, Submission as S, Supervisor as V};
use Need::{Optional as O, Required as R};

/// The three functions that write the state table.
const STATE: &[(FunctionName, Need)] = &[(S, R), (C, R), (V, R)];
const STATE_OPTIONAL: &[(FunctionName, Need)] = &[(S, O), (C, O), (V, O)];
const ALL_OPTIONAL: &[(FunctionName, Need)] = &[(S, O), (C, O), (A, O), (V, O)];

pub const VARIABLES: &[Variable] = &[
    // The agent writes only limited agents' call marks there: it requires the table only
    // when the definition file has an agent with limits (`AgentConfig`).
    Variable {
        name: "STATE_TABLE",
        read_by: &[(S, R), (C, R), (A, O), (V, R)],
        source: Source::Resource,
        about: "the state table: one item per order (the agent: only limited agents' call marks, required when an agent has limits)",
    },
    Variable {
        name: "DUE_INDEX",
        read_by: STATE_OPTIONAL,
        source: Source::Resource,
        about: "the state table's sparse due index (default due-index)",
    },
    Variable {
        name: "DUE_SHARDS",
        read_by: STATE_OPTIONAL,
        source: Source::Resource,
        about: "partitions of the due index; writers and the supervisor must agree (default 4)",
    },
    Variable {
        name: "LIST_FINISHED",
        read_by: STATE_OPTIONAL,
        source: Source::Resource,
        about: "true: finished tasks (Processed, Compensated) go into the table's finished-index, so operators can list them; one more index write per order (default false)",
    },
    Variable {
        name: "RETENTION_DAYS",
        read_by: STATE_OPTIONAL,
        source: Source::Resource,
        about: "days a finished task's record is kept (its expires_at TTL); 0 keeps it forever (default 30)",
    },
    Variable {
        name: "ORDERS_QUEUE_URL",
        read_by: &[(S, R), (C, O), (V, O)],
        source: Source::Resource,
        about: "the orders queue (the others read it to keep reply_to off it)",
    },
    Variable {
        name: "ORDERS_DLQ_URL",
        read_by: &[(S, R), (C, O), (V, O)],
        source: Source::Resource,
        about: "the orders queue's DLQ, where rejected input is kept with its reason",
    },
    Variable {
        name: "SCHEDULER_QUEUE_URL",
        read_by: &[(S, R), (C, R), (A, R), (V, R)],
        source: Source::Resource,
        about: "the scheduler queue: schedules and agents' replies",
    },
    Variable {
        name: "SCHEDULER_DLQ_URL",
        read_by: &[(S, O), (C, R), (V, O)],
        source: Source::Resource,
        about: "the scheduler queue's DLQ",
    },
    Variable {
        name: "AGENT_QUEUE_URL",
        read_by: &[(S, O), (C, R), (A, R), (V, O)],
        source: Source::Resource,
        about: "the agent queue: the scheduler's requests (only the scheduler dispatches)",
    },
    Variable {
        name: "AGENT_DLQ_URL",
        read_by: &[(S, O), (C, O), (A, R), (V, O)],
        source: Source::Resource,
        about: "the agent queue's DLQ",
    },
    // Required by the scheduler, which consumes the callback queue through a second event
    // source and tells its records apart by this URL: a scheduler that did not know it
    // would read completions as scheduler messages and keep every one in the scheduler
    // DLQ. The template always sets both; the others read them only to keep reply_to off
    // them, as they do the other queues.
    Variable {
        name: "CALLBACK_QUEUE_URL",
        read_by: &[(S, O), (C, R), (V, O)],
        source: Source::Resource,
        about: "the callback queue: the outside's completions, failures and heartbeats of callback steps, which the scheduler applies",
    },
    Variable {
        name: "CALLBACK_DLQ_URL",
        read_by: &[(S, O), (C, R), (V, O)],
        source: Source::Resource,
        about: "the callback queue's DLQ, where a refused or malformed completion is kept with its reason",
    },
    Variable {
        name: "ALERT_TOPIC_ARN",
        read_by: &[(C, R), (V, R)],
        source: Source::Resource,
        about: "the SNS topic operator alerts go to",
    },
    Variable {
        name: "STATUS_QUEUE_ARN",
        read_by: STATE,
        source: Source::Resource,
        about: "the status queue, always on the reply_to allow-list",
    },
    Variable {
        name: "REMOTE_SERVICE_URL",
        read_by: &[(A, R)],
        source: Source::Deployer,
        about: "the remote service of agents that name no url of their own (https; plain http only to loopback)",
    },
    Variable {
        name: "WORKFLOWS_FILE",
        read_by: ALL_OPTIONAL,
        source: Source::Deployer,
        about: "the definition file of agents and workflows, read once at cold start (default: the built-in examples/workflows.json)",
    },
    Variable {
        name: "STACK_NAME",
        read_by: &[(C, O), (V, O)],
        source: Source::Deployer,
        about: "named in every alert's show command (sasctl tasks show ID --stack NAME); unset: --prefix when STATE_TABLE is {prefix}-state",
    },
    Variable {
        name: "STEP_TIMEOUT_MS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "a step's complete-by after its claim, 1000 to 50000 (default 30000)",
    },
    Variable {
        name: "REPLY_GRACE_MS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "how long after complete-by a reply may still arrive before the supervisor acts (default 10000)",
    },
    Variable {
        name: "PENDING_TIMEOUT_MS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "how long a Pending task waits for its claim before the supervisor acts (default 60000)",
    },
    Variable {
        name: "FAILURE_THRESHOLD",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "a step's failure budget when its workflow sets none (default 5)",
    },
    Variable {
        name: "RETRY_BASE_MS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "the supervisor's retry backoff, first delay (default 1000)",
    },
    Variable {
        name: "RETRY_CAP_MS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "the supervisor's retry backoff, longest delay (default 60000)",
    },
    Variable {
        name: "METRICS_NAMESPACE",
        read_by: ALL_OPTIONAL,
        source: Source::Tuning,
        about: "the CloudWatch namespace of the EMF metrics (default sas)",
    },
    Variable {
        name: "SEND_MAX_HOLD_MS",
        read_by: ALL_OPTIONAL,
        source: Source::Tuning,
        about: "how long a send may wait to be batched with its invocation's others, 0 to 1000 (default 300; the agent 20)",
    },
    Variable {
        name: "REPLY_TO_EXTRA_QUEUE_ARNS",
        read_by: STATE_OPTIONAL,
        source: Source::Tuning,
        about: "more queue ARNs reply_to may name, comma-separated, no wildcards (default none)",
    },
    // The AWS SDK in every function reads these four too; the list names the readers in
    // this module, which use them for the form a reply_to may take.
    Variable {
        name: "AWS_REGION",
        read_by: STATE_OPTIONAL,
        source: Source::Platform,
        about: "the region of a reply_to in a local endpoint's form (Lambda sets it; else AWS_DEFAULT_REGION, else the status queue's); every function's AWS SDK reads it too",
    },
    Variable {
        name: "AWS_LAMBDA_RUNTIME_API",
        read_by: &[(A, O)],
        source: Source::Platform,
        about: "where Lambda (or cargo lambda watch) serves the Runtime API; no agent may call it",
    },
    Variable {
        name: "AWS_DEFAULT_REGION",
        read_by: STATE_OPTIONAL,
        source: Source::Platform,
        about: "read when AWS_REGION is unset",
    },
    Variable {
        name: "AWS_ENDPOINT_URL_SQS",
        read_by: STATE_OPTIONAL,
        source: Source::Platform,
        about: "a local endpoint (moto, LocalStack): the form a reply_to may take there; every function's AWS SDK reads it too",
    },
    Variable {
        name: "AWS_ENDPOINT_URL",
        read_by: STATE_OPTIONAL,
        source: Source::Platform,
        about: "read when AWS_ENDPOINT_URL_SQS is unset; every function's AWS SDK reads it (the endpoint of every service)",
    },
];

/// The listed variable `name`, if any.
pub fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}

/// The variables `function` reads, in the list's order.
pub fn read_by(function: FunctionName) -> impl Iterator<Item = &'static Variable> {
    VARIABLES.iter().filter(move |v| v.is_read_by(function))
}

/// The list as JSON, for the template contract check and for people.
pub fn to_json() -> String {
    let all: Vec<serde_json::Value> = VARIABLES
        .iter()
        .map(|v| {
            let read_by: serde_json::Map<String, serde_json::Value> = v
                .read_by
                .iter()
                .map(|(f, need)| {
                    let need = match need {
                        Need::Required => "required",
                        Need::Optional => "optional",
                    };
                    (f.as_str().to_owned(), need.into())
                })
                .collect();
            let source = match v.source {
                Source::Resource => "resource",
                Source::Tuning => "tuning",
                Source::Deployer => "deployer",
                Source::Platform => "platform",
            };
            serde_json::json!({"name": v.name, "read_by": read_by, "source": source, "about": v.about})
        })
        .collect();
    serde_json::to_string_pretty(&all).expect("plain JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_once() {
        let mut names: Vec<_> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a variable is listed twice");
    }

    #[test]
    fn a_required_variable_is_one_a_deployment_provides() {
        for v in VARIABLES {
            if v.read_by.iter().any(|(_, n)| *n == Need::Required) {
                assert!(
                    matches!(v.source, Source::Resource | Source::Deployer),
                    "{} is required but nobody is said to set it",
                    v.name
                );
            }
        }
    }

    /// docs/REFERENCE.md's configuration table lists exactly these variables, each with the
    /// functions that read it (`| NAME | reader, reader (optional) |`, readers in alphabetical
    /// order).
    #[test]
    fn the_reference_lists_every_variable() {
        let reference = include_str!("../../../docs/REFERENCE.md");
        let section = reference.split("\n## Configuration\n").nth(1).expect("the section");
        let section = section.split("\n## ").next().unwrap();
        let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
        assert_eq!(
            rows.len(),
            VARIABLES.len(),
            "docs/REFERENCE.md has {} rows, the list {}",
            rows.len(),
            VARIABLES.len()
        );
        for v in VARIABLES {
            let mut readers: Vec<String> = v
                .read_by
                .iter()
                .map(|(f, n)| match n {
                    Need::Required => f.as_str().to_owned(),
                    Need::Optional => format!("{} (optional)", f.as_str()),
                })
                .collect();
            readers.sort();
            let row = format!("| `{}` | {} |", v.name, readers.join(", "));
            assert!(rows.iter().any(|r| r.starts_with(&row)), "docs/REFERENCE.md lacks the row {row}");
        }
    }
}
