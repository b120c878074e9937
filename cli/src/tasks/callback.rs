//! `sasctl tasks complete|fail|heartbeat TOKEN`: the outside's word on a callback step,
//! given by hand. Each is `sas::handlers::complete` on the AWS adapters, exactly what the
//! callback queue's handler runs: the token's fence on a fresh read (the record still
//! waits on the token's step and attempt, the token's digest is the record's, the
//! callback is not yet due), then one conditional write through the domain and its
//! effects (the next step's Schedule, the order's status). A token completes its attempt
//! at most once, so there is nothing to preview: a refused one changes nothing.
//!
//! The token is a capability: it is read from the command line or from stdin (`-`, to
//! keep it out of shell history) and never printed whole (`CallbackToken`'s `Display`).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sas::domain::{
    Actor, CallbackToken, Completion, Origin, ProcessState, StepOutput, TaskRecord, TokenClaims,
};
use sas::handlers::{Completed, HandlerError, Operated, complete, complete_as_operator};
use serde_json::{Value, json};

use super::{Common, Context, TasksError, policy, render};
use crate::args::non_empty;
use crate::deployment::DeploymentError;

/// Exit status: the completion was applied.
pub const EXIT_APPLIED: u8 = 0;
/// Exit status: refused, nothing changed (the token's step ended, it is forged, late, or
/// names no order).
pub const EXIT_REFUSED: u8 = 1;
/// Exit status: bad input (usage, a malformed token, an --output that is not JSON or
/// cannot be kept, definitions that do not hold the task's workflow).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the deployment could not be reached, read or written.
pub const EXIT_UNAVAILABLE: u8 = 3;

/// What `--help` says of the three commands' exit status (kept beside the codes above).
pub const EXIT_HELP: &str = "Exit status: 0 applied; 1 refused, nothing changed (the \
reason is printed: the token's step has ended, the token is forged, it came after the \
callback's timeout or heartbeat was due, or it names no order); 2 bad input (usage, a \
malformed token, --output that is not JSON or cannot be kept, definitions without the \
task's workflow); 3 the deployment could not be reached, read or written: run it again \
(a completion applies at most once: if the first one landed, the second is refused as \
ended).";

/// The token, as every one of the three commands takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// The callback token the step's agent request carried
    /// (sas1.<order id>.<step>.<attempt>.<64 hex digits>), or - to read it from stdin
    /// (one line), which keeps it out of shell history. Never printed whole.
    #[arg(value_name = "TOKEN", allow_hyphen_values = true)]
    pub token: String,
    #[command(flatten)]
    pub common: Common,
}

/// The step, as `complete` and `fail` take it: by its token, or by hand, as an operator,
/// by the order and the step's name.
#[derive(Debug, Clone, clap::Args)]
pub struct StepArgs {
    /// The callback token the step's agent request carried
    /// (sas1.<order id>.<step>.<attempt>.<64 hex digits>), or - to read it from stdin
    /// (one line), which keeps it out of shell history. Never printed whole. Or, as an
    /// operator without the token, --order and --step.
    #[arg(value_name = "TOKEN", allow_hyphen_values = true, required_unless_present = "order")]
    pub token: Option<String>,
    /// As an operator, without the token: the order whose callback step waits (with
    /// --step and --reason). Fenced on the record instead of a token (the task waits on
    /// that step's callback, not yet due), and recorded in its history with your identity
    /// and --reason.
    #[arg(long, value_name = "ORDER", conflicts_with = "token", requires_all = ["step", "reason"])]
    pub order: Option<String>,
    /// With --order: the name of the callback step the task waits on.
    #[arg(long, value_name = "NAME", requires = "order")]
    pub step: Option<String>,
    /// With --order: say what it would do, on the task as read now, and change nothing.
    #[arg(long, requires = "order")]
    pub dry_run: bool,
    #[command(flatten)]
    pub common: Common,
}

/// `sasctl tasks complete`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct CompleteArgs {
    /// The step's output, a JSON value of at most 4 KiB (compact) nested at most 32
    /// deep: kept under the step's name and handed to the later steps and the step's
    /// compensation. Without it (or --output-file) the step has no output.
    #[arg(long, value_name = "JSON", conflicts_with = "output_file")]
    pub output: Option<String>,
    /// The step's output, read from a file (as --output).
    #[arg(long, value_name = "PATH")]
    pub output_file: Option<PathBuf>,
    /// With --order: why you complete it by hand (recorded in the task's timeline).
    #[arg(long, value_name = "TEXT", requires = "order", value_parser = non_empty("--reason"))]
    pub reason: Option<String>,
    #[command(flatten)]
    pub step: StepArgs,
}

/// `sasctl tasks fail`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct FailArgs {
    /// Why the step failed: recorded in the task's timeline and told to the order's
    /// reply_to (required).
    #[arg(long, value_name = "TEXT", required = true, value_parser = non_empty("--reason"))]
    pub reason: String,
    #[command(flatten)]
    pub step: StepArgs,
}

/// `sasctl tasks heartbeat`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct HeartbeatArgs {
    #[command(flatten)]
    pub token: TokenArgs,
}

/// Which of the three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Complete,
    Fail,
    Heartbeat,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Complete => "complete",
            Verb::Fail => "fail",
            Verb::Heartbeat => "heartbeat",
        }
    }

    /// What it gives the step, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            Verb::Complete => "completion",
            Verb::Fail => "failure",
            Verb::Heartbeat => "heartbeat",
        }
    }
}

/// The token as given: `-` reads one line of stdin. Blank, or not a token's shape, is a
/// usage error; the message never repeats the token.
pub fn read_token(given: &str, stdin: &mut dyn BufRead) -> Result<(CallbackToken, TokenClaims), TasksError> {
    let text = if given == "-" {
        let mut line = String::new();
        stdin.read_line(&mut line).map_err(|e| TasksError::Usage(format!("TOKEN -: reading stdin: {e}")))?;
        if line.trim().is_empty() {
            return Err(TasksError::Usage("TOKEN -: stdin had no token (give it on one line)".into()));
        }
        line
    } else {
        given.to_owned()
    };
    let text = text.trim();
    CallbackToken::parse(text).map_err(|e| {
        // An order id is no secret: say what was given instead of a token.
        if sas::domain::OrderId::parse(text).is_ok() {
            TasksError::Usage(format!(
                "TOKEN {text:?} is an order id, not a callback token: give the token the step's agent request carried (sasctl tasks show {text} says which step and attempt wait for one)"
            ))
        } else {
            TasksError::Usage(format!("TOKEN: {e}"))
        }
    })
}

/// The completion `--output` or `--output-file` describes, checked as the step's output
/// would be: one that could not be kept would give the step up, so it is refused here.
pub fn output_of(output: Option<&str>, file: Option<&Path>) -> Result<Option<Value>, TasksError> {
    let (flag, text) = match (output, file) {
        (Some(text), _) => ("--output".to_owned(), text.to_owned()),
        (None, Some(path)) => {
            let flag = format!("--output-file {}", path.display());
            let text = std::fs::read_to_string(path)
                .map_err(|e| TasksError::Usage(format!("{flag}: cannot read it: {e}")))?;
            (flag, text)
        }
        (None, None) => return Ok(None),
    };
    let value: Value =
        serde_json::from_str(&text).map_err(|e| TasksError::Usage(format!("{flag} is not JSON: {e}")))?;
    StepOutput::from_value(&value)
        .map_err(|e| TasksError::Usage(format!("{flag} cannot be the step's output: {e}")))?;
    Ok(Some(value))
}

/// Runs `complete` or `fail`: by the token, or by hand with --order and --step.
pub async fn run_step(
    verb: Verb,
    completion_of: CompletionOf<'_>,
    why: Option<&str>,
    args: &StepArgs,
) -> Result<ExitCode, TasksError> {
    match (&args.token, &args.order, &args.step) {
        (_, Some(order), Some(step)) => {
            let completion = completion_of.completion()?;
            let why = why.unwrap_or_default();
            let by_hand = ByHand { verb, order, step, why, dry_run: args.dry_run, seen: None };
            match by_hand.run(&completion, &args.common).await {
                Err(e) if unavailable(&e) => {
                    eprintln!("sasctl: {order}: not applied: {e}");
                    Ok(ExitCode::from(EXIT_UNAVAILABLE))
                }
                other => other,
            }
        }
        (Some(token), _, _) => {
            let args = TokenArgs { token: token.clone(), common: args.common.clone() };
            run(verb, completion_of, &args).await
        }
        _ => Err(TasksError::Usage("give the step's TOKEN, or --order and --step".into())),
    }
}

/// Runs one of the three commands by the token.
pub async fn run(
    verb: Verb,
    completion_of: CompletionOf<'_>,
    args: &TokenArgs,
) -> Result<ExitCode, TasksError> {
    let (token, claims) = read_token(&args.token, &mut std::io::stdin().lock())?;
    let completion = completion_of.completion()?;
    match apply(verb, &token, &claims, &completion, &args.common).await {
        Ok(code) => Ok(code),
        Err(e) if unavailable(&e) => {
            eprintln!("sasctl: {token}: not applied: {e}");
            Ok(ExitCode::from(EXIT_UNAVAILABLE))
        }
        Err(e) => Err(e),
    }
}

/// What the command line says the outside's word is.
#[derive(Debug, Clone, Copy)]
pub enum CompletionOf<'a> {
    Success { output: Option<&'a str>, file: Option<&'a Path> },
    Failure { reason: &'a str },
    Heartbeat,
}

impl CompletionOf<'_> {
    pub(crate) fn completion(self) -> Result<Completion, TasksError> {
        Ok(match self {
            CompletionOf::Success { output, file } => {
                Completion::Success { output: output_of(output, file)? }
            }
            CompletionOf::Failure { reason } => Completion::Failure { reason: reason.to_owned() },
            CompletionOf::Heartbeat => Completion::Heartbeat,
        })
    }
}

/// `complete` or `fail` by hand: the operator's word on the callback step `step` of
/// `order`, without its token (`sas::handlers::complete_as_operator`). `sasctl console`
/// runs the same three parts (cli/src/console/actions.rs).
pub(crate) struct ByHand<'a> {
    pub(crate) verb: Verb,
    pub(crate) order: &'a str,
    pub(crate) step: &'a str,
    pub(crate) why: &'a str,
    pub(crate) dry_run: bool,
    /// The revision a dry run showed (the console's confirm): refused if the task moved
    /// since, as every other action from the page is.
    pub(crate) seen: Option<u64>,
}

impl ByHand<'_> {
    async fn run(&self, completion: &Completion, common: &Common) -> Result<ExitCode, TasksError> {
        let policy = policy()?;
        let id = super::order_id(self.order)?;
        let ctx = Context::connect(common).await?;
        let Some(task) = ctx.task(&id).await? else {
            return self.told(common, &Err(format!("no task {id}")));
        };
        let wf = self.workflow(&ctx, &task)?;
        if self.dry_run {
            return self.told(common, &self.preview(&task, wf, completion, &policy));
        }
        let by = ctx.deployment.caller_identity().await?;
        let (deps, settings) = super::act::pipeline(&ctx, policy)?;
        let told = self.apply(&ctx, &deps, &settings, &by, completion).await?;
        self.told(common, &told)
    }

    /// The task's workflow, which must have the step named (bad input otherwise).
    pub(crate) fn workflow<'d>(
        &self,
        ctx: &'d Context,
        task: &TaskRecord,
    ) -> Result<&'d sas::domain::Workflow, TasksError> {
        let wf = ctx.workflow_of(task)?;
        if wf.step_named(self.step).is_none() {
            let names: Vec<&str> =
                wf.steps.iter().filter(|s| s.is_callback()).map(|s| s.name.as_str()).collect();
            return Err(TasksError::Usage(format!(
                "--step {}: workflow {} v{} has no such step (its callback steps: {})",
                self.step,
                wf.name,
                wf.version,
                if names.is_empty() { "none".to_owned() } else { names.join(", ") }
            )));
        }
        Ok(wf)
    }

    /// The dry run: the decision on the record as read, written nowhere.
    pub(crate) fn preview(
        &self,
        task: &TaskRecord,
        wf: &sas::domain::Workflow,
        completion: &Completion,
        policy: &sas::domain::Policy,
    ) -> Result<Told, String> {
        let actor = Actor { by: "(dry run)", why: self.why, seen: None, origin: Origin::Operator };
        let index = wf.step_named(self.step).unwrap_or_default();
        let decided = task.complete_as_operator(index, completion, actor, super::now(), wf, policy);
        decided
            .map(|d| Told::WouldApply {
                from: task.state().as_str(),
                to: d.next.state().as_str(),
                trigger: d.trigger.as_str(),
            })
            .map_err(|r| r.to_string())
    }

    /// The completion by hand, by `by`, through the handler: what came of it, or trouble
    /// with the deployment (worth running again).
    pub(crate) async fn apply(
        &self,
        ctx: &Context,
        deps: &sas::handlers::Deps,
        settings: &sas::handlers::Settings,
        by: &str,
        completion: &Completion,
    ) -> Result<Result<Told, String>, TasksError> {
        let id = super::order_id(self.order)?;
        let actor = Actor { by, why: self.why, seen: self.seen, origin: Origin::Operator };
        Ok(match complete_as_operator(deps, settings, &id, self.step, completion, actor).await {
            Ok(Operated::Applied { before, trigger, task }) => Ok(Told::Applied {
                from: before.as_str(),
                to: task.state().as_str(),
                trigger: trigger.as_str(),
            }),
            Ok(Operated::Refused(why)) => Err(why.to_string()),
            Ok(Operated::NoSuchTask) => Err(format!("no task {id}")),
            Err(HandlerError::Retry(why) | HandlerError::Throttled(why)) => {
                return Err(TasksError::Aws {
                    doing: format!("applying the {} to task {id}", self.verb.noun()),
                    at: ctx.deployment.at().to_owned(),
                    reason: format!(
                        "{}; run it again: it acts on the step as it then waits (if the first landed, it says the step no longer waits)",
                        crate::endpoint::one_line(&why)
                    ),
                });
            }
            Err(HandlerError::Reject(why)) => Err(crate::endpoint::one_line(&why)),
        })
    }

    /// What came of it, as one line (a refusal's without the `sasctl: ` it is printed
    /// with).
    pub(crate) fn line(&self, told: &Result<Told, String>) -> String {
        let (order, step) = (self.order, self.step);
        let done = if self.verb == Verb::Fail { "failed" } else { "completed" };
        match told {
            Ok(Told::Applied { from, to, trigger }) => {
                format!("{order}: step {step} {done} by hand: {from} -> {to} ({trigger})")
            }
            Ok(Told::WouldApply { from, to, trigger }) => format!(
                "{order}: step {step} would be {done} by hand: {from} -> {to} ({trigger}); dry run, nothing changed"
            ),
            Err(why) => format!("{order}: step {step}: refused: {why}"),
        }
    }

    /// Prints what came of it (one line, or one object with --json) and its exit status.
    fn told(&self, common: &Common, told: &Result<Told, String>) -> Result<ExitCode, TasksError> {
        if common.json {
            let mut v = json!({"act": self.verb.as_str(), "by_hand": true, "id": self.order, "step_name": self.step,
                               "reason": self.why, "dry_run": self.dry_run});
            match told {
                Ok(Told::Applied { from, to, trigger }) | Ok(Told::WouldApply { from, to, trigger }) => {
                    let outcome = if self.dry_run { "would_apply" } else { "applied" };
                    v["outcome"] = outcome.into();
                    (v["from"], v["to"], v["trigger"]) = ((*from).into(), (*to).into(), (*trigger).into());
                }
                Err(why) => (v["outcome"], v["refused"]) = ("refused".into(), why.clone().into()),
            }
            println!("{v}");
        } else if told.is_ok() {
            println!("{}", self.line(told));
        } else {
            eprintln!("sasctl: {}", self.line(told));
        }
        Ok(ExitCode::from(if told.is_ok() { EXIT_APPLIED } else { EXIT_REFUSED }))
    }
}

/// What a completion by hand came to, or would.
pub(crate) enum Told {
    Applied { from: &'static str, to: &'static str, trigger: &'static str },
    WouldApply { from: &'static str, to: &'static str, trigger: &'static str },
}

/// Trouble with the deployment itself (worth running again), as opposed to input that
/// is wrong (which running again cannot fix).
fn unavailable(e: &TasksError) -> bool {
    matches!(
        e,
        TasksError::Aws { .. }
            | TasksError::Store { .. }
            | TasksError::Deployment(DeploymentError::Aws { .. } | DeploymentError::NoIdentity { .. })
    )
}

async fn apply(
    verb: Verb,
    token: &CallbackToken,
    claims: &TokenClaims,
    completion: &Completion,
    common: &Common,
) -> Result<ExitCode, TasksError> {
    let policy = policy()?;
    let ctx = Context::connect(common).await?;
    // Read first, only to say clearly when these definitions cannot decide for the task
    // (the handler would only say it cannot); no task is the handler's refusal too.
    if let Some(task) = ctx.task(&claims.order_id).await? {
        ctx.workflow_of(&task)?;
    }
    let (deps, settings) = super::act::pipeline(&ctx, policy)?;
    let outcome = match complete(&deps, &settings, token.expose(), completion).await {
        Ok(Completed::Applied { before, trigger, task }) => {
            let name = render::step_name(render::workflow_of(&ctx.definitions, &task), claims.step);
            Outcome::Applied { before, after: task.state(), trigger: trigger.as_str(), name, task }
        }
        Ok(Completed::Noted { written_at, due }) => Outcome::Noted { written_at, due },
        Ok(Completed::Refused(why)) => Outcome::Refused(why.to_string()),
        // The store, a queue or the alerts topic failed: before the write (nothing
        // changed), or after it (its effects are the supervisor's to recover).
        Err(HandlerError::Retry(why) | HandlerError::Throttled(why)) => {
            return Err(TasksError::Aws {
                doing: format!("applying the {} to task {}", verb.noun(), claims.order_id),
                at: ctx.deployment.at().to_owned(),
                reason: format!(
                    "{}; run it again (if it landed, the second run says the step has ended)",
                    crate::endpoint::one_line(&why)
                ),
            });
        }
        Err(HandlerError::Reject(why)) => Outcome::Refused(crate::endpoint::one_line(&why)),
    };
    if common.json {
        println!("{}", outcome.json(verb, token, claims));
    } else {
        match &outcome {
            Outcome::Applied { .. } | Outcome::Noted { .. } => println!("{}", outcome.line(token, claims)),
            Outcome::Refused(_) => eprintln!("sasctl: {}", outcome.line(token, claims)),
        }
    }
    Ok(ExitCode::from(match outcome {
        Outcome::Applied { .. } | Outcome::Noted { .. } => EXIT_APPLIED,
        Outcome::Refused(_) => EXIT_REFUSED,
    }))
}

/// What the completion came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The task was `before`, moved by `trigger` to `after`; `task` is the record written.
    Applied {
        before: ProcessState,
        after: ProcessState,
        trigger: &'static str,
        name: Option<String>,
        task: Box<TaskRecord>,
    },
    /// A heartbeat acknowledged without a write: the one written at `written_at`, less
    /// than the floor before, stands; the step is due by `due`.
    Noted {
        written_at: sas::domain::Timestamp,
        due: sas::domain::Timestamp,
    },
    Refused(String),
}

impl Outcome {
    /// One line: the order, step and the step's own attempt the token is for, and what
    /// moved (or why not).
    pub fn line(&self, token: &CallbackToken, claims: &TokenClaims) -> String {
        match self {
            Outcome::Applied { before, after, trigger, name, task } => {
                let step = match name {
                    Some(n) => format!("step {} {n}", claims.step),
                    None => format!("step {}", claims.step),
                };
                let mut line = format!(
                    "{}: {step}, attempt {}: {} -> {} ({trigger})",
                    claims.order_id,
                    step_attempt(task, claims),
                    before.as_str(),
                    after.as_str()
                );
                if let Some(due) = next_due(task) {
                    line.push_str(&format!("; next heartbeat or completion due by {}", render::iso(due)));
                }
                line
            }
            Outcome::Noted { written_at, due } => format!(
                "{}: step {}: heartbeat noted (the one written at {} stands); next heartbeat or completion due by {}",
                claims.order_id,
                claims.step,
                render::iso(*written_at),
                render::iso(*due)
            ),
            Outcome::Refused(why) => format!("{token}: refused: {why}"),
        }
    }

    pub fn json(&self, verb: Verb, token: &CallbackToken, claims: &TokenClaims) -> Value {
        let mut v = json!({
            "act": verb.as_str(),
            "token": token.to_string(),
            "id": claims.order_id.as_str(),
            "step": claims.step,
            "task_attempt": claims.attempt,
        });
        match self {
            Outcome::Applied { before, after, trigger, name, task } => {
                v["outcome"] = "applied".into();
                v["attempt"] = step_attempt(task, claims).into();
                v["step_name"] = json!(name);
                v["from"] = before.as_str().into();
                v["to"] = after.as_str().into();
                v["trigger"] = (*trigger).into();
                if let Some(due) = next_due(task) {
                    v["next_due"] = render::iso(due).into();
                }
            }
            Outcome::Noted { written_at, due } => {
                v["outcome"] = "noted".into();
                v["written_at"] = render::iso(*written_at).into();
                v["next_due"] = render::iso(*due).into();
            }
            Outcome::Refused(why) => {
                v["outcome"] = "refused".into();
                v["reason"] = why.clone().into();
            }
        }
        v
    }
}

/// The step's own attempt the token was for (its claims carry the task's counter): from
/// the written record's entry of the move, or its `step_attempts` while it still waits on
/// that attempt; the task's counter if neither says (not seen: the move always logs).
fn step_attempt(task: &TaskRecord, claims: &TokenClaims) -> u32 {
    let logged = task.timeline.iter().rev().find(|e| {
        e.what != sas::domain::Happened::Submitted && (e.step, e.attempt) == (claims.step, claims.attempt)
    });
    match logged {
        Some(entry) => entry.step_attempt(),
        None if (task.step, task.attempt) == (claims.step, claims.attempt) => task.step_attempts,
        None => claims.attempt,
    }
}

/// After a heartbeat, when the step is due again (it still waits on the same attempt).
fn next_due(task: &TaskRecord) -> Option<sas::domain::Timestamp> {
    task.callback().map(|cb| cb.due())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::domain::{CallbackSecret, OrderId, Timestamp};

    fn token() -> CallbackToken {
        CallbackToken::mint(&OrderId::parse("o-1").unwrap(), 1, 3, &CallbackSecret([0xab; 32]))
    }

    #[test]
    fn a_token_is_read_from_the_argument_or_one_line_of_stdin() {
        let whole = token().expose().to_owned();
        let (t, claims) = read_token(&whole, &mut std::io::empty()).unwrap();
        assert_eq!((t, claims.step, claims.attempt), (token(), 1, 3));
        let mut piped = std::io::Cursor::new(format!("{whole}\nsomething else\n"));
        assert_eq!(read_token("-", &mut piped).unwrap().0, token());
        let e = read_token("-", &mut std::io::Cursor::new("\n")).unwrap_err().to_string();
        assert_eq!(e, "TOKEN -: stdin had no token (give it on one line)");
        let e = read_token("o-1", &mut std::io::empty()).unwrap_err().to_string();
        assert_eq!(
            e,
            "TOKEN \"o-1\" is an order id, not a callback token: give the token the step's agent request carried (sasctl tasks show o-1 says which step and attempt wait for one)"
        );
        let e = read_token("sas1.o-1.1.3.abab", &mut std::io::empty()).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "TOKEN: a callback token is sas1.<order id>.<step>.<attempt>.<64 hex digits>; this one "
            ),
            "{e}"
        );
        // A near miss (one digit off the alphabet) is not echoed.
        let near = format!("{}G", &whole[..whole.len() - 1]);
        let e = read_token(&near, &mut std::io::empty()).unwrap_err().to_string();
        assert!(!e.contains(&near[near.len() - 20..]), "{e}");
    }

    #[test]
    fn an_output_must_be_json_that_a_step_can_keep() {
        assert_eq!(output_of(None, None).unwrap(), None);
        assert_eq!(
            output_of(Some(r#"{"approved_by":"ana"}"#), None).unwrap(),
            Some(json!({"approved_by": "ana"}))
        );
        let e = output_of(Some("{approved_by: ana}"), None).unwrap_err().to_string();
        assert!(e.starts_with("--output is not JSON: key must be a string at line 1 column 2"), "{e}");
        let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(5_000));
        let e = output_of(Some(&big), None).unwrap_err().to_string();
        assert!(e.starts_with("--output cannot be the step's output: "), "{e}");
        let e = output_of(None, Some(Path::new("/nonexistent/out.json"))).unwrap_err().to_string();
        assert!(e.starts_with("--output-file /nonexistent/out.json: cannot read it: "), "{e}");
        let dir = std::env::temp_dir().join(format!("sasctl-output-{}", std::process::id()));
        std::fs::write(&dir, "[1, 2").unwrap();
        let e = output_of(None, Some(&dir)).unwrap_err().to_string();
        assert!(e.starts_with(&format!("--output-file {} is not JSON: ", dir.display())), "{e}");
        std::fs::write(&dir, "[1, 2]\n").unwrap();
        assert_eq!(output_of(None, Some(&dir)).unwrap(), Some(json!([1, 2])));
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn outcomes_are_one_line_that_never_shows_the_token_whole() {
        let t = token();
        let claims = CallbackToken::parse(t.expose()).unwrap().1;
        let mut task = crate::fixtures::task("o-1", ProcessState::Pending);
        task.step = 2;
        // The completion's entry: step 1's first attempt, the task's third claim.
        std::sync::Arc::make_mut(&mut task.timeline).push(sas::domain::Entry {
            at: Timestamp(1_700_000_000_000),
            what: sas::domain::Happened::Moved(sas::domain::Trigger::Advanced),
            step: 1,
            attempt: 3,
            step_attempt: Some(1),
            note: None,
            by: None,
        });
        let applied = Outcome::Applied {
            before: ProcessState::Waiting,
            after: ProcessState::Pending,
            trigger: "Advanced",
            name: Some("approve".into()),
            task: Box::new(task.clone()),
        };
        assert_eq!(
            applied.line(&t, &claims),
            "o-1: step 1 approve, attempt 1: Waiting -> Pending (Advanced)"
        );
        let v = applied.json(Verb::Complete, &t, &claims);
        assert_eq!(v["outcome"], "applied");
        assert_eq!((v["from"].as_str(), v["to"].as_str()), (Some("Waiting"), Some("Pending")));
        assert_eq!(v["token"], "sas1.o-1.1.3.abab…");
        assert_eq!((&v["attempt"], &v["task_attempt"]), (&json!(1), &json!(3)));
        assert!(v.get("next_due").is_none());
        // A heartbeat says when the next is due.
        let mut waiting = crate::fixtures::task("o-1", ProcessState::Waiting);
        (waiting.step, waiting.attempt, waiting.step_attempts) = (1, 3, 2);
        let waiting = waiting.with_phase(sas::domain::Phase::waiting(sas::domain::WaitingFor::Callback(
            sas::domain::Awaiting {
                step: 1,
                attempt: 3,
                digest: t.digest(),
                timeout_at: Timestamp(1_700_000_100_000),
                heartbeat_ms: Some(10_000),
                last_heartbeat: Some(Timestamp(1_700_000_020_000)),
                started_at: Some(Timestamp(1_700_000_001_000)),
                since: Timestamp(1_700_000_000_000),
            },
        )));
        let beat = Outcome::Applied {
            before: ProcessState::Waiting,
            after: ProcessState::Waiting,
            trigger: "Heartbeat",
            name: None,
            task: Box::new(waiting),
        };
        assert_eq!(
            beat.line(&t, &claims),
            "o-1: step 1, attempt 2: Waiting -> Waiting (Heartbeat); next heartbeat or completion due by 2023-11-14T22:13:51.000Z"
        );
        assert_eq!(beat.json(Verb::Heartbeat, &t, &claims)["next_due"], "2023-11-14T22:13:51.000Z");
        let refused = Outcome::Refused("the token does not match the one issued for step 1 attempt 3".into());
        let line = refused.line(&t, &claims);
        assert_eq!(
            line,
            "sas1.o-1.1.3.abab…: refused: the token does not match the one issued for step 1 attempt 3"
        );
        let v = refused.json(Verb::Fail, &t, &claims);
        for shown in [line, v.to_string()] {
            assert!(!shown.contains(&t.expose()[20..]), "{shown}");
        }
        assert_eq!(v["outcome"], "refused");
    }

    #[test]
    fn trouble_with_the_deployment_is_told_apart_from_bad_input() {
        let aws = TasksError::Aws { doing: "x".into(), at: "y".into(), reason: "z".into() };
        assert!(unavailable(&aws));
        assert!(unavailable(&TasksError::Store { table: "t".into(), reason: "r".into() }));
        assert!(!unavailable(&TasksError::Usage("u".into())));
        assert!(!unavailable(&TasksError::NoTable { table: "t".into(), at: "a".into() }));
    }
}

#[cfg(test)]
mod parsing_tests {
    use clap::Parser;

    use super::super::TasksCommand;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: TasksCommand,
    }

    fn parse(args: &[&str]) -> Result<TasksCommand, clap::Error> {
        Cli::try_parse_from([&["tasks"], args].concat()).map(|c| c.command)
    }

    #[test]
    fn the_three_commands_take_a_token_or_a_dash() {
        match parse(&["complete", "-", "--output", "{}", "--prefix", "p"]).unwrap() {
            TasksCommand::Complete(a) => {
                assert_eq!((a.step.token.as_deref(), a.output.as_deref()), (Some("-"), Some("{}")));
                assert_eq!(a.step.common.deployment.prefix.as_deref(), Some("p"));
            }
            _ => panic!("not complete"),
        }
        match parse(&["fail", "sas1.x", "--reason", " no ", "--json"]).unwrap() {
            TasksCommand::Fail(a) => assert_eq!((a.reason.as_str(), a.step.common.json), ("no", true)),
            _ => panic!("not fail"),
        }
        // By hand: --order with --step and --reason, never with a token.
        match parse(&["complete", "--order", "o-1", "--step", "approve", "--reason", "phoned", "--dry-run"])
            .unwrap()
        {
            TasksCommand::Complete(a) => assert_eq!(
                (a.step.order.as_deref(), a.step.step.as_deref(), a.reason.as_deref(), a.step.dry_run),
                (Some("o-1"), Some("approve"), Some("phoned"), true)
            ),
            _ => panic!("not complete"),
        }
        assert!(matches!(parse(&["heartbeat", "sas1.x"]).unwrap(), TasksCommand::Heartbeat(_)));
        use clap::error::ErrorKind;
        let kind = |args: &[&str]| parse(args).err().map(|e| e.kind());
        assert_eq!(
            kind(&["complete", "t", "--output", "1", "--output-file", "f"]),
            Some(ErrorKind::ArgumentConflict)
        );
        assert_eq!(kind(&["fail", "t"]), Some(ErrorKind::MissingRequiredArgument));
        assert_eq!(kind(&["fail", "t", "--reason", " "]), Some(ErrorKind::ValueValidation));
        assert_eq!(kind(&["heartbeat"]), Some(ErrorKind::MissingRequiredArgument));
        assert_eq!(
            kind(&["complete", "--order", "o-1", "--step", "a"]),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind(&["fail", "t", "--order", "o-1", "--step", "a", "--reason", "r"]),
            Some(ErrorKind::ArgumentConflict)
        );
        assert_eq!(kind(&["complete", "t", "--dry-run"]), Some(ErrorKind::MissingRequiredArgument));
        assert_eq!(kind(&["heartbeat", "--order", "o-1"]), Some(ErrorKind::UnknownArgument));
        assert_eq!(kind(&["heartbeat", "t", "--output", "{}"]), Some(ErrorKind::UnknownArgument));
    }
}
