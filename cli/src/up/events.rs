//! What `sasctl up` tells its user while it runs: one line per notable event (an order
//! accepted, rejected or ended, an app's cancel asked, applied or refused, an alert,
//! trouble with the endpoint), or one JSON object per line with `--json`, and the counts
//! behind the final summary.
//!
//! The event log learns of orders by watching the ports (`tap`): the landed writes of the
//! state store, the alerts raised, the messages kept in a dead-letter queue; and of apps'
//! cancels by watching the orders function ([`CancelWatch`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sas::domain::{
    Act, Actor, CancelRequest, Cause, Happened, Intake, OperatorAlert, OrderId, Origin, ProcessState, Sender,
    TaskRecord, Trigger, Workflows,
};
use sas::handlers::{BatchReport, HandlerError, Inbound, REASON_ATTRIBUTE, Submission, SweepReport};
use sas::ports::{AlertError, Alerts, Outgoing, QueueError, QueueUrl, Queues};
use serde::Serialize;
use serde_json::json;

use crate::pump::PumpEvents;
use crate::tap::{Landed, Tap};

/// The counts of one `up` run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpCounts {
    /// Orders accepted (their task created) by this run.
    pub accepted: usize,
    /// The orders this run accepted or moved, each once, by the state it is in now: one
    /// that failed and was then resubmitted and processed counts as processed only.
    pub processed: usize,
    pub error: usize,
    pub compensated: usize,
    /// Not ended yet.
    pub in_flight: usize,
    /// Messages kept in a dead-letter queue with a reason (bad orders, mostly), other than
    /// callback completions.
    pub rejected: usize,
    /// Callback completions refused and kept in the callback DLQ with their reason.
    pub callbacks_refused: usize,
    /// Operator alerts published.
    pub alerts: usize,
    pub supervisor_runs: u64,
    /// Tasks the supervisor put back for another attempt after their deadline passed.
    pub supervisor_retries: usize,
    /// Batches handled (function invocations), by queue name.
    pub invocations: BTreeMap<String, u64>,
}

impl UpCounts {
    pub fn line(&self) -> String {
        format!(
            "{} accepted, {} processed, {} error, {} compensated, {} in flight; {} rejected, {} callbacks \
             refused, {} alerts, {} supervisor runs ({} retries)",
            self.accepted,
            self.processed,
            self.error,
            self.compensated,
            self.in_flight,
            self.rejected,
            self.callbacks_refused,
            self.alerts,
            self.supervisor_runs,
            self.supervisor_retries
        )
    }
}

#[derive(Default)]
struct Counts {
    /// All but the orders by state, which `latest` gives.
    summary: UpCounts,
    /// Each order seen, by the state of its latest landed write.
    latest: HashMap<OrderId, ProcessState>,
    /// Orders whose cancel landed and whose cancel message has not been looked at since.
    cancels_landed: HashSet<OrderId>,
}

impl Counts {
    /// `order` is now in `state`: counted there, and no longer where it was (returned).
    fn moved(&mut self, order: &OrderId, state: ProcessState) -> Option<ProcessState> {
        self.latest.insert(order.clone(), state)
    }

    /// Counted when the counts are read (at the stop, or a benchmark's poll), not kept
    /// beside `latest`, which holds the same.
    fn in_state(&self, state: ProcessState) -> usize {
        self.latest.values().filter(|s| **s == state).count()
    }
}

/// Where events are told, and the counts kept.
pub struct EventLog {
    started: Instant,
    /// The run's workflows, to name steps (`with_workflows`).
    workflows: Option<Workflows>,
    json: bool,
    /// Tells nothing, only counts (`bench traffic`).
    quiet: bool,
    counts: Mutex<Counts>,
}

/// The last part of a queue URL: its name.
fn queue_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

impl EventLog {
    pub fn new(json: bool) -> EventLog {
        EventLog { started: Instant::now(), workflows: None, json, quiet: false, counts: Mutex::default() }
    }

    /// Names the steps of `workflows` in what it tells.
    pub fn with_workflows(self, workflows: Workflows) -> EventLog {
        EventLog { workflows: Some(workflows), ..self }
    }

    /// An event log that only counts.
    pub fn quiet() -> EventLog {
        EventLog { quiet: true, ..EventLog::new(false) }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn summary(&self) -> UpCounts {
        let counts = self.counts();
        let in_flight =
            ProcessState::ALL.iter().filter(|s| !s.is_terminal()).map(|s| counts.in_state(*s)).sum();
        UpCounts {
            processed: counts.in_state(ProcessState::Processed),
            error: counts.in_state(ProcessState::Error),
            compensated: counts.in_state(ProcessState::Compensated),
            in_flight,
            ..counts.summary.clone()
        }
    }

    /// One event: `what` (a word), `text` for people, `fields` for `--json`.
    pub fn tell(&self, what: &str, text: &str, fields: serde_json::Value) {
        if self.quiet {
            return;
        }
        let line = if self.json {
            let mut object =
                serde_json::json!({ "event": what, "at_ms": self.started.elapsed().as_millis() as u64 });
            if let (Some(o), serde_json::Value::Object(extra)) = (object.as_object_mut(), fields) {
                o.extend(extra);
            }
            object.to_string()
        } else {
            format!("[{:>8.1}s] {what:<14} {text}", self.started.elapsed().as_secs_f64())
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// A supervisor run finished.
    pub fn swept(&self, report: &SweepReport) {
        {
            let mut counts = self.counts();
            counts.summary.supervisor_runs += 1;
            counts.summary.supervisor_retries += report.retried;
        }
        if report.retried + report.gave_up + report.errors > 0 {
            self.tell(
                "supervisor",
                &format!(
                    "{} overdue: {} retried, {} given up, {} errors",
                    report.examined, report.retried, report.gave_up, report.errors
                ),
                serde_json::json!({
                    "examined": report.examined, "retried": report.retried,
                    "gave_up": report.gave_up, "errors": report.errors,
                }),
            );
        }
    }

    pub fn sweep_failed(&self, error: &str) {
        self.counts().summary.supervisor_runs += 1;
        self.tell(
            "trouble",
            &format!("supervisor run failed: {error}"),
            serde_json::json!({ "error": error }),
        );
    }

    fn ended(&self, task: &TaskRecord) {
        let state = task.state().as_str();
        let why = task.last_error.as_deref().filter(|_| task.state() != ProcessState::Processed);
        let text = match why {
            Some(why) => format!("{} ({} v{}): {why}", task.order_id, task.workflow, task.workflow_version),
            None => format!("{} ({} v{})", task.order_id, task.workflow, task.workflow_version),
        };
        self.tell(
            state,
            &text,
            serde_json::json!({ "order_id": task.order_id.as_str(), "state": state, "reason": why }),
        );
    }

    /// The step's name, where the run's definitions have the task's workflow.
    fn step_name(&self, task: &TaskRecord, step: u32) -> String {
        let named =
            self.workflows.as_ref().and_then(|w| w.get_version(&task.workflow, task.workflow_version));
        named.and_then(|wf| wf.step(step)).map_or_else(|| format!("step {step}"), |s| s.name.clone())
    }

    /// A task that starts or stops waiting (`wait_event`).
    fn waits(&self, task: &TaskRecord) {
        if let Some((what, text, fields)) = wait_event(task, |step| self.step_name(task, step)) {
            self.tell(what, &text, fields);
        }
    }

    /// The simulated service's outside party was given a callback step's token: by hand,
    /// the command that completes it; else, that the party will.
    pub fn kept_token(&self, kept: &crate::remote_sim::KeptToken, by_hand: bool) {
        let complete = format!("sasctl tasks complete {}", kept.token);
        let text = match by_hand {
            true => format!(
                "{} at {} waits for you (the simulated party sends its heartbeats for up to 15 \
                 minutes): {complete}  (or: sasctl tasks fail TOKEN --reason ...)",
                kept.order_id, kept.step
            ),
            false => format!("{} at {}: the simulated party completes it soon", kept.order_id, kept.step),
        };
        self.tell(
            "callback",
            &text,
            json!({"order_id": kept.order_id, "step": kept.step, "attempt": kept.attempt,
                   "token": by_hand.then_some(&kept.token), "complete": by_hand.then_some(complete)}),
        );
    }

    /// An app's cancel arrived on the orders queue.
    pub fn cancel_asked(&self, cancel: &CancelRequest) {
        let by = cancel.actor_name();
        self.tell(
            "cancel",
            &format!("{} asked by {by}: {}", cancel.cancel, crate::text::one_line(&cancel.reason, 200)),
            serde_json::json!({ "order_id": cancel.cancel.as_str(), "by": by, "reason": cancel.reason }),
        );
    }

    /// Whether a cancel of `order` landed since this was last asked (and forgets it).
    pub fn cancel_landed(&self, order: &OrderId) -> bool {
        self.counts().cancels_landed.remove(order)
    }

    /// An app's cancel was refused: the task stays as it was.
    pub fn cancel_refused(&self, cancel: &CancelRequest, why: &str) {
        self.tell(
            "cancel_refused",
            &format!("{}: {why}", cancel.cancel),
            serde_json::json!({ "order_id": cancel.cancel.as_str(), "by": cancel.actor_name(), "reason": why }),
        );
    }
}

/// The cancel a landed write applied, if it did: its timeline's newest entry is a cancel,
/// and the order was live before it (a later write on a cancelled task is not a cancel).
fn cancel_in(task: &TaskRecord, was: Option<ProcessState>) -> Option<&sas::domain::Entry> {
    let live_before = was.is_none_or(|s| matches!(s, ProcessState::Pending | ProcessState::Processing));
    let newest = task.timeline.last()?;
    let cancel = matches!(newest.what, Happened::Moved(Trigger::Cancel | Trigger::CancelUndone));
    (cancel && live_before).then_some(newest)
}

/// A `cancelled` line: the order, the move, who asked and why.
fn cancelled_text(task: &TaskRecord, was: Option<ProcessState>, entry: &sas::domain::Entry) -> String {
    let from = was.map_or("live", ProcessState::as_str);
    let mut text = format!(
        "{} ({} v{}): {from} -> {}",
        task.order_id,
        task.workflow,
        task.workflow_version,
        task.state().as_str()
    );
    if let Some(by) = &entry.by {
        text.push_str(&format!(", by {by}"));
    }
    if let Some(why) = &entry.note {
        text.push_str(&format!(": {}", crate::text::one_line(why, 200)));
    }
    text
}

impl Tap for EventLog {
    fn landed(&self, task: &TaskRecord, how: Landed) {
        let terminal = task.state().is_terminal();
        let was = {
            let mut counts = self.counts();
            if how == Landed::Inserted {
                counts.summary.accepted += 1;
            }
            let was = counts.moved(&task.order_id, task.state());
            if how == Landed::Replaced && cancel_in(task, was).is_some() {
                counts.cancels_landed.insert(task.order_id.clone());
            }
            was
        };
        if let Some(entry) = cancel_in(task, was).filter(|_| how == Landed::Replaced) {
            self.tell(
                "cancelled",
                &cancelled_text(task, was, entry),
                serde_json::json!({
                    "order_id": task.order_id.as_str(), "from": was.map(ProcessState::as_str),
                    "to": task.state().as_str(), "by": entry.by, "reason": entry.note,
                }),
            );
        }
        if how == Landed::Inserted {
            self.tell(
                "accepted",
                &format!("{} ({} v{})", task.order_id, task.workflow, task.workflow_version),
                serde_json::json!({
                    "order_id": task.order_id.as_str(), "workflow": task.workflow,
                    "workflow_version": task.workflow_version,
                }),
            );
        } else if terminal {
            self.ended(task);
        } else {
            self.waits(task);
        }
    }
}

#[async_trait]
impl Alerts for EventLog {
    async fn raise(&self, alert: &OperatorAlert) -> Result<(), AlertError> {
        self.counts().summary.alerts += 1;
        self.tell(
            "alert",
            &format!("{}: {}", alert.order_id, alert.reason),
            serde_json::json!({ "order_id": alert.order_id.as_str(), "reason": alert.reason }),
        );
        Ok(())
    }
}

impl PumpEvents for EventLog {
    fn receive_failed(&self, queue: &QueueUrl, error: &QueueError, retry_in: Duration) {
        let error = crate::endpoint::one_line(&error.to_string());
        self.tell(
            "trouble",
            &format!("receive from {} failed, again in {retry_in:?}: {error}", queue_name(&queue.0)),
            serde_json::json!({ "queue": queue.0, "error": error }),
        );
    }

    fn batch_done(&self, queue: &QueueUrl, _report: &BatchReport, failed_deletes: usize) {
        *self.counts().summary.invocations.entry(queue_name(&queue.0).to_owned()).or_default() += 1;
        if failed_deletes > 0 {
            self.tell(
                "trouble",
                &format!(
                    "{failed_deletes} handled messages of {} not deleted: they come back after the visibility timeout",
                    queue_name(&queue.0)
                ),
                serde_json::json!({ "queue": queue.0, "failed_deletes": failed_deletes }),
            );
        }
    }
}

/// The line a task that starts or stops waiting is told with: a timer, the outside, a
/// place at a limited agent, or a remote's Retry-After. `name`: a step's name.
fn wait_event(
    task: &TaskRecord,
    name: impl Fn(u32) -> String,
) -> Option<(&'static str, String, serde_json::Value)> {
    let order = task.order_id.as_str();
    let at = |ms: u64| crate::tasks::render::iso(sas::domain::Timestamp(ms));
    let (what, text, fields) = match &task.last_cause {
        Cause::Slept { step, wake_at } => {
            let name = name(*step);
            (
                "waiting",
                format!("{order} sleeps at {name} until {}", at(wake_at.0)),
                json!({"step": name, "wake_at": at(wake_at.0)}),
            )
        }
        Cause::Started { step } => {
            let name = name(*step);
            let timeout = task.callback().map(|c| at(c.timeout_at.0));
            let until = timeout.as_deref().map_or_else(String::new, |t| format!(" (timeout {t})"));
            (
                "waiting",
                format!("{order} waits for the outside at {name}{until}"),
                json!({"step": name, "timeout_at": timeout}),
            )
        }
        Cause::Woke { step, late_ms } => {
            let name = name(*step);
            (
                "woke",
                format!("{order} woke at {name}, {late_ms} ms after its time"),
                json!({"step": name, "late_ms": late_ms}),
            )
        }
        Cause::Completed { step } => {
            let name = name(*step);
            (
                "woke",
                format!("{order}'s callback at {name} completed"),
                json!({"step": name, "completed": true}),
            )
        }
        Cause::Queued { step, ticket } => {
            let name = name(*step);
            let gate = task.queued().map(|q| q.agent.clone()).unwrap_or_default();
            (
                "queued",
                format!("{order} waits for a place at {gate} for {name} (ticket {ticket})"),
                json!({"step": name, "gate": gate, "ticket": ticket}),
            )
        }
        Cause::Throttled { step, retry_after_ms, .. } => {
            let name = name(*step);
            (
                "throttled",
                format!(
                    "{order} throttled at {name}: tried again in {:.1} s",
                    *retry_after_ms as f64 / 1_000.0
                ),
                json!({"step": name, "retry_after_ms": retry_after_ms}),
            )
        }
        Cause::StoreThrottled { step, .. } => {
            let name = name(*step);
            let until = task.deadline().map(|d| at(d.0)).unwrap_or_default();
            (
                "throttled",
                format!(
                    "{order} throttled by the state store at {name}: tried again after a backoff, no failure counted before {until}"
                ),
                json!({"step": name, "store": true, "deadline": until}),
            )
        }
        _ => return None,
    };
    let mut fields = fields;
    fields["order_id"] = json!(order);
    Some((what, text, fields))
}

/// The queues the handlers keep rejected messages through, telling the event log of each
/// one kept (with its reason) once it is in its dead-letter queue.
pub struct RejectionTap {
    pub inner: Arc<dyn Queues>,
    pub log: Arc<EventLog>,
    /// The callback DLQ: what is kept there is a completion the task refused (a token
    /// stale, forged or for a step that ended), counted as refused, not as a rejection.
    pub refused_at: QueueUrl,
}

impl RejectionTap {
    fn kept(&self, queue: &QueueUrl, message: &Outgoing) {
        let Some(reason) = message.attributes.get(REASON_ATTRIBUTE) else { return };
        let refused = *queue == self.refused_at;
        // The simulated party's heartbeats go on after a step is completed by hand: each
        // refused one is counted, not told.
        let heartbeat = refused && message.body.contains(r#""outcome":"heartbeat""#);
        {
            let mut counts = self.log.counts();
            match refused {
                true => counts.summary.callbacks_refused += 1,
                false => counts.summary.rejected += 1,
            }
        }
        if heartbeat {
            return;
        }
        self.log.tell(
            if refused { "refused" } else { "rejected" },
            &rejected_text(queue_name(&queue.0), &message.body, reason),
            serde_json::json!({
                "order_id": named_order(&message.body), "queue": queue.0, "reason": reason,
                "body": crate::text::redact_token(&message.body),
            }),
        );
    }
}

/// The order a kept message names, when its body can be read: an order's `order_id`, the
/// order a cancel names (as written, even when not a valid id: that may be why), or the
/// order a callback message's token is for.
fn named_order(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let Some(id) = v.get("order_id").or_else(|| v.get("cancel")) else {
        return crate::text::token_order(body);
    };
    Some(crate::text::one_line(id.as_str()?, 80))
}

/// A `rejected` line: the order, when the body names one, where it was kept, and why.
fn rejected_text(queue: &str, body: &str, reason: &str) -> String {
    match named_order(body) {
        Some(order) => format!("{order} kept in {queue}: {reason}"),
        None => format!("kept in {queue}: {reason}"),
    }
}

#[async_trait]
impl Queues for RejectionTap {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        let told = messages.clone();
        self.inner.send_batch(queue, messages).await?;
        told.iter().for_each(|m| self.kept(queue, m));
        Ok(())
    }
    async fn send(&self, queue: &QueueUrl, message: Outgoing) -> Result<(), QueueError> {
        let told = message.clone();
        self.inner.send(queue, message).await?;
        self.kept(queue, &told);
        Ok(())
    }
    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Vec<Result<(), QueueError>> {
        let told = messages.clone();
        let results = self.inner.send_each(queue, messages).await;
        for (m, r) in told.iter().zip(&results) {
            if r.is_ok() {
                self.kept(queue, m);
            }
        }
        results
    }
}

/// The orders function as `up` runs it: the submission handler, telling the event log of
/// each app's cancel when it first arrives and, when it was refused, why. An applied
/// cancel is told by the store's tap; a refused one changes nothing a tap would see.
#[derive(Clone)]
pub struct CancelWatch {
    pub submission: Submission,
    pub log: Arc<EventLog>,
}

impl CancelWatch {
    pub async fn handle(&self, message: Inbound) -> Result<(), HandlerError> {
        let Ok(Intake::Cancel(cancel)) = Intake::parse(&message.body) else {
            return self.submission.handle(message).await;
        };
        if message.receive_count <= 1 {
            self.log.cancel_asked(&cancel);
        }
        self.log.cancel_landed(&cancel.cancel);
        let sender = message.sender.as_deref().and_then(Sender::from_sender_id);
        let handled = self.submission.handle(message).await;
        if handled.is_ok()
            && !self.log.cancel_landed(&cancel.cancel)
            && let Some(why) = self.refusal(&cancel, sender.as_ref()).await
        {
            self.log.cancel_refused(&cancel, &why);
        }
        handled
    }

    /// Why the handler refused `cancel`: its decision, made again on the task as it is
    /// now. `None` when there is no task: the cancel was kept as bad input, and the
    /// rejection is told.
    async fn refusal(&self, cancel: &CancelRequest, sender: Option<&Sender>) -> Option<String> {
        let (deps, settings) = (&self.submission.deps, &self.submission.settings);
        let task = match deps.store.task(&cancel.cancel).await {
            Ok(task) => task?,
            Err(e) => {
                let e = crate::endpoint::one_line(&e.to_string());
                return Some(format!("(the task could not be read again: {e})"));
            }
        };
        let by = cancel.actor_name();
        let actor = Actor { by: &by, why: &cancel.reason, seen: None, origin: Origin::App { sender } };
        let decided = settings
            .workflows
            .get_version(&task.workflow, task.workflow_version)
            .map(|wf| task.act(Act::Cancel, actor, deps.clock.now(), wf, &settings.policy));
        Some(match decided {
            Some(Err(refusal)) => refusal.to_string(),
            _ => format!("the task is {}", task.state().as_str()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::task;
    use sas::domain::Timestamp;

    /// An order counts once, in the state it is in now: one that failed, then was
    /// resubmitted and processed is processed, not also an error.
    #[test]
    fn orders_are_counted_by_their_latest_state() {
        let log = EventLog::quiet();
        use ProcessState::*;
        for (id, states) in [
            ("resubmitted", &[Pending, Processing, Error, Pending, Processing, Processed][..]),
            ("compensated", &[Pending, Processing, Error, Compensating, Compensated]),
            ("failed", &[Pending, Processing, Error]),
            ("moving", &[Pending, Processing]),
        ] {
            for (i, state) in states.iter().enumerate() {
                let how = if i == 0 { Landed::Inserted } else { Landed::Replaced };
                log.landed(&task(id, *state), how);
            }
        }
        // An order a previous run accepted, ended by this one.
        log.landed(&task("carried-on", Processed), Landed::Replaced);
        let c = log.summary();
        assert_eq!(
            (c.accepted, c.processed, c.error, c.compensated, c.in_flight),
            (4, 2, 1, 1, 1),
            "{}",
            c.line()
        );
    }

    #[test]
    fn a_rejection_names_its_order_when_the_body_does() {
        let dlq = "p-orders-dlq";
        assert_eq!(
            rejected_text(dlq, r#"{"order_id":"bad-1","customer_id":"c","items":[]}"#, "items is empty"),
            "bad-1 kept in p-orders-dlq: items is empty"
        );
        assert_eq!(
            rejected_text(dlq, r#"{"cancel":"o-9","reason":"r"}"#, "no order o-9 to cancel (looked 3 times)"),
            "o-9 kept in p-orders-dlq: no order o-9 to cancel (looked 3 times)"
        );
        assert_eq!(
            rejected_text(dlq, "{not json", "not a valid message"),
            "kept in p-orders-dlq: not a valid message"
        );
        assert_eq!(
            rejected_text(dlq, r#"{"order_id":12}"#, "invalid type"),
            "kept in p-orders-dlq: invalid type"
        );
    }

    #[test]
    fn an_applied_cancel_is_told_once_and_remembered_for_its_message() {
        let log = EventLog::quiet();
        log.landed(&task("slow-1", ProcessState::Processing), Landed::Inserted);
        let mut cancelled = task("slow-1", ProcessState::Compensating);
        std::sync::Arc::make_mut(&mut cancelled.timeline).push(sas::domain::Entry {
            at: Timestamp(1_700_000_001_000),
            what: Happened::Moved(Trigger::Cancel),
            step: 0,
            attempt: 1,
            step_attempt: None,
            note: Some("too slow".into()),
            by: Some("app:shop".into()),
        });
        let entry = cancel_in(&cancelled, Some(ProcessState::Processing)).expect("a cancel");
        assert_eq!(
            cancelled_text(&cancelled, Some(ProcessState::Processing), entry),
            "slow-1 (w v1): Processing -> Compensating, by app:shop: too slow"
        );
        log.landed(&cancelled, Landed::Replaced);
        // A later write of the cancelled task is not a second cancel.
        assert!(cancel_in(&cancelled, Some(ProcessState::Compensating)).is_none());
        log.landed(&cancelled, Landed::Replaced);
        let id = OrderId::parse("slow-1").unwrap();
        assert!(log.cancel_landed(&id));
        assert!(!log.cancel_landed(&id), "told once");
        // Nothing else is a cancel.
        assert!(cancel_in(&task("slow-1", ProcessState::Processing), Some(ProcessState::Pending)).is_none());
    }

    #[test]
    fn waits_are_told_with_the_step_name_and_other_changes_are_not() {
        let name = |step: u32| format!("s{step}");
        let mut t = task("o-1", ProcessState::Pending);
        t.last_cause = Cause::Slept { step: 1, wake_at: Timestamp(1_700_000_060_000) };
        let (what, text, fields) = wait_event(&t, name).expect("a sleep is told");
        assert_eq!((what, text.as_str()), ("waiting", "o-1 sleeps at s1 until 2023-11-14T22:14:20.000Z"));
        assert_eq!(fields["order_id"], "o-1");
        t.last_cause = Cause::Woke { step: 1, late_ms: 40 };
        assert_eq!(wait_event(&t, name).unwrap().1, "o-1 woke at s1, 40 ms after its time");
        t.last_cause = Cause::Queued { step: 0, ticket: 7 };
        assert_eq!(wait_event(&t, name).unwrap().0, "queued");
        t.last_cause = Cause::Throttled { step: 0, action: sas::domain::Action::Do, retry_after_ms: 2_500 };
        assert_eq!(wait_event(&t, name).unwrap().1, "o-1 throttled at s0: tried again in 2.5 s");
        t.last_cause = Cause::Claimed { step: 0, action: sas::domain::Action::Do };
        assert!(wait_event(&t, name).is_none(), "a claim is no wait");
    }
}
