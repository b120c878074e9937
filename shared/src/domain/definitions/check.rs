//! Every problem of a file at once, each naming its agent, or its workflow, stage, step
//! and field, so `sasctl workflows validate` and a function's cold start can both say
//! exactly what is wrong.

use std::collections::{BTreeMap, BTreeSet};

use super::file::{AgentKind, AuthDef, DefinitionFile};
use super::limits::{
    MAX_BRANCHES, MAX_FAILURES, MAX_MAX_THROTTLED_MS, MAX_NAME_LEN, MAX_STEP_TIMEOUT_MS, MAX_STEPS,
    MIN_MAX_THROTTLED_MS, MIN_STEP_TIMEOUT_MS, name_ok,
};
use super::problem::{Problem, Severity};
use super::urls::{queue_url_ok, remote_url_allowed, secret_host};
use super::waiting_steps::{callback_problems, timer_problems};
use crate::domain::gate::{MAX_IN_FLIGHT_LIMIT, MAX_PER_KEY_LIMIT, MAX_PER_SECOND_LIMIT, OrderKey};
use crate::domain::map::{ItemsPath, MAX_MAP_CONCURRENCY, MAX_MAP_ITEMS, MapStep};
use crate::domain::secrets::{self, SecretSource};
use crate::domain::workflow::{StepEffect, Workflow};

impl DefinitionFile {
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
                error(at("max_per_second"), format!("{m} is out of range: 1 to {MAX_PER_SECOND_LIMIT}"));
            }
            if let Some(p) = &agent.max_in_flight_per_key {
                let at = at("max_in_flight_per_key");
                if OrderKey::parse(&p.key).is_none() {
                    let paths: Vec<&str> = OrderKey::ALL.iter().map(|(_, p)| *p).collect();
                    error(
                        format!("{at}.key"),
                        format!("{:?} is not a key: write one of {}", p.key, paths.join(", ")),
                    );
                }
                if !(1..=MAX_PER_KEY_LIMIT).contains(&p.limit) {
                    error(
                        format!("{at}.limit"),
                        format!("{} is out of range: 1 to {MAX_PER_KEY_LIMIT}", p.limit),
                    );
                }
                if agent.max_in_flight.is_none() && agent.max_per_second.is_none() {
                    error(
                        at,
                        "needs max_in_flight or max_per_second on the agent: a key's places are taken \
                         on the way to the agent's"
                            .into(),
                    );
                }
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
                }
                // The stage's claim holds one place for all its branches' calls: room for
                // more than one could be found at once only by taking places one by one,
                // and a stage holding some while it waits for the rest could starve others.
                let limited: Vec<&crate::domain::workflow::Step> = wf.steps
                    [stage.start as usize..stage.end() as usize]
                    .iter()
                    .filter(|b| self.agents.get(&b.agent).is_some_and(|a| a.limits().any()))
                    .collect();
                if let [_, second, ..] = limited[..] {
                    error(
                        at(&format!("step {}", second.name)),
                        format!(
                            "agent {} has limits, and so does step {}'s agent {}: at most one branch of a \
                             parallel stage may call a limited agent (put the others before or after the stage)",
                            second.agent, limited[0].name, limited[0].agent
                        ),
                    );
                }
            }
            for map in &wf.maps {
                for (field, why) in map_problems(wf, map) {
                    error(format!("{wat}, map {}, {field}", map.name), why);
                }
                // A task holds one place in a gate at a time (`MapStep::gated`).
                let agent = wf.step(map.at).map(|s| s.agent.as_str()).unwrap_or_default();
                if map.max_concurrency > 1 && self.agents.get(agent).is_some_and(|a| a.limits().any()) {
                    warnings.push(Problem {
                        severity: Severity::Warning,
                        at: format!("{wat}, map {}, max_concurrency", map.name),
                        message: format!(
                            "agent {agent} has limits, so the map's items take places in its gate one at a \
                             time: {} is never reached (set it to 1)",
                            map.max_concurrency
                        ),
                    });
                }
            }
            for (i, step) in (0u32..).zip(&wf.steps) {
                let at = |field: &str| match (wf.stage_of(i), wf.map_at(i)) {
                    (Some(stage), _) => format!("{wat}, stage {}, step {}, {field}", stage.name, step.name),
                    (_, Some(map)) => format!("{wat}, map {}, step {}, {field}", map.name, step.name),
                    _ => format!("{wat}, step {}, {field}", step.name),
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
                if let Some(t) = step.max_throttled_ms
                    && !(MIN_MAX_THROTTLED_MS..=MAX_MAX_THROTTLED_MS).contains(&t)
                {
                    error(
                        at("max_throttled_ms"),
                        format!("{t} is out of range: {MIN_MAX_THROTTLED_MS} to {MAX_MAX_THROTTLED_MS}"),
                    );
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

/// A map step's own problems, as (field, why): its name, items, cap and tolerance, and
/// what its step may be (an agent step, without a timer or a callback).
fn map_problems(wf: &Workflow, map: &MapStep) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if !name_ok(&map.name) {
        out.push(("name", format!("must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _")));
    }
    let taken = wf.steps.iter().map(|s| &s.name).chain(wf.stages.iter().map(|s| &s.name));
    if taken.chain(wf.maps.iter().filter(|m| m.at != map.at).map(|m| &m.name)).any(|n| *n == map.name) {
        out.push(("name", "is also the name of a step, stage or other map".into()));
    }
    if wf.maps.first().is_some_and(|first| first.at != map.at) {
        out.push((
            "map",
            "a workflow holds one map: its outputs take the room of many steps' in the record".into(),
        ));
    }
    match ItemsPath::parse(&map.items) {
        Err(why) => out.push(("items", why)),
        Ok(path) => {
            // The step must answer before the map starts, and with an output: a timer has none.
            match path.step().map(|step| (step, wf.steps[..map.at as usize].iter().find(|s| s.name == step)))
            {
                Some((step, None)) => out.push((
                    "items",
                    format!(
                        "{step:?} names no step before the map: items come from an earlier step's output"
                    ),
                )),
                Some((step, Some(s))) if s.is_timer() => {
                    out.push(("items", format!("names timer step {step:?}, which has no output")))
                }
                _ => {}
            }
        }
    }
    if !(1..=MAX_MAP_CONCURRENCY).contains(&map.max_concurrency) {
        out.push((
            "max_concurrency",
            format!("{} is out of range: 1 to {MAX_MAP_CONCURRENCY}", map.max_concurrency),
        ));
    }
    if map.tolerated_failures as usize > MAX_MAP_ITEMS {
        out.push((
            "tolerated_failures",
            format!("{} is out of range: 0 to {MAX_MAP_ITEMS}", map.tolerated_failures),
        ));
    }
    if let Some(step) = wf.step(map.at) {
        if step.is_timer() {
            out.push(("step", "a timer cannot be a map's step: put it before or after the map".into()));
        }
        if step.is_callback() {
            out.push((
                "step",
                "a callback step cannot be a map's step: put it before or after the map".into(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Definitions;

    fn problems(text: &str) -> Vec<String> {
        match DefinitionFile::parse(text) {
            Ok(file) => file.check().iter().map(ToString::to_string).collect(),
            Err(p) => vec![p.to_string()],
        }
    }

    #[test]
    fn a_per_key_limit_names_a_scalar_field_of_the_order_and_needs_the_agents_limits() {
        let text = r#"{"agents": {
            "a": {"max_in_flight": 4, "max_in_flight_per_key": {"key": "$.order.customer_id", "limit": 1}},
            "b": {"max_in_flight_per_key": {"key": "$.order.items", "limit": 0}}},
          "workflows": [{"name": "w", "steps": [{"name": "s", "agent": "a"}, {"name": "t", "agent": "b"}]}]}"#;
        let got = problems(text);
        let errors: Vec<&String> = got.iter().filter(|p| p.starts_with("error")).collect();
        assert_eq!(
            errors,
            [
                r#"error: agent b, max_in_flight_per_key.key: "$.order.items" is not a key: write one of $.order.order_id, $.order.customer_id, $.order.workflow, $.order.workflow_version"#,
                "error: agent b, max_in_flight_per_key.limit: 0 is out of range: 1 to 100",
                "error: agent b, max_in_flight_per_key: needs max_in_flight or max_per_second on the agent: a key's places are taken on the way to the agent's",
            ]
        );
        let file = DefinitionFile::parse(text).unwrap();
        let per_key = file.agents["a"].limits().per_key;
        let want = crate::domain::gate::PerKey { key: OrderKey::CustomerId, limit: 1 };
        assert_eq!(per_key, Some(want));
    }

    #[test]
    fn every_problem_is_named_with_its_workflow_step_and_field() {
        let text = r#"{"agents": {"a": {"url": "http://example.com"}, "unused": {}},
          "workflows": [
            {"name": "w", "steps": [
               {"name": "s", "agent": "nope"},
               {"name": "s", "agent": "a", "timeout_ms": 10},
               {"name": "t", "agent": "a", "max_failures": 0, "compensation": "t", "max_throttled_ms": 999},
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
            "error: workflow w v1, step t, max_throttled_ms: 999 is out of range: 1000 to 604800000",
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
    fn a_compensable_step_after_a_pivot_is_a_warning_not_an_error() {
        let text = r#"{"agents": {"a": {}}, "workflows": [{"name": "w", "steps": [
            {"name": "ship", "agent": "a"}, {"name": "invoice", "agent": "a", "compensation": "void"}]}]}"#;
        let d = Definitions::parse(text).unwrap();
        assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
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
    fn a_map_step_is_read_and_its_problems_are_named_one_line_each() {
        let agents = r#""agents": {"a": {"url": "https://a.example"}, "wh": {"url": "https://wh.example"},
            "lim": {"url": "https://lim.example", "max_in_flight": 2}}"#;
        let file = |steps: &[&str]| {
            format!(r#"{{{agents}, "workflows": [{{"name": "w", "steps": [{}]}}]}}"#, steps.join(", "))
        };
        let quote = r#"{"name": "quote", "agent": "a", "effect": "none"}"#;
        let ship = r#"{"name": "ship", "agent": "lim"}"#;
        let reserve = r#"{"name": "reserve", "agent": "wh", "compensation": "release"}"#;
        // A map entry of `name`, `items`, `max_concurrency`, `tolerated_failures` and `step`.
        let map = |name: &str, items: &str, cap: u32, tolerated: u32, step: &str| {
            format!(
                r#"{{"map": {{"name": "{name}", "items": "{items}", "max_concurrency": {cap},
                    "tolerated_failures": {tolerated}, "step": {step}}}}}"#
            )
        };
        let lines = "$.steps.quote.output.lines";

        let ok = file(&[quote, &map("reserve-lines", lines, 5, 2, reserve), ship]);
        assert_eq!(problems(&ok), Vec::<String>::new());
        let parsed = DefinitionFile::parse(&ok).unwrap();
        let wf = &parsed.workflows[0];
        let want = MapStep {
            name: "reserve-lines".into(),
            at: 1,
            items: lines.into(),
            max_concurrency: 5,
            tolerated_failures: 2,
            gated: false,
        };
        assert_eq!(
            (wf.maps.as_slice(), wf.steps.len(), wf.steps[1].name.as_str()),
            (&[want][..], 3, "reserve")
        );
        let d = Definitions::parse(&ok).unwrap();
        assert_eq!(d.workflows.default_workflow().map_at(1).map(|m| m.name.as_str()), Some("reserve-lines"));
        // From the order's lines, with the bounds' ends, it is as good.
        let edges = file(&[quote, &map("m", "$.order.items", 50, 1_000, reserve), ship]);
        assert_eq!(problems(&edges), Vec::<String>::new());

        // Each problem alone: its one located error line.
        let errors = |steps: &[&str]| {
            problems(&file(steps)).into_iter().filter(|p| p.starts_with("error")).collect::<Vec<_>>()
        };
        let one = |m: String| errors(&[quote, &m, ship]);
        let at = "error: workflow w v1, map";
        assert_eq!(
            one(map("reserve lines", lines, 5, 0, reserve)),
            [format!("{at} reserve lines, name: must be 1 to 64 of A-Z a-z 0-9 - _")]
        );
        let clash = "is also the name of a step, stage or other map";
        assert_eq!(one(map("quote", lines, 5, 0, reserve)), [format!("{at} quote, name: {clash}")]);
        assert_eq!(one(map("reserve", lines, 5, 0, reserve)), [format!("{at} reserve, name: {clash}")]);
        let stage = r#"{"parallel": {"name": "both", "steps": [{"name": "x", "agent": "a"}, {"name": "y", "agent": "a"}]}}"#;
        assert_eq!(
            errors(&[quote, stage, &map("both", lines, 5, 0, reserve), ship]),
            [format!("{at} both, name: {clash}")]
        );
        let second = r#"{"name": "reserve-again", "agent": "wh", "compensation": "release-again"}"#;
        assert_eq!(
            errors(&[quote, &map("m1", lines, 5, 0, reserve), &map("m2", lines, 5, 0, second), ship]),
            [format!(
                "{at} m2, map: a workflow holds one map: its outputs take the room of many steps' in the record"
            )]
        );
        assert_eq!(
            one(map("m", "$.order.lines", 5, 0, reserve)),
            [format!(
                r#"{at} m, items: "$.order.lines" is not an items path: write "$.order.items" or "$.steps.<step>.output" and field names"#
            )]
        );
        for (items, step) in [
            ("$.steps.ship.output.lines", "ship"),
            ("$.steps.nope.output", "nope"),
            ("$.steps.reserve.output", "reserve"),
        ] {
            assert_eq!(
                one(map("m", items, 5, 0, reserve)),
                [format!(
                    r#"{at} m, items: "{step}" names no step before the map: items come from an earlier step's output"#
                )],
                "{items}"
            );
        }
        let pause = r#"{"name": "pause", "wait": {"for_ms": 5000}}"#;
        assert_eq!(
            errors(&[pause, &map("m", "$.steps.pause.output", 5, 0, reserve), ship]),
            [format!(r#"{at} m, items: names timer step "pause", which has no output"#)]
        );
        assert_eq!(MAX_MAP_CONCURRENCY, 50, "the schema's bound on max_concurrency (workflow.rs) says 50");
        for cap in [0, 51] {
            assert_eq!(
                one(map("m", lines, cap, 0, reserve)),
                [format!("{at} m, max_concurrency: {cap} is out of range: 1 to 50")]
            );
        }
        assert_eq!(
            one(map("m", lines, 5, 1_001, reserve)),
            [format!("{at} m, tolerated_failures: 1001 is out of range: 0 to 1000")]
        );
        assert_eq!(
            one(map("m", lines, 5, 0, pause)),
            [format!("{at} m, step: a timer cannot be a map's step: put it before or after the map")]
        );
        let callback = r#"{"name": "approve", "agent": "wh", "callback": {"timeout_ms": 5000}}"#;
        assert_eq!(
            one(map("m", lines, 5, 0, callback)),
            [format!("{at} m, step: a callback step cannot be a map's step: put it before or after the map")]
        );
        // A limited agent is no error: its items take places one at a time, which a cap
        // over one is warned of; the parsed map is gated.
        let limited = r#"{"name": "reserve", "agent": "lim", "compensation": "release"}"#;
        let ship = r#"{"name": "ship", "agent": "wh"}"#;
        let (five, one_at_a_time) = (
            file(&[quote, &map("m", lines, 5, 0, limited), ship]),
            file(&[quote, &map("m", lines, 1, 0, limited), ship]),
        );
        assert_eq!(
            problems(&five),
            [
                "warning: workflow w v1, map m, max_concurrency: agent lim has limits, so the map's items take places \
              in its gate one at a time: 5 is never reached (set it to 1)"
            ]
        );
        assert_eq!(problems(&one_at_a_time), Vec::<String>::new());
        let gated = |text: &str| Definitions::parse(text).unwrap().workflows.default_workflow().maps[0].gated;
        assert!(gated(&five) && gated(&one_at_a_time) && !gated(&ok));
        // The map's step's own fields are named with the map.
        let slow = r#"{"name": "reserve", "agent": "wh", "timeout_ms": 10}"#;
        assert_eq!(
            one(map("m", lines, 5, 0, slow)),
            [format!("{at} m, step reserve, timeout_ms: 10 is out of range: 1000 to 50000")]
        );
    }

    /// One branch of a stage may call a limited agent (the stage's claim holds its place);
    /// a second is named, with the first.
    #[test]
    fn at_most_one_branch_of_a_stage_calls_a_limited_agent() {
        let file = |branches: &str| {
            format!(
                r#"{{"agents": {{"a": {{"url": "https://a.example", "max_in_flight": 2}},
                     "b": {{"url": "https://b.example", "max_per_second": 5}},
                     "c": {{"url": "https://c.example"}}}},
                   "workflows": [{{"name": "w", "steps": [{{"parallel": {{"name": "st", "steps": [{branches}]}}}}]}}]}}"#
            )
        };
        let one =
            file(r#"{"name": "x", "agent": "a"}, {"name": "y", "agent": "c"}, {"name": "z", "agent": "c"}"#);
        assert_eq!(
            problems(&one).into_iter().filter(|p| p.starts_with("error")).count(),
            0,
            "{:?}",
            problems(&one)
        );
        for (second, agent) in [("y", "b"), ("y", "a")] {
            let two = file(&format!(
                r#"{{"name": "x", "agent": "a"}}, {{"name": "{second}", "agent": "{agent}"}}"#
            ));
            assert_eq!(
                problems(&two).into_iter().filter(|p| p.starts_with("error")).collect::<Vec<_>>(),
                [format!(
                    "error: workflow w v1, stage st, step {second}: agent {agent} has limits, and so does step x's \
                     agent a: at most one branch of a parallel stage may call a limited agent (put the others \
                     before or after the stage)"
                )]
            );
        }
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
