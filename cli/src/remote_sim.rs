//! A simulated remote service on loopback HTTP for `sasctl dev`: the simulation's model
//! of a well-behaved service (`sas_sim::ledger`: seeded transient failures, permanent
//! refusals and hangs, deduplication by idempotency key, a ledger of every call and
//! every applied effect) served over real HTTP in real time.
//!
//! It also plays the outside party of callback steps ([`Outside`]): a call that carries a
//! `callback_token` is answered 2xx at once (the work started), and the service later
//! completes it through the real completion path, a `CallbackMessage` on the callback
//! queue, with the faults of [`CallbackFaults`]: failures, second copies, late sends,
//! an earlier attempt's token, forged tokens, silence; and heartbeats before each is due.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sas::adapters::http_remote::IDEMPOTENCY_HEADER;
use sas::domain::{
    Action, CallbackMessage, CallbackOutcome, CallbackSecret, CallbackToken, Completion, StepOutput,
};
use sas::ports::{Outgoing, QueueUrl, Queues};
use sas_sim::ledger::{Call, Settled, Verdict};
pub use sas_sim::ledger::{Ledger, RemoteFaults};

struct Service {
    faults: RemoteFaults,
    /// Agents whose service fails differently from the rest (`--agent-fault`).
    agent_faults: BTreeMap<String, RemoteFaults>,
    seed: u64,
    started: Instant,
    /// The ledger, and how many calls each idempotency key has had, behind one lock: a
    /// key is settled under it once.
    state: Mutex<(HashMap<String, u64>, Ledger)>,
    /// The outside party of callback steps, when the run has any.
    outside: Option<Outside>,
    /// Each agent's calls as the service itself sees them: when each arrived, and how
    /// many were open at once (`Flights`). Also by agent and the order id's first part,
    /// `<agent>:<up to the first ->` (`order` for a run's own orders, `trickle` for a
    /// trickle's: `bench fair` tells one customer's flood from the others' so).
    flights: Mutex<BTreeMap<String, Flights>>,
}

/// One agent's calls at the service, from its own side of the wire: what flow control
/// (`domain::gate`) promises the remote, measured where the promise is kept or broken.
///
/// A call is in flight from when its request reaches the handler until the handler is
/// done with it: it answered (a 2xx, 503 or 422; the answer leaves after that), or the
/// caller went away (the agent's timeout dropped the connection, and the server dropped
/// the handler). A hung call thus counts until the agent stops waiting, which the
/// service learns only when the connection closes; a call still open when the service
/// stops counts to the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flights {
    pub calls: u64,
    pub in_flight: u64,
    /// The most calls in flight at one instant.
    pub max_in_flight: u64,
    /// When each call arrived, in µs after the service started, in arrival order.
    pub arrivals_us: Vec<u64>,
    /// Calls closed and not yet followed by an arrival: when each closed, oldest first.
    closed_us: std::collections::VecDeque<u64>,
    /// For each call that arrived after another had closed: how long after the oldest
    /// such close it came (the hand-over of a place, when every call holds one), in µs.
    pub hand_overs_us: Vec<u64>,
    /// Every closed call's time open, summed, in µs: over `calls`, the mean latency the
    /// service actually gave (its draws, not the mean they are drawn around).
    pub open_us: u64,
}

impl Flights {
    /// The most calls that arrived within any one window of `RATE_WINDOW_MS` (a
    /// half-open window: calls exactly a window apart are in different ones).
    pub fn max_per_second(&self) -> u64 {
        let window = sas::domain::gate::RATE_WINDOW_MS * 1_000;
        let (mut first, mut most) = (0, 0);
        for (i, at) in self.arrivals_us.iter().enumerate() {
            while self.arrivals_us[first] + window <= *at {
                first += 1;
            }
            most = most.max(i + 1 - first);
        }
        most as u64
    }
}

/// A call counted in flight until dropped: when the handler returns, or when the server
/// drops it because the caller went away.
struct InFlight {
    service: Arc<Service>,
    agent: String,
    /// When it arrived, in µs after the service started.
    at: u64,
}

impl Service {
    fn arrive(self: &Arc<Self>, agent: &str) -> InFlight {
        let at = self.started.elapsed().as_micros() as u64;
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        let f = flights.entry(agent.to_owned()).or_default();
        f.calls += 1;
        f.in_flight += 1;
        f.max_in_flight = f.max_in_flight.max(f.in_flight);
        f.arrivals_us.push(at);
        if let Some(closed) = f.closed_us.pop_front() {
            f.hand_overs_us.push(at.saturating_sub(closed));
        }
        InFlight { service: self.clone(), agent: agent.to_owned(), at }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut flights = self.service.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = flights.get_mut(&self.agent) {
            let now = self.service.started.elapsed().as_micros() as u64;
            f.in_flight -= 1;
            f.open_us += now.saturating_sub(self.at);
            f.closed_us.push_back(now);
        }
    }
}

/// The dice for the `nth` call under `key`: drawn from the seed, the key and `nth`
/// alone, so a call's fate does not depend on which other calls happened to arrive
/// before it (one shared generator would hand out its numbers in arrival order, which
/// the scheduling of threads decides).
fn dice(seed: u64, key: &str, nth: u64) -> fastrand::Rng {
    // FNV-1a over the key; fastrand's generator mixes the rest.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(nth.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    fastrand::Rng::with_seed(seed ^ h)
}

#[derive(serde::Deserialize)]
struct CallBody {
    order_id: String,
    step: u32,
    action: Action,
    #[serde(default)]
    outputs: std::collections::BTreeMap<String, serde_json::Value>,
    /// Only a callback step's call carries one.
    #[serde(default)]
    callback_token: Option<String>,
}

/// No answer can take longer than this; the agent's own timeout ends the call first.
const HANG: Duration = Duration::from_secs(3_600);

async fn call(
    State(service): State<Arc<Service>>,
    Path((agent, action_name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::Json<CallBody>,
) -> (StatusCode, String) {
    let _in_flight = service.arrive(&agent);
    let prefix = body.order_id.split('-').next().unwrap_or_default();
    let _in_flight_of_prefix = service.arrive(&format!("{agent}:{prefix}"));
    let Some(key) = headers.get(IDEMPOTENCY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key".into());
    };
    let handed = serde_json::to_string(&body.outputs).unwrap_or_default();
    let (verdict, answer, plan) = {
        let mut state = service.state.lock().unwrap_or_else(|p| p.into_inner());
        let (calls, ledger) = &mut *state;
        let nth = calls.entry(key.to_owned()).or_default();
        *nth += 1;
        let mut rng = dice(service.seed, key, *nth);
        let at = service.started.elapsed().as_millis() as u64;
        let call = Call {
            key,
            order_id: &body.order_id,
            step: body.step,
            action: body.action,
            timeout_ms: HANG.as_millis() as u64,
            agent: &agent,
            name: &action_name,
            handed: &handed,
        };
        let faults = service.agent_faults.get(&agent).unwrap_or(&service.faults);
        let verdict = ledger.call(faults, &mut rng, at, call);
        let answer = ledger.answer(key).to_owned();
        // The work of a callback step started: the outside party plans its word now (a
        // decided failure settles the key as refused, under this same lock).
        let plan = match (&service.outside, &body.callback_token, verdict) {
            (Some(outside), Some(token), Verdict::Answer { .. }) if body.action == Action::Do => {
                outside.plan(ledger, &call, token, &answer, at)
            }
            _ => Vec::new(),
        };
        (verdict, answer, plan)
    };
    if let Some(outside) = &service.outside {
        outside.send(plan).await;
    }
    match verdict {
        Verdict::Answer { latency_ms } => {
            if latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(latency_ms)).await;
            }
            (StatusCode::OK, answer)
        }
        Verdict::Transient => (StatusCode::SERVICE_UNAVAILABLE, "try again".into()),
        Verdict::Refused => (StatusCode::UNPROCESSABLE_ENTITY, "declined".into()),
        Verdict::Hang => {
            // The caller's timeout ends this call; the server never answers it.
            tokio::time::sleep(HANG).await;
            (StatusCode::GATEWAY_TIMEOUT, "hung".into())
        }
    }
}

/// A running simulated service; dropped or `stop`ped, it stops serving.
pub struct LoopbackRemote {
    pub addr: SocketAddr,
    service: Arc<Service>,
    server: tokio::task::JoinHandle<()>,
}

impl LoopbackRemote {
    pub async fn start(
        faults: RemoteFaults,
        agent_faults: BTreeMap<String, RemoteFaults>,
        seed: u64,
    ) -> std::io::Result<LoopbackRemote> {
        LoopbackRemote::start_with(faults, agent_faults, seed, None).await
    }

    /// As `start`, and with `outside` playing the outside party of callback steps.
    pub async fn start_with(
        faults: RemoteFaults,
        agent_faults: BTreeMap<String, RemoteFaults>,
        seed: u64,
        outside: Option<Outside>,
    ) -> std::io::Result<LoopbackRemote> {
        let service = Arc::new(Service {
            faults,
            agent_faults,
            seed,
            started: Instant::now(),
            state: Mutex::new((HashMap::new(), Ledger::default())),
            outside,
            flights: Mutex::default(),
        });
        let router = Router::new().route("/{agent}/{action}", post(call)).with_state(service.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "simulated remote service stopped");
            }
        });
        Ok(LoopbackRemote { addr, service, server })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Now on the service's clock: µs after it started, as `Flights` counts.
    pub fn elapsed_us(&self) -> u64 {
        self.service.started.elapsed().as_micros() as u64
    }

    pub fn ledger(&self) -> Ledger {
        self.service.state.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Each agent's calls as the service saw them (`Flights`), by agent name.
    pub fn flights(&self) -> BTreeMap<String, Flights> {
        self.service.flights.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Everything the outside party sent to the callback queue, in the order planned.
    pub fn callback_sends(&self) -> Vec<CallbackSend> {
        self.service.outside.as_ref().map(Outside::sends).unwrap_or_default()
    }

    /// Every attempt whose call the outside party answered, with the word it drew.
    pub fn callback_attempts(&self) -> Vec<CallbackAttempt> {
        self.service.outside.as_ref().map(Outside::attempts).unwrap_or_default()
    }

    /// Stops at once: hung calls are abandoned, as a real outage would leave them.
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for LoopbackRemote {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// How the simulated outside party answers callback steps. Per attempt it draws one word:
/// never (`never`), too late (`late`), a failure (`failure`), else a success; and, each on
/// its own, whether to send it twice, and whether to send a completion with a bad token
/// while the attempt waits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CallbackFaults {
    /// The word comes up to this long after the call (uniform), in ms.
    pub delay_max_ms: u64,
    /// The word is a failure: the work was declined, and it had no effect (the service's
    /// ledger records the step's key as refused).
    pub failure: f64,
    /// The word is sent after the step's callback timeout: it is refused, and the wait lapses.
    pub late: f64,
    /// No word at all, and no heartbeats: the wait lapses.
    pub never: f64,
    /// The word is sent twice: the second copy is refused.
    pub duplicate: f64,
    /// While the attempt waits, a success is sent with the token of an earlier attempt
    /// of the step (a forged token when there was none).
    pub stale: f64,
    /// While the attempt waits, a success is sent with a forged token: the attempt's
    /// order, step and attempt, another secret.
    pub forged: f64,
    /// A party with no word of its own (`never`) still sends the heartbeats the step asks
    /// for, until its timeout: it keeps the work open for someone to complete by hand
    /// (`sasctl up`).
    pub keep_alive: bool,
}

/// How long a party that keeps a token for someone (`keep_alive`) sends its heartbeats:
/// they are planned at the call, each a delayed message, and SQS delays a message 15
/// minutes at most. A step to complete by hand later than this needs no heartbeat, or
/// one longer than its wait.
pub const KEEP_ALIVE_MAX_MS: u64 = 900_000;

/// The reason of every failure the outside party sends.
pub const DECLINED: &str = "declined by the outside party (sasctl dev)";

/// What a send of the outside party was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SendKind {
    /// The attempt's own word (completion, failure or heartbeat), in time.
    Genuine,
    /// The attempt's own word, sent after its callback timeout.
    Late,
    /// The second copy of a word.
    Copy,
    /// A completion with the token of an earlier attempt of the step.
    Stale,
    /// A completion with a forged token.
    Forged,
}

impl SendKind {
    /// A send that must change nothing.
    pub fn is_bad(self) -> bool {
        self != SendKind::Genuine
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SendKind::Genuine => "genuine",
            SendKind::Late => "late",
            SendKind::Copy => "second copy",
            SendKind::Stale => "stale",
            SendKind::Forged => "forged",
        }
    }
}

/// One message the outside party put on the callback queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackSend {
    pub order_id: String,
    pub step: u32,
    /// The attempt whose wait it was sent to (a stale send's token names an earlier one).
    pub attempt: u32,
    pub kind: SendKind,
    pub outcome: CallbackOutcome,
    /// The `CallbackMessage` as sent.
    pub body: String,
    /// When it was due to arrive, ms after the service started.
    pub at_ms: u64,
}

/// The outside party of callback steps: it takes each started attempt's token from the
/// call and answers later on the callback queue, through the real completion path.
pub struct Outside {
    faults: CallbackFaults,
    seed: u64,
    /// Each callback step's timeout and heartbeat, by (agent, step name): the call names
    /// no workflow version, so the longest timeout and the shortest heartbeat of the
    /// versions that have it.
    steps: BTreeMap<(String, String), sas::domain::Callback>,
    queues: Arc<dyn Queues>,
    queue: QueueUrl,
    state: Mutex<OutsideState>,
    /// Told of each token once, when its call brings it (`with_keeper`).
    keeper: Option<tokio::sync::mpsc::UnboundedSender<KeptToken>>,
}

/// A callback step's token as the outside party was given it, for someone to complete it
/// by hand (`sasctl up` prints `sasctl tasks complete TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptToken {
    pub order_id: String,
    pub step: String,
    pub attempt: u32,
    pub token: String,
}

#[derive(Default)]
struct OutsideState {
    /// The tokens each (order, step) was called with, by attempt.
    tokens: HashMap<(String, u32), BTreeMap<u32, String>>,
    attempts: Vec<CallbackAttempt>,
    sends: Vec<CallbackSend>,
}

/// The word an attempt gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    Success,
    Failure,
    Late,
    Never,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Success => "success",
            Fate::Failure => "failure",
            Fate::Late => "late",
            Fate::Never => "never",
        }
    }
}

/// An attempt of a callback step whose call the outside party answered (the work
/// started), and the word it drew for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackAttempt {
    pub order_id: String,
    pub step: u32,
    pub attempt: u32,
    pub fate: Fate,
}

impl Outside {
    /// The outside party of the callback steps of `workflows`, sending on `queue`.
    pub fn new(
        faults: CallbackFaults,
        seed: u64,
        workflows: &sas::domain::Workflows,
        queues: Arc<dyn Queues>,
        queue: QueueUrl,
    ) -> Outside {
        let mut steps: BTreeMap<(String, String), sas::domain::Callback> = BTreeMap::new();
        for step in workflows.all().iter().flat_map(|w| &w.steps) {
            let Some(cb) = step.callback else { continue };
            steps
                .entry((step.agent.clone(), step.name.clone()))
                .and_modify(|kept| {
                    kept.timeout_ms = kept.timeout_ms.max(cb.timeout_ms);
                    kept.heartbeat_ms = match (kept.heartbeat_ms, cb.heartbeat_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                })
                .or_insert(cb);
        }
        Outside { faults, seed, steps, queues, queue, state: Mutex::default(), keeper: None }
    }

    /// Tells `keeper` of each token the calls bring, once per token.
    pub fn with_keeper(self, keeper: tokio::sync::mpsc::UnboundedSender<KeptToken>) -> Outside {
        Outside { keeper: Some(keeper), ..self }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutsideState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn sends(&self) -> Vec<CallbackSend> {
        self.lock().sends.clone()
    }

    pub fn attempts(&self) -> Vec<CallbackAttempt> {
        self.lock().attempts.clone()
    }

    /// What to send, and after how long, for the attempt whose call (answered 2xx at `at`
    /// with `answer`) carried `token`. Once per token: an agent's retry of the same
    /// attempt plans nothing more. A failure is settled in `ledger` at once (the key is
    /// refused from now on, its effect never stood).
    fn plan(
        &self,
        ledger: &mut Ledger,
        call: &Call<'_>,
        token: &str,
        answer: &str,
        at: u64,
    ) -> Vec<(u64, CallbackSend)> {
        let Ok((token, claims)) = CallbackToken::parse(token) else { return Vec::new() };
        let Some(cb) = self.steps.get(&(call.agent.to_owned(), call.name.to_owned())).copied() else {
            return Vec::new();
        };
        // An answer a step cannot keep gives the step up at the agent: nothing to complete.
        let output = match answer {
            "" => None,
            text => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) if StepOutput::from_value(&v).is_ok() => Some(v),
                _ => return Vec::new(),
            },
        };
        let earlier = {
            let mut state = self.lock();
            let seen = state.tokens.entry((call.order_id.to_owned(), call.step)).or_default();
            if seen.contains_key(&claims.attempt) {
                return Vec::new();
            }
            let earlier = seen.range(..claims.attempt).next_back().map(|(_, t)| t.clone());
            seen.insert(claims.attempt, token.expose().to_owned());
            earlier
        };
        if let Some(keeper) = &self.keeper {
            let _ = keeper.send(KeptToken {
                order_id: call.order_id.to_owned(),
                step: call.name.to_owned(),
                attempt: claims.attempt,
                token: token.expose().to_owned(),
            });
        }
        let f = &self.faults;
        let mut rng = dice(self.seed ^ 0xca11_bac4_0000_0000, call.key, claims.attempt.into());
        let roll = rng.f64();
        let fate = if roll < f.never {
            Fate::Never
        } else if roll < f.never + f.late {
            Fate::Late
        } else if roll < f.never + f.late + f.failure {
            Fate::Failure
        } else {
            Fate::Success
        };
        let (duplicate, stale, forged) = (rng.f64() < f.duplicate, rng.f64() < f.stale, rng.f64() < f.forged);
        self.lock().attempts.push(CallbackAttempt {
            order_id: call.order_id.to_owned(),
            step: call.step,
            attempt: claims.attempt,
            fate,
        });
        let delay = rng.u64(0..=f.delay_max_ms);
        let mut secret = [0u8; 32];
        rng.fill(&mut secret);
        let forged_token =
            CallbackToken::mint(&claims.order_id, claims.step, claims.attempt, &CallbackSecret(secret));
        if fate == Fate::Failure {
            declined(ledger, call);
        }
        let word = match fate {
            Fate::Failure => Completion::Failure { reason: DECLINED.to_owned() },
            _ => Completion::Success { output: output.clone() },
        };
        // The step's output is the outside's once it completes (the shared checker's
        // `Outputs` reads it here): the service's answer, as this party completes with it.
        if let Some(o) = &output {
            ledger.callback_outputs.insert(call.key.to_owned(), o.to_string());
        }
        let success = Completion::Success { output };
        let mut out = Vec::new();
        let mut push = |after: u64, kind: SendKind, token: &str, completion: &Completion| {
            let message = CallbackMessage::new(token, completion);
            out.push((
                after,
                CallbackSend {
                    order_id: call.order_id.to_owned(),
                    step: call.step,
                    attempt: claims.attempt,
                    kind,
                    outcome: message.outcome,
                    body: message.to_body(),
                    at_ms: at + after,
                },
            ));
        };
        let own = token.expose();
        // Heartbeats, one well before each is due, while the word is still to come.
        if let Some(every) = cb.heartbeat_ms.filter(|_| fate != Fate::Never || f.keep_alive) {
            let half = (every / 2).max(1);
            let until = match fate {
                Fate::Late => cb.timeout_ms.saturating_sub(half),
                // Planned now, each a delayed message: at most SQS's longest delay ahead.
                Fate::Never => cb.timeout_ms.saturating_sub(half).min(KEEP_ALIVE_MAX_MS),
                _ => delay,
            };
            // A sign of life halfway to a word that takes a while.
            if !matches!(fate, Fate::Late | Fate::Never) && delay >= 50 {
                push(delay / 2, SendKind::Genuine, own, &Completion::Heartbeat);
            }
            let mut t = half;
            while t < until {
                push(t, SendKind::Genuine, own, &Completion::Heartbeat);
                t += half;
            }
        }
        let copy_after = 1 + rng.u64(0..20);
        match fate {
            Fate::Never => {}
            Fate::Late => {
                let t = cb.timeout_ms + 100 + delay;
                push(t, SendKind::Late, own, &word);
                if duplicate {
                    push(t + copy_after, SendKind::Copy, own, &word);
                }
            }
            Fate::Success | Fate::Failure => {
                push(delay, SendKind::Genuine, own, &word);
                if duplicate {
                    push(delay + copy_after, SendKind::Copy, own, &word);
                }
            }
        }
        // Bad tokens, while the attempt still waits.
        if stale {
            match &earlier {
                Some(old) => push(delay / 3, SendKind::Stale, old, &success),
                None => push(delay / 3, SendKind::Forged, forged_token.expose(), &success),
            }
        }
        if forged {
            push(delay / 3, SendKind::Forged, forged_token.expose(), &success);
        }
        out
    }

    /// Puts each planned message on the callback queue, delayed until it is due (as
    /// SQS's per-message delay does), and logs it.
    async fn send(&self, plan: Vec<(u64, CallbackSend)>) {
        for (after, sent) in plan {
            let message = Outgoing::delayed(sent.body.clone(), after);
            match self.queues.send(&self.queue, message).await {
                Ok(()) => self.lock().sends.push(sent),
                Err(e) => tracing::error!(error = %e, "the outside party could not send its callback"),
            }
        }
    }
}

/// The outside declined the work of `call`'s step: it had no effect, and the key is
/// refused from now on (the ledger's answer stays: the agent was handed it at the start).
fn declined(ledger: &mut Ledger, call: &Call<'_>) {
    if ledger.applied.remove(call.key).is_some() {
        ledger.effects.retain(|(_, order, step, action)| {
            !(order == call.order_id && *step == call.step && *action == Action::Do)
        });
    }
    ledger.settled.insert(call.key.to_owned(), Settled::Refused);
    ledger.refusals += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{Callback, OrderId, Step, Workflow, Workflows};

    struct Nowhere;

    #[async_trait::async_trait]
    impl Queues for Nowhere {
        async fn send_batch(&self, _: &QueueUrl, _: Vec<Outgoing>) -> Result<(), sas::ports::QueueError> {
            Ok(())
        }
    }

    fn outside(faults: CallbackFaults, heartbeat_ms: Option<u64>) -> Outside {
        let mut approve = Step::compensable("approve", "approvals", "withdraw");
        approve.callback = Some(Callback { timeout_ms: 3_000, heartbeat_ms });
        let wf = Workflow::new("w", vec![approve]);
        Outside::new(faults, 7, &Workflows::new(vec![wf]), Arc::new(Nowhere), QueueUrl("callbacks".into()))
    }

    fn call(key: &str) -> Call<'_> {
        Call {
            key,
            order_id: "o-1",
            step: 0,
            action: Action::Do,
            timeout_ms: 1_000,
            agent: "approvals",
            name: "approve",
            handed: "{}",
        }
    }

    fn token(attempt: u32, fill: u8) -> String {
        CallbackToken::mint(&OrderId::parse("o-1").unwrap(), 0, attempt, &CallbackSecret([fill; 32]))
            .expose()
            .to_owned()
    }

    fn kinds(plan: &[(u64, CallbackSend)]) -> Vec<(SendKind, &'static str)> {
        let word = |o: CallbackOutcome| match o {
            CallbackOutcome::Success => "success",
            CallbackOutcome::Failure => "failure",
            CallbackOutcome::Heartbeat => "heartbeat",
        };
        plan.iter().map(|(_, s)| (s.kind, word(s.outcome))).collect()
    }

    #[test]
    fn the_most_calls_in_one_second_counts_a_half_open_window() {
        let at = |ms: &[u64]| Flights {
            arrivals_us: ms.iter().map(|m| m * 1_000).collect(),
            ..Default::default()
        };
        assert_eq!(at(&[]).max_per_second(), 0);
        assert_eq!(at(&[0, 999, 1_000, 1_001, 1_998]).max_per_second(), 4, "999 to 1998 lie in one window");
        assert_eq!(at(&[0, 1_000, 2_000]).max_per_second(), 1, "a window apart: never together");
    }

    /// What the agent's timeout does to a hung call at the service: the connection goes,
    /// and with it the call's place in `Flights`. Without this a hung call would count
    /// until the service stopped, and the dev run's limit check would see calls the gate
    /// had long given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_call_is_in_flight_until_its_caller_gives_up() {
        let faults = RemoteFaults { hang: 1.0, ..Default::default() };
        let remote = LoopbackRemote::start(faults, BTreeMap::new(), 1).await.unwrap();
        // reqwest is built with no crypto provider: `http_remote::build_client` says why.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let call = |key: &'static str| {
            client
                .post(format!("{}/payment/charge", remote.base_url()))
                .header(IDEMPOTENCY_HEADER, key)
                .json(&serde_json::json!({"order_id": "o-1", "step": 0, "action": "do"}))
                .timeout(Duration::from_millis(300))
                .send()
        };
        let open = |remote: &LoopbackRemote| remote.flights().get("payment").map(|f| f.in_flight);
        let (a, b) = tokio::join!(call("o-1:0:do"), call("o-2:0:do"));
        assert!(a.is_err() && b.is_err(), "both hang until the caller's timeout");
        let flights = remote.flights()["payment"].clone();
        assert_eq!((flights.calls, flights.max_in_flight), (2, 2));
        // The server learns of the closed connection on its own time: wait for it,
        // without a sleep, up to a bound far past any loopback's.
        let bound = Instant::now() + Duration::from_secs(10);
        while open(&remote) != Some(0) && Instant::now() < bound {
            tokio::task::yield_now().await;
        }
        assert_eq!(open(&remote), Some(0), "the calls still count as in flight");
    }

    #[test]
    fn a_started_attempt_is_completed_once_with_the_services_answer() {
        let o = outside(CallbackFaults { delay_max_ms: 200, ..Default::default() }, None);
        let mut ledger = Ledger::default();
        let plan = o.plan(&mut ledger, &call("o-1:0:do"), &token(1, 1), r#"{"ticket":"A-1"}"#, 10);
        assert_eq!(kinds(&plan), [(SendKind::Genuine, "success")]);
        let sent = CallbackMessage::parse(&plan[0].1.body).unwrap();
        assert_eq!(sent.token, token(1, 1));
        assert_eq!(sent.output, Some(serde_json::json!({"ticket": "A-1"})));
        assert!(plan[0].0 <= 200 && plan[0].1.at_ms == 10 + plan[0].0);
        // The same attempt's call again (an agent's retry): nothing more.
        assert!(o.plan(&mut ledger, &call("o-1:0:do"), &token(1, 1), "", 20).is_empty());
        // A step that is no callback step, or an answer no step can keep: nothing.
        let other = Call { name: "other", ..call("o-1:0:do") };
        assert!(o.plan(&mut ledger, &other, &token(2, 1), "", 20).is_empty());
        assert!(o.plan(&mut ledger, &call("o-1:0:do"), &token(3, 1), "not json", 20).is_empty());
    }

    #[test]
    fn heartbeats_come_before_each_is_due_and_a_failure_settles_the_key_refused() {
        let faults = CallbackFaults { delay_max_ms: 2_600, failure: 1.0, ..Default::default() };
        let o = outside(faults, Some(1_000));
        let mut ledger = Ledger::default();
        ledger.applied.insert("o-1:0:do".into(), 1);
        ledger.effects.push((5, "o-1".into(), 0, Action::Do));
        let plan = o.plan(&mut ledger, &call("o-1:0:do"), &token(1, 1), "", 10);
        let word = plan.iter().find(|(_, s)| s.outcome == CallbackOutcome::Failure).unwrap().0;
        let mut beats: Vec<u64> =
            plan.iter().filter(|(_, s)| s.outcome == CallbackOutcome::Heartbeat).map(|(t, _)| *t).collect();
        beats.sort();
        // From the call on, no gap of a whole interval without a heartbeat before the word.
        let mut last = 0;
        for t in beats.iter().copied().chain([word]) {
            assert!(t - last < 1_000, "a gap from {last} to {t}: {beats:?}, word at {word}");
            last = t;
        }
        assert!(!ledger.is_applied("o-1:0:do") && ledger.effects.is_empty());
        assert_eq!(ledger.settled["o-1:0:do"], Settled::Refused);
        assert!(
            CallbackMessage::parse(&plan.last().unwrap().1.body)
                .unwrap()
                .reason
                .unwrap()
                .contains("declined")
        );
    }

    #[test]
    fn bad_sends_are_late_second_copies_old_or_forged_tokens() {
        let all = CallbackFaults {
            delay_max_ms: 100,
            late: 1.0,
            duplicate: 1.0,
            stale: 1.0,
            forged: 1.0,
            ..Default::default()
        };
        let o = outside(all, None);
        let mut ledger = Ledger::default();
        // The first attempt: no earlier token, so the stale send is forged.
        let first = o.plan(&mut ledger, &call("o-1:0:do"), &token(1, 1), "", 0);
        let mut got = kinds(&first);
        got.sort();
        let s = "success";
        assert_eq!(
            got,
            [(SendKind::Late, s), (SendKind::Copy, s), (SendKind::Forged, s), (SendKind::Forged, s)]
        );
        let late = first.iter().find(|(_, x)| x.kind == SendKind::Late).unwrap().0;
        assert!(late > 3_000, "after the timeout: {late}");
        for (_, x) in first.iter().filter(|(_, x)| x.kind == SendKind::Forged) {
            let t = CallbackMessage::parse(&x.body).unwrap().token;
            assert!(t.starts_with("sas1.o-1.0.1.") && t != token(1, 1), "{t}");
        }
        // The second attempt: the stale send carries the first's token.
        let second = o.plan(&mut ledger, &call("o-1:0:do"), &token(2, 2), "", 0);
        let stale = second.iter().find(|(_, x)| x.kind == SendKind::Stale).unwrap();
        assert_eq!(CallbackMessage::parse(&stale.1.body).unwrap().token, token(1, 1));
        assert_eq!(stale.1.attempt, 2);
        // Never: not a word, not a heartbeat.
        let never = outside(CallbackFaults { never: 1.0, ..Default::default() }, Some(1_000));
        assert!(never.plan(&mut Ledger::default(), &call("o-1:0:do"), &token(1, 1), "", 0).is_empty());
        // Kept for a person: no word, only heartbeats every half interval until the timeout.
        let kept =
            outside(CallbackFaults { never: 1.0, keep_alive: true, ..Default::default() }, Some(1_000));
        let sends = kept.plan(&mut Ledger::default(), &call("o-1:0:do"), &token(1, 1), "", 0);
        assert!(!sends.is_empty());
        assert!(sends.iter().all(|(_, x)| x.body.contains("heartbeat")), "{sends:?}");
    }
}
