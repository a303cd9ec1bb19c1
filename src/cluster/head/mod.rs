//! The head of a multi-process run (`gyre train --cluster …`): it starts
//! the node agents through the launcher, assigns them the plan's roles,
//! assembles the scheduling plane over their ports, and reports what the
//! run learned and what moved between processes.
//!
//! Phases: *join* (every node agent started and joined, with its transfer
//! address), *assign* (each builds its backends over the plane and answers
//! their ports), *run* (the scheduler, the proxy and the rest on the head;
//! the core's updates arrive on an observer endpoint), *collect* (each
//! node's bytes moved), *stop*. A node that ends or loses its link before
//! the run starts fails it at once, naming the node, its roles and how it
//! ended. Once the run is going, a node that hosts neither the core nor
//! anything else the run cannot do without (a rollout cell, a satellite,
//! the pool) is a defined loss: the scheduler watches its node and takes it
//! out of the ledger (its executions' calls move, KV is recomputed, C_R
//! drops, a batch it trained in goes back to the queue), the head records
//! it in the report's `node_losses`, and the run goes on. Once its process
//! has ended, the launcher starts the agent again (see [`rejoin`]), and the
//! node rejoins the run. So does the core's node when the core writes
//! durable checkpoints: its restarted trainer resumes from the last one
//! (`core::restore` in the actors, `TrainerWorker::load_checkpoint` here).
//! Without checkpoints, or with its restarts spent, the core's loss fails
//! the run, naming the node.

mod durable;
mod rejoin;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gyre_actors::sched::ConfigError;
use gyre_actors::sched::core::SealedBatch;
use gyre_actors::sched::plan::BackendFactory;
use gyre_actors::sched::proto::engine::EngineReq;
use gyre_actors::sched::scheduler::{Backends, Publication, Scheduler};
use gyre_rdma::ClusterSecret;
use gyre_runtime::live::{LinkSecret, LiveConfig, LiveNode};
use gyre_runtime::{ActorId, Addr, External, NodeId, Recipient};
use serde::Serialize;
use tokio::sync::mpsc::Receiver;

use super::launcher::{ClusterEvent, Launcher, LauncherMsg};
use super::node::to_hex;
use super::placement::{HeadInfo, Launch, Placement, placement_for, process_runs};
use super::plane::{BytesMoved, Directory, Plane, PlaneError, shared_over};
use super::proto::{HEAD, NodeCmd, NodeEvent, NodePorts, NodeSpec, Role, launcher_id, node_specs};
use super::tap::{TapMsg, serve_tap};
use crate::embedded::cluster::{
    BuildError, ConfigFileError, EmbeddedBackends, EmbeddedConfig, TaskBackends,
};
use crate::embedded::external::GatewayOptions;
use crate::embedded::external::bridge::ToFront;
use crate::embedded::external::side::{self, GatewayCounters, GatewaySide, Incarnation};
use crate::embedded::last_word::{self, LostHead, Taken};
use crate::embedded::live::LiveReport;
use crate::embedded::run_journal::{
    self, JournalError, Line, Opened, Resumed, RewardsSeen, RunCounters, RunJournal,
};
use crate::embedded::task::{TaskStats, Workspaces};
use crate::embedded::trainer::UpdateSummary;
use crate::harness::orphans;

/// How a cluster run is placed.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub launch: Launch,
    /// Node-agent processes; `None` for one per plan node.
    pub processes: Option<usize>,
    /// Where the head listens for node agents (port 0: any).
    pub listen: SocketAddr,
    /// The `gyre` binary node agents run.
    pub exe: PathBuf,
    /// How long node agents have to start, join and build their backends.
    pub join_timeout: Duration,
    /// A run that publishes nothing for this long is reported stuck.
    pub stall: Duration,
    /// How many times a lost node agent is started again, per node (0:
    /// never; the node stays lost). Every placement restarts: `local` and
    /// `slurm` start the process again, `slurm-batch` a step of the same
    /// allocation, `k8s` the node's Job.
    pub restarts: u32,
    /// Resume the run an earlier head lost, from the core's checkpoint and
    /// the run journal in `[checkpoint] dir` (see
    /// [`crate::embedded::run_journal`]).
    pub resume: bool,
    /// How long node agents wait for a resumed head after losing this one
    /// (runs with a checkpoint directory, `local` and `slurm` placements;
    /// zero: they exit with it). See [`durable`].
    pub agent_wait: Duration,
    /// How long a resumed head waits for the agents an earlier head left
    /// running to join it before it starts new ones in their place.
    pub adopt_wait: Duration,
}

impl ClusterOptions {
    /// Child processes on this machine, one per plan node.
    pub fn local(exe: PathBuf) -> Self {
        Self {
            launch: Launch::Local,
            processes: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            exe,
            join_timeout: Duration::from_secs(60),
            stall: Duration::from_secs(300),
            restarts: 3,
            resume: false,
            agent_wait: Duration::from_secs(60),
            adopt_wait: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("configuration: {0}")]
    Config(#[from] ConfigFileError),
    #[error("transfer plane: {0}")]
    Plane(#[from] PlaneError),
    #[error("live host: {0}")]
    Host(#[from] gyre_runtime::RuntimeError),
    #[error("could not start the tokio runtime: {0}")]
    Tokio(#[from] std::io::Error),
    #[error("the head's listener {0} must be a concrete address node agents can reach")]
    Unreachable(SocketAddr),
    #[error("the launcher got id {got}, not the well-known {want} node agents address")]
    LauncherId { got: ActorId, want: ActorId },
    #[error("{label} could not be started: {error}")]
    LaunchFailed { label: String, error: String },
    #[error("{label} failed: {what}")]
    NodeFailed { label: String, what: String },
    #[error("{label} failed: its link to the head went down")]
    LinkLost { node: NodeId, label: String },
    #[error("timed out after {secs} s waiting for node agents to {phase}")]
    Timeout { phase: &'static str, secs: u64 },
    #[error(
        "{label} was restarted but its backends answered at other addresses than its first process's"
    )]
    RejoinPorts { label: String },
    #[error("run journal: {0}")]
    Journal(#[from] JournalError),
    #[error("no progress for {secs} s: {steps} of {target} steps published")]
    Stalled { secs: u64, steps: u64, target: u64 },
    #[error("the gateway: {0}")]
    Gateway(String),
    #[error("the head's state {path}: {what}")]
    State { path: PathBuf, what: String },
}

impl From<ConfigError> for ClusterError {
    fn from(e: ConfigError) -> Self {
        ClusterError::Build(BuildError::Sched(e))
    }
}

/// One node-agent process of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    pub node: u32,
    pub roles: Vec<String>,
    /// The process the launcher started (`srun` under Slurm).
    pub pid: u32,
    /// The node agent's own process (the last one started).
    pub agent_pid: u32,
    /// What that process read from the others (`None`: it did not report,
    /// being lost at the end).
    pub bytes_moved: Option<BytesMoved>,
}

/// A node agent lost while the run went on.
#[derive(Debug, Clone, Serialize)]
pub struct NodeLoss {
    pub node: u32,
    pub roles: Vec<String>,
    /// How it ended, as the launcher saw it.
    pub how: String,
    /// Seconds into the run.
    pub at_secs: f64,
    /// Updates published before the loss.
    pub after_steps: u64,
    /// Times its agent was started again since.
    pub restarts: u32,
    /// Seconds into the run when the restarted agent had rebuilt its
    /// backends and the scheduler was told the node is back; `None` if it
    /// never came back.
    pub back_at_secs: Option<f64>,
}

/// What a cluster run did: the live host's report, plus the processes and
/// the payload bytes that crossed between them.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    #[serde(flatten)]
    pub run: LiveReport,
    pub placement: String,
    /// The head (`gyre train`) and the node agents.
    pub head_pid: u32,
    pub processes: Vec<ProcessReport>,
    /// Bytes read by one process from another's transfer engine, by kind.
    pub bytes_moved: BytesMoved,
    /// Node agents lost mid-run, in the order they were lost.
    pub node_losses: Vec<NodeLoss>,
    /// Updates a core restored from its checkpoint rolled back and made
    /// again (`updates` holds the history: one per version), including
    /// those an earlier head published after its last checkpoint.
    pub redone_updates: u64,
    /// What the gateway saw, in a run whose executions are external
    /// processes behind it (`--gateway-listen`, `--job`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayCounters>,
    /// Node agents an earlier head left running that this one adopted
    /// (reported as `resumed.agents_adopted`).
    #[serde(skip)]
    pub agents_adopted: u64,
    /// The scheduler's counters at the last publication, over the whole
    /// run (a resumed run's continue the lost head's: [`RunCounters`]).
    pub counters: Option<RunCounters>,
}

/// Runs `cfg` across processes as `opts` places them.
pub fn run_cluster(
    cfg: &EmbeddedConfig,
    opts: &ClusterOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ClusterReport, ClusterError> {
    run_cluster_with(cfg, opts, None, progress)
}

/// Runs `cfg` across processes as `opts` places them, its executions
/// external harness processes behind the head's gateway when `gateway`
/// says how to run them (else the built-in task).
pub fn run_cluster_with(
    cfg: &EmbeddedConfig,
    opts: &ClusterOptions,
    gateway: Option<GatewayOptions>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ClusterReport, ClusterError> {
    if opts.listen.ip().is_unspecified() {
        return Err(ClusterError::Unreachable(opts.listen));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut placement: Option<Arc<dyn Placement>> = None;
    let result = rt.block_on(run_head(cfg, opts, gateway, &mut placement, progress));
    // Whatever happened, no node agent outlives its head.
    if let Some(p) = placement {
        p.stop_all();
    }
    result
}

struct Head {
    live: LiveNode,
    events: Receiver<(ActorId, ClusterEvent)>,
    from: ActorId,
    launcher: Addr<Launcher>,
    specs: Vec<NodeSpec>,
    pids: BTreeMap<NodeId, u32>,
    agents: BTreeMap<NodeId, u32>,
    /// Set once the scheduling plane runs: from then on, a node other
    /// than the core's is a loss the run survives.
    running: Option<Instant>,
    /// Updates published so far.
    steps: u64,
    lost: Vec<NodeLoss>,
    rejoins: rejoin::Rejoins,
    /// The core writes durable checkpoints a restarted core resumes from.
    core_recovers: bool,
    /// Updates rolled back by a restored core and made again.
    redone: u64,
    /// Bytes each node agent reported at the end.
    moved: BTreeMap<NodeId, BytesMoved>,
    /// Where a resumable run records its agents' processes.
    state: Option<durable::HeadState>,
    /// Agents of an earlier head adopted.
    agents_adopted: u64,
    /// 0 for the run's first head, n for its n-th resume.
    incarnation: u64,
    /// The scheduler's last publication.
    last_publication: Option<Publication>,
}

/// How long the head waits, after the last update, for the scheduler's
/// last publication.
const LAST_PUBLICATION_WAIT: Duration = Duration::from_secs(5);

impl Head {
    fn label(&self, node: NodeId) -> String {
        self.specs
            .iter()
            .find(|s| s.node == node)
            .map_or_else(|| format!("node {}", node.0), NodeSpec::label)
    }

    /// The next event, with every unexpected end turned into an error.
    async fn next(
        &mut self,
        deadline: Instant,
        phase: &'static str,
    ) -> Result<NodeEvent, ClusterError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some((_, e))) => e,
                Ok(None) | Err(_) => {
                    return Err(ClusterError::Timeout {
                        phase,
                        secs: left.as_secs(),
                    });
                }
            };
            if let Some(e) = self.failure(event)? {
                return Ok(e);
            }
        }
    }

    /// Whether the run survives losing `node`: it is running, and the node
    /// hosts no part of the core (cell 0), or the core resumes from its
    /// checkpoints on a restarted agent.
    fn survives(&self, node: NodeId) -> bool {
        let core_back = self.core_recovers && self.rejoins.can_restart(node);
        self.running.is_some()
            && self
                .specs
                .iter()
                .find(|s| s.node == node)
                .is_some_and(|s| core_back || !s.roles.contains(&Role::Cell(0)))
    }

    /// Whether `node` is lost and not back (restarting or not).
    fn is_lost(&self, node: NodeId) -> bool {
        self.rejoins.is_down(node)
    }

    /// Records a loss the run survives.
    fn lose(&mut self, node: NodeId, how: String) {
        if !self.rejoins.down(node) {
            return;
        }
        let roles = self
            .specs
            .iter()
            .find(|s| s.node == node)
            .map(|s| s.roles.iter().map(Role::to_string).collect())
            .unwrap_or_default();
        tracing::warn!(node = node.0, roles = %self.label(node), %how, "node agent lost; the run goes on without it");
        self.lost.push(NodeLoss {
            node: node.0,
            roles,
            how,
            at_secs: self.running.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            after_steps: self.steps,
            restarts: 0,
            back_at_secs: None,
        });
    }

    /// `node`'s process is `pid` now, recorded for a resumed head.
    fn placed(&mut self, node: NodeId, pid: u32) {
        self.pids.insert(node, pid);
        if let Some(Err(e)) = self.state.as_ref().map(|s| s.remember_agent(node, pid)) {
            tracing::warn!(node = node.0, error = %e, "a resumed head will not find this agent");
        }
    }

    fn failure(&mut self, event: ClusterEvent) -> Result<Option<NodeEvent>, ClusterError> {
        match event {
            ClusterEvent::Exited {
                node,
                status,
                expected: false,
                ..
            } if self.survives(node) => {
                self.lose(node, format!("its process exited ({status})"));
                self.rejoins.exited(node);
                Ok(None)
            }
            ClusterEvent::LinkDown { node, .. } if self.survives(node) => {
                self.lose(node, "its link to the head went down".into());
                Ok(None)
            }
            ClusterEvent::Started { node, pid } => {
                tracing::info!(node = node.0, pid, roles = %self.label(node), "node agent started");
                self.placed(node, pid);
                Ok(None)
            }
            ClusterEvent::Adopted { node, pid } => {
                tracing::info!(node = node.0, pid, roles = %self.label(node), "node agent adopted");
                self.agents_adopted += 1;
                self.placed(node, pid);
                Ok(None)
            }
            ClusterEvent::LaunchFailed { label, error, .. } => {
                Err(ClusterError::LaunchFailed { label, error })
            }
            ClusterEvent::Exited {
                label,
                status,
                expected: false,
                ..
            } => Err(ClusterError::NodeFailed {
                label,
                what: format!("its process exited ({status})"),
            }),
            ClusterEvent::Exited { .. } => Ok(None),
            ClusterEvent::LinkDown { node, label } => Err(ClusterError::LinkLost { node, label }),
            ClusterEvent::Node(NodeEvent::Failed { node, error }) => {
                Err(ClusterError::NodeFailed {
                    label: self.label(node),
                    what: format!("its assignment failed: {error}"),
                })
            }
            ClusterEvent::Node(e) => Ok(Some(e)),
        }
    }

    /// A lost link is usually a process that ended: wait briefly for its
    /// exit, so the report says how it ended.
    async fn why_lost(&mut self, node: NodeId, label: String) -> ClusterError {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some((
                    _,
                    ClusterEvent::Exited {
                        node: n, status, ..
                    },
                ))) if n == node => {
                    return ClusterError::NodeFailed {
                        label,
                        what: format!(
                            "its process exited ({status}) and its link to the head went down"
                        ),
                    };
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return ClusterError::LinkLost { node, label },
            }
        }
    }

    async fn tell(&self, to: Addr<External<NodeCmd>>, cmd: NodeCmd) -> Result<(), ClusterError> {
        Ok(self.live.send(self.from, to, cmd).await?)
    }
}

async fn run_head(
    cfg: &EmbeddedConfig,
    opts: &ClusterOptions,
    gateway: Option<GatewayOptions>,
    placement_out: &mut Option<Arc<dyn Placement>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ClusterReport, ClusterError> {
    let started = Instant::now();
    let seed_of_run = cfg.seed;
    let take_word = |dir: &Path, lost: &LostHead| take_core_word(cfg, opts, dir, lost);
    let Opened {
        mut journal,
        resumed,
        report: mut resume_report,
        cfg,
    } = tokio::task::block_in_place(|| run_journal::open_with(cfg, opts.resume, Some(&take_word)))?;
    let cfg = &cfg;
    // A resumable run keeps its secret and address for the head after
    // this one, which its waiting agents join.
    let state = durable::HeadState::new(
        cfg.checkpoint
            .path()
            .map(|_| PathBuf::from(&cfg.checkpoint.dir))
            .as_deref(),
    );
    let secret = &match &state {
        Some(s) => {
            if !opts.resume {
                s.forget_agents()?;
            }
            s.secret(opts.resume)?
        }
        None => rand::random(),
    };
    let transfer_secret = ClusterSecret::new(secret).map_err(PlaneError::from)?;
    let plane = Plane::start(HEAD, SocketAddr::new(opts.listen.ip(), 0), transfer_secret)?;
    plane.serve_homing();
    let shared = shared_over(&plane, cfg.model.clone());

    let listen = match &state {
        Some(s) => s.listen(opts.resume, opts.listen)?,
        None => opts.listen,
    };
    let mut live_cfg = LiveConfig::local(HEAD, cfg.seed);
    live_cfg.listen = Some(listen);
    live_cfg.secret = Some(LinkSecret::new(secret)?);
    let live = match LiveNode::start(live_cfg.clone()).await {
        Err(e) if listen != opts.listen => {
            // The lost head's address is taken: its agents will not find
            // this head, and new ones are started in their place.
            tracing::warn!(%listen, error = %e, "cannot listen where the lost head did");
            live_cfg.listen = Some(opts.listen);
            LiveNode::start(live_cfg).await?
        }
        started => started?,
    };
    // Agents the lost head left waiting dial where it listened: only a
    // head listening there can adopt them.
    let reachable = opts.resume && live.local_addr() == Some(listen);
    if let (Some(s), Some(addr)) = (&state, live.local_addr()) {
        s.remember_listen(addr)?;
    }
    // Endpoints in a fixed order, the launcher next (`LAUNCHER_LOCAL_ID`).
    let (events_addr, events) = live.probe::<ClusterEvent>(1024);
    let (updates_addr, updates_rx) = live.probe::<UpdateSummary>(1024);
    let front = live.probe::<ToFront>(1 << 16);
    let (tap_addr, tap_rx) = live.probe::<TapMsg>(1 << 16);
    let endpoints = Endpoints {
        events_addr,
        events,
        updates_addr,
        updates_rx,
    };
    let run = HeadRun {
        cfg,
        opts,
        plane: &plane,
        live: &live,
        secret,
        journal: journal.as_mut(),
        resumed: resumed.as_ref(),
        state: state.as_ref(),
        adopt: reachable,
        placement_out,
        progress,
    };
    // Built before any process starts, so a bad configuration fails first.
    let outcome = match gateway {
        None => {
            let workspaces = Arc::new(Workspaces::new());
            let factory = EmbeddedBackends::new(cfg, shared, workspaces.clone(), None)?;
            let stats = move || workspaces.stats();
            run.with_task(factory, endpoints, None, &stats).await
        }
        Some(gw) => {
            let (task, prepared) = side::prepare(&gw, front);
            let factory = EmbeddedBackends::with_task(cfg, shared.clone(), task, None)?;
            // As in the one-process run: without `--run-dir` the
            // workspaces and logs live in a temporary folder removed at
            // the end (the records stay in the report).
            let (dir, temporary) = match &gw.dir {
                Some(d) => (d.clone(), false),
                None => (
                    std::env::temp_dir().join(format!(
                        "gyre-cluster-{}-{}",
                        std::process::id(),
                        cfg.seed
                    )),
                    true,
                ),
            };
            std::fs::create_dir_all(&dir)?;
            // The harnesses are told the run's journal folder (or, without
            // one, the run's folder): a resume kills those an earlier head
            // left running, and gives its own workspaces a folder of their
            // own (execution ids start from 0 again).
            let run_tag = orphans::tag_of(&cfg.checkpoint.path().map_or(dir.clone(), |_| {
                std::path::PathBuf::from(&cfg.checkpoint.dir)
            }));
            // Until the run has ended its harnesses itself, a SIGINT or
            // SIGTERM ends them (see `orphans::end_on_signal`).
            let _watch = orphans::watch(&run_tag, temporary.then_some(dir.as_path()));
            let at = match &resumed {
                Some(r) => Incarnation {
                    dir: dir.join(format!("resume-{}", r.resumes + 1)),
                    run: run_tag,
                    number: r.resumes + 1,
                    trained: r.trained.clone(),
                },
                None => Incarnation {
                    dir: dir.clone(),
                    run: run_tag,
                    ..Default::default()
                },
            };
            let side = prepared
                .open(cfg, &gw, at, &shared)
                .await
                .map_err(|e| ClusterError::Gateway(e.to_string()))?;
            if let Some(report) = resume_report.as_mut() {
                report.harnesses_killed = side.adopted.killed;
                report.adopted = side.adopted;
            }
            tracing::info!(gateway = %side.api_base, "gateway listening for harness processes");
            let tap = tokio::spawn(serve_tap(
                live.clone(),
                tap_addr.id(),
                tap_rx,
                side.streams.clone(),
            ));
            let stats = {
                let board = side.board.clone();
                move || board.stats()
            };
            let mut side = Some(side);
            let outcome = run
                .with_task(factory, endpoints, Some((tap_addr, &mut side)), &stats)
                .await;
            tap.abort();
            // The front's probe is gone with the host: the front ends and
            // kills the harnesses still running.
            live.clone().shutdown().await;
            let outcome = match (outcome, side) {
                (Ok(mut report), Some(side)) => {
                    report.gateway = Some(side.close().await.0);
                    Ok(report)
                }
                (outcome, _) => outcome,
            };
            if temporary {
                let _ = std::fs::remove_dir_all(&dir);
            }
            outcome
        }
    };
    live.shutdown().await;
    plane.stop();
    let mut report = outcome?;
    report.run.seed = seed_of_run;
    report.run.resumed = resume_report.map(|mut r| {
        r.agents_adopted = report.agents_adopted;
        r
    });
    report.run.wall_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// A resumed head's take of the core's last word: while the core's node
/// agent, as the lost head recorded it, still runs here (`local` and
/// `slurm` placements, whose processes a head can see), it waits up to the
/// adoption window for the word, which that agent writes as soon as it
/// finds its head gone.
fn take_core_word(
    cfg: &EmbeddedConfig,
    opts: &ClusterOptions,
    dir: &Path,
    lost: &LostHead,
) -> Result<Option<Taken>, String> {
    let visible = matches!(opts.launch, Launch::Local | Launch::Slurm { .. });
    let core_node = node_specs(&cfg.sched, opts.processes)
        .into_iter()
        .find(|s| s.roles.contains(&Role::Cell(0)))
        .map(|s| s.node);
    let pid = match (visible, core_node, durable::HeadState::new(Some(dir))) {
        (true, Some(node), Some(state)) => state
            .agents()
            .map_err(|e| e.to_string())?
            .get(&node)
            .copied(),
        _ => None,
    };
    last_word::take(dir, lost, opts.adopt_wait, &|| {
        pid.is_some_and(process_runs)
    })
}

/// The head's endpoints for the node agents' events and the core's updates.
struct Endpoints {
    events_addr: Addr<External<ClusterEvent>>,
    events: Receiver<(ActorId, ClusterEvent)>,
    updates_addr: Addr<External<UpdateSummary>>,
    updates_rx: Receiver<(ActorId, UpdateSummary)>,
}

/// What a head's run needs whatever its task.
struct HeadRun<'a> {
    cfg: &'a EmbeddedConfig,
    opts: &'a ClusterOptions,
    plane: &'a Arc<Plane>,
    live: &'a LiveNode,
    secret: &'a [u8; 32],
    journal: Option<&'a mut RunJournal>,
    /// What earlier heads of the run did.
    resumed: Option<&'a Resumed>,
    /// The head's state files, in a resumable run.
    state: Option<&'a durable::HeadState>,
    /// Whether the lost head's waiting agents can reach this one.
    adopt: bool,
    placement_out: &'a mut Option<Arc<dyn Placement>>,
    progress: &'a mut dyn FnMut(u64, u64),
}

impl HeadRun<'_> {
    /// Starts the node agents and runs the plane with `factory`'s task;
    /// `gateway` is the tap endpoint and the gateway side of a run with
    /// external harnesses (attached once the harness actor runs).
    async fn with_task<T: TaskBackends>(
        self,
        mut factory: EmbeddedBackends<T>,
        endpoints: Endpoints,
        gateway: Option<(Addr<External<TapMsg>>, &mut Option<GatewaySide>)>,
        stats: &(dyn Fn() -> TaskStats + Send + Sync),
    ) -> Result<ClusterReport, ClusterError> {
        let HeadRun {
            cfg,
            opts,
            plane,
            live,
            secret,
            journal,
            resumed,
            state,
            adopt,
            placement_out,
            progress,
        } = self;
        let config_text = cfg.to_toml()?;
        let head_addr = live
            .local_addr()
            .ok_or(ClusterError::Unreachable(opts.listen))?;
        let Endpoints {
            events_addr,
            events,
            updates_addr,
            mut updates_rx,
        } = endpoints;
        let specs = node_specs(&cfg.sched, opts.processes);
        let incarnation = resumed.map_or(0, |r| r.resumes + 1);
        // Agents wait for a resumed head where it can adopt them: with
        // the state to find them by, and processes it can watch.
        let adoptable =
            state.is_some() && matches!(opts.launch, Launch::Local | Launch::Slurm { .. });
        let placement: Arc<dyn Placement> = placement_for(
            &opts.launch,
            HeadInfo {
                addr: head_addr,
                secret_hex: to_hex(secret),
                exe: opts.exe.clone(),
                head_wait: if adoptable {
                    opts.agent_wait
                } else {
                    Duration::ZERO
                },
                incarnation,
            },
            &specs,
        )
        .into();
        *placement_out = Some(placement.clone());
        let earlier = match state {
            Some(s) if adoptable && adopt => s.agents()?,
            _ => BTreeMap::new(),
        };
        let launcher = live.spawn(
            Launcher::new(placement.clone(), specs.clone(), events_addr).adopting(
                incarnation,
                earlier,
                opts.adopt_wait,
            ),
        );
        if launcher.id() != launcher_id() {
            return Err(ClusterError::LauncherId {
                got: launcher.id(),
                want: launcher_id(),
            });
        }
        tracing::info!(%head_addr, placement = placement.name(), nodes = specs.len(), "head listening");
        let mut head = Head {
            live: live.clone(),
            events,
            from: events_addr.id(),
            launcher,
            specs: specs.clone(),
            pids: BTreeMap::new(),
            agents: BTreeMap::new(),
            running: None,
            steps: 0,
            lost: Vec::new(),
            rejoins: rejoin::Rejoins::new(
                &specs,
                if placement.restarts() {
                    opts.restarts
                } else {
                    0
                },
            ),
            moved: BTreeMap::new(),
            core_recovers: cfg.checkpoint.path().is_some(),
            redone: resumed.map_or(0, |r| r.lost_updates),
            state: state.cloned(),
            agents_adopted: 0,
            incarnation,
            last_publication: None,
        };
        let (tap, mut side) = match gateway {
            Some((tap, side)) => (Some(tap), Some(side)),
            None => (None, None),
        };
        let result = drive(
            &mut head,
            cfg,
            opts,
            &config_text,
            plane,
            &mut factory,
            Observers {
                updates_addr,
                updates_rx: &mut updates_rx,
                tap,
                on_harness: &mut |harness| {
                    if let Some(side) = side.as_deref_mut().and_then(Option::as_mut) {
                        side.attach(live.clone(), Addr::new(harness));
                    }
                },
            },
            Journaled {
                journal,
                earlier: resumed.map(|r| r.updates.clone()).unwrap_or_default(),
                stats,
                rewards: RewardsSeen::default(),
                incarnation: resumed.map_or(0, |r| r.resumes + 1),
                base: resumed.and_then(|r| r.counters),
            },
            progress,
        )
        .await;
        let result = match result {
            Err(ClusterError::LinkLost { node, label }) => Err(head.why_lost(node, label).await),
            other => other,
        };
        let (updates, bytes_moved) = result?;
        let task = stats();
        let rewarded = match resumed {
            Some(r) => r.with_rewards(task.clone()),
            None => task.clone(),
        };
        let processes = specs
            .iter()
            .map(|s| ProcessReport {
                node: s.node.0,
                roles: s.roles.iter().map(Role::to_string).collect(),
                pid: head.pids.get(&s.node).copied().unwrap_or(0),
                agent_pid: head.agents.get(&s.node).copied().unwrap_or(0),
                bytes_moved: head.moved.get(&s.node).copied(),
            })
            .collect();
        Ok(ClusterReport {
            run: LiveReport::of_task(cfg.seed, updates, &task, &rewarded),
            placement: placement.name().into(),
            head_pid: std::process::id(),
            processes,
            bytes_moved,
            node_losses: head.lost.clone(),
            redone_updates: head.redone,
            gateway: None,
            agents_adopted: head.agents_adopted,
            counters: head.last_publication.map(RunCounters::from),
        })
    }
}

/// The head's journal, the updates earlier heads of the run made, and
/// the task's reward tallies it journals with each update.
struct Journaled<'a> {
    journal: Option<&'a mut RunJournal>,
    earlier: Vec<UpdateSummary>,
    /// The task's tallies now.
    stats: &'a (dyn Fn() -> TaskStats + Send + Sync),
    rewards: RewardsSeen,
    /// 0 for the run's first head, n for its n-th resume.
    incarnation: u64,
    /// The publication resumed from, as journaled (whole-run counters).
    base: Option<Publication>,
}

impl Journaled<'_> {
    /// Journals `p` with the run's counters; returns them.
    fn publication(&mut self, p: Publication) -> Result<Publication, JournalError> {
        let p = run_journal::continued(self.base.as_ref(), p);
        if let Some(j) = self.journal.as_deref_mut() {
            j.append(&Line::Published(p))?;
        }
        Ok(p)
    }

    fn seal(&mut self, sealed: SealedBatch) -> Result<(), JournalError> {
        let Some(j) = self.journal.as_deref_mut() else {
            return Ok(());
        };
        j.append(&Line::Sealed {
            incarnation: self.incarnation,
            step: sealed.step,
            groups: sealed.groups.iter().map(|g| g.0).collect(),
        })
    }
}

/// Where the core's updates arrive, where the engines' tokens go (a run
/// with the gateway), and who hears the harness actor's address.
struct Observers<'a> {
    updates_addr: Addr<External<UpdateSummary>>,
    updates_rx: &'a mut Receiver<(ActorId, UpdateSummary)>,
    tap: Option<Addr<External<TapMsg>>>,
    on_harness: &'a mut dyn FnMut(ActorId),
}

#[allow(clippy::too_many_arguments)]
async fn drive<T: TaskBackends>(
    head: &mut Head,
    cfg: &EmbeddedConfig,
    opts: &ClusterOptions,
    config_text: &str,
    plane: &Arc<Plane>,
    factory: &mut EmbeddedBackends<T>,
    observers: Observers<'_>,
    mut journaled: Journaled<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<UpdateSummary>, BytesMoved), ClusterError> {
    let Observers {
        updates_addr,
        updates_rx,
        tap,
        on_harness,
    } = observers;
    // Join.
    let deadline = Instant::now() + opts.join_timeout;
    let mut joined = BTreeMap::new();
    while joined.len() < head.specs.len() {
        if let NodeEvent::Joined {
            node,
            pid,
            transfer,
            commands,
            ..
        } = head.next(deadline, "join").await?
        {
            tracing::info!(node = node.0, pid, %transfer, "node agent joined");
            head.agents.insert(node, pid);
            joined.insert(node, (transfer, commands));
        }
    }
    let host_of = |role: Role| {
        head.specs
            .iter()
            .find(|s| s.roles.contains(&role))
            .map_or(HEAD, |s| s.node)
    };
    let directory = Directory {
        endpoints: std::iter::once((HEAD, plane.local_addr().unwrap_or(opts.listen)))
            .chain(head.specs.iter().map(|s| (s.node, joined[&s.node].0)))
            .collect(),
        core: host_of(Role::Cell(0)),
        cells: (0..cfg.sched.cells)
            .map(|c| host_of(Role::Cell(c)))
            .collect(),
    };
    {
        let (p, d) = (plane.clone(), directory.clone());
        tokio::task::spawn_blocking(move || p.connect(&d))
            .await
            .map_err(|e| PlaneError::Join(e.to_string()))??;
    }

    // Assign.
    for spec in head.specs.clone() {
        let cmd = NodeCmd::Assign {
            config: config_text.to_string(),
            roles: spec.roles.clone(),
            directory: directory.clone(),
            observer: Recipient::of(updates_addr),
            tap,
            incarnation: head.incarnation,
        };
        head.tell(joined[&spec.node].1, cmd).await?;
    }
    let mut ready: BTreeMap<NodeId, NodePorts> = BTreeMap::new();
    while ready.len() < head.specs.len() {
        if let NodeEvent::Ready { node, ports } =
            head.next(deadline, "build their backends").await?
        {
            ready.insert(node, ports);
        }
    }

    // Run: the head's own backends and the scheduler over every port.
    let cells: BTreeMap<u32, _> = ready
        .values()
        .flat_map(|p| p.cells.iter().map(|c| (c.cell, *c)))
        .collect();
    let pool_engine: Option<Recipient<EngineReq>> = ready.values().find_map(|p| p.pool);
    let live = head.live.clone();
    let transfer = live.spawn(factory.transfer()?);
    let harness = live.spawn(factory.harness()?);
    on_harness(harness.id());
    let evaluator = live.spawn(factory.evaluator()?);
    let ports = Backends {
        engines: cells.values().map(|c| c.engine).collect(),
        pool_engine,
        trainers: cells.values().map(|c| c.trainer).collect(),
        memories: cells.values().map(|c| c.memory).collect(),
        transfer: Recipient::of(transfer),
        harness: Recipient::of(harness),
        evaluator: Recipient::of(evaluator),
        kv_bytes_per_token: factory.kv_bytes_per_token(),
        blobs: factory.blobs(),
    };
    let mut sched = cfg.sched_config();
    // The scheduler takes a lost node out of the ledger; a restarted one
    // is announced by the head, never found by resending (the embedded
    // backends need not tolerate duplicate requests).
    sched.watch_nodes = true;
    sched.rejoin_notices = true;
    // The prefix's ring fails without a lost member: collect again.
    sched.reduce_needs_members = true;
    // The groups each batch is sealed from, journaled: a head resumed
    // from a checkpoint knows which groups it holds trained.
    let (sealed_addr, mut sealed_rx) = live.probe::<SealedBatch>(1024);
    // And each publication: the counters and the core's role at each
    // version, for a head resumed from it.
    let (publications_addr, mut publications_rx) = live.probe::<Publication>(1024);
    let sched = live.spawn(
        Scheduler::new(sched, ports)?
            .with_sealed_observer(Recipient::of(sealed_addr))
            .with_publication_observer(Recipient::of(publications_addr)),
    );
    head.running = Some(Instant::now());
    let mut run = rejoin::Running {
        config: config_text.to_string(),
        directory,
        joined,
        ports: ready,
        observer: Recipient::of(updates_addr),
        tap,
        plane: plane.clone(),
        sched,
    };
    tracing::info!(nodes = head.specs.len(), "cluster assembled; training");

    let target = cfg.sched.target_steps;
    let mut updates: Vec<UpdateSummary> = std::mem::take(&mut journaled.earlier);
    head.steps = updates.len() as u64;
    progress(updates.len() as u64, target);
    while (updates.len() as u64) < target {
        tokio::select! {
            Some((_, sealed)) = sealed_rx.recv() => {
                journaled.seal(sealed)?;
            }
            Some((_, p)) = publications_rx.recv() => {
                head.last_publication = Some(journaled.publication(p)?);
            }
            u = tokio::time::timeout(opts.stall, updates_rx.recv()) => match u {
                Ok(Some((_, u))) => {
                    // A step's batch is sealed long before its update
                    // arrives: its groups are journaled first.
                    while let Ok((_, sealed)) = sealed_rx.try_recv() {
                        journaled.seal(sealed)?;
                    }
                    // Journaled before it is logged: a log line means the
                    // update is on disk (the kill tests count on it).
                    if let Some(j) = journaled.journal.as_deref_mut() {
                        j.append(&Line::Update(u))?;
                        journaled.rewards.journal(j, (journaled.stats)())?;
                    }
                    tracing::info!(step = u.step, version = u.version, loss = u.loss, "update published");
                    // A core restored from its checkpoint makes the
                    // versions after it again: the history keeps the new.
                    let before = updates.len();
                    updates.retain(|x| x.version < u.version);
                    head.redone += (before - updates.len()) as u64;
                    updates.push(u);
                    head.steps = updates.len() as u64;
                    progress(updates.len() as u64, target);
                }
                Ok(None) | Err(_) => {
                    return Err(ClusterError::Stalled {
                        secs: opts.stall.as_secs(),
                        steps: updates.len() as u64,
                        target,
                    });
                }
            },
            e = head.events.recv() => {
                if let Some((_, e)) = e
                    && let Some(event) = head.failure(e)?
                {
                    head.on_run_event(event, &mut run).await?;
                }
            }
        }
        head.flush_rejoins(&run).await?;
    }

    // The scheduler tells the last publication after the core's update
    // arrived: its counters end the report.
    let deadline = Instant::now() + LAST_PUBLICATION_WAIT;
    while head.last_publication.is_none_or(|p| p.version < target) {
        match tokio::time::timeout_at(deadline.into(), publications_rx.recv()).await {
            Ok(Some((_, p))) => {
                head.last_publication = Some(journaled.publication(p)?);
            }
            _ => break,
        }
    }

    // The last update is published; its checkpoint, where one is due,
    // follows: the run is over once the final model is durable.
    if let Some(j) = journaled.journal.as_deref_mut() {
        tokio::task::block_in_place(|| run_journal::finish(j, cfg, opts.stall))?;
    }

    // Collect what moved, then stop every node agent.
    let mut moved = plane.moved();
    let alive: Vec<_> = run
        .joined
        .iter()
        .filter(|(n, _)| !head.is_lost(**n))
        .map(|(_, (_, commands))| *commands)
        .collect();
    for commands in &alive {
        head.tell(*commands, NodeCmd::Report).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reported = 0;
    while reported < alive.len() {
        if let NodeEvent::Moved { node, bytes } = head.next(deadline, "report their bytes").await? {
            moved += bytes;
            head.moved.insert(node, bytes);
            reported += 1;
        }
    }
    head.live
        .send(head.from, head.launcher, LauncherMsg::Stopping)
        .await?;
    for commands in &alive {
        head.tell(*commands, NodeCmd::Stop).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut exited = 0;
    while exited < alive.len() && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, head.events.recv()).await {
            Ok(Some((_, ClusterEvent::Exited { node, .. }))) if !head.is_lost(node) => exited += 1,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    if exited < alive.len() {
        tracing::warn!(
            exited,
            nodes = alive.len(),
            "some node agents did not exit when stopped"
        );
    }
    Ok((updates, moved))
}
