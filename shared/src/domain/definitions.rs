//! A deployment's definition file: the agents (remote services) its steps call and the
//! workflows its orders run, as a team writes them (JSON; its schema is
//! `docs/workflows.schema.json`, generated from these types). `examples/workflows.json`
//! holds the built-in workflows and is the default when a deployment names no file.
//!
//! Parsing is strict (unknown keys are errors, so a typo is not a silent default), and
//! [`DefinitionFile::check`] finds every problem at once, each naming the workflow, step
//! and field, so `sasctl workflows validate` and a function's cold start can both say
//! exactly what is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::breaker::BreakerPolicy;
use super::callback::{Callback, MAX_CALLBACK_MS, MIN_CALLBACK_MS};
use super::gate::{MAX_IN_FLIGHT_LIMIT, MAX_PER_SECOND_LIMIT};
use super::retry::Backoff;
use super::secrets::{self, SecretSource};
use super::wait::{MAX_WAIT_MS, MIN_WAIT_MS, Wait, WaitPath};
use super::workflow::{Step, StepEffect, Workflow, Workflows};

/// The shortest and longest complete-by a step may have, as for the deployment's own
/// `STEP_TIMEOUT_MS`: Lambda's 15-minute limit is far off, but a step's attempt must end
/// well inside the agent function's timeout.
pub const MIN_STEP_TIMEOUT_MS: u64 = 1_000;
pub const MAX_STEP_TIMEOUT_MS: u64 = 50_000;
/// Steps per workflow: every step's key and status fit in one task item many times over.
pub const MAX_STEPS: usize = 20;
/// Branches of one parallel stage. They count as steps towards `MAX_STEPS`, which bounds
/// the outputs a record keeps; this bounds the branch replies that race on one record
/// (each round of conflicting writes lands one) and the dispatches of one claim.
pub const MAX_BRANCHES: usize = 10;
pub const MAX_FAILURES: u32 = 100;
pub const MAX_NAME_LEN: usize = 64;

/// The file as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DefinitionFile {
    /// For editors: the path or URL of the JSON Schema.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The remote services, by name.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentDef>,
    /// The first is the default for orders that name none.
    pub workflows: Vec<Workflow>,
}

/// How a step reaches its remote service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// The agent function calls `POST {url}/{step name}` with retries and a breaker.
    #[default]
    Http,
    /// The scheduler puts the agent request on `queue_url`; a worker of the team's own
    /// (any language) does the step and sends the fenced reply to the scheduler's queue
    /// (docs/WORKERS.md).
    Queue,
}

/// One remote service. Every field is optional: an empty object is the deployment's
/// `REMOTE_SERVICE_URL` with the agent's name appended, and the deployment's timing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    /// `http` (the default) or `queue`.
    #[serde(default, skip_serializing_if = "is_http")]
    pub kind: AgentKind,
    /// A `queue` agent's SQS queue URL, where its worker takes requests from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_url: Option<String>,
    /// Base URL: a step is `POST {url}/{step name}`. https (plain http only to a
    /// loopback host, and never for an agent with `auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// One call's timeout (each call is also bounded by the step's complete-by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Backoff between the calls of one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerDef>,
    /// A header sent on every call, its value read from Parameter Store or Secrets
    /// Manager and kept for 5 minutes. Needs the agent's own https `url`, and a secret
    /// goes to one host only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthDef>,
    /// At most this many calls in progress at once, across every container and every
    /// workflow that uses the agent (1 to 100). Work over it waits its turn, in arrival
    /// order, and counts no failure (`gate.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// At most this many calls started in any one-second window (1 to 100). An agent with
    /// it makes one request per dispatch: a transient failure is retried by the
    /// supervisor, through the gate, not in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<u32>,
}

impl AgentDef {
    /// The agent's flow-control limits; none set is an agent without a gate.
    pub fn limits(&self) -> crate::domain::gate::Limits {
        crate::domain::gate::Limits { max_in_flight: self.max_in_flight, max_per_second: self.max_per_second }
    }
}

/// `{"header": "Authorization", "secret": "ssm:/sas/payment/token", "prefix": "Bearer "}`:
/// every call of the agent carries `header: prefix + value`, the value read from where
/// `secret` says. The file names the secret, never holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AuthDef {
    /// The header's name, e.g. `Authorization` or `X-Api-Key`; not one sas sets itself
    /// (`Idempotency-Key`, `Content-Type`, `Content-Length`, `Host`, `Transfer-Encoding`,
    /// `Connection`).
    pub header: String,
    /// `ssm:NAME` (a Parameter Store parameter by name or ARN; a SecureString is read
    /// decrypted) or `secretsmanager:NAME-or-ARN` (a Secrets Manager secret's
    /// SecretString).
    pub secret: String,
    /// Put before the value, e.g. `Bearer ` (with its space); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

impl AuthDef {
    /// Where the value lives; `None` when `secret` does not parse (`check` reports it).
    pub fn source(&self) -> Option<SecretSource> {
        SecretSource::parse(&self.secret).ok()
    }
}

fn is_http(kind: &AgentKind) -> bool {
    *kind == AgentKind::Http
}

impl AgentDef {
    /// The queue a `queue` agent's requests go to.
    pub fn queue(&self) -> Option<&str> {
        match self.kind {
            AgentKind::Queue => self.queue_url.as_deref(),
            AgentKind::Http => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RetryDef {
    pub base_ms: u64,
    pub cap_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BreakerDef {
    /// Consecutive transient failures that open the circuit.
    pub failures: u32,
    /// How long it stays open before one probe call.
    pub open_ms: u64,
}

impl RetryDef {
    pub fn backoff(self) -> Backoff {
        Backoff { base_ms: self.base_ms, cap_ms: self.cap_ms }
    }
}

impl BreakerDef {
    pub fn policy(self) -> BreakerPolicy {
        BreakerPolicy { failure_threshold: self.failures, open_ms: self.open_ms }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One thing wrong with a file, located as precisely as the file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// `workflow NAME v1, step NAME, field` or `agent NAME, field` or the JSON position.
    pub at: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: {}: {}", self.at, self.message)
    }
}

/// The problems of a file that cannot be used (at least one error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Invalid(pub Vec<Problem>);

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
        Ok(Definitions { agents: file.agents, workflows: Workflows::new(file.workflows), warnings })
    }

    /// `examples/workflows.json`: the built-in workflows.
    pub fn example() -> Definitions {
        Definitions::parse(EXAMPLE).expect("examples/workflows.json is valid (tested)")
    }
}

/// The example file, compiled in: the default definitions.
pub const EXAMPLE: &str = include_str!("../../../examples/workflows.json");

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

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The remote service gets the order: https only, so it cannot be read or altered on the
/// way, except to a loopback host (local runs, `sasctl dev`'s simulated service). Never a
/// link-local address (169.254.0.0/16, fe80::/10, AWS's fd00:ec2::/32): that is where a
/// host's instance metadata and container credentials are served, never a business service.
pub fn remote_url_allowed(value: &str) -> bool {
    url::Url::parse(value).is_ok_and(|u| {
        !is_link_local(&u)
            && match u.scheme() {
                "https" => u.has_host(),
                "http" => match u.host() {
                    Some(url::Host::Domain(d)) => d == "localhost",
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    None => false,
                },
                _ => false,
            }
    })
}

fn is_link_local(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_link_local(),
        Some(url::Host::Ipv6(ip)) => {
            let s = ip.segments();
            (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0xfd00 && s[1] == 0x0ec2)
                // `[::ffff:169.254.169.254]` is the IPv4 address, written as IPv6.
                || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
        }
        _ => false,
    }
}

/// The host a secret sent to `url` reaches, as scheme, host and port (`https://pay.internal`,
/// `https://pay.internal:8443`): two URLs with the same one reach the same server.
fn secret_host(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.has_host().then(|| url.origin().ascii_serialization())
}

/// A queue URL in a form SQS (or a local endpoint) answers: scheme, host, and a path of
/// exactly `/<account>/<name>`.
fn queue_url_ok(value: &str) -> bool {
    let Ok(url) = url::Url::parse(value) else { return false };
    let path_ok = super::reply_to::QueueId::account_and_name(value).is_some();
    let scheme_ok = url.scheme() == "https" || remote_url_allowed(value);
    path_ok && scheme_ok && url.query().is_none() && url.username().is_empty()
}

impl DefinitionFile {
    /// The JSON as typed, or the first place it does not fit (serde's own message, cut:
    /// it may echo a long key).
    pub fn parse(text: &str) -> Result<DefinitionFile, Problem> {
        serde_json::from_str(text).map_err(|e| {
            // serde's text ends with the position `at` already gives.
            let text = e.to_string();
            let position = format!(" at line {} column {}", e.line(), e.column());
            let message = text.strip_suffix(&position).unwrap_or(&text).to_owned();
            Problem {
                severity: Severity::Error,
                at: format!("line {}, column {}", e.line(), e.column()),
                message: super::messages::cut_reason(message),
            }
        })
    }

    /// Every problem of the file, errors and warnings, in file order.
    pub fn check(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut error = |at: String, message: String| {
            out.push(Problem { severity: Severity::Error, at, message });
        };
        for (name, agent) in &self.agents {
            let at = |field: &str| format!("agent {name}, {field}");
            if !name_ok(name) {
                error(at("name"), format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _"));
            }
            match (agent.kind, &agent.queue_url) {
                (AgentKind::Queue, None) => error(at("queue_url"), "a queue agent needs its queue's URL".into()),
                (AgentKind::Queue, Some(q)) if !queue_url_ok(q) => error(
                    at("queue_url"),
                    "must be an SQS queue URL: https://sqs.<region>.amazonaws.com/<account>/<name> (or an endpoint's, for local runs)".into(),
                ),
                (AgentKind::Http, Some(_)) => {
                    error(at("queue_url"), "only a queue agent has one (set \"kind\": \"queue\")".into())
                }
                _ => {}
            }
            if agent.kind == AgentKind::Queue {
                let set: Vec<&str> = [
                    ("url", agent.url.is_some()),
                    ("timeout_ms", agent.timeout_ms.is_some()),
                    ("retry", agent.retry.is_some()),
                    ("breaker", agent.breaker.is_some()),
                    ("auth", agent.auth.is_some()),
                ]
                .into_iter()
                .filter_map(|(f, set)| set.then_some(f))
                .collect();
                if !set.is_empty() {
                    error(
                        at("kind"),
                        format!(
                            "a queue agent's worker makes its own calls: {} do not apply",
                            set.join(", ")
                        ),
                    );
                }
            }
            if let Some(url) = &agent.url
                && !remote_url_allowed(url)
            {
                error(at("url"), "must be an https URL (plain http only to a loopback host)".into());
            }
            // A secret goes only where its agent says, and only encrypted: not to the
            // deployment's REMOTE_SERVICE_URL (shared by every agent without a url, and
            // changed by whoever deploys), and not over plain http even to loopback (under
            // Lambda, loopback is the Runtime API's and extensions' address).
            if agent.auth.is_some() && agent.kind == AgentKind::Http {
                match agent.url.as_deref().map(url::Url::parse) {
                    None => error(
                        at("auth"),
                        "an agent with auth must name its own url: its secret goes only to the host \
                         that url names, never to the deployment's REMOTE_SERVICE_URL"
                            .into(),
                    ),
                    Some(Ok(url)) if url.scheme() != "https" => error(
                        at("auth"),
                        "an agent with auth must call over https: its secret is not sent over plain \
                         http, even to a loopback host"
                            .into(),
                    ),
                    _ => {}
                }
            }
            if let Some(t) = agent.timeout_ms
                && !(100..=MAX_STEP_TIMEOUT_MS).contains(&t)
            {
                error(at("timeout_ms"), format!("{t} is out of range: 100 to {MAX_STEP_TIMEOUT_MS}"));
            }
            if let Some(m) = agent.max_in_flight
                && !(1..=MAX_IN_FLIGHT_LIMIT).contains(&m)
            {
                error(at("max_in_flight"), format!("{m} is out of range: 1 to {MAX_IN_FLIGHT_LIMIT}"));
            }
            if let Some(m) = agent.max_per_second
                && !(1..=MAX_PER_SECOND_LIMIT).contains(&m)
            {
                error(
                    at("max_per_second"),
                    format!(
                        "{m} is out of range: 1 to {MAX_PER_SECOND_LIMIT} (each call writes the agent's gate \
                         item twice, and one item takes at most 1,000 writes a second)"
                    ),
                );
            }
            if let Some(r) = agent.retry
                && (r.base_ms == 0 || r.cap_ms < r.base_ms || r.cap_ms > MAX_STEP_TIMEOUT_MS)
            {
                error(
                    at("retry"),
                    format!("base_ms must be at least 1 and cap_ms from base_ms to {MAX_STEP_TIMEOUT_MS}"),
                );
            }
            if let Some(b) = agent.breaker
                && (b.failures == 0 || b.open_ms == 0 || b.open_ms > MAX_STEP_TIMEOUT_MS)
            {
                error(
                    at("breaker"),
                    format!("failures and open_ms must be at least 1, open_ms at most {MAX_STEP_TIMEOUT_MS}"),
                );
            }
            if let Some(auth) = &agent.auth {
                if !secrets::header_name_ok(&auth.header) {
                    error(
                        at("auth.header"),
                        format!(
                            "must be an HTTP header name: 1 to {} of A-Z a-z 0-9 !#$%&'*+-.^_`|~",
                            secrets::MAX_HEADER_NAME_LEN
                        ),
                    );
                } else if secrets::header_reserved(&auth.header) {
                    error(at("auth.header"), format!("{} is set by sas itself", auth.header));
                }
                if let Err(e) = SecretSource::parse(&auth.secret) {
                    error(at("auth.secret"), e.to_string());
                }
                if let Some(prefix) = &auth.prefix
                    && !secrets::prefix_ok(prefix)
                {
                    error(
                        at("auth.prefix"),
                        format!(
                            "must be at most {} printable characters or spaces (no line breaks)",
                            secrets::MAX_PREFIX_LEN
                        ),
                    );
                }
            }
        }
        // One secret, one host: a definition that hands the payment token to a second
        // host hands it to whoever runs that host.
        // Compared as the store knows the secret: its name and its ARN are one secret.
        let mut secret_hosts: BTreeMap<(&str, String), (&str, String)> = BTreeMap::new();
        for (name, agent) in &self.agents {
            let Some(source) = agent.auth.as_ref().and_then(AuthDef::source) else { continue };
            let Some(host) = agent.url.as_deref().and_then(secret_host) else { continue };
            match secret_hosts.get(&source.identity()) {
                Some((first, first_host)) if *first_host != host => error(
                    format!("agent {name}, auth.secret"),
                    format!(
                        "{source} is also agent {first}'s secret, sent to {first_host}: a secret goes to one host only, not also to {host}"
                    ),
                ),
                Some(_) => {}
                None => {
                    secret_hosts.insert(source.identity(), (name, host));
                }
            }
        }
        if self.workflows.is_empty() {
            error("workflows".into(), "at least one workflow is needed".into());
        }
        let mut latest: BTreeMap<&str, u32> = BTreeMap::new();
        let mut used_agents = BTreeSet::new();
        let mut warnings = Vec::new();
        for wf in &self.workflows {
            let wat = format!("workflow {} v{}", wf.name, wf.version);
            if !name_ok(&wf.name) {
                error(format!("{wat}, name"), format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _"));
            }
            if wf.version == 0 {
                error(format!("{wat}, version"), "must be at least 1".into());
            }
            // Versions of one workflow come in increasing order: a task runs the version
            // it was accepted under, new orders the last one.
            match latest.insert(wf.name.as_str(), wf.version) {
                Some(before) if before == wf.version => {
                    error(format!("{wat}, version"), "is defined twice".into())
                }
                Some(before) if before > wf.version => {
                    error(format!("{wat}, version"), format!("must be above v{before}, defined before it"))
                }
                _ => {}
            }
            if wf.steps.is_empty() || wf.steps.len() > MAX_STEPS {
                error(
                    format!("{wat}, steps"),
                    format!("must hold 1 to {MAX_STEPS} steps, not {}", wf.steps.len()),
                );
            }
            let mut names = BTreeSet::new();
            for stage in &wf.stages {
                let at = |field: &str| format!("{wat}, stage {}, {field}", stage.name);
                if !name_ok(&stage.name) {
                    error(at("name"), format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _"));
                }
                if wf.stages.iter().filter(|s| s.name == stage.name).count() > 1 {
                    error(at("name"), "is used by two stages".into());
                }
                if wf.steps.iter().any(|s| s.name == stage.name) {
                    error(at("name"), "is also a step's name".into());
                }
                match stage.len as usize {
                    0 => error(at("steps"), "is empty: a parallel stage needs 2 or more steps".into()),
                    1 => error(
                        at("steps"),
                        "has one step: a parallel stage needs 2 or more (write a lone step without \"parallel\")"
                            .into(),
                    ),
                    n if n > MAX_BRANCHES => error(
                        at("steps"),
                        format!("has {n} steps: a parallel stage holds at most {MAX_BRANCHES}"),
                    ),
                    _ => {}
                }
                for branch in &wf.steps[stage.start as usize..stage.end() as usize] {
                    if branch.is_timer() {
                        error(
                            at(&format!("step {}", branch.name)),
                            "a timer cannot run in a parallel stage: put it before or after the stage".into(),
                        );
                    }
                    if branch.is_callback() {
                        error(
                            at(&format!("step {}", branch.name)),
                            "a callback step cannot run in a parallel stage: put it before or after the stage"
                                .into(),
                        );
                    }
                    if self.agents.get(&branch.agent).is_some_and(|a| a.limits().any()) {
                        error(
                            at(&format!("step {}", branch.name)),
                            format!(
                                "agent {} has max_in_flight or max_per_second: a limited agent cannot \
                                 run in a parallel stage yet (put the step before or after the stage)",
                                branch.agent
                            ),
                        );
                    }
                }
            }
            for (i, step) in (0u32..).zip(&wf.steps) {
                let at = |field: &str| match wf.stage_of(i) {
                    Some(stage) => format!("{wat}, stage {}, step {}, {field}", stage.name, step.name),
                    None => format!("{wat}, step {}, {field}", step.name),
                };
                // A pivot among a stage's branches does not stand in the way of its
                // siblings' compensations: it may have been refused while they took effect.
                let pivot_before =
                    wf.pivot_before(wf.together(i).start).map(|p| wf.steps[p as usize].name.as_str());
                if !name_ok(&step.name) {
                    error(at("name"), format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _"));
                }
                if !names.insert(step.name.as_str()) {
                    error(at("name"), "is used by two steps".into());
                }
                if let Some(wait) = &step.wait {
                    for problem in timer_problems(wf, step, wait) {
                        error(at(problem.0), problem.1);
                    }
                    continue;
                }
                if step.agent.is_empty() {
                    error(at("agent"), "a step needs an agent (or a wait, to be a timer step)".into());
                } else if !self.agents.contains_key(&step.agent) {
                    let known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
                    error(
                        at("agent"),
                        format!("unknown agent {:?}; the file defines: {}", step.agent, known.join(", ")),
                    );
                }
                used_agents.insert(step.agent.as_str());
                if let Some(cb) = &step.callback {
                    for (field, why) in callback_problems(cb) {
                        error(at(field), why);
                    }
                }
                if let Some(c) = &step.compensation {
                    if !name_ok(c) {
                        error(at("compensation"), format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _"));
                    }
                    if wf.steps.iter().any(|s| &s.name == c && s.agent == step.agent) {
                        error(
                            at("compensation"),
                            format!(
                                "{c:?} is also a step of agent {}: the two calls would share a URL",
                                step.agent
                            ),
                        );
                    }
                    if step.effect == StepEffect::None {
                        error(at("effect"), "a step with no effect has nothing to compensate".into());
                    }
                    if let Some(pivot) = pivot_before {
                        warnings.push(Problem {
                            severity: Severity::Warning,
                            at: at("compensation"),
                            message: format!(
                                "never runs: once pivot step {pivot} took effect, giving up undoes nothing"
                            ),
                        });
                    }
                }
                if let Some(t) = step.timeout_ms
                    && !(MIN_STEP_TIMEOUT_MS..=MAX_STEP_TIMEOUT_MS).contains(&t)
                {
                    error(
                        at("timeout_ms"),
                        format!("{t} is out of range: {MIN_STEP_TIMEOUT_MS} to {MAX_STEP_TIMEOUT_MS}"),
                    );
                }
                if let Some(n) = step.max_failures
                    && !(1..=MAX_FAILURES).contains(&n)
                {
                    error(at("max_failures"), format!("{n} is out of range: 1 to {MAX_FAILURES}"));
                }
            }
        }
        for name in self.agents.keys().filter(|a| !used_agents.contains(a.as_str())) {
            warnings.push(Problem {
                severity: Severity::Warning,
                at: format!("agent {name}"),
                message: "no step uses it".into(),
            });
        }
        out.extend(warnings);
        out
    }
}

/// The order's fields, as a `$.order.<key>` path may name them (`messages.rs`'s `Order`;
/// a test holds the two to each other).
const ORDER_FIELDS: [&str; 5] = ["order_id", "customer_id", "items", "workflow", "workflow_version"];

/// What is wrong with a timer step, by field: a timer calls nothing, undoes nothing and
/// cannot fail, and waits for a length in range or until a time an earlier agent step
/// (or the order) gives.
fn timer_problems(wf: &Workflow, step: &Step, wait: &Wait) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let not_for_timer = "does not apply to a timer step: it calls nothing and cannot fail";
    if !step.agent.is_empty() {
        out.push(("agent", "a timer step calls no agent: remove agent or wait".to_owned()));
    }
    if step.compensation.is_some() {
        out.push(("compensation", "a timer step has nothing to undo".to_owned()));
    }
    if step.effect != StepEffect::Writes {
        out.push(("effect", "does not apply to a timer step: it changes nothing".to_owned()));
    }
    if step.timeout_ms.is_some() {
        out.push(("timeout_ms", not_for_timer.to_owned()));
    }
    if step.max_failures.is_some() {
        out.push(("max_failures", not_for_timer.to_owned()));
    }
    if step.callback.is_some() {
        out.push((
            "callback",
            "a timer step waits for its time, not for the outside: remove wait or callback".to_owned(),
        ));
    }
    match (wait.for_ms, &wait.until) {
        (Some(_), Some(_)) => out.push(("wait", "set for_ms or until, not both".to_owned())),
        (None, None) => out.push(("wait", "needs for_ms (how long) or until (a path to a time)".to_owned())),
        (Some(ms), None) if !(MIN_WAIT_MS..=MAX_WAIT_MS).contains(&ms) => out.push((
            "wait.for_ms",
            format!("{ms} is out of range: {MIN_WAIT_MS} (1 s) to {MAX_WAIT_MS} (366 days)"),
        )),
        (Some(_), None) => {}
        (None, Some(path)) => match WaitPath::parse(path) {
            Err(e) => out.push(("wait.until", e.to_string())),
            Ok(WaitPath::Order(keys)) if !ORDER_FIELDS.contains(&keys[0].as_str()) => out.push((
                "wait.until",
                format!("the order has no field {:?}; it has: {}", keys[0], ORDER_FIELDS.join(", ")),
            )),
            Ok(WaitPath::Order(_)) => {}
            Ok(WaitPath::Output { step: named, .. }) => {
                let this = wf.steps.iter().position(|s| s.name == step.name);
                let earlier = wf.steps.iter().position(|s| s.name == named).filter(|&i| Some(i) < this);
                match earlier.map(|i| &wf.steps[i]) {
                    None => out.push((
                        "wait.until",
                        format!("names step {named:?}, which is not an earlier step of this workflow"),
                    )),
                    Some(s) if s.is_timer() => {
                        out.push(("wait.until", format!("names timer step {named:?}, which has no output")))
                    }
                    Some(_) => {}
                }
            }
        },
    }
    out
}

/// What is wrong with a callback step's timeout and heartbeat, by field.
fn callback_problems(cb: &Callback) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let range = |ms: u64| (MIN_CALLBACK_MS..=MAX_CALLBACK_MS).contains(&ms);
    if !range(cb.timeout_ms) {
        out.push((
            "callback.timeout_ms",
            format!(
                "{} is out of range: {MIN_CALLBACK_MS} (1 s) to {MAX_CALLBACK_MS} (366 days)",
                cb.timeout_ms
            ),
        ));
    }
    match cb.heartbeat_ms {
        Some(ms) if !range(ms) => out.push((
            "callback.heartbeat_ms",
            format!("{ms} is out of range: {MIN_CALLBACK_MS} (1 s) to the callback's timeout_ms"),
        )),
        Some(ms) if ms > cb.timeout_ms => out.push((
            "callback.heartbeat_ms",
            format!(
                "{ms} is longer than the callback's timeout_ms ({}): it could never be missed",
                cb.timeout_ms
            ),
        )),
        _ => {}
    }
    out
}

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
    use crate::domain::workflow::StepKind;

    fn problems(text: &str) -> Vec<String> {
        match DefinitionFile::parse(text) {
            Ok(file) => file.check().iter().map(ToString::to_string).collect(),
            Err(p) => vec![p.to_string()],
        }
    }

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

    #[test]
    fn every_problem_is_named_with_its_workflow_step_and_field() {
        let text = r#"{"agents": {"a": {"url": "http://example.com"}, "unused": {}},
          "workflows": [
            {"name": "w", "steps": [
               {"name": "s", "agent": "nope"},
               {"name": "s", "agent": "a", "timeout_ms": 10},
               {"name": "t", "agent": "a", "max_failures": 0, "compensation": "t"},
               {"name": "r", "agent": "a", "effect": "none", "compensation": "undo-r"}]},
            {"name": "w", "steps": []}]}"#;
        let got = problems(text);
        let want = [
            "error: agent a, url: must be an https URL (plain http only to a loopback host)",
            r#"error: workflow w v1, step s, agent: unknown agent "nope"; the file defines: a, unused"#,
            "error: workflow w v1, step s, name: is used by two steps",
            "error: workflow w v1, step s, timeout_ms: 10 is out of range: 1000 to 50000",
            r#"error: workflow w v1, step t, compensation: "t" is also a step of agent a: the two calls would share a URL"#,
            "error: workflow w v1, step t, max_failures: 0 is out of range: 1 to 100",
            "error: workflow w v1, step r, effect: a step with no effect has nothing to compensate",
            "error: workflow w v1, version: is defined twice",
            "error: workflow w v1, steps: must hold 1 to 20 steps, not 0",
            "warning: workflow w v1, step t, compensation: never runs: once pivot step s took effect, giving up undoes nothing",
            "warning: workflow w v1, step r, compensation: never runs: once pivot step s took effect, giving up undoes nothing",
            "warning: agent unused: no step uses it",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w:?} in {got:#?}");
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        assert!(Definitions::parse(text).is_err());
    }

    #[test]
    fn timer_steps_wait_for_a_length_or_until_a_time_from_an_earlier_step() {
        let text = r#"{"agents": {"pay": {}, "ship": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "charge", "agent": "pay", "compensation": "refund"},
            {"name": "cool-off", "wait": {"for_ms": 86400000}},
            {"name": "hold", "wait": {"until": "$.steps.charge.output.release_at"}},
            {"name": "by", "wait": {"until": "$.order.customer_id"}},
            {"name": "ship", "agent": "ship"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let wf = d.workflows.get("w").unwrap();
        assert_eq!(wf.step(1).unwrap().wait, Some(Wait::for_ms(86_400_000)));
        assert_eq!(wf.step(1).unwrap().kind(), StepKind::ReadOnly);
        // The longest wait is a year and a day; the shortest a second.
        for ms in [MIN_WAIT_MS, MAX_WAIT_MS] {
            let ok = text.replace("86400000", &ms.to_string());
            assert!(Definitions::parse(&ok).is_ok(), "{ms}");
        }
        const { assert!(MAX_WAIT_MS >= 365 * 24 * 3_600_000) };
    }

    #[test]
    fn callback_steps_need_an_agent_and_a_timeout_in_range() {
        let text = r#"{"agents": {"approvals": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "approve", "agent": "approvals", "compensation": "withdraw",
             "callback": {"timeout_ms": 604800000, "heartbeat_ms": 3600000}}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        let step = d.workflows.get("w").unwrap().step(0).unwrap();
        assert_eq!(step.callback, Some(Callback { timeout_ms: 604_800_000, heartbeat_ms: Some(3_600_000) }));
        let bad = r#"{"agents": {"approvals": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "short", "agent": "approvals", "callback": {"timeout_ms": 999}},
            {"name": "long", "agent": "approvals", "callback": {"timeout_ms": 31622400001}},
            {"name": "beat", "agent": "approvals", "callback": {"timeout_ms": 5000, "heartbeat_ms": 6000}},
            {"name": "tick", "agent": "approvals", "callback": {"timeout_ms": 5000, "heartbeat_ms": 10}},
            {"name": "both", "wait": {"for_ms": 5000}, "callback": {"timeout_ms": 5000}},
            {"name": "nobody", "callback": {"timeout_ms": 5000}}]}]}"#;
        let got = problems(bad);
        let want = [
            "error: workflow w v1, step short, callback.timeout_ms: 999 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step long, callback.timeout_ms: 31622400001 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step beat, callback.heartbeat_ms: 6000 is longer than the callback's timeout_ms (5000): it could never be missed",
            "error: workflow w v1, step tick, callback.heartbeat_ms: 10 is out of range: 1000 (1 s) to the callback's timeout_ms",
            "error: workflow w v1, step both, callback: a timer step waits for its time, not for the outside: remove wait or callback",
            "error: workflow w v1, step nobody, agent: a step needs an agent (or a wait, to be a timer step)",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w:?} in {got:#?}");
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        // A callback with no timeout is one clear line too.
        let none = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "s", "agent": "a", "callback": {"heartbeat_ms": 5000}}]}]}"#;
        let e = Definitions::parse(none).unwrap_err().to_string();
        assert!(e.contains("missing field `timeout_ms`"), "{e}");
    }

    #[test]
    fn every_problem_of_a_timer_step_is_one_located_line() {
        let text = r#"{"agents": {"pay": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "early", "wait": {"until": "$.steps.charge.output.at"}},
            {"name": "charge", "agent": "pay"},
            {"name": "both", "wait": {"for_ms": 5000, "until": "$.order.customer_id"}},
            {"name": "neither", "wait": {}},
            {"name": "short", "wait": {"for_ms": 999}},
            {"name": "long", "wait": {"for_ms": 31622400001}},
            {"name": "agented", "agent": "pay", "compensation": "undo", "timeout_ms": 5000, "max_failures": 2, "effect": "none", "wait": {"for_ms": 5000}},
            {"name": "syntax", "wait": {"until": "$.steps.charge.output[0]"}},
            {"name": "unknown", "wait": {"until": "$.steps.nope.output.at"}},
            {"name": "on-timer", "wait": {"until": "$.steps.short.output.at"}},
            {"name": "no-field", "wait": {"until": "$.order.ship_by"}},
            {"name": "nothing"}]}]}"#;
        let got = problems(text);
        let want = [
            r#"error: workflow w v1, step early, wait.until: names step "charge", which is not an earlier step of this workflow"#,
            "error: workflow w v1, step both, wait: set for_ms or until, not both",
            "error: workflow w v1, step neither, wait: needs for_ms (how long) or until (a path to a time)",
            "error: workflow w v1, step short, wait.for_ms: 999 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step long, wait.for_ms: 31622400001 is out of range: 1000 (1 s) to 31622400000 (366 days)",
            "error: workflow w v1, step agented, agent: a timer step calls no agent: remove agent or wait",
            "error: workflow w v1, step agented, compensation: a timer step has nothing to undo",
            "error: workflow w v1, step agented, effect: does not apply to a timer step: it changes nothing",
            "error: workflow w v1, step agented, timeout_ms: does not apply to a timer step: it calls nothing and cannot fail",
            "error: workflow w v1, step agented, max_failures: does not apply to a timer step: it calls nothing and cannot fail",
            r#"error: workflow w v1, step syntax, wait.until: "$.steps.charge.output[0]" is not a path: write $.order.<key>(.<key>)* or $.steps.<step name>.output.<key>(.<key>)*, each key 1 to 64 of A-Z a-z 0-9 - _"#,
            r#"error: workflow w v1, step unknown, wait.until: names step "nope", which is not an earlier step of this workflow"#,
            r#"error: workflow w v1, step on-timer, wait.until: names timer step "short", which has no output"#,
            r#"error: workflow w v1, step no-field, wait.until: the order has no field "ship_by"; it has: order_id, customer_id, items, workflow, workflow_version"#,
            "error: workflow w v1, step nothing, agent: a step needs an agent (or a wait, to be a timer step)",
        ];
        assert_eq!(got, want, "{got:#?}");
        // A wait with an unknown key is refused by the parser, located.
        let got = problems(
            r#"{"agents": {}, "workflows": [{"name": "w", "steps": [{"name": "t", "wait": {"for": 5}}]}]}"#,
        );
        assert!(got.len() == 1 && got[0].contains("unknown field `for`"), "{got:?}");
    }

    #[test]
    fn the_order_fields_a_path_may_name_are_the_orders() {
        let order = super::super::messages::Order {
            order_id: super::super::ids::OrderId::parse("o").unwrap(),
            customer_id: "c".into(),
            items: vec![],
            workflow: "w".into(),
            workflow_version: Some(1),
        };
        let value = serde_json::to_value(order).unwrap();
        let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = ORDER_FIELDS.to_vec();
        want.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, want);
    }

    #[test]
    fn a_compensable_step_after_a_pivot_is_a_warning_not_an_error() {
        let text = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "ship", "agent": "a"}, {"name": "invoice", "agent": "a", "compensation": "void"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    }

    #[test]
    fn unknown_keys_and_bad_json_are_one_located_error() {
        let got = problems(
            r#"{"agents": {}, "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a", "compensate": "x"}]}]}"#,
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with("error: line 1, column "), "{got:?}");
        assert!(got[0].contains("unknown field `compensate`"), "{got:?}");
        let got = problems("{");
        assert!(got[0].contains("EOF"), "{got:?}");
    }

    /// serde's message carries the position itself; the problem names it once, in `at`.
    #[test]
    fn a_json_error_gives_its_position_once() {
        assert_eq!(problems(r#"{"agents": {"#), ["error: line 1, column 12: EOF while parsing an object"]);
        let unknown = problems("{\n  \"agents\": {},\n  \"workflow\": []\n}");
        assert_eq!(
            unknown,
            [
                "error: line 3, column 12: unknown field `workflow`, expected one of `$schema`, `agents`, `workflows`"
            ]
        );
    }

    #[test]
    fn versions_of_a_workflow_increase_and_new_orders_get_the_latest() {
        let text = r#"{"agents": {"a": {}}, "workflows": [
            {"name": "w", "version": 1, "steps": [{"name": "s", "agent": "a"}]},
            {"name": "other", "steps": [{"name": "s", "agent": "a"}]},
            {"name": "w", "version": 2, "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "a"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert_eq!(d.workflows.names(), ["w", "other"]);
        assert_eq!(d.workflows.default_workflow().version, 2);
        assert_eq!(d.workflows.get("w").unwrap().len(), 2);
        assert_eq!(d.workflows.get_version("w", 1).unwrap().len(), 1);
        assert!(d.workflows.get_version("w", 3).is_none());

        let backwards =
            text.replace(r#""version": 2"#, r#""version": 0"#).replace(r#""version": 1"#, r#""version": 3"#);
        let got = problems(&backwards);
        assert!(got.iter().any(|p| p == "error: workflow w v0, version: must be at least 1"), "{got:?}");
        assert!(
            got.iter().any(|p| p == "error: workflow w v0, version: must be above v3, defined before it"),
            "{got:?}"
        );
    }

    #[test]
    fn a_queue_agent_names_its_queue_and_nothing_the_agent_function_would_use() {
        let ok = r#"{"agents": {"mail": {"kind": "queue", "queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/mail"}},
            "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "mail"}]}]}"#;
        let d = Definitions::parse(ok).unwrap();
        assert_eq!(d.agents["mail"].queue(), Some("https://sqs.eu-west-1.amazonaws.com/123456789012/mail"));
        let got = problems(
            r#"{"agents": {"a": {"kind": "queue"}, "b": {"kind": "queue", "queue_url": "https://example.com/x", "timeout_ms": 500},
                           "c": {"queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/c"}},
                "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "b"}, {"name": "u", "agent": "c"}]}]}"#,
        );
        let want = [
            "error: agent a, queue_url: a queue agent needs its queue's URL",
            "error: agent b, queue_url: must be an SQS queue URL: https://sqs.<region>.amazonaws.com/<account>/<name> (or an endpoint's, for local runs)",
            "error: agent b, kind: a queue agent's worker makes its own calls: timeout_ms do not apply",
            r#"error: agent c, queue_url: only a queue agent has one (set "kind": "queue")"#,
        ];
        assert_eq!(got, want);
    }

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

    #[test]
    fn an_agents_auth_names_a_header_and_where_its_value_lives() {
        let text = r#"{"agents": {
            "payment": {"url": "https://pay.internal/sas",
                        "auth": {"header": "Authorization", "secret": "ssm:/sas/payment/token", "prefix": "Bearer "}},
            "inventory": {"url": "https://inventory.internal/sas",
                          "auth": {"header": "X-Api-Key", "secret": "secretsmanager:inventory-key"}}},
          "workflows": [{"name": "w", "steps": [{"name": "charge", "agent": "payment"}, {"name": "reserve", "agent": "inventory"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        let auth = d.agents["payment"].auth.as_ref().unwrap();
        assert_eq!(auth.source(), Some(SecretSource::Ssm("/sas/payment/token".into())));
        assert_eq!(auth.prefix.as_deref(), Some("Bearer "));
        let auth = d.agents["inventory"].auth.as_ref().unwrap();
        assert_eq!(auth.source(), Some(SecretSource::SecretsManager("inventory-key".into())));
        assert_eq!(auth.prefix, None);
    }

    #[test]
    fn a_bad_auth_is_one_located_error_per_field() {
        let text = r#"{"agents": {
            "a": {"url": "https://a.example", "auth": {"header": "X Api Key", "secret": "vault:kv/token", "prefix": "Bearer\r\n"}},
            "b": {"url": "https://b.example", "auth": {"header": "idempotency-key", "secret": "ssm:"}},
            "c": {"url": "https://c.example", "auth": {"header": "Authorization", "secret": "secretsmanager:has space"}}},
          "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "b"}, {"name": "u", "agent": "c"}]}]}"#;
        let got = problems(text);
        let want = [
            "error: agent a, auth.header: must be an HTTP header name: 1 to 128 of A-Z a-z 0-9 !#$%&'*+-.^_`|~",
            "error: agent a, auth.secret: must be ssm:NAME (Parameter Store) or secretsmanager:NAME-or-ARN (Secrets Manager)",
            "error: agent a, auth.prefix: must be at most 64 printable characters or spaces (no line breaks)",
            "error: agent b, auth.header: idempotency-key is set by sas itself",
            "error: agent b, auth.secret: the name after the store must be 1 to 2048 printable characters, no spaces",
            "error: agent c, auth.secret: the name after the store must be 1 to 2048 printable characters, no spaces",
        ];
        assert_eq!(got, want, "{got:#?}");
        // The value has no place in the file: an unknown key is refused, not ignored.
        let got = problems(
            r#"{"agents": {"a": {"auth": {"header": "Authorization", "secret": "ssm:/t", "value": "s3cr3t"}}},
                "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a"}]}]}"#,
        );
        assert!(got.len() == 1 && got[0].contains("unknown field `value`"), "{got:?}");
    }

    /// Issue 24, finding 4: a secret goes only over https, only to the host its own agent
    /// names, and one secret to one host.
    #[test]
    fn a_secret_goes_only_over_https_to_the_host_its_agent_names() {
        let file = |agents: &str| {
            format!(
                r#"{{"agents": {{{agents}}}, "workflows": [{{"name": "w", "steps": [{{"name": "s", "agent": "a"}}]}}]}}"#
            )
        };
        let auth = |secret: &str| format!(r#""auth": {{"header": "Authorization", "secret": "{secret}"}}"#);
        let pay = auth("ssm:/sas/pay");
        let got = problems(&file(&format!(
            r#""a": {{"url": "http://127.0.0.1:3000", {pay}}}, "b": {{"url": "http://pay.example", {pay}}},
               "c": {{{pay}}}"#
        )));
        let https = "an agent with auth must call over https: its secret is not sent over plain http, even to a loopback host";
        let own = "an agent with auth must name its own url: its secret goes only to the host that url names, never to the deployment's REMOTE_SERVICE_URL";
        let want = [
            format!("error: agent a, auth: {https}"),
            "error: agent b, url: must be an https URL (plain http only to a loopback host)".into(),
            format!("error: agent b, auth: {https}"),
            format!("error: agent c, auth: {own}"),
            "error: agent b, auth.secret: ssm:/sas/pay is also agent a's secret, sent to http://127.0.0.1:3000: a secret goes to one host only, not also to http://pay.example".into(),
            "warning: agent b: no step uses it".into(),
            "warning: agent c: no step uses it".into(),
        ];
        assert_eq!(got, want, "{got:#?}");

        // One secret to two hosts (another port is another server); to one host by two
        // agents, or two secrets to two hosts, is fine.
        let got = problems(&file(&format!(
            r#""a": {{"url": "https://pay.example/v1", {pay}}}, "b": {{"url": "https://pay.example/v2/", {pay}}},
               "c": {{"url": "https://evil.example", {pay}}}, "d": {{"url": "https://pay.example:8443", {pay}}},
               "e": {{"url": "https://other.example", {}}}"#,
            auth("ssm:/sas/other")
        )));
        let errors: Vec<&String> = got.iter().filter(|p| p.starts_with("error")).collect();
        assert_eq!(
            errors,
            [
                "error: agent c, auth.secret: ssm:/sas/pay is also agent a's secret, sent to https://pay.example: a secret goes to one host only, not also to https://evil.example",
                "error: agent d, auth.secret: ssm:/sas/pay is also agent a's secret, sent to https://pay.example: a secret goes to one host only, not also to https://pay.example:8443",
            ],
            "{got:#?}"
        );
        // The same secret by its ARN is the same secret.
        let by_arn = auth("ssm:arn:aws:ssm:us-east-1:123456789012:parameter/sas/pay");
        let got = problems(&file(&format!(
            r#""a": {{"url": "https://pay.example", {pay}}}, "b": {{"url": "https://evil.example", {by_arn}}}"#
        )));
        assert!(
            got.iter().any(|p| p.starts_with("error: agent b, auth.secret:") && p.contains("evil.example")),
            "{got:#?}"
        );
        // Without auth, an agent may still use the deployment's URL, or loopback http.
        assert!(Definitions::parse(&file(r#""a": {}, "b": {"url": "http://127.0.0.1:3000"}"#)).is_ok());
    }

    #[test]
    fn on_give_up_fail_never_compensates() {
        let text = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "on_give_up": "fail", "steps": [
            {"name": "s", "agent": "a", "compensation": "undo-s"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert!(!d.workflows.get("w").unwrap().compensates());
    }

    /// Instance metadata and container credentials live on link-local addresses: no agent
    /// may call there, over https or http.
    #[test]
    fn a_link_local_address_is_never_a_remote_service() {
        for bad in [
            "https://169.254.169.254/latest/meta-data",
            "http://169.254.170.2/v2/credentials",
            "https://[fe80::1]/x",
            "https://[fd00:ec2::254]/latest",
            "https://[::ffff:169.254.169.254]/latest/meta-data",
        ] {
            assert!(!remote_url_allowed(bad), "{bad}");
        }
        for ok in [
            "https://pay.example/sas",
            "https://10.0.0.5/sas",
            "http://127.0.0.1:3000",
            "https://[fd00:1::1]/x",
        ] {
            assert!(remote_url_allowed(ok), "{ok}");
        }
    }

    #[test]
    fn a_parallel_stage_is_read_and_its_problems_are_named_one_line_each() {
        let agents = r#""agents": {"a": {"url": "https://a.example"}, "b": {"url": "https://b.example"}}"#;
        let ok = format!(
            r#"{{{agents}, "workflows": [{{"name": "w", "steps": [
                {{"name": "check", "agent": "a", "effect": "none"}},
                {{"parallel": {{"name": "reserve-all", "steps": [
                    {{"name": "reserve-a", "agent": "a", "compensation": "release-a"}},
                    {{"name": "reserve-b", "agent": "b", "compensation": "release-b"}}]}}}},
                {{"name": "ship", "agent": "a"}}]}}]}}"#
        );
        assert_eq!(problems(&ok), Vec::<String>::new());
        let file = DefinitionFile::parse(&ok).unwrap();
        let wf = &file.workflows[0];
        assert_eq!(wf.steps.len(), 4);
        assert_eq!((wf.stages[0].name.as_str(), wf.stages[0].start, wf.stages[0].len), ("reserve-all", 1, 2));
        // The stage's own lines (an empty workflow and an unused agent are told apart).
        let stage = |steps: &str| {
            let all = problems(&format!(
                r#"{{{agents}, "workflows": [{{"name": "w", "steps": [{{"parallel": {{"name": "st", "steps": [{steps}]}}}}]}}]}}"#
            ));
            all.into_iter()
                .filter(|p| p.contains("stage st") || p.contains("unknown field"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            stage(""),
            ["error: workflow w v1, stage st, steps: is empty: a parallel stage needs 2 or more steps"]
        );
        assert_eq!(
            stage(r#"{"name": "x", "agent": "a"}"#),
            [
                r#"error: workflow w v1, stage st, steps: has one step: a parallel stage needs 2 or more (write a lone step without "parallel")"#
            ]
        );
        assert_eq!(MAX_BRANCHES, 10, "the schema's bound on a stage's steps (workflow.rs) says 10");
        let eleven: Vec<String> = (0..11).map(|i| format!(r#"{{"name": "s{i}", "agent": "a"}}"#)).collect();
        assert_eq!(
            stage(&eleven.join(",")),
            [format!(
                "error: workflow w v1, stage st, steps: has 11 steps: a parallel stage holds at most {MAX_BRANCHES}"
            )]
        );
        assert_eq!(
            stage(r#"{"name": "x", "agent": "a"}, {"name": "x", "agent": "b"}"#),
            ["error: workflow w v1, stage st, step x, name: is used by two steps"]
        );
        assert_eq!(
            stage(r#"{"name": "x", "agent": "a"}, {"name": "wait", "wait": {"for_ms": 5000}}"#),
            [
                "error: workflow w v1, stage st, step wait: a timer cannot run in a parallel stage: put it before or after the stage"
            ]
        );
        assert_eq!(
            stage(
                r#"{"name": "x", "agent": "a"}, {"name": "y", "agent": "b", "callback": {"timeout_ms": 5000}}"#
            ),
            [
                "error: workflow w v1, stage st, step y: a callback step cannot run in a parallel stage: put it before or after the stage"
            ]
        );
        // A branch's own typo is reported as the step's error, not as "no variant matched".
        let typo = stage(r#"{"name": "x", "agent": "a"}, {"name": "y", "agnet": "b"}"#);
        assert!(typo[0].contains("unknown field `agnet`"), "{typo:?}");
        let typo = stage(r#"{"name": "x", "agent": "a"}], "extra": 1, "z": [{"name": "y", "agent": "b"}"#);
        assert!(typo[0].contains("unknown field `extra`"), "{typo:?}");
    }

    #[test]
    fn a_pivot_branch_does_not_silence_its_siblings_compensations() {
        let text = r#"{"agents": {"a": {"url": "https://a.example"}},
          "workflows": [{"name": "w", "steps": [
            {"parallel": {"name": "st", "steps": [
               {"name": "notify", "agent": "a"},
               {"name": "reserve", "agent": "a", "compensation": "release"}]}},
            {"name": "charge", "agent": "a", "compensation": "refund"}]}]}"#;
        let got = problems(text);
        assert_eq!(
            got,
            [
                "warning: workflow w v1, step charge, compensation: never runs: once pivot step notify took effect, giving up undoes nothing"
            ]
        );
    }
}
