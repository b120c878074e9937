//! supervisor: finds tasks whose deadline passed (through the due index, never a scan)
//! and recovers each with one conditional write, so concurrent supervisors act once.

use std::collections::HashSet;

use super::coalesce::join_round;
use super::{Deps, HandlerError, Settings, Transition, perform, transition};
use crate::domain::{OrderId, ProcessState, Refusal, Trigger};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Due entries read from the index.
    pub examined: usize,
    /// Put back to wait for another attempt.
    pub retried: usize,
    /// Waiting timers whose time came, woken (no failure counted).
    pub woke: usize,
    /// Given up on: Error, or compensation started or finished.
    pub gave_up: usize,
    /// Moved by someone else between the index read and our write.
    pub skipped: usize,
    /// Left for the next run (an infrastructure error on that task).
    pub errors: usize,
}

#[derive(Clone)]
pub struct Supervisor {
    pub deps: Deps,
    pub settings: Settings,
    /// Due entries read per index page.
    pub page_size: usize,
    /// Pages per run: bounds one run's work; the next run carries on.
    pub max_pages: usize,
}

impl Supervisor {
    pub fn new(deps: Deps, settings: Settings) -> Supervisor {
        Supervisor { deps, settings, page_size: 100, max_pages: 50 }
    }

    pub async fn sweep(&self) -> Result<SweepReport, HandlerError> {
        let mut report = SweepReport::default();
        // Entries this run has examined. The ones it skipped (moved by someone else since
        // the index was read, or an index entry lagging a write) or failed on may still be
        // in the index: each page asks for that many more entries and leaves them out, so
        // they neither spin the run nor stop it while other tasks are still due.
        let mut examined: HashSet<OrderId> = HashSet::new();
        let mut lingering = 0;
        for _ in 0..self.max_pages {
            let now = self.deps.clock.now();
            let limit = self.page_size + lingering;
            let page = self.deps.store.due(now, limit).await?;
            // A short page means the index holds nothing more that is due.
            let exhausted = page.len() < limit;
            let due: Vec<OrderId> = page.into_iter().filter(|id| !examined.contains(id)).collect();
            report.examined += due.len();
            // One round per page: a `SendCoalescer` sends the page's re-enqueues together.
            let outcomes = join_round(due.iter().map(|id| self.recover(id))).await;
            for outcome in outcomes {
                match outcome {
                    Ok(Some((_, Trigger::Retry))) => report.retried += 1,
                    Ok(Some((ProcessState::Waiting, _))) => report.woke += 1,
                    Ok(Some(_)) => report.gave_up += 1,
                    Ok(None) => {
                        report.skipped += 1;
                        lingering += 1;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "recovery failed; the next run retries it");
                        report.errors += 1;
                        lingering += 1;
                    }
                }
            }
            if exhausted || due.is_empty() {
                break;
            }
            examined.extend(due);
        }
        self.deps.metrics.flush();
        tracing::info!(?report, "supervisor sweep");
        Ok(report)
    }

    /// The state the task was found in and the trigger that moved it, if it moved.
    async fn recover(&self, order_id: &OrderId) -> Result<Option<(ProcessState, Trigger)>, HandlerError> {
        let policy = self.settings.policy;
        let jitter = self.deps.random.jitter();
        // Decided on a fresh read: the index entry may be stale.
        match transition(&self.deps, &self.settings, order_id, |task, wf, now| {
            task.recover(now, wf, &policy, jitter)
        })
        .await?
        {
            Transition::Applied { before, decision } => {
                tracing::info!(
                    order_id = %order_id, step = before.step, attempt = before.attempt,
                    failure_count = decision.next.failure_count, trigger = ?decision.trigger, "recovered"
                );
                perform(&self.deps, &self.settings, &decision).await?;
                Ok(Some((before.state(), decision.trigger)))
            }
            Transition::Refused(Refusal::NotDue { .. }) | Transition::NoSuchTask => Ok(None),
            Transition::Refused(refusal) => Err(HandlerError::Reject(refusal.to_string())),
        }
    }
}
