//! What a waiting task waits for, as the listing and `show` give it: a timer's wake time,
//! a callback's wait (started, times out, heartbeats, next due; never the token's digest),
//! a place in its agent's gate.

use sas::domain::{Awaiting, TaskRecord, Timestamp, Workflow};
use serde_json::{Value, json};

use super::basics::{iso, step_name};

/// What a Waiting task waits for: `timer` (its wake time) or `callback` (the outside).
pub fn waits_for(task: &TaskRecord) -> Option<&'static str> {
    if task.state() != sas::domain::ProcessState::Waiting {
        return None;
    }
    match (task.wake_at(), &task.callback()) {
        (Some(_), _) => Some("timer"),
        (None, Some(_)) => Some("callback"),
        (None, None) => None,
    }
}

/// What a task waiting for a place in its agent's gate waits for, and how long it has
/// waited by `now`: `waiting for a place at payment (ticket 41, 3.2 s)`.
pub fn queued_line(task: &TaskRecord, now: Timestamp) -> Option<String> {
    let q = task.queued()?;
    let waited = now.millis_since(q.since) as f64 / 1_000.0;
    Some(format!("waiting for a place at {} (ticket {}, {waited:.1} s)", q.agent, q.ticket))
}

/// When a throttled task is tried again: its agent's service answered 429 or 503 with
/// Retry-After, and the task (no lease, Pending or Compensating) waits for the retry that
/// was sent with that delay from the move's time.
pub fn throttled_until(task: &TaskRecord) -> Option<Timestamp> {
    match task.last_cause {
        sas::domain::Cause::Throttled { retry_after_ms, .. }
            if task.locked_by().is_none() && !task.state().is_terminal() =>
        {
            Some(task.updated_at.plus_ms(retry_after_ms))
        }
        _ => None,
    }
}

/// A length of time as people write it: `90s`, `15m`, `1h`, `1500 ms`.
pub fn span(ms: u64) -> String {
    match ms {
        0 => "0 ms".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}

/// A callback step's wait as `show` prints it, one field a line: what it waits for, and
/// when it started, times out, last heard and is next due. Never its digest.
pub(super) fn callback_lines(
    task: &TaskRecord,
    cb: &Awaiting,
    wf: Option<&Workflow>,
    now: Timestamp,
) -> Vec<(&'static str, String)> {
    let state = task.state();
    let step = match step_name(wf, cb.step) {
        Some(name) => format!("step {} {name}", cb.step),
        None => format!("step {}", cb.step),
    };
    let mut out = vec![(
        "waits for",
        format!(
            "a callback on {step}, attempt {}: the token sas1.{}.{}.{}.… completes it",
            callback_step_attempt(task, cb),
            task.order_id,
            cb.step,
            cb.attempt
        ),
    )];
    out.push((
        "started",
        match cb.started_at {
            Some(at) => format!("{} (the agent began the work; claimed {})", iso(at), iso(cb.since)),
            None if state == sas::domain::ProcessState::Processing => {
                format!("not yet: claimed {}, the agent has not answered", iso(cb.since))
            }
            None => format!("claimed {}", iso(cb.since)),
        },
    ));
    out.push(("times out at", iso(cb.timeout_at)));
    out.push((
        "heartbeat",
        match (cb.heartbeat_ms, cb.last_heartbeat) {
            (None, _) => "none asked for".to_owned(),
            (Some(ms), Some(last)) => format!("every {}, last {}", span(ms), iso(last)),
            (Some(ms), None) => format!("every {}, none yet", span(ms)),
        },
    ));
    let due = cb.due();
    let what = if cb.heartbeat_ms.is_some() && due < cb.timeout_at {
        "a heartbeat or the completion"
    } else {
        "the completion"
    };
    let passed = if due <= now { ", passed: the supervisor fails the attempt" } else { "" };
    out.push(("next due", format!("{} ({what}{passed})", iso(due))));
    out
}

/// The step's own attempt a callback waits on: the task's `step_attempts`, the wait being
/// the task's current step and attempt (the record holds no other); the token's counter
/// if ever not.
pub(super) fn callback_step_attempt(task: &TaskRecord, cb: &Awaiting) -> u32 {
    if (cb.step, cb.attempt) == (task.step, task.attempt) { task.step_attempts } else { cb.attempt }
}

/// A callback step's wait as `show --json` gives it: the record's `callback` with times
/// in ISO-8601, its step's name, its step's own attempt (`task_attempt` the token's
/// counter) and when it is next due, without the token's digest.
pub fn callback_json(task: &TaskRecord, cb: &Awaiting, wf: Option<&Workflow>) -> Value {
    json!({
        "step": cb.step,
        "step_name": step_name(wf, cb.step),
        "attempt": callback_step_attempt(task, cb),
        "task_attempt": cb.attempt,
        "since": iso(cb.since),
        "started_at": cb.started_at.map(iso),
        "timeout_at": iso(cb.timeout_at),
        "heartbeat_ms": cb.heartbeat_ms,
        "last_heartbeat": cb.last_heartbeat.map(iso),
        "due": iso(cb.due()),
    })
}

#[cfg(test)]
mod waiting_tests {
    use super::*;
    use crate::tasks::render::summary::table;
    use crate::tasks::render::{next_commands, show_json, show_text, task_summary_json};
    use sas::domain::{Phase, Policy, ProcessState, WaitingFor};

    fn task(state: ProcessState) -> TaskRecord {
        crate::fixtures::task("o-1", state)
    }

    /// A timer's task shows when it wakes, in the listing, `show` and their JSON, and can
    /// be cancelled.
    #[test]
    fn a_waiting_task_shows_its_wake_time() {
        let t = task(ProcessState::Waiting)
            .with_phase(Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(1_700_000_060_000) }));
        let listed = table(&[(&t, None)]);
        assert!(listed.contains("Waiting until 2023-11-14T22:14:20.000Z"), "{listed}");
        assert_eq!(task_summary_json(&t, None)["wake_at"], "2023-11-14T22:14:20.000Z");
        let now = Timestamp(1_700_000_001_000);
        let text = show_text(&t, None, now, &[]);
        assert!(text.contains("  wakes at      2023-11-14T22:14:20.000Z (a timer step"), "{text}");
        assert_eq!(show_json(&t, None, now, &[])["wake_at"], "2023-11-14T22:14:20.000Z");
        assert_eq!(
            next_commands(&t, None, &Policy::default(), now, ""),
            ["sasctl tasks cancel o-1 --reason TEXT", "sasctl tasks pause o-1 --reason TEXT"]
        );
        // Any other task has no such field.
        let pending = task(ProcessState::Pending);
        assert!(task_summary_json(&pending, None).get("wake_at").is_none());
        assert!(show_json(&pending, None, now, &[]).get("wake_at").is_none());
    }
}

#[cfg(test)]
mod callback_tests {
    use super::*;
    use crate::tasks::render::summary::table;
    use crate::tasks::render::{next_commands, show_json, show_text, task_summary_json};
    use sas::domain::{Lease, LeaseToken, Phase, Policy, ProcessState, Step, WaitingFor};

    fn wf() -> Workflow {
        let mut approve = Step::compensable("approve", "approvals", "withdraw");
        approve.callback =
            Some(sas::domain::Callback { timeout_ms: 86_400_000, heartbeat_ms: Some(3_600_000) });
        Workflow::new("w", vec![Step::compensable("charge", "payment", "refund"), approve])
    }

    /// A task waiting at a callback step: started, one heartbeat heard.
    fn waiting() -> TaskRecord {
        let mut t = crate::fixtures::task("o-1", ProcessState::Waiting);
        t.step = 1;
        t.attempt = 2;
        t.step_attempts = 1;
        let cb = Awaiting {
            step: 1,
            attempt: 2,
            digest: "d1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gestd1gest0000".into(),
            timeout_at: Timestamp(1_700_086_400_000),
            heartbeat_ms: Some(3_600_000),
            last_heartbeat: Some(Timestamp(1_700_000_600_000)),
            started_at: Some(Timestamp(1_700_000_000_500)),
            since: Timestamp(1_700_000_000_000),
        };
        t.with_phase(Phase::waiting(WaitingFor::Callback(cb)))
    }

    #[test]
    fn show_says_what_a_callback_waits_for_and_when_it_is_due_never_its_digest() {
        let t = waiting();
        let now = Timestamp(1_700_000_700_000);
        let text = show_text(&t, Some(&wf()), now, &[]);
        for want in [
            "  waits for     a callback on step 1 approve, attempt 1: the token sas1.o-1.1.2.… completes it\n",
            "  started       2023-11-14T22:13:20.500Z (the agent began the work; claimed 2023-11-14T22:13:20.000Z)\n",
            "  times out at  2023-11-15T22:13:20.000Z\n",
            "  heartbeat     every 1h, last 2023-11-14T22:23:20.000Z\n",
            // The hour's interval and its floor (6 minutes) after the last heartbeat written.
            "  next due      2023-11-14T23:29:20.000Z (a heartbeat or the completion)\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let v = show_json(&t, Some(&wf()), now, &[]);
        assert_eq!(v["waits_for"], "callback");
        assert_eq!(
            v["callback"],
            json!({"step": 1, "step_name": "approve", "attempt": 1, "task_attempt": 2, "since": "2023-11-14T22:13:20.000Z",
                   "started_at": "2023-11-14T22:13:20.500Z", "timeout_at": "2023-11-15T22:13:20.000Z",
                   "heartbeat_ms": 3_600_000, "last_heartbeat": "2023-11-14T22:23:20.000Z",
                   "due": "2023-11-14T23:29:20.000Z"})
        );
        for shown in [text, v.to_string()] {
            assert!(!shown.contains("d1gest"), "the digest is shown: {shown}");
        }
        // Past its due, the supervisor fails the attempt.
        let late = show_text(&t, Some(&wf()), Timestamp(1_700_005_000_000), &[]);
        assert!(
            late.contains("(a heartbeat or the completion, passed: the supervisor fails the attempt)"),
            "{late}"
        );
    }

    #[test]
    fn a_callback_claimed_but_not_started_says_so() {
        let t = waiting();
        let mut cb = t.callback().unwrap().clone();
        cb.started_at = None;
        cb.last_heartbeat = None;
        cb.heartbeat_ms = None;
        let lease = Lease { token: LeaseToken(uuid::Uuid::from_u128(1)), complete_by: cb.timeout_at };
        let t = t.with_phase(Phase::Processing {
            due: cb.due(),
            lease,
            callback: Some(cb),
            stage: None,
            paused: false,
        });
        let text = show_text(&t, None, Timestamp(1_700_000_001_000), &[]);
        assert!(
            text.contains(
                "  waits for     a callback on step 1, attempt 1: the token sas1.o-1.1.2.… completes it\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  started       not yet: claimed 2023-11-14T22:13:20.000Z, the agent has not answered\n"
            ),
            "{text}"
        );
        assert!(text.contains("  heartbeat     none asked for\n"), "{text}");
        assert!(text.contains("  next due      2023-11-15T22:13:20.000Z (the completion)\n"), "{text}");
        // Not Waiting yet: the listing has nothing to say of it.
        assert!(show_json(&t, None, Timestamp(0), &[]).get("waits_for").is_none());
        assert!(task_summary_json(&t, None).get("waits_for").is_none());
    }

    #[test]
    fn the_listing_says_what_each_waiting_task_waits_for() {
        let cb = waiting();
        let timer = crate::fixtures::task("o-2", ProcessState::Waiting)
            .with_phase(Phase::waiting(WaitingFor::Timer { wake_at: Timestamp(1_700_000_060_000) }));
        let listed = table(&[(&cb, Some(&wf())), (&timer, None)]);
        assert!(listed.contains("Waiting for callback, due 2023-11-14T23:29:20.000Z"), "{listed}");
        assert!(listed.contains("Waiting until 2023-11-14T22:14:20.000Z"), "{listed}");
        let v = task_summary_json(&cb, Some(&wf()));
        assert_eq!((v["waits_for"].as_str(), v["callback_attempt"].as_u64()), (Some("callback"), Some(1)));
        assert_eq!(v["callback_task_attempt"], 2);
        assert_eq!(v["callback_due"], "2023-11-14T23:29:20.000Z");
        assert_eq!(task_summary_json(&timer, None)["waits_for"], "timer");
        // Whoever holds the token is shown how to use it.
        let next =
            next_commands(&cb, Some(&wf()), &Policy::default(), Timestamp(1_700_000_700_000), " --prefix p");
        assert_eq!(
            next,
            [
                "sasctl tasks cancel o-1 --reason TEXT --prefix p",
                "sasctl tasks pause o-1 --reason TEXT --prefix p",
                "sasctl tasks complete TOKEN --output JSON --prefix p",
                "sasctl tasks fail TOKEN --reason TEXT --prefix p",
                "sasctl tasks heartbeat TOKEN --prefix p"
            ]
        );
        assert_eq!(span(1_500), "1500 ms");
        assert_eq!(span(90_000), "90s");
        assert_eq!(span(604_800_000), "168h");
    }
}
#[cfg(test)]
mod flow_tests {
    use super::*;
    use crate::tasks::render::{show_json, show_text, table_at, task_summary_json};
    use sas::domain::{Entry, Happened, Policy, ProcessState, Step, Trigger};

    const T0: u64 = 1_700_000_000_000;

    fn wf() -> Workflow {
        Workflow::new("w", vec![Step::compensable("charge", "payment", "refund")])
    }

    /// A task that found payment's gate full at T0 + 1 s and took ticket 41, through the
    /// domain's own decision (its record and timeline as the scheduler writes them).
    fn queued() -> TaskRecord {
        let t = crate::fixtures::task("o-1", ProcessState::Pending);
        t.queue("payment", 41, Timestamp(T0 + 1_000), &Policy::default()).expect("a Pending task queues").next
    }

    #[test]
    fn the_listing_says_which_gate_a_task_waits_at_its_ticket_and_for_how_long() {
        let t = queued();
        let listed = table_at(&[(&t, Some(&wf()))], Timestamp(T0 + 4_200));
        assert!(listed.contains("Pending, waiting for a place at payment (ticket 41, 3.2 s)"), "{listed}");
        let v = task_summary_json(&t, Some(&wf()));
        assert_eq!(
            v["queued"],
            json!({"agent": "payment", "ticket": 41, "since": "2023-11-14T22:13:21.000Z"})
        );
        // A task that does not wait says nothing of it.
        let plain = crate::fixtures::task("o-2", ProcessState::Pending);
        assert!(task_summary_json(&plain, None).get("queued").is_none());
        assert!(!table_at(&[(&plain, None)], Timestamp(T0)).contains("place"));
    }

    #[test]
    fn show_gives_the_wait_and_a_timeline_that_reads_queued_and_throttled() {
        let mut t = queued();
        std::sync::Arc::make_mut(&mut t.timeline).push(Entry {
            at: Timestamp(T0 + 9_000),
            what: Happened::Moved(Trigger::Throttled),
            step: 0,
            attempt: 1,
            step_attempt: None,
            note: None,
            by: None,
        });
        let now = Timestamp(T0 + 2_500);
        let text = show_text(&t, Some(&wf()), now, &[]);
        assert!(
            text.contains(
                "  queued        waiting for a place at payment (ticket 41, 1.5 s), since 2023-11-14T22:13:21.000Z: \
                 the agent has no room; no failure counted\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "Queued        step 0 charge  attempt 0  waiting for a place at payment (its limits)\n"
            ),
            "{text}"
        );
        assert!(text.contains("Throttled     step 0 charge  attempt 1  the remote asked to wait"), "{text}");
        // Without the workflow, the entry still says what it was.
        assert!(show_text(&t, None, now, &[]).contains("waiting for a place at the step's agent"));
        let v = show_json(&t, Some(&wf()), now, &[]);
        assert_eq!(v["queued"]["waited_ms"], 1_500);
        assert_eq!(v["queued"]["ticket"], 41);
        assert_eq!(v["timeline"][1]["what"], "Queued");
        let ended = crate::fixtures::task("o-2", ProcessState::Processed);
        assert!(show_json(&ended, None, now, &[]).get("queued").is_none());
    }

    /// A task its agent's service throttled waits for its retry: the listing says until
    /// when (the move's time plus the Retry-After), and `--state queued` selects it.
    #[test]
    fn a_throttled_task_says_when_it_is_tried_again() {
        let mut t = crate::fixtures::task("o-3", ProcessState::Pending);
        t.updated_at = Timestamp(T0 + 5_000);
        t.last_cause =
            sas::domain::Cause::Throttled { step: 0, action: sas::domain::Action::Do, retry_after_ms: 2_000 };
        assert_eq!(super::throttled_until(&t), Some(Timestamp(T0 + 7_000)));
        let listed = table_at(&[(&t, Some(&wf()))], Timestamp(T0 + 6_000));
        assert!(listed.contains("Pending, throttled until 2023-11-14T22:13:27.000Z"), "{listed}");
        assert_eq!(task_summary_json(&t, Some(&wf()))["throttled_until"], "2023-11-14T22:13:27.000Z");
        // Claimed again since, or ended: no longer waiting for the pause.
        let ended = t.clone().with_phase(sas::domain::Phase::ended(ProcessState::Processed).unwrap());
        assert_eq!(super::throttled_until(&ended), None);
        assert!(task_summary_json(&queued(), None).get("throttled_until").is_none());
    }
}
