//! How an invocation ends: it crashes (its messages stay for redelivery), or it returns
//! and the platform deletes what it handled; and, when the last of a group of overlapping
//! supervisor runs ends, the check that they left nothing due untouched.

use super::EventLoop;
use crate::deployment::Role;
use crate::invariants::{Invariant, Violation};
use crate::invocation::Returned;
use crate::world::InvocationId;

impl EventLoop {
    /// The invocation dies where it stands: nothing more of it runs, its messages are not
    /// deleted and come back once their visibility lapses.
    pub(super) fn crash(&mut self, id: InvocationId, how: &str) {
        let Some(invocation) = self.invocations.remove(&id) else { return };
        self.crashes += 1;
        if let Some(slot) = invocation.agent_slot {
            self.agent_busy[slot] = false;
        }
        if invocation.role == Role::Supervisor {
            self.sweep_group_faulted = true;
            self.end_of_sweep();
        }
        self.note_args(format_args!("crash inv {id} {how}"));
        drop(invocation);
        self.shared.w().running.remove(&id);
    }

    pub(super) fn finish(&mut self, id: InvocationId, returned: Returned) {
        if self.invocations.get(&id).is_some_and(|i| i.crash_at.is_some()) {
            // It crashed after its last I/O call, before the platform deleted anything.
            self.crash(id, "before its messages were deleted");
            return;
        }
        let invocation = self.invocations.remove(&id).expect("finishing a live invocation");
        {
            let mut w = self.shared.w();
            let hit = w.running.get(&id).is_some_and(|m| m.hit);
            let now = w.now;
            w.gates.ended(id, now, hit);
        }
        if let Some(slot) = invocation.agent_slot {
            self.agent_busy[slot] = false;
        }
        match returned {
            Returned::Batch(report) => {
                let queue = invocation.queue.expect("batches come from a queue");
                for r in &invocation.received {
                    if report.failures.contains(&r.message.message_id) {
                        continue;
                    }
                    let lost = {
                        let mut w = self.shared.w();
                        w.current_invocation = Some(id);
                        let p = w.faults.delete_lost;
                        let lost = w.roll("delete_lost", p);
                        w.current_invocation = None;
                        lost
                    };
                    if !lost {
                        self.deployed.queues.delete(queue, &r.receipt);
                    }
                }
                self.note_args(format_args!(
                    "finish inv {id} failures {:?} kept {}",
                    report.failures, report.kept
                ));
            }
            Returned::Operator(result) => {
                // The landed record is traced whole, in its rendering from before phases
                // (and without a stage it does not have, as before parallel stages), so the
                // pinned histories hash as they did.
                self.note(|| {
                    format!("finish inv {id} operator {}", crate::trace_record::operated_line(&result))
                });
            }
            Returned::Outside(result) => {
                let result = result.map(|c| match c {
                    sas::handlers::Completed::Applied { trigger, .. } => format!("applied {trigger:?}"),
                    sas::handlers::Completed::Noted { .. } => "noted".to_owned(),
                    sas::handlers::Completed::Refused(why) => format!("refused: {why}"),
                });
                self.note_args(format_args!("finish inv {id} outside {result:?}"));
            }
            Returned::Sweep(result) => {
                let faulted = self.shared.w().running.get(&id).is_some_and(|m| m.faulted);
                self.note_args(format_args!("finish inv {id} sweep {result:?}"));
                // A run its time budget cut short may leave due tasks: the next run has them.
                let cut_short = result.as_ref().is_ok_and(|r| r.cut_short);
                if cut_short {
                    let mut w = self.shared.w();
                    let now = w.now;
                    w.sweeps_cut_short.push(now);
                }
                let clean = result.as_ref().is_ok_and(|r| r.errors == 0) && !cut_short && !faulted;
                self.sweep_group_faulted |= !clean;
                self.sweep_group.push((id, invocation.due_at_start));
                self.end_of_sweep();
            }
        }
        self.shared.w().running.remove(&id);
    }

    /// When the last of a group of overlapping supervisor runs ends, and none of them met a
    /// fault: every task due when any of them started has been acted on (by them or by
    /// anyone else). `Invariant::Supervised` ("a task past its deadline is acted on by the
    /// next supervisor run"), allowing concurrent runs to share the work.
    pub(super) fn end_of_sweep(&mut self) {
        if self.invocations.values().any(|i| i.role == Role::Supervisor) {
            return;
        }
        let group = std::mem::take(&mut self.sweep_group);
        if std::mem::take(&mut self.sweep_group_faulted) {
            return;
        }
        for (id, due) in group {
            for (order_id, revision) in due {
                if self.deployed.store.peek_revision(&order_id) == Some(revision) {
                    self.runtime.push(Violation::new(
                        Invariant::Supervised,
                        format!("supervisor run {id} (and any overlapping) left order {order_id}, due at its start, untouched"),
                    ));
                }
            }
        }
    }
}
