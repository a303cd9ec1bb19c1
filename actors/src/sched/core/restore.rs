//! The core's recovery when its trainer's node is lost.
//!
//! The trainer (cell 0's backend) holds the weights, the optimizer state
//! and the gradients being accumulated; the core actor, on the scheduler's
//! node, only directs it. When the scheduler hears the trainer's node is
//! down (a crash, or a partition it cannot tell from one), the satellites
//! go back to rollout and the core:
//! 1. forgets its outstanding trainer requests and has cell 0 drop its
//!    share of the batch in progress (`CellMsg::Abort`, answered
//!    `Aborted`), so nothing of the old state is sent to the trainer after
//!    the restore;
//! 2. asks the trainer to restore (`TrainerReq::Restore`, resent until the
//!    node answers): a trainer that kept its state answers with its
//!    version, a restarted one loads the last durable checkpoint c;
//! 3. rolls the model's history back to the version restored: the updates
//!    after it (at most S − 1 completed steps and the step in progress;
//!    every publication is durable, so none of them was published) move to
//!    [`super::CoreLog::redone`], their groups leave the trained set, the
//!    queue puts their micro-steps back (`QueueMsg::Rewind`), and the core
//!    trains them again from step c with the batches it kept, so the
//!    version goes on from c + 1, one per update. Micro-step and step ids
//!    repeat in the redone steps; what makes them unambiguous is that the
//!    trainer answers nothing it was asked before its restore, cell 0 asks
//!    nothing more of the aborted batch, and satellites sit the redone
//!    steps out (they join at the first step after the lost one).
//!
//! Whatever the scheduler sends meanwhile (an activation, a satellite's
//! join, a burst-end decision) waits for the restore.

use gyre_runtime::{Cx, Nanos, Recipient};

use super::{Core, CoreMsg, CorePhase, StepRecord};
use crate::sched::ids::{Step, Version};
use crate::sched::msg::cell::CellMsg;
use crate::sched::msg::packer::PackerMsg;
use crate::sched::msg::queue::QueueMsg;
use crate::sched::proto::trainer::TrainerReq;
use crate::sched::retry::{ReqKey, Resend};

/// One restore of the core, for invariants and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRecord {
    pub epoch: u64,
    /// When the trainer's node was heard down.
    pub at: Nanos,
    /// The version and the step the core was at.
    pub from_version: Version,
    pub step: Step,
    /// The version the trainer restored (`None` until it answers), and
    /// whether it was the state it kept (a partition: nothing rolled back).
    pub to_version: Option<Version>,
    pub kept: bool,
    /// Completed updates rolled back (not counting the step in progress).
    pub lost_updates: u64,
    /// When the first update after the restore was made.
    pub resumed_at: Option<Nanos>,
}

/// A restore under way.
#[derive(Debug)]
pub(super) struct Restoring {
    epoch: u64,
    /// The phase the loss interrupted.
    was: CorePhase,
    queue: Recipient<QueueMsg>,
    /// The restore request is out (cell 0 has dropped its batch).
    sent: bool,
    /// The scheduler's messages that arrived meanwhile, in order.
    deferred: Vec<CoreMsg>,
}

/// A request of the core to its trainer.
fn is_core_trainer_key(key: &ReqKey) -> bool {
    matches!(
        key,
        ReqKey::BuildGroups
            | ReqKey::Reduce(_)
            | ReqKey::Update(_)
            | ReqKey::Broadcast(_)
            | ReqKey::Checkpoint(_)
            | ReqKey::RestoreCore(_)
    )
}

impl Core {
    /// The trainer's node is down.
    pub(super) fn core_lost(&mut self, queue: Recipient<QueueMsg>, cx: &mut Cx<'_, Self>) {
        let epoch = self.log.restores.len() as u64 + 1;
        let (was, mut deferred) = match self.restoring.take() {
            Some(r) => (r.was, r.deferred),
            None => (self.phase, Vec::new()),
        };
        // Lost again before the restore was over: the scheduler sent every
        // satellite back to rollout with this loss, so an activation that
        // waits keeps cell 0 alone, and a join that waits is void.
        deferred.retain_mut(|m| match m {
            CoreMsg::Activate { members, .. } => {
                members.retain(|(c, _)| *c == 0);
                true
            }
            CoreMsg::Join { .. } => false,
            _ => true,
        });
        for key in self.outbox.pending() {
            if is_core_trainer_key(&key) {
                self.outbox.forget(&key);
            }
        }
        let step = self.step;
        if self.members.len() > 1 {
            let cut: Vec<u32> = self.members.drain(1..).map(|(c, _)| c).collect();
            self.log.cut.extend(cut.iter().map(|c| (step, *c)));
            if was == CorePhase::Collecting {
                cx.send(queue, QueueMsg::Requeue { step, cells: cut });
            }
        }
        self.pending.clear();
        self.window_open = false;
        tracing::warn!(
            epoch,
            step,
            version = self.version,
            ?was,
            "core trainer lost"
        );
        self.log.restores.push(RestoreRecord {
            epoch,
            at: cx.now(),
            from_version: self.version,
            step,
            to_version: None,
            kept: false,
            lost_updates: 0,
            resumed_at: None,
        });
        self.phase = CorePhase::Restoring;
        self.restoring = Some(Restoring {
            epoch,
            was,
            queue,
            sent: false,
            deferred,
        });
        match self.members.first() {
            Some((_, cell0)) => cx.send(*cell0, CellMsg::Abort { step }),
            None => self.send_restore(cx),
        }
    }

    /// Holds a scheduler message until the restore is over; false if
    /// there is no restore under way.
    pub(super) fn defer(&mut self, msg: CoreMsg) -> Result<(), CoreMsg> {
        match &mut self.restoring {
            Some(r) => {
                r.deferred.push(msg);
                Ok(())
            }
            None => Err(msg),
        }
    }

    /// Cell 0 dropped its batch: nothing of it reaches the trainer now.
    pub(super) fn aborted(&mut self, step: Step, cx: &mut Cx<'_, Self>) {
        if self.restoring.as_ref().is_some_and(|r| !r.sent) && step == self.step {
            self.send_restore(cx);
        }
    }

    fn send_restore(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(r) = &mut self.restoring else {
            return;
        };
        r.sent = true;
        let epoch = r.epoch;
        let reply_to = cx.recipient();
        self.outbox.send(
            cx,
            Resend::Trainer(self.links.trainer, TrainerReq::Restore { epoch, reply_to }),
        );
    }

    /// The trainer holds `version` now, the state it `kept` or the
    /// checkpoint it loaded: go on from there.
    pub(super) fn restored(
        &mut self,
        epoch: u64,
        version: Version,
        kept: bool,
        cx: &mut Cx<'_, Self>,
    ) {
        if self.restoring.as_ref().is_none_or(|r| r.epoch != epoch) {
            return;
        }
        let Some(r) = self.restoring.take() else {
            return;
        };
        if let Some(rec) = self.log.restores.last_mut() {
            rec.to_version = Some(version);
            rec.kept = kept;
        }
        tracing::info!(epoch, version, kept, was = ?r.was, "core trainer restored");
        // A new process builds its communication groups again; so does
        // one that kept its state when the loss forgot a build request
        // still unanswered (building is idempotent).
        if !kept || !self.groups_built {
            self.build_groups(cx);
        }
        let v = self.version;
        let published = matches!(
            r.was,
            CorePhase::Publishing | CorePhase::AwaitDecision | CorePhase::Idle
        );
        match r.was {
            _ if version > v + 1 || (version == v + 1 && r.was != CorePhase::Updating) => {
                self.violation(format!(
                    "trainer restored version {version}, the core is at {v} ({:?})",
                    r.was
                ));
                self.phase = r.was;
            }
            _ if version < v && published => {
                self.violation(format!(
                    "trainer restored version {version} below the published {v}"
                ));
                self.phase = r.was;
            }
            // The update was made and kept; only its answer was lost.
            CorePhase::Updating if version == v + 1 => {
                self.phase = CorePhase::Updating;
                self.updated(cx);
            }
            CorePhase::Collecting | CorePhase::Reducing | CorePhase::Updating => {
                self.rewind(version, r.queue, cx);
            }
            _ if version < v => self.rewind(version, r.queue, cx),
            CorePhase::Checkpointing if kept => {
                self.phase = CorePhase::Checkpointing;
                let reply_to = cx.recipient();
                let req = TrainerReq::Checkpoint {
                    epoch: self.epoch(),
                    step: self.step,
                    version: v,
                    reply_to,
                };
                self.outbox
                    .send(cx, Resend::Trainer(self.links.trainer, req));
            }
            // A new process loaded version v: its checkpoint is durable.
            CorePhase::Checkpointing => {
                self.log.checkpoints.push((self.step, v));
                self.sealed.retain(|s, _| *s >= v);
                self.durable(v, cx);
                self.proceed(cx);
            }
            CorePhase::Broadcasting | CorePhase::Publishing => self.after_update(cx),
            CorePhase::AwaitDecision => self.phase = CorePhase::AwaitDecision,
            CorePhase::Idle | CorePhase::Restoring => self.phase = CorePhase::Idle,
        }
        let me = cx.me().id();
        for msg in r.deferred {
            self.on_msg_now(me, msg, cx);
        }
    }

    /// Trains again from version `to`: the updates after it are lost.
    fn rewind(&mut self, to: Version, queue: Recipient<QueueMsg>, cx: &mut Cx<'_, Self>) {
        let lost: Vec<StepRecord> = self
            .log
            .records
            .iter()
            .filter(|rec| rec.step >= to)
            .cloned()
            .collect();
        self.log.records.retain(|rec| rec.step < to);
        self.log.updates.retain(|s| *s < to);
        for rec in &lost {
            for g in &rec.groups {
                self.log.trained.remove(&g.group);
            }
        }
        if let Some(rec) = self.log.restores.last_mut() {
            rec.lost_updates = lost.len() as u64;
        }
        self.log.redone.extend(lost);
        // Satellites sit the redone steps out: their ids repeat there.
        for s in to..=self.step {
            for c in 1..self.cfg.cells {
                if !self.log.cut.contains(&(s, c)) {
                    self.log.cut.push((s, c));
                }
            }
        }
        cx.send(queue, QueueMsg::Rewind { from: to });
        self.version = to;
        self.step = to;
        self.burst_closed = false;
        self.members.truncate(1);
        self.begin(cx);
    }

    /// The updates before `version` are durable: with recovery on, the
    /// packer frees their rows now (a restore never trains them again).
    pub(super) fn durable(&self, version: Version, cx: &mut Cx<'_, Self>) {
        if let Some(p) = self.packer.filter(|_| self.cfg.recover) {
            cx.send(p, PackerMsg::Durable { version });
        }
    }

    /// Marks the first update after a restore.
    pub(super) fn resumed(&mut self, now: Nanos) {
        if let Some(rec) = self.log.restores.last_mut()
            && rec.to_version.is_some()
            && rec.resumed_at.is_none()
        {
            rec.resumed_at = Some(now);
        }
    }
}
