//! The scheduler: the single owner of the counters, the capacity ledger and
//! every role decision.
//!
//! It dispatches executions ([`SchedMsg`] never carries a decision back: the
//! scheduler decides, others report), starts them under the launch rule,
//! moves cells to training one at a time under the watermark rule (2) and
//! the supply check, and at each publication applies the burst-end rule
//! (3). On start it spawns the protocol actors of the cluster (proxy,
//! buffer, evaluator, packer, queue, core, cells) and wires them to the
//! backends it was given; the executions it spawns as it dispatches them.
//!
//! - [`transition`]: launches, dispatch, and rollout→training decisions;
//! - [`burst`]: step completions and publications.

mod burst;
mod loss;
mod transition;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use gyre_runtime::{Actor, ActorId, Addr, BlobStore, Cx, Nanos, NodeId, Recipient};

use crate::sched::Policy;
use crate::sched::buffer::Buffer;
use crate::sched::cell::{Cell, CellLinks};
use crate::sched::config::{ConfigError, Derived, SampleMode, SchedConfig};
use crate::sched::core::{Core, CoreConfig, CoreLinks, SealedBatch};
use crate::sched::evaluator::Evaluator;
use crate::sched::execution::{ExecStatus, Execution};
use crate::sched::ids::{EngineIx, ExecId, Step, SwitchId, Version};
use crate::sched::maths::{Counters, Dispatcher, Ledger, Role, SupplyCheck};
pub use crate::sched::msg::scheduler::SchedMsg;
use crate::sched::packer::{Packer, PackerConfig, PackerLinks};
use crate::sched::proto::Port;
use crate::sched::proto::engine::EngineReq;
use crate::sched::proto::evaluator::EvalReq;
use crate::sched::proto::harness::HarnessReq;
use crate::sched::proto::memory::MemoryReq;
use crate::sched::proto::trainer::TrainerReq;
use crate::sched::proto::transfer::TransferReq;
use crate::sched::proxy::{Proxy, RejectRetry};
use crate::sched::queue::MicroQueue;
use crate::sched::samples::{Recorded, SampleSource};

/// The backend ports a cluster runs on.
#[derive(Debug, Clone)]
pub struct Backends {
    /// One inference engine per cell.
    pub engines: Vec<Port<EngineReq>>,
    /// The standalone pool's engine, iff C_s > 0.
    pub pool_engine: Option<Port<EngineReq>>,
    /// One trainer per cell; cell 0's also serves the core.
    pub trainers: Vec<Port<TrainerReq>>,
    /// One device-memory manager per cell.
    pub memories: Vec<Port<MemoryReq>>,
    pub transfer: Port<TransferReq>,
    pub harness: Port<HarnessReq>,
    pub evaluator: Port<EvalReq>,
    pub kv_bytes_per_token: u64,
    /// Where payload handles point (prompts, TITO records, micro-step
    /// rows); `None` in the simulator, which sends no payloads.
    pub blobs: Option<Arc<dyn BlobStore>>,
}

/// The protocol actors the scheduler spawned.
#[derive(Debug, Clone)]
pub struct Peers {
    pub proxy: Addr<Proxy>,
    pub buffer: Addr<Buffer>,
    pub evaluator: Addr<Evaluator>,
    pub packer: Addr<Packer>,
    pub queue: Addr<MicroQueue>,
    pub core: Addr<Core>,
    pub cells: Vec<Addr<Cell>>,
    pub pool: Option<Addr<Cell>>,
}

impl Peers {
    /// The cell that owns `engine`.
    pub fn cell_of(&self, engine: EngineIx) -> Option<Addr<Cell>> {
        match engine {
            EngineIx::Pool => self.pool,
            EngineIx::Cell(c) => self.cells.get(c as usize).copied(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SchedTimer {
    /// The supply check comes due.
    Supply,
}

/// One rollout→training decision, with the values it was taken on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionRecord {
    pub at: Nanos,
    pub cells: Vec<u32>,
    pub watermark: u64,
    /// C_R once the cells left.
    pub capacity_after: u64,
    pub supply: u64,
    pub supply_since: Option<Nanos>,
    pub displaced: usize,
}

/// One role switch as the scheduler saw it: from its decision (to
/// training) or its return order (to rollout) until the cell holds the
/// new role (`Joined`, `Returned`). Observation only: nothing reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchTime {
    pub cell: u32,
    pub to_training: bool,
    pub began: Nanos,
    pub took: Nanos,
}

/// One burst-end decision (SPEC 2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstRecord {
    pub step: Step,
    pub core_stays: bool,
    pub ready: u64,
    pub watermark: u64,
}

/// A publication as the scheduler made it (SPEC 2.2, 2.4), told to an
/// observer: a cluster's head journals it, so that the counters and the
/// core's role at each version outlive the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Publication {
    pub step: Step,
    pub version: Version,
    /// d, p and f once the publication's dispatch is made.
    pub dispatched: u64,
    pub started: u64,
    pub finished: u64,
    /// The burst-end decision: the core stays in training.
    pub core_stays: bool,
}

/// One lost node (see [`loss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossRecord {
    pub at: Nanos,
    /// Publications before the loss.
    pub burst: u64,
    pub engine: EngineIx,
    /// The cell's role when it was lost (`None`: the pool).
    pub role: Option<Role>,
    /// Executions that were placed on it, and those of them no slot was
    /// free for.
    pub displaced: usize,
    pub unplaced: usize,
    pub rejoined_at: Option<Nanos>,
}

#[derive(Debug, Clone, Default)]
pub struct SchedLog {
    pub transitions: Vec<TransitionRecord>,
    /// Every switch that completed, in completion order.
    pub switch_times: Vec<SwitchTime>,
    pub bursts: Vec<BurstRecord>,
    /// Decisions the ledger refused (must stay empty).
    pub errors: Vec<String>,
    /// Over-sampling: surplus executions that closed cancelled (they were
    /// running), and those withdrawn from the queue before they started.
    pub surplus_cancelled: u64,
    pub surplus_withdrawn: u64,
    /// Nodes lost (with `SchedConfig::watch_nodes`).
    pub losses: Vec<LossRecord>,
    /// The core's node lost (checkpoints on as well): when, and in which
    /// burst (publications before it); the satellites left training then.
    pub core_losses: Vec<(Nanos, u64)>,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    derived: Derived,
    backends: Backends,
    /// The packer's sample source, until the packer is spawned.
    source: Option<Box<dyn SampleSource>>,
    peers: Option<Peers>,
    reject_retry: RejectRetry,
    counters: Counters,
    ledger: Ledger,
    dispatcher: Dispatcher,
    supply: SupplyCheck,
    supply_timer: Option<Nanos>,
    queue: VecDeque<ExecId>,
    execs: BTreeMap<ExecId, Addr<Execution>>,
    published: Version,
    steps_done: u64,
    burst: u64,
    done: bool,
    switches: Vec<Option<SwitchId>>,
    /// When each cell's current switch began (for [`SchedLog::switch_times`]).
    switch_began: Vec<Nanos>,
    next_switch: u64,
    /// Cells of an all-at-once switch (Colocate, Async's start), and those
    /// of them whose training memory is resident.
    group: BTreeSet<u32>,
    group_switched: BTreeSet<u32>,
    /// The pool's rejoin, while its node is lost.
    pool_switch: Option<SwitchId>,
    log: SchedLog,
    /// Executions the dispatch rule released while an operator paused
    /// dispatch (`Some` while paused).
    held: Option<u64>,
    /// The engines last named to the proxy as lenders (see [`Self::lend`]).
    lent: Vec<EngineIx>,
    /// Told the groups of each sealed batch (the packer's observer).
    sealed: Option<Recipient<SealedBatch>>,
    /// Told each publication.
    publications: Option<Recipient<Publication>>,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, backends: Backends) -> Result<Self, ConfigError> {
        let derived = cfg.validate()?;
        let k = cfg.cells as usize;
        for (what, got) in [
            ("engines", backends.engines.len()),
            ("trainers", backends.trainers.len()),
            ("device memories", backends.memories.len()),
        ] {
            if got != k {
                return Err(ConfigError::Ports {
                    what,
                    expected: k,
                    got,
                });
            }
        }
        let pool = usize::from(cfg.pool_capacity > 0);
        let got = usize::from(backends.pool_engine.is_some());
        if pool != got {
            return Err(ConfigError::Ports {
                what: "standalone pool engine",
                expected: pool,
                got,
            });
        }
        let source = sample_source(&cfg.samples, backends.blobs.as_ref())?;
        Ok(Self {
            source,
            ledger: Ledger::new(cfg.cells, cfg.cell_capacity, cfg.pool_capacity),
            dispatcher: Dispatcher {
                mode: cfg.dispatch,
                over_groups: derived.over_groups,
                mu: u64::from(cfg.mu),
                batch_groups: u64::from(cfg.batch_groups),
                group_size: u64::from(cfg.dispatched_per_group()),
            },
            supply: SupplyCheck::new(u64::from(derived.supply_threshold), cfg.tau),
            supply_timer: None,
            counters: Counters::default(),
            queue: VecDeque::new(),
            execs: BTreeMap::new(),
            published: cfg.start_version,
            steps_done: cfg.start_version,
            burst: 0,
            done: false,
            switches: vec![None; k],
            switch_began: vec![0; k],
            next_switch: 0,
            group: BTreeSet::new(),
            group_switched: BTreeSet::new(),
            pool_switch: None,
            log: SchedLog::default(),
            held: None,
            lent: Vec::new(),
            sealed: None,
            publications: None,
            peers: None,
            reject_retry: RejectRetry::default(),
            cfg,
            derived,
            backends,
        })
    }

    /// Tells `observer` the groups of every batch the packer seals (a
    /// cluster's head journals them: [`SealedBatch`]).
    pub fn with_sealed_observer(mut self, observer: Recipient<SealedBatch>) -> Self {
        self.sealed = Some(observer);
        self
    }

    /// Tells `observer` every publication ([`Publication`]).
    pub fn with_publication_observer(mut self, observer: Recipient<Publication>) -> Self {
        self.publications = Some(observer);
        self
    }

    /// The proxy retries a rejected call on the same engine (remote
    /// engines' transient failures); off by default.
    pub fn with_reject_retry(mut self, r: RejectRetry) -> Self {
        self.reject_retry = r;
        self
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }
    pub fn derived(&self) -> Derived {
        self.derived
    }
    pub fn peers(&self) -> Option<&Peers> {
        self.peers.as_ref()
    }
    pub fn counters(&self) -> Counters {
        self.counters
    }
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
    pub fn supply(&self) -> &SupplyCheck {
        &self.supply
    }
    pub fn published(&self) -> Version {
        self.published
    }
    /// Whether an operator paused dispatch.
    pub fn dispatch_paused(&self) -> bool {
        self.held.is_some()
    }

    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }
    /// Publications so far.
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// The target step count was reached.
    pub fn is_done(&self) -> bool {
        self.done
    }
    pub fn log(&self) -> &SchedLog {
        &self.log
    }

    /// A decision the ledger refused: logged (a live run's tests read the
    /// log for it) and kept for the invariant checker.
    fn refused(&mut self, error: String) {
        tracing::error!(%error, "the ledger refused a scheduling decision");
        self.log.errors.push(error);
    }

    fn new_switch(&mut self) -> SwitchId {
        self.next_switch += 1;
        SwitchId(self.next_switch)
    }

    /// Logs a switch of `cell` that ends `now` (observation only).
    fn switch_done(&mut self, cell: u32, to_training: bool, now: Nanos) {
        let began = self.switch_began.get(cell as usize).copied().unwrap_or(now);
        let took = now.saturating_sub(began);
        self.log.switch_times.push(SwitchTime {
            cell,
            to_training,
            began,
            took,
        });
        tracing::debug!(cell, to_training, took_us = took / 1_000, "switch done");
    }

    fn current(&self, cell: u32, switch: SwitchId) -> bool {
        self.switches.get(cell as usize).copied().flatten() == Some(switch)
    }

    fn spawn_peers(&mut self, cx: &mut Cx<'_, Self>) -> Peers {
        let me = cx.me();
        let b = &self.backends;
        let cfg = &self.cfg;
        let mut engines: BTreeMap<EngineIx, Port<EngineReq>> = b
            .engines
            .iter()
            .enumerate()
            .map(|(i, p)| (EngineIx::Cell(i as u32), *p))
            .collect();
        if let Some(p) = b.pool_engine {
            engines.insert(EngineIx::Pool, p);
        }
        let mut proxy = Proxy::new(engines)
            .with_retry(cfg.retry)
            .with_reject_retry(self.reject_retry);
        if let Some(store) = &b.blobs {
            proxy = proxy.with_blobs(store.clone());
        }
        let proxy = cx.spawn(proxy);
        let buffer = Buffer::new(cfg.group_size)
            .with_dispatched(cfg.dispatched_per_group())
            .with_sched(me);
        let buffer = cx.spawn(buffer);
        let evaluator = Evaluator::new(b.evaluator, buffer, cfg.eval_retry).with_resend(cfg.retry);
        let evaluator = cx.spawn(evaluator);
        let core = cx.spawn(
            Core::new(
                CoreConfig {
                    cells: cfg.cells,
                    mu: cfg.mu,
                    target_steps: cfg.target_steps,
                    streaming: cfg.streaming,
                    keep_satellites: matches!(cfg.policy, Policy::Async { .. }),
                    checkpoint_every: cfg.checkpoint_every,
                    recover: cfg.watch_nodes && cfg.checkpoint_every.is_some(),
                    reduce_needs_members: cfg.reduce_needs_members,
                },
                CoreLinks {
                    sched: me,
                    trainer: b.trainers[0],
                    transfer: b.transfer,
                },
            )
            .with_retry(cfg.retry)
            .starting_at(cfg.start_version),
        );
        let queue = cx.spawn(MicroQueue::new());
        let mut packer = Packer::new(
            PackerConfig {
                batch_groups: cfg.batch_groups,
                micro_tokens: cfg.micro_tokens,
                short_micro_steps: cfg.short_micro_steps,
                streaming: cfg.streaming,
                keep_until_durable: cfg.watch_nodes && cfg.checkpoint_every.is_some(),
            },
            PackerLinks {
                buffer,
                queue,
                core,
                sched: me,
            },
        );
        if let Some(source) = self.source.take() {
            packer = packer.with_source(source);
            if let Some(store) = &b.blobs {
                packer = packer.with_blobs(store.clone());
            }
        }
        let packer = cx.spawn(
            packer
                .starting_at(cfg.start_version)
                .with_observer(self.sealed),
        );
        let links = |engine, trainer, memory| CellLinks {
            sched: me,
            core,
            queue,
            engine,
            trainer,
            memory,
            transfer: b.transfer,
        };
        let cells = (0..cfg.cells as usize)
            .map(|i| {
                let l = links(b.engines[i], Some(b.trainers[i]), Some(b.memories[i]));
                let cell = Cell::new(i as u32, l, b.kv_bytes_per_token).with_retry(cfg.retry);
                cx.spawn(cell.serving(cfg.start_version))
            })
            .collect();
        let pool = b.pool_engine.map(|e| {
            let pool = Cell::standalone(links(e, None, None), b.kv_bytes_per_token);
            cx.spawn(pool.with_retry(cfg.retry).serving(cfg.start_version))
        });
        Peers {
            proxy,
            buffer,
            evaluator,
            packer,
            queue,
            core,
            cells,
            pool,
        }
    }
}

/// The packer's source for `mode`: `None` keeps the packer's own (counts).
fn sample_source(
    mode: &SampleMode,
    blobs: Option<&Arc<dyn BlobStore>>,
) -> Result<Option<Box<dyn SampleSource>>, ConfigError> {
    let SampleMode::Recorded(rc) = mode else {
        return Ok(None);
    };
    let Some(store) = blobs else {
        return Err(ConfigError::Samples(
            "Recorded reads TITO records by handle: the backends need a blob store".into(),
        ));
    };
    let source = Recorded::new(rc.clone())
        .map_err(|e| ConfigError::Samples(format!("recorded profile: {e}")))?
        .with_blobs(store.clone());
    Ok(Some(Box::new(source)))
}

impl Actor for Scheduler {
    type Msg = SchedMsg;
    type Timer = SchedTimer;

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        let peers = self.spawn_peers(cx);
        self.peers = Some(peers);
        self.watch_backends(cx);
        if let Policy::Async { train_cells } = self.cfg.policy {
            let cells: Vec<u32> = (0..train_cells).collect();
            self.start_switch(&cells, cx);
        }
        let n = self.dispatcher.at_start();
        self.dispatch(n, cx);
        self.launch(cx);
        self.try_transition(cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: SchedMsg, cx: &mut Cx<'_, Self>) {
        self.handle(msg, cx);
        self.lend(cx);
    }

    fn on_timer(&mut self, _timer: SchedTimer, cx: &mut Cx<'_, Self>) {
        self.supply_timer = None;
        self.try_transition(cx);
    }

    fn on_peer_down(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        self.on_node_down(node, cx);
        self.lend(cx);
    }
}

impl Scheduler {
    fn handle(&mut self, msg: SchedMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            SchedMsg::Closed { exec, status } => {
                // Only a started (placed) execution can close.
                if self.ledger.release(exec).is_none() && !self.ledger.release_unplaced(exec) {
                    return;
                }
                if status == ExecStatus::Cancelled {
                    self.log.surplus_cancelled += 1;
                }
                self.execs.remove(&exec);
                self.counters.finish();
                self.launch(cx);
                self.try_transition(cx);
            }
            SchedMsg::Switched { cell, switch } => self.on_switched(cell, switch, cx),
            SchedMsg::Joined { cell, switch } => {
                if self.current(cell, switch) && self.ledger.role(cell) == Some(Role::ToTraining) {
                    if let Err(e) = self.ledger.set_role(cell, Role::Training) {
                        self.refused(e.to_string());
                    }
                    self.switch_done(cell, true, cx.now());
                    self.supply.reset(cx.now());
                    self.try_transition(cx);
                }
            }
            SchedMsg::Returned { cell, switch } if cell == u32::MAX => {
                self.rejoined(None, switch, cx)
            }
            SchedMsg::Returned { cell, switch } if self.ledger.role(cell) == Some(Role::Lost) => {
                self.rejoined(Some(cell), switch, cx)
            }
            SchedMsg::Returned { cell, switch } => {
                if self.current(cell, switch) && self.ledger.role(cell) == Some(Role::Returning) {
                    if let Err(e) = self.ledger.set_role(cell, Role::Rollout) {
                        self.refused(e.to_string());
                    }
                    self.switch_done(cell, false, cx.now());
                    self.launch(cx);
                    self.try_transition(cx);
                }
            }
            SchedMsg::Supply { value, .. } => {
                self.supply.observe(cx.now(), value);
                self.try_transition(cx);
            }
            SchedMsg::StepDone { step } => self.on_step_done(step, cx),
            SchedMsg::Published { step, version } => self.on_published(step, version, cx),
            SchedMsg::Surplus { execs } => self.cancel_surplus(&execs, cx),
            SchedMsg::NodeBack { node } => self.on_node_back(node, cx),
            SchedMsg::PauseDispatch => {
                self.held.get_or_insert(0);
            }
            SchedMsg::ResumeDispatch => {
                if let Some(n) = self.held.take() {
                    self.dispatch(n, cx);
                    self.launch(cx);
                    self.try_transition(cx);
                }
            }
        }
    }

    /// Tells the proxy which engines lend themselves to the calls of
    /// executions a loss left without a slot (none once every running
    /// execution has one), when that changes. Fault-free runs never have
    /// such executions, so they never send it.
    fn lend(&mut self, cx: &mut Cx<'_, Self>) {
        let engines = if self.ledger.unplaced() > 0 {
            self.ledger.serving()
        } else {
            Vec::new()
        };
        if engines == self.lent {
            return;
        }
        let Some(proxy) = self.peers.as_ref().map(|p| p.proxy) else {
            return;
        };
        self.lent = engines.clone();
        cx.send(proxy, crate::sched::proxy::ProxyMsg::Lend { engines });
    }
}
