//! How `dlq` prints messages: a table, or one JSON object each.

use super::list::DlqMessage;

impl DlqMessage {
    pub(super) fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a kept message serializes");
        v["first_seen"] = self.first_seen_ms.map(time).into();
        v
    }
}

/// RFC 3339, UTC, to the millisecond.
fn time(ms: i64) -> String {
    aws_sdk_sqs::primitives::DateTime::from_millis(ms)
        .fmt(aws_sdk_sqs::primitives::DateTimeFormat::DateTime)
        .unwrap_or_else(|_| ms.to_string())
}

/// `text` on one line, at most `max` characters (control characters shown as spaces).
fn preview(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
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
            preview(&k.body, 60)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_are_one_short_line() {
        assert_eq!(preview("a\nb\tc", 10), "a b c");
        assert_eq!(preview("abcdef", 3), "abc...");
        assert_eq!(preview("ééé", 2), "éé...");
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
