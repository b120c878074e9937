//! `sasctl tasks resubmit|compensate|cancel`: an operator's action on one task, or on
//! each task of a listing, carried out by `sas::handlers::operate` on the AWS adapters,
//! the deployment's own resources and the caller's identity. This module never writes
//! the table itself: the handler decides on a fresh read and writes conditionally.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use indicatif::ProgressBar;
use sas::adapters::aws::{SnsAlerts, SqsQueues};
use sas::adapters::embedded::CountingMetrics;
use sas::adapters::system::{SystemClock, SystemRandom};
use sas::domain::{Act, Actor, OperatorAlert, Origin, Policy, ProcessState, ReplyToRules, TaskRecord};
use sas::handlers::{Deps, Operated, Settings, Topology, operate};
use sas::ports::{AlertError, Alerts, QueueUrl};
use serde_json::{Value, json};

use super::list::{now, select};
use super::{ActArgs, Context, StateArg, TasksError, order_id, policy, render};
use crate::deployment::WorkQueue;

/// The ports and settings an action runs with, and who acts (`sasctl console` holds one
/// for its whole run: cli/src/console/actions.rs).
pub(crate) struct Operator {
    pub(crate) ctx: Context,
    pub(crate) deps: Deps,
    pub(crate) settings: Settings,
    pub(crate) by: String,
}

/// Stands in for the alert topic when the deployment's cannot be found: no operator
/// action raises an alert, so the topic is not worth failing the command over (a callback
/// failure that gives up does raise one: it then fails with this reason).
struct NoTopic(String);

#[async_trait]
impl Alerts for NoTopic {
    async fn raise(&self, _: &OperatorAlert) -> Result<(), AlertError> {
        Err(AlertError(self.0.clone()))
    }
}

/// The ports and settings a handler runs with against the deployment `ctx` found: its
/// table, its scheduler queue (and agent queue, when found), its alert topic (a stand-in
/// that refuses every alert when none is found) and its `reply_to` allow-list.
pub(super) fn pipeline(ctx: &Context, policy: Policy) -> Result<(Deps, Settings), TasksError> {
    let d = &ctx.deployment;
    let scheduler = QueueUrl(d.queue(WorkQueue::Scheduler)?.to_owned());
    // Operator actions never dispatch to an agent; the queue is the deployment's when found.
    let agent =
        QueueUrl(d.queue(WorkQueue::Agent).map_or(sas::config::UNUSED_AGENT_QUEUE.to_owned(), str::to_owned));
    let sdk = d.sdk_config();
    let alerts: Arc<dyn Alerts> = match d.alert_topic_arn() {
        Ok(arn) => {
            let named = match d.origin() {
                crate::deployment::Origin::Stack(s) => sas::config::Deployment::Stack(s.clone()),
                crate::deployment::Origin::Prefix(p) => sas::config::Deployment::Prefix(p.clone()),
                crate::deployment::Origin::Flags => sas::config::Deployment::Unnamed,
            };
            Arc::new(SnsAlerts::new(aws_sdk_sns::Client::new(sdk), arn, named))
        }
        Err(e) => Arc::new(NoTopic(e.to_string())),
    };
    let deps = Deps {
        store: ctx.store.clone(),
        queues: Arc::new(SqsQueues::new(aws_sdk_sqs::Client::new(sdk))),
        alerts,
        clock: Arc::new(SystemClock),
        random: Arc::new(SystemRandom::new()),
        metrics: Arc::new(CountingMetrics::default()),
    };
    // Status updates go by the deployment's own allow-list, as the functions' do: an
    // order whose reply_to it no longer allows hears nothing from an operator either.
    let reply_to = match d.reply_to_rules() {
        Ok(rules) => rules,
        Err(e) => {
            eprintln!("sasctl: no status update will be sent to any reply_to: {e}");
            // Queues named, none allowed: every reply_to is refused.
            ReplyToRules::names(&[], &[])
        }
    };
    let settings = Settings::new(
        policy,
        ctx.definitions.workflows.clone(),
        Topology::new(scheduler, agent).with_queue_agents(&ctx.definitions.agents),
        reply_to,
    );
    Ok((deps, settings))
}

impl Operator {
    pub(crate) async fn new(ctx: Context, policy: Policy) -> Result<Operator, TasksError> {
        let by = ctx.deployment.caller_identity().await?;
        let (deps, settings) = pipeline(&ctx, policy)?;
        Ok(Operator { ctx, deps, settings, by })
    }

    /// Carries out `act` on task `id`: the outcome, or why it could not be tried.
    /// `seen`: the revision a listing showed, for a bulk action (refused if it moved).
    pub(crate) async fn act(
        &self,
        id: &str,
        act: Act,
        why: &str,
        seen: Option<u64>,
    ) -> Result<Outcome, TasksError> {
        let id = order_id(id)?;
        let Some(task) = self.ctx.task(&id).await? else {
            return Ok(Outcome::NoTask);
        };
        self.ctx.workflow_of(&task)?;
        // The handler checks the reply_to again before each send and skips a refused
        // one; said here so the operator knows the order heard nothing.
        let no_status = task
            .reply_to
            .as_deref()
            .and_then(|r| self.settings.reply_to.allows(r).err())
            .map(|refusal| refusal.to_string());
        let actor = Actor { by: &self.by, why, seen, origin: Origin::Operator };
        match operate(&self.deps, &self.settings, &id, act, actor).await {
            Ok(Operated::Applied { before, trigger, task }) => {
                Ok(Outcome::Applied { before, after: task.state(), trigger: trigger.as_str(), no_status })
            }
            Ok(Operated::Refused(r)) => Ok(Outcome::Refused(r.to_string())),
            Ok(Operated::NoSuchTask) => Ok(Outcome::NoTask),
            Err(e) => Ok(Outcome::Failed(crate::endpoint::one_line(&e.to_string()))),
        }
    }
}

/// What one action came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `no_status`: why the order's reply_to was told nothing, if it has one it may not be told.
    Applied {
        before: ProcessState,
        after: ProcessState,
        trigger: &'static str,
        no_status: Option<String>,
    },
    Refused(String),
    NoTask,
    Failed(String),
}

impl Outcome {
    pub(crate) fn line(&self, id: &str, by: &str, why: &str) -> String {
        match self {
            Outcome::Applied { before, after, trigger, no_status } => format!(
                "{id}: {} -> {} ({trigger}), by {by}, why {}{}",
                before.as_str(),
                after.as_str(),
                render::one_line(why, 200),
                no_status.as_ref().map_or(String::new(), |r| format!("; no status sent: {r}"))
            ),
            Outcome::Refused(why) => format!("{id}: refused: {why}"),
            Outcome::NoTask => format!("no task {id}"),
            Outcome::Failed(e) => format!("{id}: failed: {e}"),
        }
    }

    pub(crate) fn json(&self, id: &str, act: Act, by: &str, why: &str) -> Value {
        let mut v = json!({"id": id, "act": act.as_str(), "by": by, "why": why});
        match self {
            Outcome::Applied { before, after, trigger, no_status } => {
                v["outcome"] = "applied".into();
                v["from"] = before.as_str().into();
                v["to"] = after.as_str().into();
                v["trigger"] = (*trigger).into();
                if let Some(refusal) = no_status {
                    v["status_not_sent"] = refusal.clone().into();
                }
            }
            Outcome::Refused(r) => {
                v["outcome"] = "refused".into();
                v["reason"] = r.clone().into();
            }
            Outcome::NoTask => v["outcome"] = "no_task".into(),
            Outcome::Failed(e) => {
                v["outcome"] = "failed".into();
                v["reason"] = e.clone().into();
            }
        }
        v
    }
}

/// `sasctl tasks resubmit|compensate|cancel`.
pub async fn run(act: Act, args: &ActArgs) -> Result<ExitCode, TasksError> {
    let policy = policy()?;
    match (&args.id, args.state) {
        (Some(_), _) if args.filter.workflow.is_some() || args.filter.since.is_some() => {
            Err(TasksError::Usage(
                "--workflow and --since narrow a bulk action's --state listing: not with an ID".into(),
            ))
        }
        (Some(id), _) if args.dry_run => single_dry_run(act, id, args, policy).await,
        (Some(id), _) => single(act, id, args, policy).await,
        (None, Some(state)) => bulk(act, state, args, policy).await,
        // clap requires one of them.
        (None, None) => Err(TasksError::Usage("give a task's ID or --state".into())),
    }
}

async fn single(act: Act, id: &str, args: &ActArgs, policy: Policy) -> Result<ExitCode, TasksError> {
    order_id(id)?;
    let ctx = Context::connect(&args.common).await?;
    let operator = Operator::new(ctx, policy).await?;
    let outcome = operator.act(id, act, &args.reason, None).await?;
    let line = outcome.line(id, &operator.by, &args.reason);
    if args.common.json {
        println!("{}", outcome.json(id, act, &operator.by, &args.reason));
    } else if matches!(outcome, Outcome::Applied { .. }) {
        println!("{line}");
    } else {
        eprintln!("sasctl: {line}");
    }
    Ok(if matches!(outcome, Outcome::Applied { .. }) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The states an action applies to in bulk: selecting any other only collects refusals.
fn check_state(act: Act, state: StateArg) -> Result<(), TasksError> {
    let fits = match act {
        Act::Resubmit { .. } | Act::Compensate => state == StateArg::Error,
        Act::Cancel => !state.from_own_index() && state != StateArg::Compensating,
        Act::Pause => !state.from_own_index() && state != StateArg::Paused,
        Act::Resume => state == StateArg::Paused,
    };
    if fits {
        return Ok(());
    }
    Err(TasksError::Usage(match act {
        Act::Cancel => format!(
            "cancel applies to live tasks: --state pending, processing or stuck (not {})",
            state.as_str()
        ),
        Act::Pause => format!(
            "pause applies to live tasks that are not paused: --state pending, processing, waiting, compensating or stuck (not {})",
            state.as_str()
        ),
        Act::Resume => format!("resume applies to paused tasks: --state paused (not {})", state.as_str()),
        _ => {
            format!("{} applies to tasks in Error only: --state error (not {})", act.as_str(), state.as_str())
        }
    }))
}

async fn bulk(act: Act, state: StateArg, args: &ActArgs, policy: Policy) -> Result<ExitCode, TasksError> {
    check_state(act, state)?;
    let ctx = Context::connect(&args.common).await?;
    let selection = select(&ctx, state, &args.filter).await?;
    if selection.more {
        eprintln!(
            "sasctl: more tasks match than these {}: run again afterwards, or raise --limit",
            selection.tasks.len()
        );
    }
    if args.dry_run {
        dry_run(&ctx, act, &selection.tasks, args, &policy);
        return Ok(ExitCode::SUCCESS);
    }
    let json = args.common.json;
    let operator = Operator::new(ctx, policy).await?;
    let bar = if json {
        ProgressBar::hidden()
    } else {
        crate::text::progress_bar(selection.tasks.len() as u64, "")
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(args.rate)));
    // After a slow action, wait a whole period again rather than catching up in a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut applied, mut refused, mut failed) = (0usize, 0usize, 0usize);
    for task in &selection.tasks {
        tick.tick().await;
        let id = task.order_id.as_str();
        let outcome = match operator.act(id, act, &args.reason, Some(task.revision)).await {
            Ok(o) => o,
            Err(e) => Outcome::Failed(e.to_string()),
        };
        match outcome {
            Outcome::Applied { .. } => applied += 1,
            Outcome::Refused(_) | Outcome::NoTask => refused += 1,
            Outcome::Failed(_) => failed += 1,
        }
        if json {
            println!("{}", outcome.json(id, act, &operator.by, &args.reason));
        } else if bar.is_hidden() {
            // Not a terminal (a pipe, a log): the bar draws nothing, the lines still count.
            println!("{}", outcome.line(id, &operator.by, &args.reason));
        } else {
            bar.println(outcome.line(id, &operator.by, &args.reason));
        }
        bar.inc(1);
        bar.set_message(format!("{applied} applied, {refused} refused, {failed} failed"));
    }
    bar.finish_and_clear();
    let selected = selection.tasks.len();
    if json {
        println!(
            "{}",
            json!({"act": act.as_str(), "state": state.as_str(), "selected": selected,
                   "applied": applied, "refused": refused, "failed": failed})
        );
    } else {
        println!(
            "{}: {applied} applied, {refused} refused, {failed} failed ({selected} selected)",
            act.as_str()
        );
    }
    Ok(if refused + failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// What `act` would do to `task`, decided on the record as read, changing nothing: whether
/// it would apply, a line for people and an object for --json.
pub(crate) fn preview(
    ctx: &Context,
    act: Act,
    task: &TaskRecord,
    why: &str,
    policy: &Policy,
) -> (bool, String, Value) {
    let id = task.order_id.as_str();
    let actor = Actor { by: "(dry run)", why, seen: None, origin: Origin::Operator };
    let decided = match render::workflow_of(&ctx.definitions, task) {
        None => Err(format!(
            "{} does not define workflow {:?} v{}: pass --workflows FILE",
            ctx.definitions_from, task.workflow, task.workflow_version
        )),
        Some(wf) => task.act(act, actor, now(), wf, policy).map_err(|r| r.to_string()),
    };
    match decided {
        Ok(d) => (
            true,
            format!(
                "would {}: {id}: {} -> {} ({})",
                act.as_str(),
                task.state().as_str(),
                d.next.state().as_str(),
                d.trigger.as_str()
            ),
            json!({"id": id, "act": act.as_str(), "dry_run": true, "outcome": "would_apply",
                   "from": task.state().as_str(), "to": d.next.state().as_str(), "trigger": d.trigger.as_str()}),
        ),
        Err(why) => (
            false,
            format!("would refuse: {id}: {why}"),
            json!({"id": id, "act": act.as_str(), "dry_run": true, "outcome": "would_refuse", "reason": why}),
        ),
    }
}

/// `--dry-run` with an ID: what the action would do to the task as it is now (one
/// consistent read), changing nothing; exit 1 when it would be refused, as the action
/// would be.
async fn single_dry_run(act: Act, id: &str, args: &ActArgs, policy: Policy) -> Result<ExitCode, TasksError> {
    let order = order_id(id)?;
    let ctx = Context::connect(&args.common).await?;
    let Some(task) = ctx.task(&order).await? else {
        eprintln!("sasctl: no task {id} in table {}", ctx.table);
        return Ok(ExitCode::FAILURE);
    };
    ctx.workflow_of(&task)?;
    let (would, line, v) = preview(&ctx, act, &task, &args.reason, &policy);
    if args.common.json {
        println!("{v}");
    } else {
        println!("{line}");
        println!("dry run: nothing changed");
    }
    Ok(if would { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// What each selected task would come to, decided on the listed record (the index may
/// lag the table by a moment; the real action decides on a fresh read).
fn dry_run(ctx: &Context, act: Act, tasks: &[TaskRecord], args: &ActArgs, policy: &Policy) {
    let (mut would, mut refused) = (0usize, 0usize);
    for task in tasks {
        let (applies, line, v) = preview(ctx, act, task, &args.reason, policy);
        if applies {
            would += 1;
        } else {
            refused += 1;
        }
        if args.common.json {
            println!("{v}");
        } else {
            println!("{line}");
        }
    }
    if args.common.json {
        println!(
            "{}",
            json!({"act": act.as_str(), "dry_run": true, "selected": tasks.len(), "would_apply": would, "would_refuse": refused})
        );
    } else {
        println!(
            "dry run: {} task(s) selected, {would} would change, {refused} would be refused; nothing changed",
            tasks.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_actions_take_the_states_they_apply_to() {
        assert!(check_state(Act::Resubmit { from_step: None }, StateArg::Error).is_ok());
        assert_eq!(
            check_state(Act::Compensate, StateArg::Stuck).unwrap_err().to_string(),
            "compensate applies to tasks in Error only: --state error (not stuck)"
        );
        assert!(check_state(Act::Cancel, StateArg::Stuck).is_ok());
        assert_eq!(
            check_state(Act::Cancel, StateArg::Error).unwrap_err().to_string(),
            "cancel applies to live tasks: --state pending, processing or stuck (not error)"
        );
    }

    #[test]
    fn outcomes_are_one_line_each() {
        let applied = Outcome::Applied {
            before: ProcessState::Error,
            after: ProcessState::Pending,
            trigger: "Resubmit",
            no_status: None,
        };
        assert_eq!(
            applied.line("o-1", "arn:aws:sts::1:user/me", "remote fixed"),
            "o-1: Error -> Pending (Resubmit), by arn:aws:sts::1:user/me, why remote fixed"
        );
        assert_eq!(Outcome::NoTask.line("o-1", "", ""), "no task o-1");
        let v = applied.json("o-1", Act::Resubmit { from_step: None }, "me", "why");
        assert_eq!(v["outcome"], "applied");
        assert_eq!(v["to"], "Pending");
        assert!(v.get("status_not_sent").is_none());
        let quiet = Outcome::Applied {
            before: ProcessState::Pending,
            after: ProcessState::Compensated,
            trigger: "CancelUndone",
            no_status: Some(
                "reply_to names a queue that is not on this deployment's reply_to allow-list".into(),
            ),
        };
        assert!(quiet.line("o-2", "me", "why").ends_with(
            "; no status sent: reply_to names a queue that is not on this deployment's reply_to allow-list"
        ));
        assert!(quiet.json("o-2", Act::Cancel, "me", "why")["status_not_sent"].is_string());
    }
}
