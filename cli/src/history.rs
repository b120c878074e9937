//! Where an order's whole history is, when its record keeps only the latest entries
//! (`domain::timeline::TIMELINE_LEN`): the functions' own log lines, one JSON object per
//! event with the order id in its span. A deployed stack's are in CloudWatch Logs (one
//! log group per function); a local run's (`sasctl up`) go to a file per prefix,
//! [`path`], which the console reads.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;

/// The file of this process's local run, once `up` has opened it.
static FILE: OnceLock<Mutex<Current>> = OnceLock::new();

/// The file being written, and how big it is.
struct Current {
    file: std::fs::File,
    path: PathBuf,
    bytes: u64,
}

/// Past this size the file becomes `<path>.old` (replacing the one before) and a new one
/// is begun: a long local run keeps between one and two of these of its latest history.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Turns the file's log layer on (`layer`'s reload handle, its subscriber's type erased).
static TURN_ON: OnceLock<Box<dyn Fn() + Send + Sync>> = OnceLock::new();

/// The most history lines a page shows: the newest are kept.
pub const MAX_LINES: usize = 500;

/// The history file of the local run under `prefix`.
pub fn path(prefix: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sasctl-up-{prefix}.log"))
}

/// The file of the history before `path`'s, once it grew past [`MAX_FILE_BYTES`].
fn older(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".old");
    PathBuf::from(name)
}

/// Opens `path` to append, readable by its owner only, refusing a symbolic link there
/// (the temporary directory is shared).
fn open(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// From here on, the functions' log lines of this process go to `prefix`'s file
/// (appended: a second `up` on the same prefix carries the history on).
pub fn start(prefix: &str) -> std::io::Result<PathBuf> {
    let path = path(prefix);
    let file = open(&path)?;
    let bytes = file.metadata()?.len();
    let _ = FILE.set(Mutex::new(Current { file, path: path.clone(), bytes }));
    if let Some(turn_on) = TURN_ON.get() {
        turn_on();
    }
    Ok(path)
}

/// The log layer that writes the file: the functions' (crate `sas`) events at INFO and
/// above, as the Lambda functions log them (JSON, with the current span and the span
/// list). Off until [`start`], through a filter that tells tracing so: every other
/// command (a `dev` run above all) logs nothing and pays nothing for it.
pub fn layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let (filter, handle) = tracing_subscriber::reload::Layer::new(Targets::new());
    let _ = TURN_ON.set(Box::new(move || {
        // `sas::`, not `sas`: a target is matched as a prefix, and `sasctl` starts with `sas`.
        let _ = handle.reload(Targets::new().with_target("sas::", tracing::Level::INFO));
    }));
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_target(false)
        .with_writer(ToFile)
        .with_filter(filter)
}

struct ToFile;

impl Write for ToFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match FILE.get() {
            Some(current) => {
                let mut c = current.lock().unwrap_or_else(|p| p.into_inner());
                if c.bytes > MAX_FILE_BYTES {
                    std::fs::rename(&c.path, older(&c.path))?;
                    c.file = open(&c.path)?;
                    c.bytes = 0;
                }
                let n = c.file.write(buf)?;
                c.bytes += n as u64;
                Ok(n)
            }
            None => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for ToFile {
    type Writer = ToFile;
    fn make_writer(&'a self) -> ToFile {
        ToFile
    }
}

/// The lines of `order_id` in the file at `path` (and the one before it, `.old`), oldest
/// first, the newest [`MAX_LINES`] of them; `None` when there is no such file.
pub fn lines_of(path: &std::path::Path, order_id: &str) -> Option<Vec<Value>> {
    let file = std::fs::File::open(path).ok()?;
    let before = std::fs::File::open(older(path)).ok();
    let needle = format!("\"order_id\":{}", Value::from(order_id));
    let mut kept = std::collections::VecDeque::new();
    let lines = before
        .into_iter()
        .chain([file])
        .flat_map(|f| std::io::BufReader::new(f).lines().map_while(Result::ok));
    for line in lines {
        if !line.contains(&needle) {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
        if order_of(&v) == Some(order_id) {
            if kept.len() == MAX_LINES {
                kept.pop_front();
            }
            kept.push_back(v);
        }
    }
    Some(kept.into())
}

/// A deployed stack's log groups, one per function (template.yaml names them).
pub fn log_groups(prefix: &str) -> Vec<String> {
    ["submission", "scheduler", "agent", "supervisor"]
        .iter()
        .map(|f| format!("/aws/lambda/{prefix}-{f}"))
        .collect()
}

/// Pages of one log group read at most per order: the filter keeps them to the order's
/// lines, so more than this is an order of a very long life. FilterLogEvents answers
/// oldest first, so past it an order's latest lines in that group are not read.
const MAX_PAGES: usize = 20;

/// The lines of `order_id` in a deployed stack's log groups (CloudWatch Logs
/// FilterLogEvents, the order id as the filter's term, then only the lines that are
/// about it), oldest first, the newest [`MAX_LINES`]. A group that does not exist
/// (a function never run) has none.
pub async fn from_cloudwatch(
    sdk: &aws_config::SdkConfig,
    prefix: &str,
    order_id: &str,
) -> Result<Vec<Value>, String> {
    let region = sdk.region().map(|r| r.as_ref().to_owned()).ok_or("no AWS region configured")?;
    let endpoint = std::env::var("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| sdk.endpoint_url().map(str::to_owned))
        .unwrap_or_else(|| format!("https://logs.{region}.amazonaws.com"));
    let url = format!("{}/", endpoint.trim_end_matches('/'));
    let client = sas::adapters::http_remote::client_builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut kept: Vec<Value> = Vec::new();
    for group in log_groups(prefix) {
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut ask =
                serde_json::json!({"logGroupName": group, "filterPattern": format!("\"{order_id}\"")});
            if let Some(t) = &token {
                ask["nextToken"] = Value::from(t.as_str());
            }
            let body = ask.to_string();
            let target = "Logs_20140328.FilterLogEvents";
            let headers =
                sas::adapters::aws::secrets::signed_json_headers(sdk, "logs", &region, &url, target, &body)
                    .await?;
            let mut request = client.post(&url).body(body);
            for (name, value) in &headers {
                request = request.header(name, value);
            }
            let response =
                request.send().await.map_err(|e| format!("CloudWatch Logs at {url}: {}", e.without_url()))?;
            let status = response.status();
            let answer: Value = response.json().await.unwrap_or_default();
            if !status.is_success() {
                let kind = answer["__type"].as_str().unwrap_or_default();
                if kind.ends_with("ResourceNotFoundException") {
                    break;
                }
                return Err(format!("CloudWatch Logs FilterLogEvents on {group}: HTTP {status} {kind}"));
            }
            for event in answer["events"].as_array().into_iter().flatten() {
                let Some(line) =
                    event["message"].as_str().and_then(|m| serde_json::from_str::<Value>(m.trim()).ok())
                else {
                    continue;
                };
                if order_of(&line) == Some(order_id) {
                    kept.push(line);
                }
            }
            token = answer["nextToken"].as_str().map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
    }
    kept.sort_by(|a, b| a["timestamp"].as_str().cmp(&b["timestamp"].as_str()));
    let drop = kept.len().saturating_sub(MAX_LINES);
    Ok(kept.split_off(drop))
}

/// The order a line is about: its own field's (a hand-over inside a reply's span names
/// the next order so), else its current span's, else an outer span's.
fn order_of(line: &Value) -> Option<&str> {
    line["fields"]["order_id"]
        .as_str()
        .or_else(|| line["span"]["order_id"].as_str())
        .or_else(|| line["spans"].as_array()?.iter().rev().find_map(|s| s["order_id"].as_str()))
}

/// A line as the page shows it: when, which function, what, and its other fields.
pub fn describe(line: &Value) -> (String, String, String) {
    let at = line["timestamp"].as_str().unwrap_or("").to_owned();
    let function = line["spans"]
        .as_array()
        .and_then(|s| s.first())
        .and_then(|s| s["name"].as_str())
        .or_else(|| line["span"]["name"].as_str())
        .unwrap_or("")
        .to_owned();
    let fields = line["fields"].as_object();
    let message = fields.and_then(|f| f.get("message")).and_then(Value::as_str).unwrap_or("");
    let rest: Vec<String> = fields
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "message")
        .map(|(k, v)| match v.as_str() {
            Some(s) => format!("{k}={s}"),
            None => format!("{k}={v}"),
        })
        .collect();
    let what = if rest.is_empty() { message.to_owned() } else { format!("{message} ({})", rest.join(", ")) };
    (at, function, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orders_lines_are_found_by_their_span_and_only_theirs() {
        let dir = std::env::temp_dir().join(format!("sasctl-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("h.log");
        let lines = [
            r#"{"timestamp":"t1","level":"INFO","fields":{"message":"claimed","step":0},"span":{"order_id":"o-1","name":"scheduler"},"spans":[{"order_id":"o-1","name":"scheduler"}]}"#,
            r#"{"timestamp":"t2","level":"INFO","fields":{"message":"claimed","step":0},"span":{"order_id":"o-10","name":"scheduler"},"spans":[{"order_id":"o-10","name":"scheduler"}]}"#,
            "not json, \"order_id\":\"o-1\"",
            r#"{"timestamp":"t3","level":"INFO","fields":{"message":"reply applied","trigger":"Finished"},"span":{"order_id":"o-1","name":"scheduler"},"spans":[{"order_id":"o-1","name":"scheduler"}]}"#,
        ];
        std::fs::write(&file, lines.join("\n")).unwrap();
        // The file before it (rotated past `MAX_FILE_BYTES`) is read first.
        let before = r#"{"timestamp":"t0","level":"INFO","fields":{"message":"accepted"},"span":{"order_id":"o-1","name":"submission"}}"#;
        std::fs::write(older(&file), format!("{before}\n")).unwrap();
        let found = lines_of(&file, "o-1").expect("the file");
        let described: Vec<_> = found.iter().map(describe).collect();
        assert_eq!(
            described,
            [
                ("t0".into(), "submission".into(), "accepted".into()),
                ("t1".into(), "scheduler".into(), "claimed (step=0)".into()),
                ("t3".into(), "scheduler".into(), "reply applied (trigger=Finished)".into()),
            ]
        );
        assert!(lines_of(&dir.join("none.log"), "o-1").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
