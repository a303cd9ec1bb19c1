//! `gyre train` with the gateway in front: the embedded cluster on the live
//! host, its executions played by external harness processes that reach
//! the policy only over HTTP, every call recorded by the gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{BlobStore, NodeId, Recipient};
use serde::Serialize;

use super::board::Board;
use super::bridge::{GatewayHarness, ToFront};
use super::evaluator::{CommandEvaluator, WorkspaceScorer};
use super::front::{Front, forward};
use super::launcher::HarnessLauncher;
use super::plane::{Executions, PlaneEngine, PlaneRecords};
use super::streams::CallStreams;
use crate::embedded::cluster::{BuildError, EmbeddedConfig, TaskBackends, assemble_with};
use crate::embedded::engine::TokenTap;
use crate::embedded::live::OnLiveNode;
use crate::embedded::run::{VersionReward, rewards};
use crate::embedded::shared::{Shared, lock};
use crate::embedded::task::{TaskStats, Workspaces};
use crate::embedded::trainer::UpdateSummary;
use crate::gateway::embedded::renderer_for_vocab;
use crate::gateway::parse::ToolFormat;
use crate::gateway::service::{Gateway, GatewayConfig};
use crate::gateway::store::Store;

/// How to run the external harnesses.
pub struct GatewayOptions {
    /// The gateway's API listener (`:0` for a free port).
    pub listen: SocketAddr,
    pub launcher: Arc<dyn HarnessLauncher>,
    /// The evaluator command (`{workspace}`, `{query}`).
    pub evaluator: Vec<String>,
    /// Scores in place of the command when set (a job file's evaluator).
    pub scorer: Option<Arc<dyn WorkspaceScorer>>,
    /// Workspaces and logs; a temporary directory (removed at the end)
    /// when absent.
    pub dir: Option<PathBuf>,
    /// The gateway's durable store; in memory when absent.
    pub store: Option<PathBuf>,
    /// No published step for this long ends the run as stalled.
    pub stall: Duration,
    /// The policy's output cap per call (a job's `model.max_tokens`).
    pub max_tokens: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayRunError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("the live host failed")]
    Host(#[from] gyre_runtime::RuntimeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the gateway: {0}")]
    Gateway(String),
    #[error("no progress for {secs} s: {steps} of {target} steps published")]
    Stalled { secs: u64, steps: u64, target: u64 },
}

/// What a run with the gateway in front did.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayReport {
    pub seed: u64,
    pub steps: u64,
    pub wall_secs: f64,
    /// The API address the harnesses were given.
    pub gateway: String,
    pub updates: Vec<UpdateSummary>,
    pub reward_by_version: Vec<VersionReward>,
    pub early_reward: Option<f64>,
    pub late_reward: Option<f64>,
    pub task: HarnessSummary,
    /// HTTP model calls the gateway recorded (durably, then for training).
    pub gateway_calls: u64,
    /// Model calls the proxy answered, and those of harnesses that ended
    /// by themselves whose gateway call has no record (a client gone
    /// before the end of its answer).
    pub plane_calls_answered: u64,
    pub calls_without_record: u64,
    /// Tokens streamed from the engines to the gateway as sampled.
    pub streamed_tokens: u64,
    /// Call attempts that continued after an earlier attempt's tokens (a
    /// role change mid-answer), and calls whose tokens came from more than
    /// one engine.
    pub resumed_attempts: u64,
    pub engine_changes: u64,
    /// Engine failures the gateway itself retried.
    pub gateway_reroutes: u64,
    /// Role changes to training (rollout engines unloaded), KV prefixes
    /// exported by a cell switching and taken by the engine that adopted
    /// the execution, and steps whose gradient a satellite joined.
    pub role_changes: u64,
    pub kv_exported: u64,
    pub kv_adopted: u64,
    pub satellite_steps: u64,
    pub dir: String,
}

/// How the external harnesses ended and were scored.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HarnessSummary {
    pub executions: u64,
    pub completed: u64,
    pub harness_timeouts: u64,
    /// Exited non-zero, or could not start.
    pub failed: u64,
    pub aborted: u64,
    pub scored: u64,
    pub eval_failures: u64,
}

impl From<&TaskStats> for HarnessSummary {
    fn from(s: &TaskStats) -> Self {
        Self {
            executions: s.begun,
            completed: s.completed,
            harness_timeouts: s.harness_timeouts,
            failed: s.failed,
            aborted: s.aborted,
            scored: s.scored,
            eval_failures: s.eval_failures,
        }
    }
}

/// External harnesses behind the gateway, as the cluster's harness and
/// evaluator backends.
struct ExternalTask {
    front: Recipient<ToFront>,
    board: Arc<Board>,
    evaluator: Vec<String>,
    scorer: Option<Arc<dyn WorkspaceScorer>>,
    tap: Arc<CallStreams>,
}

impl TaskBackends for ExternalTask {
    type Harness = GatewayHarness;
    type Evaluator = CommandEvaluator;

    fn harness(&mut self, shared: &Shared) -> Result<GatewayHarness, BuildError> {
        Ok(GatewayHarness::new(self.front, shared.blobs.clone()))
    }

    fn evaluator(&mut self) -> Result<CommandEvaluator, BuildError> {
        match &self.scorer {
            Some(s) => Ok(CommandEvaluator::with_scorer(s.clone(), self.board.clone())),
            None => CommandEvaluator::new(self.evaluator.clone(), self.board.clone())
                .map_err(BuildError::Harness),
        }
    }

    fn token_tap(&self) -> Option<Arc<dyn TokenTap>> {
        Some(self.tap.clone())
    }
}

/// Runs `cfg` on a live node with the gateway in front until every step is
/// trained and published, or nothing moves for `opts.stall`.
pub fn run_with_gateway(
    cfg: &EmbeddedConfig,
    opts: GatewayOptions,
    progress: &mut dyn FnMut(u64, u64),
    started: &mut dyn FnMut(&str),
) -> Result<GatewayReport, GatewayRunError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(cfg, opts, progress, started))
}

async fn run_async(
    cfg: &EmbeddedConfig,
    opts: GatewayOptions,
    progress: &mut dyn FnMut(u64, u64),
    started: &mut dyn FnMut(&str),
) -> Result<GatewayReport, GatewayRunError> {
    let t0 = Instant::now();
    let (dir, temporary) = match &opts.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("gyre-train-{}-{}", std::process::id(), cfg.seed)),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let mut live = LiveConfig::local(NodeId(0), cfg.seed);
    live.actor_threads = 1;
    let node = LiveNode::start(live).await?;
    let (front_addr, front_rx) = node.probe::<ToFront>(1 << 16);
    let streams = Arc::new(CallStreams::default());
    let board = Arc::new(Board::default());
    let task = ExternalTask {
        front: Recipient::of(front_addr),
        board: board.clone(),
        evaluator: opts.evaluator.clone(),
        scorer: opts.scorer.clone(),
        tap: streams.clone(),
    };
    let parts = assemble_with(
        &mut OnLiveNode(&node),
        cfg,
        None,
        task,
        Arc::new(Workspaces::new()),
    )?;
    let blobs: Arc<dyn BlobStore> = parts.shared.blobs.clone();
    let executions = Arc::new(Executions::default());
    let (inbox, inbox_rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = PlaneEngine {
        inbox: inbox.clone(),
        streams: streams.clone(),
        executions: executions.clone(),
        blobs: blobs.clone(),
        weights: parts.shared.weights.clone(),
        context: cfg.model.context,
        max_tokens: opts.max_tokens,
    };
    let store = match &opts.store {
        Some(d) => Store::open(d),
        None => Store::temporary(),
    }
    .map_err(|e| GatewayRunError::Gateway(e.to_string()))?;
    let config = GatewayConfig {
        model: "gyre-policy".into(),
        tool_format: ToolFormat::Hermes,
        max_body_bytes: 4 * 1024 * 1024,
        max_concurrency: 1024,
        request_timeout: Duration::from_secs(600),
    };
    // The policy's own vocabulary: the byte game's bytes, or the shipped BPE.
    let renderer = renderer_for_vocab(Some(cfg.model.vocab))
        .map_err(|e| GatewayRunError::Gateway(e.to_string()))?;
    let gateway = Gateway::new(Arc::new(engine), renderer, store, config)
        .map_err(|e| GatewayRunError::Gateway(e.to_string()))?
        .with_record_sink(Arc::new(PlaneRecords {
            inbox: inbox.clone(),
            executions: executions.clone(),
            blobs,
            board: board.clone(),
        }));
    let gateway = Arc::new(gateway);
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let api_base = format!("http://{}", listener.local_addr()?);
    started(&api_base);
    let server = tokio::spawn({
        let router = crate::gateway::http::api_router(gateway.clone());
        async move { axum::serve(listener, router).await }
    });
    let forwarder = tokio::spawn(forward(
        node.clone(),
        front_addr.id(),
        parts.backends.harness,
        inbox_rx,
    ));
    let front = Front {
        gateway: gateway.clone(),
        launcher: opts.launcher.clone(),
        executions: executions.clone(),
        streams: streams.clone(),
        inbox,
        board: board.clone(),
        task: cfg.task.clone(),
        api_base: api_base.clone(),
        dir: dir.clone(),
        runs: Default::default(),
    };
    let front = tokio::spawn(front.run(front_rx));
    let target = cfg.sched.target_steps;
    let published = || parts.shared.weights.latest().map_or(0, |(v, _)| v);
    let (mut last, mut moved) = (u64::MAX, Instant::now());
    let outcome = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let done = published();
        if done != last {
            last = done;
            moved = Instant::now();
            progress(done, target);
        }
        let serving = parts
            .backends
            .engine_handles
            .iter()
            .all(|e| lock(e).version() >= target);
        if done >= target && serving {
            break Ok(());
        }
        if moved.elapsed() > opts.stall {
            break Err(GatewayRunError::Stalled {
                secs: opts.stall.as_secs(),
                steps: done,
                target,
            });
        }
    };
    // Stopping the node drops the probe: the front ends and kills the
    // harnesses still running.
    node.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), front).await;
    forwarder.abort();
    server.abort();
    outcome?;
    let stats = board.stats();
    let (reward_by_version, early_reward, late_reward) = rewards(&stats);
    let (answered, unrecorded) = executions.answered_unrecorded();
    let m = &gateway.metrics;
    let report = GatewayReport {
        seed: cfg.seed,
        steps: published(),
        wall_secs: t0.elapsed().as_secs_f64(),
        gateway: api_base,
        updates: lock(&parts.shared.updates).clone(),
        reward_by_version,
        early_reward,
        late_reward,
        task: HarnessSummary::from(&stats),
        gateway_calls: m.calls_committed.load(Ordering::Relaxed),
        plane_calls_answered: answered,
        calls_without_record: unrecorded,
        streamed_tokens: streams.stats.tokens.load(Ordering::Relaxed),
        resumed_attempts: streams.stats.resumed.load(Ordering::Relaxed),
        engine_changes: streams.stats.engine_changes.load(Ordering::Relaxed),
        gateway_reroutes: m.reroutes.load(Ordering::Relaxed),
        role_changes: parts.shared.unloads.load(Ordering::Relaxed),
        kv_exported: parts.shared.kv.migrations().0,
        kv_adopted: parts.shared.kv.migrations().1,
        satellite_steps: parts.shared.grads.shared_steps(),
        dir: dir.display().to_string(),
    };
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}
