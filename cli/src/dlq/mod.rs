//! `sasctl dlq`: read a dead-letter queue without consuming it, and move its messages back
//! to the work queue they came from.
//!
//! Reading SQS means receiving: `list` receives with a short visibility timeout and makes
//! every message it saw visible again at once, so other consumers miss them for a few
//! seconds at most, and each message's receive count goes up by one (harmless on a DLQ,
//! which has no redrive policy of its own; `list` refuses a queue that has one).
//!
//! `redrive` uses SQS's own message move task (StartMessageMoveTask, followed with
//! ListMessageMoveTasks) where the endpoint offers it. Where it does not (moto has no
//! message move tasks), it receives, sends to the source queue and deletes from the DLQ,
//! ten at a time, deleting a message only after its send succeeded: a failure leaves it in
//! the DLQ, at worst also in the source queue (a duplicate, which every handler tolerates),
//! never in neither.
//!
//! A redrive goes at most `--rate` messages a second (50 by default), so a DLQ of thousands
//! does not land on the functions at once. Cancels are held back: a cancel kept in the
//! orders DLQ may be stale by the time it is redriven (its order resubmitted by an
//! operator since, or sent again), and sent again it would stop that order. They stay in
//! the DLQ unless `--include-cancels`; holding them back means reading every message, so
//! the orders DLQ (or a DLQ named by URL) is then moved by hand, not by a move task.
//!
//! The callback DLQ holds completions of callback steps the scheduler refused (a dead or
//! forged token, a malformed message), each with its reason. Their bodies carry tokens,
//! which complete steps: `list` shows them redacted; a redrive moves them whole.
//!
//! Files, each using only those listed before it (and this file's arguments and errors):
//! `queue.rs` (finding the DLQ, and
//! the SQS calls on it), `message.rs` (a kept message), `render.rs` (printing messages),
//! `list.rs` (`list`, and peeking), `redrive.rs` (`redrive`).

mod list;
mod message;
mod queue;
mod redrive;
mod render;

use std::str::FromStr;

use crate::args::whole;
use crate::deployment::{DeploymentArgs, DeploymentError, WorkQueue};

pub use list::{list, peek};
pub use message::DlqMessage;
pub use queue::{Source, Target, target};
pub use redrive::{Method, Redriven, attributes_to_keep, redrive};

/// How long `list` hides what it receives: long enough to page through `--limit`
/// messages without seeing one twice, and it is cut short as soon as the listing ends.
pub const PEEK_VISIBILITY_S: i32 = 20;
/// How long the fallback redrive hides a batch while sending it to the source queue: if
/// sasctl dies mid-batch, the batch is back in the DLQ after this.
pub const MOVE_VISIBILITY_S: i32 = 60;
/// SQS's limit on a move task's rate, used for the fallback's `--rate` too.
pub const MAX_RATE: u32 = 500;
/// `--rate` unless given: a DLQ of thousands trickles back rather than landing at once.
pub const DEFAULT_RATE: u32 = 50;

/// QUEUE: a work queue whose DLQ is meant, or a DLQ's URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueArg {
    Work(WorkQueue),
    Url(String),
}

impl FromStr for QueueArg {
    type Err = String;
    fn from_str(s: &str) -> Result<QueueArg, String> {
        if let Some(q) = WorkQueue::parse(s) {
            return Ok(QueueArg::Work(q));
        }
        if crate::endpoint::check_url(s).is_ok() {
            return Ok(QueueArg::Url(s.to_owned()));
        }
        Err(format!("must be orders, scheduler, agent, callbacks or a DLQ's URL (got {s:?})"))
    }
}

/// `sasctl dlq list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// orders, scheduler, agent or callbacks (the work queue whose DLQ to read), or a DLQ's
    /// URL.
    #[arg(value_name = "QUEUE")]
    pub queue: QueueArg,
    /// Messages to show at most (1 to 1000).
    #[arg(long, default_value_t = 50, value_parser = whole::<usize>("--limit", 1, 1_000))]
    pub limit: usize,
    /// One JSON object per message (its whole body included).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// `sasctl dlq redrive`.
#[derive(Debug, Clone, clap::Args)]
pub struct RedriveArgs {
    /// orders, scheduler, agent or callbacks (the work queue whose DLQ to redrive), or a
    /// DLQ's URL (its source queue is the one queue whose redrive policy names it).
    #[arg(value_name = "QUEUE")]
    pub queue: QueueArg,
    /// Messages moved per second at most (1 to 500).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RATE,
          value_parser = whole::<u32>("--rate", 1, MAX_RATE.into()))]
    pub rate: u32,
    /// Redrive apps' cancel messages too. Without it they stay in the DLQ: a cancel may be
    /// stale by now (its order resubmitted or sent again since), and would stop the order.
    #[arg(long)]
    pub include_cancels: bool,
    /// Move nothing: say where the messages would go, or why one would stay, and list them
    /// (as `list` does, hiding them for a few seconds).
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: messages to list at most (1 to 1000).
    #[arg(long, default_value_t = 50, requires = "dry_run",
          value_parser = whole::<usize>("--limit", 1, 1_000))]
    pub limit: usize,
    /// One JSON object for the result (with --dry-run, one per message first).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
}

/// Why a `dlq` command stopped. Each displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DlqError {
    #[error(transparent)]
    Deployment(#[from] DeploymentError),
    #[error("queue {url} does not exist at {at}: check the URL (aws sqs list-queues)")]
    NoSuchQueue { url: String, at: String },
    #[error(
        "{url} is not a dead-letter queue (it has a redrive policy of its own): reading it would count towards moving its messages to its DLQ"
    )]
    NotADlq { url: String },
    #[error(
        "{why}: name the work queue (orders, scheduler, agent, callbacks) with --stack or --prefix instead of the URL"
    )]
    NoSource { why: String },
    #[error("{doing} at {at} failed: {reason}")]
    Aws { doing: String, at: String, reason: String },
    /// The message move task ended without moving everything.
    #[error("the message move task {handle} ended {status}: {reason} ({moved} moved)")]
    MoveTask { handle: String, status: String, reason: String, moved: i64 },
    /// The fallback redrive stopped: these were not sent and stay in the DLQ.
    #[error(
        "{failed} message(s) could not be sent to {source_url} ({reason}); they stay in the DLQ ({moved} moved)"
    )]
    NotSent { failed: usize, source_url: String, reason: String, moved: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_has_a_rate_and_holds_cancels_back_unless_asked() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            redrive: RedriveArgs,
        }
        let args = Cli::try_parse_from(["redrive", "orders"]).unwrap().redrive;
        assert_eq!((args.rate, args.include_cancels), (DEFAULT_RATE, false));
        let args =
            Cli::try_parse_from(["redrive", "orders", "--rate", "7", "--include-cancels"]).unwrap().redrive;
        assert_eq!((args.rate, args.include_cancels), (7, true));
    }

    #[test]
    fn queue_names_and_urls() {
        assert_eq!("orders".parse(), Ok(QueueArg::Work(WorkQueue::Orders)));
        assert_eq!("agent".parse(), Ok(QueueArg::Work(WorkQueue::Agent)));
        assert_eq!("callbacks".parse(), Ok(QueueArg::Work(WorkQueue::Callbacks)));
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/sas-orders-dlq";
        assert_eq!(url.parse(), Ok(QueueArg::Url(url.into())));
        assert_eq!(
            "status".parse::<QueueArg>(),
            Err("must be orders, scheduler, agent, callbacks or a DLQ's URL (got \"status\")".into())
        );
    }
}
