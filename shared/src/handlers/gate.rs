//! Flow control in the scheduler: a claim that dispatches an agent with limits first
//! takes a place in the agent's gate (`domain::gate`), one conditional write of the gate
//! item; a reply gives the place back. Agents without limits never come here.
//!
//! The turns a change lets through are collected (`LetThrough`), not sent while the
//! gate is held: the scheduler claims their tasks itself once its own message is done
//! (`Scheduler::hand_over`), so a place freed by a reply is taken again with no queue hop
//! between; other handlers wake them through the scheduler's queue (`wake`).
//!
//! What a hand-over waits on is kept short: within a process, changes that free a place
//! go before new arrivals that come to the line after them (`Precedence`), and the
//! arrival of the ticket a release let through starts from the gate that release stored
//! (`LetThrough::recall`).
//!
//! Changes that wait in a process's line for one gate land together: whoever takes the
//! gate next applies every change waiting there, one after another as if each were
//! written alone, and writes the result once (`GateLine::commit`). A burst's arrivals at
//! a gate then cost one conditional write per batch, not one each, and a freeing change
//! waits for at most one write in flight before its own lands.

use super::{Deps, HandlerError, Settings};
use crate::domain::Place;
use crate::domain::gate::{Admission, Gate, MAX_WITHDRAWN, Passage, Withdrawn, limits_of_gate};
use crate::domain::{OrderId, SchedulerMessage, Timestamp, Turn};
use crate::ports::{Metric, Outgoing, Written};

/// Gates are shared by every claim of their agent: a burst of claims meets on one item,
/// and each round of re-reads lands one writer's changes. Anything left is redelivered.
const GATE_RETRIES: usize = 16;

/// One process's turns at its gates: the messages of one batch change a gate one after
/// another, those waiting at once in one write, instead of racing each other's
/// conditional writes (each lost race is a billed write and a read again). Processes
/// still race each other; the condition settles that.
#[derive(Default)]
pub struct Turns {
    lines: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<GateLine>>>,
    /// Counts the process's commits at its gates (written, unchanged or failed): a gate a
    /// message remembers is still what this process last knew of it only if none came
    /// after (`LetThrough::recall`).
    changes: std::sync::atomic::AtomicU64,
}

/// Which changes of a gate go first in a process's line for it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Precedence {
    /// A place given back (a release, an unclaim, a withdrawn ticket) and the arrival of
    /// a ticket let through: the next call waits on these, so a burst's new arrivals do
    /// not go before them.
    Freeing,
    /// A new arrival, or a look: its task waits in the line either way.
    InLine,
}

/// One gate's line in this process.
#[derive(Default)]
struct GateLine {
    lock: tokio::sync::Mutex<()>,
    /// Changes waiting to land: the next holder of the lock writes them all.
    waiting: std::sync::Mutex<Vec<Waiting>>,
    /// Freeing changes waiting for the lock: changes in line let them go first.
    freeing: std::sync::atomic::AtomicUsize,
    none_freeing: tokio::sync::Notify,
}

impl GateLine {
    async fn take(&self, precedence: Precedence) -> tokio::sync::MutexGuard<'_, ()> {
        use std::sync::atomic::Ordering::SeqCst;
        if precedence == Precedence::Freeing {
            self.freeing.fetch_add(1, SeqCst);
            // Counted out once it holds the lock, or if its future is dropped first: a
            // count left behind would hold every later arrival back.
            let _waiting = FreeingWait(self);
            return self.lock.lock().await;
        }
        loop {
            let cleared = self.none_freeing.notified();
            tokio::pin!(cleared);
            // Registered before the count is read, so a clearing in between is not missed.
            cleared.as_mut().enable();
            if self.freeing.load(SeqCst) == 0 {
                return self.lock.lock().await;
            }
            cleared.await;
        }
    }
}

/// A change applied to a gate as read: it keeps its passage for its caller (each round
/// of re-reads decides again) and gives the gate it leaves.
type Apply = std::sync::Arc<dyn Fn(&Gate, Timestamp) -> Gate + Send + Sync>;

/// How a change landed: when it was decided, the gate as stored after the write that
/// carried it, and that write's stamp (`Turns::changes`).
type Landing = Result<(Timestamp, Gate, u64), HandlerError>;

/// A change in a gate's line, waiting for a holder of the lock to land it.
struct Waiting {
    apply: Apply,
    precedence: Precedence,
    landed: futures::channel::oneshot::Sender<Landing>,
}

impl GateLine {
    /// Lands `apply`, alone or with the changes waiting beside it. The change waits in
    /// the line until it holds the lock or another holder landed it; holding the lock, it
    /// lands every change waiting, its own among them, in one write. If the holder's
    /// future is dropped before it answers (its invocation ended), the callers it held
    /// changes for queue them again: a write of its that landed is then made again on
    /// the gate it left, which is the same for every change but a new arrival (a second
    /// ticket, let through in its turn and lapsing unused). Lambda and the simulation drop
    /// a whole invocation, its callers with it, so only a panic could come to this.
    async fn commit(
        &self,
        deps: &Deps,
        (turns, precedence): (&Turns, Precedence),
        let_through: &LetThrough,
        agent: &str,
        apply: Apply,
    ) -> Landing {
        use futures::FutureExt;
        loop {
            let (reply, mut answer) = futures::channel::oneshot::channel();
            self.line().push(Waiting { apply: apply.clone(), precedence, landed: reply });
            let _held = futures::select_biased! {
                done = answer => match done {
                    Ok(landing) => return landing,
                    Err(_) => continue,
                },
                held = self.take(precedence).fuse() => held,
            };
            // The holder before may have landed it while the lock came.
            match answer.try_recv() {
                Ok(Some(landing)) => return landing,
                Ok(None) => {}
                Err(_) => continue,
            }
            let mut batch = std::mem::take(&mut *self.line());
            // A change whose caller is gone (its future dropped) before the line is taken
            // is not made for it.
            batch.retain(|w| !w.landed.is_canceled());
            // Freeing changes first, as in the line itself; otherwise in arrival order.
            batch.sort_by_key(|w| w.precedence != Precedence::Freeing);
            let known = let_through.recall(agent, turns.changes.load(std::sync::atomic::Ordering::SeqCst));
            let landing = landed(deps, agent, known, |gate: &Gate, now| {
                let mut next = batch.iter().fold(gate.clone(), |g, w| {
                    match crate::mutations::gate_changes_from_read() {
                        true => (w.apply)(gate, now),
                        false => (w.apply)(&g, now),
                    }
                });
                // One write, one revision, however many changes it carries.
                next.revision = gate.revision + 1;
                Passage { next, outcome: (), wake: Vec::new(), poke: None }
            })
            .await;
            // Counted whatever came of it: a write whose answer was lost may have landed.
            let stamp = turns.changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let landing = landing.map(|(_, now, stored)| (now, stored, stamp));
            for w in batch {
                let _ = w.landed.send(landing.clone());
            }
            return match answer.try_recv() {
                Ok(Some(landing)) => landing,
                // Its own change was in the batch it answered: never reached.
                _ => Err(HandlerError::Retry(format!("a change of gate {agent} went unanswered"))),
            };
        }
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A freeing change waiting for its gate's lock, counted while it waits.
struct FreeingWait<'a>(&'a GateLine);

impl Drop for FreeingWait<'_> {
    fn drop(&mut self) {
        if self.0.freeing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            self.0.none_freeing.notify_waiters();
        }
    }
}

impl Turns {
    fn of(&self, agent: &str) -> std::sync::Arc<GateLine> {
        let mut turns = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        turns.entry(agent.to_owned()).or_default().clone()
    }

    /// Drops the turn of a gate nobody waits at: a warm container meets one gate per key
    /// of a per-key limit, so the map must not keep every gate it ever saw.
    fn forget_if_idle(&self, agent: &str) {
        let mut turns = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if turns.get(agent).is_some_and(|t| std::sync::Arc::strong_count(t) == 1) {
            turns.remove(agent);
        }
    }
}

/// The turns gate changes let through, in order, for their tasks to take their places;
/// and the gate as the message's last change left it.
#[derive(Default)]
pub(crate) struct LetThrough {
    turns: std::sync::Mutex<Vec<Turn>>,
    /// The gate as this message's last change of it stored or read it. A hand-over's
    /// arrival comes right after the release that let its ticket through, at the same
    /// gate: it starts from there instead of reading it again (one store call less
    /// between a call's answer and the next call). If another writer came between, the
    /// conditional write says so and the gate is read; a decision to write nothing is
    /// taken on a fresh read (`landed`).
    last: std::sync::Mutex<Option<(Gate, u64)>>,
}

impl LetThrough {
    fn add(&self, agent: &str, tickets: &[u64]) {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        turns.extend(tickets.iter().map(|&ticket| Turn { agent: agent.to_owned(), ticket }));
    }

    /// Takes the turns collected so far.
    pub(crate) fn take(&self) -> Vec<Turn> {
        std::mem::take(&mut *self.turns.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// `stored` as of the process's change `stamp` (`Turns::changes`).
    fn remember(&self, stored: Gate, stamp: u64) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((stored, stamp));
    }

    /// The gate `agent` as this message last stored or read it, taken (it is used once),
    /// if no other change of the process's came since, at any gate: one that did would
    /// make it stale for sure, and the stale write would cost a failed write and a read.
    fn recall(&self, agent: &str, now_at: u64) -> Option<Gate> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.take_if(|(g, stamp)| g.agent == agent && *stamp == now_at).map(|(g, _)| g)
    }
}

/// One change of an agent's gate: read it, decide, write conditional on the revision
/// read, and read again if another writer came first. The tickets the change let
/// through go to `let_through`; the look it plans is sent once the turn is given up, so
/// no send waits with the gate held (a batch's sends wait for each other: `coalesce`).
async fn change<T: Send + 'static>(
    deps: &Deps,
    settings: &Settings,
    (turns, precedence): (&Turns, Precedence),
    let_through: &LetThrough,
    agent: &str,
    decide: impl Fn(&Gate, Timestamp) -> Passage<T> + Send + Sync + 'static,
) -> Result<Passage<T>, HandlerError> {
    let decided = std::sync::Arc::new(std::sync::Mutex::new(None));
    let apply: Apply = {
        let decided = decided.clone();
        std::sync::Arc::new(move |gate: &Gate, now| {
            let passage = decide(gate, now);
            let next = passage.next.clone();
            *decided.lock().unwrap_or_else(|p| p.into_inner()) = Some(passage);
            next
        })
    };
    let landing = turns.of(agent).commit(deps, (turns, precedence), let_through, agent, apply).await;
    turns.forget_if_idle(agent);
    let (now, stored, stamp) = landing?;
    // The round that landed decided it last.
    let passage = decided.lock().unwrap_or_else(|p| p.into_inner()).take();
    let passage =
        passage.ok_or_else(|| HandlerError::Retry(format!("a change of gate {agent} landed undecided")))?;
    let_through.remember(stored, stamp);
    let_through.add(agent, &passage.wake);
    if let Some(at) = passage.poke {
        poke(deps, settings, agent, at, now).await;
    }
    Ok(passage)
}

/// The rounds of one change, under the caller's turn, the first from `known` if given:
/// the passage that landed, when, and the gate as stored after it.
async fn landed<T>(
    deps: &Deps,
    agent: &str,
    mut known: Option<Gate>,
    decide: impl Fn(&Gate, Timestamp) -> Passage<T>,
) -> Result<(Passage<T>, Timestamp, Gate), HandlerError> {
    for _ in 0..GATE_RETRIES {
        let (gate, recalled) = match known.take() {
            Some(gate) => (gate, true),
            None => (deps.store.gate(agent).await?.unwrap_or_else(|| Gate::new(agent)), false),
        };
        let now = deps.clock.now();
        let passage = decide(&gate, now);
        // A look that changes nothing (a ticket still behind) is not written.
        let unchanged = Gate { revision: gate.revision, ..passage.next.clone() } == gate;
        // Nothing written checks a remembered gate: another writer may have let the
        // ticket through since, so a decision to change nothing is taken on a fresh read.
        if unchanged && recalled {
            continue;
        }
        let written = match unchanged {
            true => Written::Applied,
            false => match deps.store.replace_gate(&passage.next, gate.revision).await {
                Ok(written) => written,
                // No answer (throttled, or lost on its way back): the gate says whether it
                // landed. A write that did must be taken as landed, or every change it
                // carried would be made again (a second place, a second ticket).
                Err(e) => match deps.store.gate(agent).await {
                    Ok(Some(stored)) if stored == passage.next => Written::Applied,
                    _ => return Err(e.into()),
                },
            },
        };
        match written {
            Written::Applied if unchanged => return Ok((passage, now, gate)),
            Written::Applied => {
                let stored = passage.next.clone();
                return Ok((passage, now, stored));
            }
            Written::RevisionMoved => deps.metrics.record(Metric::GateConflict, 1),
        }
    }
    Err(HandlerError::Retry(format!("the gate of agent {agent} kept changing under concurrent writers")))
}

/// Arrives at the place's gate, with the ticket the task holds there, if any.
pub(crate) async fn arrive(
    deps: &Deps,
    settings: &Settings,
    turns: &Turns,
    let_through: &LetThrough,
    place: &Place,
    ticket: Option<u64>,
) -> Result<Admission, HandlerError> {
    // A ticket let through comes to take the place kept for it: the next call waits on it.
    let precedence = if ticket.is_some() { Precedence::Freeing } else { Precedence::InLine };
    let (limits, holder, until) = (place.limits, place.holder.clone(), place.until);
    let passage = change(deps, settings, (turns, precedence), let_through, &place.gate, move |gate, now| {
        gate.arrive(now, &limits, &holder, until, ticket)
    })
    .await?;
    Ok(passage.outcome)
}

/// Gives back the place of `order_id`'s attempt at `agent`, and pauses the gate until
/// `pause_until` if the remote asked. Best effort: a place not given back lapses at its
/// own time, so a failure here is logged, not retried.
pub(crate) async fn release(
    deps: &Deps,
    settings: &Settings,
    turns: &Turns,
    let_through: &LetThrough,
    agent: &str,
    holder: &str,
    pause_until: Option<Timestamp>,
) {
    let Some(limits) = limits_of_gate(&settings.topology.limits, agent) else {
        return;
    };
    let holder_of = holder.to_owned();
    let result =
        change(deps, settings, (turns, Precedence::Freeing), let_through, agent, move |gate, now| {
            let holder = holder_of.as_str();
            match pause_until {
                Some(until) => {
                    let mut p = gate.pause(now, until).release(now, &limits, holder);
                    // `pause` and `release` each bump the revision; one write lands both.
                    p.next.revision = gate.revision + 1;
                    p
                }
                None => gate.release(now, &limits, holder),
            }
        })
        .await;
    if let Err(e) = result {
        tracing::warn!(%agent, %holder, error = %e, "place not given back; it lapses at its own time");
    }
}

/// Hands a lost claim's place back to the ticket it came with (best effort: a place not
/// handed back lapses at its own time).
pub(crate) async fn unclaim(
    deps: &Deps,
    settings: &Settings,
    turns: &Turns,
    let_through: &LetThrough,
    agent: &str,
    holder: &str,
    ticket: u64,
) {
    // An agent whose limits were taken away (or spread over other gates now) keeps no
    // places here any more.
    let Some(limits) = limits_of_gate(&settings.topology.limits, agent) else {
        return;
    };
    let holder_of = holder.to_owned();
    if let Err(e) =
        change(deps, settings, (turns, Precedence::Freeing), let_through, agent, move |gate, now| {
            gate.unclaim(now, &limits, &holder_of, ticket)
        })
        .await
    {
        tracing::warn!(%agent, %holder, error = %e, "place not handed back to its ticket; it lapses at its own time");
    }
}

/// Withdraws the ticket of a task that left the line (`Effect::HandBack`). Best effort:
/// a reservation not handed back lapses at its own time, so a failure is logged, not
/// retried. `turns`: the caller's, or a fresh set where it has none (the conditional
/// write keeps it correct; the turns only spare lost races).
pub(crate) async fn withdraw(
    deps: &Deps,
    settings: &Settings,
    turns: &Turns,
    let_through: &LetThrough,
    agent: &str,
    ticket: u64,
) {
    // An agent whose limits were taken away (or spread over other gates now) keeps no
    // line here any more.
    let Some(limits) = limits_of_gate(&settings.topology.limits, agent) else {
        return;
    };
    match change(deps, settings, (turns, Precedence::Freeing), let_through, agent, move |gate, now| {
        gate.withdraw(now, &limits, ticket)
    })
    .await
    {
        Ok(passage) if matches!(passage.outcome, Withdrawn::PlaceFreed | Withdrawn::Skipped) => {
            deps.metrics.record(Metric::TicketHandedBack, 1);
        }
        Ok(passage) if passage.outcome == Withdrawn::Unmarked => {
            // Its turn wakes the task with the ticket (`Schedule::turn`), and the task, no
            // longer holding it, hands the turn on then: one message, not a lapse.
            tracing::info!(%agent, ticket, "ticket not marked (the gate marks {MAX_WITHDRAWN} at most): handed on when its turn comes");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(%agent, ticket, error = %e, "ticket not handed back; a place reserved for it lapses at its own time");
        }
    }
}

/// A look at the gate, from its poke message.
pub(crate) async fn look(
    deps: &Deps,
    settings: &Settings,
    turns: &Turns,
    let_through: &LetThrough,
    agent: &str,
    planned: Option<Timestamp>,
) -> Result<(), HandlerError> {
    // An agent whose limits were taken away (or spread over other gates now) has nobody
    // waiting behind this gate any more.
    let Some(limits) = limits_of_gate(&settings.topology.limits, agent) else {
        tracing::info!(%agent, "look at a gate its agent's limits no longer keep ignored");
        return Ok(());
    };
    change(deps, settings, (turns, Precedence::InLine), let_through, agent, move |gate, now| {
        gate.look(now, &limits, planned)
    })
    .await?;
    Ok(())
}

/// Sends a look at the gate to the scheduler's queue for `at` (one millisecond later, so
/// it does not come before; at most SQS's longest delay, and a look that comes before its
/// time plans the next). Best effort: if it is lost, the next change of the gate plans
/// another, and the supervisor asks the gate again for tasks that wait long.
async fn poke(deps: &Deps, settings: &Settings, agent: &str, at: Timestamp, now: Timestamp) {
    let body = SchedulerMessage::Gate { agent: agent.to_owned(), at: Some(at) }.to_body();
    let delay_ms = (at.millis_since(now) + 1).min(MAX_DELAY_MS);
    if let Err(e) =
        deps.queues.send(&settings.topology.scheduler_queue, Outgoing::delayed(body, delay_ms)).await
    {
        tracing::warn!(%agent, error = %e, "could not plan the next look at the gate");
    }
}

/// SQS's longest delay: a later look is sent at this and plans the rest.
const MAX_DELAY_MS: u64 = 900_000;

/// Sends a Schedule to the task of each turn let through, for handlers that do not claim
/// tasks themselves. A ticket whose task is not noted yet is not lost: the task looks at
/// the gate again after noting itself.
pub(crate) async fn wake(deps: &Deps, settings: &Settings, turns: Vec<Turn>) {
    for turn in turns {
        let result = match deps.store.waiter(&turn.agent, turn.ticket).await {
            Ok(Some(order_id)) => send_turn(deps, settings, order_id, turn).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = result {
            // Its place is kept for `RESERVATION_MS`, and the supervisor asks the gate
            // again for a task that waits long.
            tracing::warn!(error = %e, "could not wake the next in line");
        }
    }
}

/// A Schedule for the task of a turn, with the turn: a task that no longer holds the
/// ticket hands it on at once.
pub(crate) async fn send_turn(
    deps: &Deps,
    settings: &Settings,
    order_id: OrderId,
    turn: Turn,
) -> Result<(), HandlerError> {
    let body = SchedulerMessage::Schedule { order_id, turn: Some(turn), throttled: 0 }.to_body();
    deps.queues
        .send(&settings.topology.scheduler_queue, Outgoing::new(body))
        .await
        .map_err(HandlerError::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::{
        CountingMetrics, EmbeddedQueues, EmbeddedStore, ManualClock, RecordingAlerts,
    };
    use crate::adapters::system::FastRandom;
    use std::sync::Arc;

    fn deps() -> Deps {
        let clock = Arc::new(ManualClock::at(1_000));
        Deps {
            store: Arc::new(EmbeddedStore::new()),
            queues: Arc::new(EmbeddedQueues::new(clock.clone(), 1)),
            alerts: Arc::new(RecordingAlerts::default()),
            clock,
            random: Arc::new(FastRandom::seeded(1)),
            metrics: Arc::new(CountingMetrics::default()),
        }
    }

    /// A decision that writes nothing checks no condition, so it must not be taken on a
    /// remembered gate another writer may have changed since (a ticket let through there
    /// would wait out its reservation).
    #[tokio::test]
    async fn a_decision_to_write_nothing_is_taken_on_a_fresh_read_not_a_remembered_gate() {
        let deps = deps();
        let remembered = Gate::new("a");
        let moved_on = Gate { revision: 1, issued: 7, ..Gate::new("a") };
        assert_eq!(deps.store.replace_gate(&moved_on, 0).await.unwrap(), Written::Applied);
        let keep =
            |gate: &Gate, _| Passage { next: gate.clone(), outcome: gate.issued, wake: vec![], poke: None };

        let (passage, _, stored) = landed(&deps, "a", Some(remembered.clone()), keep).await.unwrap();
        assert_eq!((passage.outcome, stored.revision), (7, 1), "decided on the stored gate");

        // A change is written conditionally, so a remembered gate that moved is read again.
        let bump = |gate: &Gate, _| Passage {
            next: Gate { issued: gate.issued + 1, revision: gate.revision + 1, ..gate.clone() },
            outcome: gate.issued,
            wake: vec![],
            poke: None,
        };
        let (passage, _, stored) = landed(&deps, "a", Some(remembered), bump).await.unwrap();
        assert_eq!((passage.outcome, stored.revision, stored.issued), (7, 2, 8));
    }

    /// Changes that wait while the gate is held land together, in one write, each with
    /// the outcome it would have had alone, in its turn: places freed first.
    #[tokio::test]
    async fn changes_waiting_at_a_held_gate_land_in_one_write_each_as_if_alone() {
        use crate::adapters::embedded::queue_names::{reply_to_rules, topology};
        let deps = deps();
        let limits = crate::domain::gate::Limits { max_in_flight: Some(2), ..Default::default() };
        let mut topology = topology();
        topology.limits.insert("a".into(), limits);
        let settings = Settings::new(
            Default::default(),
            crate::domain::Workflows::builtin(),
            topology,
            reply_to_rules(),
        );
        let (turns, let_through) = (Turns::default(), LetThrough::default());
        let held = Gate {
            holds: vec![crate::domain::gate::Hold { holder: "o-0#1".into(), until: Timestamp(60_000) }],
            revision: 4,
            ..Gate::new("a")
        };
        assert_eq!(deps.store.replace_gate(&held, 0).await.unwrap(), Written::Applied);
        let place = |n: u32| Place {
            gate: "a".into(),
            limits,
            holder: format!("o-{n}#1"),
            attempt: 1,
            until: Timestamp(60_000),
            key: None,
        };
        let places: Vec<Place> = (1..=3).map(place).collect();

        let line = turns.of("a");
        let lock = line.lock.lock().await;
        let arrivals = futures::future::join_all(
            places.iter().map(|p| arrive(&deps, &settings, &turns, &let_through, p, None)),
        );
        let released = release(&deps, &settings, &turns, &let_through, "a", "o-0#1", None);
        let (admissions, (), ()) = futures::join!(arrivals, released, async {
            tokio::task::yield_now().await;
            drop(lock);
        });

        let admissions: Vec<Admission> = admissions.into_iter().map(Result::unwrap).collect();
        // The release went first: two places free, so two in at once and one in line.
        assert_eq!(admissions, [Admission::Admitted, Admission::Admitted, Admission::Queued { ticket: 0 }]);
        let stored = deps.store.gate("a").await.unwrap().unwrap();
        assert_eq!(stored.revision, 5, "one write for all four changes");
        let holders: Vec<&str> = stored.holds.iter().map(|h| h.holder.as_str()).collect();
        assert_eq!((holders, stored.issued), (vec!["o-1#1", "o-2#1"], 1));
    }
}
