//! The embedded cluster on the live host: the same actors and backends as
//! under the simulator, on real threads and real time, with model work on
//! the blocking pool (cells generate and train concurrently).
//!
//! A live node offers no view into its actors, so progress is read from
//! what the backends share: the core publishes every new version on the
//! weight board, each engine's handle says which version it serves, and
//! the task's board holds the rewards. The run ends once the last version
//! is published and every rollout engine serves it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{Actor, Addr, NodeId};
use serde::Serialize;

use super::cluster::{Assembled, BuildError, EmbeddedConfig, assemble_journaled};
use super::journal::Journal;
use super::run::{VersionReward, rewards};
use super::run_journal::ResumeReport;
use super::shared::{Shared, lock};
use super::task::{TaskStats, Workspaces};
use super::trainer::UpdateSummary;
use gyre_actors::sched::plan::Host;

/// Spawns every actor of the cluster on one live node.
pub struct OnLiveNode<'a>(pub &'a LiveNode);

impl Host for OnLiveNode<'_> {
    fn spawn<A: Actor>(&mut self, _node: NodeId, actor: A) -> Addr<A> {
        self.0.spawn(actor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LiveRunError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("the live host failed")]
    Host(#[from] gyre_runtime::RuntimeError),
    #[error("could not start the tokio runtime")]
    Tokio(#[from] std::io::Error),
    #[error("no progress for {secs} s: {steps} of {target} steps published")]
    Stalled { secs: u64, steps: u64, target: u64 },
    /// A handler panicked (the embedded actors are not supervised, so the
    /// run cannot carry on): fails at once instead of after the stall.
    #[error("{0}")]
    Panicked(gyre_runtime::live::PanicReport),
}

/// What a live run did, as far as the shared boards tell.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReport {
    pub seed: u64,
    pub steps: u64,
    pub wall_secs: f64,
    pub updates: Vec<UpdateSummary>,
    pub reward_by_version: Vec<VersionReward>,
    pub early_reward: Option<f64>,
    pub late_reward: Option<f64>,
    pub executions: u64,
    pub scored: u64,
    /// With `--resume`: where the run resumed from (`updates` holds the
    /// whole history, the earlier runs' journaled updates first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<ResumeReport>,
}

/// Runs `cfg` on a live node until every step is trained and published,
/// or nothing moves for `stall`.
pub fn run_live(
    cfg: &EmbeddedConfig,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LiveReport, LiveRunError> {
    run_live_journaled(cfg, stall, progress, None)
}

/// [`run_live`], with every backend writing what it does to `journal`
/// (`gyre train --host live --record`).
pub fn run_live_journaled(
    cfg: &EmbeddedConfig,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
    journal: Option<Journal>,
) -> Result<LiveReport, LiveRunError> {
    run_live_watched(cfg, stall, progress, journal, |_, _| {})
}

/// [`run_live_journaled`], handing `started` the backends' shared boards
/// and the task's workspaces once they are built, before the run starts
/// (the run journal's [`super::run_journal::Follower`] reads the updates
/// and rewards from them).
pub fn run_live_watched(
    cfg: &EmbeddedConfig,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
    journal: Option<Journal>,
    started: impl FnOnce(&Shared, &Arc<Workspaces>),
) -> Result<LiveReport, LiveRunError> {
    on_live_node(
        cfg,
        |node| {
            let parts = assemble_journaled(&mut OnLiveNode(node), cfg, journal)?;
            started(&parts.shared, &parts.workspaces);
            let handles = parts.backends.engine_handles.clone();
            let target = cfg.sched.target_steps;
            let serving = move || {
                let all = handles.iter().all(|e| lock(e).version() >= target);
                async move { all }
            };
            Ok((parts, serving))
        },
        stall,
        progress,
    )
}

/// Starts a live node for `cfg`, spawns the cluster `assemble` builds on
/// it, and waits until every step is published and `serving` says every
/// rollout engine serves the last version (or nothing moves for `stall`).
pub(crate) fn on_live_node<E: Actor, H: Actor, V: Actor, S, F>(
    cfg: &EmbeddedConfig,
    assemble: impl FnOnce(&LiveNode) -> Result<(Assembled<E, H, V>, S), BuildError>,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LiveReport, LiveRunError>
where
    S: FnMut() -> F,
    F: std::future::Future<Output = bool>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let started = Instant::now();
        let mut live = LiveConfig::local(NodeId(0), cfg.seed);
        live.actor_threads = 1;
        let node = LiveNode::start(live).await?;
        let (parts, mut serving) = assemble(&node)?;
        let target = cfg.sched.target_steps;
        let (mut last, mut moved) = (u64::MAX, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let done = published(&parts);
            if done != last {
                last = done;
                moved = Instant::now();
                progress(done, target);
            }
            if done >= target && serving().await {
                break;
            }
            if let Some(report) = node.panics().into_iter().next() {
                node.shutdown().await;
                return Err(LiveRunError::Panicked(report));
            }
            if moved.elapsed() > stall {
                node.shutdown().await;
                return Err(LiveRunError::Stalled {
                    secs: stall.as_secs(),
                    steps: done,
                    target,
                });
            }
        }
        node.shutdown().await;
        Ok(LiveReport::of(&parts, cfg.seed, started))
    })
}

impl LiveReport {
    /// What the boards of `parts` say, `started` being the run's start.
    pub fn of<E: Actor, H: Actor, V: Actor>(
        parts: &Assembled<E, H, V>,
        seed: u64,
        started: Instant,
    ) -> Self {
        let task = parts.workspaces.stats();
        let mut report = Self::of_task(seed, lock(&parts.shared.updates).clone(), &task, &task);
        report.steps = published(parts);
        report.wall_secs = started.elapsed().as_secs_f64();
        report
    }

    /// The report of `updates` and the task's tallies `task`, its reward
    /// curve from `rewarded` (the tallies of earlier runs included, when
    /// resumed); wall time 0, to be set by the caller.
    pub fn of_task(
        seed: u64,
        updates: Vec<UpdateSummary>,
        task: &TaskStats,
        rewarded: &TaskStats,
    ) -> Self {
        let (reward_by_version, early_reward, late_reward) = rewards(rewarded);
        Self {
            seed,
            steps: updates.len() as u64,
            wall_secs: 0.0,
            updates,
            reward_by_version,
            early_reward,
            late_reward,
            executions: task.begun,
            scored: task.scored,
            resumed: None,
        }
    }
}

/// The newest version the core published.
pub fn published<E: Actor, H: Actor, V: Actor>(parts: &Assembled<E, H, V>) -> u64 {
    parts.shared.weights.latest().map_or(0, |(v, _)| v)
}
