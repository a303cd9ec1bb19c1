//! A whole elastic cluster on the embedded policy, in the deterministic
//! simulator.
//!
//! The scheduler and every protocol actor are the ones the simulation lab
//! runs; only the backends differ: each cell gets a real engine, trainer
//! and device-memory manager over the small transformer, the harness and
//! evaluator run the built-in task, and the packer builds trajectory trees
//! from the engine's TITO records. Model work is real and runs inline; the
//! clock is virtual, advanced by a modelled cost per kind of work, so a
//! seed reproduces a run exactly (same trace hash, same losses, same
//! rewards) however loaded the machine is.
//!
//! Node layout as in the lab: one [`ClusterPlan`] places both.

use std::sync::{Arc, Mutex};

use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::plan::{BackendFactory, CellBackends, ClusterPlan, Host, place};
use gyre_actors::sched::proto::evaluator::EvalReq;
use gyre_actors::sched::proto::harness::HarnessReq;
use gyre_actors::sched::samples::RecordedConfig;
use gyre_actors::sched::scheduler::Scheduler;
use gyre_actors::sched::{ConfigError, SampleMode, SchedConfig};
use gyre_actors::trajectory::profile::ProfileConfig;
use gyre_gpu::engine::{Engine, EngineConfig, EngineError};
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_gpu::trainer::checkpoint::CoreCheckpoint;
use gyre_gpu::trainer::{ObjectiveConfig, OptimConfig, TrainerError};
use gyre_runtime::sim::{IoModel, Latency, LinkModel, Sim, SimConfig};
use gyre_runtime::{Actor, Addr, BlobStore, MICROS, MILLIS, MemBlobs, Nanos, Recipient, SECS};
use serde::{Deserialize, Serialize};

use super::engine::{EngineWorker, TokenTap};
use super::journal::Journal;
use super::memory::MemoryWorker;
use super::shared::{EngineHandle, Shared, TrainerHandle, lock};
use super::task::{EvaluatorWorker, HarnessWorker, TaskConfig, TaskConfigError, Workspaces};
use super::trainer::{TrainerWorker, UpdateSummary, trainer_handle};
use super::transfer::TransferWorker;

/// Modelled device time of each kind of work, in the simulator's virtual
/// clock (the work itself is real; only its duration is modelled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VirtualCosts {
    /// One decode step of the whole running batch.
    pub engine_step_us: u64,
    /// Pin, cancel, unload and the other engine controls.
    pub engine_control_us: u64,
    /// Loading or updating the serving weights.
    pub engine_weights_us: u64,
    pub fwd_bwd_us: u64,
    pub warmup_us: u64,
    pub drain_us: u64,
    pub reduce_us: u64,
    pub update_us: u64,
    pub memory_us: u64,
    pub transfer_us: u64,
    /// One whole model call on an SGLang engine (`gyre train --engines`):
    /// the adapter sees a call's answer, not its decode steps.
    pub sglang_call_us: u64,
    /// Writing the core's durable checkpoint (with `[checkpoint] every`).
    pub checkpoint_us: u64,
}

impl Default for VirtualCosts {
    fn default() -> Self {
        Self {
            engine_step_us: 2_000,
            engine_control_us: 500,
            engine_weights_us: 5_000,
            fwd_bwd_us: 20_000,
            warmup_us: 2_000,
            drain_us: 2_000,
            reduce_us: 5_000,
            update_us: 10_000,
            memory_us: 3_000,
            transfer_us: 2_000,
            sglang_call_us: 20_000,
            checkpoint_us: 50_000,
        }
    }
}

impl VirtualCosts {
    fn io_model(&self) -> IoModel {
        let us = |v: u64| Latency::Const(v.saturating_mul(MICROS));
        let mut m = IoModel::default();
        for (kind, v) in [
            ("engine.step", self.engine_step_us),
            ("engine.pin", self.engine_control_us),
            ("engine.cancel", self.engine_control_us),
            ("engine.release_kv", self.engine_control_us),
            ("engine.unload", self.engine_control_us),
            ("engine.load", self.engine_weights_us),
            ("engine.set_weights", self.engine_weights_us),
            ("trainer.warmup", self.warmup_us),
            ("trainer.fwd_bwd", self.fwd_bwd_us),
            ("trainer.drain", self.drain_us),
            ("trainer.reduce", self.reduce_us),
            ("trainer.update", self.update_us),
            ("trainer.checkpoint", self.checkpoint_us),
            ("memory.release", self.memory_us),
            ("memory.restore", self.memory_us),
            ("transfer.read", self.transfer_us),
            ("sglang.generate", self.sglang_call_us),
            ("sglang.sync", self.engine_weights_us),
            ("sglang.abort", self.engine_control_us),
            ("sglang.release", self.engine_control_us),
            ("sglang.resume", self.engine_weights_us),
            ("sglang.update_weights", self.engine_weights_us),
        ] {
            m = m.with_kind(kind, us(v), 0.0);
        }
        m
    }
}

/// Everything an embedded run depends on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedConfig {
    pub seed: u64,
    pub sched: SchedConfig,
    pub model: ModelConfig,
    pub optim: OptimConfig,
    pub objective: ObjectiveConfig,
    pub task: TaskConfig,
    /// Requests one engine decodes together (continuous batching); 0 means
    /// the engine's capacity in executions.
    pub engine_batch: usize,
    pub costs: VirtualCosts,
    /// Liveness bound on simulator events.
    pub max_events: u64,
    /// Durable checkpoints of the core (off by default).
    pub checkpoint: CheckpointConfig,
}

/// `[checkpoint]`: the core writes `<dir>/core.ckpt` after every `every`-th
/// update (0: never), atomically.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    pub every: u64,
    pub dir: String,
}

impl CheckpointConfig {
    /// The file the core writes, when checkpoints are on.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        (self.every > 0).then(|| std::path::Path::new(&self.dir).join("core.ckpt"))
    }
}

impl Default for EmbeddedConfig {
    /// The main job's embedded default: two elastic cells and a small pool
    /// serving the default small model, 40 training steps.
    fn default() -> Self {
        Self {
            seed: 1,
            sched: SchedConfig {
                cells: 2,
                cell_capacity: 8,
                pool_capacity: 8,
                group_size: 8,
                batch_groups: 2,
                phi: 1.0,
                mu: 2,
                target_steps: 40,
                micro_tokens: 2_048,
                short_micro_steps: 2,
                tau: 20 * MILLIS,
                overall_timeout: 600 * SECS,
                eval_retry: 50 * MILLIS,
                samples: SampleMode::Recorded(RecordedConfig {
                    // The task's harness names each call's role (main,
                    // sub-agent, their summaries), as Claude Code's does.
                    profile: ProfileConfig::claude_code_by_thread(None),
                    ..RecordedConfig::default()
                }),
                ..SchedConfig::default()
            },
            model: ModelConfig::default(),
            // SPEC 3.7's 1e-6 is for a 122B model; a 1M-parameter model
            // from scratch needs a far larger step to move in 40 updates.
            optim: OptimConfig {
                lr: 1e-2,
                ..OptimConfig::default()
            },
            objective: ObjectiveConfig::default(),
            task: TaskConfig::default(),
            engine_batch: 0,
            costs: VirtualCosts::default(),
            max_events: 50_000_000,
            checkpoint: CheckpointConfig::default(),
        }
    }
}

impl EmbeddedConfig {
    /// A cluster small enough for debug-build tests: the tiny model.
    pub fn tiny(seed: u64) -> Self {
        let mut c = Self {
            seed,
            model: ModelConfig::tiny(),
            ..Self::default()
        };
        c.sched.cell_capacity = 4;
        c.sched.pool_capacity = 4;
        c.sched.group_size = 4;
        c.sched.micro_tokens = 512;
        c.optim.lr = 2e-2;
        c
    }

    /// The scheduling configuration with `[checkpoint] every` applied.
    pub fn sched_config(&self) -> SchedConfig {
        let mut s = self.sched.clone();
        if self.checkpoint.every > 0 {
            s.checkpoint_every = Some(self.checkpoint.every);
        }
        s
    }

    /// The same cluster, trained for `steps` steps.
    pub fn with_steps(mut self, steps: u64) -> Self {
        self.sched.target_steps = steps;
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    // Each message carries its cause's text, so the cause is not also
    // exposed as `source` (a report would print it twice).
    #[error("scheduling configuration: {0}")]
    Sched(ConfigError),
    #[error("sched.samples must be Recorded: the embedded backends train on recorded tokens")]
    Counted,
    #[error("model: {0}")]
    Model(gyre_gpu::ModelError),
    #[error("engine: {0}")]
    Engine(EngineError),
    #[error("trainer: {0}")]
    Trainer(TrainerError),
    #[error("task: {0}")]
    Task(TaskConfigError),
    #[error("engines: {0}")]
    Engines(String),
    #[error("this cluster's payloads are not in one process")]
    NotInProcess,
    #[error("harness: {0}")]
    Harness(String),
    #[error("checkpoints: {0}")]
    Checkpoint(String),
}

macro_rules! build_error_from {
    ($($variant:ident($ty:ty)),*) => {$(
        impl From<$ty> for BuildError {
            fn from(e: $ty) -> Self {
                BuildError::$variant(e)
            }
        }
    )*};
}

build_error_from!(
    Sched(ConfigError),
    Model(gyre_gpu::ModelError),
    Engine(EngineError),
    Trainer(TrainerError),
    Task(TaskConfigError)
);

/// The backends of a built cluster, for reading their state: `E` is the
/// engine actor (the embedded engine, or an SGLang adapter), `H` and `V`
/// the harness and evaluator backends (the built-in task's by default).
#[derive(Debug, Clone)]
pub struct EmbeddedAddrs<
    E: Actor = EngineWorker,
    H: Actor = HarnessWorker,
    V: Actor = EvaluatorWorker,
> {
    pub engines: Vec<Addr<E>>,
    pub pool: Option<Addr<E>>,
    pub trainers: Vec<Addr<TrainerWorker>>,
    pub memories: Vec<Addr<MemoryWorker>>,
    pub transfer: Addr<TransferWorker>,
    pub harness: Addr<H>,
    pub evaluator: Addr<V>,
    /// Each cell's engine (none when the engines are SGLang servers) and
    /// trainer (memory reports, weights).
    pub engine_handles: Vec<EngineHandle>,
    pub trainer_handles: Vec<TrainerHandle>,
}

/// A cluster's actors and what its backends share, on whatever host.
pub struct Assembled<E: Actor = EngineWorker, H: Actor = HarnessWorker, V: Actor = EvaluatorWorker>
{
    pub sched: Addr<Scheduler>,
    pub backends: EmbeddedAddrs<E, H, V>,
    pub shared: Shared,
    pub workspaces: Arc<Workspaces>,
    pub blobs: Arc<MemBlobs>,
}

/// An embedded cluster in the simulator.
pub struct EmbeddedCluster<
    E: Actor = EngineWorker,
    H: Actor = HarnessWorker,
    V: Actor = EvaluatorWorker,
> {
    pub sim: Sim,
    pub sched: Addr<Scheduler>,
    pub backends: EmbeddedAddrs<E, H, V>,
    pub shared: Shared,
    pub workspaces: Arc<Workspaces>,
    pub blobs: Arc<MemBlobs>,
}

/// Builds the simulator and spawns the embedded cluster of `cfg` into it.
pub fn build(cfg: &EmbeddedConfig) -> Result<EmbeddedCluster, BuildError> {
    build_with(cfg, assemble)
}

/// The simulator of `cfg`, with the cluster `assemble` spawns into it.
pub fn build_with<E: Actor, H: Actor, V: Actor>(
    cfg: &EmbeddedConfig,
    assemble: impl FnOnce(&mut Sim, &EmbeddedConfig) -> Result<Assembled<E, H, V>, BuildError>,
) -> Result<EmbeddedCluster<E, H, V>, BuildError> {
    let mut sc = SimConfig::new(cfg.seed);
    sc.default_link = LinkModel::constant(100 * MICROS);
    sc.local_link = LinkModel::constant(10 * MICROS);
    sc.io = cfg.costs.io_model();
    sc.max_events = Some(cfg.max_events);
    let mut sim = Sim::new(sc);
    let a = assemble(&mut sim, cfg)?;
    Ok(EmbeddedCluster {
        sim,
        sched: a.sched,
        backends: a.backends,
        shared: a.shared,
        workspaces: a.workspaces,
        blobs: a.blobs,
    })
}

/// Where a cluster's executions come from: the harness and evaluator
/// backends (the built-in task, or external harness processes behind the
/// gateway).
pub trait TaskBackends {
    type Harness: Actor<Msg: From<HarnessReq>>;
    type Evaluator: Actor<Msg: From<EvalReq>>;
    fn harness(&mut self, shared: &Shared) -> Result<Self::Harness, BuildError>;
    fn evaluator(&mut self) -> Result<Self::Evaluator, BuildError>;
    /// Where the engines stream every sampled token, if anywhere (the
    /// tap's owner then writes the records).
    fn token_tap(&self) -> Option<Arc<dyn TokenTap>> {
        None
    }
}

/// The built-in agent task (`src/embedded/task/`).
pub struct BuiltInTask {
    cfg: TaskConfig,
    workspaces: Arc<Workspaces>,
    seed: u64,
    journal: Option<Journal>,
    tap: Option<Arc<dyn TokenTap>>,
}

impl BuiltInTask {
    /// The task of `cfg`, over `workspaces` (the board its harness and
    /// evaluator share).
    pub fn new(cfg: &EmbeddedConfig, workspaces: Arc<Workspaces>) -> Self {
        BuiltInTask {
            cfg: cfg.task.clone(),
            workspaces,
            seed: gyre_runtime::rng::mix64(cfg.seed ^ 0x7a5c),
            journal: None,
            tap: None,
        }
    }

    /// Its engines stream every sampled token to `tap` and write no
    /// records: a cluster's node agent in a run whose executions are
    /// external processes behind the head's gateway (which records the
    /// calls).
    pub fn with_tap(mut self, tap: Option<Arc<dyn TokenTap>>) -> Self {
        self.tap = tap;
        self
    }

    /// Its harness and evaluator write to `journal` (`gyre train --record`).
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }
}

impl TaskBackends for BuiltInTask {
    type Harness = HarnessWorker;
    type Evaluator = EvaluatorWorker;

    fn harness(&mut self, shared: &Shared) -> Result<HarnessWorker, BuildError> {
        Ok(
            HarnessWorker::new(self.cfg.clone(), shared, self.workspaces.clone(), self.seed)?
                .with_journal(self.journal.clone()),
        )
    }

    fn evaluator(&mut self) -> Result<EvaluatorWorker, BuildError> {
        Ok(
            EvaluatorWorker::new(self.cfg.clone(), self.workspaces.clone(), self.seed)?
                .with_journal(self.journal.clone()),
        )
    }

    fn token_tap(&self) -> Option<Arc<dyn TokenTap>> {
        self.tap.clone()
    }
}

/// The embedded backends: the real policy's engines and trainers, the
/// task's harness and evaluator, and the payload store of `shared`.
pub struct EmbeddedBackends<T: TaskBackends = BuiltInTask> {
    cfg: EmbeddedConfig,
    params: ParamBuffer,
    shared: Shared,
    task: T,
    /// The in-process payload store, when the factory made it.
    blobs: Option<Arc<MemBlobs>>,
    /// The core's checkpoint a resumed run starts from
    /// (`SchedConfig::start_version` > 0): every engine and trainer starts
    /// from its parameters, and the core's trainer from its optimizer
    /// state too.
    resumed: Option<Arc<CoreCheckpoint>>,
    engine_handles: Vec<EngineHandle>,
    trainer_handles: Vec<TrainerHandle>,
    observer: Option<Recipient<UpdateSummary>>,
    /// `gyre train --record`: the engines, trainers and device memories
    /// write to it.
    journal: Option<Journal>,
}

impl EmbeddedBackends {
    /// The factory over `shared` (its boards and payload store may be
    /// in-process or a cluster's transfer plane) with the built-in task;
    /// the initial weights are drawn from the seed, so every process of a
    /// cluster draws the same.
    pub fn new(
        cfg: &EmbeddedConfig,
        shared: Shared,
        workspaces: Arc<Workspaces>,
        observer: Option<Recipient<UpdateSummary>>,
    ) -> Result<Self, BuildError> {
        Self::with_task(cfg, shared, BuiltInTask::new(cfg, workspaces), observer)
    }
}

impl<T: TaskBackends> EmbeddedBackends<T> {
    /// The factory over `shared` with the harness and evaluator of `task`.
    pub fn with_task(
        cfg: &EmbeddedConfig,
        shared: Shared,
        task: T,
        observer: Option<Recipient<UpdateSummary>>,
    ) -> Result<Self, BuildError> {
        if !matches!(cfg.sched.samples, SampleMode::Recorded(_)) {
            return Err(BuildError::Counted);
        }
        cfg.sched.validate()?;
        cfg.model.validate()?;
        if cfg.checkpoint.every > 0 && cfg.checkpoint.dir.is_empty() {
            return Err(BuildError::Checkpoint(
                "checkpoint.every is set but checkpoint.dir is empty".into(),
            ));
        }
        let (params, resumed) = match cfg.sched.start_version {
            0 => {
                let seed = gyre_runtime::rng::mix64(cfg.seed ^ 0x9a7a);
                (ParamBuffer::init(&cfg.model, seed)?, None)
            }
            c => {
                let ckpt = resumed_checkpoint(cfg, c)?;
                let params = ParamBuffer {
                    version: ckpt.version,
                    fingerprint: ckpt.fingerprint,
                    data: ckpt.params.clone(),
                };
                (params, Some(Arc::new(ckpt)))
            }
        };
        Ok(Self {
            cfg: cfg.clone(),
            params,
            resumed,
            shared,
            task,
            blobs: None,
            engine_handles: Vec::new(),
            trainer_handles: Vec::new(),
            observer,
            journal: None,
        })
    }

    /// The backends of `cfg` in one process: the model's initial weights
    /// published as version 0, one in-process payload store.
    pub(crate) fn in_process(
        cfg: &EmbeddedConfig,
        task: T,
        observer: Option<Recipient<UpdateSummary>>,
    ) -> Result<Self, BuildError> {
        let blobs = MemBlobs::shared();
        let store: Arc<dyn BlobStore> = blobs.clone();
        let shared = Shared::new(cfg.model.clone(), store);
        let mut factory = Self::with_task(cfg, shared, task, observer)?;
        let params = factory.initial_params();
        factory
            .shared
            .weights
            .publish(params.version, Arc::from(params.encode()));
        factory.blobs = Some(blobs);
        Ok(factory)
    }

    /// The weights every engine and trainer starts from (version 0).
    pub fn initial_params(&self) -> &ParamBuffer {
        &self.params
    }

    fn engine_worker(&self, ix: EngineIx, handle: EngineHandle, seed: u64) -> EngineWorker {
        let w = EngineWorker::new(ix, handle, self.shared.clone(), seed)
            .with_journal(self.journal.clone());
        match self.task.token_tap() {
            Some(tap) => w.with_tap(tap),
            None => w,
        }
    }

    fn engine(&self, slots: u32) -> Result<EngineHandle, BuildError> {
        let batch = if self.cfg.engine_batch == 0 {
            slots as usize
        } else {
            self.cfg.engine_batch
        };
        let e = Engine::new(
            EngineConfig::for_model(self.cfg.model.clone(), batch.max(1)),
            &self.params,
        )?;
        Ok(Arc::new(Mutex::new(e)))
    }

    /// The base of every sampling seed of engine `ix` (a cell's index, or
    /// `0xffff` for the pool).
    pub(crate) fn engine_seed(&self, ix: u64) -> u64 {
        gyre_runtime::rng::mix64(self.cfg.seed ^ (0xe9 << 8) ^ ix)
    }

    /// What the backends share (for engines made outside this factory).
    pub(crate) fn shared_backends(&self) -> Shared {
        self.shared.clone()
    }

    /// Cell `c`'s trainer and device memory; `engine` is its embedded
    /// engine, or `None` when the rollout side lives in a server.
    pub(crate) fn training_side(
        &mut self,
        c: u32,
        engine: Option<EngineHandle>,
    ) -> Result<(TrainerWorker, MemoryWorker), BuildError> {
        let optim = (c == 0).then_some(self.cfg.optim);
        let th = trainer_handle(&self.shared, &self.params, optim)?;
        if let (0, Some(ckpt)) = (c, &self.resumed) {
            lock(&th).restore(ckpt)?;
        }
        // Every cell starts in rollout: its training memory is parked on
        // the host until a switch restores it.
        lock(&th).release_memory()?;
        let checkpoint = if c == 0 {
            self.cfg.checkpoint.path()
        } else {
            None
        };
        let trainer = TrainerWorker::new(c, th.clone(), self.shared.clone(), self.cfg.objective)
            .with_observer(self.observer)
            .with_checkpoint(checkpoint)
            .with_journal(self.journal.clone());
        let memory = match engine {
            Some(eh) => MemoryWorker::new(eh, th.clone()),
            None => MemoryWorker::training_only(th.clone()),
        }
        .with_journal(c, self.journal.clone());
        self.trainer_handles.push(th);
        Ok((trainer, memory))
    }
}

/// The core's checkpoint of version `c`, which a resumed run starts from:
/// refused, naming the file, if it is missing, does not load, or holds
/// another version (it changed after the head read it).
fn resumed_checkpoint(cfg: &EmbeddedConfig, c: u64) -> Result<CoreCheckpoint, BuildError> {
    let path = cfg.checkpoint.path().ok_or_else(|| {
        BuildError::Checkpoint(format!(
            "the run resumes from version {c} but [checkpoint] every or dir is not set"
        ))
    })?;
    let ckpt = CoreCheckpoint::load(&path)
        .map_err(|e| BuildError::Checkpoint(format!("{}: {e}", path.display())))?;
    if ckpt.version != c {
        return Err(BuildError::Checkpoint(format!(
            "{} holds version {}, the run resumes from version {c}",
            path.display(),
            ckpt.version
        )));
    }
    Ok(ckpt)
}

impl<T: TaskBackends> BackendFactory for EmbeddedBackends<T> {
    type Engine = EngineWorker;
    type Trainer = TrainerWorker;
    type Memory = MemoryWorker;
    type Transfer = TransferWorker;
    type Harness = T::Harness;
    type Evaluator = T::Evaluator;
    type Error = BuildError;

    fn cell(&mut self, c: u32, slots: u32) -> Result<CellBackends<Self>, BuildError> {
        let eh = self.engine(slots)?;
        let engine = self.engine_worker(
            EngineIx::Cell(c),
            eh.clone(),
            self.engine_seed(u64::from(c)),
        );
        let (trainer, memory) = self.training_side(c, Some(eh.clone()))?;
        self.engine_handles.push(eh);
        Ok(CellBackends {
            engine,
            trainer,
            memory,
        })
    }

    fn pool(&mut self, slots: u32) -> Result<EngineWorker, BuildError> {
        let eh = self.engine(slots)?;
        let seed = self.engine_seed(0xffff);
        Ok(self.engine_worker(EngineIx::Pool, eh, seed))
    }

    fn transfer(&mut self) -> Result<TransferWorker, BuildError> {
        Ok(TransferWorker::new(self.shared.clone()).with_journal(self.journal.clone()))
    }

    fn harness(&mut self) -> Result<T::Harness, BuildError> {
        self.task.harness(&self.shared)
    }

    fn evaluator(&mut self) -> Result<T::Evaluator, BuildError> {
        self.task.evaluator()
    }

    fn kv_bytes_per_token(&self) -> u64 {
        kv_bytes_per_token(&self.cfg.model)
    }

    fn blobs(&self) -> Option<Arc<dyn BlobStore>> {
        Some(self.shared.blobs.clone())
    }
}

/// Creates the model, its engines and trainers, and spawns every backend
/// and the scheduler (which spawns the protocol actors) on `host`, as the
/// shared [`ClusterPlan`] places them.
pub fn assemble<H: Host>(host: &mut H, cfg: &EmbeddedConfig) -> Result<Assembled, BuildError> {
    assemble_observed(host, cfg, None)
}

/// [`assemble`], with every optimizer update also reported to `observer`
/// (an application's monitor, e.g. a user's actix actor).
pub fn assemble_observed<H: Host>(
    host: &mut H,
    cfg: &EmbeddedConfig,
    observer: Option<Recipient<UpdateSummary>>,
) -> Result<Assembled, BuildError> {
    let workspaces = Arc::new(Workspaces::new());
    let task = BuiltInTask::new(cfg, workspaces.clone());
    assemble_with(host, cfg, observer, task, workspaces)
}

/// [`assemble`], with every backend writing what it does to `journal`
/// (`gyre train --record`; `None`: exactly [`assemble`]).
pub fn assemble_journaled<H: Host>(
    host: &mut H,
    cfg: &EmbeddedConfig,
    journal: Option<Journal>,
) -> Result<Assembled, BuildError> {
    let workspaces = Arc::new(Workspaces::new());
    let task = BuiltInTask::new(cfg, workspaces.clone()).with_journal(journal.clone());
    let mut factory = EmbeddedBackends::in_process(cfg, task, None)?;
    factory.journal = journal;
    assemble_from(host, cfg, &mut factory, workspaces, |f| f)
}

/// [`assemble_observed`] with the harness and evaluator backends of
/// `task`; `workspaces` is the built-in task's board (empty for others).
pub fn assemble_with<H: Host, T: TaskBackends>(
    host: &mut H,
    cfg: &EmbeddedConfig,
    observer: Option<Recipient<UpdateSummary>>,
    task: T,
    workspaces: Arc<Workspaces>,
) -> Result<Assembled<EngineWorker, T::Harness, T::Evaluator>, BuildError> {
    let mut factory = EmbeddedBackends::in_process(cfg, task, observer)?;
    assemble_from(host, cfg, &mut factory, workspaces, |f| f)
}

/// The cluster a backend factory `F` assembles.
pub(crate) type FactoryAssembled<F> = Assembled<
    <F as BackendFactory>::Engine,
    <F as BackendFactory>::Harness,
    <F as BackendFactory>::Evaluator,
>;

/// Spawns the cluster `factory` makes (the embedded backends, or a
/// factory around them, which `inner` reaches) on `host`.
pub(crate) fn assemble_from<H: Host, T: TaskBackends, F>(
    host: &mut H,
    cfg: &EmbeddedConfig,
    factory: &mut F,
    workspaces: Arc<Workspaces>,
    inner: impl Fn(&mut F) -> &mut EmbeddedBackends<T>,
) -> Result<FactoryAssembled<F>, BuildError>
where
    F: BackendFactory<
            Error = BuildError,
            Trainer = TrainerWorker,
            Memory = MemoryWorker,
            Transfer = TransferWorker,
        >,
{
    let plan = ClusterPlan::for_config(&cfg.sched);
    let (sched, b) = place(&plan, &cfg.sched_config(), host, factory)?;
    let e = inner(factory);
    let backends = EmbeddedAddrs {
        engines: b.engines,
        pool: b.pool,
        trainers: b.trainers,
        memories: b.memories,
        transfer: b.transfer,
        harness: b.harness,
        evaluator: b.evaluator,
        engine_handles: std::mem::take(&mut e.engine_handles),
        trainer_handles: std::mem::take(&mut e.trainer_handles),
    };
    Ok(Assembled {
        sched,
        backends,
        shared: e.shared.clone(),
        workspaces,
        blobs: e.blobs.clone().ok_or(BuildError::NotInProcess)?,
    })
}

/// Keys and values of every layer, f32.
fn kv_bytes_per_token(m: &ModelConfig) -> u64 {
    (m.layers * 2 * m.width * 4) as u64
}

/// Virtual time as seconds, for reports.
pub fn secs(t: Nanos) -> f64 {
    t as f64 / 1e9
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    #[error(
        "unknown field `{0}` (a typo? every field and its default: README, `gyre train --print-config`)"
    )]
    Unknown(String),
    #[error("the defaults do not serialise: {0}")]
    Defaults(#[from] toml::ser::Error),
}

impl EmbeddedConfig {
    /// Reads a TOML overlay: every field the file leaves out keeps its value
    /// in `base`, and a field `base` does not have is refused by name (so a
    /// typo never silently falls back to a default).
    pub fn from_toml(text: &str, base: &EmbeddedConfig) -> Result<Self, ConfigFileError> {
        let overlay: toml::Table = toml::from_str(text)?;
        let mut merged = toml::Table::try_from(base)?;
        merge(&mut merged, overlay, "")?;
        Ok(merged.try_into()?)
    }

    /// The configuration as a complete TOML file.
    pub fn to_toml(&self) -> Result<String, ConfigFileError> {
        Ok(toml::to_string(self)?)
    }
}

fn merge(base: &mut toml::Table, overlay: toml::Table, path: &str) -> Result<(), ConfigFileError> {
    for (key, value) in overlay {
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match (base.get_mut(&key), value) {
            (None, _) => return Err(ConfigFileError::Unknown(here)),
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o, &here)?,
            (Some(slot), v) => *slot = v,
        }
    }
    Ok(())
}
