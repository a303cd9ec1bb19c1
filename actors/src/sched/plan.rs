//! One cluster plan for every world: where each backend and the scheduler
//! live, and the order they are spawned in.
//!
//! The simulation lab and the embedded cluster differ only in their
//! backends (cost models or the real policy), so the topology is written
//! once here and each world supplies a [`BackendFactory`]. The spawn order
//! is fixed (per cell: engine, trainer, device memory; then the pool's
//! engine, the transfer engine, the harness, the evaluator, the scheduler),
//! because actor ids, and with them every random stream, follow it.
//!
//! Node layout: 0 the scheduler and the actors it spawns (proxy, buffer,
//! evaluator, packer, queue, core, cells, executions); 10 + c cell c's
//! engine, trainer and device memory; 5 the pool's engine; 2 the transfer
//! engine; 3 the harness backend; 4 the evaluator backend.

use std::sync::Arc;

use gyre_runtime::sim::Sim;
use gyre_runtime::{Actor, Addr, BlobStore, NodeId, Recipient};

use crate::sched::config::{ConfigError, SchedConfig};
use crate::sched::proto::engine::EngineReq;
use crate::sched::proto::evaluator::EvalReq;
use crate::sched::proto::harness::HarnessReq;
use crate::sched::proto::memory::MemoryReq;
use crate::sched::proto::trainer::TrainerReq;
use crate::sched::proto::transfer::TransferReq;
use crate::sched::proxy::RejectRetry;
use crate::sched::scheduler::{Backends, Scheduler};

/// Where a cluster's actors are spawned: the simulator, or a live node
/// (which hosts every actor itself and ignores the node).
pub trait Host {
    fn spawn<A: Actor>(&mut self, node: NodeId, actor: A) -> Addr<A>;

    /// Like [`Host::spawn`], with `make` building the actor again when
    /// its node restarts; a host that cannot restart one spawns the first
    /// build and forgets `make`.
    fn spawn_remade<A: Actor>(&mut self, node: NodeId, mut make: Box<dyn FnMut() -> A>) -> Addr<A> {
        let first = make();
        self.spawn(node, first)
    }
}

impl Host for Sim {
    fn spawn<A: Actor>(&mut self, node: NodeId, actor: A) -> Addr<A> {
        Sim::spawn(self, node, actor)
    }

    fn spawn_remade<A: Actor>(&mut self, node: NodeId, make: Box<dyn FnMut() -> A>) -> Addr<A> {
        Sim::spawn_restartable(self, node, make)
    }
}

/// The nodes of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    pub sched: NodeId,
    /// One node per cell, in cell order.
    pub cells: Vec<NodeId>,
    /// The standalone pool's engine, if the pool has slots.
    pub pool: Option<NodeId>,
    pub transfer: NodeId,
    pub harness: NodeId,
    pub evaluator: NodeId,
}

impl ClusterPlan {
    /// The layout for `sched`'s cells and pool.
    pub fn for_config(sched: &SchedConfig) -> Self {
        Self {
            sched: NodeId(0),
            cells: (0..sched.cells).map(|c| NodeId(10 + c)).collect(),
            pool: (sched.pool_capacity > 0).then_some(NodeId(5)),
            transfer: NodeId(2),
            harness: NodeId(3),
            evaluator: NodeId(4),
        }
    }
}

/// A cell's three backends.
pub struct CellBackends<F: BackendFactory + ?Sized> {
    pub engine: F::Engine,
    pub trainer: F::Trainer,
    pub memory: F::Memory,
}

/// Makes one world's backends. Each answers its protocol (its message
/// enum accepts the protocol's requests).
pub trait BackendFactory {
    type Engine: Actor<Msg: From<EngineReq>>;
    type Trainer: Actor<Msg: From<TrainerReq>>;
    type Memory: Actor<Msg: From<MemoryReq>>;
    type Transfer: Actor<Msg: From<TransferReq>>;
    type Harness: Actor<Msg: From<HarnessReq>>;
    type Evaluator: Actor<Msg: From<EvalReq>>;
    type Error: From<ConfigError>;

    /// Cell `cell`'s engine (with `slots` execution slots), trainer and
    /// device memory.
    fn cell(&mut self, cell: u32, slots: u32) -> Result<CellBackends<Self>, Self::Error>;
    /// The standalone pool's engine.
    fn pool(&mut self, slots: u32) -> Result<Self::Engine, Self::Error>;
    fn transfer(&mut self) -> Result<Self::Transfer, Self::Error>;
    fn harness(&mut self) -> Result<Self::Harness, Self::Error>;
    fn evaluator(&mut self) -> Result<Self::Evaluator, Self::Error>;
    /// Bytes of KV cache per token, for transfer sizes.
    fn kv_bytes_per_token(&self) -> u64;
    /// Where payloads live, if the backends send any.
    fn blobs(&self) -> Option<Arc<dyn BlobStore>>;
    /// How the proxy retries a call an engine rejected on that same
    /// engine (remote engines fail transiently); none by default.
    fn reject_retry(&self) -> RejectRetry {
        RejectRetry::default()
    }

    /// How to build cell `cell`'s backends again, fresh, when its node
    /// restarts (the simulator's node crashes); `None` (the default):
    /// they are spawned once.
    fn remake_cell(&self, _cell: u32, _slots: u32) -> Option<CellRemakers<Self>> {
        None
    }

    /// [`BackendFactory::remake_cell`] for the pool's engine.
    fn remake_pool(&self, _slots: u32) -> Option<Remake<Self::Engine>> {
        None
    }
}

/// Builds one backend again after its node restarts.
pub type Remake<A> = Box<dyn FnMut() -> A>;

/// How to build a cell's three backends again.
pub struct CellRemakers<F: BackendFactory + ?Sized> {
    pub engine: Remake<F::Engine>,
    pub trainer: Remake<F::Trainer>,
    pub memory: Remake<F::Memory>,
}

/// Spawns `first` on `node`, restartable with `remake` if there is one.
fn spawn_backend<H: Host, A: Actor>(
    host: &mut H,
    node: NodeId,
    first: A,
    remake: Option<Remake<A>>,
) -> Addr<A> {
    let Some(mut remake) = remake else {
        return host.spawn(node, first);
    };
    let mut first = Some(first);
    host.spawn_remade(
        node,
        Box::new(move || first.take().unwrap_or_else(&mut remake)),
    )
}

/// The backends of a built cluster, for reading their state.
pub struct PlacedBackends<F: BackendFactory> {
    pub engines: Vec<Addr<F::Engine>>,
    pub pool: Option<Addr<F::Engine>>,
    pub trainers: Vec<Addr<F::Trainer>>,
    pub memories: Vec<Addr<F::Memory>>,
    pub transfer: Addr<F::Transfer>,
    pub harness: Addr<F::Harness>,
    pub evaluator: Addr<F::Evaluator>,
}

impl<F: BackendFactory> Clone for PlacedBackends<F> {
    fn clone(&self) -> Self {
        Self {
            engines: self.engines.clone(),
            pool: self.pool,
            trainers: self.trainers.clone(),
            memories: self.memories.clone(),
            transfer: self.transfer,
            harness: self.harness,
            evaluator: self.evaluator,
        }
    }
}

impl<F: BackendFactory> std::fmt::Debug for PlacedBackends<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacedBackends")
            .field("engines", &self.engines)
            .field("pool", &self.pool)
            .field("trainers", &self.trainers)
            .field("memories", &self.memories)
            .field("transfer", &self.transfer)
            .field("harness", &self.harness)
            .field("evaluator", &self.evaluator)
            .finish()
    }
}

/// Spawns `factory`'s backends and the scheduler for `sched` on `host`,
/// as `plan` places them.
pub fn place<F: BackendFactory, H: Host>(
    plan: &ClusterPlan,
    sched: &SchedConfig,
    host: &mut H,
    factory: &mut F,
) -> Result<(Addr<Scheduler>, PlacedBackends<F>), F::Error> {
    sched.validate()?;
    let (mut engines, mut trainers, mut memories) = (Vec::new(), Vec::new(), Vec::new());
    let slots = sched.cell_capacity;
    for (c, &node) in (0u32..).zip(&plan.cells) {
        let cell = factory.cell(c, slots)?;
        // A cell's three backends share its node, and restart with it.
        let (e, t, m) = match factory.remake_cell(c, slots) {
            Some(r) => (Some(r.engine), Some(r.trainer), Some(r.memory)),
            None => (None, None, None),
        };
        engines.push(spawn_backend(host, node, cell.engine, e));
        trainers.push(spawn_backend(host, node, cell.trainer, t));
        memories.push(spawn_backend(host, node, cell.memory, m));
    }
    let pool = match plan.pool {
        Some(node) => {
            let first = factory.pool(sched.pool_capacity)?;
            let remake = factory.remake_pool(sched.pool_capacity);
            Some(spawn_backend(host, node, first, remake))
        }
        None => None,
    };
    let transfer = host.spawn(plan.transfer, factory.transfer()?);
    let harness = host.spawn(plan.harness, factory.harness()?);
    let evaluator = host.spawn(plan.evaluator, factory.evaluator()?);
    let ports = Backends {
        engines: engines.iter().map(|a| Recipient::of(*a)).collect(),
        pool_engine: pool.map(Recipient::of),
        trainers: trainers.iter().map(|a| Recipient::of(*a)).collect(),
        memories: memories.iter().map(|a| Recipient::of(*a)).collect(),
        transfer: Recipient::of(transfer),
        harness: Recipient::of(harness),
        evaluator: Recipient::of(evaluator),
        kv_bytes_per_token: factory.kv_bytes_per_token(),
        blobs: factory.blobs(),
    };
    let scheduler = Scheduler::new(sched.clone(), ports)?.with_reject_retry(factory.reject_retry());
    let sched_addr = host.spawn(plan.sched, scheduler);
    Ok((
        sched_addr,
        PlacedBackends {
            engines,
            pool,
            trainers,
            memories,
            transfer,
            harness,
            evaluator,
        },
    ))
}
