//! The simulated world every port shares: true time, the one seeded generator, the I/O
//! gate that lets the event loop decide which invocation's next I/O call runs, the
//! timers behind `Clock::sleep_until`, and the recorded history.
//!
//! Everything is single-threaded: the loop polls one invocation at a time, and it tells
//! the ports which invocation (and which message) is running, so a port call knows whose
//! it is without any argument.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::deployment::Role;
use crate::ledger::Ledger;
use crate::outside::Outside;
use crate::swarm::Faults;

/// Which invocation (Lambda run) is executing; assigned by the loop.
pub type InvocationId = u64;

/// One kind of I/O call, as it appears in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Io {
    Insert,
    ReadTask,
    Replace,
    Due,
    Send(String),
    Alert,
    Remote(String),
    /// An agent's gate item (`domain::gate`): read, or written conditionally.
    ReadGate,
    ReplaceGate,
    /// A waiting ticket's task, noted or looked up.
    PutWaiter,
    ReadWaiter,
    /// A limited agent's call mark (`domain::gate::CallMark`), written conditionally.
    StartCall,
}

/// The context of one landed task write: who wrote it and while handling what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCtx {
    pub invocation: InvocationId,
    pub role: Option<Role>,
    /// The body of the message being handled, if the write was made for one.
    pub message: Option<Arc<str>>,
    /// True time of the write.
    pub at: u64,
}

/// What the ports need to know about a running invocation.
#[derive(Debug, Clone, Default)]
pub struct Running {
    pub role: Option<Role>,
    /// This invocation's clock offset from true time (a Lambda host's clock).
    pub skew: i64,
    /// Whether any fault was injected into it (crash aside), its clock's skew included.
    pub faulted: bool,
    /// Whether a fault was rolled while it ran (its starting clock skew aside).
    pub hit: bool,
}

/// FNV-1a, 64 bit: a hash that is the same in every process and on every platform, so
/// two runs of one seed can be compared by their history's hash.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn add(&mut self, bytes: &[u8]) {
        self.feed(bytes);
        self.end();
    }

    /// Part of one `add`: the bytes, without the separator.
    fn feed(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The end of one `add`: a separator, so ("ab","c") and ("a","bc") differ.
    fn end(&mut self) {
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Formatted text fed straight into the hash, as `Fnv::add` of the whole text would
/// (before its separator): no `String` is made for a line that is not kept.
struct FnvWriter<'a>(&'a mut Fnv);

impl std::fmt::Write for FnvWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.feed(s.as_bytes());
        Ok(())
    }
}

/// The history of a run as the loop saw it: every scheduling decision, every I/O call
/// granted, every message sent and every fault, hashed; kept in full on request.
#[derive(Debug, Default)]
pub struct Trace {
    pub hash: Fnv,
    pub lines: Option<Vec<String>>,
    pub events: u64,
    /// Nothing noted is formatted: neither hashed nor kept (`Options::unhashed`). Formatting
    /// every line into the hash was about a tenth of a run's instructions, and a run of
    /// many seeds never reads the hash.
    pub unhashed: bool,
}

impl Trace {
    /// Notes `line` (formatted arguments): hashed as `note` hashes the same text, but
    /// formatted into the hash directly unless the lines are kept.
    pub fn note_args(&mut self, now: u64, line: std::fmt::Arguments<'_>) {
        if self.unhashed {
            self.events += 1;
            return;
        }
        if self.lines.is_some() {
            return self.note(now, || std::fmt::format(line));
        }
        self.hash.add(&now.to_le_bytes());
        std::fmt::write(&mut FnvWriter(&mut self.hash), line).expect("hashing cannot fail");
        self.hash.end();
        self.events += 1;
    }

    pub fn note(&mut self, now: u64, line: impl FnOnce() -> String) {
        if self.unhashed {
            self.events += 1;
            return;
        }
        let line = line();
        self.hash.add(&now.to_le_bytes());
        self.hash.add(line.as_bytes());
        self.events += 1;
        if let Some(lines) = &mut self.lines {
            lines.push(format!("{now:>8} {line}"));
        }
    }
}

struct Ticket {
    invocation: InvocationId,
    io: Io,
    granted: bool,
    waker: Option<Waker>,
}

pub struct World {
    /// True time, ms since the epoch of the run.
    pub now: u64,
    pub rng: fastrand::Rng,
    /// The faults in force now (all off in the quiet tail).
    pub faults: Faults,
    pub current_invocation: Option<InvocationId>,
    pub current_message: Option<Arc<str>>,
    /// The running invocations, as the ports see them.
    pub running: BTreeMap<InvocationId, Running>,
    tickets: BTreeMap<u64, Ticket>,
    timers: BTreeMap<(u64, u64), Option<Waker>>,
    next_id: u64,
    pub trace: Trace,
    pub write_ctx: Vec<WriteCtx>,
    pub ledger: Ledger,
    /// The outside party of callback steps: the tokens the remote service was handed, and
    /// the words it plans and sent (`outside.rs`).
    pub outside: Outside,
    /// What the gates let through, and who ended cleanly (`gate_log.rs`).
    pub gates: crate::gate_log::GateLog,
    /// When each supervisor run that stopped at its time budget ended, in true time.
    pub sweeps_cut_short: Vec<u64>,
    /// Faults injected, by kind.
    pub fault_counts: BTreeMap<&'static str, u64>,
    /// The names of the branches of the run's parallel stages and of its map steps, whose
    /// service refuses them at `Faults::branch_refusal`.
    pub stage_branches: std::collections::BTreeSet<String>,
}

impl World {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Decides one fault of probability `p` for the running invocation, and records it.
    pub fn roll(&mut self, kind: &'static str, p: f64) -> bool {
        if p <= 0.0 || self.rng.f64() >= p {
            return false;
        }
        *self.fault_counts.entry(kind).or_default() += 1;
        if let Some(inv) = self.current_invocation {
            let running = self.running.entry(inv).or_default();
            running.faulted = true;
            running.hit = true;
        }
        let inv = self.current_invocation;
        self.trace.note_args(self.now, format_args!("fault {kind} inv {inv:?}"));
        true
    }

    /// The running invocation's view of the time.
    pub fn local_now(&self) -> u64 {
        let skew = self.current_invocation.and_then(|i| self.running.get(&i)).map_or(0, |m| m.skew);
        self.now.saturating_add_signed(skew)
    }

    pub fn current_skew(&self) -> i64 {
        self.current_invocation.and_then(|i| self.running.get(&i)).map_or(0, |m| m.skew)
    }

    pub fn current_role(&self) -> Option<Role> {
        self.current_invocation.and_then(|i| self.running.get(&i)).and_then(|m| m.role)
    }

    // ---- for the loop ----

    /// Pending I/O calls: (ticket, invocation, what), in ticket order.
    pub fn pending(&self) -> Vec<(u64, InvocationId)> {
        self.tickets.iter().filter(|(_, t)| !t.granted).map(|(id, t)| (*id, t.invocation)).collect()
    }

    /// Notes in the trace that invocation `id` makes its pending call `ticket`.
    pub fn note_io(&mut self, id: InvocationId, ticket: u64) {
        let io = self.tickets.get(&ticket).map(|t| &t.io);
        self.trace.note_args(self.now, format_args!("inv {id} io {io:?}"));
    }

    /// How many I/O calls are pending: `pending().len()`, without the list.
    pub fn pending_count(&self) -> usize {
        self.tickets.values().filter(|t| !t.granted).count()
    }

    /// The `n`th of `pending()`.
    pub fn nth_pending(&self, n: usize) -> Option<(u64, InvocationId)> {
        self.tickets.iter().filter(|(_, t)| !t.granted).nth(n).map(|(id, t)| (*id, t.invocation))
    }

    pub fn ticket_io(&self, ticket: u64) -> Option<(InvocationId, Io)> {
        self.tickets.get(&ticket).map(|t| (t.invocation, t.io.clone()))
    }

    /// Lets a pending call run; returns the waker to wake once the lock is released.
    pub fn grant(&mut self, ticket: u64) -> Option<Waker> {
        let t = self.tickets.get_mut(&ticket)?;
        t.granted = true;
        t.waker.take()
    }

    pub fn next_timer(&self) -> Option<u64> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Removes the timers due at `now` and returns their wakers.
    pub fn due_timers(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::new();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            if let Some(w) = entry.remove() {
                wakers.push(w);
            }
        }
        wakers
    }

    pub fn has_timers(&self) -> bool {
        !self.timers.is_empty()
    }
}

/// The world behind one lock. Never held across an `.await` or a call into a port.
pub struct Shared(Mutex<World>);

impl Shared {
    pub fn new(seed: u64, faults: Faults, keep_trace: bool, unhashed: bool) -> Arc<Shared> {
        Arc::new(Shared(Mutex::new(World {
            now: 0,
            rng: fastrand::Rng::with_seed(seed),
            faults,
            current_invocation: None,
            current_message: None,
            running: BTreeMap::new(),
            tickets: BTreeMap::new(),
            timers: BTreeMap::new(),
            next_id: 0,
            trace: Trace {
                lines: keep_trace.then(Vec::new),
                unhashed: unhashed && !keep_trace,
                ..Trace::default()
            },
            write_ctx: Vec::new(),
            ledger: Ledger::default(),
            outside: Outside::default(),
            gates: Default::default(),
            sweeps_cut_short: Vec::new(),
            fault_counts: BTreeMap::new(),
            stage_branches: Default::default(),
        })))
    }

    pub fn w(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the loop lets the running invocation make this I/O call. Outside an
    /// invocation (the loop's own calls) it does not wait.
    pub fn gate(self: &Arc<Shared>, io: Io) -> Gate {
        let mut w = self.w();
        let Some(inv) = w.current_invocation else {
            return Gate { shared: self.clone(), ticket: None };
        };
        let id = w.next_id();
        w.tickets.insert(id, Ticket { invocation: inv, io, granted: false, waker: None });
        Gate { shared: self.clone(), ticket: Some(id) }
    }

    /// Resolves once true time reaches `at`.
    pub fn sleep_until(self: &Arc<Shared>, at: u64) -> Sleep {
        let mut w = self.w();
        let seq = w.next_id();
        Sleep { shared: self.clone(), key: (at, seq), registered: false }
    }
}

pub struct Gate {
    shared: Arc<Shared>,
    ticket: Option<u64>,
}

impl Future for Gate {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(id) = self.ticket else {
            return Poll::Ready(());
        };
        let mut w = self.shared.w();
        match w.tickets.get_mut(&id) {
            Some(t) if t.granted => {
                w.tickets.remove(&id);
                Poll::Ready(())
            }
            Some(t) => {
                t.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            // Removed by the loop: cannot happen while the invocation lives.
            None => Poll::Pending,
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(id) = self.ticket {
            self.shared.w().tickets.remove(&id);
        }
    }
}

pub struct Sleep {
    shared: Arc<Shared>,
    key: (u64, u64),
    registered: bool,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let key = self.key;
        let mut w = self.shared.w();
        if w.now >= key.0 {
            w.timers.remove(&key);
            drop(w);
            self.registered = false;
            return Poll::Ready(());
        }
        w.timers.insert(key, Some(cx.waker().clone()));
        drop(w);
        self.registered = true;
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if self.registered {
            self.shared.w().timers.remove(&self.key);
        }
    }
}
