//! How `dlq` prints messages: a table, or one JSON object each.

use super::message::DlqMessage;
use crate::text::{iso_ms as time, one_line as preview, redact_token};

impl DlqMessage {
    /// The message as printed: a callback message's token redacted (the callback DLQ's
    /// bodies carry tokens, which complete steps; a redrive moves them whole).
    pub(crate) fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a kept message serializes");
        v["first_seen"] = self.first_seen_ms.map(time).into();
        v["body"] = redact_token(&self.body).into();
        v
    }
}

pub(super) fn print_messages(kept: &[DlqMessage], json: bool, extra: Option<(&str, serde_json::Value)>) {
    if json {
        for k in kept {
            let mut v = k.json();
            if let Some((key, value)) = &extra {
                v[*key] = value.clone();
            }
            println!("{v}");
        }
        return;
    }
    if kept.is_empty() {
        return;
    }
    println!("{:<36}  {:<24}  {:>8}  {:<40}  BODY", "MESSAGE ID", "FIRST SEEN", "RECEIVES", "REASON");
    for k in kept {
        println!(
            "{:<36}  {:<24}  {:>8}  {:<40}  {}",
            k.message_id,
            k.first_seen_ms.map(time).unwrap_or_else(|| "-".into()),
            k.receive_count,
            k.reason.as_deref().map(|r| preview(r, 40)).unwrap_or_else(|| "-".into()),
            preview(&redact_token(&k.body), 60)
        );
    }
}
