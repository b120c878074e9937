//! The remote service answered in-process, so the benchmarks measure sas and not a
//! network.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;

use sas::ports::{RemoteCall, RemoteError, RemoteService};

/// The remote service answered in-process: no I/O, optional injected failures.
pub struct InstantRemote {
    transient_rate: f64,
    permanent_rate: f64,
    rng: Mutex<fastrand::Rng>,
    /// A step whose name ends in `-list` answers `{"lines": [0, 1, ...]}` of this many.
    list_items: usize,
    pub calls: AtomicU64,
    /// Calls of map items (those that carry an index), and when the first and the
    /// latest of them came (wall time: `bench map` runs on the system clock).
    pub item_calls: AtomicU64,
    pub item_span: Mutex<Option<(Instant, Instant)>>,
    /// Calls by agent.
    pub by_agent: Mutex<std::collections::BTreeMap<String, u64>>,
    /// The callback tokens of the calls that started a callback step, for the rig's
    /// outside party to complete.
    pub started: Mutex<Vec<String>>,
}

impl InstantRemote {
    pub fn new(transient_rate: f64, permanent_rate: f64, seed: u64) -> InstantRemote {
        InstantRemote {
            transient_rate,
            permanent_rate,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            list_items: 0,
            calls: AtomicU64::new(0),
            item_calls: AtomicU64::new(0),
            item_span: Mutex::default(),
            by_agent: Mutex::default(),
            started: Mutex::default(),
        }
    }
}

impl InstantRemote {
    /// A `-list` step answers `items` lines.
    pub fn listing(mut self, items: usize) -> InstantRemote {
        self.list_items = items;
        self
    }

    /// A success's body: a `-list` step's lines, else nothing.
    fn answer(&self, call: &RemoteCall<'_>) -> Vec<u8> {
        if call.step_name.ends_with("-list") && call.action == sas::domain::Action::Do {
            let lines: Vec<String> = (0..self.list_items).map(|i| i.to_string()).collect();
            return format!(r#"{{"lines":[{}]}}"#, lines.join(",")).into_bytes();
        }
        Vec::new()
    }

    /// Calls made to any of `agents`.
    pub fn calls_to<'a>(&self, agents: impl IntoIterator<Item = &'a String>) -> u64 {
        let by = self.by_agent.lock().unwrap_or_else(|p| p.into_inner());
        agents.into_iter().filter_map(|a| by.get(a)).sum()
    }
}

#[async_trait]
impl RemoteService for InstantRemote {
    async fn call(&self, call: &RemoteCall<'_>, _timeout_ms: u64) -> Result<Vec<u8>, RemoteError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        *self.by_agent.lock().unwrap_or_else(|p| p.into_inner()).entry(call.agent.to_owned()).or_default() +=
            1;
        if call.index.is_some() {
            self.item_calls.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let mut span = self.item_span.lock().unwrap_or_else(|p| p.into_inner());
            *span = Some(span.map_or((now, now), |(first, _)| (first, now)));
        }
        if self.transient_rate == 0.0 && self.permanent_rate == 0.0 {
            if let Some(token) = call.callback_token {
                self.started.lock().unwrap_or_else(|p| p.into_inner()).push(token.to_owned());
            }
            return Ok(self.answer(call));
        }
        let r = self.rng.lock().unwrap_or_else(|p| p.into_inner()).f64();
        if r < self.permanent_rate {
            Err(RemoteError::permanent("injected: 422"))
        } else if r < self.permanent_rate + self.transient_rate {
            Err(RemoteError::Transient("injected: 503".into()))
        } else {
            Ok(self.answer(call))
        }
    }
}
