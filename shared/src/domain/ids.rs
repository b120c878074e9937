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
}
