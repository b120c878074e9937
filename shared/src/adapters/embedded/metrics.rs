use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::ports::{Metric, Metrics};

/// Counters and latency samples kept in memory, for `sasctl dev`'s report and tests.
#[derive(Debug, Default)]
pub struct CountingMetrics(Mutex<MetricsSnapshot>);

#[derive(Debug, Default, Clone)]
pub struct MetricsSnapshot {
    pub counters: BTreeMap<Metric, u64>,
    pub samples: BTreeMap<Metric, Vec<u64>>,
}

impl MetricsSnapshot {
    pub fn count(&self, metric: Metric) -> u64 {
        self.counters.get(&metric).copied().unwrap_or(0)
    }
    /// The `p`-th percentile (0-100) of a latency metric's samples, by nearest rank.
    pub fn percentile(&self, metric: Metric, p: f64) -> Option<u64> {
        let mut samples = self.samples.get(&metric)?.clone();
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let rank = ((p / 100.0) * samples.len() as f64).ceil().max(1.0) as usize;
        Some(samples[rank.min(samples.len()) - 1])
    }
}

impl CountingMetrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Metrics for CountingMetrics {
    fn record(&self, metric: Metric, value: u64) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if metric.is_latency() {
            s.samples.entry(metric).or_default().push(value);
        } else {
            *s.counters.entry(metric).or_default() += value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let m = CountingMetrics::default();
        for v in 1..=100 {
            m.record(Metric::OrderLatencyMs, v);
        }
        let s = m.snapshot();
        assert_eq!(s.percentile(Metric::OrderLatencyMs, 50.0), Some(50));
        assert_eq!(s.percentile(Metric::OrderLatencyMs, 99.0), Some(99));
        assert_eq!(s.percentile(Metric::OrderLatencyMs, 100.0), Some(100));
        assert_eq!(s.percentile(Metric::StepLatencyMs, 50.0), None);
    }
}
