//! `gyre train` with the gateway in front: the embedded cluster on the live
//! host, its executions played by external harness processes that reach
//! the policy only over HTTP, every call recorded by the gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gyre_runtime::NodeId;
use gyre_runtime::live::{LiveConfig, LiveNode};
use serde::Serialize;

use super::bridge::ToFront;
use super::evaluator::WorkspaceScorer;
use super::launcher::HarnessLauncher;
use super::side::{self, GatewayCounters, Incarnation};
use crate::embedded::cluster::{BuildError, EmbeddedConfig, assemble_with};
use crate::embedded::live::OnLiveNode;
use crate::embedded::run::{VersionReward, rewards};
use crate::embedded::shared::lock;
use crate::embedded::task::{TaskStats, Workspaces};
use crate::embedded::trainer::UpdateSummary;
use crate::harness::orphans;

/// How to run the external harnesses.
pub struct GatewayOptions {
    /// The gateway's API listener (`:0` for a free port).
    pub listen: SocketAddr,
    pub launcher: Arc<dyn HarnessLauncher>,
    /// The evaluator command (`{workspace}`, `{query}`).
    pub evaluator: Vec<String>,
    /// The command is killed after this long (the attempt fails).
    pub evaluator_timeout: Duration,
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
    pub updates: Vec<UpdateSummary>,
    pub reward_by_version: Vec<VersionReward>,
    pub early_reward: Option<f64>,
    pub late_reward: Option<f64>,
    #[serde(flatten)]
    pub seen: GatewayCounters,
    pub role_changes: u64,
    pub kv_exported: u64,
    pub kv_adopted: u64,
    pub satellite_steps: u64,
    pub dir: String,
}

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
    let (task, prepared) = side::prepare(&opts, node.probe::<ToFront>(1 << 16));
    let parts = assemble_with(
        &mut OnLiveNode(&node),
        cfg,
        None,
        task,
        Arc::new(Workspaces::new()),
    )?;
    let run_tag = orphans::tag_of(&dir);
    // Until the run has ended its harnesses itself, a SIGINT or SIGTERM
    // ends them (see `orphans::end_on_signal`).
    let _watch = orphans::watch(&run_tag, temporary.then_some(dir.as_path()));
    let mut gateway = prepared
        .open(
            cfg,
            &opts,
            Incarnation {
                dir: dir.clone(),
                run: run_tag,
                ..Default::default()
            },
            &parts.shared,
        )
        .await?;
    started(&gateway.api_base);
    gateway.attach(node.clone(), parts.backends.harness);
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
    let (seen, stats) = gateway.close().await;
    outcome?;
    let (reward_by_version, early_reward, late_reward) = rewards(&stats);
    let report = GatewayReport {
        seed: cfg.seed,
        steps: published(),
        wall_secs: t0.elapsed().as_secs_f64(),
        updates: lock(&parts.shared.updates).clone(),
        reward_by_version,
        early_reward,
        late_reward,
        seen,
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
