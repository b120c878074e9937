//! A Schedule, handled whole, as a machine without I/O: the scheduler performs each
//! [`Next`] it asks for and reports back what came of it ([`Seen`]), until it is done.
//!
//! Most Schedules are one decision: read the task, decide (`TaskRecord::schedule`: wake,
//! sleep or claim), write it conditional on the revision read, and perform its effects.
//! A claim that dispatches an agent with limits (`domain::gate`) first takes a place in
//! the agent's gate, and is written only once it holds one; without room, the task waits
//! with a ticket. Everything that needs deciding on the way is decided here: the ticket
//! an arrival brings, what a lost race on the task does with the place it took (handed
//! back to the ticket it came with, or given back to the gate), a ticket taken whose task
//! write was lost, a claim decided again after a lost race that now needs a place (it
//! goes back through the gate, never around it), and how many rounds each may take.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::claim::Mint;
use super::outcome::{Effect, Policy, Refusal};
use super::record::{Decision, TaskRecord};
use crate::domain::callback::CallbackSecret;
use crate::domain::gate::{
    Admission, Limits, call_holder, gate_of, key_gate_of, key_holder, pause_ms, reserved_for,
};
use crate::domain::ids::{LeaseToken, OrderId, Timestamp};
use crate::domain::lifecycle::Trigger;
use crate::domain::messages::{AgentReply, Order, ReplyOutcome};
use crate::domain::workflow::{Action, Workflow};

/// Rounds of a gated claim, and of going back to the gate: each lost race on the task
/// (a duplicate Schedule, a supervisor) reads it again. Anything left is redelivered.
pub const GATED_ROUNDS: usize = 4;

/// Concurrent writers to one task are rare (a duplicate message, a supervisor racing a
/// reply); a few re-reads settle them, and anything left is retried by redelivery.
pub const CONFLICT_RETRIES: usize = 4;

/// The branch replies of a parallel stage (or a map's items in flight) come back together
/// and race on the record: each round of re-reads lands one, so a workflow with stages gets
/// a round per branch of its widest stage (or item of its map's cap), plus two for the
/// supervisor and an operator. Workflows without either keep [`CONFLICT_RETRIES`].
pub fn conflict_retries(workflow: &Workflow) -> usize {
    let stages = workflow.stages.iter().map(|s| s.len as usize);
    let widest = stages.chain(workflow.maps.iter().map(|m| m.max_concurrency as usize)).max().unwrap_or(0);
    CONFLICT_RETRIES.max(widest + 2)
}

/// The place a claim's call must hold: in which gate (`gate::gate_of`), under what
/// limits (that gate's share), held by whom and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub gate: String,
    pub limits: Limits,
    pub holder: String,
    /// The attempt the holder names: the task's, or a stage branch's own.
    pub attempt: u32,
    pub until: Timestamp,
    /// Under a per-key limit, the place in the order's key gate (`gate::key_gate_of`),
    /// taken first: a key's flood waits in its own line, not in the agent's.
    pub key: Option<Box<Place>>,
}

/// The place a decided claim needs, if the agent it dispatches has limits. A parallel
/// stage's claim dispatches all its open branches at once; at most one of them calls a
/// limited agent (the definition file holds stages to that), and the claim holds a place
/// for that one, under that branch's own attempt, which its reply echoes. A gated map's
/// claim dispatches one item, and holds its place under the item's attempt.
pub fn place_of(
    limits: &BTreeMap<String, Limits>,
    policy: &Policy,
    wf: &Workflow,
    decision: &Decision,
) -> Option<Place> {
    if decision.trigger != Trigger::Claimed {
        return None;
    }
    let task = &decision.next;
    let mut limited = decision.effects.iter().filter_map(|e| match e {
        Effect::Dispatch { step, action, item, .. } => {
            let agent = &wf.step(*step)?.agent;
            limits.get(agent).map(|l| (*step, *action, *item, agent, l))
        }
        _ => None,
    });
    let (Some((step, action, item, agent, agent_limits)), None) = (limited.next(), limited.next()) else {
        return None;
    };
    // A branch's (an item's) undo is a lone claim, under the task's attempt.
    let attempt = match task.stage().filter(|run| run.at == task.step && action == Action::Do) {
        Some(run) if run.map => run.slot(step, item)?.attempt,
        Some(_) if crate::mutations::stage_without_place() => return None,
        Some(run) => run.branch(step)?.attempt,
        None => task.attempt,
    };
    let (gate, limits) = gate_of(agent, agent_limits, &task.order_id);
    let until = limits.hold_until(task.complete_by()?, policy.reply_grace_ms);
    let key = key_gate_of(agent, agent_limits, |k| task.order.key_value(k))
        .filter(|_| !crate::mutations::key_gate_skipped())
        .map(|(gate, limits)| {
            Box::new(Place {
                gate,
                limits,
                holder: key_holder(&task.order_id, attempt),
                attempt,
                until,
                key: None,
            })
        });
    Some(Place {
        gate,
        limits,
        holder: call_holder(&task.order_id, attempt, &task.locked_by()?),
        attempt,
        until,
        key,
    })
}

/// A place an agent's reply frees: whatever the fence says of the reply, the call it
/// answers is over, so its place in a limited agent's gate goes back (and a remote's
/// Retry-After pauses the gate for `pause_ms` from when the place is given back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freed {
    /// The gate's name (`gate::gate_of`).
    pub gate: String,
    pub holder: String,
    pub pause_ms: Option<u64>,
    /// Under a per-key limit, the key gate's place too (gate, holder): given back after
    /// the agent's.
    pub key: Option<(String, String)>,
}

/// The place `reply` frees, if its step's agent (in the task's workflow, for the task's
/// `order`) has limits.
pub fn freed_by(
    reply: &AgentReply,
    wf: &Workflow,
    order: &Order,
    limits: &BTreeMap<String, Limits>,
) -> Option<Freed> {
    let agent = &wf.step(reply.step)?.agent;
    limits.get(agent).map(|l| Freed {
        gate: gate_of(agent, l, &reply.order_id).0,
        holder: call_holder(&reply.order_id, reply.attempt, &reply.lease),
        pause_ms: match reply.outcome {
            ReplyOutcome::Throttled { retry_after_ms } => Some(pause_ms(retry_after_ms)),
            _ => None,
        },
        key: key_gate_of(agent, l, |k| order.key_value(k))
            .map(|(gate, _)| (gate, key_holder(&reply.order_id, reply.attempt))),
    })
}

/// What the scheduler does next.
// Each value is moved once per step; boxing the large ones would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Next {
    /// Read the task, strongly consistent; report it with the workflow it runs and the time.
    ReadTask,
    /// Draw the secret of a callback step's token (once per Schedule, only when needed).
    DrawSecret,
    /// Arrive at the place's gate with the ticket the task holds there, if any; report
    /// the admission.
    Arrive { place: Place, ticket: Option<u64> },
    /// Give `holder`'s place at `agent` back to the gate, best effort; then go on.
    Release { agent: String, holder: String },
    /// Hand `holder`'s place at `agent` back to `ticket`, best effort; then go on.
    Unclaim { agent: String, holder: String, ticket: u64 },
    /// Raise the decision's alerts, then write its record conditional on `revision`;
    /// report whether it landed. Shared with the machine, which performs it if it lands,
    /// so a write copies no record.
    Write { decision: Arc<Decision>, revision: u64 },
    /// The write landed: perform the decision's effects (the first failure ends the
    /// handling, for redelivery); then go on. `waited_ms`: how long the task waited for
    /// its place, for a gated claim that had a ticket.
    Perform { decision: Decision, waited_ms: Option<u64> },
    /// Withdraw `ticket` from its gate, best effort (`gate::Gate::withdraw`): it was
    /// handed out in this pass, but the task does not wait with it; then go on.
    Withdraw { agent: String, ticket: u64 },
    /// Note that `ticket`'s task waits at `agent`'s gate, so its turn can wake it; then go on.
    NoteWaiter { agent: String, ticket: u64, at: Timestamp },
    /// Read `agent`'s gate; report whether `ticket` is still behind.
    LookBehind { agent: String, ticket: u64 },
    /// Send this task a Schedule delayed `delay_ms`: one that came while its timer slept
    /// comes back when it is due (`Refusal::rearm_ms`); then go on.
    Rearm { delay_ms: u64 },
    /// Over.
    Done(Done),
}

/// How a Schedule's handling ended.
#[derive(Debug)]
pub enum Done {
    /// Its work is done (its effects performed, if it wrote anything).
    Handled,
    /// The decision was refused: nothing was written.
    Refused(Refusal),
    /// A ticket was handed out, but the task cannot wait with it (paused, or moved on):
    /// nothing was written, and the ticket was withdrawn.
    Ignored(Refusal),
    /// No such task.
    NoSuchTask,
    /// The task (or its gate) kept changing: leave the Schedule for redelivery.
    KeptChanging(String),
    /// The state store throttled the way through the gate, as `.0` says: the Schedule is
    /// to be sent again after a backoff, with the turn it brought. The task's deadline
    /// was moved out past that backoff first, where it had to be (`TaskRecord::defer`).
    Throttled(String),
}

/// What came of the last step.
#[allow(clippy::large_enum_variant)] // as for `Next`
#[derive(Debug)]
pub enum Seen<'w> {
    /// The first call, or a step that reports nothing.
    Nothing,
    /// The task as read (none: no such task), with its workflow and the time.
    Task(Option<(TaskRecord, &'w Workflow, Timestamp)>),
    Secret(CallbackSecret),
    Admission(Admission),
    /// The state store throttled the arrival at the gate, as the string says.
    Throttled(String),
    /// Whether the conditional write landed.
    Landed(bool),
    /// Whether the ticket is still behind in its gate.
    Behind(bool),
}

/// Where the machine is: what it waits to hear of.
#[allow(clippy::large_enum_variant)] // as for `Next`
#[derive(Debug)]
enum At<'w> {
    Start,
    /// A read in the gate's rounds.
    GateRead,
    /// A read on the way without a gate.
    PlainRead,
    /// The secret, for a decision on `read`.
    Secret {
        read: Read<'w>,
        gated: bool,
    },
    /// The task's wait was paused: its reserved place went back; decide without the gate.
    ReleasedPaused {
        read: Read<'w>,
    },
    /// At `place`'s gate; `then`: the agent's place, after a key gate's.
    Arriving {
        read: Read<'w>,
        decision: Decision,
        place: Place,
        ticket: Option<u64>,
        then: Option<Place>,
    },
    /// The agent's ticket given up, as the task now waits at its key gate (its key place
    /// lapsed while it waited in the agent's line): write that wait.
    WithdrewForKey {
        read: Read<'w>,
        decision: Decision,
        key: Place,
        arrived_with: Option<u64>,
        ticket: u64,
    },
    /// A key place this pass held and no longer needs given back: decide on `read` again.
    ReleasedKey {
        read: Read<'w>,
        gated: bool,
    },
    WritingClaim {
        read: Read<'w>,
        decision: Arc<Decision>,
        place: Place,
        ticket: Option<u64>,
    },
    /// A gate change after a lost race: the next gate round.
    GaveBack,
    /// A ticket taken in this pass withdrawn, as the decision on `read` did not need it:
    /// decide on it again.
    WithdrewTaken {
        read: Read<'w>,
        gated: bool,
    },
    /// The pass's ticket withdrawn on the way out: over, as `Done` says.
    WithdrewThenDone(Done),
    WritingQueued {
        decision: Arc<Decision>,
        agent: String,
        ticket: u64,
        now: Timestamp,
    },
    PerformedQueued {
        agent: String,
        ticket: u64,
        now: Timestamp,
    },
    /// A waiter noted after its Queued write: look at the gate next; or, still waiting, done.
    Noted {
        agent: String,
        ticket: u64,
        look: bool,
    },
    Looked,
    WritingPlain {
        read: Read<'w>,
        decision: Arc<Decision>,
    },
    Performed,
    /// An early Schedule sent again: over, refused as `refusal` says.
    Rearmed(Refusal),
    /// The task's deadline moved out after the store throttled its arrival (`.0` why):
    /// over, whether or not that write landed.
    Deferring(String),
    Over,
}

/// A task as read, with its workflow and the time of the read.
#[derive(Debug)]
struct Read<'w> {
    task: TaskRecord,
    wf: &'w Workflow,
    now: Timestamp,
}

/// One Schedule's handling.
#[derive(Debug)]
pub struct Scheduling<'w> {
    order_id: OrderId,
    lease: LeaseToken,
    secret: Option<CallbackSecret>,
    limits: &'w BTreeMap<String, Limits>,
    policy: Policy,
    at: At<'w>,
    /// Reads made in this pass through the gate.
    gate_reads: usize,
    /// Passes on the way without a gate (a decision there that needs one starts another).
    rounds: usize,
    /// Writes tried on the way without a gate.
    tries: usize,
    /// A ticket this pass holds a claim on that the record as last read may not show: one
    /// taken whose Queued write was lost, or one a lost claim handed its place back to
    /// (`Unclaim`), or the one whose turn woke this Schedule. The next arrival at its gate
    /// brings it; a pass that ends otherwise, or finds the record no longer holding it,
    /// withdraws it.
    taken: Option<(String, u64)>,
    /// The ticket whose turn woke this Schedule (`SchedulerMessage::Schedule::turn`), for
    /// the first pass to hold as `taken`.
    turn: Option<(String, u64)>,
    /// A key place this pass took (gate, holder, the attempt it is for) that no write has
    /// settled yet: the next read decides whether the task still needs it, or another pass
    /// of the attempt claimed with it, or it goes back.
    key_held: Option<(String, String, u32)>,
}

impl<'w> Scheduling<'w> {
    /// A Schedule's handling under `lease`, with the limited agents' `limits`.
    pub fn new(
        order_id: OrderId,
        lease: LeaseToken,
        limits: &'w BTreeMap<String, Limits>,
        policy: Policy,
    ) -> Scheduling<'w> {
        Scheduling {
            order_id,
            lease,
            secret: None,
            limits,
            policy,
            at: At::Start,
            gate_reads: 0,
            rounds: 0,
            tries: 0,
            taken: None,
            turn: None,
            key_held: None,
        }
    }

    /// The handling of a Schedule the gate sent when `turn`'s ticket was let through: a
    /// place is reserved for it. A task that holds the ticket takes its turn as before; one
    /// that no longer does (cancelled, refused, moved on, gone) withdraws it, so the place
    /// goes to the next in line now rather than when the reservation lapses. This is what
    /// frees the turns of tickets the gate could not mark withdrawn (`MAX_WITHDRAWN`).
    pub fn woken_for(mut self, turn: Option<(String, u64)>) -> Scheduling<'w> {
        self.turn = turn;
        self
    }

    /// The next step, given what came of the last one.
    pub fn next(&mut self, seen: Seen<'w>) -> Next {
        let at = std::mem::replace(&mut self.at, At::Over);
        match (at, seen) {
            (At::Start, _) => self.pass(),
            (At::GateRead, Seen::Task(None)) => self.without_gate(None),
            (At::GateRead, Seen::Task(Some((task, wf, now)))) => self.decide(Read { task, wf, now }, true),
            (At::PlainRead, Seen::Task(None)) => self.over(Done::NoSuchTask),
            (At::PlainRead, Seen::Task(Some((task, wf, now)))) => {
                self.tries += 1;
                self.decide(Read { task, wf, now }, false)
            }
            (At::Secret { read, gated }, Seen::Secret(secret)) => {
                self.secret = Some(secret);
                self.decide(read, gated)
            }
            (At::ReleasedPaused { read }, _) => self.without_gate(Some(read)),
            (At::Arriving { read, decision, place, ticket, then }, Seen::Admission(admission)) => {
                match then {
                    Some(agent) => self.key_admitted(read, decision, place, agent, ticket, admission),
                    None => self.admitted(read, decision, place, ticket, admission),
                }
            }
            (At::Arriving { read, .. }, Seen::Throttled(why)) => self.throttled(read, why),
            (At::Deferring(why), _) => Next::Done(Done::Throttled(why)),
            (At::WithdrewForKey { read, decision, key, arrived_with, ticket }, _) => {
                self.admitted(read, decision, key, arrived_with, Admission::Queued { ticket })
            }
            (At::ReleasedKey { read, gated }, _) => self.decide(read, gated),
            (At::WritingClaim { read, decision, .. }, Seen::Landed(true)) => {
                // The claim took its turn with the pass's ticket, if it had one, and
                // holds its key place, if any.
                self.taken = None;
                self.key_held = None;
                let waited_ms = read.task.queued().map(|q| read.now.millis_since(q.since));
                self.at = At::Performed;
                Next::Perform { decision: landed(decision), waited_ms }
            }
            // Another writer came first: the place goes back to the ticket it came with
            // (the task keeps its turn), or back to the gate; then decide again.
            (At::WritingClaim { place, ticket, .. }, Seen::Landed(false)) => {
                self.at = At::GaveBack;
                match ticket {
                    Some(ticket) => {
                        // The place is the ticket's again: if the record no longer holds
                        // the ticket when read next (a cancel came first), it is withdrawn.
                        self.taken = Some((place.gate.clone(), ticket));
                        Next::Unclaim { agent: place.gate, holder: place.holder, ticket }
                    }
                    None => Next::Release { agent: place.gate, holder: place.holder },
                }
            }
            (At::GaveBack, _) | (At::Looked, Seen::Behind(false)) => self.gate_round(),
            (At::WithdrewTaken { read, gated }, _) => self.decide(read, gated),
            (At::WithdrewThenDone(done), _) => Next::Done(done),
            (At::Rearmed(refusal), _) => Next::Done(Done::Refused(refusal)),
            (At::WritingQueued { agent, ticket, .. }, Seen::Landed(false)) => {
                self.taken = Some((agent, ticket));
                self.gate_round()
            }
            (At::WritingQueued { decision, agent, ticket, now }, Seen::Landed(true)) => {
                // The record holds the ticket now; a key place taken on the way stays
                // the task's while it waits in the agent's line.
                self.taken = None;
                self.key_held = None;
                self.at = At::PerformedQueued { agent, ticket, now };
                Next::Perform { decision: landed(decision), waited_ms: None }
            }
            (At::PerformedQueued { agent, ticket, now }, _) => {
                self.at = At::Noted { agent: agent.clone(), ticket, look: true };
                Next::NoteWaiter { agent, ticket, at: now }
            }
            // Let through while noting itself, nobody could wake it: look again.
            (At::Noted { agent, ticket, look: true }, _) => {
                self.at = At::Looked;
                Next::LookBehind { agent, ticket }
            }
            (At::Noted { look: false, .. }, _) | (At::Looked, Seen::Behind(true)) | (At::Performed, _) => {
                Next::Done(Done::Handled)
            }
            (At::WritingPlain { decision, .. }, Seen::Landed(true)) => {
                self.at = At::Performed;
                Next::Perform { decision: landed(decision), waited_ms: None }
            }
            (At::WritingPlain { read, .. }, Seen::Landed(false)) => {
                if self.tries >= conflict_retries(read.wf) {
                    return Next::Done(Done::KeptChanging(format!(
                        "task {} kept changing under concurrent writers",
                        self.order_id
                    )));
                }
                self.at = At::PlainRead;
                Next::ReadTask
            }
            (at, seen) => unreachable_step(&format!("{seen:?} at {at:?}")),
        }
    }

    /// A pass: through the gate if any agent has limits, else the way without one.
    fn pass(&mut self) -> Next {
        if self.limits.is_empty() {
            return self.without_gate(None);
        }
        self.gate_reads = 0;
        self.taken = self.turn.take();
        self.gate_round()
    }

    fn gate_round(&mut self) -> Next {
        if self.gate_reads >= GATED_ROUNDS {
            let why = format!("task {} kept changing while it passed its gate", self.order_id);
            return self.over(Done::KeptChanging(why));
        }
        self.gate_reads += 1;
        self.at = At::GateRead;
        Next::ReadTask
    }

    /// Ends the pass as `done` says, withdrawing its own ticket first, if it holds one.
    fn over(&mut self, done: Done) -> Next {
        match self.taken.take() {
            Some((agent, ticket)) => {
                self.at = At::WithdrewThenDone(done);
                Next::Withdraw { agent, ticket }
            }
            None => Next::Done(done),
        }
    }

    fn without_gate(&mut self, read: Option<Read<'w>>) -> Next {
        self.tries = 0;
        match read {
            Some(read) => {
                self.tries += 1;
                self.decide(read, false)
            }
            None => {
                self.at = At::PlainRead;
                Next::ReadTask
            }
        }
    }

    fn decide(&mut self, read: Read<'w>, gated: bool) -> Next {
        let callback = read.wf.step(read.task.step).is_some_and(|s| s.is_callback());
        if callback && self.secret.is_none() {
            self.at = At::Secret { read, gated };
            return Next::DrawSecret;
        }
        let mint = Mint { lease: self.lease, secret: self.secret.filter(|_| callback) };
        let decided = read.task.schedule(mint, read.now, read.wf, &self.policy);
        let place = decided.as_ref().ok().and_then(|d| place_of(self.limits, &self.policy, read.wf, d));
        // A key place taken for a write that lost: kept if this decision takes it again;
        // left alone if another pass claimed the attempt, since that claim holds it under
        // the same holder and gives it back with its call, even when the task has moved on
        // since (a cancel while the call is out); else given back. Of an attempt claimed
        // without this key place (the task moved to another agent first), the place
        // lapses at its time rather than risk giving back one whose call is out.
        if let Some((gate, holder, attempt)) = self.key_held.take() {
            let again = place
                .as_ref()
                .and_then(|p| p.key.as_ref())
                .is_some_and(|k| k.gate == gate && k.holder == holder);
            let claimed_by_another = read.task.attempt >= attempt;
            if again {
                self.key_held = Some((gate, holder, attempt));
            } else if !claimed_by_another {
                self.at = At::ReleasedKey { read, gated };
                return Next::Release { agent: gate, holder };
            }
        }
        // The pass's own ticket: the record holds it (nothing of the pass's own then), or
        // it goes with the next arrival at its gate when the record holds none there; a
        // decision that makes no such arrival (the task moved on, or needs another
        // agent, or holds another ticket there) hands it back first.
        if let Some((agent, ticket)) = &self.taken {
            let recorded = read.task.queued().is_some_and(|q| q.agent == *agent && q.ticket == *ticket);
            let brought = gated
                && place
                    .as_ref()
                    .is_some_and(|p| p.gate == *agent || p.key.as_ref().is_some_and(|k| k.gate == *agent))
                && read.task.queued().is_none_or(|q| q.agent != *agent);
            if recorded {
                self.taken = None;
            } else if !brought && let Some((agent, ticket)) = self.taken.take() {
                self.at = At::WithdrewTaken { read, gated };
                return Next::Withdraw { agent, ticket };
            }
        }
        match (decided, place, gated) {
            (Ok(decision), Some(mut place), true) => match place.key.take() {
                // Under a per-key limit, the key gate first.
                Some(key) => {
                    let key = *key;
                    let ticket = self.ticket_at(&read, &key.gate);
                    self.at = At::Arriving { read, decision, place: key.clone(), ticket, then: Some(place) };
                    Next::Arrive { place: key, ticket }
                }
                None => self.arrive_at_agent(read, decision, place),
            },
            // Decided again without the gate after a lost race, it now needs a place:
            // back through the gate, never around it.
            (Ok(_), Some(_), false) => {
                self.rounds += 1;
                if self.rounds >= GATED_ROUNDS {
                    let why = format!("task {} kept changing at its gate", self.order_id);
                    return self.over(Done::KeptChanging(why));
                }
                self.pass()
            }
            // Woken while paused: its turn is over, and the place kept for it goes to the
            // next in line rather than waiting to lapse.
            (Err(Refusal::Paused), _, true) if read.task.queued().is_some() => {
                let q = read.task.queued().expect("queued").clone();
                self.at = At::ReleasedPaused { read };
                Next::Release { agent: q.agent, holder: reserved_for(q.ticket) }
            }
            (_, None, true) => self.without_gate(Some(read)),
            (Ok(decision), None, false) => {
                let revision = read.task.revision;
                let decision = Arc::new(decision);
                self.at = At::WritingPlain { read, decision: decision.clone() };
                Next::Write { decision, revision }
            }
            (Err(refusal), _, false) => match refusal.rearm_ms() {
                Some(delay_ms) => {
                    self.at = At::Rearmed(refusal);
                    Next::Rearm { delay_ms }
                }
                None => Next::Done(Done::Refused(refusal)),
            },
            (Err(_), Some(_), true) => unreachable_step("a refusal needs no place"),
        }
    }

    /// The ticket the task brings to `gate`: the one its record holds there, or this
    /// pass's own.
    fn ticket_at(&self, read: &Read<'w>, gate: &str) -> Option<u64> {
        read.task
            .queued()
            .filter(|q| q.agent == gate)
            .map(|q| q.ticket)
            .or_else(|| self.taken.as_ref().filter(|(a, _)| *a == gate).map(|(_, t)| *t))
    }

    /// The store throttled an arrival at a gate (the gate is one hot item). The Schedule
    /// is sent again after a backoff with the turn it brought, and a key place this pass
    /// took is taken again then, under the same holder. A ticket the pass took whose
    /// Queued write was lost is not withdrawn (a gate write, and the store is throttling):
    /// its reservation lapses when its turn comes, as after any failed pass. The task's
    /// deadline first moves out past that backoff, where it must, so the supervisor counts
    /// no failure for the wait.
    fn throttled(&mut self, read: Read<'w>, why: String) -> Next {
        match read.task.defer(read.now, &self.policy) {
            Ok(deferred) => {
                let revision = read.task.revision;
                self.at = At::Deferring(why);
                Next::Write { decision: Arc::new(deferred), revision }
            }
            Err(_) => Next::Done(Done::Throttled(why)),
        }
    }

    fn arrive_at_agent(&mut self, read: Read<'w>, decision: Decision, place: Place) -> Next {
        let ticket = self.ticket_at(&read, &place.gate);
        self.at = At::Arriving { read, decision, place: place.clone(), ticket, then: None };
        Next::Arrive { place, ticket }
    }

    /// What came of the arrival at the key gate: admitted, on to the agent's gate;
    /// otherwise the task waits in the key's line, as it would in the agent's, giving up
    /// any ticket it holds at the agent's (a key place that lapsed while it waited there).
    fn key_admitted(
        &mut self,
        read: Read<'w>,
        decision: Decision,
        key: Place,
        agent: Place,
        arrived_with: Option<u64>,
        admission: Admission,
    ) -> Next {
        let ticket = match admission {
            Admission::Admitted => {
                self.key_held = Some((key.gate, key.holder, key.attempt));
                return self.arrive_at_agent(read, decision, agent);
            }
            Admission::Queued { ticket } => ticket,
            Admission::StillWaiting { ticket }
                if read.task.queued().is_none_or(|q| q.agent != key.gate || q.ticket != ticket) =>
            {
                ticket
            }
            other => return self.admitted(read, decision, key, arrived_with, other),
        };
        // A ticket at the agent's gate that the record holds is handed back by the Queued
        // write (`Effect::HandBack`); one only this pass holds, here.
        match self.taken.take_if(|(gate, _)| *gate == agent.gate) {
            Some((gate, t)) => {
                self.at = At::WithdrewForKey { read, decision, key, arrived_with, ticket };
                Next::Withdraw { agent: gate, ticket: t }
            }
            None => self.admitted(read, decision, key, arrived_with, Admission::Queued { ticket }),
        }
    }

    fn admitted(
        &mut self,
        read: Read<'w>,
        decision: Decision,
        place: Place,
        arrived_with: Option<u64>,
        admission: Admission,
    ) -> Next {
        match admission {
            Admission::Admitted => {
                let revision = read.task.revision;
                let decision = Arc::new(decision);
                self.at = At::WritingClaim { read, decision: decision.clone(), place, ticket: arrived_with };
                Next::Write { decision, revision }
            }
            // A ticket still behind that the record does not hold (taken by this pass,
            // its Queued write lost): written now, as a new one would be.
            Admission::StillWaiting { ticket }
                if read.task.queued().is_none_or(|q| q.agent != place.gate || q.ticket != ticket) =>
            {
                self.admitted(read, decision, place, arrived_with, Admission::Queued { ticket })
            }
            Admission::Queued { ticket } => {
                match read.task.queue(&place.gate, ticket, read.now, &self.policy) {
                    Ok(queued) => {
                        let queued = Arc::new(queued);
                        let revision = read.task.revision;
                        self.at = At::WritingQueued {
                            decision: queued.clone(),
                            agent: place.gate,
                            ticket,
                            now: read.now,
                        };
                        Next::Write { decision: queued, revision }
                    }
                    Err(refusal) => {
                        self.taken = Some((place.gate, ticket));
                        self.over(Done::Ignored(refusal))
                    }
                }
            }
            // Another pass of this claim took the ticket's place: its write or this
            // one's lands, not both, and this one leaves the turn to it. In case that
            // pass died before its write, a Schedule comes back once its place has
            // lapsed: then the task takes a place or a ticket again, not wait for the
            // supervisor (one message, only when passes contend).
            Admission::Contended { until } => {
                let lost =
                    Refusal::ClaimLost { state: read.task.state(), locked: read.task.locked_by().is_some() };
                let delay_ms = until.millis_since(read.now) + 1;
                // Past a message's longest delay, the task's own deadline brings the
                // supervisor's ask instead.
                if delay_ms > crate::domain::wait::MAX_DELAYED_WAKE_MS {
                    return self.over(Done::Refused(lost));
                }
                self.at = At::Rearmed(lost);
                Next::Rearm { delay_ms }
            }
            // Noted again: a note lost to an error after the Queued write would leave
            // nobody to wake this ticket but the supervisor.
            Admission::StillWaiting { ticket } => {
                self.at = At::Noted { agent: place.gate.clone(), ticket, look: false };
                Next::NoteWaiter { agent: place.gate, ticket, at: read.now }
            }
        }
    }
}

/// The decision of a write that landed, to perform: the handler has let its share go by
/// then, so it is moved out rather than copied.
fn landed(decision: Arc<Decision>) -> Decision {
    Arc::try_unwrap(decision).unwrap_or_else(|shared| Decision::clone(&shared))
}

/// A report the machine cannot have asked for: a bug in the scheduler's loop.
fn unreachable_step(what: &str) -> Next {
    Next::Done(Done::KeptChanging(format!("scheduling lost its place: {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::fixtures::*;

    /// three-step's first step's agent, limited to one call at a time.
    fn limited(wf: &Workflow) -> (String, BTreeMap<String, Limits>) {
        let agent = wf.step(0).unwrap().agent.clone();
        let limits =
            Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None };
        (agent.clone(), BTreeMap::from([(agent, limits)]))
    }

    fn read<'w>(task: &TaskRecord, wf: &'w Workflow) -> Seen<'w> {
        Seen::Task(Some((task.clone(), wf, T0)))
    }

    fn run(limits: &BTreeMap<String, Limits>) -> Scheduling<'_> {
        Scheduling::new(OrderId::parse("o-1").unwrap(), lease(1), limits, policy())
    }

    /// A Schedule's run that has read `task` and asked to arrive at its gate.
    fn arrived<'w>(
        limits: &'w BTreeMap<String, Limits>,
        task: &TaskRecord,
        wf: &'w Workflow,
    ) -> Scheduling<'w> {
        let mut r = run(limits);
        r.next(Seen::Nothing);
        assert!(matches!(r.next(read(task, wf)), Next::Arrive { .. }), "an arrival at the gate");
        r
    }

    #[test]
    fn without_limits_a_schedule_is_one_decision_written_then_performed() {
        let wf = Workflow::three_step();
        let task = new_task(&wf);
        let none = BTreeMap::new();
        let mut r = run(&none);
        assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        let Next::Write { decision, revision } = r.next(read(&task, &wf)) else { panic!("a write") };
        assert_eq!((decision.trigger, revision), (Trigger::Claimed, task.revision));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { waited_ms: None, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Handled)));
    }

    #[test]
    fn a_lost_race_on_the_task_is_read_again_until_the_rounds_run_out() {
        let wf = Workflow::three_step();
        let task = new_task(&wf);
        let none = BTreeMap::new();
        let mut r = run(&none);
        r.next(Seen::Nothing);
        for _ in 0..conflict_retries(&wf) - 1 {
            assert!(matches!(r.next(read(&task, &wf)), Next::Write { .. }));
            assert!(matches!(r.next(Seen::Landed(false)), Next::ReadTask));
        }
        assert!(matches!(r.next(read(&task, &wf)), Next::Write { .. }));
        assert!(matches!(r.next(Seen::Landed(false)), Next::Done(Done::KeptChanging(_))));
    }

    #[test]
    fn a_limited_claim_takes_a_place_first_and_a_lost_write_gives_it_back() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let task = new_task(&wf);
        let mut r = run(&limits);
        assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        let Next::Arrive { place, ticket: None } = r.next(read(&task, &wf)) else { panic!("an arrival") };
        assert_eq!(place.gate, agent);
        assert!(matches!(r.next(Seen::Admission(Admission::Admitted)), Next::Write { .. }));
        // Without a ticket, the place goes back to the gate.
        let Next::Release { holder, .. } = r.next(Seen::Landed(false)) else { panic!("a release") };
        assert_eq!(holder, place.holder);
        assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        // Admitted again, and this time it lands.
        r.next(read(&task, &wf));
        r.next(Seen::Admission(Admission::Admitted));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { waited_ms: None, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Handled)));
    }

    #[test]
    fn a_waiting_task_arrives_with_its_ticket_and_a_lost_write_hands_the_place_back_to_it() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let queued = new_task(&wf).queue(&agent, 7, T0, &policy()).unwrap().next;
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        let Next::Arrive { ticket: Some(7), .. } = r.next(read(&queued, &wf)) else {
            panic!("with its ticket")
        };
        r.next(Seen::Admission(Admission::Admitted));
        assert!(matches!(r.next(Seen::Landed(false)), Next::Unclaim { ticket: 7, .. }));
        // A claim that lands after waiting says how long it waited.
        r.next(Seen::Nothing);
        r.next(read(&queued, &wf));
        r.next(Seen::Admission(Admission::Admitted));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { waited_ms: Some(0), .. }));
    }

    #[test]
    fn without_room_the_task_waits_with_a_ticket_notes_itself_and_looks_again() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let task = new_task(&wf);
        let mut r = arrived(&limits, &task, &wf);
        let Next::Write { decision, .. } = r.next(Seen::Admission(Admission::Queued { ticket: 3 })) else {
            panic!("the Queued write")
        };
        assert_eq!(decision.trigger, Trigger::Queued);
        // Its write lost: the ticket it took comes with its next arrival.
        assert!(matches!(r.next(Seen::Landed(false)), Next::ReadTask));
        assert!(matches!(r.next(read(&task, &wf)), Next::Arrive { ticket: Some(3), .. }));
        // Still behind, and not on the record yet: the Queued write again.
        let Next::Write { decision, .. } = r.next(Seen::Admission(Admission::StillWaiting { ticket: 3 }))
        else {
            panic!("the Queued write again")
        };
        assert_eq!(decision.next.queued().map(|q| q.ticket), Some(3));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { .. }));
        let Next::NoteWaiter { agent: noted, ticket: 3, .. } = r.next(Seen::Nothing) else {
            panic!("a note")
        };
        assert_eq!(noted, agent);
        assert!(matches!(r.next(Seen::Nothing), Next::LookBehind { ticket: 3, .. }));
        // Let through while it noted itself: another round at the gate.
        assert!(matches!(r.next(Seen::Behind(false)), Next::ReadTask));
    }

    #[test]
    fn a_ticket_still_behind_is_noted_again_and_nothing_is_written() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let task = new_task(&wf).queue(&agent, 2, T0, &policy()).unwrap().next;
        let mut r = arrived(&limits, &task, &wf);
        assert!(matches!(
            r.next(Seen::Admission(Admission::StillWaiting { ticket: 2 })),
            Next::NoteWaiter { ticket: 2, .. }
        ));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Handled)));
    }

    #[test]
    fn a_paused_task_woken_in_line_gives_its_reserved_place_to_the_next() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let queued = new_task(&wf).queue(&agent, 5, T0, &policy()).unwrap().next;
        let mut paused = queued.draft();
        paused.paused = true;
        let paused = paused.build().unwrap();
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        let Next::Release { holder, .. } = r.next(read(&paused, &wf)) else { panic!("a release") };
        assert_eq!(holder, reserved_for(5));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(Refusal::Paused))));
    }

    /// Woken with its ticket, a queued task's second pass finds the turn taken by the
    /// first (`Admission::Contended`): it stops without a write and without handing the
    /// ticket back, which the first pass holds, and comes back when that place lapses.
    #[test]
    fn a_second_pass_of_a_woken_claim_leaves_the_turn_to_the_first() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let queued = new_task(&wf).queue(&agent, 5, T0, &policy()).unwrap().next;
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        assert!(matches!(r.next(read(&queued, &wf)), Next::Arrive { ticket: Some(5), .. }));
        // Back after the other pass's place lapses, in case that pass died unwritten.
        let contended = Seen::Admission(Admission::Contended { until: T0.plus_ms(61_000) });
        assert!(matches!(r.next(contended), Next::Rearm { delay_ms: 61_001 }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(Refusal::ClaimLost { .. }))));
    }

    #[test]
    fn a_ticket_taken_for_a_write_that_lost_to_a_cancel_is_handed_back() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let task = new_task(&wf);
        let mut r = arrived(&limits, &task, &wf);
        // Ticket 3 taken, and the Queued write lost to a cancel: no place needed now.
        for seen in [Seen::Admission(Admission::Queued { ticket: 3 }), Seen::Landed(false)] {
            r.next(seen);
        }
        let cancelled = act(&task, &wf, crate::domain::task::outcome::Act::Cancel).next;
        let Next::Withdraw { agent: from, ticket: 3 } = r.next(read(&cancelled, &wf)) else {
            panic!("the ticket handed back")
        };
        assert_eq!(from, agent);
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(_))));
    }

    #[test]
    fn a_place_handed_back_to_a_ticket_the_task_has_left_is_withdrawn() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let queued = new_task(&wf).queue(&agent, 7, T0, &policy()).unwrap().next;
        let mut r = arrived(&limits, &queued, &wf);
        r.next(Seen::Admission(Admission::Admitted));
        // The claim lost to a cancel: the place goes back to ticket 7 ...
        assert!(matches!(r.next(Seen::Landed(false)), Next::Unclaim { ticket: 7, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        // ... and, the record no longer holding it, ticket 7 is withdrawn.
        let cancelled = act(&queued, &wf, crate::domain::task::outcome::Act::Cancel).next;
        assert!(matches!(r.next(read(&cancelled, &wf)), Next::Withdraw { ticket: 7, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(_))));
    }

    #[test]
    fn a_pass_that_runs_out_of_rounds_withdraws_the_ticket_it_took() {
        let wf = Workflow::three_step();
        let (_, limits) = limited(&wf);
        let task = new_task(&wf);
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        for round in 0..GATED_ROUNDS {
            r.next(read(&task, &wf));
            r.next(Seen::Admission(Admission::Queued { ticket: 3 }));
            match r.next(Seen::Landed(false)) {
                Next::ReadTask => continue,
                Next::Withdraw { ticket: 3, .. } => {
                    assert_eq!(round, GATED_ROUNDS - 1);
                    assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::KeptChanging(_))));
                    return;
                }
                other => panic!("{other:?}"),
            }
        }
        panic!("more than {GATED_ROUNDS} rounds");
    }

    #[test]
    fn the_gate_rounds_are_bounded() {
        let wf = Workflow::three_step();
        let (_, limits) = limited(&wf);
        let task = new_task(&wf);
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        for _ in 0..GATED_ROUNDS {
            r.next(read(&task, &wf));
            r.next(Seen::Admission(Admission::Admitted));
            r.next(Seen::Landed(false));
            if let Next::Done(done) = r.next(Seen::Nothing) {
                assert!(matches!(done, Done::KeptChanging(_)), "{done:?}");
                return;
            }
        }
        panic!("more than {GATED_ROUNDS} rounds");
    }

    fn woken<'w>(limits: &'w BTreeMap<String, Limits>, agent: &str, ticket: u64) -> Scheduling<'w> {
        let mut r = run(limits).woken_for(Some((agent.to_owned(), ticket)));
        assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        r
    }

    #[test]
    fn woken_for_the_ticket_it_holds_a_task_takes_its_turn() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        let queued = new_task(&wf).queue(&agent, 3, T0, &policy()).unwrap().next;
        let mut r = woken(&limits, &agent, 3);
        assert!(matches!(r.next(read(&queued, &wf)), Next::Arrive { ticket: Some(3), .. }));
    }

    #[test]
    fn woken_for_a_ticket_it_no_longer_holds_a_task_hands_the_turn_on_first() {
        let wf = Workflow::three_step();
        let (agent, limits) = limited(&wf);
        // It holds a newer ticket there: the old one's turn goes on, then it arrives with its own.
        let requeued = new_task(&wf).queue(&agent, 5, T0, &policy()).unwrap().next;
        let mut r = woken(&limits, &agent, 3);
        let Next::Withdraw { agent: a, ticket: 3 } = r.next(read(&requeued, &wf)) else {
            panic!("a withdrawal")
        };
        assert_eq!(a, agent);
        assert!(matches!(r.next(Seen::Nothing), Next::Arrive { ticket: Some(5), .. }));
        // Cancelled (Compensated at once: nothing took effect): the turn goes on, nothing else.
        let queued = new_task(&wf).queue(&agent, 3, T0, &policy()).unwrap().next;
        let cancelled = act(&queued, &wf, crate::domain::task::outcome::Act::Cancel).next;
        assert_eq!(cancelled.state(), crate::domain::ProcessState::Compensated);
        let mut r = woken(&limits, &agent, 3);
        assert!(matches!(r.next(read(&cancelled, &wf)), Next::Withdraw { ticket: 3, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(_))));
        // Gone.
        let mut r = woken(&limits, &agent, 3);
        assert!(matches!(r.next(Seen::Task(None)), Next::ReadTask), "read again without the gate");
        assert!(matches!(r.next(Seen::Task(None)), Next::Withdraw { ticket: 3, .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::NoSuchTask)));
    }

    /// A Schedule that finds its timer asleep is sent again for the wake time when a
    /// message can wait that long; a longer sleep is the supervisor's to wake.
    #[test]
    fn an_early_schedule_for_a_sleeping_timer_is_sent_again_for_its_time() {
        let wf = timer_first();
        let none = BTreeMap::new();
        let asleep = sleep(&new_task(&wf), &wf, T0);
        let mut r = run(&none);
        r.next(Seen::Nothing);
        let early = Seen::Task(Some((asleep.clone(), &wf, T0.plus_ms(400))));
        assert!(matches!(r.next(early), Next::Rearm { delay_ms: 600 }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(Refusal::Asleep { .. }))));
        // Asleep past what a message can wait: no Schedule, only the refusal.
        let long = Workflow::new(
            "long",
            vec![crate::domain::Step::timer("t", crate::domain::Wait::for_ms(3_600_000))],
        );
        let asleep = sleep(&new_task(&long), &long, T0);
        let mut r = run(&none);
        r.next(Seen::Nothing);
        let early = Seen::Task(Some((asleep, &long, T0.plus_ms(400))));
        assert!(matches!(r.next(early), Next::Done(Done::Refused(Refusal::Asleep { .. }))));
    }

    /// three-step's first step's agent, with 4 places and 1 per customer.
    fn keyed(wf: &Workflow) -> (String, BTreeMap<String, Limits>) {
        use crate::domain::gate::{OrderKey, PerKey};
        let agent = wf.step(0).unwrap().agent.clone();
        let per_key = Some(PerKey { key: OrderKey::CustomerId, limit: 1 });
        let limits = Limits { max_in_flight: Some(4), per_key, ..Limits::default() };
        (agent.clone(), BTreeMap::from([(agent, limits)]))
    }

    fn key_gate(limits: &BTreeMap<String, Limits>, agent: &str, task: &TaskRecord) -> String {
        key_gate_of(agent, &limits[agent], |k| task.order.key_value(k)).unwrap().0
    }

    #[test]
    fn under_a_per_key_limit_a_claim_takes_its_key_place_then_waits_in_the_agents_line() {
        let wf = Workflow::three_step();
        let (agent, limits) = keyed(&wf);
        let task = new_task(&wf);
        let key = key_gate(&limits, &agent, &task);
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        let Next::Arrive { place, ticket: None } = r.next(read(&task, &wf)) else { panic!("the key gate") };
        assert_eq!((place.gate.as_str(), place.holder.as_str()), (key.as_str(), "o-1#1"));
        assert_eq!(place.limits.max_in_flight, Some(1));
        let Next::Arrive { place: at_agent, ticket: None } = r.next(Seen::Admission(Admission::Admitted))
        else {
            panic!("then the agent's")
        };
        assert_eq!((at_agent.gate.as_str(), at_agent.until), (agent.as_str(), place.until));
        let Next::Write { decision, .. } = r.next(Seen::Admission(Admission::Queued { ticket: 3 })) else {
            panic!("the Queued write")
        };
        assert_eq!(decision.next.queued().map(|q| (q.agent.as_str(), q.ticket)), Some((agent.as_str(), 3)));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::NoteWaiter { ticket: 3, .. }));
        // Woken from the agent's line, it asks its key place again (the same holder: it
        // holds it still) and arrives with the agent's ticket.
        let queued = decision.next.clone();
        let mut r = run(&limits);
        r.next(Seen::Nothing);
        let Next::Arrive { place, ticket: None } = r.next(read(&queued, &wf)) else { panic!("the key gate") };
        assert_eq!(place.holder, "o-1#1");
        assert!(matches!(r.next(Seen::Admission(Admission::Admitted)), Next::Arrive { ticket: Some(3), .. }));
        assert!(matches!(r.next(Seen::Admission(Admission::Admitted)), Next::Write { .. }));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { .. }));
    }

    #[test]
    fn a_keys_flood_waits_in_its_own_line_and_its_turn_takes_it_on_to_the_agents_gate() {
        let wf = Workflow::three_step();
        let (agent, limits) = keyed(&wf);
        let task = new_task(&wf);
        let key = key_gate(&limits, &agent, &task);
        let mut r = arrived(&limits, &task, &wf);
        let Next::Write { decision, .. } = r.next(Seen::Admission(Admission::Queued { ticket: 4 })) else {
            panic!("the Queued write")
        };
        assert_eq!(decision.next.queued().map(|q| (q.agent.clone(), q.ticket)), Some((key.clone(), 4)));
        r.next(Seen::Landed(true));
        let Next::NoteWaiter { agent: noted, .. } = r.next(Seen::Nothing) else { panic!("a note") };
        assert_eq!(noted, key);
        // The key's turn: its ticket at the key gate, then the agent's gate, then the claim.
        let queued = decision.next.clone();
        let mut r = woken(&limits, &key, 4);
        let Next::Arrive { place, ticket: Some(4) } = r.next(read(&queued, &wf)) else {
            panic!("with its ticket")
        };
        assert_eq!(place.gate, key);
        let Next::Arrive { place, ticket: None } = r.next(Seen::Admission(Admission::Admitted)) else {
            panic!("the agent's gate")
        };
        assert_eq!(place.gate, agent);
        r.next(Seen::Admission(Admission::Admitted));
        assert!(matches!(r.next(Seen::Landed(true)), Next::Perform { waited_ms: Some(0), .. }));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Handled)));
    }

    #[test]
    fn a_lost_claim_gives_back_both_places_unless_another_pass_of_the_attempt_claimed() {
        let wf = Workflow::three_step();
        let (agent, limits) = keyed(&wf);
        let task = new_task(&wf);
        let key = key_gate(&limits, &agent, &task);
        let admitted_twice = |r: &mut Scheduling<'_>| {
            r.next(Seen::Admission(Admission::Admitted));
            assert!(matches!(r.next(Seen::Admission(Admission::Admitted)), Next::Write { .. }));
            let Next::Release { agent: from, .. } = r.next(Seen::Landed(false)) else { panic!("a release") };
            assert_eq!(from, agent);
            assert!(matches!(r.next(Seen::Nothing), Next::ReadTask));
        };
        // Lost to a cancel: the key place goes back too.
        let mut r = arrived(&limits, &task, &wf);
        admitted_twice(&mut r);
        let cancelled = act(&task, &wf, crate::domain::task::outcome::Act::Cancel).next;
        let Next::Release { agent: from, holder } = r.next(read(&cancelled, &wf)) else {
            panic!("the key's")
        };
        assert_eq!((from, holder.as_str()), (key.clone(), "o-1#1"));
        assert!(matches!(r.next(Seen::Nothing), Next::Done(Done::Refused(_))), "then decided again");
        // Lost to another pass of the same attempt: it claimed with that key place.
        let mut r = arrived(&limits, &task, &wf);
        admitted_twice(&mut r);
        let other = claim(&task, &wf, 2, T0);
        assert_eq!(other.attempt, 1);
        let next = r.next(read(&other, &wf));
        assert!(
            matches!(next, Next::Done(Done::Refused(Refusal::ClaimLost { .. }))),
            "nothing given back: {next:?}"
        );
        // ... and cancelled since, its call still out: that claim still holds the place.
        let mut r = arrived(&limits, &task, &wf);
        admitted_twice(&mut r);
        let cancelled = act(&other, &wf, crate::domain::task::outcome::Act::Cancel).next;
        assert!(cancelled.locked_by().is_none());
        let next = r.next(read(&cancelled, &wf));
        assert!(matches!(next, Next::Done(Done::Refused(_))), "nothing given back: {next:?}");
        // Lost to a write that changed nothing it needs: it asks its key place again.
        let mut r = arrived(&limits, &task, &wf);
        admitted_twice(&mut r);
        let Next::Arrive { place, .. } = r.next(read(&task, &wf)) else { panic!("the key gate again") };
        assert_eq!(place.gate, key);
    }

    /// Its key place lapsed while it waited in the agent's line: woken by the agent's
    /// turn, the key gate has no room, so it waits in the key's line and hands the turn on.
    #[test]
    fn a_key_place_lapsed_in_the_agents_line_sends_the_task_back_to_the_keys() {
        let wf = Workflow::three_step();
        let (agent, limits) = keyed(&wf);
        let queued = new_task(&wf).queue(&agent, 3, T0, &policy()).unwrap().next;
        let key = key_gate(&limits, &agent, &queued);
        let mut r = woken(&limits, &agent, 3);
        assert!(matches!(r.next(read(&queued, &wf)), Next::Arrive { ticket: None, .. }));
        let Next::Write { decision, .. } = r.next(Seen::Admission(Admission::Queued { ticket: 9 })) else {
            panic!("the Queued write")
        };
        assert_eq!(decision.next.queued().map(|q| (q.agent.clone(), q.ticket)), Some((key, 9)));
        // The agent's ticket, on the record, goes back with the write.
        let handed_back =
            decision.effects.iter().any(|e| matches!(e, Effect::HandBack(t) if t.agent == agent));
        assert!(handed_back, "{:?}", decision.effects);
        // A ticket at the agent's gate only this pass held is withdrawn before the write.
        let task = new_task(&wf);
        let mut r = woken(&limits, &agent, 5);
        assert!(matches!(r.next(read(&task, &wf)), Next::Arrive { ticket: None, .. }));
        let Next::Withdraw { agent: from, ticket: 5 } =
            r.next(Seen::Admission(Admission::Queued { ticket: 9 }))
        else {
            panic!("the agent's turn handed on")
        };
        assert_eq!(from, agent);
        assert!(matches!(r.next(Seen::Nothing), Next::Write { .. }));
    }
}
