//! Reading variables: every problem collected, so one cold start names them all.

use std::str::FromStr;

use super::variables::{FunctionName, VARIABLES};
use super::{
    ConfigError, DEFAULT_DUE_INDEX, DEFAULT_DUE_SHARDS, DEFAULT_ERROR_INDEX, DEFAULT_FINISHED_INDEX,
    DEFAULT_METRICS_NAMESPACE, DEFAULT_RETENTION_DAYS, Deployment, MAX_DUE_SHARDS, MAX_RETENTION_DAYS,
    MAX_SEND_MAX_HOLD_MS, MAX_STEP_TIMEOUT_MS, MIN_STEP_TIMEOUT_MS, OWN_QUEUE_VARIABLES, TableNames,
};
use crate::domain::retry::Backoff;
use crate::domain::{Definitions, Invalid, Policy, QueueId, ReplyToRules};
use crate::ports::QueueUrl;

/// Reads variables through `lookup`, collecting problems instead of stopping at one.
pub(super) struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// Whose configuration this is: every name read must be listed for it.
    function: FunctionName,
    problems: Vec<String>,
}

impl Env<'_> {
    /// Unset and empty are the same: templates often render a missing value as "".
    pub(super) fn optional(&mut self, name: &str) -> Option<String> {
        // A name missing from the list would be missing from bootstrap's output, `up`,
        // the template check and the docs: caught here, in every test that reads a config.
        debug_assert!(
            super::variables::variable(name).is_some_and(|v| v.is_read_by(self.function)),
            "{name} is read by the {} function but not listed for it in config/variables.rs",
            self.function.as_str()
        );
        (self.lookup)(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
    }

    pub(super) fn required(&mut self, name: &str) -> String {
        self.optional(name).unwrap_or_else(|| {
            self.problems.push(format!("{name} is not set"));
            String::new()
        })
    }

    pub(super) fn problem(&mut self, problem: String) {
        self.problems.push(problem);
    }

    pub(super) fn check(&mut self, name: &str, value: &str, ok: bool, expected: &str) {
        if !ok {
            self.problems.push(format!("{name}={value:?} is not {expected}"));
        }
    }

    pub(super) fn table(&mut self, name: &str) -> String {
        let value = self.required(name);
        if !value.is_empty() {
            let ok = (3..=255).contains(&value.len())
                && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            self.check(
                name,
                &value,
                ok,
                "a DynamoDB table or index name ([A-Za-z0-9_.-], 3 to 255 characters)",
            );
        }
        value
    }

    pub(super) fn url(&mut self, name: &str, value: String) -> String {
        let ok = value.starts_with("https://") || value.starts_with("http://");
        self.check(name, &value, ok, "an http(s) URL");
        value
    }

    /// The remote service gets the order: https only, so it cannot be read or altered on
    /// the way, except to a loopback host (local runs, `sasctl dev`'s simulated service).
    pub(super) fn remote_url(&mut self, name: &str, value: String) -> String {
        let ok = crate::domain::definitions::remote_url_allowed(&value);
        self.check(name, &value, ok, "an https URL (plain http is accepted only to a loopback host)");
        value
    }

    pub(super) fn queue(&mut self, name: &str) -> QueueUrl {
        let value = self.required(name);
        QueueUrl(if value.is_empty() { value } else { self.url(name, value) })
    }

    pub(super) fn optional_queue(&mut self, name: &str) -> Option<QueueUrl> {
        self.optional(name).map(|v| QueueUrl(self.url(name, v)))
    }

    pub(super) fn arn(&mut self, name: &str) -> String {
        let value = self.required(name);
        if !value.is_empty() {
            self.check(name, &value, value.starts_with("arn:"), "an ARN");
        }
        value
    }

    pub(super) fn number<T>(&mut self, name: &str, default: T, range: std::ops::RangeInclusive<T>) -> T
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let Some(raw) = self.optional(name) else {
            return default;
        };
        match raw.parse::<T>() {
            Ok(v) if range.contains(&v) => v,
            _ => {
                self.problems.push(format!(
                    "{name}={raw:?} is not a whole number from {} to {}",
                    range.start(),
                    range.end()
                ));
                default
            }
        }
    }

    /// The definition file named by `WORKFLOWS_FILE`, or the built-in one. Every
    /// problem of the file is reported, as one line naming the variable.
    pub(super) fn definitions(&mut self) -> Definitions {
        let Some(path) = self.optional("WORKFLOWS_FILE") else {
            return Definitions::example();
        };
        let parsed =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot be read: {e}")).and_then(|text| {
                Definitions::parse(&text).map_err(|Invalid(problems)| {
                    let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
                    format!("is not valid: {}", all.join("; "))
                })
            });
        match parsed {
            Ok(definitions) => definitions,
            Err(why) => {
                self.problems.push(format!("WORKFLOWS_FILE={path:?} {why}"));
                Definitions::example()
            }
        }
    }

    pub(super) fn tables(&mut self) -> TableNames {
        let state = self.table("STATE_TABLE");
        let due_index = match self.optional("DUE_INDEX") {
            Some(_) => self.table("DUE_INDEX"),
            None => DEFAULT_DUE_INDEX.to_owned(),
        };
        let due_shards = self.number("DUE_SHARDS", DEFAULT_DUE_SHARDS, 1..=MAX_DUE_SHARDS);
        // No function queries the error index (operators' `sasctl` does): only writers
        // need its key attribute, which `task_item` adds whatever the index is called.
        let error_index = DEFAULT_ERROR_INDEX.to_owned();
        let retention_days = self.number("RETENTION_DAYS", DEFAULT_RETENTION_DAYS, 0..=MAX_RETENTION_DAYS);
        let list_finished = match self.optional("LIST_FINISHED").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                self.problems.push(format!("LIST_FINISHED={other:?} is neither true nor false"));
                false
            }
        };
        TableNames {
            state,
            due_index,
            due_shards,
            error_index,
            list_finished,
            finished_index: DEFAULT_FINISHED_INDEX.to_owned(),
            retention_days,
        }
    }

    pub(super) fn policy(&mut self) -> Policy {
        let d = Policy::default();
        let day = 24 * 3600 * 1000;
        let policy = Policy {
            step_timeout_ms: self.number(
                "STEP_TIMEOUT_MS",
                d.step_timeout_ms,
                MIN_STEP_TIMEOUT_MS..=MAX_STEP_TIMEOUT_MS,
            ),
            reply_grace_ms: self.number("REPLY_GRACE_MS", d.reply_grace_ms, 0..=day),
            pending_timeout_ms: self.number("PENDING_TIMEOUT_MS", d.pending_timeout_ms, 1..=day),
            failure_threshold: self.number("FAILURE_THRESHOLD", d.failure_threshold, 1..=1_000),
            retry_backoff: Backoff {
                base_ms: self.number("RETRY_BASE_MS", d.retry_backoff.base_ms, 0..=day),
                cap_ms: self.number("RETRY_CAP_MS", d.retry_backoff.cap_ms, 0..=day),
            },
        };
        if policy.retry_backoff.cap_ms < policy.retry_backoff.base_ms {
            self.problems.push(format!(
                "RETRY_CAP_MS ({}) is below RETRY_BASE_MS ({})",
                policy.retry_backoff.cap_ms, policy.retry_backoff.base_ms
            ));
        }
        policy
    }

    /// The `reply_to` rules: SQS URLs only, the status queue plus the extra ARNs, never
    /// one of the eight queues of the deployment (`domain::reply_to`).
    pub(super) fn reply_to(&mut self) -> ReplyToRules {
        let status_arn = self.required("STATUS_QUEUE_ARN");
        let status = (!status_arn.is_empty()).then(|| QueueId::from_arn(&status_arn)).flatten();
        if !status_arn.is_empty() && status.is_none() {
            self.check("STATUS_QUEUE_ARN", &status_arn, false, "an SQS queue ARN");
        }
        let mut extras = Vec::new();
        for arn in self.optional("REPLY_TO_EXTRA_QUEUE_ARNS").unwrap_or_default().split(',') {
            let arn = arn.trim();
            if arn.is_empty() {
                continue;
            }
            match QueueId::from_arn(arn) {
                Some(id) => extras.push(id),
                None => self.problems.push(format!(
                    "REPLY_TO_EXTRA_QUEUE_ARNS: {arn:?} is not an SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>, no wildcards)"
                )),
            }
        }
        let region = self
            .optional("AWS_REGION")
            .or_else(|| self.optional("AWS_DEFAULT_REGION"))
            .or_else(|| status.as_ref().map(|s| s.region.clone()))
            .unwrap_or_default();
        let endpoint =
            match self.optional("AWS_ENDPOINT_URL_SQS").or_else(|| self.optional("AWS_ENDPOINT_URL")) {
                Some(raw) => match url::Url::parse(&raw) {
                    Ok(url) if url.has_host() => Some(url),
                    _ => {
                        self.check("AWS_ENDPOINT_URL", &raw, false, "a URL");
                        None
                    }
                },
                None => None,
            };
        let mut rules = ReplyToRules::sqs(region, endpoint);
        for name in OWN_QUEUE_VARIABLES {
            let Some(url) = self.optional(name) else { continue };
            match QueueId::account_and_name(&url) {
                Some((account, queue)) => rules = rules.own_queue(account, queue),
                // A value that is not a URL at all is reported by the function's own read.
                None if url.starts_with("http") => {
                    self.check(name, &url, false, "a queue URL ending in /<account>/<queue name>")
                }
                None => {}
            }
        }
        for queue in status.into_iter().chain(extras) {
            if rules.is_own(&queue) {
                self.problems.push(format!(
                    "reply_to allow-list names this deployment's own queue {queue}: status would land among its messages"
                ));
            }
            rules = rules.allow(queue);
        }
        rules
    }

    pub(super) fn deployment(&mut self, tables: &TableNames) -> Deployment {
        Deployment::infer(self.optional("STACK_NAME").as_deref(), &tables.state)
    }

    pub(super) fn namespace(&mut self) -> String {
        self.optional("METRICS_NAMESPACE").unwrap_or_else(|| DEFAULT_METRICS_NAMESPACE.to_owned())
    }

    pub(super) fn send_max_hold(&mut self, default: u64) -> u64 {
        self.number("SEND_MAX_HOLD_MS", default, 0..=MAX_SEND_MAX_HOLD_MS)
    }

    /// The problems in the order of the variable list (a problem is placed by the variable
    /// it starts with; one naming none goes last), whatever order the reads took.
    pub(super) fn finish<T>(mut self, config: T) -> Result<T, ConfigError> {
        if self.problems.is_empty() {
            return Ok(config);
        }
        let rank = |problem: &String| {
            let name: String = problem
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            VARIABLES.iter().position(|v| v.name == name).unwrap_or(VARIABLES.len())
        };
        self.problems.sort_by_key(rank);
        Err(ConfigError { problems: self.problems })
    }
}

pub(super) fn read<T>(
    function: FunctionName,
    lookup: &dyn Fn(&str) -> Option<String>,
    build: impl FnOnce(&mut Env<'_>) -> T,
) -> Result<T, ConfigError> {
    let mut env = Env { lookup, function, problems: Vec::new() };
    let config = build(&mut env);
    env.finish(config)
}

pub(super) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
