//! A whole simulated cluster from one small config: the simulated backends
//! on their own nodes, and the scheduler, which spawns every protocol actor
//! of `gyre_actors::sched` on its node.
//!
//! Node layout: 0 hosts the scheduler and the actors it spawns (proxy,
//! buffer, evaluator, packer, queue, core, cells, executions); each cell's
//! engine, trainer and device memory share node 10 + index; the standalone
//! pool's engine is node 5; the transfer engine, harness and evaluator
//! backends are nodes 2, 3 and 4.

use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::proto::port;
use gyre_actors::sched::scheduler::{Backends, Scheduler};
use gyre_actors::sched::{ConfigError, SampleMode, SchedConfig};
use gyre_runtime::sim::{Latency, LinkModel, Sim, SimConfig};
use gyre_runtime::{Addr, BlobStore, MICROS, MILLIS, MemBlobs, NodeId};

use crate::backends::{SimEngine, SimEvaluator, SimHarness, SimMemory, SimTrainer, SimTransfer};
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
        }
    }
}

/// The backends of a built cluster, for reading their statistics.
#[derive(Debug, Clone)]
pub struct BackendAddrs {
    pub engines: Vec<Addr<SimEngine>>,
    pub pool: Option<Addr<SimEngine>>,
    pub trainers: Vec<Addr<SimTrainer>>,
    pub memories: Vec<Addr<SimMemory>>,
    pub transfer: Addr<SimTransfer>,
    pub harness: Addr<SimHarness>,
    pub evaluator: Addr<SimEvaluator>,
}

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
    let mut sim = Sim::new(sc);
    let costs = &cfg.costs;
    let k = cfg.sched.cells;
    let mut engines = Vec::new();
    let mut trainers = Vec::new();
    let mut memories = Vec::new();
    let engine_costs = |slots: u32| {
        let mut e = costs.engine.clone();
        if e.load_capacity == 0 {
            e.load_capacity = slots;
        }
        e
    };
    for c in 0..k {
        let node = NodeId(10 + c);
        engines.push(sim.spawn(
            node,
            SimEngine::new(EngineIx::Cell(c), engine_costs(cfg.sched.cell_capacity)),
        ));
        trainers.push(sim.spawn(node, SimTrainer::new(costs.trainer.clone(), c)));
        memories.push(sim.spawn(node, SimMemory::new(costs.memory.clone())));
    }
    let pool = (cfg.sched.pool_capacity > 0).then(|| {
        sim.spawn(
            NodeId(5),
            SimEngine::new(EngineIx::Pool, engine_costs(cfg.sched.pool_capacity)),
        )
    });
    let transfer = sim.spawn(NodeId(2), SimTransfer::new(costs.transfer.clone()));
    let harness = match &costs.model {
        Some(model) => SimHarness::calibrated(
            costs.workload.clone(),
            model.clone(),
            gyre_runtime::rng::mix64(cfg.seed ^ 0x9_0e21),
        ),
        None => SimHarness::new(costs.workload.clone()),
    };
    let harness = sim.spawn(NodeId(3), harness);
    let evaluator = sim.spawn(NodeId(4), SimEvaluator::new(costs.eval.clone()));
    let ports = Backends {
        engines: engines.iter().map(|a| port(*a)).collect(),
        pool_engine: pool.map(port),
        trainers: trainers.iter().map(|a| port(*a)).collect(),
        memories: memories.iter().map(|a| port(*a)).collect(),
        transfer: port(transfer),
        harness: port(harness),
        evaluator: port(evaluator),
        kv_bytes_per_token: costs.kv_bytes_per_token,
        // Simulated backends send no payloads; a Recorded run still needs
        // a store to be a valid configuration.
        blobs: matches!(cfg.sched.samples, SampleMode::Recorded(_))
            .then(|| -> std::sync::Arc<dyn BlobStore> { MemBlobs::shared() }),
    };
    let scheduler = Scheduler::new(cfg.sched.clone(), ports)?;
    let sched = sim.spawn(NodeId(0), scheduler);
    Ok(Cluster {
        sim,
        sched,
        backends: BackendAddrs {
            engines,
            pool,
            trainers,
            memories,
            transfer,
            harness,
            evaluator,
        },
    })
}
