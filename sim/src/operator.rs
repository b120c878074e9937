//! The simulated operator: which task it acts on, what it does there, and whether the
//! same action goes out twice at once, as from two terminals. The loop (`event_loop.rs`)
//! decides when it acts; its commands run as invocations of their own.

use sas::domain::{Act, Actor, Completion, OrderId, Origin, ProcessState, TaskRecord};
use sas::handlers::Submission;

use crate::invocation::{InvocationFuture, Returned};
use crate::world::World;

/// Who the simulated operator's actions name.
pub const OPERATOR: &str = "sim-operator";

/// What the operator does.
#[derive(Debug, Clone)]
pub enum Command {
    Act(Act),
    /// Completes (or fails) the callback step `step` by hand, without its token
    /// (`sasctl tasks complete --order`).
    /// It names the step `name`, as the command line does (the loop names it from the
    /// task's workflow).
    ByHand {
        step: u32,
        name: String,
        completion: Completion,
    },
}

/// One action, decided.
pub struct Decision {
    pub task: TaskRecord,
    pub command: Command,
    /// Sent twice at once: the two must land at most once between them.
    pub twins: bool,
}

/// Picks a task of `tasks` (not empty) and what its state calls for (or, now and then,
/// what it does not: that must be refused). One in three is sent twice. A live task is
/// paused one time in four; a paused one is mostly resumed (and whatever is still paused
/// when the faults stop is resumed by the loop, `resume_held`).
pub fn decide(tasks: &[TaskRecord], w: &mut World, pauses: Option<&mut fastrand::Rng>) -> Decision {
    // Mostly a task in Error, when there is one: that is what operators act on.
    let errors: Vec<&TaskRecord> = tasks.iter().filter(|t| t.state() == ProcessState::Error).collect();
    let task = if !errors.is_empty() && w.rng.u8(..3) > 0 {
        errors[w.rng.usize(..errors.len())].clone()
    } else {
        tasks[w.rng.usize(..tasks.len())].clone()
    };
    let resubmit = |w: &mut World| Act::Resubmit {
        from_step: (w.rng.u8(..3) == 0).then(|| w.rng.u32(0..=task.step + 1)),
    };
    // Pauses come from their own generator, so a seed without them runs as before them;
    // and so do completions by hand: one action in three, when a task waits on a callback,
    // completes or fails one of those (maybe one that has moved on since, as an operator
    // acting on a listing would).
    if let Some(p) = pauses {
        let waiting: Vec<&TaskRecord> =
            tasks.iter().filter(|t| t.state() == ProcessState::Waiting && t.callback().is_some()).collect();
        if !waiting.is_empty() && p.u8(..3) == 0 {
            let task = waiting[p.usize(..waiting.len())].clone();
            let cb = task.callback().expect("waits on a callback").clone();
            // The output is the outside's own (the operator relays its answer: the loop
            // fills it in from what the outside party answers for the step).
            let completion = if p.bool() {
                Completion::Success { output: None }
            } else {
                Completion::Failure { reason: "refused by hand".into() }
            };
            let command = Command::ByHand { step: cb.step, name: String::new(), completion };
            return Decision { task, command, twins: p.u8(..3) == 0 };
        }
        let act = match task.state() {
            // A paused task is mostly resumed; now and then paused again (refused).
            _ if task.paused() && p.u8(..4) > 0 => Some(Act::Resume),
            _ if task.paused() => Some(Act::Pause),
            state if !state.is_terminal() && p.u8(..4) == 0 => Some(Act::Pause),
            _ => None,
        };
        if let Some(act) = act {
            return Decision { task, command: Command::Act(act), twins: p.u8(..3) == 0 };
        }
    }
    let act = match task.state() {
        ProcessState::Error if w.rng.bool() => Act::Compensate,
        ProcessState::Error => resubmit(w),
        ProcessState::Pending | ProcessState::Processing | ProcessState::Waiting if w.rng.u8(..4) > 0 => {
            Act::Cancel
        }
        _ => match w.rng.u8(..3) {
            0 => Act::Cancel,
            1 => Act::Compensate,
            _ => resubmit(w),
        },
    };
    Decision { task, command: Command::Act(act), twins: w.rng.u8(..3) == 0 }
}

/// The operator's command (`sasctl tasks`), run on a submission function's container.
pub fn command(
    submission: std::sync::Arc<Submission>,
    order_id: OrderId,
    command: Command,
    why: String,
    seen: u64,
) -> InvocationFuture {
    Box::pin(async move {
        let (deps, settings) = (&submission.deps, &submission.settings);
        // Decided on the task as the operator saw it: a twin, or one delayed until the
        // task came back to the same state, must not land a second time.
        let actor = Actor { by: OPERATOR, why: &why, seen: Some(seen), origin: Origin::Operator };
        Returned::Operator(match command {
            Command::Act(act) => sas::handlers::operate(deps, settings, &order_id, act, actor).await,
            Command::ByHand { name, completion, .. } => {
                sas::handlers::complete_as_operator(deps, settings, &order_id, &name, &completion, actor)
                    .await
            }
        })
    })
}
