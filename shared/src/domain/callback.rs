//! Callback steps: the step's agent starts something and answers at once; the outside
//! finishes it later by presenting the step's callback token.
//!
//! A token is a capability, so it is built to be useless to anyone but its holder:
//! - `sas1.<order id>.<step>.<attempt>.<64 hex digits>`: the order, step and attempt it
//!   is bound to, then 256 bits from the operating system's generator (the `Random`
//!   port's `callback_secret`).
//! - The record keeps only the token's SHA-256 digest (`Awaiting::digest`), so whoever
//!   can read the state table (an operator, `tasks show`) cannot complete the step.
//! - It is dead once the step ends: the record's `callback` goes when the task leaves the
//!   attempt it was minted for, and a retry mints a new one.
//! - It is never shown whole: its `Display` and `Debug` end at the attempt
//!   (`CallbackToken::expose` is for the agent's request alone).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ids::{OrderId, Timestamp};

/// The shortest callback timeout and heartbeat interval.
pub const MIN_CALLBACK_MS: u64 = 1_000;
/// The least heartbeat floor (`heartbeat_floor_ms`).
pub const MIN_HEARTBEAT_FLOOR_MS: u64 = 1_000;

/// How close after the last written heartbeat another one is acknowledged without a write:
/// a tenth of `every` (the heartbeat interval, or the callback timeout of a step without
/// one), at least `MIN_HEARTBEAT_FLOOR_MS`. A party that beats far more often than it must
/// then costs at most one write per floor; the wait's due time allows for the beats left
/// unwritten (`Awaiting::due`).
pub fn heartbeat_floor_ms(every: u64) -> u64 {
    (every / 10).max(MIN_HEARTBEAT_FLOOR_MS)
}
/// The longest callback timeout: 366 days, as long as the longest timer.
pub const MAX_CALLBACK_MS: u64 = 366 * 24 * 60 * 60 * 1_000;
/// A token's prefix: its format's version.
const PREFIX: &str = "sas1";
const SECRET_BYTES: usize = 32;
/// The longest text a token can be (prefix, order id, two u32s, the secret, four dots).
pub const MAX_TOKEN_LEN: usize = PREFIX.len() + 64 + 10 + 10 + SECRET_BYTES * 2 + 4;

/// `{"timeout_ms": 604800000, "heartbeat_ms": 3600000}` on a step with an agent.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Callback {
    /// How long the outside has to complete the step, from its dispatch, in
    /// milliseconds: 1000 (1 s) to 31622400000 (366 days). Past it, the attempt has
    /// failed: retried with a new token, or given up by the step's failure budget.
    #[cfg_attr(feature = "schema", schemars(range(min = 1_000, max = 31_622_400_000u64)))]
    pub timeout_ms: u64,
    /// When set, the outside must send a heartbeat (or complete) at least this often, in
    /// milliseconds (1000 to `timeout_ms`); a missed heartbeat fails the attempt as the
    /// timeout does, once this and a floor (a tenth of it, at least 1 s) have passed since
    /// the last heartbeat written. A heartbeat within the floor of the last one written is
    /// acknowledged but not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1_000, max = 31_622_400_000u64)))]
    pub heartbeat_ms: Option<u64>,
}

/// 256 bits from a generator: the part of a token nobody can guess.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CallbackSecret(pub [u8; SECRET_BYTES]);

impl fmt::Debug for CallbackSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallbackSecret(…)")
    }
}

/// A callback token as handed to the outside. Its `Display` and `Debug` hide the secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallbackToken(String);

/// The parts of a token, as its text names them: only a match of its digest with the
/// record's proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    pub order_id: OrderId,
    pub step: u32,
    pub attempt: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("a callback token is sas1.<order id>.<step>.<attempt>.<64 hex digits>; this one {0}")]
    Malformed(&'static str),
}

impl CallbackToken {
    pub fn mint(order_id: &OrderId, step: u32, attempt: u32, secret: &CallbackSecret) -> CallbackToken {
        let mut text = format!("{PREFIX}.{order_id}.{step}.{attempt}.");
        text.push_str(&hex::encode(secret.0));
        CallbackToken(text)
    }

    /// A token as the outside sent it back; only its shape is checked here.
    pub fn parse(text: &str) -> Result<(CallbackToken, TokenClaims), TokenError> {
        if text.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed("is too long"));
        }
        let parts: Vec<&str> = text.trim().split('.').collect();
        let [prefix, order_id, step, attempt, secret] = parts.as_slice() else {
            return Err(TokenError::Malformed("does not have five dot-separated parts"));
        };
        if *prefix != PREFIX {
            return Err(TokenError::Malformed("does not start with sas1"));
        }
        let order_id =
            OrderId::parse(order_id).map_err(|_| TokenError::Malformed("has no valid order id"))?;
        let number = |s: &str| s.parse::<u32>().ok().filter(|_| s.bytes().all(|b| b.is_ascii_digit()));
        let (Some(step), Some(attempt)) = (number(step), number(attempt)) else {
            return Err(TokenError::Malformed("has no valid step and attempt numbers"));
        };
        if secret.len() != SECRET_BYTES * 2 || !secret.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(TokenError::Malformed("does not end in 64 lower-case hex digits"));
        }
        Ok((CallbackToken(text.trim().to_owned()), TokenClaims { order_id, step, attempt }))
    }

    /// What the record keeps: the SHA-256 of the whole token, in hex.
    pub fn digest(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes());
        hex::encode(d.as_ref())
    }

    /// The whole token, for the one place it must go: the agent's request.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The token up to its secret, and the secret's first four digits: enough to tell
    /// tokens apart in a log line, nothing to complete with.
    pub fn redacted(&self) -> String {
        match self.0.rsplit_once('.') {
            Some((head, secret)) => format!("{head}.{}…", secret.get(..4).unwrap_or_default()),
            None => "…".to_owned(),
        }
    }
}

impl fmt::Display for CallbackToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for CallbackToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallbackToken({})", self.redacted())
    }
}

/// A callback step's wait, kept in the record from its claim until the step ends: which
/// attempt's token completes it, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Awaiting {
    pub step: u32,
    pub attempt: u32,
    /// SHA-256 of the attempt's token, in hex.
    pub digest: String,
    /// The callback timeout: dispatch plus `timeout_ms`.
    pub timeout_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// The last heartbeat received, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Timestamp>,
    /// When the agent answered that it started the work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// Claimed at: the heartbeat interval counts from here until the first heartbeat.
    pub since: Timestamp,
}

impl Awaiting {
    /// When the attempt fails if nothing arrives: the timeout, or the next heartbeat due
    /// if that comes first. The heartbeat is due one interval and one floor after the last
    /// one written: a heartbeat acknowledged within the floor was not written, so it pushed
    /// nothing out, and a party that beats at least every interval has its next beat
    /// written (or again acknowledged) before then. Without the floor's slack, a party
    /// beating every interval would be lapsed after a beat that fell within the floor.
    pub fn due(&self) -> Timestamp {
        let beat = self.heartbeat_ms.map(|ms| {
            let slack = if crate::mutations::heartbeat_no_slack() { 0 } else { heartbeat_floor_ms(ms) };
            self.beat_from().plus_ms(ms + slack)
        });
        beat.map_or(self.timeout_at, |b| b.min(self.timeout_at))
    }

    /// The last heartbeat written, or the claim: the interval and the floor count from here.
    pub fn beat_from(&self) -> Timestamp {
        self.last_heartbeat.unwrap_or(self.since)
    }

    /// This wait's heartbeat floor: from its interval, or from its timeout when it has none.
    pub fn floor_ms(&self) -> u64 {
        heartbeat_floor_ms(self.heartbeat_ms.unwrap_or_else(|| self.timeout_at.millis_since(self.since)))
    }

    /// Whether a heartbeat at `now` is written: only once the floor has passed since the
    /// last one written (or the claim).
    pub fn writes_heartbeat(&self, now: Timestamp) -> bool {
        now >= self.beat_from().plus_ms(self.floor_ms()) || crate::mutations::heartbeat_every_write()
    }
}

/// What the outside says about a callback step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Done: `output` becomes the step's output, as an agent's answer would.
    Success { output: Option<serde_json::Value> },
    /// Refused: counts as the step's refusal (compensate or Error, as for an agent's).
    Failure { reason: String },
    /// Still working: push the heartbeat deadline out.
    Heartbeat,
}

impl Completion {
    pub fn as_str(&self) -> &'static str {
        match self {
            Completion::Success { .. } => "success",
            Completion::Failure { .. } => "failure",
            Completion::Heartbeat => "heartbeat",
        }
    }
}

/// Why a completion changed nothing. Each is told to whoever sent it (the CLI's exit and
/// message; the callback queue's dead-letter queue with this reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompletionRefused {
    #[error("{0}")]
    Malformed(#[from] TokenError),
    #[error("no order {0} is known")]
    NoSuchOrder(OrderId),
    #[error("the token is for step {step} attempt {attempt}, which has ended{}", now_at(.current))]
    Ended { step: u32, attempt: u32, current: Option<(u32, u32)> },
    #[error("the token does not match the one issued for step {step} attempt {attempt}")]
    Forged { step: u32, attempt: u32 },
    #[error("the callback of step {step} attempt {attempt} was due at {} and has failed", .due.to_rfc3339())]
    TimedOut { step: u32, attempt: u32, due: Timestamp },
}

fn now_at(current: &Option<(u32, u32)>) -> String {
    match current {
        Some((step, attempt)) => format!(" (the task waits on step {step} attempt {attempt})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(n: u8) -> CallbackSecret {
        CallbackSecret([n; SECRET_BYTES])
    }

    #[test]
    fn a_token_names_its_order_step_and_attempt_and_round_trips() {
        let id = OrderId::parse("ord-1").unwrap();
        let token = CallbackToken::mint(&id, 2, 7, &secret(0xab));
        let (parsed, claims) = CallbackToken::parse(token.expose()).unwrap();
        assert_eq!(parsed, token);
        assert_eq!(claims, TokenClaims { order_id: id.clone(), step: 2, attempt: 7 });
        assert_eq!(parsed.digest(), token.digest());
        assert_eq!(token.digest().len(), 64);
        assert_ne!(CallbackToken::mint(&id, 2, 7, &secret(1)).digest(), token.digest());
        assert!(token.expose().len() <= MAX_TOKEN_LEN);
    }

    #[test]
    fn a_token_is_never_shown_whole() {
        let token = CallbackToken::mint(&OrderId::parse("o").unwrap(), 0, 1, &secret(0xcd));
        for shown in [token.to_string(), format!("{token:?}"), format!("{:?}", secret(0xcd))] {
            assert!(!shown.contains("cdcdcdcdcd"), "{shown}");
        }
        assert_eq!(token.to_string(), "sas1.o.0.1.cdcd…");
    }

    #[test]
    fn malformed_tokens_are_refused_with_what_is_wrong() {
        let good = CallbackToken::mint(&OrderId::parse("o").unwrap(), 0, 1, &secret(1)).expose().to_owned();
        for bad in [
            "",
            "sas1.o.0.1",
            "sas2.o.0.1.0101010101010101010101010101010101010101010101010101010101010101",
            "sas1.o/x.0.1.0101010101010101010101010101010101010101010101010101010101010101",
            "sas1.o.-1.1.0101010101010101010101010101010101010101010101010101010101010101",
            "sas1.o.+1.1.0101010101010101010101010101010101010101010101010101010101010101",
            "sas1.o.0.1.0101",
            "sas1.o.0.1.0101010101010101010101010101010101010101010101010101010101010G0G",
            &good.to_uppercase(),
            &"x".repeat(10_000),
        ] {
            let e = CallbackToken::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("a callback token is sas1."), "{bad}: {e}");
        }
        assert!(CallbackToken::parse(&format!(" {good}\n")).is_ok(), "pasted with spaces");
    }

    #[test]
    fn an_attempt_is_due_at_its_timeout_or_its_next_heartbeat() {
        let mut w = Awaiting {
            step: 1,
            attempt: 1,
            digest: String::new(),
            timeout_at: Timestamp(10_000),
            heartbeat_ms: None,
            last_heartbeat: None,
            started_at: None,
            since: Timestamp(0),
        };
        assert_eq!(w.due(), Timestamp(10_000));
        w.heartbeat_ms = Some(3_000);
        assert_eq!(w.due(), Timestamp(4_000), "the interval and the floor's slack (1 s at least)");
        w.last_heartbeat = Some(Timestamp(8_000));
        assert_eq!(w.due(), Timestamp(10_000), "never past the timeout");
    }

    #[test]
    fn the_floor_is_a_tenth_of_the_interval_at_least_a_second() {
        assert_eq!(heartbeat_floor_ms(1_000), 1_000);
        assert_eq!(heartbeat_floor_ms(3_000), 1_000);
        assert_eq!(heartbeat_floor_ms(60_000), 6_000);
        assert_eq!(heartbeat_floor_ms(3_600_000), 360_000);
        let mut w = Awaiting {
            step: 1,
            attempt: 1,
            digest: String::new(),
            timeout_at: Timestamp(600_000),
            heartbeat_ms: Some(60_000),
            last_heartbeat: None,
            started_at: None,
            since: Timestamp(0),
        };
        assert_eq!((w.floor_ms(), w.due()), (6_000, Timestamp(66_000)));
        // Counted from the claim until a heartbeat is written, then from that one.
        assert!(!w.writes_heartbeat(Timestamp(5_999)));
        assert!(w.writes_heartbeat(Timestamp(6_000)));
        w.last_heartbeat = Some(Timestamp(50_000));
        assert!(!w.writes_heartbeat(Timestamp(55_999)));
        assert!(w.writes_heartbeat(Timestamp(56_000)));
        assert_eq!(w.due(), Timestamp(116_000));
        // Without an interval, the floor comes from the timeout.
        w.heartbeat_ms = None;
        assert_eq!((w.floor_ms(), w.due()), (60_000, Timestamp(600_000)));
    }
}
