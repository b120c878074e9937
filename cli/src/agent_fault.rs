//! `--agent-fault NAME=KIND:RATE[,KIND:RATE...]`: one agent's simulated service fails
//! differently from the rest, e.g. `payment=fail:0.3` or `inventory=hang:0.5,latency:50`.

use std::collections::BTreeMap;
use std::str::FromStr;

use sas_sim::ledger::RemoteFaults;

/// One `--agent-fault` as given: the agent and what changes for it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentFault {
    pub agent: String,
    changes: Vec<(Kind, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Fail,
    Refuse,
    UndoRefuse,
    Hang,
    BadOutput,
    Latency,
}

const KINDS: &str = "fail, refuse, undo-refuse, hang, bad-output (rates 0 to 1) or latency (ms)";

impl FromStr for AgentFault {
    type Err = String;

    fn from_str(s: &str) -> Result<AgentFault, String> {
        let (agent, spec) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not NAME=KIND:RATE (e.g. payment=fail:0.3)"))?;
        if agent.is_empty() {
            return Err(format!("{s:?} names no agent"));
        }
        let mut changes = Vec::new();
        for part in spec.split(',') {
            let (kind, value) =
                part.split_once(':').ok_or_else(|| format!("{part:?} is not KIND:RATE; kinds: {KINDS}"))?;
            let kind = match kind {
                "fail" => Kind::Fail,
                "refuse" => Kind::Refuse,
                "undo-refuse" => Kind::UndoRefuse,
                "hang" => Kind::Hang,
                "bad-output" => Kind::BadOutput,
                "latency" => Kind::Latency,
                other => return Err(format!("unknown fault {other:?}; kinds: {KINDS}")),
            };
            let value: f64 = value.parse().map_err(|_| format!("{part:?}: {value:?} is not a number"))?;
            let ok = match kind {
                Kind::Latency => (0.0..=60_000.0).contains(&value) && value.fract() == 0.0,
                _ => (0.0..=1.0).contains(&value),
            };
            if !ok {
                let range = if kind == Kind::Latency { "whole ms from 0 to 60000" } else { "from 0 to 1" };
                return Err(format!("{part:?}: must be {range}"));
            }
            changes.push((kind, value));
        }
        Ok(AgentFault { agent: agent.to_owned(), changes })
    }
}

impl AgentFault {
    /// The agent's faults: `base` with these changes.
    pub fn apply(&self, base: RemoteFaults) -> Result<RemoteFaults, String> {
        let mut f = base;
        for (kind, v) in &self.changes {
            match kind {
                Kind::Fail => f.transient = *v,
                Kind::Refuse => f.permanent = *v,
                Kind::UndoRefuse => f.undo_permanent = *v,
                Kind::Hang => f.hang = *v,
                Kind::BadOutput => f.bad_output = *v,
                Kind::Latency => f.latency_max_ms = *v as u64,
            }
        }
        if f.transient + f.permanent + f.hang >= 1.0 {
            return Err(format!("--agent-fault {}: fail + refuse + hang must stay below 1", self.agent));
        }
        Ok(f)
    }
}

/// Each named agent's faults, checked against the agents the definitions hold.
pub fn per_agent(
    faults: &[AgentFault],
    base: RemoteFaults,
    agents: &[&str],
) -> Result<BTreeMap<String, RemoteFaults>, String> {
    let mut out = BTreeMap::new();
    for fault in faults {
        if !agents.contains(&fault.agent.as_str()) {
            return Err(format!(
                "--agent-fault names agent {:?}; the definitions have: {}",
                fault.agent,
                agents.join(", ")
            ));
        }
        let start = out.get(&fault.agent).copied().unwrap_or(base);
        out.insert(fault.agent.clone(), fault.apply(start)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_changes_only_what_it_names() {
        let f: AgentFault = "payment=fail:0.3,latency:50".parse().unwrap();
        let base = RemoteFaults { hang: 0.02, ..RemoteFaults::default() };
        let got = per_agent(&[f], base, &["payment", "inventory"]).unwrap();
        assert_eq!(got["payment"], RemoteFaults { transient: 0.3, latency_max_ms: 50, ..base });
        assert!(!got.contains_key("inventory"));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, want) in [
            ("payment", "is not NAME=KIND:RATE"),
            ("=fail:0.1", "names no agent"),
            ("payment=oops:0.1", "unknown fault \"oops\""),
            ("payment=fail", "is not KIND:RATE"),
            ("payment=fail:x", "is not a number"),
            ("payment=fail:1.5", "must be from 0 to 1"),
            ("payment=latency:0.5", "whole ms"),
        ] {
            let err = spec.parse::<AgentFault>().unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
        let f: AgentFault = "nobody=fail:0.1".parse().unwrap();
        assert!(
            per_agent(&[f], RemoteFaults::default(), &["a"]).unwrap_err().contains("the definitions have: a")
        );
        let f: AgentFault = "a=fail:0.6,hang:0.5".parse().unwrap();
        assert!(per_agent(&[f], RemoteFaults::default(), &["a"]).unwrap_err().contains("below 1"));
    }
}
