//! A whole simulated cluster from one small config: the simulated backends
//! placed by the shared [`ClusterPlan`], and the scheduler, which spawns
//! every protocol actor of `gyre_actors::sched` on its node.

use std::sync::Arc;

use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::plan::{
    BackendFactory, CellBackends, CellRemakers, ClusterPlan, PlacedBackends, Remake, place,
};
use gyre_actors::sched::scheduler::Scheduler;
use gyre_actors::sched::{ConfigError, SampleMode, SchedConfig};
use gyre_runtime::sim::{Latency, LinkModel, PayloadCost, Sim, SimConfig};
use gyre_runtime::{Addr, BlobStore, MICROS, MILLIS, MemBlobs};

use crate::backends::{
    CheckpointDisk, SimEngine, SimEvaluator, SimHarness, SimMemory, SimTrainer, SimTransfer,
};
use crate::costs::Costs;

/// Everything one simulated run depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    pub sched: SchedConfig,
    pub costs: Costs,
    pub seed: u64,
    /// Between nodes; FIFO per link, random latency.
    pub link: LinkModel,
    /// Encode and decode every message on the way (slower; catches
    /// messages that would not survive the wire).
    pub codec_check: bool,
    /// Liveness bound: a run needing more events than this fails.
    pub max_events: u64,
    /// Place the harness on the scheduler's node, so its link is exactly
    /// once: the harness protocol has no acknowledgements yet, so fault
    /// plans leave it out (see [`crate::swarm`]).
    pub harness_local: bool,
    /// A deliberately broken backend guard, to show the swarm catches it
    /// (`None` in every real run).
    pub mutation: Option<Mutation>,
    /// The cells' and the pool's backends can restart after their node
    /// crashes (`Sim::crash_node`, `Sim::restart_node`), fresh. Off by
    /// default: a fault plan's actor crashes would then find them.
    pub restartable: bool,
    /// The engines and the harness keep the id of every call they ended,
    /// for the checker's "no answered call lost" (memory grows with the
    /// calls of a run, so the lab's scenario runs turn it off).
    pub track_calls: bool,
    /// What a payload-transfer effect costs (zero by default).
    pub payload: PayloadCost,
}

/// A guard of the simulated backends switched off on purpose (the swarm's
/// mutation check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The trainer computes a repeated micro-step again instead of
    /// answering it from what it remembers.
    TrainerRepeatsWork,
    /// The engine ignores a repeated call attempt it has already answered,
    /// so a lost answer is never given again.
    EngineIgnoresRepeats,
    /// The engine acknowledges a weight update without applying it, so it
    /// keeps serving the version it loaded.
    EngineAcksWithoutLoading,
}

impl ClusterConfig {
    pub fn new(sched: SchedConfig, seed: u64) -> Self {
        Self {
            sched,
            costs: Costs::default(),
            seed,
            link: LinkModel {
                latency: Latency::Uniform {
                    min: 50 * MICROS,
                    max: 2 * MILLIS,
                },
                loss: 0.0,
                duplicate: 0.0,
                fifo: true,
            },
            codec_check: false,
            max_events: 2_000_000,
            harness_local: false,
            mutation: None,
            restartable: false,
            track_calls: true,
            payload: PayloadCost::default(),
        }
    }
}

/// The simulated backends: cost models, no payloads.
#[derive(Clone)]
pub struct SimBackends {
    cfg: ClusterConfig,
    /// The core trainer's checkpoints, across its restarts.
    disk: CheckpointDisk,
}

impl SimBackends {
    fn untracked_harness(&mut self) -> Result<SimHarness, ConfigError> {
        let costs = &self.cfg.costs;
        if let Some(r) = &costs.replay {
            return Ok(SimHarness::replaying(costs.workload.clone(), r.clone()));
        }
        Ok(match &costs.model {
            Some(model) => SimHarness::calibrated(
                costs.workload.clone(),
                model.clone(),
                gyre_runtime::rng::mix64(self.cfg.seed ^ 0x9_0e21),
            ),
            None => SimHarness::new(costs.workload.clone()),
        })
    }

    fn engine(&self, ix: EngineIx, slots: u32) -> SimEngine {
        let mut e = self.cfg.costs.engine.clone();
        if e.load_capacity == 0 {
            e.load_capacity = slots;
        }
        let mut engine = SimEngine::new(ix, e);
        if self.cfg.track_calls {
            engine = engine.tracking_calls();
        }
        if let Some(r) = &self.cfg.costs.replay {
            engine = engine.replaying(r.clone());
        }
        match self.cfg.mutation {
            Some(Mutation::EngineIgnoresRepeats) => engine.ignoring_repeats(),
            Some(Mutation::EngineAcksWithoutLoading) => engine.acking_without_loading(),
            _ => engine,
        }
    }
}

impl SimBackends {
    fn memory(&self, cell: u32) -> SimMemory {
        let memory = SimMemory::new(self.cfg.costs.memory.clone());
        match &self.cfg.costs.replay {
            Some(r) => memory.replaying(r.clone(), cell),
            None => memory,
        }
    }

    fn trainer(&self, cell: u32) -> SimTrainer {
        let mut trainer = SimTrainer::new(self.cfg.costs.trainer.clone(), cell);
        if let Some(r) = &self.cfg.costs.replay {
            trainer = trainer.replaying(r.clone());
        }
        if cell == 0 {
            trainer = trainer.with_disk(self.disk.clone());
        }
        match self.cfg.mutation {
            Some(Mutation::TrainerRepeatsWork) => trainer.repeating_work(),
            _ => trainer,
        }
    }
}

impl SimBackends {
    /// A cell's trainer after its node restarted: the core's holds nothing
    /// until it restores, when the core restores it (see
    /// `gyre_actors::sched::core`).
    fn rebuilt_trainer(&self, cell: u32) -> SimTrainer {
        let s = &self.cfg.sched;
        let trainer = self.trainer(cell);
        if cell == 0 && s.watch_nodes && s.checkpoint_every.is_some() {
            trainer.fresh()
        } else {
            trainer
        }
    }
}

impl BackendFactory for SimBackends {
    type Engine = SimEngine;
    type Trainer = SimTrainer;
    type Memory = SimMemory;
    type Transfer = SimTransfer;
    type Harness = SimHarness;
    type Evaluator = SimEvaluator;
    type Error = ConfigError;

    fn cell(&mut self, cell: u32, slots: u32) -> Result<CellBackends<Self>, ConfigError> {
        Ok(CellBackends {
            engine: self.engine(EngineIx::Cell(cell), slots),
            trainer: self.trainer(cell),
            memory: self.memory(cell),
        })
    }

    fn pool(&mut self, slots: u32) -> Result<SimEngine, ConfigError> {
        Ok(self.engine(EngineIx::Pool, slots))
    }

    fn transfer(&mut self) -> Result<SimTransfer, ConfigError> {
        let transfer = SimTransfer::new(self.cfg.costs.transfer.clone());
        Ok(match &self.cfg.costs.replay {
            Some(r) => transfer.replaying(r.clone()),
            None => transfer,
        })
    }

    fn harness(&mut self) -> Result<SimHarness, ConfigError> {
        let track = self.cfg.track_calls;
        self.untracked_harness()
            .map(|h| if track { h.tracking_calls() } else { h })
    }

    fn evaluator(&mut self) -> Result<SimEvaluator, ConfigError> {
        let e = SimEvaluator::new(self.cfg.costs.eval.clone());
        Ok(match &self.cfg.costs.replay {
            Some(r) => e.replaying(r.clone()),
            None => e,
        })
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.cfg.costs.kv_bytes_per_token
    }

    fn remake_cell(&self, cell: u32, slots: u32) -> Option<CellRemakers<Self>> {
        if !self.cfg.restartable {
            return None;
        }
        let (e, t, m) = (self.clone(), self.clone(), self.clone());
        Some(CellRemakers {
            engine: Box::new(move || e.engine(EngineIx::Cell(cell), slots)),
            trainer: Box::new(move || t.rebuilt_trainer(cell)),
            memory: Box::new(move || m.memory(cell)),
        })
    }

    fn remake_pool(&self, slots: u32) -> Option<Remake<SimEngine>> {
        let f = self.cfg.restartable.then(|| self.clone())?;
        Some(Box::new(move || f.engine(EngineIx::Pool, slots)))
    }

    /// Simulated backends send no payloads; a Recorded run still needs a
    /// store to be a valid configuration.
    fn blobs(&self) -> Option<Arc<dyn BlobStore>> {
        matches!(self.cfg.sched.samples, SampleMode::Recorded(_))
            .then(|| -> Arc<dyn BlobStore> { MemBlobs::shared() })
    }
}

/// The backends of a built cluster, for reading their statistics.
pub type BackendAddrs = PlacedBackends<SimBackends>;

/// A built cluster, ready to run.
pub struct Cluster {
    pub sim: Sim,
    pub sched: Addr<Scheduler>,
    pub backends: BackendAddrs,
}

/// Builds the simulator and spawns the cluster of `cfg` into it.
pub fn build(cfg: &ClusterConfig) -> Result<Cluster, ConfigError> {
    cfg.sched.validate()?;
    let mut sc = SimConfig::new(cfg.seed);
    sc.default_link = cfg.link;
    sc.local_link = LinkModel::constant(10 * MICROS);
    sc.codec_roundtrip = cfg.codec_check;
    sc.max_events = Some(cfg.max_events);
    sc.payload = cfg.payload;
    let mut sim = Sim::new(sc);
    let mut plan = ClusterPlan::for_config(&cfg.sched);
    if cfg.harness_local {
        plan.harness = plan.sched;
    }
    let mut factory = SimBackends {
        cfg: cfg.clone(),
        disk: CheckpointDisk::default(),
    };
    let (sched, backends) = place(&plan, &cfg.sched, &mut sim, &mut factory)?;
    Ok(Cluster {
        sim,
        sched,
        backends,
    })
}
