//! A cell: one elastic unit of GPUs that serves rollout or trains.
//!
//! Its role is a state machine driven by messages (SPEC 2.5):
//! rollout → draining → switching → training → returning → rollout.
//! - draining ([`drain`]): stop admitting; once the proxy confirms the
//!   scheduler's reroutes, pin the KV blocks of the displaced executions,
//!   cancel unfinished calls (the proxy retries them on their new engines),
//!   hand each pinned prefix to its destination cell, which reads it through
//!   the transfer engine and acknowledges, and release the pins;
//! - switching: unload the engine, release rollout memory and restore
//!   training memory through the device-memory protocol;
//! - training ([`train`]): join the core's batch (reading its weights),
//!   claim micro-steps until the stream ends, one warm-up and one drain per
//!   batch;
//! - returning ([`ret`]): release training memory, restore rollout memory,
//!   load the published weights and serve again.
//!
//! A cell in rollout is also a destination for another cell's executions
//! ([`takeover`]). The standalone pool is a cell that never switches.

mod drain;
mod lost;
mod ret;
mod takeover;
mod train;

use gyre_runtime::{Actor, ActorId, Addr, Cx, Nanos};
use serde::{Deserialize, Serialize};

use crate::sched::core::Core;
use crate::sched::ids::{EngineIx, MicroStepId, Step, SwitchId, Version};
use crate::sched::proto::Port;
use crate::sched::proto::engine::{EngineEvent, EngineReq};
use crate::sched::proto::memory::{MemoryEvent, MemoryReq};
use crate::sched::proto::trainer::{TrainerEvent, TrainerReq};
use crate::sched::proto::transfer::{TransferEvent, TransferReq};
use crate::sched::queue::MicroQueue;
use crate::sched::retry::{Outbox, ReqKey, Resend, RetryTick};
use crate::sched::scheduler::Scheduler;

pub use crate::sched::msg::cell::{CellMsg, Move};
pub use drain::Drain;
pub use train::Train;

/// The role a cell reports, for invariants and traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CellRole {
    Rollout,
    Draining,
    Switching,
    Training,
    Returning,
}

/// The steps of switching and returning that wait on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Unloading,
    FreeingRollout,
    RestoringTraining,
    FreeingTraining,
    RestoringRollout,
    Loading,
}

#[derive(Debug)]
pub(crate) enum Phase {
    Rollout,
    Draining(Drain),
    Switching {
        switch: SwitchId,
        stage: Stage,
    },
    /// Training memory resident, between batches; `joining` holds the
    /// switch until the cell has joined its first batch.
    Ready {
        joining: Option<SwitchId>,
    },
    /// Reading the core's weights before training `step`.
    Syncing {
        step: Step,
        joining: Option<SwitchId>,
    },
    Training(Train),
    Returning {
        switch: SwitchId,
        stage: Stage,
    },
}

/// Where a cell sends things. A standalone pool has no trainer or memory.
#[derive(Debug, Clone, Copy)]
pub struct CellLinks {
    pub sched: Addr<Scheduler>,
    pub core: Addr<Core>,
    pub queue: Addr<MicroQueue>,
    pub engine: Port<EngineReq>,
    pub trainer: Option<Port<TrainerReq>>,
    pub memory: Option<Port<MemoryReq>>,
    pub transfer: Port<TransferReq>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CellStats {
    pub to_training: u64,
    pub to_rollout: u64,
    /// Batches this cell computed at least one micro-step of.
    pub batches: u64,
    pub warmups: u64,
    pub drains: u64,
    pub micro_steps: u64,
    /// KV prefixes handed to destinations / taken over from sources.
    pub kv_handed: u64,
    pub kv_taken: u64,
    /// A snapshot read that was not the version of the step it trains.
    pub stale_snapshots: u64,
    /// Messages that made no sense in the current phase.
    pub unexpected: u64,
    /// Backend refusals (device memory full): the switch is stuck.
    pub faults: u64,
    /// Times its node was lost, and messages of the abandoned phase that
    /// arrived afterwards and were ignored.
    pub losses: u64,
    pub stale_after_loss: u64,
    /// Trainer answers of another restore epoch than the batch's, ignored.
    pub stale_trainer_answers: u64,
}

#[derive(Debug)]
pub struct Cell {
    /// `None` for the standalone pool.
    index: Option<u32>,
    links: CellLinks,
    kv_bytes_per_token: u64,
    phase: Phase,
    version: Version,
    /// A return that arrived mid-batch, applied once the batch is done.
    pending_return: Option<(SwitchId, Version)>,
    /// Backend requests awaiting their answers.
    outbox: Outbox,
    /// Rejoining after its node was lost: messages of the abandoned phase
    /// are expected, and ignored.
    rejoining: bool,
    /// Lost without resends (the live settings): until the host says the
    /// node is back, any answer of its backends comes from the process that
    /// died (a `Loaded` it sent before it went down would otherwise end a
    /// pool's rejoin, whose only step is a load, on a node not back yet).
    backends_down: bool,
    /// The batch abandoned when the node was lost: the queue may still
    /// answer its claims after the rejoin.
    abandoned: Option<Step>,
    /// The batch the core aborted (its trainer's node was lost): grants and
    /// stream ends of it still in flight are ignored until the next batch.
    aborted: Option<Step>,
    /// The core's restore epoch of the latest batch: this cell's trainer
    /// requests carry it, and trainer answers of another are stale.
    trainer_epoch: u64,
    /// The switch id of the latest rejoin: hand-over steps of an earlier
    /// switch belong to an abandoned phase.
    rejoined_as: Option<SwitchId>,
    /// Cell 0's backends were lost on the training side: a restarted node
    /// starts them in rollout, so the switch to training is made again
    /// when the node is back (see `lost`).
    resync: lost::Resync,
    stats: CellStats,
}

impl Cell {
    /// Elastic cell `index` (0 is the core), starting in rollout.
    pub fn new(index: u32, links: CellLinks, kv_bytes_per_token: u64) -> Self {
        Self::build(Some(index), links, kv_bytes_per_token)
    }

    /// The standalone pool's cell: serves rollout for its whole life.
    pub fn standalone(links: CellLinks, kv_bytes_per_token: u64) -> Self {
        Self::build(None, links, kv_bytes_per_token)
    }

    fn build(index: Option<u32>, links: CellLinks, kv_bytes_per_token: u64) -> Self {
        Self {
            index,
            links,
            kv_bytes_per_token,
            phase: Phase::Rollout,
            version: 0,
            pending_return: None,
            outbox: Outbox::new(None),
            rejoining: false,
            backends_down: false,
            abandoned: None,
            aborted: None,
            trainer_epoch: 0,
            rejoined_as: None,
            resync: lost::Resync::default(),
            stats: CellStats::default(),
        }
    }

    /// Its engine starts serving `version` (the run's first: see
    /// `SchedConfig::start_version`).
    pub fn serving(mut self, version: Version) -> Self {
        self.version = version;
        self
    }

    /// Resends unanswered backend requests every `after` (see
    /// [`crate::sched::retry`]).
    pub fn with_retry(mut self, after: Option<Nanos>) -> Self {
        self.outbox = Outbox::new(after);
        self
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Tells the engine to serve `version`: a hint sent once, or, when
    /// requests are resent, a request resent until acknowledged.
    fn set_weights(&mut self, version: Version, cx: &mut Cx<'_, Self>) {
        let engine = self.links.engine;
        if self.outbox.resends() {
            let reply_to = cx.recipient();
            let req = EngineReq::SetWeightsAcked { version, reply_to };
            self.request(Resend::Engine(engine, req), cx);
        } else {
            cx.send(engine, EngineReq::SetWeights { version });
        }
    }

    /// Sends a backend request through the outbox.
    fn request(&mut self, req: Resend, cx: &mut Cx<'_, Self>) {
        self.outbox.send(cx, req);
    }

    pub fn index(&self) -> Option<u32> {
        self.index
    }

    pub fn engine(&self) -> EngineIx {
        self.index.map_or(EngineIx::Pool, EngineIx::Cell)
    }

    pub fn stats(&self) -> CellStats {
        self.stats
    }

    /// The version its engine serves (or will serve when it returns).
    pub fn version(&self) -> Version {
        self.version
    }

    pub fn role(&self) -> CellRole {
        match self.phase {
            Phase::Rollout => CellRole::Rollout,
            Phase::Draining(_) => CellRole::Draining,
            Phase::Switching { .. } => CellRole::Switching,
            Phase::Ready { .. } | Phase::Syncing { .. } | Phase::Training(_) => CellRole::Training,
            Phase::Returning { .. } => CellRole::Returning,
        }
    }

    /// The step being trained, if any.
    pub fn training_step(&self) -> Option<Step> {
        match &self.phase {
            Phase::Training(t) => Some(t.step),
            Phase::Syncing { step, .. } => Some(*step),
            _ => None,
        }
    }

    fn unexpected(&mut self, what: &str) {
        if self.rejoining {
            self.stats.stale_after_loss += 1;
            return;
        }
        self.stats.unexpected += 1;
        tracing::warn!(cell = ?self.index, phase = ?self.role(), what, "unexpected message");
    }

    fn cell_no(&self) -> u32 {
        self.index.unwrap_or(u32::MAX)
    }

    fn consumed(&self) -> Vec<MicroStepId> {
        match &self.phase {
            Phase::Training(t) => t.consumed.clone(),
            _ => Vec::new(),
        }
    }
}

impl Actor for Cell {
    type Msg = CellMsg;
    type Timer = RetryTick;
    gyre_runtime::accepts!(EngineEvent, MemoryEvent, TrainerEvent, TransferEvent);

    fn on_timer(&mut self, _: RetryTick, cx: &mut Cx<'_, Self>) {
        self.outbox.tick(cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: CellMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            CellMsg::RoutesMoved { switch } | CellMsg::TakenOver { switch, .. }
                if self.rejoined_as > Some(switch) =>
            {
                self.stats.stale_after_loss += 1;
            }
            CellMsg::Switch { switch, moves } => self.on_switch(switch, moves, cx),
            CellMsg::RoutesMoved { switch } => self.on_routes_moved(switch, cx),
            CellMsg::KvComing { exec, .. } => self.on_kv_coming(exec, cx),
            CellMsg::TakeOver { switch, kv, source } => self.on_take_over(switch, kv, source, cx),
            CellMsg::TakenOver { switch, exec } => self.on_taken_over(switch, exec, cx),
            CellMsg::Return { switch, version } => self.on_return(switch, version, cx),
            CellMsg::Weights { version } => {
                self.version = self.version.max(version);
                if matches!(self.phase, Phase::Rollout) {
                    self.set_weights(version, cx);
                }
            }
            CellMsg::Batch {
                epoch,
                step,
                snapshot,
            } => {
                self.trainer_epoch = self.trainer_epoch.max(epoch);
                if self.resync.busy() {
                    self.resync.stash(step, snapshot);
                } else {
                    self.on_batch(step, snapshot, cx);
                }
            }
            CellMsg::Trainer(e) if e.epoch() != self.trainer_epoch => {
                self.stats.stale_trainer_answers += 1;
            }
            CellMsg::Grant { mstep } if self.abandoned >= Some(mstep.id.step) => {
                self.stats.stale_after_loss += 1;
            }
            CellMsg::StreamEnd { step } if self.abandoned >= Some(step) => {
                self.stats.stale_after_loss += 1;
            }
            CellMsg::Grant { mstep } if self.aborted >= Some(mstep.id.step) => {
                self.stats.stale_after_loss += 1;
            }
            CellMsg::StreamEnd { step } if self.aborted >= Some(step) => {
                self.stats.stale_after_loss += 1;
            }
            CellMsg::Abort { step } => self.on_abort(step, cx),
            CellMsg::Grant { mstep } => self.on_grant(mstep, cx),
            CellMsg::StreamEnd { step } => self.on_stream_end(step, cx),
            CellMsg::Lost { switch, version } => self.on_lost(switch, version, cx),
            CellMsg::BackendsLost => self.on_backends_lost(cx),
            CellMsg::NodeBack { node } => self.on_node_back(node, cx),
            // A lost node's dying process may still answer (a refusal
            // included): nothing it says counts until the node is back.
            CellMsg::Engine(_) | CellMsg::Memory(_) | CellMsg::Trainer(_) if self.backends_down => {
                self.stats.stale_after_loss += 1;
            }
            // A backend's answer counts once: a duplicate (the network's
            // copy, or the answer to a resend) finds nothing outstanding.
            // A refusal does not say which of the role's requests it
            // answers (a device may refuse a release too): it ends both.
            CellMsg::Memory(MemoryEvent::Refused { role, reason }) => {
                self.outbox.forget(&ReqKey::Release(role));
                self.outbox.forget(&ReqKey::Restore(role));
                self.on_memory(MemoryEvent::Refused { role, reason }, cx);
            }
            CellMsg::Engine(EngineEvent::Unloaded) if self.resync.busy() => {
                if self.outbox.ack(&EngineEvent::Unloaded) {
                    self.resynced(cx);
                }
            }
            CellMsg::Memory(e) if self.resync.busy() => {
                if self.outbox.ack(&e) {
                    self.resynced(cx);
                }
            }
            CellMsg::Engine(e) if self.outbox.ack(&e) => self.on_engine(e, cx),
            CellMsg::Memory(e) if self.outbox.ack(&e) => self.on_memory(e, cx),
            CellMsg::Trainer(e) if self.outbox.ack(&e) => self.on_trainer(e, cx),
            CellMsg::Transfer(e @ TransferEvent::ReadDone { .. }) if self.outbox.ack(&e) => {
                if let TransferEvent::ReadDone { tag } = e {
                    self.on_read_done(tag, cx);
                }
            }
            CellMsg::Engine(_) | CellMsg::Memory(_) | CellMsg::Trainer(_) => {}
            CellMsg::Transfer(TransferEvent::ReadDone { .. }) => {}
            CellMsg::Transfer(_) => self.unexpected("transfer event"),
        }
    }
}
