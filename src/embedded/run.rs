//! Runs an embedded cluster to the end and reports what it learned and
//! what the elastic machinery did along the way.

use std::time::Instant;

use gyre_actors::sched::core::Core;
use gyre_actors::sched::ids::Version;
use gyre_actors::sched::maths::Staleness;
use gyre_runtime::sim::SimError;
use gyre_runtime::{Actor, Addr, MILLIS, Nanos};
use gyre_simulations::run::staleness;
use serde::Serialize;

use super::cluster::{BuildError, EmbeddedCluster, EmbeddedConfig, build, secs};
use super::engine::{EngineStats, EngineWorker};
use super::task::TaskStats;
use super::trainer::UpdateSummary;

/// An engine actor the report reads: the embedded engine worker or an
/// SGLang adapter.
pub trait EngineBackend: Actor {
    fn engine_stats(&self) -> EngineStats;
}

impl EngineBackend for EngineWorker {
    fn engine_stats(&self) -> EngineStats {
        self.stats()
    }
}

/// Virtual time run between progress checks.
const SLICE: Nanos = 100 * MILLIS;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Sim(#[from] Box<SimError>),
    #[error(
        "liveness: the cluster was still busy after {events} events ({steps} of {target} steps done)"
    )]
    Stuck {
        events: u64,
        steps: u64,
        target: u64,
    },
    #[error("protocol violations: {0:?}")]
    Violations(Vec<String>),
}

/// The reward of the executions that a policy version served.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct VersionReward {
    pub version: Version,
    pub scored: u64,
    pub mean_reward: f64,
}

/// What the elastic machinery did.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Elasticity {
    /// Cell role changes (to training and back).
    pub transitions: usize,
    pub reroutes: u64,
    /// Call attempts after the first (cancelled or refused by a switch).
    pub retries: u64,
    pub kv_pinned: u64,
    pub kv_adopted: u64,
    pub adopted_tokens: u64,
    /// Executions moved without their KV blocks (SGLang engines cannot
    /// export them): their destination recomputed the prefix.
    pub kv_recomputed: u64,
    /// Largest training prefix of one step.
    pub max_members: u32,
    pub rollout_bytes_released: u64,
    pub training_bytes_released: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    pub seed: u64,
    pub steps: u64,
    pub events: u64,
    pub trace_hash: u64,
    /// Virtual time until the last step's update (within [`SLICE`]).
    pub virtual_secs: f64,
    pub wall_secs: f64,
    pub updates: Vec<UpdateSummary>,
    pub reward_by_version: Vec<VersionReward>,
    /// Mean reward over the first and the last quarter of the versions
    /// that have scored executions.
    pub early_reward: Option<f64>,
    pub late_reward: Option<f64>,
    pub staleness: Staleness,
    pub elasticity: Elasticity,
    pub calls: u64,
    pub served: u64,
    pub generated_tokens: u64,
    pub trained_targets: u64,
    pub micro_steps_by_cell: Vec<u64>,
    pub failed_micro_steps: u64,
    pub backend_errors: u64,
    /// Durable checkpoints the core wrote (`[checkpoint] every`), and bytes.
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    pub task: TaskSummary,
    /// Payloads still held at the end (records of executions that never
    /// trained, cancelled calls' prompts): bounded, not growing per step.
    pub blobs_left: usize,
    /// With `--resume`: where the run resumed from (`updates` holds the
    /// whole history, the earlier runs' journaled updates first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<super::run_journal::ResumeReport>,
}

/// The task's counters, for the report.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TaskSummary {
    pub executions: u64,
    pub completed: u64,
    pub harness_timeouts: u64,
    pub aborted: u64,
    pub compactions: u64,
    pub sub_agent_calls: u64,
    pub scored: u64,
    pub eval_failures: u64,
    pub hit_rate: Option<f64>,
}

impl From<&TaskStats> for TaskSummary {
    fn from(s: &TaskStats) -> Self {
        Self {
            executions: s.begun,
            completed: s.completed,
            harness_timeouts: s.harness_timeouts,
            aborted: s.aborted,
            compactions: s.compactions,
            sub_agent_calls: s.sub_agent_calls,
            scored: s.scored,
            eval_failures: s.eval_failures,
            hit_rate: s.hit_rate(),
        }
    }
}

/// Mean reward by the version that served the executions, and over the
/// first and last quarter of those versions.
pub fn rewards(task: &TaskStats) -> (Vec<VersionReward>, Option<f64>, Option<f64>) {
    let by: Vec<VersionReward> = task
        .by_version
        .iter()
        .filter_map(|(v, t)| {
            Some(VersionReward {
                version: *v,
                scored: t.scored,
                mean_reward: t.mean()?,
            })
        })
        .collect();
    let quarter = by.len().div_ceil(4);
    let mean_of = |xs: &[VersionReward]| {
        let n: u64 = xs.iter().map(|x| x.scored).sum();
        (n > 0).then(|| {
            xs.iter()
                .map(|x| x.mean_reward * x.scored as f64)
                .sum::<f64>()
                / n as f64
        })
    };
    let early = mean_of(&by[..quarter]);
    let late = mean_of(&by[by.len() - quarter..]);
    (by, early, late)
}

/// A backend actor's state, if it is alive.
pub fn worker_of<W: Actor, E: Actor>(c: &EmbeddedCluster<E>, addr: Addr<W>) -> Option<&W> {
    c.sim.actor(addr)
}

fn core<E: Actor>(c: &EmbeddedCluster<E>) -> Option<&Core> {
    let peers = c.sim.actor(c.sched)?.peers()?;
    c.sim.actor(peers.core)
}

/// Builds `cfg` and runs it until every step is trained and the cluster is
/// quiet; `progress(done, target)` is called as steps complete.
pub fn run(
    cfg: &EmbeddedConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(EmbeddedCluster, TrainReport), RunError> {
    let started = Instant::now();
    let c = build(cfg)?;
    run_built(c, cfg, started, progress)
}

/// Runs a built cluster of `cfg` (whatever its engines) to the end.
pub fn run_built<E: EngineBackend>(
    mut c: EmbeddedCluster<E>,
    cfg: &EmbeddedConfig,
    started: Instant,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(EmbeddedCluster<E>, TrainReport), RunError> {
    let target = cfg.sched.target_steps;
    let mut shown = u64::MAX;
    let mut trained_at = None;
    loop {
        let horizon = c.sim.now().saturating_add(SLICE);
        let stats = c.sim.run_until(horizon).map_err(Box::new)?;
        let done = core(&c).map_or(0, |k| k.version());
        if done != shown {
            shown = done;
            progress(done, target);
        }
        if done >= target && trained_at.is_none() {
            trained_at = Some(c.sim.now());
        }
        if stats.limited {
            return Err(RunError::Stuck {
                events: c.sim.events(),
                steps: done,
                target,
            });
        }
        if c.sim.pending() == 0 {
            break;
        }
    }
    let trained_at = trained_at.unwrap_or_else(|| c.sim.now());
    let report = report(&c, cfg, trained_at, started.elapsed().as_secs_f64())?;
    Ok((c, report))
}

fn report<E: EngineBackend>(
    c: &EmbeddedCluster<E>,
    cfg: &EmbeddedConfig,
    trained_at: Nanos,
    wall_secs: f64,
) -> Result<TrainReport, RunError> {
    let sim = &c.sim;
    let sched = sim.actor(c.sched);
    let peers = sched.and_then(|s| s.peers());
    let core = core(c);
    let mut violations: Vec<String> = core.map(|k| k.log().violations.clone()).unwrap_or_default();
    violations.extend(sched.map(|s| s.log().errors.clone()).unwrap_or_default());
    if !violations.is_empty() {
        return Err(RunError::Violations(violations));
    }
    let records = core.map(|k| k.log().records.clone()).unwrap_or_default();
    let proxy = peers.and_then(|p| sim.actor(p.proxy));
    let cells: Vec<_> = peers
        .map(|p| p.cells.iter().filter_map(|a| sim.actor(*a)).collect())
        .unwrap_or_default();
    let b = &c.backends;
    let engines: Vec<_> = b
        .engines
        .iter()
        .chain(b.pool.iter())
        .filter_map(|e| worker_of(c, *e))
        .map(|w| w.engine_stats())
        .collect();
    let trainers: Vec<_> = b.trainers.iter().filter_map(|t| worker_of(c, *t)).collect();
    let memories: Vec<_> = b
        .memories
        .iter()
        .filter_map(|m| worker_of(c, *m))
        .map(|w| w.stats())
        .collect();
    let updates: Vec<UpdateSummary> = trainers
        .iter()
        .flat_map(|t| t.stats().updates.iter().copied())
        .collect();
    let task = c.workspaces.stats();
    let (reward_by_version, early_reward, late_reward) = rewards(&task);
    let steady_from = cfg.sched.phi.ceil() as u64 + u64::from(cfg.sched.mu);
    let transfer = worker_of(c, b.transfer).map(|t| t.stats());
    Ok(TrainReport {
        seed: cfg.seed,
        steps: core.map_or(0, |k| k.version()),
        events: sim.events(),
        trace_hash: sim.trace_hash(),
        virtual_secs: secs(trained_at),
        wall_secs,
        updates,
        reward_by_version,
        early_reward,
        late_reward,
        staleness: staleness(&records, steady_from).all,
        elasticity: Elasticity {
            transitions: sched.map_or(0, |s| s.log().transitions.len()),
            reroutes: proxy.map_or(0, |p| p.stats().reroutes),
            retries: proxy.map_or(0, |p| p.stats().retries),
            kv_pinned: engines.iter().map(|e| e.kv_pinned).sum(),
            kv_adopted: engines.iter().map(|e| e.kv_adopted).sum(),
            adopted_tokens: engines.iter().map(|e| e.adopted_tokens).sum(),
            kv_recomputed: engines.iter().map(|e| e.kv_recomputed).sum(),
            max_members: records.iter().map(|r| r.members).max().unwrap_or(0),
            rollout_bytes_released: memories.iter().map(|m| m.rollout_bytes_released).sum(),
            training_bytes_released: memories.iter().map(|m| m.training_bytes_released).sum(),
        },
        calls: proxy.map_or(0, |p| p.stats().calls),
        served: engines.iter().map(|e| e.served).sum(),
        generated_tokens: engines.iter().map(|e| e.output_tokens).sum(),
        trained_targets: trainers.iter().map(|t| t.stats().targets).sum(),
        micro_steps_by_cell: cells.iter().map(|c| c.stats().micro_steps).collect(),
        failed_micro_steps: trainers.iter().map(|t| t.stats().failed_micro_steps).sum(),
        backend_errors: trainers.iter().map(|t| t.stats().errors).sum::<u64>()
            + memories.iter().map(|m| m.refusals).sum::<u64>()
            + transfer.map_or(0, |t| t.missing),
        checkpoints: trainers.iter().map(|t| t.stats().checkpoints).sum(),
        checkpoint_bytes: trainers.iter().map(|t| t.stats().checkpoint_bytes).sum(),
        task: TaskSummary::from(&task),
        blobs_left: gyre_runtime::BlobStore::live(c.blobs.as_ref()),
        resumed: None,
    })
}
