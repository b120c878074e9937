use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch. Every time in the domain is one of these,
/// read through the clock port by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn plus_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// An RFC 3339 time (`2026-03-01T09:00:00Z`, `2026-03-01T10:00:00.250+01:00`) as
    /// milliseconds since the epoch; a time before the epoch is the epoch (for a timer,
    /// both are long past). Only a date, only a time, or no offset is an error: a wait
    /// until a local time would depend on where it runs.
    pub fn parse_rfc3339(text: &str) -> Result<Timestamp, TimeError> {
        let parsed = chrono::DateTime::parse_from_rfc3339(text)
            .map_err(|e| TimeError { got: cut(text), why: e.to_string() })?;
        Ok(Timestamp(u64::try_from(parsed.timestamp_millis()).unwrap_or(0)))
    }
}

impl Timestamp {
    /// As RFC 3339 in UTC, to the millisecond: what `parse_rfc3339` reads back.
    pub fn to_rfc3339(self) -> String {
        let ms = i64::try_from(self.0).unwrap_or(i64::MAX);
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default()
    }
}

/// A text that is not an RFC 3339 time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{got:?} is not an RFC 3339 time such as 2026-03-01T09:00:00Z ({why})")]
pub struct TimeError {
    pub got: String,
    pub why: String,
}

/// At most 64 characters of what was given, for an error message.
fn cut(text: &str) -> String {
    text.chars().take(64).collect()
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

pub const ORDER_ID_MAX_LEN: usize = 64;

/// An order's id, also the task's key. Restricted to `[A-Za-z0-9_-]{1,64}` so it is
/// safe in idempotency keys, log lines and DynamoDB keys without escaping.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct OrderId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderIdError {
    #[error("order_id is empty")]
    Empty,
    #[error("order_id is {0} characters long; at most {ORDER_ID_MAX_LEN} are allowed")]
    TooLong(usize),
    #[error("order_id contains {0:?}; only ASCII letters, digits, '-' and '_' are allowed")]
    BadChar(char),
}

impl OrderId {
    pub fn parse(raw: &str) -> Result<OrderId, OrderIdError> {
        if raw.is_empty() {
            return Err(OrderIdError::Empty);
        }
        let len = raw.chars().count();
        if len > ORDER_ID_MAX_LEN {
            return Err(OrderIdError::TooLong(len));
        }
        if let Some(c) = raw.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
            return Err(OrderIdError::BadChar(c));
        }
        Ok(OrderId(raw.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for OrderId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        OrderId::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The value of LockedBy: proof that one claim owns the task until complete-by.
/// A fresh token per claim, so a reply to an older claim can never match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(pub uuid::Uuid);

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Sent with every remote call of one step (every retry, every attempt), so the
/// remote side can deduplicate. Derived, never stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IdempotencyKey(pub String);

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who sent a message to the orders queue: the principal part of SQS's `SenderId`
/// attribute, which SQS sets from the sender's credentials and a sender cannot forge.
/// For an IAM user `SenderId` is the user's unique id (`AIDA...`); for an assumed role it
/// is `AROA...:<session name>`, and the session name differs from one container or
/// session to the next, so only the part before the first `:` (the role's unique id)
/// names the same sender every time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sender(String);

impl Sender {
    /// The sender a `SenderId` names; `None` for an empty one (no sender known).
    pub fn from_sender_id(sender_id: &str) -> Option<Sender> {
        let principal = sender_id.split(':').next().unwrap_or_default().trim();
        (!principal.is_empty()).then(|| Sender(principal.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_id_rules() {
        assert!(OrderId::parse("ord-1_A").is_ok());
        assert_eq!(OrderId::parse(""), Err(OrderIdError::Empty));
        assert_eq!(OrderId::parse(&"a".repeat(65)), Err(OrderIdError::TooLong(65)));
        assert_eq!(OrderId::parse("a/b"), Err(OrderIdError::BadChar('/')));
        assert_eq!(OrderId::parse("é"), Err(OrderIdError::BadChar('é')));
        let e: Result<OrderId, _> = serde_json::from_str("\"a b\"");
        assert!(e.is_err());
    }

    #[test]
    fn a_sender_is_the_principal_of_its_sender_id() {
        let of = |id: &str| Sender::from_sender_id(id).map(|s| s.as_str().to_owned());
        // An assumed role: the session name varies per container, the role's id does not.
        assert_eq!(of("AROAEXAMPLEROLE:lambda-1"), of("AROAEXAMPLEROLE:lambda-2"));
        assert_eq!(of("AROAEXAMPLEROLE:lambda-1").as_deref(), Some("AROAEXAMPLEROLE"));
        assert_eq!(of("AIDAEXAMPLEUSER").as_deref(), Some("AIDAEXAMPLEUSER"));
        assert_eq!(of("123456789012").as_deref(), Some("123456789012"));
        assert_eq!(of(""), None);
        assert_eq!(of(":session"), None);
        assert_ne!(of("AROAONE:s"), of("AROATWO:s"));
    }

    #[test]
    fn rfc3339_times_parse_with_their_offsets() {
        let utc = Timestamp::parse_rfc3339("2026-03-01T09:00:00Z").unwrap();
        assert_eq!(utc, Timestamp(1_772_355_600_000));
        // The same instant written with an offset, lower case, and a fraction.
        assert_eq!(Timestamp::parse_rfc3339("2026-03-01T10:00:00+01:00"), Ok(utc));
        assert_eq!(Timestamp::parse_rfc3339("2026-03-01t04:30:00-04:30"), Ok(utc));
        assert_eq!(Timestamp::parse_rfc3339("2026-03-01T09:00:00.250Z"), Ok(utc.plus_ms(250)));
        assert_eq!(Timestamp::parse_rfc3339("1969-12-31T23:59:59Z"), Ok(Timestamp(0)), "before the epoch");
        for bad in ["2026-03-01", "09:00:00Z", "2026-03-01T09:00:00", "2026-02-30T09:00:00Z", "tomorrow", ""]
        {
            let e = Timestamp::parse_rfc3339(bad).unwrap_err();
            assert!(e.to_string().contains("is not an RFC 3339 time"), "{bad}: {e}");
        }
        assert_eq!(utc.plus_ms(250).to_rfc3339(), "2026-03-01T09:00:00.250Z");
        assert_eq!(Timestamp::parse_rfc3339(&Timestamp(1_234).to_rfc3339()), Ok(Timestamp(1_234)));
        let long = "x".repeat(1_000);
        assert!(Timestamp::parse_rfc3339(&long).unwrap_err().got.len() <= 64);
    }
}
