//! Where an order may ask for its status updates.
//!
//! `reply_to` is chosen by whoever sends the order, but the status updates are sent with
//! this deployment's roles, which may also send to its own queues. Taken as given it
//! would be a confused deputy: a `reply_to` naming the scheduler queue or a DLQ would
//! have status messages land there. So a `reply_to` must be an SQS queue URL, must not
//! name one of the deployment's own queues, and must name a queue on the allow-list
//! (the status queue plus the operator's extra queues). Submission checks it, and every
//! send checks it again, so a record written before a rule changed cannot bypass it.

use std::collections::BTreeSet;

use url::Url;

/// How a queue is named in IAM: region, account and name (its ARN without the partition).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId {
    pub region: String,
    pub account: String,
    pub name: String,
}

impl QueueId {
    /// An SQS queue ARN, `arn:<partition>:sqs:<region>:<account>:<name>`; wildcards refused.
    pub fn from_arn(arn: &str) -> Option<QueueId> {
        let mut parts = arn.split(':');
        let (Some("arn"), Some(partition), Some("sqs"), Some(region), Some(account), Some(name), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        (partition.starts_with("aws") && is_region(region) && is_account(account) && is_queue_name(name))
            .then(|| QueueId { region: region.into(), account: account.into(), name: name.into() })
    }

    /// Account and name from a queue URL's path (`/<account>/<name>`), whatever its host.
    /// Used for the deployment's own queues, which are refused in any form.
    pub fn account_and_name(url: &str) -> Option<(String, String)> {
        let url = Url::parse(url).ok()?;
        let mut segments = url.path_segments()?;
        let (Some(account), Some(name), None) = (segments.next(), segments.next(), segments.next()) else {
            return None;
        };
        (is_account(account) && is_queue_name(name)).then(|| (account.to_owned(), name.to_owned()))
    }
}

impl std::fmt::Display for QueueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sqs:{}:{}:{}", self.region, self.account, self.name)
    }
}

/// Why a `reply_to` is refused. The texts name the rule, never echo the value: they go
/// back to the sender and into the DLQ attribute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyToError {
    #[error("reply_to must be a queue URL")]
    Empty,
    #[error(
        "reply_to is a queue ARN; give the queue's URL instead (https://sqs.<region>.amazonaws.com/<account>/<name>)"
    )]
    Arn,
    #[error("reply_to is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)")]
    NotQueueUrl,
    #[error("reply_to names one of this deployment's own queues")]
    OwnQueue,
    #[error("reply_to names a queue that is not on this deployment's reply_to allow-list")]
    NotAllowed,
}

/// How `reply_to` addresses a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addressing {
    /// SQS queue URLs: AWS's regional (`sqs.<region>.amazonaws.com`), legacy
    /// (`<region>.queue.amazonaws.com`, `queue.amazonaws.com`) and FIPS
    /// (`sqs-fips.<region>.amazonaws.com`) forms, https only, and, for local runs, the
    /// form of the configured endpoint (`<endpoint>/<account>/<name>`, in `region`).
    Sqs { region: String, endpoint: Option<Url> },
    /// In-process runs (`sasctl dev`, the simulation, the handler tests) name queues.
    Names,
}

/// The rules a `reply_to` must pass; built once from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyToRules {
    addressing: Addressing,
    allowed: BTreeSet<QueueId>,
    /// Account and name of every queue of the deployment itself.
    own: BTreeSet<(String, String)>,
}

impl ReplyToRules {
    pub fn sqs(region: impl Into<String>, endpoint: Option<Url>) -> ReplyToRules {
        ReplyToRules {
            addressing: Addressing::Sqs { region: region.into(), endpoint },
            allowed: BTreeSet::new(),
            own: BTreeSet::new(),
        }
    }

    /// Queues named, not addressed: `allowed` may receive status, `own` never.
    pub fn names(allowed: &[&str], own: &[&str]) -> ReplyToRules {
        let id = |n: &&str| QueueId { region: String::new(), account: String::new(), name: (*n).to_owned() };
        ReplyToRules {
            addressing: Addressing::Names,
            allowed: allowed.iter().map(id).collect(),
            own: own.iter().map(|n| (String::new(), (*n).to_owned())).collect(),
        }
    }

    pub fn allow(mut self, queue: QueueId) -> ReplyToRules {
        self.allowed.insert(queue);
        self
    }

    pub fn own_queue(mut self, account: String, name: String) -> ReplyToRules {
        self.own.insert((account, name));
        self
    }

    pub fn is_own(&self, queue: &QueueId) -> bool {
        // A handful of queues: a scan, without building a key to look up.
        self.own.iter().any(|(account, name)| *account == queue.account && *name == queue.name)
    }

    pub fn allowed(&self) -> impl Iterator<Item = &QueueId> {
        self.allowed.iter()
    }

    /// The queue a `reply_to` addresses, if it is addressed the way these rules accept.
    pub fn parse(&self, reply_to: &str) -> Result<QueueId, ReplyToError> {
        let raw = reply_to.trim();
        if raw.is_empty() {
            return Err(ReplyToError::Empty);
        }
        if raw.len() != reply_to.len() || raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(ReplyToError::NotQueueUrl);
        }
        match &self.addressing {
            Addressing::Names => {
                Ok(QueueId { region: String::new(), account: String::new(), name: raw.to_owned() })
            }
            Addressing::Sqs { region, endpoint } => parse_sqs_url(raw, region, endpoint.as_ref()),
        }
    }

    /// [`check`](Self::check) without the queue it names: what the handlers ask before
    /// every status send, so in-process runs (named queues) answer without allocating.
    pub fn allows(&self, reply_to: &str) -> Result<(), ReplyToError> {
        match self.addressing {
            Addressing::Names if !reply_to.trim().is_empty() && reply_to.trim().len() == reply_to.len() => {
                if self.own.iter().any(|(_, name)| name == reply_to) {
                    Err(ReplyToError::OwnQueue)
                } else if self.allowed.iter().any(|q| q.name == reply_to) {
                    Ok(())
                } else {
                    self.check(reply_to).map(|_| ())
                }
            }
            _ => self.check(reply_to).map(|_| ()),
        }
    }

    /// Whether status may be sent to `reply_to`.
    pub fn check(&self, reply_to: &str) -> Result<QueueId, ReplyToError> {
        let queue = self.parse(reply_to)?;
        if self.is_own(&queue) {
            return Err(ReplyToError::OwnQueue);
        }
        if !self.allowed.contains(&queue) {
            return Err(ReplyToError::NotAllowed);
        }
        Ok(queue)
    }
}

fn parse_sqs_url(raw: &str, region: &str, endpoint: Option<&Url>) -> Result<QueueId, ReplyToError> {
    if raw.starts_with("arn:") {
        return Err(ReplyToError::Arn);
    }
    let url = Url::parse(raw).map_err(|_| ReplyToError::NotQueueUrl)?;
    // What is checked is what is sent: a URL that parsing would rewrite (dot segments,
    // a host in capitals, escapes) is not in its one written form.
    if url.as_str() != raw {
        return Err(ReplyToError::NotQueueUrl);
    }
    // A queue URL has none of these; userinfo in particular would be a way to smuggle
    // credentials through our logs.
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(ReplyToError::NotQueueUrl);
    }
    let (account, name) = QueueId::account_and_name(raw).ok_or(ReplyToError::NotQueueUrl)?;
    let host = url.host_str().ok_or(ReplyToError::NotQueueUrl)?;
    let same_origin = |e: &Url| {
        e.scheme() == url.scheme()
            && e.host_str() == Some(host)
            && e.port_or_known_default() == url.port_or_known_default()
    };
    let queue_region = if endpoint.is_some_and(same_origin) {
        region.to_owned()
    } else if url.scheme() == "https" && url.port().is_none() {
        aws_host_region(host).ok_or(ReplyToError::NotQueueUrl)?
    } else {
        return Err(ReplyToError::NotQueueUrl);
    };
    Ok(QueueId { region: queue_region, account, name })
}

/// The region of an SQS endpoint host in one of AWS's forms.
fn aws_host_region(host: &str) -> Option<String> {
    let rest = host.strip_suffix(".amazonaws.com").or_else(|| host.strip_suffix(".amazonaws.com.cn"))?;
    if rest == "queue" {
        return Some("us-east-1".to_owned());
    }
    let region = rest
        .strip_prefix("sqs.")
        .or_else(|| rest.strip_prefix("sqs-fips."))
        .or_else(|| rest.strip_suffix(".queue"))?;
    is_region(region).then(|| region.to_owned())
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`: letters, dashes, a number.
fn is_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && parts[..parts.len() - 1].iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts[parts.len() - 1].chars().all(|c| c.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

fn is_account(s: &str) -> bool {
    s.len() == 12 && s.chars().all(|c| c.is_ascii_digit())
}

/// SQS's rule: 1 to 80 of `[A-Za-z0-9_-]`, a FIFO queue's name ending in `.fifo`.
fn is_queue_name(s: &str) -> bool {
    let base = s.strip_suffix(".fifo").unwrap_or(s);
    !base.is_empty()
        && s.len() <= 80
        && base.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-status";

    fn rules() -> ReplyToRules {
        ReplyToRules::sqs("us-east-1", Some(Url::parse("http://127.0.0.1:5000").unwrap()))
            .allow(QueueId::from_arn("arn:aws:sqs:us-east-1:123456789012:sas-status").unwrap())
            .allow(QueueId::from_arn("arn:aws:sqs:eu-west-1:123456789012:app-status.fifo").unwrap())
            .own_queue("123456789012".into(), "sas-scheduler".into())
            .own_queue("123456789012".into(), "sas-orders-dlq".into())
    }

    #[test]
    fn every_sqs_url_form_names_the_same_queue() {
        let r = rules();
        let want =
            QueueId { region: "us-east-1".into(), account: "123456789012".into(), name: "sas-status".into() };
        for url in [
            STATUS,
            "https://us-east-1.queue.amazonaws.com/123456789012/sas-status",
            "https://queue.amazonaws.com/123456789012/sas-status",
            "https://sqs-fips.us-east-1.amazonaws.com/123456789012/sas-status",
            "http://127.0.0.1:5000/123456789012/sas-status",
        ] {
            assert_eq!(r.check(url), Ok(want.clone()), "{url}");
        }
        assert!(r.check("https://sqs.eu-west-1.amazonaws.com/123456789012/app-status.fifo").is_ok());
    }

    #[test]
    fn refusals_name_the_rule() {
        let r = rules();
        let cases = [
            ("", ReplyToError::Empty),
            (" ", ReplyToError::Empty),
            ("not a queue url", ReplyToError::NotQueueUrl),
            ("arn:aws:sqs:us-east-1:123456789012:sas-status", ReplyToError::Arn),
            ("http://sqs.us-east-1.amazonaws.com/123456789012/sas-status", ReplyToError::NotQueueUrl),
            (
                "https://sqs.us-east-1.amazonaws.com.evil.example/123456789012/sas-status",
                ReplyToError::NotQueueUrl,
            ),
            ("https://evil.example/123456789012/sas-status", ReplyToError::NotQueueUrl),
            ("https://sqs.us-east-1.amazonaws.com:8443/123456789012/sas-status", ReplyToError::NotQueueUrl),
            (
                "https://user:pw@sqs.us-east-1.amazonaws.com/123456789012/sas-status",
                ReplyToError::NotQueueUrl,
            ),
            (
                "https://sqs.us-east-1.amazonaws.com/123456789012/sas-status?Action=x",
                ReplyToError::NotQueueUrl,
            ),
            ("https://sqs.us-east-1.amazonaws.com/123456789012/sas-status/", ReplyToError::NotQueueUrl),
            ("https://sqs.us-east-1.amazonaws.com/1234/sas-status", ReplyToError::NotQueueUrl),
            ("https://sqs.us-east-1.amazonaws.com/123456789012/sas status", ReplyToError::NotQueueUrl),
            ("http://127.0.0.1:5001/123456789012/sas-status", ReplyToError::NotQueueUrl),
            // Only the one written form: what is checked must be what is sent.
            ("https://SQS.us-east-1.amazonaws.com:443/123456789012/sas-status", ReplyToError::NotQueueUrl),
            ("https://sqs.us-east-1.amazonaws.com/x/../123456789012/sas-status", ReplyToError::NotQueueUrl),
            ("https://sqs.us-east-1.amazonaws.com/123456789012/sas-scheduler", ReplyToError::OwnQueue),
            ("https://sqs.eu-west-1.amazonaws.com/123456789012/sas-orders-dlq", ReplyToError::OwnQueue),
            ("http://127.0.0.1:5000/123456789012/sas-scheduler", ReplyToError::OwnQueue),
            ("https://sqs.us-west-2.amazonaws.com/123456789012/sas-status", ReplyToError::NotAllowed),
            ("https://sqs.us-east-1.amazonaws.com/999999999999/sas-status", ReplyToError::NotAllowed),
        ];
        for (raw, want) in cases {
            assert_eq!(r.check(raw), Err(want.clone()), "{raw:?}");
            assert!(!r.check(raw).unwrap_err().to_string().contains("evil"), "no echo of the value");
        }
    }

    #[test]
    fn arns_parse_without_wildcards() {
        assert_eq!(
            QueueId::from_arn("arn:aws-us-gov:sqs:us-gov-west-1:123456789012:q"),
            Some(QueueId {
                region: "us-gov-west-1".into(),
                account: "123456789012".into(),
                name: "q".into()
            })
        );
        for bad in [
            "arn:aws:sqs:us-east-1:123456789012:*",
            "arn:aws:sqs:*:123456789012:q",
            "arn:aws:sqs:us-east-1:*:q",
            "arn:aws:sns:us-east-1:123456789012:q",
            "arn:aws:sqs:us-east-1:123456789012:q:extra",
            "arn:aws:sqs:us-east-1:123456789012:q?",
            "https://sqs.us-east-1.amazonaws.com/123456789012/q",
        ] {
            assert_eq!(QueueId::from_arn(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_addressing_for_in_process_runs() {
        let r = ReplyToRules::names(&["status"], &["scheduler", "orders-dlq"]);
        assert!(r.check("status").is_ok());
        assert_eq!(r.check("scheduler"), Err(ReplyToError::OwnQueue));
        for name in ["status", "scheduler", "elsewhere", "", " status", "stat\nus"] {
            assert_eq!(r.allows(name), r.check(name).map(|_| ()), "{name:?}");
        }
        assert_eq!(r.check("elsewhere"), Err(ReplyToError::NotAllowed));
        assert_eq!(r.check(" "), Err(ReplyToError::Empty));
    }
}
