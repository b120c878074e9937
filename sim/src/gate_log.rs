//! What the limited agents' gates did, as the simulation saw them: which tickets each
//! landed gate write let through (a place reserved for each), and which invocations ended
//! with nothing in their way. `check.rs` judges `Invariant::TicketsHandedBack` on them.
//!
//! A task that leaves an agent's line without taking its turn (a cancel, a give-up)
//! hands its ticket back in the same invocation, after its write lands (`Effect::HandBack`),
//! best effort. So once that invocation has ended with no fault, no crash and no gate
//! write that lost a race (each of which may have cost the hand-back), the ticket must
//! never be let through: a place reserved for it would wait for a task that will not come.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sas::domain::gate::{Gate, reserved_for};

/// An invocation's id (`world::InvocationId`), kept as a number so this file needs
/// nothing of the crate.
type InvocationId = u64;

/// A ticket let through by a landed gate write, at true time `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetThrough {
    pub at: u64,
    pub agent: String,
    pub ticket: u64,
}

#[derive(Debug, Default)]
pub struct GateLog {
    /// Each gate's `admitted` as last written: the tickets a write lets through are the
    /// ones it moves past that got a reserved place (a withdrawn one is skipped, without).
    admitted: HashMap<String, u64>,
    pub let_through: Vec<LetThrough>,
    /// Invocations with a gate write that lost a race: a change that keeps losing gives up.
    lost_race: BTreeSet<InvocationId>,
    /// Invocations that ended with no fault, no crash and no lost gate race: when.
    pub ended_clean: BTreeMap<InvocationId, u64>,
}

impl GateLog {
    pub fn landed(&mut self, gate: &Gate, at: u64) {
        let from = self.admitted.insert(gate.agent.clone(), gate.admitted).unwrap_or(0);
        for ticket in from..gate.admitted {
            let holder = reserved_for(ticket);
            if gate.holds.iter().any(|h| h.holder == holder) {
                self.let_through.push(LetThrough { at, agent: gate.agent.clone(), ticket });
            }
        }
    }

    pub fn lost_race(&mut self, invocation: InvocationId) {
        self.lost_race.insert(invocation);
    }

    pub fn ended(&mut self, invocation: InvocationId, at: u64, hit: bool) {
        if !hit && !self.lost_race.contains(&invocation) {
            self.ended_clean.insert(invocation, at);
        }
    }
}
