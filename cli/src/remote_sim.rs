//! A simulated remote service on loopback HTTP for `sasctl dev`: answers the agents'
//! calls with configurable latency, transient failures, permanent refusals and hangs,
//! deduplicates by idempotency key as a well-behaved service does, and keeps a ledger
//! of every call and every applied effect so the run can be checked against it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sas::adapters::http_remote::IDEMPOTENCY_HEADER;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability a call answers 503.
    pub failure_rate: f64,
    /// Probability a forward call is refused for good (422).
    pub permanent_rate: f64,
    /// Probability a call never answers (half of those after applying the effect,
    /// as when a response is lost).
    pub hang_rate: f64,
    /// Service time of an answered call.
    pub latency_ms: u64,
}

/// What the service saw and did, per idempotency key.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub calls: u64,
    pub hangs: u64,
    pub transient_failures: u64,
    pub refusals: u64,
    /// Key -> times its effect was applied. The service deduplicates, so anything but 1
    /// means the service itself is broken; the checker still verifies it.
    pub effects: BTreeMap<String, u32>,
    /// (order id, step, action) -> idempotency keys used for it.
    pub keys: BTreeMap<(String, u32, String), BTreeSet<String>>,
    /// Keys refused for good, whose effect must never be applied.
    pub refused: BTreeSet<String>,
}

struct Service {
    faults: Faults,
    rng: Mutex<fastrand::Rng>,
    ledger: Mutex<Ledger>,
}

impl Service {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(serde::Deserialize)]
struct CallBody {
    order_id: String,
    step: u32,
    action: String,
}

enum Verdict {
    Hang,
    Transient,
    Refuse,
    Answer,
}

async fn call(
    State(service): State<Arc<Service>>,
    Path((_agent, _action_name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::Json<CallBody>,
) -> (StatusCode, String) {
    let Some(key) = headers.get(IDEMPOTENCY_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key".into());
    };
    let f = service.faults;
    // Decide and apply under one lock: a real idempotent service settles a key once, so
    // two concurrent calls with one key can never see one applied and the other refused.
    let verdict = {
        let mut ledger = service.ledger();
        ledger.calls += 1;
        ledger
            .keys
            .entry((body.order_id.clone(), body.step, body.action.clone()))
            .or_default()
            .insert(key.clone());
        let applied = ledger.effects.contains_key(&key);
        let refused = ledger.refused.contains(&key);
        let r = service.rng.lock().unwrap_or_else(|p| p.into_inner()).f64();
        if r < f.hang_rate {
            ledger.hangs += 1;
            // Half the hangs lose the response after the work was done.
            if r < f.hang_rate / 2.0 && !applied && !refused {
                ledger.effects.insert(key.clone(), 1);
            }
            Verdict::Hang
        } else if r < f.hang_rate + f.failure_rate {
            ledger.transient_failures += 1;
            Verdict::Transient
        } else if refused
            || (body.action == "do" && !applied && r < f.hang_rate + f.failure_rate + f.permanent_rate)
        {
            if !refused {
                ledger.refusals += 1;
                ledger.refused.insert(key.clone());
            }
            Verdict::Refuse
        } else {
            if !applied {
                ledger.effects.insert(key.clone(), 1);
            }
            Verdict::Answer
        }
    };
    match verdict {
        Verdict::Hang => {
            // The caller's timeout ends this call; the server never answers it.
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            (StatusCode::GATEWAY_TIMEOUT, "hung".into())
        }
        Verdict::Transient => (StatusCode::SERVICE_UNAVAILABLE, "try again".into()),
        Verdict::Refuse => (StatusCode::UNPROCESSABLE_ENTITY, "declined".into()),
        Verdict::Answer => {
            if f.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(f.latency_ms)).await;
            }
            (StatusCode::OK, "done".into())
        }
    }
}

/// A running simulated service; dropped or `stop`ped, it stops serving.
pub struct SimRemote {
    pub addr: SocketAddr,
    service: Arc<Service>,
    server: tokio::task::JoinHandle<()>,
}

impl SimRemote {
    pub async fn start(faults: Faults, seed: u64) -> std::io::Result<SimRemote> {
        let service = Arc::new(Service {
            faults,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            ledger: Mutex::default(),
        });
        let router = Router::new().route("/{agent}/{action}", post(call)).with_state(service.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "simulated remote service stopped");
            }
        });
        Ok(SimRemote { addr, service, server })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn ledger(&self) -> Ledger {
        self.service.ledger().clone()
    }

    /// Stops at once: hung calls are abandoned, as a real outage would leave them.
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for SimRemote {
    fn drop(&mut self) {
        self.server.abort();
    }
}
