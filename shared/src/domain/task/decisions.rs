//! The domain's public decisions: one entry per message kind and operator act. Each is a
//! pure function of the record as read, the event, the time and the workflow, and returns
//! the next record (built, so of a shape its state allows) and the effects to perform once
//! its conditional write has landed, or the refusal that says why nothing changes.
//!
//! | message or act | decision |
//! |---|---|
//! | `schedule` (scheduler) | [`TaskRecord::schedule`]: wake a timer, sleep at a timer step, or claim |
//! | `schedule`, a limited agent full | [`TaskRecord::queue`]: wait for a place with a ticket |
//! | `schedule`, the store throttled | [`TaskRecord::defer`]: the deadline moves past the backoff |
//! | agent reply | [`TaskRecord::fence`], then [`TaskRecord::apply_reply`] |
//! | callback word (the outside) | [`TaskRecord::awaiting_token`], then [`TaskRecord::complete`] |
//! | due (supervisor) | [`TaskRecord::recover`]: wake, ask the gate again, or lapse |
//! | operator or app | [`TaskRecord::act`]: resubmit, compensate, cancel, pause, resume |
//!
//! The moves themselves live in the peers of this file (`claim.rs`, `reply.rs`, ...),
//! on a flat working copy of the record (`draft.rs`).

use super::claim::Mint;
use super::draft::Draft;
use super::outcome::{Act, Actor, Effect, Origin, Policy, Refusal, StaleReason};
use super::record::{Decision, TaskRecord};
use crate::domain::callback::{Awaiting, CallbackToken, Completion, CompletionRefused, TokenClaims};
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::Trigger;
use crate::domain::messages::AgentReply;
use crate::domain::workflow::Workflow;

impl TaskRecord {
    /// Scheduler, on a Schedule: a waiting timer wakes, a timer step starts to sleep, any
    /// other step is claimed.
    pub fn schedule(
        &self,
        mint: impl Into<Mint>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().schedule(mint, now, wf, policy))
    }

    /// Scheduler: take the task for its current step (Pending, or Compensating and unlocked).
    pub fn claim(
        &self,
        mint: impl Into<Mint>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().claim(mint, now, wf, policy))
    }

    /// Scheduler: the step's agent had no room and handed out `ticket`.
    pub fn queue(
        &self,
        agent: &str,
        ticket: u64,
        now: Timestamp,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().queue(agent, ticket, now, policy))
    }

    /// Scheduler: the state store throttled the claim, and the Schedule comes back after a
    /// backoff: the deadline moves out past it, so the wait counts no failure.
    pub fn defer(&self, now: Timestamp, policy: &Policy) -> Result<Decision, Refusal> {
        built(self, self.draft().defer(now, policy))
    }

    /// The fence: the reply belongs to the live lease of this very attempt, in time.
    pub fn fence(&self, reply: &AgentReply, now: Timestamp) -> Result<(), StaleReason> {
        self.draft().fence(reply, now)
    }

    /// Scheduler: apply an agent's reply, if it passes the fence.
    pub fn apply_reply(
        &self,
        reply: &AgentReply,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().apply_reply(reply, now, wf, policy))
    }

    /// The token's fence: the wait it completes, if it may.
    pub fn awaiting_token(
        &self,
        token: &CallbackToken,
        claims: &TokenClaims,
        now: Timestamp,
    ) -> Result<&Awaiting, CompletionRefused> {
        self.draft().awaiting_token(token, claims, now)?;
        Ok(self.callback().expect("a token that passed its fence has a wait"))
    }

    /// The outside's word on a callback step, presented with its token.
    pub fn complete(
        &self,
        token: &CallbackToken,
        claims: &TokenClaims,
        completion: &Completion,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().complete(token, claims, completion, now, wf, policy))
    }

    /// An operator's completion or failure of the callback step `step` the task waits
    /// on, without its token, recorded with who gave it and why.
    pub fn complete_as_operator(
        &self,
        step: u32,
        completion: &Completion,
        actor: Actor<'_>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().complete_as_operator(step, completion, actor, now, wf, policy))
    }

    /// Supervisor: the task is due. A timer wakes, a task waiting for a place asks its
    /// gate again, anything else has lapsed.
    pub fn recover(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().recover(now, wf, policy, jitter))
    }

    /// The deadline passed with the step neither answered nor woken: retry or give up.
    pub fn lapse(
        &self,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
        jitter: u64,
    ) -> Result<Decision, Refusal> {
        built(self, self.draft().lapse(now, wf, policy, jitter))
    }

    /// A waiting timer's time came.
    pub fn wake(&self, now: Timestamp, wf: &Workflow, policy: &Policy) -> Result<Decision, Refusal> {
        built(self, self.draft().wake(now, wf, policy))
    }

    /// The operator's `act` on this task as read, or why it does not apply.
    pub fn act(
        &self,
        act: Act,
        actor: Actor<'_>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision, Refusal> {
        // First, so an app learns nothing of another sender's order, not even its state.
        if let Origin::App { sender } = actor.origin
            && !crate::mutations::cancel_from_any_sender()
        {
            self.check_sender(sender)?;
        }
        built(self, self.draft().act(act, actor, now, wf, policy))
    }
}

/// A decision with its next record built: one whose shape its state allows. Leaving a
/// phase hands back what it held: a ticket in a limited agent's line that the next record
/// no longer holds is withdrawn (`Effect::HandBack`), unless the claim took its turn with
/// it (the ticket's place became the call's, given back by the reply).
fn built(read: &TaskRecord, decided: Result<Decision<Draft>, Refusal>) -> Result<Decision, Refusal> {
    let d = decided?;
    let next = d.next.build()?;
    let mut effects = d.effects;
    if let Some(held) = read.queued()
        && next.queued() != Some(held)
        && d.trigger != Trigger::Claimed
        && !crate::mutations::tickets_left_behind()
    {
        effects.push(Effect::HandBack(held.clone()));
    }
    Ok(Decision { trigger: d.trigger, next, effects })
}
