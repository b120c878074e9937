//! Metrics as CloudWatch Embedded Metric Format lines on stdout: Lambda ships its
//! logs to CloudWatch, which turns these lines into metrics without an API call.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

use crate::ports::{Metric, Metrics};

pub struct EmfMetrics {
    namespace: String,
    function: String,
    pending: Mutex<BTreeMap<Metric, Vec<u64>>>,
}

impl EmfMetrics {
    pub fn new(namespace: impl Into<String>, function: impl Into<String>) -> EmfMetrics {
        EmfMetrics { namespace: namespace.into(), function: function.into(), pending: Mutex::default() }
    }

    /// The EMF document for what is pending, or `None` when nothing is.
    pub fn render(&self, timestamp_ms: u64) -> Option<String> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if pending.is_empty() {
            return None;
        }
        let definitions: Vec<_> = pending
            .keys()
            .map(|m| serde_json::json!({"Name": m.name(), "Unit": if m.is_latency() { "Milliseconds" } else { "Count" }}))
            .collect();
        let mut doc = serde_json::json!({
            "_aws": {
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [["Function"]],
                    "Metrics": definitions,
                }],
            },
            "Function": self.function,
        });
        for (metric, values) in pending {
            doc[metric.name()] = if metric.is_latency() {
                serde_json::json!(values)
            } else {
                serde_json::json!(values.iter().sum::<u64>())
            };
        }
        Some(doc.to_string())
    }
}

impl Metrics for EmfMetrics {
    fn record(&self, metric: Metric, value: u64) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).entry(metric).or_default().push(value);
    }
    fn flush(&self) {
        let now = crate::ports::Clock::now(&crate::adapters::system::SystemClock);
        if let Some(line) = self.render(now.0) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_summed_and_latencies_listed() {
        let m = EmfMetrics::new("sas", "scheduler");
        m.record(Metric::StaleReply, 1);
        m.record(Metric::StaleReply, 2);
        m.record(Metric::StepLatencyMs, 7);
        m.record(Metric::StepLatencyMs, 9);
        let doc: serde_json::Value = serde_json::from_str(&m.render(5).unwrap()).unwrap();
        assert_eq!(doc["StaleReplies"], 3);
        assert_eq!(doc["StepLatency"], serde_json::json!([7, 9]));
        assert_eq!(doc["_aws"]["CloudWatchMetrics"][0]["Namespace"], "sas");
        assert_eq!(doc["Function"], "scheduler");
        assert!(m.render(6).is_none(), "flushed");
    }
}
