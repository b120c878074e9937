//! An agent's optional auth: a header sent on every call of that agent, whose value is
//! read from AWS Parameter Store or Secrets Manager. The definition file names where the
//! value lives ([`SecretSource`]), never the value; the value itself only ever exists as a
//! [`SecretValue`], which no `Debug` or log line can print.

use std::fmt;

/// The longest name or ARN a source may give: the `Name` of SSM's GetParameter and the
/// `SecretId` of Secrets Manager's GetSecretValue both allow 2048 characters.
pub const MAX_SECRET_ID_LEN: usize = 2_048;
/// Header names have no length limit in HTTP; this one only catches a value pasted into
/// the wrong field.
pub const MAX_HEADER_NAME_LEN: usize = 128;
pub const MAX_PREFIX_LEN: usize = 64;

/// How long an agent keeps a value it read before reading it again: a rotated secret
/// reaches every warm container within this time without a call being refused first (a
/// refused one is read again at once). Per container and agent, one read per 5 minutes is
/// far inside Parameter Store's and Secrets Manager's request quotas.
pub const SECRET_TTL_MS: u64 = 5 * 60 * 1_000;
/// When reading an expired value again fails (the store throttles or cannot be reached),
/// the agent keeps the value it had and tries again this much later: an outage of the
/// store does not fail calls that the value still opens. A value the service refused is
/// never kept this way.
pub const SECRET_RETRY_MS: u64 = 30 * 1_000;

/// Headers that sas or its HTTP client sets on every call: an auth header of the same name
/// would replace or duplicate them (a second `Content-Length` or `Host` makes the request
/// ambiguous to the server).
pub const RESERVED_HEADERS: [&str; 6] =
    ["Idempotency-Key", "Content-Type", "Content-Length", "Host", "Transfer-Encoding", "Connection"];

/// Where an auth header's value lives, as the definition file writes it:
/// `ssm:NAME` or `secretsmanager:NAME-or-ARN`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretSource {
    /// A Parameter Store parameter, by name (`/path/to/param`) or ARN; a SecureString is
    /// read decrypted.
    Ssm(String),
    /// A Secrets Manager secret, by name or ARN; its `SecretString` is the value.
    SecretsManager(String),
}

/// Why a source does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("must be ssm:NAME (Parameter Store) or secretsmanager:NAME-or-ARN (Secrets Manager)")]
    UnknownStore,
    #[error("the name after the store must be 1 to {MAX_SECRET_ID_LEN} printable characters, no spaces")]
    BadName,
}

impl SecretSource {
    pub fn parse(text: &str) -> Result<SecretSource, SourceError> {
        let (store, name) = text.split_once(':').ok_or(SourceError::UnknownStore)?;
        // Names and ARNs of both stores are printable ASCII without spaces; anything else
        // is a typo or a pasted value, and would only fail later, at the first call.
        let name_ok =
            !name.is_empty() && name.len() <= MAX_SECRET_ID_LEN && name.bytes().all(|b| b.is_ascii_graphic());
        match store {
            "ssm" if name_ok => Ok(SecretSource::Ssm(name.to_owned())),
            "secretsmanager" if name_ok => Ok(SecretSource::SecretsManager(name.to_owned())),
            "ssm" | "secretsmanager" => Err(SourceError::BadName),
            _ => Err(SourceError::UnknownStore),
        }
    }
}

impl SecretSource {
    /// The name or ARN the store is asked for.
    pub fn id(&self) -> &str {
        match self {
            SecretSource::Ssm(id) | SecretSource::SecretsManager(id) => id,
        }
    }

    /// The region an ARN names (`arn:aws:ssm:eu-west-1:123456789012:parameter/x` is in
    /// eu-west-1): the secret lives there, whatever region the agent runs in. `None` for a
    /// plain name (the agent's own region) or an ARN without a region.
    pub fn region(&self) -> Option<&str> {
        let mut parts = self.id().strip_prefix("arn:")?.splitn(5, ':');
        let (_partition, _service, region, _rest) =
            (parts.next()?, parts.next()?, parts.next()?, parts.nth(1)?);
        let region_ok = !region.is_empty()
            && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        region_ok.then_some(region)
    }
}

impl SecretSource {
    /// The secret as the store knows it, however it is written: a name or an ARN of the
    /// same parameter or secret give the same key. Errs towards one secret: a Parameter
    /// Store name with and without its leading `/` are one key (their ARNs are the same),
    /// and so are a Secrets Manager name and the name with AWS's `-XXXXXX` suffix.
    pub fn identity(&self) -> (&'static str, String) {
        let after = |id: &str, marker: &str| -> Option<String> {
            id.strip_prefix("arn:").and_then(|rest| rest.split_once(marker)).map(|(_, name)| name.to_owned())
        };
        match self {
            SecretSource::Ssm(id) => {
                let name = after(id, ":parameter/").unwrap_or_else(|| id.clone());
                ("ssm", name.trim_start_matches('/').to_owned())
            }
            SecretSource::SecretsManager(id) => {
                let name = after(id, ":secret:").unwrap_or_else(|| id.clone());
                let suffixed = name.len() > 7
                    && name.as_bytes()[name.len() - 7] == b'-'
                    && name[name.len() - 6..].bytes().all(|b| b.is_ascii_alphanumeric());
                let name = if suffixed { name[..name.len() - 7].to_owned() } else { name };
                ("secretsmanager", name)
            }
        }
    }
}

/// As the definition file writes it: it names the secret, it is not the secret, so it may
/// be logged.
impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Ssm(name) => write!(f, "ssm:{name}"),
            SecretSource::SecretsManager(id) => write!(f, "secretsmanager:{id}"),
        }
    }
}

/// A header name as HTTP allows it: a token (RFC 9110 5.1, 5.6.2).
pub fn header_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header sas sets itself (names are case-insensitive).
pub fn header_reserved(name: &str) -> bool {
    RESERVED_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// A prefix that can start a header value: visible ASCII and spaces (`Bearer `), nothing a
/// header value may not hold (line breaks, control characters).
pub fn prefix_ok(prefix: &str) -> bool {
    prefix.len() <= MAX_PREFIX_LEN && prefix.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}

/// A secret's value. It has no `Display`, and its `Debug` prints `***`, so it cannot reach
/// a log line, an error or a reply's reason by accident; [`SecretValue::expose`] is the
/// one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> SecretValue {
        SecretValue(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_written_by_name_or_by_arn_is_one_secret() {
        let id = |text: &str| SecretSource::parse(text).unwrap().identity();
        let pay = id("ssm:/sas/pay");
        assert_eq!(id("ssm:sas/pay"), pay);
        assert_eq!(id("ssm:arn:aws:ssm:eu-west-1:123456789012:parameter/sas/pay"), pay);
        assert_ne!(id("ssm:/sas/payroll"), pay);
        let key = id("secretsmanager:inventory-key");
        assert_eq!(
            id("secretsmanager:arn:aws:secretsmanager:us-east-1:123456789012:secret:inventory-key-Ab12Cd"),
            key
        );
        assert_eq!(
            id("secretsmanager:arn:aws:secretsmanager:us-east-1:123456789012:secret:inventory-key"),
            key
        );
        assert_eq!(id("secretsmanager:inventory-key-Ab12Cd"), key);
        assert_ne!(id("secretsmanager:inventory"), key);
        assert_ne!(id("ssm:inventory-key"), key, "another store, another secret");
    }

    #[test]
    fn sources_name_their_store() {
        assert_eq!(
            SecretSource::parse("ssm:/sas/payment/token"),
            Ok(SecretSource::Ssm("/sas/payment/token".into()))
        );
        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:pay-token-AbCdEf";
        assert_eq!(
            SecretSource::parse(&format!("secretsmanager:{arn}")),
            Ok(SecretSource::SecretsManager(arn.into()))
        );
        assert_eq!(
            SecretSource::parse(&format!("secretsmanager:{arn}")).unwrap().to_string(),
            format!("secretsmanager:{arn}")
        );
        for unknown in ["", "/sas/token", "vault:kv/token", "SSM:/x", "ssm/x"] {
            assert_eq!(SecretSource::parse(unknown), Err(SourceError::UnknownStore), "{unknown:?}");
        }
        let long = format!("ssm:/{}", "a".repeat(MAX_SECRET_ID_LEN));
        for bad in
            ["ssm:", "secretsmanager:", "ssm:/with space", "ssm:/tab\t", "secretsmanager:caf\u{e9}", &long]
        {
            assert_eq!(SecretSource::parse(bad), Err(SourceError::BadName), "{bad:?}");
        }
        assert!(SecretSource::parse(&format!("ssm:/{}", "a".repeat(MAX_SECRET_ID_LEN - 1))).is_ok());
    }

    /// Issue 24, finding 6: a secret named by ARN is read in the ARN's region.
    #[test]
    fn an_arn_names_the_region_its_secret_lives_in() {
        let region = |text: &str| SecretSource::parse(text).unwrap().region().map(str::to_owned);
        assert_eq!(
            region("secretsmanager:arn:aws:secretsmanager:eu-west-1:123456789012:secret:pay-AbCdEf")
                .as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            region("ssm:arn:aws-cn:ssm:cn-north-1:123456789012:parameter/sas/pay").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(
            region("ssm:arn:aws-us-gov:ssm:us-gov-west-1:123456789012:parameter/a:b").as_deref(),
            Some("us-gov-west-1")
        );
        // A name, or an ARN without (or with a malformed) region: the agent's own region.
        for own in [
            "ssm:/sas/pay",
            "secretsmanager:pay-token",
            "secretsmanager:arn:aws:secretsmanager::123456789012:secret:x",
            "secretsmanager:arn:aws:secretsmanager:EU-WEST-1:123456789012:secret:x",
            "ssm:arn:aws:ssm:eu-west-1",
            "ssm:arn:aws:ssm:eu-west-1:123456789012",
        ] {
            assert_eq!(region(own), None, "{own}");
        }
    }

    #[test]
    fn header_names_are_tokens_and_not_ours() {
        for ok in ["Authorization", "X-Api-Key", "x-api-key", "Ocp-Apim-Subscription-Key"] {
            assert!(header_name_ok(ok) && !header_reserved(ok), "{ok}");
        }
        for bad in ["", "X Api Key", "X-Key:", "Authorization\r\n", "Schl\u{fc}ssel", &"a".repeat(129)] {
            assert!(!header_name_ok(bad), "{bad:?}");
        }
        for ours in ["Idempotency-Key", "idempotency-key", "CONTENT-TYPE", "Host", "content-length"] {
            assert!(header_name_ok(ours) && header_reserved(ours), "{ours}");
        }
    }

    #[test]
    fn prefixes_fit_in_a_header_value() {
        assert!(prefix_ok("Bearer ") && prefix_ok("") && prefix_ok("Token token="));
        assert!(!prefix_ok("Bearer\r\n") && !prefix_ok("\tBearer") && !prefix_ok(&"x".repeat(65)));
    }

    #[test]
    fn a_value_never_shows_in_debug() {
        let value = SecretValue::new("s3cr3t-t0ken".into());
        assert_eq!(format!("{value:?}"), "***");
        assert_eq!(format!("{:?}", Some(&value)), "Some(***)");
        assert_eq!(value.expose(), "s3cr3t-t0ken");
    }
}
