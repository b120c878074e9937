//! The outside party of callback steps: whoever finishes the work a callback step's agent
//! started (a person approving, a partner's webhook). The simulated remote service
//! (`remote.rs`) hands it every callback token a call it saw carried; it then answers on
//! the simulation's clock, through the real callback path: a `CallbackMessage` on the
//! callback queue, which the scheduler function's `Callbacks` handler takes (so crashes,
//! duplicates and redelivery are the platform's), or now and then `sasctl tasks
//! complete|fail|heartbeat` (`handlers::complete`) run directly.
//!
//! Like any outside party it is not always right: it answers late (after the callback's
//! timeout), twice, with heartbeats spaced too far apart, with the token of an attempt that
//! was retried since, with a forged token (the right order, step and attempt, another
//! secret), with a message that is not a callback message at all, or never. How often is
//! drawn per seed (`OutsideRates`, swarm testing as for faults), and every plan from a
//! generator of its own seeded from the seed, so the world's draws stay the world's.
//!
//! What it sends is kept (`Outside::sent`) with the tokens it was handed
//! (`Outside::handed`): the checker (`check.rs`) knows of every word whether its token was
//! one the pipeline minted and for which attempt, and judges each write made for one.

use std::collections::BTreeMap;

use sas::domain::{Callback, CallbackMessage, CallbackToken, Completion, MAX_OUTPUT_BYTES, Workflows};

use crate::ledger::Ledger;

/// How the outside party behaves in one seed. All zero: it finishes every attempt it hears
/// of with success, once, within half the callback's timeout, and beats well within the
/// heartbeat interval: a well-behaved party.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OutsideRates {
    /// An attempt gets no final word (heartbeats, perhaps, then nothing).
    pub never: f64,
    /// The final word is a failure: the outside declined (a refusal, the step had no effect).
    pub fail: f64,
    /// The final word comes within 60 ms: often before the agent's answer has landed.
    pub fast: f64,
    /// The final word comes after the callback's timeout.
    pub late: f64,
    /// The final word is sent a second time, up to 3 s later.
    pub duplicate: f64,
    /// A heartbeat within 40 ms of the work starting (before the agent's answer, often).
    pub early_beat: f64,
    /// Heartbeats are spaced up to 1.15 intervals apart (else at most half of one): some
    /// are missed.
    pub skip_beats: bool,
    /// Once a retry's token arrives, a word with the token of the attempt before it.
    pub stale: f64,
    /// A word with a forged token: the right order, step and attempt, another secret.
    pub forged: f64,
    /// A message that is not a callback message, or whose token is not one.
    pub malformed: f64,
    /// A word sent with `sasctl tasks complete|fail|heartbeat` instead of the queue.
    pub direct: f64,
    /// Some steps' outputs are over 4 KiB: their success can never be kept.
    pub too_large: bool,
}

const OUTSIDE_SALT: u64 = 0x006f_7574_7369_6465;

impl OutsideRates {
    /// The seed's rates, from a generator of their own (seeded from `seed`, not drawn from
    /// the seed's generator): a quarter of the seeds have a well-behaved party, the rest
    /// switch each misbehaviour on or off.
    pub fn for_seed(seed: u64) -> OutsideRates {
        let mut rng = fastrand::Rng::with_seed(seed ^ OUTSIDE_SALT);
        if rng.u8(..4) == 0 {
            return OutsideRates::default();
        }
        let mut on = |lo: f64, hi: f64| if rng.bool() { lo + rng.f64() * (hi - lo) } else { 0.0 };
        let never = on(0.03, 0.15);
        let fail = on(0.1, 0.4);
        let fast = on(0.05, 0.3);
        let late = on(0.05, 0.2);
        let duplicate = on(0.1, 0.5);
        let early_beat = on(0.1, 0.5);
        let stale = on(0.3, 1.0);
        let forged = on(0.05, 0.3);
        let malformed = on(0.02, 0.15);
        let direct = on(0.05, 0.25);
        OutsideRates {
            never,
            fail,
            fast,
            late,
            duplicate,
            early_beat,
            skip_beats: rng.bool(),
            stale,
            forged,
            malformed,
            direct,
            too_large: rng.u8(..4) == 0,
        }
    }

    pub fn enabled(&self) -> Vec<&'static str> {
        let all = [
            ("never", self.never),
            ("fail", self.fail),
            ("fast", self.fast),
            ("late", self.late),
            ("duplicate", self.duplicate),
            ("early_beat", self.early_beat),
            ("skip_beats", if self.skip_beats { 1.0 } else { 0.0 }),
            ("stale", self.stale),
            ("forged", self.forged),
            ("malformed", self.malformed),
            ("direct", self.direct),
            ("too_large", if self.too_large { 1.0 } else { 0.0 }),
        ];
        all.into_iter().filter(|(_, v)| *v > 0.0).map(|(k, _)| k).collect()
    }
}

/// What kind of word a send is, as the outside party meant it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Word {
    /// The attempt's own token, planned within its timeout (a final word or a heartbeat).
    Live,
    /// The attempt's own token, planned after its timeout.
    Late,
    /// The final word again.
    Duplicate,
    /// The token of an attempt retried since.
    Stale,
    /// Another secret under the attempt's order, step and attempt.
    Forged,
    /// Not a callback message, or a token that is not one.
    Malformed,
}

impl Word {
    pub fn name(self) -> &'static str {
        match self {
            Word::Live => "outside_live",
            Word::Late => "outside_late",
            Word::Duplicate => "outside_duplicate",
            Word::Stale => "outside_stale",
            Word::Forged => "outside_forged",
            Word::Malformed => "outside_malformed",
        }
    }
}

/// A token the remote service was handed by a call it saw: the pipeline minted it for this
/// order, step and attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    pub order_id: String,
    pub step: u32,
    pub attempt: u32,
    /// True time the service first saw it.
    pub at: u64,
}

/// One word the outside party sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// True time it was sent.
    pub at: u64,
    /// The callback message, as sent (for a direct word, as the command would write it).
    pub body: String,
    pub word: Word,
    /// Sent with `sasctl tasks ...` (`handlers::complete`), not on the callback queue.
    pub direct: bool,
    /// A malformed message: a phrase the reason it is kept with must contain.
    pub expect: Option<&'static str>,
}

/// A word to send at a time: the body, and for a direct one, the token and the word.
#[derive(Debug, Clone)]
pub struct Planned {
    pub body: String,
    pub word: Word,
    pub direct: Option<(String, Completion)>,
    pub expect: Option<&'static str>,
}

pub struct Outside {
    rng: fastrand::Rng,
    pub rates: OutsideRates,
    /// The callback of each (workflow, step name) of the deployment.
    callbacks: BTreeMap<(String, String), Callback>,
    /// Every token the service was handed, by its text.
    pub handed: BTreeMap<String, Handed>,
    /// Each job's tokens (order id, step), in the order handed.
    jobs: BTreeMap<(String, u32), Vec<String>>,
    planned: BTreeMap<(u64, u64), Planned>,
    seq: u64,
    /// Every word sent, in the order sent.
    pub sent: Vec<Sent>,
    /// The words the pipeline acknowledged (a callback handler that returned success, or
    /// `sasctl tasks ...` that applied or noted it), in the order acknowledged.
    pub acked: Vec<Acked>,
}

/// A word the pipeline acknowledged, and the true time its handling began: the decision
/// that acknowledged it read the clock no earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub at: u64,
    pub body: std::sync::Arc<str>,
}

impl Default for Outside {
    fn default() -> Outside {
        Outside {
            rng: fastrand::Rng::with_seed(0),
            rates: OutsideRates::default(),
            callbacks: BTreeMap::new(),
            handed: BTreeMap::new(),
            jobs: BTreeMap::new(),
            planned: BTreeMap::new(),
            seq: 0,
            sent: Vec::new(),
            acked: Vec::new(),
        }
    }
}

fn roll(rng: &mut fastrand::Rng, p: f64) -> bool {
    p > 0.0 && rng.f64() < p
}

/// FNV-1a of a key: which steps answer with an output, from the key alone.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Outside {
    pub fn new(seed: u64, rates: OutsideRates, workflows: &Workflows) -> Outside {
        let callbacks = workflows
            .all()
            .iter()
            .flat_map(|w| {
                w.steps.iter().filter_map(|s| Some(((w.name.clone(), s.name.clone()), s.callback?)))
            })
            .collect();
        Outside {
            rng: fastrand::Rng::with_seed(fnv(&format!("outside {seed}"))),
            rates,
            callbacks,
            ..Outside::default()
        }
    }

    /// What the outside answers a success of the work under forward key `key` with: nothing
    /// for one key in four, else an object naming the key (over 4 KiB for one key in
    /// sixteen, in seeds with `too_large`). The same every time.
    fn output_for(&self, key: &str) -> Option<serde_json::Value> {
        match fnv(key) % 16 {
            0..=3 => None,
            4 if self.rates.too_large => {
                Some(serde_json::json!({"approved": key, "pad": "x".repeat(MAX_OUTPUT_BYTES + 100)}))
            }
            _ => Some(serde_json::json!({"approved": key})),
        }
    }

    /// The service took a call of `workflow`'s step `step_name` (forward key `key`) carrying
    /// `token`, at `now`. The first time it sees a token, the outside plans its words.
    pub fn hand(
        &mut self,
        now: u64,
        token: &str,
        workflow: &str,
        step_name: &str,
        key: &str,
        ledger: &mut Ledger,
    ) {
        if self.handed.contains_key(token) {
            return;
        }
        let Ok((_, claims)) = CallbackToken::parse(token) else { return };
        let order_id = claims.order_id.as_str().to_owned();
        let handed =
            Handed { order_id: order_id.clone(), step: claims.step, attempt: claims.attempt, at: now };
        self.handed.insert(token.to_owned(), handed);
        let earlier = self.jobs.entry((order_id, claims.step)).or_default();
        let previous = earlier.last().cloned();
        earlier.push(token.to_owned());
        let output = self.output_for(key);
        if let Some(o) = &output {
            ledger.callback_outputs.insert(key.to_owned(), o.to_string());
        }
        let cb = self
            .callbacks
            .get(&(workflow.to_owned(), step_name.to_owned()))
            .copied()
            .unwrap_or(Callback { timeout_ms: 2_000, heartbeat_ms: None });
        self.plan(now, token, previous.as_deref(), cb, output);
    }

    fn plan(
        &mut self,
        now: u64,
        token: &str,
        previous: Option<&str>,
        cb: Callback,
        output: Option<serde_json::Value>,
    ) {
        let r = self.rates;
        let timeout = cb.timeout_ms;
        let success = Completion::Success { output };
        let declined = Completion::Failure { reason: "declined by the outside".into() };
        // The final word: when, and what.
        let last = if roll(&mut self.rng, r.never) {
            None
        } else {
            let (at, word) = if roll(&mut self.rng, r.fast) {
                (now + self.rng.u64(0..=60), Word::Live)
            } else if roll(&mut self.rng, r.late) {
                (now + timeout + self.rng.u64(0..=2_000), Word::Late)
            } else {
                let within = if r == OutsideRates::default() { timeout / 2 } else { timeout * 9 / 10 };
                (now + self.rng.u64(0..=within), Word::Live)
            };
            let completion = if roll(&mut self.rng, r.fail) { declined.clone() } else { success.clone() };
            Some((at, word, completion))
        };
        // Heartbeats until then (or until the timeout when no final word comes): at its
        // interval when the step has one, else now and then at a third of the timeout.
        let end = last.as_ref().map_or(now + timeout, |(at, ..)| *at);
        if roll(&mut self.rng, r.early_beat) {
            let at = now + self.rng.u64(0..=40);
            self.word(at, token, Completion::Heartbeat, Word::Live);
        }
        let interval = match cb.heartbeat_ms {
            Some(ms) => Some(ms),
            None if self.rng.u8(..5) == 0 => Some((timeout / 3).max(300)),
            None => None,
        };
        if let Some(interval) = interval {
            let hi = if r.skip_beats { 1.15 } else { 0.5 };
            let mut at = now;
            loop {
                at += (interval as f64 * (0.3 + self.rng.f64() * (hi - 0.3))) as u64;
                if at >= end {
                    break;
                }
                self.word(at, token, Completion::Heartbeat, Word::Live);
            }
        }
        if let Some((at, word, completion)) = last {
            if roll(&mut self.rng, r.duplicate) {
                let again = at + self.rng.u64(0..=3_000);
                self.word(again, token, completion.clone(), Word::Duplicate);
            }
            self.word(at, token, completion, word);
        }
        let any = |rng: &mut fastrand::Rng| match rng.u8(..3) {
            0 => Completion::Heartbeat,
            1 => declined.clone(),
            _ => success.clone(),
        };
        if roll(&mut self.rng, r.forged) {
            let head = token.rsplit_once('.').map_or(token, |(head, _)| head);
            let secret: String =
                (0..64).map(|_| char::from(b"0123456789abcdef"[self.rng.usize(..16)])).collect();
            let forged = format!("{head}.{secret}");
            let (at, completion) = (now + self.rng.u64(0..=timeout), any(&mut self.rng));
            self.word(at, &forged, completion, Word::Forged);
        }
        if let Some(previous) = previous
            && roll(&mut self.rng, r.stale)
        {
            let (at, completion) = (now + self.rng.u64(0..=1_500), any(&mut self.rng));
            self.word(at, previous, completion, Word::Stale);
        }
        if roll(&mut self.rng, r.malformed) {
            let at = now + self.rng.u64(0..=timeout);
            let cut = &token[..token.len() - 2];
            let (body, expect) = match self.rng.u8(..6) {
                0 => ("{not json".to_owned(), "not a callback message"),
                1 => (format!(r#"{{"token":"{cut}","outcome":"success"}}"#), "a callback token is"),
                2 => (
                    format!(r#"{{"token":"{token}","outcome":"heartbeat","reason":"still on it"}}"#),
                    "not a callback message",
                ),
                3 => (format!(r#"{{"token":"{token}","outcome":"failure"}}"#), "not a callback message"),
                4 => (format!(r#"{{"token":"{token}","outcome":"done"}}"#), "not a callback message"),
                _ => {
                    let ghost = format!("sas1.ghost-{}.0.1.{}", self.seq, "0".repeat(64));
                    (CallbackMessage::new(&ghost, &success).to_body(), "no order ghost-")
                }
            };
            self.push(at, Planned { body, word: Word::Malformed, direct: None, expect: Some(expect) });
        }
    }

    fn word(&mut self, at: u64, token: &str, completion: Completion, word: Word) {
        let body = CallbackMessage::new(token, &completion).to_body();
        let direct = roll(&mut self.rng, self.rates.direct).then(|| (token.to_owned(), completion));
        self.push(at, Planned { body, word, direct, expect: None });
    }

    fn push(&mut self, at: u64, planned: Planned) {
        self.seq += 1;
        self.planned.insert((at, self.seq), planned);
    }

    /// When the next word goes out, if any is planned.
    pub fn next_send(&self) -> Option<u64> {
        self.planned.keys().next().map(|(at, _)| *at)
    }

    /// The words due at `now`, taken off the plan and kept as sent.
    pub fn due(&mut self, now: u64) -> Vec<Planned> {
        let mut out = Vec::new();
        while let Some(entry) = self.planned.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let planned = entry.remove();
            self.sent.push(Sent {
                at: now,
                body: planned.body.clone(),
                word: planned.word,
                direct: planned.direct.is_some(),
                expect: planned.expect,
            });
            out.push(planned);
        }
        out
    }

    /// How many words of each kind were sent (and how many of them directly).
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        for s in &self.sent {
            *counts.entry(s.word.name()).or_default() += 1;
            if s.direct {
                *counts.entry("outside_direct").or_default() += 1;
            }
        }
        counts
    }
}
