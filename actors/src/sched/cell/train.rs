//! A training cell's batch: claim micro-steps from the shared queue whenever
//! compute is free, warm the pipeline up once before the first one, and
//! drain it once after the stream has ended (SPEC 2.6). When the queue is
//! momentarily empty the claim simply waits at the queue: the pipeline parks
//! at a consistent point without paying another warm-up.

use gyre_runtime::Cx;

use super::{Cell, Phase};
use crate::sched::core::CoreMsg;
use crate::sched::ids::{MicroStepId, Step, SwitchId, Version};
use crate::sched::proto::trainer::{TrainerEvent, TrainerReq};
use crate::sched::proto::transfer::{ReadTag, Segment, TransferReq};
use crate::sched::queue::{MicroStep, QueueMsg};
use crate::sched::retry::{ReqKey, Resend};
use crate::sched::scheduler::SchedMsg;

/// Progress through one batch.
#[derive(Debug)]
pub struct Train {
    pub step: Step,
    warm: bool,
    draining: bool,
    /// A grant waiting for the warm-up.
    stash: Option<MicroStep>,
    pub consumed: Vec<MicroStepId>,
}

impl Cell {
    pub(super) fn on_batch(
        &mut self,
        step: Step,
        snapshot: Option<Segment>,
        cx: &mut Cx<'_, Self>,
    ) {
        let Phase::Ready { joining } = self.phase else {
            return self.unexpected("batch");
        };
        self.aborted = None;
        match snapshot {
            Some(seg) => {
                self.phase = Phase::Syncing { step, joining };
                let reply_to = cx.recipient();
                let req = TransferReq::Read {
                    tag: ReadTag::Snapshot {
                        step,
                        version: seg.version,
                    },
                    bytes: seg.bytes,
                    reply_to,
                };
                self.request(Resend::Transfer(self.links.transfer, req), cx);
            }
            None => self.start_batch(step, joining, cx),
        }
    }

    pub(super) fn snapshot_read(&mut self, step: Step, version: Version, cx: &mut Cx<'_, Self>) {
        let Phase::Syncing { step: s, joining } = self.phase else {
            return self.unexpected("snapshot read");
        };
        if s != step {
            return self.unexpected("snapshot read");
        }
        // Weights are fixed during accumulation: the snapshot of step s is
        // version s, whenever it is read.
        if version != step {
            self.stats.stale_snapshots += 1;
        }
        self.start_batch(step, joining, cx);
    }

    fn start_batch(&mut self, step: Step, joining: Option<SwitchId>, cx: &mut Cx<'_, Self>) {
        if let Some(switch) = joining {
            cx.send(
                self.links.sched,
                SchedMsg::Joined {
                    cell: self.cell_no(),
                    switch,
                },
            );
        }
        self.phase = Phase::Training(Train {
            step,
            warm: false,
            draining: false,
            stash: None,
            consumed: Vec::new(),
        });
        self.claim(step, cx);
    }

    fn claim(&self, step: Step, cx: &mut Cx<'_, Self>) {
        let reply_to = cx.recipient();
        cx.send(
            self.links.queue,
            QueueMsg::Claim {
                step,
                cell: self.cell_no(),
                reply_to,
            },
        );
    }

    fn trainer(&mut self, req: TrainerReq, cx: &mut Cx<'_, Self>) {
        match self.links.trainer {
            Some(port) => self.request(Resend::Trainer(port, req), cx),
            None => self.unexpected("training without a trainer"),
        }
    }

    fn compute(&mut self, m: MicroStep, cx: &mut Cx<'_, Self>) {
        let reply_to = cx.recipient();
        self.trainer(
            TrainerReq::FwdBwd {
                epoch: self.trainer_epoch,
                mstep: m.id,
                tokens: m.tokens,
                rows: m.rows,
                reply_to,
            },
            cx,
        );
    }

    pub(super) fn on_grant(&mut self, m: MicroStep, cx: &mut Cx<'_, Self>) {
        let Phase::Training(t) = &mut self.phase else {
            return self.unexpected("grant");
        };
        if t.step != m.id.step || t.stash.is_some() {
            return self.unexpected("grant");
        }
        if t.warm {
            self.compute(m, cx);
        } else {
            t.stash = Some(m);
            let step = t.step;
            self.stats.warmups += 1;
            let reply_to = cx.recipient();
            let epoch = self.trainer_epoch;
            self.trainer(
                TrainerReq::Warmup {
                    epoch,
                    step,
                    reply_to,
                },
                cx,
            );
        }
    }

    pub(super) fn on_stream_end(&mut self, step: Step, cx: &mut Cx<'_, Self>) {
        let Phase::Training(t) = &mut self.phase else {
            return self.unexpected("stream end");
        };
        if t.step != step || t.draining {
            return self.unexpected("stream end");
        }
        if t.warm {
            t.draining = true;
            let reply_to = cx.recipient();
            let epoch = self.trainer_epoch;
            self.trainer(
                TrainerReq::Drain {
                    epoch,
                    step,
                    reply_to,
                },
                cx,
            );
        } else {
            self.finish_batch(cx);
        }
    }

    pub(super) fn on_trainer(&mut self, event: TrainerEvent, cx: &mut Cx<'_, Self>) {
        let Phase::Training(t) = &mut self.phase else {
            return self.unexpected("trainer event");
        };
        match event {
            TrainerEvent::Warm { step, .. } if step == t.step && !t.warm => {
                t.warm = true;
                if let Some(m) = t.stash.take() {
                    self.compute(m, cx);
                }
            }
            TrainerEvent::Computed { mstep, .. } if mstep.step == t.step => {
                t.consumed.push(mstep);
                self.stats.micro_steps += 1;
                let step = t.step;
                self.claim(step, cx);
            }
            TrainerEvent::Drained { step, .. } if step == t.step && t.draining => {
                self.stats.drains += 1;
                self.stats.batches += 1;
                self.finish_batch(cx);
            }
            _ => self.unexpected("trainer event"),
        }
    }

    /// The core lost its trainer: the batch of `step`, if this cell is
    /// training it, is dropped without a report (what it computed went into
    /// the lost trainer's gradients), its outstanding trainer requests are
    /// forgotten, and the core hears that nothing more of it will be sent.
    pub(super) fn on_abort(&mut self, step: Step, cx: &mut Cx<'_, Self>) {
        if self.training_step() == Some(step) {
            for key in self.outbox.pending() {
                if matches!(
                    key,
                    ReqKey::Warmup(_) | ReqKey::FwdBwd(_) | ReqKey::Drain(_)
                ) {
                    self.outbox.forget(&key);
                }
            }
            self.stats.losses += 1;
            self.aborted = Some(step);
            self.phase = Phase::Ready { joining: None };
        }
        cx.send(self.links.core, CoreMsg::Aborted { step });
    }

    fn finish_batch(&mut self, cx: &mut Cx<'_, Self>) {
        let step = match &self.phase {
            Phase::Training(t) => t.step,
            _ => return,
        };
        let consumed = self.consumed();
        cx.send(
            self.links.core,
            CoreMsg::BatchDone {
                step,
                cell: self.cell_no(),
                consumed,
            },
        );
        self.phase = Phase::Ready { joining: None };
        self.apply_pending_return(cx);
    }
}
