//! One invocation as the loop drives it: the future that runs a Lambda invocation's
//! handlers (a batch through `run_batch`, a supervisor sweep, an operator's command), what
//! it returns, and the poll that tells the ports whose I/O call is running. The loop
//! (`event_loop.rs`) decides when each is polled; this file only ties the handlers to the
//! hand-made executor (`executor.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use sas::adapters::embedded::Received;
use sas::domain::Completion;
use sas::domain::OrderId;
use sas::handlers::{
    Agent, BatchOrder, BatchReport, Callbacks, Completed, DeadLetters, HandlerError, Inbound, Operated,
    Scheduler, Submission, Supervisor, SweepReport, run_batch_in,
};

use crate::deployment::Role;
use crate::executor::{Flag, poll_caught, with_msg};
use crate::outside::Acked;
use crate::world::{InvocationId, Shared};

/// What an invocation returned, by what it ran.
pub enum Returned {
    Batch(BatchReport),
    Sweep(Result<SweepReport, HandlerError>),
    Operator(Result<Operated, HandlerError>),
    /// The outside's word, sent directly (`sasctl tasks complete|fail|heartbeat`).
    Outside(Result<Completed, HandlerError>),
}

/// An invocation's handlers as one future, boxed: the loop holds invocations of every
/// role side by side.
pub type InvocationFuture = Pin<Box<dyn Future<Output = Returned>>>;

/// A running invocation, as the loop keeps it.
pub struct Invocation {
    pub role: Role,
    pub future: InvocationFuture,
    pub flag: Arc<Flag>,
    /// The queue its batch came from, and the batch, to delete once it returns.
    pub queue: Option<&'static str>,
    pub received: Vec<Received>,
    /// A scheduler batch's forward replies, by their place in `received` (order, step),
    /// when the seed has parallel stages (`EventLoop::count_branch_replies`).
    pub replies: Vec<Option<(OrderId, u32)>>,
    /// Crash when this many I/O calls have been granted (at the next one, or at the end).
    pub crash_at: Option<u32>,
    pub granted: u32,
    /// The agent handler it runs on: one per unit of the agent's concurrency.
    pub agent_slot: Option<usize>,
    /// Supervisor: the tasks due when it started, by revision, for the "acted on by the
    /// next run" check.
    pub due_at_start: Vec<(OrderId, u64)>,
}

impl Invocation {
    /// An invocation a queue feeds: it runs the batch `received` from `queue`, which the
    /// loop deletes when it returns.
    pub fn batch(
        role: Role,
        future: InvocationFuture,
        queue: &'static str,
        received: Vec<Received>,
        crash_at: Option<u32>,
        agent_slot: Option<usize>,
    ) -> Invocation {
        Invocation {
            queue: Some(queue),
            received,
            agent_slot,
            ..Invocation::unqueued(role, future, crash_at, Vec::new())
        }
    }

    /// An invocation no queue feeds (a supervisor run, an operator's command).
    pub fn unqueued(
        role: Role,
        future: InvocationFuture,
        crash_at: Option<u32>,
        due_at_start: Vec<(OrderId, u64)>,
    ) -> Invocation {
        Invocation {
            role,
            future,
            flag: Flag::woken(),
            queue: None,
            received: Vec::new(),
            replies: Vec::new(),
            crash_at,
            granted: 0,
            agent_slot: None,
            due_at_start,
        }
    }

    /// Polls it once as invocation `id`: while it runs, the ports see it as the running
    /// invocation (a write records who made it). `Err` is a panic's message.
    pub fn poll(&mut self, id: InvocationId, shared: &Shared) -> Result<Poll<Returned>, String> {
        {
            let mut w = shared.w();
            w.current_invocation = Some(id);
            w.current_message = None;
        }
        let result = poll_caught(self.future.as_mut(), &self.flag);
        {
            let mut w = shared.w();
            w.current_invocation = None;
            w.current_message = None;
        }
        result
    }
}

/// A function a queue feeds: what `run_batch` calls for each message of its batch.
pub trait QueueFed: 'static {
    fn handle_message(&self, message: Inbound) -> impl Future<Output = Result<(), HandlerError>> + '_;
}

/// A handler shared by the invocations that run it (`deploy::Deployed`).
impl<T: QueueFed> QueueFed for Arc<T> {
    fn handle_message(&self, message: Inbound) -> impl Future<Output = Result<(), HandlerError>> + '_ {
        T::handle_message(self, message)
    }
}

impl QueueFed for Submission {
    fn handle_message(&self, message: Inbound) -> impl Future<Output = Result<(), HandlerError>> + '_ {
        self.handle(message)
    }
}

impl QueueFed for Scheduler {
    fn handle_message(&self, message: Inbound) -> impl Future<Output = Result<(), HandlerError>> + '_ {
        self.handle(message)
    }
}

/// The callback queue's handler, noting each word it acknowledges (`Outside::acked`).
pub struct NotingAcks {
    pub callbacks: Arc<Callbacks>,
    pub shared: Arc<Shared>,
}

impl QueueFed for NotingAcks {
    async fn handle_message(&self, message: Inbound) -> Result<(), HandlerError> {
        let at = self.shared.w().now;
        let body: Arc<str> = message.body.as_str().into();
        let handled = self.callbacks.handle(message).await;
        if handled.is_ok() {
            self.shared.w().outside.acked.push(Acked { at, body });
        }
        handled
    }
}

impl QueueFed for Agent {
    fn handle_message(&self, message: Inbound) -> impl Future<Output = Result<(), HandlerError>> + '_ {
        self.handle(message)
    }
}

/// A batch through `run_batch`, as Lambda's SQS event source mapping hands it over; each
/// message's handler runs with that message set, so its writes record what they were for.
pub fn run_messages(
    (handler, order): (impl QueueFed, BatchOrder),
    shared: Arc<Shared>,
    messages: Vec<Inbound>,
    dead_letters: DeadLetters,
) -> InvocationFuture {
    Box::pin(async move {
        Returned::Batch(
            run_batch_in(order, messages, &dead_letters, |m| {
                let body: Arc<str> = m.body.as_str().into();
                with_msg(&shared, body, handler.handle_message(m))
            })
            .await,
        )
    })
}

/// The outside party's `sasctl tasks complete|fail|heartbeat`: the word `body` stands for,
/// through `handlers::complete` on a scheduler function's container; its writes record
/// `body` as what they were made for, as the queue's would.
pub fn outside_command(
    callbacks: Arc<Callbacks>,
    shared: Arc<Shared>,
    body: String,
    token: String,
    completion: Completion,
) -> InvocationFuture {
    Box::pin(async move {
        let at = shared.w().now;
        let body: Arc<str> = body.into();
        let word = sas::handlers::complete(&callbacks.deps, &callbacks.settings, &token, &completion);
        let done = with_msg(&shared, body.clone(), word).await;
        if matches!(done, Ok(Completed::Applied { .. } | Completed::Noted { .. })) {
            shared.w().outside.acked.push(Acked { at, body });
        }
        Returned::Outside(done)
    })
}

/// A supervisor run: one sweep.
pub fn sweep(supervisor: Arc<Supervisor>) -> InvocationFuture {
    Box::pin(async move { Returned::Sweep(supervisor.sweep().await) })
}
