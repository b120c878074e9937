//! The summary a `dev` run ends with.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

use sas::domain::{Action, Cause, OrderId, ProcessState};
use sas::ports::Metric;

use crate::dev::DevOutcome;
use crate::endpoint::{Fate, Resources};
use crate::invariants::Violation;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The run's `--seed`: running again with it sends the same orders and gives each
    /// remote call the same answer (timing still varies: `sasctl dev --help`).
    pub seed: u64,
    pub workflow: String,
    pub orders_sent: usize,
    pub duplicates_sent: usize,
    pub bad_messages_sent: usize,
    pub accepted: usize,
    pub rejected_kept: usize,
    pub final_states: BTreeMap<String, usize>,
    pub agent_retries: u64,
    pub supervisor_recoveries: u64,
    pub supervisor_runs: u64,
    pub supervisor_period_ms: u64,
    pub stale_replies_dropped: u64,
    pub claims_lost: u64,
    pub compensations_started: u64,
    pub compensation_steps: u64,
    /// Every operator alert raised: the four below add up to it.
    pub alerts: usize,
    /// First alerts for an order that ended Error (every move to Error raises one).
    pub alerts_for_error: usize,
    /// First alerts for an order that ended Compensated: raised when the supervisor
    /// gave up on a step whose failure budget was spent and undoing began.
    pub alerts_for_compensated: usize,
    /// First alerts for an order not terminal when the run stopped.
    pub alerts_for_unfinished: usize,
    /// An alert raised again for the same order, step and state (alerts are at least
    /// once: one raised before a write that then lost a race is raised again).
    pub alerts_repeated: usize,
    pub remote_calls: u64,
    pub remote_hangs: u64,
    pub remote_transient_failures: u64,
    pub remote_refusals: u64,
    pub order_latency_ms: Percentiles,
    pub step_latency_ms: Percentiles,
    /// Timer steps that began to wait, and that woke.
    pub timers_started: u64,
    pub timers_woken: u64,
    /// Schedules that came for a timer before its time: nothing changed, and each was
    /// sent again for the wake time (not timers that woke early: none does).
    pub timer_schedules_early: u64,
    /// How long after its wake time each timer woke (on its delayed Schedule or the
    /// supervisor's sweep).
    pub timer_lateness_ms: Percentiles,
    /// Timers in brief: `woken`, `schedules_early` (schedules that came early, sent again
    /// for the wake time) and `max_late_ms` (the latest wake past its time; null when none
    /// woke).
    pub timers: Timers,
    /// Callback steps and the simulated outside party's word on them.
    pub callbacks: CallbackFigures,
    /// Every agent of the definition file: its limits beside what its simulated service
    /// saw (`remote_sim::Flights`), and how long its tasks waited for a place.
    pub agents: BTreeMap<String, AgentFigures>,
    /// The map steps of the run's workflows, by the map's name: its items beside its cap,
    /// as the records the run wrote show them (`map_figures`). Absent without a map.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub maps: BTreeMap<String, MapFigures>,
    pub elapsed_s: f64,
    pub orders_per_second: f64,
    pub violations: Vec<(String, String)>,
    /// The resources of a run against an endpoint (`--endpoint-url`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timers {
    /// Timer steps that woke.
    pub woken: u64,
    /// Schedules that came for a timer before its time: nothing changed; sent again.
    pub schedules_early: u64,
    /// The latest a timer woke after its wake time, in ms.
    pub max_late_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CallbackFigures {
    /// Completions (success or failure) from the outside that were applied: at most one
    /// per attempt.
    pub completed: u64,
    /// Completions and heartbeats that changed nothing: a second copy, an earlier
    /// attempt's token, a forged one, one past the callback's timeout or heartbeat, a
    /// heartbeat for a step already ended.
    pub refused: u64,
    /// Callback waits that lapsed: the timeout or a heartbeat passed with no word.
    pub timed_out: u64,
    /// Attempts whose call the outside party answered (the work started), by the word
    /// each drew: `success`, `failure`, `late` or `never`.
    pub attempts: BTreeMap<String, usize>,
    /// Attempts that waited: their agent's answer (the work started) was applied before
    /// the outside's word, and the task waited for it; a word that came first was taken
    /// while the agent's call was still in flight.
    pub waited: u64,
    /// Heartbeats applied.
    pub heartbeats: u64,
    /// Heartbeats acknowledged without a write: within the floor of the last one written.
    pub heartbeats_noted: u64,
    /// What the outside party sent that must change nothing, by kind: `late`,
    /// `second_copy`, `stale`, `forged`.
    pub bad_sent: BTreeMap<String, usize>,
}

/// One agent's flow control: its limits (null when unset) against its service's own
/// count, and its tasks' waits for a place in its gate.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AgentFigures {
    pub max_in_flight: Option<u32>,
    pub max_per_second: Option<u32>,
    /// Calls that reached the service.
    pub calls: u64,
    /// The most calls open at the service at one instant: from arrival until it answered
    /// or the agent's timeout closed the connection.
    pub max_in_flight_seen: u64,
    /// The most calls that arrived at the service within any one 1,000 ms window.
    pub max_per_second_seen: u64,
    /// Waits for a place: from a task's first arrival at the gate for a step (its first
    /// `Queued`) to its claim of that step. Only tasks that waited count.
    pub waiting_ms: Waiting,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Waiting {
    /// Waits that ended in a claim (a task waits once per limited step it runs).
    pub count: usize,
    /// Tasks that waited at least once.
    pub tasks: usize,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

impl Waiting {
    fn of(mut waits: Vec<u64>, tasks: usize) -> Waiting {
        waits.sort_unstable();
        // Nearest rank: the smallest wait at least `p` percent of waits are no longer than.
        let rank = |p: usize| (!waits.is_empty()).then(|| waits[(waits.len() * p).div_ceil(100).max(1) - 1]);
        Waiting { count: waits.len(), tasks, p50: rank(50), p90: rank(90), p99: rank(99), max: rank(100) }
    }
}

/// Each agent's figures: limits from the definitions, the service's own count from the
/// run's flights, and waits from the write log, where a claim that ends a wait is a
/// write whose record held a ticket before (`TaskRecord::queued`, its `since` the first
/// arrival) and holds a lease after.
pub fn agent_figures(run: &DevOutcome) -> BTreeMap<String, AgentFigures> {
    let mut waits: HashMap<&str, (Vec<u64>, HashSet<&OrderId>)> = HashMap::new();
    for w in &run.writes {
        let (Some(before), after) = (&w.before, &w.after) else { continue };
        if let (Some(q), None, Some(_)) = (&before.queued(), &after.queued(), &after.locked_by()) {
            // By agent: its places may be spread over several gates, and a per-key limit
            // adds a line of its own.
            let (ms, tasks) = waits.entry(sas::domain::gate::agent_of_gate(&q.agent)).or_default();
            ms.push(after.updated_at.millis_since(q.since));
            tasks.insert(&after.order_id);
        }
    }
    run.options
        .definitions
        .agents
        .iter()
        .map(|(name, def)| {
            let limits = def.limits();
            let seen = run.flights.get(name).cloned().unwrap_or_default();
            let waiting = waits
                .remove(name.as_str())
                .map(|(ms, tasks)| Waiting::of(ms, tasks.len()))
                .unwrap_or_default();
            let figures = AgentFigures {
                max_in_flight: limits.max_in_flight,
                max_per_second: limits.max_per_second,
                calls: seen.calls,
                max_in_flight_seen: seen.max_in_flight,
                max_per_second_seen: seen.max_per_second(),
                waiting_ms: waiting,
            };
            (name.clone(), figures)
        })
        .collect()
}

/// One map step over the run: its cap beside what the records the run wrote show.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MapFigures {
    /// Its cap: items of one order's map in flight at once, at most.
    pub max_concurrency: u32,
    /// Items it ran over, summed over the orders whose map read its items.
    pub items: u64,
    /// The most items of one order's map in flight at once, in any record written: each
    /// claim and item reply writes the items it dispatched as in flight.
    pub max_in_flight_seen: u64,
    /// Item compensations that succeeded: writes that applied an item's undo reply.
    pub undone: u64,
}

/// Each map's figures, from the write log: an order's items are those its map's record
/// kept (read at the map's first claim), the most in flight the most any write left in
/// flight, and an item undone a write whose cause is the success of an undo at the map's
/// step (each item's undo is claimed, then answered: one such write per item undone).
pub fn map_figures(run: &DevOutcome) -> BTreeMap<String, MapFigures> {
    let mut figures: BTreeMap<String, MapFigures> = BTreeMap::new();
    let ran =
        run.options.workflow.split(',').chain(run.options.trickle.as_ref().map(|t| t.workflow.as_str()));
    for m in ran.filter_map(|name| run.workflows.get(name)).flat_map(|wf| &wf.maps) {
        let f = figures.entry(m.name.clone()).or_default();
        f.max_concurrency = f.max_concurrency.max(m.max_concurrency);
    }
    if figures.is_empty() {
        return figures;
    }
    let mut items: HashMap<(&OrderId, &str), usize> = HashMap::new();
    for w in &run.writes {
        let after = &w.after;
        let Some(wf) = run.workflows.get_version(&after.workflow, after.workflow_version) else { continue };
        if let Some(run) = after.stage().filter(|r| r.map)
            && let Some(m) = wf.map_at(run.at)
        {
            let f = figures.entry(m.name.clone()).or_default();
            f.max_in_flight_seen = f.max_in_flight_seen.max(run.in_flight() as u64);
            let n = items.entry((&after.order_id, m.name.as_str())).or_default();
            *n = (*n).max(run.branches.len());
        }
        if let Cause::Succeeded { step, action: Action::Undo } = after.last_cause
            && w.before.as_ref().is_none_or(|b| b.last_cause != after.last_cause)
            && let Some(m) = wf.map_at(step)
        {
            figures.entry(m.name.clone()).or_default().undone += 1;
        }
    }
    for ((_, name), n) in items {
        if let Some(f) = figures.get_mut(name) {
            f.items += n as u64;
        }
    }
    figures
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub max: Option<u64>,
}

impl Report {
    pub fn new(run: &DevOutcome, violations: &[Violation]) -> Report {
        let m = &run.metrics;
        let pct = |metric| Percentiles {
            p50: m.percentile(metric, 50.0),
            p90: m.percentile(metric, 90.0),
            p99: m.percentile(metric, 99.0),
            max: m.percentile(metric, 100.0),
        };
        let mut final_states: BTreeMap<String, usize> =
            ProcessState::ALL.iter().map(|s| (s.as_str().to_owned(), 0)).collect();
        for t in &run.tasks {
            *final_states.entry(t.state().as_str().to_owned()).or_default() += 1;
        }
        let elapsed_s = run.elapsed.as_secs_f64();
        let ended: HashMap<&OrderId, ProcessState> =
            run.tasks.iter().map(|t| (&t.order_id, t.state())).collect();
        let (mut alerts_for_error, mut alerts_for_compensated, mut alerts_for_unfinished) = (0, 0, 0);
        let mut alerts_repeated = 0;
        let mut seen = HashSet::new();
        for a in &run.alerts {
            if !seen.insert((&a.order_id, a.step, a.state)) {
                alerts_repeated += 1;
                continue;
            }
            match ended.get(&a.order_id) {
                Some(ProcessState::Error) => alerts_for_error += 1,
                Some(ProcessState::Compensated) => alerts_for_compensated += 1,
                _ => alerts_for_unfinished += 1,
            }
        }
        Report {
            seed: run.options.seed,
            workflow: run.options.workflow.clone(),
            orders_sent: run.sent.orders.len(),
            duplicates_sent: run.sent.duplicates,
            bad_messages_sent: run.sent.bad.len(),
            accepted: run.tasks.len(),
            rejected_kept: run.kept.len(),
            final_states,
            agent_retries: m.count(Metric::AgentRetry),
            supervisor_recoveries: m.count(Metric::Recovered),
            supervisor_runs: run.supervisor_runs,
            supervisor_period_ms: run.options.supervisor_period_ms,
            stale_replies_dropped: m.count(Metric::StaleReply),
            claims_lost: m.count(Metric::ClaimLost),
            compensations_started: m.count(Metric::CompensationStarted),
            compensation_steps: m.count(Metric::CompensationStep),
            alerts: run.alerts.len(),
            alerts_for_error,
            alerts_for_compensated,
            alerts_for_unfinished,
            alerts_repeated,
            remote_calls: run.ledger.calls,
            remote_hangs: run.ledger.hangs,
            remote_transient_failures: run.ledger.transient,
            remote_refusals: run.ledger.refusals,
            order_latency_ms: pct(Metric::OrderLatencyMs),
            step_latency_ms: pct(Metric::StepLatencyMs),
            timers_started: m.count(Metric::TimerStarted),
            timers_woken: m.count(Metric::TimerWoke),
            timer_schedules_early: m.count(Metric::TimerEarly),
            timer_lateness_ms: pct(Metric::TimerLatenessMs),
            timers: Timers {
                woken: m.count(Metric::TimerWoke),
                schedules_early: m.count(Metric::TimerEarly),
                max_late_ms: m.percentile(Metric::TimerLatenessMs, 100.0),
            },
            callbacks: CallbackFigures {
                completed: m.count(Metric::CallbackApplied),
                refused: m.count(Metric::CallbackRefused),
                timed_out: m.count(Metric::CallbackTimedOut),
                attempts: {
                    let mut by: BTreeMap<String, usize> = BTreeMap::new();
                    for a in &run.callback_attempts {
                        *by.entry(a.fate.as_str().to_owned()).or_default() += 1;
                    }
                    by
                },
                waited: m.count(Metric::CallbackStarted),
                heartbeats: m.count(Metric::CallbackHeartbeat),
                heartbeats_noted: m.count(Metric::CallbackHeartbeatNoted),
                bad_sent: {
                    let mut by: BTreeMap<String, usize> = BTreeMap::new();
                    for s in run.callback_sends.iter().filter(|s| s.kind.is_bad()) {
                        *by.entry(s.kind.as_str().replace(' ', "_")).or_default() += 1;
                    }
                    by
                },
            },
            agents: agent_figures(run),
            maps: map_figures(run),
            elapsed_s,
            orders_per_second: if elapsed_s > 0.0 { run.tasks.len() as f64 / elapsed_s } else { 0.0 },
            violations: violations
                .iter()
                .map(|v| (v.invariant.statement().to_owned(), v.detail.clone()))
                .collect(),
            resources: None,
        }
    }

    /// With the resources of a run against an endpoint.
    pub fn with_resources(mut self, resources: Option<Resources>) -> Report {
        self.resources = resources;
        self
    }

    /// The report as text: one figure a line, each with what it counts; fits 80 columns.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(
            w,
            "\nsas dev run: {} {} orders, seed {}: {:.1} s, {:.0} orders/s",
            self.orders_sent, self.workflow, self.seed, self.elapsed_s, self.orders_per_second
        );
        let _ = writeln!(w, "(the same --seed sends the same orders and remote answers; timing varies)");
        let line = |w: &mut String, n: &dyn std::fmt::Display, meaning: &str| {
            let _ = writeln!(w, "{n:>7}  {meaning}");
        };

        let _ = writeln!(w, "\norders");
        line(w, &self.orders_sent, "sent: valid orders, each under its own id");
        line(w, &self.duplicates_sent, "of them sent a second time, byte for byte");
        line(w, &self.bad_messages_sent, "bad messages sent (malformed, invalid, conflicting)");
        line(w, &self.accepted, "accepted: a task was created (a duplicate is not a second)");
        line(w, &self.rejected_kept, "rejected and kept in the orders DLQ with the reason");

        let _ = writeln!(w, "\nfinal state of the accepted orders");
        let state = |s: ProcessState| self.final_states.get(s.as_str()).copied().unwrap_or(0);
        line(w, &state(ProcessState::Processed), "Processed: every step took effect");
        line(w, &state(ProcessState::Compensated), "Compensated: given up on; what took effect was undone");
        line(w, &state(ProcessState::Error), "Error: given up on, left for an operator (alerted)");
        let moving: usize = ProcessState::ALL.iter().filter(|s| !s.is_terminal()).map(|s| state(*s)).sum();
        line(w, &moving, "still moving when the run stopped (it timed out)");

        let _ = writeln!(w, "\nrecovery");
        line(w, &self.agent_retries, "agent retries: a remote call repeated after a 503");
        line(w, &self.supervisor_recoveries, "supervisor recoveries: a task past its deadline retried");
        let runs = format!("supervisor runs, one every {} ms", self.supervisor_period_ms);
        line(w, &self.supervisor_runs, &runs);
        line(w, &self.stale_replies_dropped, "stale replies dropped: from an attempt no longer current");
        line(w, &self.claims_lost, "lost claims: a schedule found its task already claimed");
        line(w, &self.compensations_started, "compensations started: orders that began undoing steps");
        line(w, &self.compensation_steps, "compensating steps run: undo calls that succeeded");

        let _ = writeln!(w, "\noperator alerts ({} in all)", self.alerts);
        line(
            w,
            &self.alerts_for_error,
            "for orders that ended Error: one as each reached Error, plus one from\n         \
             when undoing began if the supervisor had given up on a step first",
        );
        line(
            w,
            &self.alerts_for_compensated,
            "for orders that ended Compensated: raised when the supervisor gave up\n         \
             on a step left unanswered past its failure budget (its effect unknown)\n         \
             and began undoing; the undo succeeded, so nothing was left standing",
        );
        if self.alerts_for_unfinished > 0 {
            line(w, &self.alerts_for_unfinished, "for orders still moving when the run stopped");
        }
        line(w, &self.alerts_repeated, "repeats: same order, step and state (alerts are at least once)");

        let _ = writeln!(w, "\nremote service (from its own ledger)");
        line(w, &self.remote_calls, "calls");
        line(w, &self.remote_hangs, "hung: never answered; the agent's timeout ended them");
        line(w, &self.remote_transient_failures, "failed transiently (503)");
        line(w, &self.remote_refusals, "refused for good (422): the step had no effect");

        // Only where some agent has limits: a run without reads as it always has.
        let limited: Vec<_> = self
            .agents
            .iter()
            .filter(|(_, a)| a.max_in_flight.is_some() || a.max_per_second.is_some())
            .collect();
        if !limited.is_empty() {
            let _ = writeln!(w, "\nflow control (limit / most seen at the service, from its own count)");
            for (name, a) in &limited {
                let mut limits = Vec::new();
                if let Some(m) = a.max_in_flight {
                    limits.push(format!("in flight {m} / {}", a.max_in_flight_seen));
                }
                if let Some(m) = a.max_per_second {
                    limits.push(format!("per second {m} / {}", a.max_per_second_seen));
                }
                let _ = writeln!(w, "  {name}: {}", limits.join(", "));
                let q = &a.waiting_ms;
                let waited = match (q.p50, q.p99) {
                    (Some(p50), Some(p99)) => {
                        format!("{} tasks waited for a place: p50 {p50} ms, p99 {p99} ms", q.tasks)
                    }
                    _ => "no task waited for a place".to_owned(),
                };
                let _ = writeln!(w, "    {waited}");
            }
            let others = self.agents.len() - limited.len();
            if others > 0 {
                let _ = writeln!(w, "  {others} other agents have no limits (--json has their figures too)");
            }
        }

        // Only where a workflow has a map step: a run without reads as it always has.
        if !self.maps.is_empty() {
            let _ = writeln!(w, "\nmap steps (from the records the run wrote)");
            for (name, m) in &self.maps {
                let _ = writeln!(w, "  {name}: at most {} items of an order at a time", m.max_concurrency);
                line(w, &m.items, "items run over, summed over the orders");
                line(w, &m.max_in_flight_seen, "most items of one order in flight at once");
                line(w, &m.undone, "items undone: item compensations that succeeded");
            }
        }

        // Only where the workflow waits: a run without timers reads as it always has.
        if self.timers_started > 0 {
            let _ = writeln!(w, "\ntimers");
            line(w, &self.timers_started, "began to wait (a timer step claimed)");
            line(w, &self.timers_woken, "woke: on their delayed schedule or the supervisor's sweep");
            line(
                w,
                &self.timer_schedules_early,
                "early schedules: came before the wake time, sent again for then",
            );
        }

        // Only where the workflow has callback steps, as for timers.
        let c = &self.callbacks;
        if c.waited > 0 || c.completed > 0 || c.refused > 0 || !c.attempts.is_empty() {
            let _ = writeln!(w, "\ncallbacks (the simulated outside party's word on each started step)");
            let handed: usize = c.attempts.values().sum();
            let count = |map: &BTreeMap<String, usize>, k: &str| map.get(k).copied().unwrap_or(0);
            let fates = format!(
                "attempts the service started (its 2xx to the agent), whose word was\n         \
                 {} success, {} failure, {} late, {} never",
                count(&c.attempts, "success"),
                count(&c.attempts, "failure"),
                count(&c.attempts, "late"),
                count(&c.attempts, "never")
            );
            line(w, &handed, &fates);
            line(w, &c.waited, "of them waited: the agent's answer was applied before the word");
            line(w, &c.completed, "completed: a success or failure from the outside applied");
            line(w, &c.heartbeats, "heartbeats applied: the outside said it was still working");
            line(w, &c.heartbeats_noted, "heartbeats noted, not written: too soon after the last written");
            line(
                w,
                &c.refused,
                "refused: words that changed nothing (a second copy, an earlier\n         \
                 attempt's token, a forged one, one too late, a heartbeat after the end)",
            );
            line(w, &c.timed_out, "timed out: waits that lapsed (the timeout or a heartbeat missed)");
            let bad: usize = c.bad_sent.values().sum();
            let sent = format!(
                "bad words sent, each to be refused: {} second copies, {} stale,\n         \
                 {} forged, {} late",
                count(&c.bad_sent, "second_copy"),
                count(&c.bad_sent, "stale"),
                count(&c.bad_sent, "forged"),
                count(&c.bad_sent, "late")
            );
            line(w, &bad, &sent);
        }

        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        let _ = writeln!(w, "\n{:<36}{:>8}{:>8}{:>8}{:>8}", "latency in ms", "p50", "p90", "p99", "max");
        let mut rows = vec![
            ("order: accepted to Processed", &self.order_latency_ms),
            ("step: claimed to reply applied", &self.step_latency_ms),
        ];
        if self.timers_started > 0 {
            rows.push(("timer: wake time to woken", &self.timer_lateness_ms));
        }
        for (name, p) in rows {
            let _ = writeln!(
                w,
                "  {name:<34}{:>8}{:>8}{:>8}{:>8}",
                opt(p.p50),
                opt(p.p90),
                opt(p.p99),
                opt(p.max)
            );
        }

        let _ = writeln!(w);
        if self.violations.is_empty() {
            let _ = writeln!(w, "invariants  all held");
        } else {
            let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (inv, detail) in &self.violations {
                by.entry(inv).or_default().push(detail);
            }
            let _ = writeln!(w, "invariants  {} VIOLATIONS", self.violations.len());
            for (inv, details) in by {
                let _ = writeln!(w, "  {inv}: {} times, e.g.", details.len());
                for d in details.iter().take(5) {
                    let _ = writeln!(w, "    - {d}");
                }
            }
        }
        if let Some(r) = &self.resources {
            let _ = write!(w, "\n{}", render_resources(r));
        }
        out
    }
}

/// What a run against an endpoint made there, and whether it is still there.
pub fn render_resources(r: &Resources) -> String {
    let mut out = String::new();
    let w = &mut out;
    if let Fate::Unknown(why) = &r.fate {
        let _ = writeln!(w, "resources at {}: which this run made is unknown ({why});", r.endpoint);
        let _ = writeln!(w, "nothing removed; every one it made is named {}-...", r.prefix);
        return out;
    }
    if r.made.is_empty() {
        let _ = writeln!(w, "resources: none made at {}", r.endpoint);
        return out;
    }
    let fate = match &r.fate {
        Fate::Kept => "kept (--keep)",
        Fate::Removed => "removed at the end (--keep keeps them)",
        _ => "NOT all removed",
    };
    let _ = writeln!(w, "resources made at {}: {}, {fate}", r.endpoint, r.made.len());
    for m in &r.made {
        let failed = match &r.fate {
            Fate::NotRemoved(failed) => failed.iter().find(|(name, _)| *name == m.name).map(|(_, why)| why),
            _ => None,
        };
        match failed {
            Some(why) => {
                let _ = writeln!(w, "  {} {}: still there: {why}", m.kind.as_str(), m.name);
            }
            None => {
                let _ = writeln!(w, "  {} {}", m.kind.as_str(), m.name);
            }
        }
    }
    out
}
