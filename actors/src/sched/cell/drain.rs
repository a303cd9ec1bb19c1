//! Rollout → training, SPEC 2.5 steps 1–5, as the switching cell runs them.
//!
//! The order matters for the harness: admission stops first; the scheduler
//! has already reserved a slot for every displaced execution and told the
//! proxy, and only once the proxy confirms the new routes are in place are
//! the displaced executions' KV blocks pinned, their destinations warned that
//! the blocks follow, and their calls cancelled, so every cancelled call is
//! retried on its destination at once and waits there for its blocks. The
//! pins are released one by one as destinations acknowledge their reads;
//! only then does the engine unload and the device memory change roles.

use std::collections::BTreeSet;

use gyre_runtime::Cx;

use super::{Cell, CellMsg, Move, Phase, Stage};
use crate::sched::ids::{ExecId, SwitchId};
use crate::sched::proto::engine::{EngineEvent, EngineReq, KvBlocks};
use crate::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use crate::sched::retry::Resend;
use crate::sched::scheduler::SchedMsg;

#[derive(Debug)]
enum DrainStage {
    /// Waiting for admission to stop and the proxy's reroutes.
    Preparing,
    Pinning,
    Cancelling {
        pinned: Vec<KvBlocks>,
    },
    HandingOver {
        waiting: BTreeSet<ExecId>,
    },
}

/// A switching cell's progress through SPEC 2.5 steps 1–4.
#[derive(Debug)]
pub struct Drain {
    pub switch: SwitchId,
    moves: Vec<Move>,
    admission_stopped: bool,
    routes_moved: bool,
    stage: DrainStage,
}

/// Before the cancel, tells each pinned execution's destination that its
/// blocks follow. The cancel makes the proxy retry those calls at once,
/// while the blocks can only be read after the cancel has completed: a
/// destination warned first holds the retried call for them rather than
/// prefilling the prefix the read is about to bring. Sent before the
/// cancel, the warning reaches the destination's engine ahead of the
/// retried call (that call waits on the cancel, the proxy and a prompt
/// read); if it loses the race anyway the call is merely recomputed.
fn announce(d: &Drain, blocks: &[KvBlocks], cx: &mut Cx<'_, Cell>) {
    for kv in blocks {
        if let Some(m) = d.moves.iter().find(|m| m.exec == kv.exec) {
            let msg = CellMsg::KvComing {
                switch: d.switch,
                exec: kv.exec,
            };
            cx.send(m.dest_cell, msg);
        }
    }
}

impl Cell {
    pub(super) fn on_switch(&mut self, switch: SwitchId, moves: Vec<Move>, cx: &mut Cx<'_, Self>) {
        if self.index.is_none() || !matches!(self.phase, Phase::Rollout) {
            return self.unexpected("switch");
        }
        self.stats.to_training += 1;
        self.phase = Phase::Draining(Drain {
            switch,
            moves,
            admission_stopped: false,
            routes_moved: false,
            stage: DrainStage::Preparing,
        });
        let reply_to = cx.recipient();
        let engine = self.links.engine;
        self.request(
            Resend::Engine(engine, EngineReq::StopAdmitting { reply_to }),
            cx,
        );
    }

    pub(super) fn on_routes_moved(&mut self, switch: SwitchId, cx: &mut Cx<'_, Self>) {
        match &mut self.phase {
            Phase::Draining(d) if d.switch == switch => {
                d.routes_moved = true;
                self.advance_drain(cx);
            }
            _ => self.unexpected("routes moved"),
        }
    }

    fn advance_drain(&mut self, cx: &mut Cx<'_, Self>) {
        let Phase::Draining(d) = &mut self.phase else {
            return;
        };
        if matches!(d.stage, DrainStage::Preparing) && d.admission_stopped && d.routes_moved {
            d.stage = DrainStage::Pinning;
            let execs = d.moves.iter().map(|m| m.exec).collect();
            let reply_to = cx.recipient();
            let req = Resend::Engine(self.links.engine, EngineReq::PinKv { execs, reply_to });
            self.request(req, cx);
        }
    }

    /// Step 4: after the cancel completed, offer each pinned prefix to the
    /// destination of its execution.
    fn hand_over(&mut self, pinned: Vec<KvBlocks>, cx: &mut Cx<'_, Self>) {
        let me = cx.me();
        let Phase::Draining(d) = &mut self.phase else {
            return;
        };
        let mut waiting = BTreeSet::new();
        for kv in pinned {
            let Some(m) = d.moves.iter().find(|m| m.exec == kv.exec) else {
                continue;
            };
            waiting.insert(kv.exec);
            cx.send(
                m.dest_cell,
                CellMsg::TakeOver {
                    switch: d.switch,
                    kv,
                    source: me.into(),
                },
            );
        }
        self.stats.kv_handed += waiting.len() as u64;
        let done = waiting.is_empty();
        d.stage = DrainStage::HandingOver { waiting };
        if done {
            self.unload(cx);
        }
    }

    pub(super) fn on_taken_over(&mut self, switch: SwitchId, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let Phase::Draining(d) = &mut self.phase else {
            return self.unexpected("taken over");
        };
        let DrainStage::HandingOver { waiting } = &mut d.stage else {
            return self.unexpected("taken over");
        };
        if d.switch != switch || !waiting.remove(&exec) {
            return self.unexpected("taken over");
        }
        let done = waiting.is_empty();
        cx.send(
            self.links.engine,
            EngineReq::ReleaseKv { execs: vec![exec] },
        );
        if done {
            self.unload(cx);
        }
    }

    /// Step 5 begins: unload rollout weights and the KV cache.
    fn unload(&mut self, cx: &mut Cx<'_, Self>) {
        let Phase::Draining(d) = &self.phase else {
            return;
        };
        self.phase = Phase::Switching {
            switch: d.switch,
            stage: Stage::Unloading,
        };
        let reply_to = cx.recipient();
        let engine = self.links.engine;
        self.request(Resend::Engine(engine, EngineReq::Unload { reply_to }), cx);
    }

    pub(super) fn memory(
        &mut self,
        req: impl FnOnce(gyre_runtime::Recipient<MemoryEvent>) -> MemoryReq,
        cx: &mut Cx<'_, Self>,
    ) {
        let me = cx.recipient();
        match self.links.memory {
            Some(port) => self.request(Resend::Memory(port, req(me)), cx),
            None => self.unexpected("memory without a device"),
        }
    }

    pub(super) fn on_engine(&mut self, event: EngineEvent, cx: &mut Cx<'_, Self>) {
        match (event, &mut self.phase) {
            (EngineEvent::AdmissionStopped, Phase::Draining(d)) => {
                d.admission_stopped = true;
                self.advance_drain(cx);
            }
            (EngineEvent::KvPinned { blocks }, Phase::Draining(d))
                if matches!(d.stage, DrainStage::Pinning) =>
            {
                announce(d, &blocks, cx);
                d.stage = DrainStage::Cancelling { pinned: blocks };
                let reply_to = cx.recipient();
                let engine = self.links.engine;
                self.request(
                    Resend::Engine(engine, EngineReq::CancelAll { reply_to }),
                    cx,
                );
            }
            (EngineEvent::CancelComplete { .. }, Phase::Draining(d)) => {
                let stage = std::mem::replace(&mut d.stage, DrainStage::Pinning);
                match stage {
                    DrainStage::Cancelling { pinned } => self.hand_over(pinned, cx),
                    other => {
                        d.stage = other;
                        self.unexpected("cancel complete");
                    }
                }
            }
            (
                EngineEvent::Unloaded,
                Phase::Switching {
                    stage: stage @ Stage::Unloading,
                    ..
                },
            ) => {
                *stage = Stage::FreeingRollout;
                self.memory(
                    |reply_to| MemoryReq::Release {
                        role: MemRole::Rollout,
                        reply_to,
                    },
                    cx,
                );
            }
            (EngineEvent::Loaded { version }, Phase::Returning { switch, stage })
                if *stage == Stage::Loading =>
            {
                let switch = *switch;
                if self.version > version {
                    // A publication arrived while the engine was loading.
                    self.set_weights(self.version, cx);
                }
                self.version = self.version.max(version);
                self.phase = Phase::Rollout;
                self.rejoined();
                self.stats.to_rollout += 1;
                cx.send(
                    self.links.sched,
                    SchedMsg::Returned {
                        cell: self.cell_no(),
                        switch,
                    },
                );
            }
            // Acknowledged; nothing follows from it.
            (EngineEvent::WeightsSet { .. }, _) => {}
            _ => self.unexpected("engine event"),
        }
    }

    pub(super) fn on_memory(&mut self, event: MemoryEvent, cx: &mut Cx<'_, Self>) {
        match (event, &mut self.phase) {
            (
                MemoryEvent::Released {
                    role: MemRole::Rollout,
                },
                Phase::Switching { stage, .. },
            ) if *stage == Stage::FreeingRollout => {
                *stage = Stage::RestoringTraining;
                self.memory(
                    |reply_to| MemoryReq::Restore {
                        role: MemRole::Training,
                        reply_to,
                    },
                    cx,
                );
            }
            (
                MemoryEvent::Restored {
                    role: MemRole::Training,
                },
                Phase::Switching { switch, stage },
            ) if *stage == Stage::RestoringTraining => {
                let switch = *switch;
                self.phase = Phase::Ready {
                    joining: Some(switch),
                };
                cx.send(
                    self.links.sched,
                    SchedMsg::Switched {
                        cell: self.cell_no(),
                        switch,
                    },
                );
                self.apply_pending_return(cx);
            }
            (
                MemoryEvent::Released {
                    role: MemRole::Training,
                },
                Phase::Returning { stage, .. },
            ) if *stage == Stage::FreeingTraining => {
                *stage = Stage::RestoringRollout;
                self.memory(
                    |reply_to| MemoryReq::Restore {
                        role: MemRole::Rollout,
                        reply_to,
                    },
                    cx,
                );
            }
            (
                MemoryEvent::Restored {
                    role: MemRole::Rollout,
                },
                Phase::Returning { stage, .. },
            ) if *stage == Stage::RestoringRollout => {
                *stage = Stage::Loading;
                let reply_to = cx.recipient();
                let req = EngineReq::Load {
                    version: self.version,
                    reply_to,
                };
                self.request(Resend::Engine(self.links.engine, req), cx);
            }
            (MemoryEvent::Refused { role, reason }, _) => {
                self.stats.faults += 1;
                tracing::error!(cell = ?self.index, ?role, %reason, "device memory refused");
            }
            _ => self.unexpected("memory event"),
        }
    }
}
