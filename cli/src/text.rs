//! How sasctl writes what it prints, the same in every command: times, text cut to one
//! line, progress bars, message bodies with their callback tokens redacted.

/// RFC 3339 (ISO 8601), UTC, to the millisecond, always three digits of it: times one
/// above the other line up (`20.500Z`, not `20.5Z`).
pub fn iso_ms(ms: i64) -> String {
    let whole_seconds = aws_sdk_sqs::primitives::DateTime::from_secs(ms.div_euclid(1_000))
        .fmt(aws_sdk_sqs::primitives::DateTimeFormat::DateTime);
    match whole_seconds.as_deref().map(|t| t.strip_suffix('Z')) {
        Ok(Some(seconds)) => format!("{seconds}.{:03}Z", ms.rem_euclid(1_000)),
        _ => format!("{ms}ms"),
    }
}

/// `text` on one line of at most `max` characters: control characters as spaces, each run
/// of white space as one space, `...` where it was cut.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let flat = flat.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
    }
}

/// A progress bar of `len` steps: time taken, the bar, `pos/len`, then `unit` (what is
/// counted, e.g. "moved"; may be empty) and the bar's message.
pub fn progress_bar(len: u64, unit: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    let unit = if unit.is_empty() { String::new() } else { format!("{unit}  ") };
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {unit}{{msg}}");
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A message body as sasctl prints it: a callback message's `token` (a capability that
/// completes its step) shown redacted, as the functions log it (its order, step, attempt
/// and the secret's first four digits; `…` for a value that is no token at all). Any other
/// body as it is.
pub fn redact_token(body: &str) -> String {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_str::<serde_json::Value>(body) else {
        return body.to_owned();
    };
    let Some(token) = fields.get("token") else { return body.to_owned() };
    let shown = match token.as_str().map(sas::domain::CallbackToken::parse) {
        Some(Ok((token, _))) => token.redacted(),
        _ => "…".to_owned(),
    };
    fields.insert("token".to_owned(), shown.into());
    serde_json::Value::Object(fields).to_string()
}

/// The order a callback message's token names, when it is one.
pub fn token_order(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let (_, claims) = sas::domain::CallbackToken::parse(v.get("token")?.as_str()?).ok()?;
    Some(claims.order_id.to_string())
}

/// `rows` as a table: each column padded to its widest cell, the last one unpadded, each
/// line after `indent` and without trailing spaces.
pub fn columns<R: AsRef<[String]>>(rows: &[R], indent: &str) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, |r| r.as_ref().len())];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let row = row.as_ref();
        let mut line = indent.to_owned();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_tokens_are_never_printed_whole() {
        let secret = "ab".repeat(32);
        let body =
            format!(r#"{{"token":"sas1.o-1.0.2.{secret}","outcome":"success","output":{{"ok":true}}}}"#);
        let shown = redact_token(&body);
        assert!(!shown.contains(&secret), "{shown}");
        assert!(shown.contains(r#""token":"sas1.o-1.0.2.abab…""#), "{shown}");
        assert!(shown.contains(r#""output":{"ok":true}"#), "{shown}");
        assert_eq!(token_order(&body).as_deref(), Some("o-1"));
        // Not a token, and not a callback message: as they are, except the no-token.
        let shown: serde_json::Value =
            serde_json::from_str(&redact_token(r#"{"token":"hunter2","outcome":"success"}"#)).unwrap();
        assert_eq!(shown, serde_json::json!({"token": "…", "outcome": "success"}));
        for other in ["{", r#"{"order_id":"o-1"}"#, "[1]"] {
            assert_eq!(redact_token(other), other);
        }
    }

    #[test]
    fn text_is_cut_to_one_short_line() {
        assert_eq!(one_line("a\nb\tc", 10), "a b c");
        assert_eq!(one_line("  a  \r\n b ", 10), "a b");
        assert_eq!(one_line("abcdef", 3), "abc...");
        assert_eq!(one_line("ééé", 2), "éé...");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(iso_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn times_keep_their_width_whatever_the_milliseconds() {
        assert_eq!(iso_ms(1_700_000_000_500), "2023-11-14T22:13:20.500Z");
        assert_eq!(iso_ms(1_700_000_000_020), "2023-11-14T22:13:20.020Z");
        assert_eq!(iso_ms(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
        assert_eq!(iso_ms(0), "1970-01-01T00:00:00.000Z");
    }
}
