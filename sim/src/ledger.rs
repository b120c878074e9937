//! The model of a well-behaved remote service, shared by the simulation's in-process
//! remote (`remote.rs`, simulated time) and `sasctl dev`'s loopback HTTP one
//! (`cli/src/remote_sim.rs`, real time): seeded faults, deduplication by idempotency key
//! (a key's first verdict, applied or refused, is final), a forward step refused once its
//! undo has been answered (docs/REFERENCE.md, "What sas relies on from the remote service"), and a
//! ledger of every call and every applied effect, which the invariants (`invariants/`)
//! judge runs by.

use std::collections::{BTreeMap, BTreeSet};

use sas::domain::Action;

/// How long after its effect a step's `release_at` answer is (a timer step waiting until
/// it then sleeps about this long).
pub const RELEASE_AFTER_MS: u64 = 1_500;

/// The remote service's faults. All zero: it answers every call at once, with success.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RemoteFaults {
    /// A transient error (503).
    pub transient: f64,
    /// A permanent refusal of a forward step (422: the step has no effect).
    pub permanent: f64,
    /// A permanent refusal of a compensation.
    pub undo_permanent: f64,
    /// The call never answers, and half of those after the effect was applied (a lost
    /// response).
    pub hang: f64,
    /// Service time of an answered call: uniform up to this.
    pub latency_max_ms: u64,
    /// A forward step's effect is applied but its answer is an output too large to keep.
    pub bad_output: f64,
    /// The service lacks the tombstone docs/REFERENCE.md asks for: it applies a forward call that
    /// arrives after its step's undo was answered. Only the cancel's hold then keeps an
    /// undo behind the effect it undoes.
    pub ignores_undone: bool,
}

/// How an idempotency key was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The effect was applied, at this time.
    Applied {
        at: u64,
    },
    Refused,
}

/// What the remote side saw and did.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub calls: u64,
    pub hangs: u64,
    pub transient: u64,
    /// Keys refused for good.
    pub refusals: u64,
    /// Forward calls refused because their step's undo had been answered before they
    /// arrived (a request held up past the undo; counted within `refusals`).
    pub late_do_refused: u64,
    /// The forward keys whose undo the service has answered (a step's, or a map item's):
    /// a `do` under one that arrives later is refused, never applied.
    pub undone: BTreeSet<String>,
    /// Answers of success, deduplicated ones included.
    pub successes: u64,
    /// Times each key's effect was applied. The service deduplicates, so more than one
    /// would mean the service (the model) is broken; the checker verifies it anyway.
    pub applied: BTreeMap<String, u32>,
    pub settled: BTreeMap<String, Settled>,
    /// (order id, step, action) -> every idempotency key it was called with.
    pub keys: BTreeMap<(String, u32, Action), BTreeSet<String>>,
    /// Applied effects in the order they happened: (time, order id, step, action).
    pub effects: Vec<(u64, String, u32, Action)>,
    /// What each applied forward key answers with, every time it is asked (its output),
    /// when it answers anything.
    pub answers: BTreeMap<String, String>,
    /// Per key: every set of earlier outputs its calls were handed, as compact JSON.
    pub handed: BTreeMap<String, BTreeSet<String>>,
    /// Per key: every (agent, action name) it was called as.
    pub called_as: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Calls that reached the service (answered, refused, or hung after it saw them), as
    /// opposed to a 503 or a hang on the way: a callback step's token is handed to whoever
    /// completes the work only by a call the service saw (`sim/src/outside.rs`).
    pub reached: u64,
    /// A callback step's final output, by its forward key: what the outside party that
    /// completes the work answers with when it answers anything (the same every time, as
    /// `answers` for a key), which later steps must be handed in place of the agent's.
    pub callback_outputs: BTreeMap<String, String>,
    /// The flow-control limits of the agents that have any, as the deployment's
    /// definitions set them: the calls of these agents are kept in `flights`.
    pub limits: BTreeMap<String, sas::domain::gate::Limits>,
    /// How far apart two of the deployment's clocks may be, at most: twice the bound of
    /// each one's skew. A gate keeps time by its writers' clocks (a place lapses, a rate
    /// tail ends), so the service may see the limits kept only to within this.
    pub clock_slack_ms: u64,
    /// Per limited agent, every call as the service saw it, in the order they started.
    pub flights: BTreeMap<String, Vec<Flight>>,
    /// Calls of limited agents answered "too many requests" (never reaching the model).
    pub throttled: u64,
    /// When an agent first sent the reply of each place (`<order>#<attempt>`) of a limited
    /// agent's call: the attempt's calls are over then, and a call under that place after
    /// it would be a copy of the request's (`Flight::copy`).
    pub replied: BTreeMap<String, u64>,
}

/// One call of a limited agent as the service saw it: from its request's arrival to its
/// answer, or to the moment its caller stopped waiting (a hang), whichever came first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flight {
    pub start: u64,
    pub end: u64,
    pub key: String,
    /// The place the call was made under, `<order>#<attempt>` (`gate::call_holder`), from
    /// the agent request being handled: the copies of one request that SQS delivered more
    /// than once share it.
    pub holder: String,
    /// Made after the place's reply was sent: a copy of the request that SQS delivered
    /// again (at least once), called after the place may have been given back. Counted
    /// by the run (`copies`); `RemoteWithinLimits` counts it like any other call.
    pub copy: bool,
}

/// The items a generated map runs over (`swarm.rs`, `with_map`), as a JSON array: none,
/// one, a few, or (one time in twenty) hundreds; drawn from half as many names as there
/// are items, so some repeat.
fn map_items(chance: &mut impl Chance) -> String {
    let n = match chance.upto(19) {
        0..=2 => 0,
        3..=5 => 1,
        6 => 100 + chance.upto(150),
        _ => 2 + chance.upto(10),
    };
    let names: Vec<String> = (0..n).map(|_| format!("\"i{}\"", chance.upto(n / 2))).collect();
    format!("[{}]", names.join(","))
}

/// The longest answer the model gives when it gives one too large to keep.
const TOO_LARGE: usize = sas::domain::MAX_OUTPUT_BYTES + 100;

/// The chance a call's verdict draws on: which faults hit it, whether a hang reached the
/// service, what it answers and how slowly. `roll` is a fault of `kind` with probability
/// `p` (the simulation counts them by kind); a plain generator serves `sasctl dev`, the
/// world's the simulation, a script the tests below.
pub trait Chance {
    fn roll(&mut self, kind: &'static str, p: f64) -> bool;
    fn coin(&mut self) -> bool;
    /// Uniform in `0..=max`.
    fn upto(&mut self, max: u64) -> u64;
}

impl Chance for fastrand::Rng {
    fn roll(&mut self, _kind: &'static str, p: f64) -> bool {
        p > 0.0 && self.f64() < p
    }
    fn coin(&mut self) -> bool {
        self.bool()
    }
    fn upto(&mut self, max: u64) -> u64 {
        self.u64(0..=max)
    }
}

/// What the caller of one remote call experiences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Success, answered after this long.
    Answer { latency_ms: u64 },
    /// 503: try again.
    Transient,
    /// 422: refused for good.
    Refused,
    /// No answer before the caller's timeout.
    Hang,
}

/// One call to the remote service, as its ledger records it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub key: &'a str,
    pub order_id: &'a str,
    pub step: u32,
    pub action: Action,
    /// The caller's timeout: an answer slower than this is a hang to the caller.
    pub timeout_ms: u64,
    pub agent: &'a str,
    /// The step's or compensation's name, as the call addressed it.
    pub name: &'a str,
    /// The outputs the call was handed, as compact JSON (`{}` for none).
    pub handed: &'a str,
}

impl Ledger {
    /// Decides and records one call at time `at`. Deciding and applying are one step,
    /// as a real idempotent service settles a key once: two concurrent calls with one
    /// key can never see it both applied and refused.
    pub fn call(
        &mut self,
        faults: &RemoteFaults,
        chance: &mut impl Chance,
        at: u64,
        call: Call<'_>,
    ) -> Verdict {
        self.calls += 1;
        self.keys
            .entry((call.order_id.to_owned(), call.step, call.action))
            .or_default()
            .insert(call.key.to_owned());
        self.handed.entry(call.key.to_owned()).or_default().insert(call.handed.to_owned());
        self.called_as
            .entry(call.key.to_owned())
            .or_default()
            .insert((call.agent.to_owned(), call.name.to_owned()));
        let settled = self.settled.get(call.key).copied();
        let (permanent_kind, permanent) = match call.action {
            Action::Do => ("remote_permanent", faults.permanent),
            Action::Undo => ("remote_undo_permanent", faults.undo_permanent),
        };
        if chance.roll("remote_hang", faults.hang) {
            self.hangs += 1;
            // Half the hangs reached the service, which settled the key before the
            // answer was lost: a late `do` there is refused like any other.
            if chance.coin() {
                self.reached += 1;
                if self.is_late(faults, settled, call) {
                    self.refuse_late(call);
                } else {
                    self.apply(faults, chance, settled, at, call);
                }
            }
            Verdict::Hang
        } else if chance.roll("remote_transient", faults.transient) {
            self.transient += 1;
            Verdict::Transient
        } else if settled == Some(Settled::Refused) {
            self.reached += 1;
            Verdict::Refused
        } else if self.is_late(faults, settled, call) {
            self.reached += 1;
            self.refuse_late(call);
            Verdict::Refused
        } else if settled.is_none() && chance.roll(permanent_kind, permanent) {
            self.reached += 1;
            self.refusals += 1;
            self.settled.insert(call.key.to_owned(), Settled::Refused);
            self.answered_undo(call);
            Verdict::Refused
        } else {
            self.reached += 1;
            self.apply(faults, chance, settled, at, call);
            let latency_ms = if faults.latency_max_ms > 0 { chance.upto(faults.latency_max_ms) } else { 0 };
            if latency_ms >= call.timeout_ms {
                // Answered too late: the caller's timeout fired first.
                Verdict::Hang
            } else {
                self.successes += 1;
                Verdict::Answer { latency_ms }
            }
        }
    }

    /// Applies a key's effect once, and settles what it answers: a forward step answers
    /// an output half the time (naming the key, so a checker can tell whose it is), and
    /// now and then one too large to keep.
    fn apply(
        &mut self,
        faults: &RemoteFaults,
        chance: &mut impl Chance,
        settled: Option<Settled>,
        at: u64,
        call: Call<'_>,
    ) {
        if settled.is_none() {
            self.answered_undo(call);
            self.settled.insert(call.key.to_owned(), Settled::Applied { at });
            *self.applied.entry(call.key.to_owned()).or_default() += 1;
            self.effects.push((at, call.order_id.to_owned(), call.step, call.action));
            if call.action == Action::Do {
                let answer = if chance.roll("remote_bad_output", faults.bad_output) {
                    Some(format!(r#"{{"ref":"{}","pad":"{}"}}"#, call.key, "x".repeat(TOO_LARGE)))
                } else if call.name.ends_with("-list") {
                    Some(format!(r#"{{"lines":{},"ref":"{}"}}"#, map_items(chance), call.key))
                } else if chance.coin() {
                    // `release_at`: a time a later timer step may wait until (`Swarm`'s
                    // generated workflows do), shortly after the effect.
                    let release_at = sas::domain::Timestamp(at + RELEASE_AFTER_MS).to_rfc3339();
                    Some(format!(r#"{{"ref":"{}","release_at":"{release_at}"}}"#, call.key))
                } else {
                    None
                };
                if let Some(answer) = answer {
                    self.answers.insert(call.key.to_owned(), answer);
                }
            }
        }
    }

    /// A forward call not settled yet whose step's undo the service has answered (and the
    /// service keeps tombstones).
    fn is_late(&self, faults: &RemoteFaults, settled: Option<Settled>, call: Call<'_>) -> bool {
        settled.is_none()
            && call.action == Action::Do
            && !faults.ignores_undone
            && self.undone.contains(call.key)
    }

    fn refuse_late(&mut self, call: Call<'_>) {
        self.refusals += 1;
        self.late_do_refused += 1;
        self.settled.insert(call.key.to_owned(), Settled::Refused);
    }

    /// Remembers that a step's undo was answered, so its forward call, if it is still on
    /// its way, is refused when it arrives.
    fn answered_undo(&mut self, call: Call<'_>) {
        if call.action == Action::Undo
            && let Some(head) = call.key.strip_suffix(":undo")
        {
            self.undone.insert(format!("{head}:do"));
        }
    }

    /// The body a success under `key` carries: its settled answer, or nothing.
    pub fn answer(&self, key: &str) -> &str {
        self.answers.get(key).map_or("", String::as_str)
    }

    /// Whether the effect under `key` was applied.
    pub fn is_applied(&self, key: &str) -> bool {
        self.applied.contains_key(key)
    }
}

/// The place a call is made under, from the agent request being handled (its order and
/// attempt); the key when the request cannot be read (it always can: the agent read it).
/// A reply to the scheduler names its place the same way.
pub fn holder_of(request: Option<&str>, key: &str) -> String {
    let place = request.and_then(|body| serde_json::from_str::<Place>(body).ok());
    match place.and_then(|p| Some((p.order_id?, p.attempt?))) {
        Some((order, attempt)) => format!("{order}#{attempt}"),
        None => key.to_owned(),
    }
}

/// The two fields of a JSON object `holder_of` reads, as `serde_json::Value`'s indexing
/// reads them (the last of a repeated key; `None` if absent or of another type; no place
/// from anything but an object), without building a `Value` of the whole request and its
/// order: that was 2 % of a run's instructions.
struct Place {
    order_id: Option<String>,
    attempt: Option<u64>,
}

impl<'de> serde::Deserialize<'de> for Place {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Place, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Place;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Place, A::Error> {
                let mut place = Place { order_id: None, attempt: None };
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::OrderId => {
                            place.order_id =
                                map.next_value::<serde_json::Value>()?.as_str().map(str::to_owned)
                        }
                        Key::Attempt => place.attempt = map.next_value::<serde_json::Value>()?.as_u64(),
                        Key::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(place)
            }
        }
        d.deserialize_any(Fields)
    }
}

/// A key of the object `Place` reads, told apart without allocating (unescaped as any).
enum Key {
    OrderId,
    Attempt,
    Other,
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "order_id" => Key::OrderId,
                    "attempt" => Key::Attempt,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chance read from a script: each roll and coin takes the next bool.
    struct Scripted(Vec<bool>);

    impl Chance for Scripted {
        fn roll(&mut self, _kind: &'static str, _p: f64) -> bool {
            self.0.remove(0)
        }
        fn coin(&mut self) -> bool {
            self.0.remove(0)
        }
        fn upto(&mut self, _max: u64) -> u64 {
            0
        }
    }

    fn call(action: Action) -> Call<'static> {
        Call {
            key: "o:0:do",
            order_id: "o",
            step: 0,
            action,
            timeout_ms: 100,
            agent: "a",
            name: "s",
            handed: "{}",
        }
    }

    #[test]
    fn a_key_is_settled_once_and_deduplicated() {
        let mut l = Ledger::default();
        let f = RemoteFaults::default();
        // hang with the effect applied, then answered: applied once, success on the retry.
        // (the last two: no output too large, and an output)
        assert_eq!(
            l.call(&f, &mut Scripted(vec![true, true, false, true]), 1, call(Action::Do)),
            Verdict::Hang
        );
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, true]), 2, call(Action::Do)),
            Verdict::Answer { latency_ms: 0 },
            "an applied key is never refused"
        );
        assert_eq!(l.applied["o:0:do"], 1);
        assert_eq!(l.effects.len(), 1);
        assert_eq!(l.settled["o:0:do"], Settled::Applied { at: 1 });
        // Its `release_at` is a time after the effect (at 1 ms) that a later timer step
        // may wait until.
        assert_eq!(
            l.answer("o:0:do"),
            r#"{"ref":"o:0:do","release_at":"1970-01-01T00:00:01.501Z"}"#,
            "the same answer every time"
        );

        let mut l = Ledger::default();
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, true]), 1, call(Action::Do)),
            Verdict::Refused
        );
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false]), 2, call(Action::Do)),
            Verdict::Refused,
            "a refusal is final"
        );
        assert!(!l.is_applied("o:0:do"));
        assert_eq!((l.calls, l.refusals), (2, 1));
    }

    #[test]
    fn a_do_that_arrives_after_its_undo_is_refused() {
        let f = RemoteFaults::default();
        let undo = Call { key: "o:0:undo", ..call(Action::Undo) };
        let mut l = Ledger::default();
        // The undo answered first (no hang, no transient, not refused): the late do is
        // refused and never applied, and its refusal is final.
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, false]), 1, undo),
            Verdict::Answer { latency_ms: 0 }
        );
        assert_eq!(l.call(&f, &mut Scripted(vec![false, false]), 2, call(Action::Do)), Verdict::Refused);
        assert_eq!(l.call(&f, &mut Scripted(vec![false, false]), 3, call(Action::Do)), Verdict::Refused);
        assert!(!l.is_applied("o:0:do"));
        assert_eq!((l.refusals, l.late_do_refused), (1, 1));

        // A do applied before its undo stays applied: it is answered as before.
        let mut l = Ledger::default();
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, false, false, false]), 1, call(Action::Do)),
            Verdict::Answer { latency_ms: 0 }
        );
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, false]), 2, undo),
            Verdict::Answer { latency_ms: 0 }
        );
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false]), 3, call(Action::Do)),
            Verdict::Answer { latency_ms: 0 }
        );
        assert_eq!(l.late_do_refused, 0);

        // A late do that hangs after reaching the service is refused there all the same.
        let mut l = Ledger::default();
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, false]), 1, undo),
            Verdict::Answer { latency_ms: 0 }
        );
        assert_eq!(l.call(&f, &mut Scripted(vec![true, true]), 2, call(Action::Do)), Verdict::Hang);
        assert!(!l.is_applied("o:0:do"));
        assert_eq!(l.settled["o:0:do"], Settled::Refused);
        assert_eq!(l.late_do_refused, 1);

        // An undo lost on its way (a hang before the service saw it) leaves no mark.
        let mut l = Ledger::default();
        assert_eq!(l.call(&f, &mut Scripted(vec![true, false]), 1, undo), Verdict::Hang);
        assert_eq!(
            l.call(&f, &mut Scripted(vec![false, false, false, false, false]), 2, call(Action::Do)),
            Verdict::Answer { latency_ms: 0 }
        );
    }
}
