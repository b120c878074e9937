//! A simulated remote service on loopback HTTP for `sasctl dev`: the simulation's model
//! of a well-behaved service (`sas_sim::ledger`: seeded transient failures, permanent
//! refusals and hangs, deduplication by idempotency key, a ledger of every call and
//! every applied effect) served over real HTTP in real time.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sas::adapters::http_remote::IDEMPOTENCY_HEADER;
use sas::domain::Action;
use sas_sim::ledger::{Call, Verdict};
pub use sas_sim::ledger::{Ledger, RemoteFaults};

struct Service {
    faults: RemoteFaults,
    /// Agents whose service fails differently from the rest (`--agent-fault`).
    agent_faults: BTreeMap<String, RemoteFaults>,
    seed: u64,
    started: Instant,
    /// The ledger, and how many calls each idempotency key has had, behind one lock: a
    /// key is settled under it once.
    state: Mutex<(HashMap<String, u64>, Ledger)>,
}

/// The dice for the `nth` call under `key`: drawn from the seed, the key and `nth`
/// alone, so a call's fate does not depend on which other calls happened to arrive
/// before it (one shared generator would hand out its numbers in arrival order, which
/// the scheduling of threads decides).
fn dice(seed: u64, key: &str, nth: u64) -> fastrand::Rng {
    // FNV-1a over the key; fastrand's generator mixes the rest.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(nth.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    fastrand::Rng::with_seed(seed ^ h)
}

#[derive(serde::Deserialize)]
struct CallBody {
    order_id: String,
    step: u32,
    action: Action,
    #[serde(default)]
    outputs: std::collections::BTreeMap<String, serde_json::Value>,
}

/// No answer can take longer than this; the agent's own timeout ends the call first.
const HANG: Duration = Duration::from_secs(3_600);

async fn call(
    State(service): State<Arc<Service>>,
    Path((agent, action_name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::Json<CallBody>,
) -> (StatusCode, String) {
    let Some(key) = headers.get(IDEMPOTENCY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key".into());
    };
    let handed = serde_json::to_string(&body.outputs).unwrap_or_default();
    let (verdict, answer) = {
        let mut state = service.state.lock().unwrap_or_else(|p| p.into_inner());
        let (calls, ledger) = &mut *state;
        let nth = calls.entry(key.to_owned()).or_default();
        *nth += 1;
        let mut rng = dice(service.seed, key, *nth);
        let at = service.started.elapsed().as_millis() as u64;
        let call = Call {
            key,
            order_id: &body.order_id,
            step: body.step,
            action: body.action,
            timeout_ms: HANG.as_millis() as u64,
            agent: &agent,
            name: &action_name,
            handed: &handed,
        };
        let faults = service.agent_faults.get(&agent).unwrap_or(&service.faults);
        let verdict = ledger.call(faults, &mut rng, at, call);
        (verdict, ledger.answer(key).to_owned())
    };
    match verdict {
        Verdict::Answer { latency_ms } => {
            if latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(latency_ms)).await;
            }
            (StatusCode::OK, answer)
        }
        Verdict::Transient => (StatusCode::SERVICE_UNAVAILABLE, "try again".into()),
        Verdict::Refused => (StatusCode::UNPROCESSABLE_ENTITY, "declined".into()),
        Verdict::Hang => {
            // The caller's timeout ends this call; the server never answers it.
            tokio::time::sleep(HANG).await;
            (StatusCode::GATEWAY_TIMEOUT, "hung".into())
        }
    }
}

/// A running simulated service; dropped or `stop`ped, it stops serving.
pub struct LoopbackRemote {
    pub addr: SocketAddr,
    service: Arc<Service>,
    server: tokio::task::JoinHandle<()>,
}

impl LoopbackRemote {
    pub async fn start(
        faults: RemoteFaults,
        agent_faults: BTreeMap<String, RemoteFaults>,
        seed: u64,
    ) -> std::io::Result<LoopbackRemote> {
        let service = Arc::new(Service {
            faults,
            agent_faults,
            seed,
            started: Instant::now(),
            state: Mutex::new((HashMap::new(), Ledger::default())),
        });
        let router = Router::new().route("/{agent}/{action}", post(call)).with_state(service.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "simulated remote service stopped");
            }
        });
        Ok(LoopbackRemote { addr, service, server })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn ledger(&self) -> Ledger {
        self.service.state.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Stops at once: hung calls are abandoned, as a real outage would leave them.
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for LoopbackRemote {
    fn drop(&mut self) {
        self.server.abort();
    }
}
