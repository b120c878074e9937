//! agent: performs one step against its remote service with retries (backoff and
//! jitter) and a circuit breaker per service, all bounded by complete-by. Past
//! complete-by, or with the service's circuit open, it replies nothing: the supervisor
//! owns the task from then on.
//!
//! A limited agent's call first writes its mark (`domain::gate::CallMark`) in the state
//! table, conditionally: only the request that wrote it calls, so a copy of the request
//! that SQS delivered to any container is never a second call under the one place.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::Instrument;

use super::{HandlerError, Inbound};
use crate::domain::breaker::{Breaker, BreakerPolicy, Permit};
use crate::domain::definitions::AgentDef;
use crate::domain::gate::{CallMark, CallStart};
use crate::domain::retry::Backoff;
use crate::domain::{
    Action, AgentRequest, ReplyOutcome, RequestMismatch, SchedulerMessage, StepOutput, Timestamp, Workflows,
    cut_reason,
};
use crate::ports::{
    CallStarts, Clock, Metric, Metrics, Outgoing, QueueUrl, Queues, Random, RemoteCall, RemoteError,
    RemoteService,
};

#[derive(Debug, Clone, Copy)]
pub struct AgentSettings {
    /// Backoff between calls of one attempt.
    pub retry: Backoff,
    pub breaker: BreakerPolicy,
    /// The agent has flow-control limits: a remote's "too many requests" goes back to
    /// its gate (`domain::gate`) instead of being waited out here.
    pub limited: bool,
    /// The agent has `max_per_second`: one request per dispatch, no retry in place.
    pub one_call: bool,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            retry: Backoff { base_ms: 100, cap_ms: 2_000 },
            breaker: BreakerPolicy { failure_threshold: 5, open_ms: 1_000 },
            limited: false,
            one_call: false,
        }
    }
}

/// The agent needs the remote service, the scheduler's queue for replies, and time; of
/// the state table, only its call marks, and only for limited agents.
#[derive(Clone)]
pub struct AgentDeps {
    pub queues: Arc<dyn Queues>,
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    pub metrics: Arc<dyn Metrics>,
    pub remote: Arc<dyn RemoteService>,
    /// Where replies go.
    pub scheduler_queue: QueueUrl,
    /// Where a limited agent's calls leave their marks; `None` where no agent has limits
    /// (a limited agent's request is then retried, never called: `AgentConfig` refuses
    /// such a deployment at cold start).
    pub call_starts: Option<Arc<dyn CallStarts>>,
}

/// Time kept back from the invocation's deadline for the reply to go out: the send may
/// be held up to `SEND_MAX_HOLD_MS` (at most 1 s, `config`) and then takes a request.
pub const REPLY_MARGIN_MS: u64 = 2_000;

#[derive(Clone)]
pub struct Agent {
    pub deps: AgentDeps,
    pub agent_settings: AgentSettings,
    /// What a request is checked against before anything is called.
    workflows: Workflows,
    /// Retry and breaker of the agents whose definition sets their own.
    per_agent: HashMap<String, AgentSettings>,
    /// One breaker per remote service, kept for the life of the process (a warm Lambda).
    breakers: Arc<Mutex<HashMap<String, Breaker>>>,
    /// Set once an invocation deadline already past has been ignored and said so: an
    /// emulator sends the same one every time, and once is enough to explain it.
    past_deadline_logged: Arc<AtomicBool>,
    /// The limited agents' requests this process took: a copy that comes back here is
    /// dropped without writing its mark.
    handled: Arc<Handled>,
}

/// Requests taken by this process, the newest `HANDLED_KEPT`.
#[derive(Default)]
struct Handled(Mutex<(std::collections::HashSet<String>, std::collections::VecDeque<String>)>);

/// Enough for every request a warm container takes within any complete-by.
const HANDLED_KEPT: usize = 10_000;

impl Handled {
    /// `true` the first time `key` is seen (and it is kept); `false` for a copy.
    fn first(&self, key: &str) -> bool {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *guard;
        if !set.insert(key.to_owned()) {
            return false;
        }
        order.push_back(key.to_owned());
        if order.len() > HANDLED_KEPT
            && let Some(old) = order.pop_front()
        {
            set.remove(&old);
        }
        true
    }

    fn forget(&self, key: &str) {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *guard;
        set.remove(key);
        order.retain(|k| k != key);
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentOutcome {
    Replied(ReplyOutcome),
    /// Complete-by passed (or would pass before the next try): stop, say nothing.
    GaveUp {
        calls: u32,
    },
    /// A limited agent's call another request already started (`CallStart::AlreadyStarted`):
    /// not called, no reply.
    Copy,
    /// A limited agent's call whose mark could not be written: not called, the request is
    /// tried again.
    Unmarked(String),
}

impl Agent {
    /// `workflows`: what each request is checked against before anything is called.
    pub fn new(deps: AgentDeps, agent_settings: AgentSettings, workflows: Workflows) -> Agent {
        Agent {
            deps,
            agent_settings,
            workflows,
            per_agent: HashMap::new(),
            breakers: Arc::default(),
            past_deadline_logged: Arc::default(),
            handled: Arc::default(),
        }
    }

    /// Each agent's retry and breaker as its definition gives them (the rest keep
    /// `agent_settings`), so one slow service's policy is not every service's.
    pub fn with_agents(mut self, agents: &std::collections::BTreeMap<String, AgentDef>) -> Agent {
        let defaults = self.agent_settings;
        self.per_agent = agents
            .iter()
            .map(|(name, def)| {
                let settings = AgentSettings {
                    retry: def.retry.map_or(defaults.retry, |r| r.backoff()),
                    breaker: def.breaker.map_or(defaults.breaker, |b| b.policy()),
                    limited: def.limits().any(),
                    one_call: def.max_per_second.is_some(),
                };
                (name.clone(), settings)
            })
            .collect();
        self
    }

    fn settings_of(&self, agent: &str) -> AgentSettings {
        self.per_agent.get(agent).copied().unwrap_or(self.agent_settings)
    }

    /// One message, with no deadline of its own (an in-process run).
    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        self.handle_until(message, None).await
    }

    /// One message of an invocation that ends at `deadline` (Lambda's): the request's
    /// complete-by is clamped to it, less [`REPLY_MARGIN_MS`], so the agent stops in time
    /// to reply, or gives up silently, instead of being cut off mid-call.
    ///
    /// A deadline at or before the time this message's handling starts is ignored:
    /// Lambda never starts an invocation that has already ended, so such a deadline is
    /// not a real one. `cargo lambda watch`'s runtime emulator sends every invocation
    /// the same `Lambda-Runtime-Deadline-Ms: 600000` (600 s after the epoch); trusting
    /// it would make the agent give up on every request without calling anything.
    pub async fn handle_until(
        &self,
        message: Inbound,
        deadline: Option<Timestamp>,
    ) -> Result<(), HandlerError> {
        let request = AgentRequest::parse(&message.body).map_err(|e| HandlerError::Reject(e.to_string()))?;
        request.check(&self.workflows).map_err(|e| match e {
            // A version published after this container loaded its definitions: a newer
            // container takes it on redelivery (see `Settings::workflow`).
            RequestMismatch::UnknownWorkflow(ref name, version) if self.workflows.is_newer(name, version) => {
                HandlerError::Retry(e.to_string())
            }
            _ => HandlerError::Reject(cut_reason(e.to_string())),
        })?;
        // A copy of a request this container is handling or has handled (SQS delivers at
        // least once) would be a second call under the one place its claim took in a
        // limited agent's gate: dropped here without a write. A copy in another container
        // finds the call's mark (`perform`).
        let copy_key = self.settings_of(&request.agent).limited.then(|| {
            CallMark::new(
                &request.order_id,
                request.step,
                request.attempt,
                &request.lease,
                request.complete_by,
            )
            .key
        });
        if let Some(key) = &copy_key
            && !self.handled.first(key)
        {
            tracing::info!(order_id = %request.order_id, attempt = request.attempt, "copy of a request already handled here: dropped");
            return Ok(());
        }
        let result = self.handle_request(request, deadline).await;
        if let (Err(_), Some(key)) = (&result, &copy_key) {
            // Its redelivery is the request itself: the call's mark decides whether it calls.
            self.handled.forget(key);
        }
        result
    }

    async fn handle_request(
        &self,
        mut request: AgentRequest,
        deadline: Option<Timestamp>,
    ) -> Result<(), HandlerError> {
        let started = self.deps.clock.now();
        if let Some(deadline) = deadline.filter(|d| !self.past_deadline(*d, started)) {
            let limit = Timestamp(deadline.0.saturating_sub(REPLY_MARGIN_MS));
            if request.complete_by > limit {
                tracing::info!(complete_by = %request.complete_by, %limit, "complete-by clamped to the invocation's deadline");
                request.complete_by = limit;
            }
        }
        let request = &request;
        let span = tracing::info_span!("agent", order_id = %request.order_id, step = request.step, attempt = request.attempt);
        async {
            match self.perform(request).await {
                AgentOutcome::Replied(outcome) => {
                    let reply = SchedulerMessage::Reply(request.reply(outcome));
                    self.deps.queues.send(&self.deps.scheduler_queue, Outgoing::new(reply.to_body())).await?;
                    Ok(())
                }
                AgentOutcome::GaveUp { calls } => {
                    tracing::warn!(calls, complete_by = %request.complete_by, "complete-by reached; no reply");
                    self.deps.metrics.record(Metric::AgentGaveUp, 1);
                    Ok(())
                }
                AgentOutcome::Copy => {
                    tracing::info!("the call was started by another copy of this request: not called, no reply");
                    Ok(())
                }
                AgentOutcome::Unmarked(reason) => Err(HandlerError::Retry(reason)),
            }
        }
        .instrument(span)
        .await
    }

    /// Whether `deadline` had passed when the handling began at `started` (then it is
    /// ignored; see [`Agent::handle_until`]), logged the first time only.
    fn past_deadline(&self, deadline: Timestamp, started: Timestamp) -> bool {
        if deadline > started {
            return false;
        }
        if !self.past_deadline_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %deadline,
                now = %started,
                "the invocation's deadline had passed before it started: not a real one (an emulator's?); \
                 ignored, complete-by alone bounds the attempt (logged once)"
            );
        }
        true
    }

    fn permit(&self, agent: &str, now: Timestamp) -> Permit {
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        breakers
            .entry(agent.to_owned())
            .or_insert_with(|| Breaker::new(self.settings_of(agent).breaker))
            .permit(now.0)
    }

    fn report(&self, agent: &str, now: Timestamp, result: &Result<Vec<u8>, RemoteError>) {
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        let breaker =
            breakers.entry(agent.to_owned()).or_insert_with(|| Breaker::new(self.settings_of(agent).breaker));
        let limited = self.settings_of(agent).limited;
        match result {
            // A limited agent's gate pauses for a Retry-After: the breaker is for outages.
            Err(RemoteError::Busy { .. }) if limited => {}
            Err(RemoteError::Transient(_) | RemoteError::Busy { .. }) => breaker.on_transient_failure(now.0),
            // A refusal, of the step or of the credentials, is the service answering.
            Ok(_) | Err(RemoteError::Permanent { .. } | RemoteError::AuthRefused { .. }) => {
                breaker.on_success()
            }
        }
    }

    /// Whether `request` is a branch of a parallel stage (`Workflow::stage_of`) or an item
    /// of a map, going forward: its reply cannot hand the lease back alone.
    fn is_branch(&self, request: &AgentRequest) -> bool {
        request.action == Action::Do
            && (request.index.is_some()
                || self
                    .workflows
                    .get_version(&request.workflow, request.workflow_version)
                    .is_some_and(|wf| wf.stage_of(request.step).is_some()))
    }

    /// Calls the remote service until it answers for good or complete-by comes.
    pub async fn perform(&self, request: &AgentRequest) -> AgentOutcome {
        let clock = &self.deps.clock;
        let complete_by = request.complete_by;
        let call = RemoteCall {
            agent: &request.agent,
            action: request.action,
            step: request.step,
            step_name: &request.step_name,
            idempotency_key: &request.idempotency_key,
            order: &request.order,
            outputs: &request.outputs,
            callback_token: request.callback_token.as_ref().map(|t| t.expose()),
            index: request.index,
            item: request.item.as_ref(),
        };
        let mut calls = 0u32;
        let mut failures = 0u32;
        // Whether the service has refused the agent's credentials once in this attempt.
        let mut auth_refused = false;
        loop {
            let now = clock.now();
            if now >= complete_by {
                return AgentOutcome::GaveUp { calls };
            }
            // An open circuit fails fast, and so does one with its probe in flight:
            // waiting would hold this invocation (and the requests of every other agent
            // behind it in the queue) for a service known to be down; waiting even for a
            // probe's verdict measured a healthy neighbour's p99 at 5.9x its baseline
            // (docs/BENCHMARKS.md 6). The task lapses and the supervisor retries it with
            // backoff, against the step's failure budget, so a service that stays down
            // spends the budget of steps it never saw: they give up as in doubt.
            if let Permit::Refused { retry_at_ms } = self.permit(&request.agent, now) {
                self.deps.metrics.record(Metric::CircuitOpen, 1);
                tracing::info!(agent = %request.agent, retry_at_ms, "circuit open; not calling, no reply");
                return AgentOutcome::GaveUp { calls };
            }
            if calls == 0
                && self.settings_of(&request.agent).limited
                && let Some(outcome) = self.start_call(request).await
            {
                return outcome;
            }
            calls += 1;
            let result = self.deps.remote.call(&call, complete_by.millis_since(now)).await;
            let now = clock.now();
            self.report(&request.agent, now, &result);
            match result {
                Ok(body) => return AgentOutcome::Replied(answered(request, &body)),
                Err(RemoteError::Permanent { reason, detail }) => {
                    // The reason reaches the order's reply_to (whose status update names the
                    // step): the adapter keeps it generic (what failed, the status class)
                    // and logs the details itself.
                    tracing::warn!(%reason, "remote service refused");
                    return AgentOutcome::Replied(ReplyOutcome::Failed { reason, detail });
                }
                // A rotated secret: the value cached here is the old one, which the service
                // no longer takes. The adapter dropped it, so the retry reads the current
                // one; once per attempt, so a value that is simply wrong is not retried
                // until complete-by.
                // Under a rate limit the place covers one request: the next attempt (after
                // complete-by, through the gate) reads the secret afresh instead.
                Err(RemoteError::AuthRefused { reason, .. }) if self.settings_of(&request.agent).one_call => {
                    tracing::warn!(agent = %request.agent, %reason, "credentials refused; an agent with max_per_second does not retry in place");
                    self.deps.metrics.record(Metric::AuthRetry, 1);
                    return AgentOutcome::GaveUp { calls };
                }
                Err(RemoteError::AuthRefused { reason, .. }) if !auth_refused => {
                    auth_refused = true;
                    tracing::warn!(agent = %request.agent, %reason, "credentials refused; reading the secret again and retrying once");
                    self.deps.metrics.record(Metric::AuthRetry, 1);
                    let Some(retry_at) = self.retry_at(request, now, &mut failures) else {
                        return AgentOutcome::GaveUp { calls };
                    };
                    clock.sleep_until(retry_at).await;
                }
                Err(RemoteError::AuthRefused { reason, detail }) => {
                    // Read afresh and refused again: a credential the service does not
                    // know. The step is refused as for any 4xx; the metric raises the
                    // auth-refused alarm, for an operator to fix the secret.
                    tracing::error!(agent = %request.agent, %reason, "credentials refused again after reading the secret afresh");
                    self.deps.metrics.record(Metric::AuthRefused, 1);
                    return AgentOutcome::Replied(ReplyOutcome::Failed { reason, detail });
                }
                // An agent with limits hands the step back to its gate, which pauses for
                // every container; one without waits in place, if complete-by allows.
                Err(RemoteError::Busy { reason, retry_after_ms }) => {
                    tracing::info!(%reason, retry_after_ms, "remote service asked to wait");
                    let settings = self.settings_of(&request.agent);
                    if settings.limited && !self.is_branch(request) {
                        return AgentOutcome::Replied(ReplyOutcome::Throttled { retry_after_ms });
                    }
                    // A parallel stage's branches (a map's items) share one lease, so one cannot go back to
                    // its gate alone: it waits in place, holding its place, as an agent
                    // without limits does; under a rate limit, where a place covers one
                    // request, it gives up instead, and the stage is tried again through
                    // the gate once it lapses.
                    if settings.one_call {
                        return AgentOutcome::GaveUp { calls };
                    }
                    let Some(retry_at) = self.retry_at(request, now, &mut failures) else {
                        return AgentOutcome::GaveUp { calls };
                    };
                    let retry_at = retry_at.max(now.plus_ms(retry_after_ms));
                    if retry_at >= complete_by {
                        return AgentOutcome::GaveUp { calls };
                    }
                    self.deps.metrics.record(Metric::AgentRetry, 1);
                    clock.sleep_until(retry_at).await;
                }
                Err(RemoteError::Transient(reason)) => {
                    // Under a rate limit each request needs a place of its own: no retry in
                    // place; the supervisor tries the step again through the gate.
                    if self.settings_of(&request.agent).one_call {
                        tracing::info!(%reason, "transient failure; an agent with max_per_second does not retry in place");
                        return AgentOutcome::GaveUp { calls };
                    }
                    let Some(retry_at) = self.retry_at(request, now, &mut failures) else {
                        return AgentOutcome::GaveUp { calls };
                    };
                    tracing::info!(%reason, delay_ms = retry_at.millis_since(now), "transient failure; retrying");
                    self.deps.metrics.record(Metric::AgentRetry, 1);
                    clock.sleep_until(retry_at).await;
                }
            }
        }
    }

    /// Writes a limited agent's call mark before its first call: `None` when this request
    /// may call, else how the attempt ends without calling.
    async fn start_call(&self, request: &AgentRequest) -> Option<AgentOutcome> {
        let Some(store) = &self.deps.call_starts else {
            tracing::error!(agent = %request.agent, "a limited agent's request, and no state table to mark its call in: not called");
            return Some(AgentOutcome::Unmarked("no state table for limited agents' call marks".into()));
        };
        let mark = CallMark::new(
            &request.order_id,
            request.step,
            request.attempt,
            &request.lease,
            request.complete_by,
        );
        match store.start_call(&mark).await {
            Ok(start) if start.may_call() => None,
            // The planted bug of `Mutation::CopiesCalled`: a copy calls anyway.
            Ok(CallStart::AlreadyStarted) if crate::mutations::copies_called() => None,
            Ok(_) => Some(AgentOutcome::Copy),
            Err(e) => Some(AgentOutcome::Unmarked(e.to_string())),
        }
    }

    /// When to call again after `failures` failed calls (counting this one), by the
    /// agent's retry policy; `None` when that would be at or past complete-by.
    fn retry_at(&self, request: &AgentRequest, now: Timestamp, failures: &mut u32) -> Option<Timestamp> {
        let delay = self.settings_of(&request.agent).retry.delay_ms(*failures, self.deps.random.jitter());
        *failures += 1;
        let retry_at = now.plus_ms(delay);
        (retry_at < request.complete_by).then_some(retry_at)
    }
}

/// A success as the reply carries it. A forward step's body is its output (nothing, or
/// JSON within the limit); one that cannot be kept is said so, for the scheduler to give
/// up on the step in doubt. A compensation's body is not kept.
fn answered(request: &AgentRequest, body: &[u8]) -> ReplyOutcome {
    if request.action == Action::Undo {
        return ReplyOutcome::DONE;
    }
    match StepOutput::from_body(body) {
        Ok(output) => ReplyOutcome::Succeeded { output },
        Err(e) => {
            tracing::warn!(error = %e, bytes = body.len(), "remote service answered an output that cannot be kept");
            ReplyOutcome::BadOutput { reason: e.to_string(), detail: None }
        }
    }
}
