//! `sasctl dev`'s checker: the invariants shared with the simulation over the run's
//! records (`sas_sim::invariants`: the write log, final records, alerts and the remote
//! service's ledger), plus what only a `dev` run shows: what was sent and what was
//! kept, the internal dead-letter queues, the status queue and whether it finished.

use std::collections::{BTreeSet, HashMap};

use sas::domain::{OrderStatus, ProcessState, StatusUpdate};
use sas::handlers::REASON_ATTRIBUTE;
pub use sas_sim::invariants::{Invariant, Violation};
use sas_sim::invariants::{Records, check_records};

use crate::dev::DevOutcome;

/// Every violation found; empty means the run upheld every invariant.
pub fn check(run: &DevOutcome) -> Vec<Violation> {
    let mut found = check_records(&Records {
        workflows: &run.workflows,
        policy: &run.options.policy(),
        tasks: &run.tasks,
        writes: &run.writes,
        alerts: &run.alerts,
        ledger: &run.ledger,
    });
    let mut add = |invariant: Invariant, detail: String| found.push(Violation::new(invariant, detail));

    // No loss: every valid order has a task; every bad message is kept with its reason.
    let tasks: BTreeSet<&str> = run.tasks.iter().map(|t| t.order_id.as_str()).collect();
    for (id, _) in &run.sent.orders {
        if !tasks.contains(id.as_str()) {
            add(Invariant::AcceptedOrRejected, format!("order {id} was sent but has no task"));
        }
    }
    if run.tasks.len() != run.sent.orders.len() {
        add(
            Invariant::AcceptedOrRejected,
            format!("{} tasks for {} valid orders", run.tasks.len(), run.sent.orders.len()),
        );
    }
    let mut kept: Vec<_> = run.kept.iter().collect();
    for (body, want) in &run.sent.bad {
        let at = kept.iter().position(|m| {
            &m.body == body && m.attributes.get(REASON_ATTRIBUTE).is_some_and(|r| r.contains(want))
        });
        match at {
            Some(i) => {
                kept.swap_remove(i);
            }
            None => add(
                Invariant::BadInputKept,
                format!("bad message {:?} not kept with a reason containing {want:?}", truncate(body)),
            ),
        }
    }
    // At-least-once delivery may hand the submission a bad message twice; it is kept
    // twice. Anything else kept was never sent as bad: an order lost to the DLQ.
    for m in kept {
        if !run.sent.bad.iter().any(|(body, _)| body == &m.body) {
            add(
                Invariant::AcceptedOrRejected,
                format!("unexpected kept message {:?}: {:?}", truncate(&m.body), m.attributes),
            );
        }
    }
    if run.timed_out {
        add(Invariant::TerminalOnce, format!("run stopped after {:?} with orders still moving", run.elapsed));
    }
    for m in &run.internal_dead_letters {
        add(
            Invariant::NoInternalReject,
            format!("{:?}: {:?}", truncate(&m.body), m.attributes.get(REASON_ATTRIBUTE)),
        );
    }

    // Each terminal order's last final status on its reply_to queue matches its state.
    let mut final_status: HashMap<String, OrderStatus> = HashMap::new();
    for m in &run.statuses {
        if let Ok(update) = serde_json::from_str::<StatusUpdate>(&m.body)
            && let (Some(id), true) = (update.order_id, is_final(update.status))
        {
            final_status.insert(id.as_str().to_owned(), update.status);
        }
    }
    for t in run.tasks.iter().filter(|t| t.state.is_terminal()) {
        let want = match t.state {
            ProcessState::Processed => OrderStatus::Processed,
            ProcessState::Compensated => OrderStatus::Compensated,
            _ => OrderStatus::Failed,
        };
        if final_status.get(t.order_id.as_str()) != Some(&want) {
            add(
                Invariant::Status,
                format!(
                    "order {} is {:?} but its final status was {:?}",
                    t.order_id,
                    t.state,
                    final_status.get(t.order_id.as_str())
                ),
            );
        }
    }
    found
}

fn is_final(s: OrderStatus) -> bool {
    matches!(s, OrderStatus::Processed | OrderStatus::Compensated | OrderStatus::Failed)
}

fn truncate(s: &str) -> String {
    if s.len() <= 80 {
        s.to_owned()
    } else {
        format!("{}… ({} bytes)", &s[..s.floor_char_boundary(80)], s.len())
    }
}
