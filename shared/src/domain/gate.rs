//! Flow control: the gate of one agent with limits (`max_in_flight`, `max_per_second`),
//! shared by every container through one item of the state table.
//!
//! A call may start only while it holds a place in its agent's gate. A place is a lease,
//! not a count: it names its holder and lasts until a time, so a holder that dies gives
//! it back when that time passes, whoever reads the gate next (`prune`). A call's place
//! lasts until its complete-by plus the reply grace (the agent stops calling by then),
//! unless the scheduler gives it back sooner, when it applies the call's reply.
//!
//! Work that finds the gate full takes a ticket and waits, in ticket order: each change
//! of the gate lets the lowest waiting tickets through while there is room, reserving a
//! place for each (`Hold::reserved`) until its task comes to take it. Nothing about
//! waiting counts as a failure.
//!
//! The rate (`max_per_second`) is held the same way: a call's place counts against the
//! rate from the moment it is given until one second after it is given back (`tails`).
//! So the calls that start in any one-second window all held their places at one
//! instant (the latest of their admissions), and there are never more of those than
//! the limit. That argument needs one request per place: an agent with a rate limit
//! makes one request per dispatch (`handlers::agent`).
//!
//! An agent's places are spread over as many gate items as keep each one small
//! (`Limits::gates`, `PLACES_PER_GATE` places each): DynamoDB bills every write of an
//! item by its size and takes at most 1,000 write units and 3,000 read units a second per
//! item, so one item of 1,000 places (about 50 KB) could take 20 writes a second, and one
//! of any size takes at most a few hundred calls a second (each call reads its gate about
//! four times and writes it about three). Each gate holds its share
//! of the limits (`Limits::of_gate`, the shares adding up to the agent's), and an order's
//! calls always go through the same one (`gate_of`, by a digest of the order id), so a
//! reply, a lapse or a cancel finds its place without being told where it is. The shares
//! hold the agent's limits because they add up to them; what it costs is that a gate
//! with waiters does not borrow another's free place (docs/ARCHITECTURE.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ids::{LeaseToken, OrderId, Timestamp};

/// The window `max_per_second` counts over.
pub const RATE_WINDOW_MS: u64 = 1_000;
/// How long a place reserved for a ticket waits for its task's claim before it goes to
/// the next in line.
pub const RESERVATION_MS: u64 = 10_000;
/// The longest pause a remote's Retry-After buys: a longer one is cut to this.
pub const MAX_PAUSE_MS: u64 = 300_000;
/// The shortest: `Retry-After: 0`, a date already past, or a queue worker's
/// `retry_after_ms: 0` would otherwise send the next call at once into the same refusal,
/// a tight loop against a service that asked to be left alone.
pub const MIN_PAUSE_MS: u64 = 1_000;

/// A remote's requested pause as the gate and the task keep it.
pub fn pause_ms(retry_after_ms: u64) -> u64 {
    retry_after_ms.clamp(MIN_PAUSE_MS, MAX_PAUSE_MS)
}
/// The most withdrawn tickets a gate marks to skip: every write of the gate is billed by
/// its size (each entry a few bytes, all of them under 2 KB). A ticket withdrawn past
/// this is let through in its turn, and its wake (`Schedule::turn`) finds the task no
/// longer holding it and hands the place on then.
pub const MAX_WITHDRAWN: usize = 256;
/// The largest `max_in_flight` a definition may set: 100 gate items of 10 places.
pub const MAX_IN_FLIGHT_LIMIT: u32 = 1_000;
/// The largest `max_per_second`: 1,000 calls a second over 100 gate items of under 1 KB,
/// each call about three writes and four reads, bill each item about 30 write units a
/// second.
pub const MAX_PER_SECOND_LIMIT: u32 = 1_000;
/// The most places (and calls a second) one gate item holds: each place's entry is about
/// 50 bytes, so a full gate with its rate window stays under 1 KB, one write unit; and
/// with calls of 100 ms or more, its 100 calls a second take about 300 of the item's
/// 1,000 write units and 400 of its 3,000 read units, once a burst's arrivals (a write
/// each) are through (docs/BENCHMARKS.md section 11).
pub const PLACES_PER_GATE: u32 = 10;

/// An agent's limits, from the definition file. Neither `max_in_flight` nor
/// `max_per_second` set: no gate at all (a per-key limit needs one of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_in_flight: Option<u32>,
    pub max_per_second: Option<u32>,
    /// Places per gate item, if not `PLACES_PER_GATE`: the simulation sets it small, so
    /// that a few places spread over several gates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub places_per_gate: Option<u32>,
    /// At most this many calls in flight for orders of one key (`key_gate_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_key: Option<PerKey>,
}

/// The largest per-key limit a definition may set: a key's gate is one item, never
/// spread, so it stays at about 5 KB (5 write units a write) at most.
pub const MAX_PER_KEY_LIMIT: u32 = 100;

/// `max_in_flight_per_key`: orders whose `key` field holds one value share `limit` places,
/// in a gate of their own in front of the agent's (`key_gate_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerKey {
    pub key: OrderKey,
    pub limit: u32,
}

/// The order's fields a per-key limit may name (`$.order.<field>`): the scalar ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderKey {
    #[serde(rename = "$.order.order_id")]
    OrderId,
    #[serde(rename = "$.order.customer_id")]
    CustomerId,
    #[serde(rename = "$.order.workflow")]
    Workflow,
    #[serde(rename = "$.order.workflow_version")]
    WorkflowVersion,
}

impl OrderKey {
    /// Every field, with its path.
    pub const ALL: [(OrderKey, &'static str); 4] = [
        (OrderKey::OrderId, "$.order.order_id"),
        (OrderKey::CustomerId, "$.order.customer_id"),
        (OrderKey::Workflow, "$.order.workflow"),
        (OrderKey::WorkflowVersion, "$.order.workflow_version"),
    ];

    pub fn parse(path: &str) -> Option<OrderKey> {
        OrderKey::ALL.iter().find(|(_, p)| *p == path).map(|(k, _)| *k)
    }

    pub fn path(self) -> &'static str {
        OrderKey::ALL.iter().find(|(k, _)| *k == self).map_or("", |(_, p)| p)
    }
}

impl Limits {
    pub fn any(&self) -> bool {
        self.max_in_flight.is_some() || self.max_per_second.is_some()
    }

    /// How many gate items hold the agent's places: enough for `PLACES_PER_GATE` each,
    /// and never more than each limit, so every gate's share of each is at least 1.
    pub fn gates(&self) -> u32 {
        let per = self.places_per_gate.unwrap_or(PLACES_PER_GATE).max(1);
        let set = || [self.max_in_flight, self.max_per_second].into_iter().flatten();
        let widest = set().max().unwrap_or(1);
        let narrowest = set().min().unwrap_or(1);
        widest.div_ceil(per).clamp(1, narrowest.max(1))
    }

    /// Gate `k`'s share of `n`: the limits split as evenly as whole numbers go, the
    /// first gates taking one more where they do not divide.
    pub fn of_gate(&self, k: u32, n: u32) -> Limits {
        if crate::mutations::whole_limits_per_gate() {
            return *self;
        }
        let share = |m: u32| m / n + u32::from(k < m % n);
        Limits {
            max_in_flight: self.max_in_flight.map(share),
            max_per_second: self.max_per_second.map(share),
            places_per_gate: self.places_per_gate,
            per_key: self.per_key,
        }
    }

    /// How long a call's place lasts if nobody gives it back: past complete-by and the
    /// grace the agent is held to, and, under a rate limit, the window after it.
    pub fn hold_until(&self, complete_by: Timestamp, grace_ms: u64) -> Timestamp {
        let tail = if self.max_per_second.is_some() { RATE_WINDOW_MS } else { 0 };
        complete_by.plus_ms(grace_ms + tail)
    }
}

/// The gate an order's calls at `agent` take their places in, and its share of the
/// agent's limits: the agent's own name while one gate holds them all (as before there
/// were several), else `<agent>@<k>`, `k` from a digest of the order id, so every
/// process finds the same one. Agent names hold no `@` (`definitions`).
pub fn gate_of(agent: &str, limits: &Limits, order_id: &OrderId) -> (String, Limits) {
    let n = limits.gates();
    if n == 1 {
        return (agent.to_owned(), *limits);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, order_id.as_str().as_bytes());
    let mut first = [0u8; 4];
    first.copy_from_slice(&digest.as_ref()[..4]);
    let k = u32::from_be_bytes(first) % n;
    (format!("{agent}@{k}"), limits.of_gate(k, n))
}

/// The key gate an order's calls at `agent` pass first, if the agent has a per-key
/// limit: `<agent>%<first 16 hex digits of the SHA-256 of the key's value>`, holding
/// `limit` places, never spread (one key's calls are few by design). Agent names hold
/// no `%` (`definitions`).
/// `value`: the order's value of a field (`messages::Order::key_value`).
pub fn key_gate_of(
    agent: &str,
    limits: &Limits,
    value: impl FnOnce(OrderKey) -> String,
) -> Option<(String, Limits)> {
    let per_key = limits.per_key?;
    let value = value(per_key.key);
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let hex: String = digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some((format!("{agent}%{hex}"), key_limits(per_key)))
}

/// The limits of a key gate: its `limit` places, nothing else.
fn key_limits(per_key: PerKey) -> Limits {
    Limits { max_in_flight: Some(per_key.limit), ..Limits::default() }
}

/// Who holds a call's place in its key gate: the attempt, not one pass of it
/// (`<order>#<attempt>`), so a later pass of the same attempt, woken from the agent's
/// line, finds the place it took still its own.
pub fn key_holder(order_id: &OrderId, attempt: u32) -> String {
    format!("{order_id}#{attempt}")
}

/// The agent a gate belongs to (`<agent>`, `<agent>@<k>` or `<agent>%<key digest>`).
pub fn agent_of_gate(gate: &str) -> &str {
    gate.split_once(['@', '%']).map_or(gate, |(agent, _)| agent)
}

/// Whether the gate is a key gate (`key_gate_of`).
pub fn is_key_gate(gate: &str) -> bool {
    gate.contains('%')
}

/// Every gate of an agent with `limits`, in order.
pub fn gates_of(agent: &str, limits: &Limits) -> Vec<String> {
    match limits.gates() {
        1 => vec![agent.to_owned()],
        n => (0..n).map(|k| format!("{agent}@{k}")).collect(),
    }
}

/// The limits the gate named `gate` holds, from every agent's: `None` if its agent has
/// none any more, or spreads them over other gates now (its limits changed). A task
/// waiting there then arrives at its new gate afresh, and what the old one holds lapses.
pub fn limits_of_gate(all: &BTreeMap<String, Limits>, gate: &str) -> Option<Limits> {
    let limits = all.get(agent_of_gate(gate))?;
    if is_key_gate(gate) {
        return limits.per_key.map(key_limits);
    }
    let n = limits.gates();
    match gate.split_once('@') {
        None => (n == 1).then_some(*limits),
        Some((_, k)) => {
            let k: u32 = k.parse().ok()?;
            (n > 1 && k < n).then(|| limits.of_gate(k, n))
        }
    }
}

/// Who holds a place: one claim of one task (`<order>#<attempt>.<lease's first 8 hex
/// digits>`), or a ticket let through and not yet claimed (`#<ticket>`). The lease tells
/// apart two schedulers that decided the same attempt of one task (a duplicate
/// Schedule): the one whose claim loses gives back its own place, never the winner's.
pub fn call_holder(order_id: &OrderId, attempt: u32, lease: &LeaseToken) -> String {
    let mut hex = uuid::Uuid::encode_buffer();
    let lease = lease.0.simple().encode_lower(&mut hex);
    format!("{order_id}#{attempt}.{}", &lease[..8])
}

/// Whether two holders are passes of one attempt of one task (`call_holder`: the same
/// `<order>#<attempt>.`, another lease).
fn same_claim(a: &str, b: &str) -> bool {
    matches!((a.rsplit_once('.'), b.rsplit_once('.')), (Some((x, _)), Some((y, _))) if x == y)
}

/// How long a call's mark (`CallMark`) is kept past the call's complete-by before it
/// expires on its own: far past any clock's skew, so no copy that may still call (one
/// arriving before complete-by by its own clock) finds it gone.
pub const CALL_MARK_KEPT_MS: u64 = 3_600_000;

/// The mark a limited agent's call leaves in the state table before it starts: SQS
/// delivers a request at least once, and its place in the gate covers one call, so only
/// the request that writes the mark first may call (`CallStart`). Keyed by the call
/// (`call#<order>#<attempt>.<lease's first 8 hex digits>#<step>`: one claim's call of one
/// step; order ids never hold `#`, so no task can take the key), and kept until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallMark {
    pub key: String,
    pub until: Timestamp,
}

impl CallMark {
    pub fn new(
        order_id: &OrderId,
        step: u32,
        attempt: u32,
        lease: &LeaseToken,
        complete_by: Timestamp,
    ) -> CallMark {
        CallMark {
            key: format!("call#{}#{step}", call_holder(order_id, attempt, lease)),
            until: complete_by.plus_ms(CALL_MARK_KEPT_MS),
        }
    }
}

/// What came of writing a call's mark (a write conditional on the mark being new).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStart {
    /// Written now: this request's call is the place's one call.
    Started,
    /// Already there: another request for the same call wrote it (a copy, in this
    /// container or another, or this request before its container crashed or failed to
    /// reply).
    AlreadyStarted,
}

impl CallStart {
    /// Whether the request may call the remote. A request that lost neither calls nor
    /// replies: the one that started the call replies, or, if it died, the task's
    /// complete-by lapses and the supervisor recovers it, as for any lost attempt. A
    /// request that started the call and died before calling leaves the place unused
    /// until then: the safe side, since the place is held either way.
    pub fn may_call(self) -> bool {
        matches!(self, CallStart::Started)
    }
}

/// The holder of a place reserved for `ticket`, let through and not yet claimed.
pub fn reserved_for(ticket: u64) -> String {
    format!("#{ticket}")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub holder: String,
    pub until: Timestamp,
}

/// One gate item of an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gate {
    /// The gate's name (`gate_of`): the agent's, or `<agent>@<k>`.
    pub agent: String,
    /// Places held: calls in flight and places reserved for tickets let through.
    #[serde(default)]
    pub holds: Vec<Hold>,
    /// Under a rate limit, when each place given back in the last window stops counting.
    #[serde(default)]
    pub tails: Vec<Timestamp>,
    /// Tickets handed out; the next is this number.
    #[serde(default)]
    pub issued: u64,
    /// Tickets let through: every ticket below this one has had its turn.
    #[serde(default)]
    pub admitted: u64,
    /// Tickets still behind whose tasks left the line (a cancel, a new ticket in place of
    /// a lapsed one): their turn is skipped, so no place waits for a task that will not
    /// come. In ascending order; each goes when its turn comes. At most `MAX_WITHDRAWN`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withdrawn: Vec<u64>,
    /// The remote asked to be left alone until then (a 429 or 503 with Retry-After).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<Timestamp>,
    /// When a look at the gate is already on its way (`Passage::poke`): while tickets
    /// wait and only time can make room (a rate window, a pause, a place that lapses),
    /// nobody else would come back to let them through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poke_at: Option<Timestamp>,
    /// Bumped by every write; every write is conditional on the revision read (0: the
    /// gate was never written).
    #[serde(default)]
    pub revision: u64,
}

/// A task's place in the line of an agent's gate, kept on the task's record while it
/// waits (`TaskRecord::queued`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The gate's name (`gate_of`).
    pub agent: String,
    pub ticket: u64,
    /// When the task first came to the gate for this step: the wait is measured from it.
    pub since: Timestamp,
}

/// What an arrival at the gate came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A place is held for the call: claim and dispatch.
    Admitted,
    /// No room, or others wait first: this ticket was handed out; wait for its turn.
    Queued { ticket: u64 },
    /// The ticket already held has not had its turn yet.
    StillWaiting { ticket: u64 },
    /// The ticket's turn was taken by another pass of the same claim (two Schedules of
    /// one task, read at one revision): at most one of their writes can land, and a new
    /// ticket here would send the task to the back of the line if it were this one's.
    /// `until`: when that pass's place lapses if its claim never lands (it died).
    Contended { until: Timestamp },
}

/// What withdrawing a ticket came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawn {
    /// Its place was reserved: it went to the next in line.
    PlaceFreed,
    /// Still behind: its turn will be skipped.
    Skipped,
    /// Still behind, but `MAX_WITHDRAWN` are marked already: its turn's wake hands the
    /// place on.
    Unmarked,
    /// Its turn had come and gone (its place claimed or lapsed): nothing held.
    Nothing,
}

/// A decided change of the gate: write `next` conditional on the revision read, then
/// wake the tasks of `wake` (tickets let through, in order), and send a look at the gate
/// for `poke` if set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage<T> {
    pub next: Gate,
    pub outcome: T,
    pub wake: Vec<u64>,
    pub poke: Option<Timestamp>,
}

impl Gate {
    pub fn new(agent: &str) -> Gate {
        Gate {
            agent: agent.to_owned(),
            holds: Vec::new(),
            tails: Vec::new(),
            issued: 0,
            admitted: 0,
            withdrawn: Vec::new(),
            paused_until: None,
            poke_at: None,
            revision: 0,
        }
    }

    /// Tickets handed out that have not had their turn, their tasks still in line.
    pub fn waiting(&self) -> u64 {
        self.issued.saturating_sub(self.admitted).saturating_sub(self.withdrawn.len() as u64)
    }

    /// A task arrives for a call that would hold its place until `until`, with the
    /// ticket it took before, if any.
    pub fn arrive(
        &self,
        now: Timestamp,
        limits: &Limits,
        holder: &str,
        until: Timestamp,
        ticket: Option<u64>,
    ) -> Passage<Admission> {
        let mut next = self.moved(now);
        let mut wake = next.let_through(now, limits);
        let outcome = match ticket {
            Some(t) if t >= next.admitted && t < next.issued => Admission::StillWaiting { ticket: t },
            Some(t) if let Some(place) = next.holds.iter_mut().find(|h| h.holder == reserved_for(t)) => {
                *place = Hold { holder: holder.to_owned(), until };
                wake.retain(|w| *w != t);
                Admission::Admitted
            }
            // No ticket, or one whose reserved place lapsed (or that this gate never
            // handed out): in at once only if nobody waits.
            // The same claim asking twice (a redelivered message, or a later pass of the
            // attempt at a key gate): it holds its place, until the later of the two.
            _ if let Some(h) = next.holds.iter_mut().find(|h| h.holder == holder) => {
                h.until = h.until.max(until);
                Admission::Admitted
            }
            Some(_) if let Some(h) = next.holds.iter().find(|h| same_claim(&h.holder, holder)) => {
                Admission::Contended { until: h.until }
            }
            _ => {
                if next.waiting() == 0 && next.has_room(now, limits) {
                    next.holds.push(Hold { holder: holder.to_owned(), until });
                    Admission::Admitted
                } else {
                    let ticket = next.issued;
                    next.issued += 1;
                    Admission::Queued { ticket }
                }
            }
        };
        let poke = next.plan_poke(now, limits);
        Passage { next, outcome, wake, poke }
    }

    /// A look at the gate, and nothing else: lapsed places and tails go, and waiting
    /// tickets are let through if that made room.
    /// `planned`: the time the look was sent for. A look that comes before it (clocks of
    /// two containers, or SQS's longest delay) plans the next one instead of trusting
    /// that one is on its way.
    pub fn look(&self, now: Timestamp, limits: &Limits, planned: Option<Timestamp>) -> Passage<()> {
        let mut next = self.moved(now);
        if next.poke_at.is_some_and(|p| planned.is_some_and(|at| p <= at)) {
            next.poke_at = None;
        }
        let wake = next.let_through(now, limits);
        let poke = next.plan_poke(now, limits);
        Passage { next, outcome: (), wake, poke }
    }

    /// The call (or reserved place) of `holder` is over: its place is free, and under a
    /// rate limit still counts for one window. `false` when it had lapsed already.
    pub fn release(&self, now: Timestamp, limits: &Limits, holder: &str) -> Passage<bool> {
        let mut next = self.moved(now);
        let released = match next.holds.iter().position(|h| h.holder == holder) {
            Some(i) => {
                next.holds.remove(i);
                true
            }
            None => false,
        };
        // A reserved place that was never claimed made no call: no tail.
        if released && limits.max_per_second.is_some() && !holder.starts_with('#') {
            next.tails.push(now.plus_ms(RATE_WINDOW_MS));
        }
        let wake = next.let_through(now, limits);
        let poke = next.plan_poke(now, limits);
        Passage { next, outcome: released, wake, poke }
    }

    /// A claim that held a place given it for `ticket` lost its task write: the place
    /// goes back to the ticket (reserved again), so the task keeps its turn.
    /// If a place is reserved for the ticket already (two passes of its task each took
    /// one, and both lost their writes), this one is released instead: one reservation
    /// per ticket, never a second place held for nobody.
    pub fn unclaim(&self, now: Timestamp, limits: &Limits, holder: &str, ticket: u64) -> Passage<bool> {
        let reserved = reserved_for(ticket);
        if self.holds.iter().any(|h| h.holder == reserved) {
            return self.release(now, limits, holder);
        }
        let mut next = self.moved(now);
        let found = match next.holds.iter_mut().find(|h| h.holder == holder) {
            Some(place) => {
                *place = Hold { holder: reserved, until: now.plus_ms(RESERVATION_MS) };
                true
            }
            None => false,
        };
        Passage { next, outcome: found, wake: Vec::new(), poke: None }
    }

    /// The task of `ticket` left the line without taking its turn: a place reserved for
    /// it goes to the next in line, and a ticket still behind is skipped when its turn
    /// comes. What it came to, for the count and the log.
    pub fn withdraw(&self, now: Timestamp, limits: &Limits, ticket: u64) -> Passage<Withdrawn> {
        let mut next = self.moved(now);
        let outcome = if let Some(i) = next.holds.iter().position(|h| h.holder == reserved_for(ticket)) {
            next.holds.remove(i);
            Withdrawn::PlaceFreed
        } else if next.behind(ticket) {
            match next.withdrawn.binary_search(&ticket) {
                Ok(_) => Withdrawn::Skipped,
                Err(_) if next.withdrawn.len() >= MAX_WITHDRAWN => Withdrawn::Unmarked,
                Err(at) => {
                    next.withdrawn.insert(at, ticket);
                    Withdrawn::Skipped
                }
            }
        } else {
            Withdrawn::Nothing
        };
        let wake = next.let_through(now, limits);
        let poke = next.plan_poke(now, limits);
        Passage { next, outcome, wake, poke }
    }

    /// The remote asked for a pause (Retry-After): nobody is let through before `until`.
    pub fn pause(&self, now: Timestamp, until: Timestamp) -> Gate {
        let mut next = self.moved(now);
        next.paused_until = Some(next.paused_until.map_or(until, |p| p.max(until)));
        next
    }

    /// Whether the ticket is still to be let through (`false` once its turn came).
    pub fn behind(&self, ticket: u64) -> bool {
        ticket >= self.admitted && ticket < self.issued
    }

    /// The gate as the next write leaves it: lapsed places and tails dropped.
    fn moved(&self, now: Timestamp) -> Gate {
        let mut next = self.clone();
        next.holds.retain(|h| h.until > now);
        next.tails.retain(|t| *t > now);
        // Only tickets behind are marked; an item written otherwise keeps none that passed.
        let admitted = next.admitted;
        next.withdrawn.retain(|t| *t >= admitted);
        if next.paused_until.is_some_and(|p| p <= now) {
            next.paused_until = None;
        }
        if next.poke_at.is_some_and(|p| p <= now) {
            next.poke_at = None;
        }
        next.revision += 1;
        next
    }

    fn has_room(&self, now: Timestamp, limits: &Limits) -> bool {
        if self.paused_until.is_some_and(|p| p > now) {
            return false;
        }
        let calls = self.holds.len() as u64;
        limits.max_in_flight.is_none_or(|m| calls < u64::from(m))
            && limits.max_per_second.is_none_or(|m| calls + (self.tails.len() as u64) < u64::from(m))
    }

    /// When time alone may make room for the waiting tickets, if a look at the gate is
    /// not on its way by then already; noted in `poke_at`. The earliest of the pause's
    /// end, a tail's end and a place's lapse: a look that comes too early finds no room
    /// and plans the next.
    fn plan_poke(&mut self, now: Timestamp, limits: &Limits) -> Option<Timestamp> {
        if self.waiting() == 0 || self.has_room(now, limits) {
            return None;
        }
        let at = self
            .paused_until
            .into_iter()
            .chain(self.tails.iter().copied())
            .chain(self.holds.iter().map(|h| h.until))
            .filter(|t| *t > now)
            .min()?;
        if self.poke_at.is_some_and(|p| p > now && p <= at) {
            return None;
        }
        self.poke_at = Some(at);
        Some(at)
    }

    /// Lets the lowest waiting tickets through while there is room, each with a place
    /// reserved for `RESERVATION_MS`; returns them.
    fn let_through(&mut self, now: Timestamp, limits: &Limits) -> Vec<u64> {
        let mut through = Vec::new();
        while self.admitted < self.issued {
            let t = self.admitted;
            if self.withdrawn.first() == Some(&t) {
                self.withdrawn.remove(0);
                self.admitted += 1;
                continue;
            }
            if !self.has_room(now, limits) {
                break;
            }
            self.holds.push(Hold { holder: reserved_for(t), until: now.plus_ms(RESERVATION_MS) });
            self.admitted += 1;
            through.push(t);
        }
        through
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per outcome of the conditional write: only the request that wrote the
    /// mark calls; the mark names the call, and lives past its complete-by.
    #[test]
    fn only_the_request_that_started_the_call_calls() {
        for (outcome, calls) in [(CallStart::Started, true), (CallStart::AlreadyStarted, false)] {
            assert_eq!(outcome.may_call(), calls, "{outcome:?}");
        }
        let order = OrderId::parse("o-1").unwrap();
        let lease = LeaseToken(uuid::Uuid::from_u128(0xabcd_ef01_0000_0000_0000_0000_0000_0001));
        let mark = CallMark::new(&order, 2, 3, &lease, Timestamp(10_000));
        assert_eq!(mark.key, "call#o-1#3.abcdef01#2");
        assert_eq!(mark.until, Timestamp(10_000 + CALL_MARK_KEPT_MS));
        // Another step, attempt or lease is another call; a copy of the request is not.
        assert_eq!(CallMark::new(&order, 2, 3, &lease, Timestamp(10_000)), mark);
        for other in [
            CallMark::new(&order, 1, 3, &lease, Timestamp(10_000)),
            CallMark::new(&order, 2, 4, &lease, Timestamp(10_000)),
            CallMark::new(&order, 2, 3, &LeaseToken(uuid::Uuid::from_u128(1)), Timestamp(10_000)),
            CallMark::new(&OrderId::parse("o-2").unwrap(), 2, 3, &lease, Timestamp(10_000)),
        ] {
            assert_ne!(other.key, mark.key);
        }
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    const TWO: Limits =
        Limits { max_in_flight: Some(2), max_per_second: None, places_per_gate: None, per_key: None };

    /// One place, held by `a#1` until 50; tickets 0 (`b#1`) and 1 (`c#1`) wait.
    fn one_place_two_waiting() -> (Limits, Gate) {
        let one =
            Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None };
        let g = Gate::new("pay").arrive(at(0), &one, "a#1", at(50), None).next;
        let g = g.arrive(at(1), &one, "b#1", at(100), None).next;
        (one, g.arrive(at(2), &one, "c#1", at(100), None).next)
    }

    #[test]
    fn arrivals_pass_while_there_is_room_then_take_tickets_in_order() {
        let g = Gate::new("pay");
        let a = g.arrive(at(0), &TWO, "a#1", at(100), None);
        assert_eq!(a.outcome, Admission::Admitted);
        let b = a.next.arrive(at(1), &TWO, "b#1", at(100), None);
        assert_eq!(b.outcome, Admission::Admitted);
        let c = b.next.arrive(at(2), &TWO, "c#1", at(100), None);
        assert_eq!(c.outcome, Admission::Queued { ticket: 0 });
        let d = c.next.arrive(at(3), &TWO, "d#1", at(100), None);
        assert_eq!(d.outcome, Admission::Queued { ticket: 1 });
        assert_eq!(d.next.revision, 4);
        // A release lets the first ticket through, and only it.
        let r = d.next.release(at(10), &TWO, "a#1");
        assert!(r.outcome);
        assert_eq!(r.wake, vec![0]);
        // A newcomer does not overtake the waiting ticket 1.
        let e = r.next.arrive(at(11), &TWO, "e#1", at(100), None);
        assert_eq!(e.outcome, Admission::Queued { ticket: 2 });
        // Ticket 1 is still behind; ticket 0 takes its reserved place.
        let still = e.next.arrive(at(12), &TWO, "d#1", at(100), Some(1));
        assert_eq!(still.outcome, Admission::StillWaiting { ticket: 1 });
        let c2 = e.next.arrive(at(12), &TWO, "c#1", at(100), Some(0));
        assert_eq!(c2.outcome, Admission::Admitted);
        assert!(c2.next.holds.iter().any(|h| h.holder == "c#1"));
        assert_eq!(c2.next.holds.len(), 2);
    }

    /// Two Schedules of one waiting task, woken for its turn, race: the first takes the
    /// reserved place; the second, the same attempt under another lease, neither takes a
    /// second place nor a new ticket that would put the task at the back of the line.
    #[test]
    fn a_second_pass_of_the_same_claim_leaves_the_turn_to_the_first() {
        let (one, g) = one_place_two_waiting();
        let r = g.release(at(10), &one, "a#1");
        assert_eq!(r.wake, vec![0]);
        let first = r.next.arrive(at(11), &one, "b#2.0000aaaa", at(100), Some(0));
        assert_eq!(first.outcome, Admission::Admitted);
        let second = first.next.arrive(at(12), &one, "b#2.0000bbbb", at(100), Some(0));
        assert_eq!(second.outcome, Admission::Contended { until: at(100) });
        assert_eq!((second.next.issued, second.next.holds.len()), (first.next.issued, 1));
        // Another task's claim, or another attempt of this one, is not a second pass.
        let other = first.next.arrive(at(12), &one, "b#3.0000bbbb", at(100), Some(0));
        assert_eq!(other.outcome, Admission::Queued { ticket: 2 });
    }

    #[test]
    fn a_place_nobody_gives_back_lapses_and_the_line_moves_on_at_the_next_change() {
        let g = Gate::new("pay");
        let a = g.arrive(at(0), &TWO, "a#1", at(100), None).next;
        let b = a.arrive(at(0), &TWO, "b#1", at(100), None).next;
        let c = b.arrive(at(1), &TWO, "c#1", at(200), None);
        assert_eq!(c.outcome, Admission::Queued { ticket: 0 });
        // a and b died holding their places: at 100 they are free again.
        let later = c.next.arrive(at(100), &TWO, "d#1", at(300), None);
        assert_eq!(later.wake, vec![0]);
        assert_eq!(later.outcome, Admission::Admitted, "room for both: the ticket first, then d");
    }

    #[test]
    fn a_reserved_place_not_taken_in_time_goes_to_the_next_ticket() {
        let (one, g) = one_place_two_waiting();
        let r = g.release(at(10), &one, "a#1");
        assert_eq!(r.wake, vec![0]);
        // Ticket 0's task never comes: its place lapses and ticket 1 goes.
        let late = r.next.arrive(at(10 + RESERVATION_MS), &one, "x#1", at(99_999), None);
        assert_eq!(late.wake, vec![1]);
        // Ticket 0 comes after all: its turn is over and others wait, so it queues again.
        let again = late.next.arrive(at(10 + RESERVATION_MS + 1), &one, "b#1", at(99_999), Some(0));
        assert!(matches!(again.outcome, Admission::Queued { .. }));
    }

    #[test]
    fn a_withdrawn_ticket_hands_its_reserved_place_to_the_next_in_line_at_once() {
        let (one, g) = one_place_two_waiting();
        let r = g.release(at(10), &one, "a#1");
        assert_eq!(r.wake, vec![0]);
        // Ticket 0's task was cancelled: its place goes to ticket 1 now, not in 10 s.
        let w = r.next.withdraw(at(11), &one, 0);
        assert_eq!(w.outcome, Withdrawn::PlaceFreed);
        assert_eq!(w.wake, vec![1]);
        assert_eq!(w.next.holds, vec![Hold { holder: reserved_for(1), until: at(11 + RESERVATION_MS) }]);
    }

    #[test]
    fn a_withdrawn_ticket_still_behind_is_skipped_when_its_turn_comes() {
        let (one, g) = one_place_two_waiting();
        let g = g.arrive(at(3), &one, "d#1", at(100), None).next; // ticket 2
        // Ticket 1 waits behind ticket 0: it is skipped later. Ticket 0, at the front, at once.
        let w = g.withdraw(at(4), &one, 1);
        assert_eq!(w.outcome, Withdrawn::Skipped);
        assert!(w.wake.is_empty(), "no room yet");
        assert_eq!((w.next.waiting(), w.next.withdrawn.clone()), (2, vec![1]));
        let w = w.next.withdraw(at(5), &one, 0);
        assert_eq!((w.next.admitted, w.next.waiting(), w.next.withdrawn.len()), (2, 1, 0));
        // The place comes free: ticket 2 gets it.
        let r = w.next.release(at(10), &one, "a#1");
        assert_eq!(r.wake, vec![2]);
        assert_eq!((r.next.admitted, r.next.waiting()), (3, 0));
        assert!(r.next.withdrawn.is_empty(), "each withdrawal goes when its turn comes");
        // Its turn over, a withdrawn ticket holds nothing: withdrawing it again changes nothing.
        let again = r.next.withdraw(at(11), &one, 0);
        assert_eq!(again.outcome, Withdrawn::Nothing);
        assert_eq!(Gate { revision: r.next.revision, ..again.next }, r.next);
    }

    #[test]
    fn withdrawn_tickets_are_kept_in_order_and_no_more_than_the_cap() {
        let one =
            Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None };
        let mut g = Gate::new("pay").arrive(at(0), &one, "a#1", at(50), None).next;
        let waiting = MAX_WITHDRAWN as u64 + 3;
        for i in 0..waiting {
            g = g.arrive(at(1), &one, &format!("w{i}#1"), at(100), None).next;
        }
        // Ticket 0 stays in line; the rest leave, last first.
        for t in (1..waiting).rev() {
            let w = g.withdraw(at(2), &one, t);
            let expected = if t > 2 { Withdrawn::Skipped } else { Withdrawn::Unmarked };
            assert_eq!(w.outcome, expected, "ticket {t}");
            g = w.next;
        }
        assert_eq!(g.withdrawn.len(), MAX_WITHDRAWN);
        assert!(g.withdrawn.windows(2).all(|p| p[0] < p[1]));
        // The place comes free: ticket 0 gets it; then 1 and 2 (unmarked) in their turns.
        let r = g.release(at(10), &one, "a#1");
        assert_eq!(r.wake, vec![0]);
        let r = r.next.release(at(11), &one, &reserved_for(0));
        assert_eq!(r.wake, vec![1]);
        let r = r.next.release(at(12), &one, &reserved_for(1));
        assert_eq!(r.wake, vec![2]);
        // After 2, every marked ticket is skipped: nobody waits, nothing is marked.
        let r = r.next.release(at(13), &one, &reserved_for(2));
        assert!(r.wake.is_empty());
        assert_eq!((r.next.waiting(), r.next.withdrawn.len(), r.next.admitted), (0, 0, waiting));
    }

    #[test]
    fn when_every_waiting_ticket_is_withdrawn_a_newcomer_goes_straight_in() {
        let one =
            Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None };
        let g = Gate::new("pay").arrive(at(0), &one, "a#1", at(50), None).next;
        let g = g.arrive(at(1), &one, "b#1", at(100), None).next;
        let g = g.withdraw(at(2), &one, 0).next.release(at(3), &one, "a#1").next;
        assert_eq!(g.waiting(), 0);
        let n = g.arrive(at(4), &one, "n#1", at(100), None);
        assert_eq!(n.outcome, Admission::Admitted);
    }

    #[test]
    fn a_rate_counts_each_place_until_a_window_after_it_is_given_back() {
        let rate =
            Limits { max_in_flight: None, max_per_second: Some(2), places_per_gate: None, per_key: None };
        let g = Gate::new("wh");
        let a = g.arrive(at(0), &rate, "a#1", at(5_000), None).next;
        let b = a.arrive(at(0), &rate, "b#1", at(5_000), None).next;
        let done = b.release(at(10), &rate, "a#1").next.release(at(20), &rate, "b#1").next;
        let c = done.arrive(at(500), &rate, "c#1", at(5_000), None);
        assert_eq!(c.outcome, Admission::Queued { ticket: 0 }, "two places given back under a second ago");
        let d = c.next.arrive(at(1_010), &rate, "d#1", at(5_000), None);
        assert_eq!(d.wake, vec![0], "a's tail is over: ticket 0 first");
        assert_eq!(d.outcome, Admission::Queued { ticket: 1 });
        assert_eq!(
            Limits { max_in_flight: None, max_per_second: Some(1), places_per_gate: None, per_key: None }
                .hold_until(at(10), 5),
            at(1_015)
        );
    }

    #[test]
    fn when_only_time_can_make_room_one_look_is_planned_for_then() {
        let rate =
            Limits { max_in_flight: None, max_per_second: Some(1), places_per_gate: None, per_key: None };
        let a = Gate::new("wh").arrive(at(0), &rate, "a#1", at(5_000), None);
        assert_eq!(a.poke, None, "nobody waits");
        let b = a.next.arrive(at(1), &rate, "b#1", at(5_000), None);
        assert_eq!(b.outcome, Admission::Queued { ticket: 0 });
        assert_eq!(b.poke, Some(at(5_000)), "a's place lapses then at the latest");
        let r = b.next.release(at(10), &rate, "a#1");
        assert_eq!(r.poke, Some(at(1_010)), "a's tail ends sooner: look then");
        let c = r.next.arrive(at(20), &rate, "c#1", at(5_000), None);
        assert_eq!(c.poke, None, "a look is on its way by then already");
        let look = c.next.look(at(1_010), &rate, Some(at(1_010)));
        assert_eq!(look.wake, vec![0]);
        assert_eq!(look.poke, Some(at(1_010 + RESERVATION_MS)), "ticket 1 waits for ticket 0's place");
        // A look that comes early plans the next one rather than trusting one is on its way.
        let early = c.next.look(at(1_009), &rate, Some(at(1_010)));
        assert_eq!(early.poke, Some(at(1_010)));
        assert_eq!(c.next.look(at(1_009), &rate, None).poke, None, "one is on its way");
    }

    #[test]
    fn a_pause_lets_nobody_through_until_it_is_over() {
        let g = Gate::new("pay").pause(at(0), at(1_000));
        assert!(matches!(g.arrive(at(999), &TWO, "a#1", at(5_000), None).outcome, Admission::Queued { .. }));
        let q = g.arrive(at(999), &TWO, "a#1", at(5_000), None).next;
        let later = q.arrive(at(1_000), &TWO, "b#1", at(5_000), None);
        assert_eq!(later.wake, vec![0]);
        assert_eq!(later.outcome, Admission::Admitted);
        assert_eq!(later.next.paused_until, None);
    }

    #[test]
    fn two_claims_of_one_attempt_hold_a_place_each_and_give_back_only_their_own() {
        let g = Gate::new("pay").arrive(at(0), &TWO, "t#1.aaaa", at(100), None).next;
        let g = g.arrive(at(0), &TWO, "t#1.bbbb", at(100), None).next;
        assert_eq!(g.holds.len(), 2);
        let asked_again = g.arrive(at(1), &TWO, "t#1.aaaa", at(100), None);
        assert_eq!((asked_again.outcome, asked_again.next.holds.len()), (Admission::Admitted, 2));
        let r = g.release(at(2), &TWO, "t#1.bbbb").next;
        assert_eq!(r.holds.iter().map(|h| h.holder.as_str()).collect::<Vec<_>>(), ["t#1.aaaa"]);
    }

    #[test]
    fn a_claim_that_lost_its_task_write_hands_its_place_back_to_its_ticket() {
        let one =
            Limits { max_in_flight: Some(1), max_per_second: None, places_per_gate: None, per_key: None };
        let g = Gate::new("pay").arrive(at(0), &one, "a#1", at(50), None).next;
        let g = g.arrive(at(1), &one, "b#1", at(100), None).next;
        let g = g.release(at(2), &one, "a#1").next;
        let took = g.arrive(at(3), &one, "b#1", at(100), Some(0)).next;
        let back = took.unclaim(at(4), &one, "b#1", 0);
        assert!(back.outcome);
        let again = back.next.arrive(at(5), &one, "b#1.x", at(100), Some(0));
        assert_eq!(again.outcome, Admission::Admitted, "the ticket's place waited for it");
    }

    /// Two passes of one task, read at two revisions (two attempts: passes of one claim
    /// contend instead), each held a place for its ticket and both lost their task writes:
    /// the second hand-back releases its place, so the ticket has one reservation.
    #[test]
    fn a_ticket_is_reserved_one_place_however_many_claims_hand_theirs_back() {
        let g = Gate::new("pay").arrive(at(0), &TWO, "a#1", at(50), None).next;
        let g = g.arrive(at(1), &TWO, "c#1", at(50), None).next;
        let g = g.arrive(at(2), &TWO, "b#1", at(100), None).next;
        let g = g.release(at(3), &TWO, "a#1").next;
        assert!(g.holds.iter().any(|h| h.holder == reserved_for(0)), "b's ticket let through");
        let first = g.arrive(at(4), &TWO, "b#1.x", at(100), Some(0)).next;
        let second =
            first.release(at(5), &TWO, "c#1").next.arrive(at(5), &TWO, "b#2.y", at(100), Some(0)).next;
        assert_eq!(second.holds.len(), 2, "both passes hold a place: {second:?}");
        let back = second.unclaim(at(6), &TWO, "b#1.x", 0).next.unclaim(at(6), &TWO, "b#2.y", 0).next;
        let reserved = back.holds.iter().filter(|h| h.holder == reserved_for(0)).count();
        assert_eq!((reserved, back.holds.len()), (1, 1), "{back:?}");
    }

    #[test]
    fn releasing_a_place_that_lapsed_changes_nothing_but_the_revision() {
        let g = Gate::new("pay").arrive(at(0), &TWO, "a#1", at(10), None).next;
        let r = g.release(at(20), &TWO, "a#1");
        assert!(!r.outcome);
        assert!(r.next.holds.is_empty());
    }

    fn limits(in_flight: Option<u32>, per_second: Option<u32>) -> Limits {
        Limits { max_in_flight: in_flight, max_per_second: per_second, places_per_gate: None, per_key: None }
    }

    #[test]
    fn places_spread_over_gates_of_at_most_10_each_never_below_one_of_each_limit() {
        assert_eq!(limits(Some(10), None).gates(), 1);
        assert_eq!(limits(Some(11), None).gates(), 2);
        assert_eq!(limits(Some(1_000), None).gates(), 100);
        assert_eq!(limits(None, Some(1_000)).gates(), 100);
        assert_eq!(limits(Some(1_000), Some(1_000)).gates(), 100);
        // A rate of 5 a second cannot be shared by more than 5 gates.
        assert_eq!(limits(Some(1_000), Some(5)).gates(), 5);
        let small = Limits { places_per_gate: Some(1), ..limits(Some(3), Some(2)) };
        assert_eq!(small.gates(), 2);
    }

    #[test]
    fn the_gates_shares_add_up_to_the_agents_limits() {
        for l in [limits(Some(1_000), None), limits(Some(999), Some(101)), limits(Some(26), Some(60))] {
            let n = l.gates();
            let shares: Vec<Limits> = (0..n).map(|k| l.of_gate(k, n)).collect();
            let sum = |f: fn(&Limits) -> Option<u32>| shares.iter().map(|s| f(s).unwrap_or(0)).sum::<u32>();
            assert_eq!(sum(|s| s.max_in_flight), l.max_in_flight.unwrap_or(0), "{l:?}");
            assert_eq!(sum(|s| s.max_per_second), l.max_per_second.unwrap_or(0), "{l:?}");
            assert!(
                shares.iter().all(
                    |s| s.max_in_flight.is_none_or(|m| m >= 1) && s.max_per_second.is_none_or(|m| m >= 1)
                )
            );
        }
    }

    #[test]
    fn an_order_always_finds_the_same_gate_and_its_limits_by_name() {
        let l = limits(Some(1_000), None);
        let all = BTreeMap::from([("pay".to_owned(), l)]);
        let mut used = std::collections::BTreeSet::new();
        for i in 0..1_000 {
            let order = OrderId::parse(&format!("o-{i}")).unwrap();
            let (gate, share) = gate_of("pay", &l, &order);
            assert_eq!(gate_of("pay", &l, &order), (gate.clone(), share));
            assert_eq!(agent_of_gate(&gate), "pay");
            assert_eq!(limits_of_gate(&all, &gate), Some(share));
            used.insert(gate);
        }
        // 1,000 orders over 100 gates: every gate gets some.
        assert_eq!(used.len(), 100);
        assert_eq!(gates_of("pay", &l).len(), 100);
        // One gate: the agent's own name, as before gates were spread.
        let one = limits(Some(10), None);
        assert_eq!(gate_of("pay", &one, &OrderId::parse("o-1").unwrap()), ("pay".to_owned(), one));
        let all = BTreeMap::from([("pay".to_owned(), one)]);
        assert_eq!(limits_of_gate(&all, "pay"), Some(one));
        // Limits changed under a waiting task: gates the agent no longer has hold nothing.
        assert_eq!(limits_of_gate(&all, "pay@3"), None);
        assert_eq!(limits_of_gate(&BTreeMap::from([("pay".to_owned(), l)]), "pay"), None);
        assert_eq!(limits_of_gate(&BTreeMap::from([("pay".to_owned(), l)]), "pay@100"), None);
        assert_eq!(limits_of_gate(&all, "other"), None);
    }

    /// An order of `customer`, without a `workflow_version`.
    fn order(customer: &str) -> impl Fn(OrderKey) -> String + '_ {
        move |key| if key == OrderKey::CustomerId { customer.to_owned() } else { String::new() }
    }

    #[test]
    fn orders_of_one_key_share_a_key_gate_of_the_per_key_limit_by_name() {
        let per_key = PerKey { key: OrderKey::CustomerId, limit: 2 };
        let l = Limits { per_key: Some(per_key), ..limits(Some(1_000), None) };
        let (a, la) = key_gate_of("pay", &l, order("A")).unwrap();
        assert_eq!(key_gate_of("pay", &l, order("A")).unwrap().0, a);
        assert_ne!(key_gate_of("pay", &l, order("B")).unwrap().0, a);
        assert!(a.starts_with("pay%") && a.len() == "pay%".len() + 16, "{a}");
        assert_eq!(la, Limits { max_in_flight: Some(2), ..Limits::default() });
        assert!(is_key_gate(&a) && !is_key_gate("pay@3"));
        assert_eq!(agent_of_gate(&a), "pay");
        let all = BTreeMap::from([("pay".to_owned(), l)]);
        assert_eq!(limits_of_gate(&all, &a), Some(la));
        // The agent no longer sets a per-key limit: its key gates hold nothing.
        let without = BTreeMap::from([("pay".to_owned(), limits(Some(1_000), None))]);
        assert_eq!(limits_of_gate(&without, &a), None);
        assert_eq!(key_gate_of("pay", &limits(Some(3), None), order("A")), None);
        // A field the order lacks is the key ""; a number is keyed by its text.
        let by_version = Limits { per_key: Some(PerKey { key: OrderKey::WorkflowVersion, limit: 1 }), ..l };
        let none = key_gate_of("pay", &by_version, order("A")).unwrap().0;
        assert_eq!(none, key_gate_of("pay", &by_version, order("B")).unwrap().0);
        assert_ne!(key_gate_of("pay", &by_version, |_| "3".to_owned()).unwrap().0, none);
        for (key, path) in OrderKey::ALL {
            assert_eq!((OrderKey::parse(path), key.path()), (Some(key), path));
            assert_eq!(serde_json::to_value(key).unwrap(), serde_json::json!(path));
        }
        // Stored limits without a per-key limit read as before.
        let stored: Limits = serde_json::from_str(r#"{"max_in_flight":2,"max_per_second":null}"#).unwrap();
        assert_eq!(stored, TWO);
        assert!(!serde_json::to_string(&TWO).unwrap().contains("per_key"));
    }

    /// A key place is held by the attempt (`key_holder`): a later pass of it, woken from
    /// the agent's line, holds it still, until the later of the two passes' times.
    #[test]
    fn the_same_holder_asking_again_holds_its_place_until_the_later_time() {
        let one = Limits { max_in_flight: Some(1), ..Limits::default() };
        let holder = key_holder(&OrderId::parse("o-1").unwrap(), 2);
        assert_eq!(holder, "o-1#2");
        let g = Gate::new("pay%00").arrive(at(0), &one, &holder, at(100), None).next;
        let again = g.arrive(at(50), &one, &holder, at(300), None);
        assert_eq!(again.outcome, Admission::Admitted);
        assert_eq!(again.next.holds, vec![Hold { holder: holder.clone(), until: at(300) }]);
        let earlier = again.next.arrive(at(60), &one, &holder, at(200), None);
        assert_eq!(earlier.next.holds, vec![Hold { holder: holder.clone(), until: at(300) }]);
        // Another attempt of the same order is another holder.
        let other = earlier.next.arrive(at(61), &one, "o-1#3", at(200), None);
        assert_eq!(other.outcome, Admission::Queued { ticket: 0 });
    }
}
