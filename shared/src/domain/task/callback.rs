//! Callback steps, after their claim (`claim.rs` mints the token): the agent's answer that
//! the work started, then the outside's completion, failure or heartbeat, each presented
//! with the token of the attempt it is for.
//!
//! A completion passes its own fence, the token's: the record still waits on the token's
//! step and attempt (so a completion applies at most once, and a token of an earlier
//! attempt is dead), the token's digest is the record's, and the callback is not yet due.

use std::sync::Arc;

use super::draft::Draft;
use super::outcome::{Actor, Cause, Effect, Origin, Policy, Refusal};
use super::record::Decision;
use super::recovery::GiveUpReason;
use crate::domain::callback::{Awaiting, CallbackToken, Completion, CompletionRefused, TokenClaims};
use crate::domain::ids::Timestamp;
use crate::domain::lifecycle::{ProcessState, Trigger};
use crate::domain::messages::{OrderStatus, cut_reason};
use crate::domain::output::StepOutput;
use crate::domain::timeline::Happened;
use crate::domain::workflow::{Action, Workflow};

impl Draft {
    /// The callback step's agent answered success: the work started (its answer is kept
    /// as the step's output until the completion brings the final one). The task waits,
    /// due when the callback is.
    pub(in crate::domain) fn started(
        mut self,
        now: Timestamp,
        name: String,
    ) -> Result<Decision<Draft>, Refusal> {
        let Some(mut awaiting) = self.callback.take() else {
            return Err(Refusal::Corrupt {
                workflow: self.workflow.clone(),
                why: format!("callback step {} was claimed without a callback", self.step),
            });
        };
        awaiting.started_at = Some(now);
        let cause = Cause::Started { step: self.step };
        let mut next = self.moved(Trigger::Started, now, cause)?.unlocked();
        next.deadline = Some(awaiting.due());
        next.callback = Some(awaiting);
        Ok(Decision {
            trigger: Trigger::Started,
            next,
            effects: vec![Effect::Status { status: OrderStatus::Waiting, step: Some(name), reason: None }],
        })
    }

    /// The token's fence: the wait it completes, if it may.
    pub fn awaiting_token(
        &self,
        token: &CallbackToken,
        claims: &TokenClaims,
        now: Timestamp,
    ) -> Result<&Awaiting, CompletionRefused> {
        let current = self.callback.as_ref().map(|cb| (cb.step, cb.attempt));
        let waiting = matches!(self.state, ProcessState::Processing | ProcessState::Waiting);
        let awaiting = match &self.callback {
            Some(cb)
                if waiting
                    && (cb.step == claims.step
                        && (cb.attempt == claims.attempt || crate::mutations::accept_old_tokens())) =>
            {
                cb
            }
            _ => {
                return Err(CompletionRefused::Ended { step: claims.step, attempt: claims.attempt, current });
            }
        };
        if token.digest() != awaiting.digest && !crate::mutations::accept_old_tokens() {
            return Err(CompletionRefused::Forged { step: claims.step, attempt: claims.attempt });
        }
        if now > awaiting.due() {
            return Err(CompletionRefused::TimedOut {
                step: claims.step,
                attempt: claims.attempt,
                due: awaiting.due(),
            });
        }
        Ok(awaiting)
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
    ) -> Result<Decision<Draft>, Refusal> {
        let decided = self.decide_completion(token, claims, completion, now, wf, policy);
        let mut d = self.logged(now, decided, None)?;
        // Heartbeats would push the rest of the history out of the bounded timeline: the
        // newest one stands for a run of them (the record counts them in `last_heartbeat`).
        if d.trigger == Trigger::Heartbeat
            && let [.., before, _] = d.next.timeline.as_slice()
            && before.what == Happened::Moved(Trigger::Heartbeat)
            && (before.step, before.attempt) == (self.step, self.attempt)
        {
            let at = d.next.timeline.len() - 2;
            Arc::make_mut(&mut d.next.timeline).remove(at);
        }
        Ok(d)
    }

    fn decide_completion(
        &self,
        token: &CallbackToken,
        claims: &TokenClaims,
        completion: &Completion,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let awaiting = self.awaiting_token(token, claims, now).map_err(Refusal::Completion)?;
        self.check_workflow(wf)?;
        self.completed(awaiting, completion, now, wf, policy)
    }

    /// An operator's word on the callback step `step` the task waits on, given without its
    /// token (`sasctl tasks complete --order`): the decision the outside's completion or
    /// failure makes, fenced on the record instead of a token (the task waits on `step`'s
    /// callback, its agent's call answered, and it is not yet due; `actor.seen`, when
    /// given, is still the revision), and recorded with who gave it and why. A heartbeat
    /// is the outside's alone. Unlike a token's word, it waits for the agent's answer that
    /// the work started: an operator completes work the service has seen.
    pub(in crate::domain) fn complete_as_operator(
        &self,
        step: u32,
        completion: &Completion,
        actor: Actor<'_>,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let act = match completion {
            Completion::Success { .. } => "complete",
            Completion::Failure { .. } => "fail",
            Completion::Heartbeat => "heartbeat",
        };
        let refused = |why: String| Refusal::NotAllowed { act, state: self.state.as_str(), why };
        // An app's word on a callback is its token: by hand is for operators only.
        if actor.origin != Origin::Operator {
            return Err(refused("only an operator completes a step without its token".into()));
        }
        if let Some(seen) = actor.seen.filter(|seen| *seen != self.revision) {
            return Err(refused(format!(
                "it changed since it was looked at (revision {seen}, now {}): look again",
                self.revision
            )));
        }
        let name = |step: u32| self.step_name(wf, step, Action::Do);
        let live = matches!(self.state, ProcessState::Processing | ProcessState::Waiting);
        let decided = match self.callback.as_ref().filter(|_| live) {
            _ if *completion == Completion::Heartbeat => {
                Err(refused("a heartbeat comes from the outside, with the step's token".into()))
            }
            Some(cb) if cb.step == step && self.state == ProcessState::Processing => Err(refused(format!(
                "step {}'s agent has not answered that the work started: complete it once the task waits",
                name(step)
            ))),
            Some(cb) if cb.step == step && now <= cb.due() => {
                self.check_workflow(wf)?;
                self.completed(cb, completion, now, wf, policy)
            }
            Some(cb) if cb.step == step => Err(refused(format!(
                "the callback of step {} was due at {} and is past due",
                name(step),
                cb.due().to_rfc3339()
            ))),
            Some(cb) => Err(refused(format!(
                "it waits on the callback of step {}, not {}",
                name(cb.step),
                name(step)
            ))),
            None => Err(refused(format!("it waits on no callback (step {} is not waiting)", name(step)))),
        };
        let by = Some((actor.by, actor.why)).filter(|_| !crate::mutations::by_hand_unrecorded());
        self.logged(now, decided, by)
    }

    /// The completion of the wait `awaiting`, past its fence.
    fn completed(
        &self,
        awaiting: &Awaiting,
        completion: &Completion,
        now: Timestamp,
        wf: &Workflow,
        policy: &Policy,
    ) -> Result<Decision<Draft>, Refusal> {
        let step = self.step;
        let name = self.step_name(wf, step, Action::Do);
        match completion {
            Completion::Heartbeat if !awaiting.writes_heartbeat(now) => {
                let (written_at, floor_ms, due) = (awaiting.beat_from(), awaiting.floor_ms(), awaiting.due());
                Err(Refusal::HeartbeatNoted { written_at, floor_ms, due })
            }
            Completion::Heartbeat => {
                let mut next = self.moved(Trigger::Heartbeat, now, Cause::Heartbeat { step })?;
                if let Some(cb) = next.callback.as_mut() {
                    cb.last_heartbeat = Some(now);
                    if next.state == ProcessState::Waiting {
                        next.deadline = Some(cb.due());
                    }
                }
                Ok(Decision { trigger: Trigger::Heartbeat, next, effects: Vec::new() })
            }
            Completion::Success { output } => {
                let step_output = match output.as_ref().map(StepOutput::from_value).transpose() {
                    Ok(step_output) => step_output,
                    Err(e) => {
                        // It took effect: like an agent's unusable answer, the step is in doubt.
                        let reason = format!("step {name} was completed, but its output cannot be kept: {e}");
                        let cause = Cause::Failed {
                            step,
                            action: Action::Do,
                            reason: reason.clone(),
                            in_doubt: true,
                        };
                        let unlocked = self.clone().unlocked();
                        return unlocked.give_up(
                            now,
                            wf,
                            policy,
                            cause,
                            GiveUpReason::plain(&reason),
                            true,
                            true,
                        );
                    }
                };
                let mut done = self.clone().unlocked();
                match step_output {
                    Some(o) => {
                        Arc::make_mut(&mut done.outputs).insert(name.clone(), o);
                    }
                    // No output: the agent's answer at the start does not stand for the
                    // outside's at the end.
                    None => {
                        Arc::make_mut(&mut done.outputs).remove(&name);
                    }
                }
                let cause = Cause::Completed { step };
                done.step_done(Trigger::Advanced, now, cause, wf, policy, name)
            }
            Completion::Failure { reason } => {
                let reason = cut_reason(reason.clone());
                let cause =
                    Cause::Failed { step, action: Action::Do, reason: reason.clone(), in_doubt: false };
                // A refusal from the outside: the step had no effect, as for an agent's.
                let gave_up = GiveUpReason { told: &reason, detail: None };
                self.clone().unlocked().give_up(now, wf, policy, cause, gave_up, false, false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::callback::{Callback, CallbackSecret};
    use crate::domain::task::TaskRecord;
    use crate::domain::task::fixtures::*;

    fn claimed_approval(wf: &Workflow, at: Timestamp) -> (TaskRecord, CallbackToken) {
        claimed_callback(wf, 1, at)
    }

    fn started(wf: &Workflow) -> (TaskRecord, CallbackToken) {
        started_callback(wf, 1)
    }

    #[test]
    fn a_callback_steps_claim_mints_a_token_bound_to_its_attempt_and_keeps_only_its_digest() {
        let wf = approval();
        let (t, token) = claimed_approval(&wf, T0);
        let claims = claims_of(&token);
        assert_eq!(
            (claims.order_id.clone(), claims.step, claims.attempt),
            (t.order_id.clone(), 1, t.attempt)
        );
        let cb = t.callback().cloned().unwrap();
        assert_eq!(cb.digest, token.digest());
        assert!(
            !serde_json::to_string(&t).unwrap().contains(token.expose()),
            "the record never holds the token"
        );
        assert_eq!((cb.timeout_at, cb.heartbeat_ms), (T0.plus_ms(10_000), Some(3_000)));
        // Without a secret, a callback step cannot be claimed (a bare lease is for the rest).
        let pending = reply(&claim(&new_task(&wf), &wf, 1, T0), &wf, ok(), T0).next;
        assert!(matches!(pending.claim(lease(2), T0, &wf, &policy()), Err(Refusal::Corrupt { .. })));
    }

    #[test]
    fn the_agents_success_starts_the_wait_due_at_the_first_heartbeat() {
        let wf = approval();
        let (t, _) = started(&wf);
        assert_eq!((t.state(), t.step, t.locked_by()), (ProcessState::Waiting, 1, None));
        assert_eq!(
            t.deadline(),
            Some(T0.plus_ms(4_000)),
            "the heartbeat (3 s and the floor's 1 s of slack) comes before the timeout"
        );
        assert_eq!(t.outputs.get("approve").unwrap().to_value()["ticket"], "A-1");
    }

    #[test]
    fn a_completion_applies_once_and_goes_on_with_its_output() {
        let wf = approval();
        let (t, token) = started(&wf);
        let done = Completion::Success { output: Some(serde_json::json!({"approved_by": "ana"})) };
        let d = checked(&t, t.complete(&token, &claims_of(&token), &done, T0.plus_ms(100), &wf, &policy()));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step, d.next.callback().cloned()),
            (Trigger::Advanced, ProcessState::Pending, 2, None)
        );
        assert_eq!(d.next.outputs.get("approve").unwrap().to_value()["approved_by"], "ana");
        // Again: the step has ended, and nothing changes.
        let again = d.next.complete(&token, &claims_of(&token), &done, T0.plus_ms(101), &wf, &policy());
        assert!(
            matches!(again, Err(Refusal::Completion(CompletionRefused::Ended { step: 1, .. }))),
            "{again:?}"
        );
    }

    /// An operator completes or fails the step the task waits on without its token: the
    /// same decision as the outside's, recorded with who and why; the token is dead after.
    #[test]
    fn an_operator_completes_or_fails_the_waiting_step_without_its_token() {
        use crate::domain::task::operator::{Actor, Origin};
        let wf = approval();
        let (t, token) = started(&wf);
        let actor = Actor {
            by: "arn:aws:iam::1:user/ana",
            why: "approved by phone",
            seen: None,
            origin: Origin::Operator,
        };
        let done = Completion::Success { output: Some(serde_json::json!({"approved_by": "ana"})) };
        let d = checked(&t, t.complete_as_operator(1, &done, actor, T0.plus_ms(100), &wf, &policy()));
        assert_eq!((d.trigger, d.next.state(), d.next.step), (Trigger::Advanced, ProcessState::Pending, 2));
        assert_eq!(d.next.outputs.get("approve").unwrap().to_value()["approved_by"], "ana");
        let entry = d.next.timeline.last().unwrap();
        assert_eq!((entry.by.as_deref(), entry.note.as_deref()), (Some(actor.by), Some(actor.why)));
        let late = d.next.complete(&token, &claims_of(&token), &done, T0.plus_ms(101), &wf, &policy());
        assert!(matches!(late, Err(Refusal::Completion(CompletionRefused::Ended { .. }))), "{late:?}");
        // Failed: the step's refusal, as the outside's failure.
        let failed = Completion::Failure { reason: "rejected by phone".into() };
        let d = checked(&t, t.complete_as_operator(1, &failed, actor, T0.plus_ms(100), &wf, &policy()));
        let by_token =
            checked(&t, t.complete(&token, &claims_of(&token), &failed, T0.plus_ms(100), &wf, &policy()));
        assert_eq!((d.trigger, d.next.state()), (by_token.trigger, by_token.next.state()));
        // Refused, nothing changed: another step, a heartbeat, past due, a moved record.
        let refused = |t: &TaskRecord, step: u32, c: &Completion, at: Timestamp, seen: Option<u64>| match t
            .complete_as_operator(step, c, Actor { seen, ..actor }, at, &wf, &policy())
        {
            Err(Refusal::NotAllowed { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert!(refused(&t, 0, &done, T0.plus_ms(100), None).contains("not"), "another step");
        assert!(refused(&t, 1, &Completion::Heartbeat, T0.plus_ms(100), None).contains("token"));
        assert!(refused(&t, 1, &done, T0.plus_ms(60_000), None).contains("was due"));
        assert!(refused(&t, 1, &done, T0.plus_ms(100), Some(t.revision + 1)).contains("changed"));
        let app = Actor { origin: Origin::App { sender: None }, ..actor };
        let r = t.complete_as_operator(1, &done, app, T0.plus_ms(100), &wf, &policy());
        assert!(
            matches!(r, Err(Refusal::NotAllowed { ref why, .. }) if why.contains("only an operator")),
            "{r:?}"
        );
        // Before the agent's answer that the work started: not yet.
        let (claimed, _) = claimed_approval(&wf, T0);
        assert!(refused(&claimed, 1, &done, T0.plus_ms(1), None).contains("not answered"));
        let done_already =
            checked(&t, t.complete(&token, &claims_of(&token), &done, T0.plus_ms(1), &wf, &policy())).next;
        let r = done_already.complete_as_operator(1, &done, actor, T0.plus_ms(2), &wf, &policy());
        assert!(matches!(r, Err(Refusal::NotAllowed { .. })), "{r:?}");
    }

    #[test]
    fn a_completion_may_come_before_the_agents_answer_which_is_then_fenced_out() {
        let wf = approval();
        let (t, token) = claimed_approval(&wf, T0);
        let done = Completion::Success { output: None };
        let d = checked(&t, t.complete(&token, &claims_of(&token), &done, T0.plus_ms(1), &wf, &policy()));
        assert_eq!((d.next.state(), d.next.step), (ProcessState::Pending, 2));
        let late = d.next.apply_reply(&reply_for(&t, ok()), T0.plus_ms(2), &wf, &policy());
        assert!(matches!(late, Err(Refusal::StaleReply(_))));
    }

    #[test]
    fn a_forged_old_or_late_token_changes_nothing() {
        let wf = approval();
        let (t, token) = started(&wf);
        let ok = Completion::Success { output: None };
        let claims = claims_of(&token);
        // Forged: the right order, step and attempt, another secret.
        let forged = CallbackToken::mint(&t.order_id, 1, t.attempt, &CallbackSecret([8; 32]));
        let e = t.complete(&forged, &claims_of(&forged), &ok, T0.plus_ms(10), &wf, &policy());
        assert!(matches!(e, Err(Refusal::Completion(CompletionRefused::Forged { .. }))), "{e:?}");
        // Another attempt's.
        let old = CallbackToken::mint(&t.order_id, 1, t.attempt - 1, &CallbackSecret([2; 32]));
        let e = t.complete(&old, &claims_of(&old), &ok, T0.plus_ms(10), &wf, &policy());
        assert!(matches!(e, Err(Refusal::Completion(CompletionRefused::Ended { .. }))), "{e:?}");
        // Past the heartbeat due.
        let e = t.complete(&token, &claims, &ok, T0.plus_ms(4_001), &wf, &policy());
        assert!(matches!(e, Err(Refusal::Completion(CompletionRefused::TimedOut { .. }))), "{e:?}");
    }

    #[test]
    fn a_heartbeat_moves_the_deadline_out_but_never_past_the_timeout() {
        let wf = approval();
        let (t, token) = started(&wf);
        let claims = claims_of(&token);
        let d = checked(
            &t,
            t.complete(&token, &claims, &Completion::Heartbeat, T0.plus_ms(2_000), &wf, &policy()),
        );
        assert_eq!(
            (d.trigger, d.next.state(), d.next.deadline()),
            (Trigger::Heartbeat, ProcessState::Waiting, Some(T0.plus_ms(6_000)))
        );
        let d1 = checked(
            &d.next,
            d.next.complete(&token, &claims, &Completion::Heartbeat, T0.plus_ms(4_500), &wf, &policy()),
        );
        assert_eq!(d1.next.deadline(), Some(T0.plus_ms(8_500)));
        let d2 = checked(
            &d1.next,
            d1.next.complete(&token, &claims, &Completion::Heartbeat, T0.plus_ms(7_400), &wf, &policy()),
        );
        assert_eq!(d2.next.deadline(), Some(T0.plus_ms(10_000)), "the timeout caps it");
        // A run of heartbeats is one timeline entry.
        let beats = d2.next.timeline.iter().filter(|e| e.what == Happened::Moved(Trigger::Heartbeat)).count();
        assert_eq!(beats, 1);
    }

    /// The heartbeat's rows, one by one (approval: heartbeat 3 s, so a floor of 1 s and a
    /// heartbeat due 4 s after the last one written; claimed at T0).
    #[test]
    fn a_heartbeat_within_the_floor_is_noted_unwritten_and_the_due_time_allows_for_it() {
        let wf = approval();
        let (t, token) = started(&wf);
        let claims = claims_of(&token);
        let beat = |task: &TaskRecord, at: u64| {
            task.complete(&token, &claims, &Completion::Heartbeat, T0.plus_ms(at), &wf, &policy())
        };
        let noted = |written: u64, due: u64| {
            Some(Refusal::HeartbeatNoted {
                written_at: T0.plus_ms(written),
                floor_ms: 1_000,
                due: T0.plus_ms(due),
            })
        };
        // Row: none written yet, within the floor of the claim: noted, nothing to write.
        assert_eq!(beat(&t, 999).err(), noted(0, 4_000));
        // Row: none written yet, at the floor: written; due an interval and a floor later.
        let first = checked(&t, beat(&t, 1_000));
        assert_eq!((first.trigger, first.next.deadline()), (Trigger::Heartbeat, Some(T0.plus_ms(5_000))));
        let t = first.next;
        // Row: within the floor of the last one written: noted, the due time unchanged.
        assert_eq!(beat(&t, 1_999).err(), noted(1_000, 5_000));
        // Row: at the floor after it: written.
        let second = checked(&t, beat(&t, 2_000));
        assert_eq!(second.next.deadline(), Some(T0.plus_ms(6_000)));
        // Row: at the due time itself: still in time, written.
        let last = checked(&t, beat(&t, 5_000));
        assert_eq!(last.next.deadline(), Some(T0.plus_ms(9_000)));
        // Row: past it: refused as late, and the supervisor's lapse applies.
        assert!(matches!(
            beat(&t, 5_001),
            Err(Refusal::Completion(CompletionRefused::TimedOut { due, .. })) if due == T0.plus_ms(5_000)
        ));
        assert!(matches!(t.recover(T0.plus_ms(4_999), &wf, &policy(), 0), Err(Refusal::NotDue { .. })));
        assert_eq!(checked(&t, t.recover(T0.plus_ms(5_000), &wf, &policy(), 0)).trigger, Trigger::Retry);
        // Row: a noted heartbeat still passes the token's fence first.
        let forged = CallbackToken::mint(&t.order_id, 1, t.attempt, &CallbackSecret([8; 32]));
        let e = t.complete(
            &forged,
            &claims_of(&forged),
            &Completion::Heartbeat,
            T0.plus_ms(1_500),
            &wf,
            &policy(),
        );
        assert!(matches!(e, Err(Refusal::Completion(CompletionRefused::Forged { .. }))), "{e:?}");
    }

    /// A party that beats at least every interval, however often, is never lapsed and
    /// never refused, and costs at most one write per floor.
    #[test]
    fn a_party_beating_at_least_every_interval_is_never_lapsed_and_written_once_per_floor() {
        let long = Callback { timeout_ms: 120_000, heartbeat_ms: Some(3_000) };
        let wf = Workflow {
            steps: vec![
                approval().steps[0].clone(),
                approval().steps[1].clone().with_callback(long),
                approval().steps[2].clone(),
            ],
            ..approval()
        };
        for every in [100, 700, 999, 1_000, 1_001, 1_999, 2_500, 2_999, 3_000] {
            let (mut t, token) = started(&wf);
            let claims = claims_of(&token);
            let (mut at, mut writes, mut last_write) = (0, 0, 0);
            while at + every < 100_000 {
                at += every;
                let now = T0.plus_ms(at);
                // The supervisor, just before each beat, finds nothing due.
                assert!(
                    matches!(t.recover(T0.plus_ms(at - 1), &wf, &policy(), 0), Err(Refusal::NotDue { .. })),
                    "beating every {every} ms: lapsed at {at} ms"
                );
                match t.complete(&token, &claims, &Completion::Heartbeat, now, &wf, &policy()) {
                    Ok(d) => {
                        assert!(
                            at - last_write >= 1_000,
                            "every {every} ms: written {} ms apart",
                            at - last_write
                        );
                        (writes, last_write) = (writes + 1, at);
                        t = d.next;
                    }
                    Err(Refusal::HeartbeatNoted { .. }) => {}
                    Err(e) => panic!("beating every {every} ms: refused at {at} ms: {e}"),
                }
            }
            assert!(writes <= at / 1_000 + 1, "every {every} ms: {writes} writes in {at} ms");
        }
    }

    #[test]
    fn a_missed_heartbeat_is_a_lapse_and_the_retry_kills_the_old_token() {
        let wf = approval();
        let (t, token) = started(&wf);
        let d = checked(&t, t.recover(T0.plus_ms(4_000), &wf, &policy(), 0));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.callback().cloned()),
            (Trigger::Retry, ProcessState::Pending, None)
        );
        let e = d.next.complete(
            &token,
            &claims_of(&token),
            &Completion::Heartbeat,
            T0.plus_ms(4_001),
            &wf,
            &policy(),
        );
        assert!(matches!(e, Err(Refusal::Completion(CompletionRefused::Ended { .. }))));
        // The next attempt has a token of its own.
        let again = checked(&d.next, d.next.claim(mint(3), d.next.deadline().unwrap(), &wf, &policy()));
        assert_ne!(again.next.callback().unwrap().digest, token.digest());
    }

    #[test]
    fn a_failure_from_the_outside_is_a_refusal_and_undoes_what_came_before() {
        let wf = approval();
        let (t, token) = started(&wf);
        let no = Completion::Failure { reason: "declined by ana".into() };
        let d = checked(&t, t.complete(&token, &claims_of(&token), &no, T0.plus_ms(10), &wf, &policy()));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::Undo, ProcessState::Compensating, 0),
            "only charge is refunded"
        );
    }

    #[test]
    fn a_timeout_with_the_budget_spent_undoes_the_started_step_too() {
        let wf = Workflow {
            steps: vec![approval().steps[0].clone(), approval().steps[1].clone().with_max_failures(1)],
            ..approval()
        };
        let (t, _) = started(&wf);
        let d = checked(&t, t.recover(T0.plus_ms(4_000), &wf, &policy(), 0));
        assert_eq!(
            (d.trigger, d.next.state(), d.next.step),
            (Trigger::Undo, ProcessState::Compensating, 1),
            "the approval may have taken effect"
        );
    }

    #[test]
    fn a_schedule_for_a_waiting_callback_changes_nothing() {
        let wf = approval();
        let (t, _) = started(&wf);
        assert!(matches!(
            t.schedule(mint(9), T0.plus_ms(10), &wf, &policy()),
            Err(Refusal::ClaimLost { .. })
        ));
    }
}
