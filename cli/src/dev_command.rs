//! `sasctl dev`'s options, and the command: check them, run, print the report.
//!
//! Beside `dev`, not inside it: it uses `endpoint`, `report` and `invariants`, which use
//! `dev`'s types, so inside `dev` it would make a circle of them.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::args::{rate, whole};
use crate::dev::{self, DevOptions};
use crate::remote_sim::{CallbackFaults, RemoteFaults};
use crate::report::Report;

#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct DevArgs {
    /// Orders to send (1 to 10,000,000).
    #[arg(long, default_value_t = 1_000, value_parser = whole::<usize>("--orders", 1, 10_000_000))]
    pub orders: usize,
    /// Workflow every order runs (a name from the definition file); several, comma
    /// separated, are taken in turn. Default: single-step, or the file's only workflow.
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,
    /// Definition file of the workflows and agents (default: the built-in
    /// examples/workflows.json; examples/ has others: callback steps, timers, a parallel
    /// stage). Every agent calls the simulated remote service.
    #[arg(long, value_name = "FILE")]
    pub workflows: Option<std::path::PathBuf>,
    /// Orders per second, sent as a steady trickle (default: all at once).
    #[arg(long, value_name = "N", value_parser = whole::<u32>("--rate", 1, 100_000))]
    pub rate: Option<u32>,
    /// Probability a remote call fails transiently (503), 0 to 1.
    #[arg(long, default_value_t = 0.1, value_parser = rate("--failure-rate"))]
    pub failure_rate: f64,
    /// Probability a remote call is refused for good (422), 0 to 1.
    #[arg(long, default_value_t = 0.01, value_parser = rate("--permanent-rate"))]
    pub permanent_rate: f64,
    /// Probability a remote call never answers, 0 to 1. The three rates must add up to
    /// less than 1.
    #[arg(long, default_value_t = 0.02, value_parser = rate("--hang-rate"))]
    pub hang_rate: f64,
    /// Remote service time per answered call: uniform up to this, in ms (at most 60000).
    #[arg(long, default_value_t = 2, value_parser = whole::<u64>("--latency-ms", 0, 60_000))]
    pub latency_ms: u64,
    /// Probability a forward step's success answers an output too large to keep (the
    /// task gives up on that step, its outcome in doubt).
    #[arg(long, default_value_t = 0.0, value_parser = rate("--bad-output-rate"))]
    pub bad_output_rate: f64,
    /// One agent's service fails differently from the rest: NAME=KIND:RATE[,KIND:RATE],
    /// kinds fail, refuse, undo-refuse, hang, bad-output (0 to 1) and latency (ms), e.g.
    /// `--agent-fault payment=fail:0.3`. Repeatable. It hits only the steps that call that
    /// agent: at a parallel stage (examples/parallel.json), only the branches that do.
    #[arg(long, value_name = "NAME=KIND:RATE")]
    pub agent_fault: Vec<crate::agent_fault::AgentFault>,
    /// Callback steps (e.g. examples/approval.json): the simulated service answers a
    /// callback step's call at once (the work started) and, as its outside party, sends
    /// its word on it (a completion with the service's answer as the step's output, or a
    /// failure) through the real path, a message on the callback queue, up to this long
    /// after the call (uniform), in ms (0 to 60000). While it works it sends a heartbeat
    /// before each is due, for steps that ask for them. Each attempt's word, and which bad
    /// ones go with it, is drawn from the seed, the step's key and the attempt.
    #[arg(long, default_value_t = 200, value_parser = whole::<u64>("--callback-delay-ms", 0, 60_000),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_delay_ms: u64,
    /// Probability an attempt's word is a failure: the work was declined, with no effect
    /// (the task's failure rules follow: compensation, or Error).
    #[arg(long, default_value_t = 0.05, value_parser = rate("--callback-failure-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_failure_rate: f64,
    /// Probability an attempt's word is sent after the step's callback timeout (it is
    /// refused, and the wait lapses: retried, or given up with the step in doubt).
    #[arg(long, default_value_t = 0.02, value_parser = rate("--callback-late-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_late_rate: f64,
    /// Probability an attempt gets no word and no heartbeat at all (its wait lapses). The
    /// failure, late and never rates must add up to at most 1.
    #[arg(long, default_value_t = 0.02, value_parser = rate("--callback-never-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_never_rate: f64,
    /// Probability an attempt's word is sent twice (the second copy is refused).
    #[arg(long, default_value_t = 0.05, value_parser = rate("--callback-duplicate-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_duplicate_rate: f64,
    /// Probability a completion with the token of an earlier attempt of the step (a
    /// forged one when there is none) is sent while the attempt waits (it is refused).
    #[arg(long, default_value_t = 0.02, value_parser = rate("--callback-stale-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_stale_rate: f64,
    /// Probability a completion with a forged token (the right order, step and attempt,
    /// a wrong secret) is sent while the attempt waits (it is refused).
    #[arg(long, default_value_t = 0.02, value_parser = rate("--callback-forged-rate"),
          help_heading = "Callback steps (the simulated outside party)")]
    pub callback_forged_rate: f64,
    /// Share of orders sent twice, 0 to 1.
    #[arg(long, default_value_t = 0.05, value_parser = rate("--duplicate-rate"))]
    pub duplicate_rate: f64,
    /// Bad messages to send (malformed, invalid, conflicting), 0 to 1000.
    #[arg(long, default_value_t = 12, value_parser = whole::<usize>("--malformed", 0, 1_000))]
    pub malformed: usize,
    /// Probability an internal queue delivers a message twice, 0 to 1.
    #[arg(long, default_value_t = 0.01, value_parser = rate("--queue-duplicate-rate"))]
    pub queue_duplicate_rate: f64,
    /// A claim's complete-by is this far after the claim, in ms (50 to 50000).
    #[arg(long, default_value_t = 1_000,
          value_parser = whole::<u64>("--step-timeout-ms", 50, sas::config::MAX_STEP_TIMEOUT_MS.into()))]
    pub step_timeout_ms: u64,
    /// How often the supervisor runs, in ms (1 to 60000).
    #[arg(long, default_value_t = 250, value_parser = whole::<u64>("--supervisor-period-ms", 1, 60_000))]
    pub supervisor_period_ms: u64,
    /// Failures of a step before its task is given up on (1 to 1000).
    #[arg(long, default_value_t = 5, value_parser = whole::<u32>("--failure-threshold", 1, 1_000))]
    pub failure_threshold: u32,
    /// Concurrent batches (invocations) per function (1 to 10000).
    #[arg(long, default_value_t = 64, value_parser = whole::<usize>("--concurrency", 1, 10_000))]
    pub concurrency: usize,
    /// The longest a send waits to go out in one request with its invocation's others,
    /// in ms (0 to 1000); one hold serves all four functions here, the agent's deployed one
    /// by default.
    #[arg(long, default_value_t = sas::config::DEFAULT_AGENT_SEND_MAX_HOLD_MS,
          value_parser = whole::<u64>("--send-max-hold-ms", 0, sas::config::MAX_SEND_MAX_HOLD_MS.into()))]
    pub send_max_hold_ms: u64,
    /// Seed: the same seed sends the same orders and gives each remote call the same
    /// answer; timing still varies (--help says what that changes).
    ///
    /// The seed fixes the orders sent (bodies, which are sent twice, the bad messages)
    /// and the simulated remote service's answer to each call, chosen by the call's
    /// idempotency key and how many calls that key had before: the same orders are
    /// refused, and the same calls fail, hang or succeed. A callback step's outside party
    /// draws each attempt's word the same way, by the step's key and the attempt number. It cannot fix timing: how many
    /// calls fit before a step's deadline, retry jitter, which internal message is
    /// delivered twice. So supervisor recoveries, stale replies, lost claims, retries,
    /// the hangs counted and latencies vary from run to run; final states repeat unless
    /// supervisor give-ups decide them (a high --hang-rate, a low --failure-threshold).
    /// For replays exact to every write, see docs/SIMULATION.md.
    #[arg(long, default_value_t = 1, value_parser = whole::<u64>("--seed", 0, u64::MAX.into()))]
    pub seed: u64,
    /// Stop waiting after this many seconds (1 to 86400).
    #[arg(long, default_value_t = 300, value_parser = whole::<u64>("--max-seconds", 1, 86_400))]
    pub max_seconds: u64,
    /// Print the report as JSON.
    ///
    /// `agents.<name>` holds, for every agent of the definition file, its limits
    /// (`max_in_flight`, `max_per_second`; null when unset) beside what the simulated
    /// service counted on its own side of the wire: `calls`, `max_in_flight_seen` (the
    /// most calls open at once: a call is open from its arrival until it is answered, or
    /// until the agent stops waiting and closes the connection, so a hung call counts up
    /// to the agent's timeout) and `max_per_second_seen` (the most calls that arrived in
    /// any 1,000 ms window); and `waiting_ms` ({count, tasks, p50, p90, p99, max}): each
    /// wait for a place in the agent's gate, from the task's first arrival at it for a
    /// step to its claim of the step, over the tasks that waited (`tasks`) only. A run in
    /// which a limited agent's service saw more than its limits fails (exit 1).
    ///
    /// `maps.<name>`, for each map step of the run's workflows (absent without one), by
    /// the map's name, from the records the run wrote: `max_concurrency` (its cap),
    /// `items` (the items its orders' maps ran over, summed), `max_in_flight_seen` (the
    /// most items of one order's map in flight at once in any record) and `undone` (item
    /// compensations that succeeded).
    #[arg(long)]
    pub json: bool,
    /// Run on the real adapters (DynamoDB, SQS, SNS) against this AWS endpoint, e.g.
    /// moto or LocalStack at http://127.0.0.1:4566. The run creates a table, seven
    /// queues and a topic under a fresh dev-xxxxxxxx prefix, lists them at the end and
    /// removes them (even on Ctrl-C), unless --keep. Workflows with callback steps or
    /// queue agents run on the embedded backend only.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// With --endpoint-url: leave the run's resources in place (the report names them).
    #[arg(long, requires = "endpoint_url")]
    pub keep: bool,
}

pub async fn run_command(args: DevArgs) -> Result<ExitCode, String> {
    if let Some(url) = &args.endpoint_url {
        crate::endpoint::check_url(url).map_err(|e| e.to_string())?;
    }
    check_rates(args.failure_rate, args.permanent_rate, args.hang_rate)?;
    check_callback_rates(args.callback_failure_rate, args.callback_late_rate, args.callback_never_rate)?;
    let definitions = crate::workflows::load(args.workflows.as_deref())?;
    let workflows = &definitions.workflows;
    let workflow = match &args.workflow {
        Some(names) => names.clone(),
        None => default_workflow(&workflows.names())?,
    };
    for name in workflow.split(',') {
        if workflows.get(name).is_none() {
            return Err(format!(
                "unknown workflow {name:?}: the file defines {}",
                workflows.names().join(", ")
            ));
        }
    }
    let faults = RemoteFaults {
        transient: args.failure_rate,
        permanent: args.permanent_rate,
        undo_permanent: 0.0,
        hang: args.hang_rate,
        latency_max_ms: args.latency_ms,
        bad_output: args.bad_output_rate,
        ignores_undone: false,
    };
    let agents: Vec<&str> = definitions.agents.keys().map(String::as_str).collect();
    let agent_faults = crate::agent_fault::per_agent(&args.agent_fault, faults, &agents)?;
    let callbacks = CallbackFaults {
        delay_max_ms: args.callback_delay_ms,
        failure: args.callback_failure_rate,
        late: args.callback_late_rate,
        never: args.callback_never_rate,
        duplicate: args.callback_duplicate_rate,
        stale: args.callback_stale_rate,
        forged: args.callback_forged_rate,
        keep_alive: false,
    };
    let options = DevOptions {
        orders: args.orders,
        definitions,
        workflow,
        faults,
        agent_faults,
        callbacks,
        duplicate_rate: args.duplicate_rate,
        malformed: args.malformed,
        queue_duplicate_rate: args.queue_duplicate_rate,
        step_timeout_ms: args.step_timeout_ms,
        supervisor_period_ms: args.supervisor_period_ms,
        failure_threshold: args.failure_threshold,
        concurrency: args.concurrency,
        batch_size: 10,
        send_max_hold_ms: args.send_max_hold_ms,
        seed: args.seed,
        max_runtime: Duration::from_secs(args.max_seconds),
        arrival_per_s: args.rate,
        trickle: None,
        schedulers: 1,
        capacity: false,
        customers: None,
    };
    let bar = crate::text::progress_bar(options.orders as u64, "terminal");
    let progress = |p: &dev::Progress| {
        bar.set_position(p.terminal as u64);
        let states: Vec<String> = p.by_state.iter().map(|(s, n)| format!("{} {n}", s.as_str())).collect();
        bar.set_message(states.join(" "));
    };
    if args.endpoint_url.is_some() && !options.callback_steps().is_empty() {
        return Err(format!(
            "callback steps ({}) run in `sasctl dev` on the embedded backend only: drop --endpoint-url",
            options.callback_steps().join(", ")
        ));
    }
    if args.endpoint_url.is_some() && !options.queue_agents().is_empty() {
        return Err(format!(
            "queue agents ({}) run in `sasctl dev` on the embedded backend only: drop --endpoint-url, or run their workers yourself",
            options.queue_agents().join(", ")
        ));
    }
    let (outcome, resources) = match &args.endpoint_url {
        None => (
            dev::run(options, progress).await.map_err(|e| (format!("dev run failed to start: {e}"), 2)),
            None,
        ),
        Some(url) => {
            let run = crate::endpoint::run_and_clean_up(options, url, args.keep, progress).await;
            let outcome = run.outcome.map_err(|e| {
                let code =
                    if matches!(e, crate::endpoint::EndpointError::Interrupted { .. }) { 130 } else { 2 };
                (e.to_string(), code)
            });
            (outcome, run.resources)
        }
    };
    bar.finish_and_clear();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err((e, code)) => {
            eprintln!("sasctl: {e}");
            if let Some(r) = &resources {
                eprint!("{}", crate::report::render_resources(r));
            }
            return Ok(ExitCode::from(code));
        }
    };
    let violations = crate::invariants::check(&outcome);
    let report = Report::new(&outcome, &violations).with_resources(resources);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        println!("{}", report.render());
    }
    Ok(if violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The three rates of a remote call's fate must leave room for success; the message shows
/// each as given and their sum as a person writes it (1.11, not 1.1099999999999999).
fn check_rates(failure: f64, permanent: f64, hang: f64) -> Result<(), String> {
    let sum = failure + permanent + hang;
    if sum < 1.0 {
        return Ok(());
    }
    let shown = (sum * 1e9).round() / 1e9;
    Err(format!(
        "--failure-rate + --permanent-rate + --hang-rate must add up to less than 1 \
         (got {failure} + {permanent} + {hang} = {shown})"
    ))
}

/// Without --workflow: `single-step` where the file has it (the built-in one does), else
/// the file's only workflow; a file of several must be told which.
fn default_workflow(names: &[&str]) -> Result<String, String> {
    match names {
        _ if names.contains(&"single-step") => Ok("single-step".to_owned()),
        [only] => Ok((*only).to_owned()),
        _ => Err(format!(
            "give --workflow NAME (several, comma separated): the file defines {}",
            names.join(", ")
        )),
    }
}

/// The three fates of a callback attempt's word that are not a success: at most all of them.
fn check_callback_rates(failure: f64, late: f64, never: f64) -> Result<(), String> {
    let sum = failure + late + never;
    if sum <= 1.0 + 1e-9 {
        return Ok(());
    }
    let shown = (sum * 1e9).round() / 1e9;
    Err(format!(
        "--callback-failure-rate + --callback-late-rate + --callback-never-rate must add up to at most 1 \
         (got {failure} + {late} + {never} = {shown})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_sum_reads_as_written() {
        assert_eq!(check_rates(0.1, 0.01, 0.02), Ok(()));
        assert_eq!(
            check_rates(0.6, 0.01, 0.5).unwrap_err(),
            "--failure-rate + --permanent-rate + --hang-rate must add up to less than 1 (got 0.6 + 0.01 + 0.5 = 1.11)"
        );
        assert_eq!(default_workflow(&["single-step", "three-step"]), Ok("single-step".to_owned()));
        assert_eq!(default_workflow(&["approval"]), Ok("approval".to_owned()));
        assert_eq!(
            default_workflow(&["a", "b"]).unwrap_err(),
            "give --workflow NAME (several, comma separated): the file defines a, b"
        );
        assert_eq!(check_callback_rates(1.0, 0.0, 0.0), Ok(()));
        assert_eq!(check_callback_rates(0.7, 0.2, 0.1), Ok(()));
        assert_eq!(
            check_callback_rates(0.5, 0.5, 0.1).unwrap_err(),
            "--callback-failure-rate + --callback-late-rate + --callback-never-rate must add up to at most 1 (got 0.5 + 0.5 + 0.1 = 1.1)"
        );
    }
}
