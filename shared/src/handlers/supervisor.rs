//! supervisor: finds tasks whose deadline passed (through the due index, never a scan)
//! and recovers each with one conditional write, so concurrent supervisors act once.

use std::collections::HashSet;

use super::coalesce::join_round;
use super::{Deps, HandlerError, Settings, Transition, perform, transition};
use crate::domain::{OrderId, ProcessState, Refusal, Timestamp, Trigger};
use crate::ports::Metric;

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
    /// Index pages read, each one round of recoveries.
    pub pages: usize,
    /// The run stopped at its time budget with due tasks perhaps left: the next run
    /// carries on.
    pub cut_short: bool,
}

/// What one run may do. Its work grows with what is due, its time does not: each full
/// page doubles the next, up to `max_page_size` recoveries in one round, and no page
/// starts unless the longest round so far and `margin_ms` still fit before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBudget {
    /// Due entries read by a run's first page: a run with fewer due costs one query of
    /// this many, as it always did.
    pub page_size: usize,
    /// The largest page, so the most recoveries one round has in flight: each holds a
    /// connection to DynamoDB, and a Lambda function has 1,024 file descriptors.
    pub max_page_size: usize,
    /// How long a run may take when whoever invoked it set no deadline (the embedded
    /// backend, `sasctl dev`, the simulation); on Lambda, the invocation's deadline.
    pub run_ms: u64,
    /// Kept back before the deadline, for the last round's stragglers and the report.
    pub margin_ms: u64,
}

impl Default for SweepBudget {
    fn default() -> Self {
        // 60 s is the function's timeout (template.yaml) and the default period: a run
        // ends before the next one starts.
        SweepBudget { page_size: 100, max_page_size: 500, run_ms: 60_000, margin_ms: 5_000 }
    }
}

impl SweepBudget {
    /// The page after a full one of `size`.
    fn next_page(&self, size: usize) -> usize {
        size.saturating_mul(2).clamp(self.page_size, self.max_page_size.max(self.page_size))
    }

    /// Whether another page may start at `now`, with `longest_round_ms` the longest round
    /// so far, in a run that must end by `deadline`.
    fn another_page(&self, now: Timestamp, longest_round_ms: u64, deadline: Timestamp) -> bool {
        now.plus_ms(longest_round_ms + self.margin_ms) < deadline
    }
}

#[derive(Clone)]
pub struct Supervisor {
    pub deps: Deps,
    pub settings: Settings,
    pub budget: SweepBudget,
}

impl Supervisor {
    pub fn new(deps: Deps, settings: Settings) -> Supervisor {
        Supervisor { deps, settings, budget: SweepBudget::default() }
    }

    /// One run, with `budget.run_ms` from now as its deadline.
    pub async fn sweep(&self) -> Result<SweepReport, HandlerError> {
        let deadline = self.deps.clock.now().plus_ms(self.budget.run_ms);
        self.sweep_until(deadline).await
    }

    /// One run that must end by `deadline` (a Lambda invocation's). Its first page always
    /// runs, so every run makes progress.
    pub async fn sweep_until(&self, deadline: Timestamp) -> Result<SweepReport, HandlerError> {
        let mut report = SweepReport::default();
        // Entries this run has examined. The ones it skipped (moved by someone else since
        // the index was read, or an index entry lagging a write) or failed on may still be
        // in the index: each page asks for that many more entries and leaves them out, so
        // they neither spin the run nor stop it while other tasks are still due.
        let mut examined: HashSet<OrderId> = HashSet::new();
        let mut lingering = 0;
        let mut size = self.budget.page_size;
        let mut longest_round_ms = 0;
        loop {
            let now = self.deps.clock.now();
            if report.pages > 0 && !self.budget.another_page(now, longest_round_ms, deadline) {
                report.cut_short = true;
                self.deps.metrics.record(Metric::SweepCutShort, 1);
                break;
            }
            let limit = size + lingering;
            let page = self.deps.store.due(now, limit).await?;
            report.pages += 1;
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
            longest_round_ms = longest_round_ms.max(self.deps.clock.now().millis_since(now));
            if exhausted || due.is_empty() {
                break;
            }
            examined.extend(due);
            size = self.budget.next_page(size);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_page_doubles_the_next_up_to_the_largest() {
        let b = SweepBudget::default();
        let sizes: Vec<usize> =
            std::iter::successors(Some(b.page_size), |&s| Some(b.next_page(s))).take(6).collect();
        assert_eq!(sizes, [100, 200, 400, 500, 500, 500]);
        let tiny = SweepBudget { page_size: 1, max_page_size: 1, ..b };
        assert_eq!(tiny.next_page(1), 1);
    }

    #[test]
    fn a_page_starts_only_while_its_round_and_the_margin_fit_before_the_deadline() {
        let b = SweepBudget { margin_ms: 5_000, ..SweepBudget::default() };
        let deadline = Timestamp(60_000);
        assert!(b.another_page(Timestamp(0), 0, deadline));
        assert!(b.another_page(Timestamp(50_000), 4_999, deadline));
        assert!(!b.another_page(Timestamp(50_000), 5_000, deadline));
        assert!(!b.another_page(Timestamp(55_000), 0, deadline));
        assert!(!b.another_page(Timestamp(70_000), 0, deadline), "past the deadline");
    }
}
