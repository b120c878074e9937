//! The remote service answered in-process, so the benchmarks measure sas and not a
//! network.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use sas::ports::{RemoteCall, RemoteError, RemoteService};

/// The remote service answered in-process: no I/O, optional injected failures.
pub struct InstantRemote {
    transient_rate: f64,
    permanent_rate: f64,
    rng: Mutex<fastrand::Rng>,
    pub calls: AtomicU64,
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
            calls: AtomicU64::new(0),
            by_agent: Mutex::default(),
            started: Mutex::default(),
        }
    }
}

impl InstantRemote {
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
        if self.transient_rate == 0.0 && self.permanent_rate == 0.0 {
            if let Some(token) = call.callback_token {
                self.started.lock().unwrap_or_else(|p| p.into_inner()).push(token.to_owned());
            }
            return Ok(Vec::new());
        }
        let r = self.rng.lock().unwrap_or_else(|p| p.into_inner()).f64();
        if r < self.permanent_rate {
            Err(RemoteError::permanent("injected: 422"))
        } else if r < self.permanent_rate + self.transient_rate {
            Err(RemoteError::Transient("injected: 503".into()))
        } else {
            Ok(Vec::new())
        }
    }
}
