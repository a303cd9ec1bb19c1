//! The embedded cluster with its engines as SGLang servers: `gyre serve`
//! processes (or any SGLang servers) behind the SGLang adapter.
//!
//! Only the engines change: each cell's engine and the pool's are
//! [`SglangEngine`] actors over one server each (cells in order, then the
//! pool), the trainers, device memory (training role only: a server's
//! rollout memory is released and resumed by its adapter), transfer,
//! task and evaluator are the embedded ones. Every publication reaches the
//! servers by version; KV blocks cannot leave a server, so moved
//! executions recompute their prefix (`Elasticity::kv_recomputed`).
//!
//! [`ServeFleet`] starts the servers as child processes of the `gyre`
//! binary with the cluster's model shape; the adapter pushes the initial
//! weights at start-up, so the servers sample from the trainer's policy.
//! [`ServeOptions`] says how versions reach the servers (Gyre's buffer,
//! or checkpoint directories on a shared path) and how often the proxy
//! retries a rejected call on the same server. It runs on the simulator
//! ([`run_serve`]: each HTTP call made inline, priced on the virtual
//! clock) or the live host ([`run_live_serve`]: real time, calls on the
//! blocking pool, done when every server reports the last version).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::plan::{BackendFactory, CellBackends, Host};
use gyre_actors::sched::proxy::RejectRetry;
use gyre_runtime::BlobStore;

use super::cluster::{
    Assembled, BuildError, BuiltInTask, EmbeddedBackends, EmbeddedCluster, EmbeddedConfig,
    assemble_from, build_with,
};
use super::engine::EngineStats;
use super::live::{LiveReport, LiveRunError, OnLiveNode, on_live_node};
use super::memory::MemoryWorker;
use super::run::{EngineBackend, RunError, TrainReport, run_built};
use super::task::{EvaluatorWorker, HarnessWorker, Workspaces};
use super::trainer::TrainerWorker;
use super::transfer::TransferWorker;
use crate::backends::sglang::adapter::{AdapterConfig, SglangEngine};
use crate::backends::sglang::client::Health;
use crate::backends::sglang::{ClientConfig, SglangClient};
use crate::cli::serve::model::ServeConfig;

impl EngineBackend for SglangEngine {
    fn engine_stats(&self) -> EngineStats {
        self.stats()
    }
}

/// How many servers a cluster of `cfg` needs: one per cell, one for the
/// pool.
pub fn servers_needed(cfg: &EmbeddedConfig) -> usize {
    cfg.sched.cells as usize + usize::from(cfg.sched.pool_capacity > 0)
}

/// How the cluster uses its servers.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Patience and publication mode of every adapter.
    pub adapter: AdapterConfig,
    /// Same-server retries of a rejected call (none by default, which
    /// keeps a simulated run's schedule).
    pub reject_retry: RejectRetry,
}

/// The embedded backends with SGLang engines.
pub struct ServeBackends {
    inner: EmbeddedBackends,
    urls: Vec<String>,
    opts: ServeOptions,
    client: ClientConfig,
}

impl ServeBackends {
    fn engine(&mut self, ix: EngineIx, n: usize, seed: u64) -> Result<SglangEngine, BuildError> {
        let url = self
            .urls
            .get(n)
            .ok_or_else(|| BuildError::Engines(format!("no server URL for engine {n} ({ix:?})")))?;
        let client = SglangClient::new(url, self.client.clone())
            .map_err(|e| BuildError::Engines(e.to_string()))?;
        Ok(SglangEngine::new(
            ix,
            client,
            self.opts.adapter.clone(),
            self.inner.shared_backends(),
            seed,
        ))
    }
}

impl BackendFactory for ServeBackends {
    type Engine = SglangEngine;
    type Trainer = TrainerWorker;
    type Memory = MemoryWorker;
    type Transfer = TransferWorker;
    type Harness = HarnessWorker;
    type Evaluator = EvaluatorWorker;
    type Error = BuildError;

    fn cell(&mut self, c: u32, _slots: u32) -> Result<CellBackends<Self>, BuildError> {
        let seed = self.inner.engine_seed(u64::from(c));
        let engine = self.engine(EngineIx::Cell(c), c as usize, seed)?;
        let (trainer, memory) = self.inner.training_side(c, None)?;
        Ok(CellBackends {
            engine,
            trainer,
            memory,
        })
    }

    fn pool(&mut self, _slots: u32) -> Result<SglangEngine, BuildError> {
        let seed = self.inner.engine_seed(0xffff);
        let n = self.urls.len() - 1;
        self.engine(EngineIx::Pool, n, seed)
    }

    fn transfer(&mut self) -> Result<TransferWorker, BuildError> {
        self.inner.transfer()
    }

    fn harness(&mut self) -> Result<HarnessWorker, BuildError> {
        self.inner.harness()
    }

    fn evaluator(&mut self) -> Result<EvaluatorWorker, BuildError> {
        self.inner.evaluator()
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.inner.kv_bytes_per_token()
    }

    fn blobs(&self) -> Option<Arc<dyn BlobStore>> {
        self.inner.blobs()
    }

    fn reject_retry(&self) -> RejectRetry {
        self.opts.reject_retry
    }
}

/// Spawns the cluster of `cfg` with its engines at `urls` (one per cell
/// in order, then the pool's) on `host`.
pub fn assemble_serve<H: Host>(
    host: &mut H,
    cfg: &EmbeddedConfig,
    urls: &[String],
    opts: &ServeOptions,
) -> Result<Assembled<SglangEngine>, BuildError> {
    let need = servers_needed(cfg);
    if urls.len() != need {
        return Err(BuildError::Engines(format!(
            "{} server URLs for {} cells{} (one each)",
            urls.len(),
            cfg.sched.cells,
            if cfg.sched.pool_capacity > 0 {
                " and the pool"
            } else {
                ""
            }
        )));
    }
    let workspaces = Arc::new(Workspaces::new());
    let task = BuiltInTask::new(cfg, workspaces.clone());
    let mut factory = ServeBackends {
        inner: EmbeddedBackends::in_process(cfg, task, None)?,
        urls: urls.to_vec(),
        opts: opts.clone(),
        client: ClientConfig::default(),
    };
    assemble_from(host, cfg, &mut factory, workspaces, |f| &mut f.inner)
}

/// Runs `cfg` in the simulator with its engines at `urls` until every
/// step is trained. Model calls are real HTTP calls, made inline; the
/// virtual clock prices each as `costs.sglang_call_us`.
pub fn run_serve(
    cfg: &EmbeddedConfig,
    urls: &[String],
    opts: &ServeOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(EmbeddedCluster<SglangEngine>, TrainReport), RunError> {
    let started = Instant::now();
    let c = build_with(cfg, |sim, cfg| assemble_serve(sim, cfg, urls, opts))?;
    run_built(c, cfg, started, progress)
}

/// Runs `cfg` on the live host with its engines at `urls` until every
/// step is published and every server with its memory resident reports
/// the last version as its `weight_version` (a server released for a
/// training role takes it when it is loaded again), or nothing moves for
/// `stall`.
pub fn run_live_serve(
    cfg: &EmbeddedConfig,
    urls: &[String],
    opts: &ServeOptions,
    stall: std::time::Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LiveReport, LiveRunError> {
    let clients = urls
        .iter()
        .map(|u| SglangClient::new(u, ClientConfig::default()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BuildError::Engines(e.to_string()))?;
    let target = cfg.sched.target_steps.to_string();
    on_live_node(
        cfg,
        |node| {
            let parts = assemble_serve(&mut OnLiveNode(node), cfg, urls, opts)?;
            let serving = move || {
                let (clients, target) = (clients.clone(), target.clone());
                async move {
                    let mut on_target = 0;
                    for c in &clients {
                        if !matches!(c.health().await, Ok(Health::Serving)) {
                            continue;
                        }
                        if c.get_weight_version().await.ok().as_deref() != Some(&target) {
                            return false;
                        }
                        on_target += 1;
                    }
                    on_target > 0
                }
            };
            Ok((parts, serving))
        },
        stall,
        progress,
    )
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("writing the servers' model file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the servers' model file: {0}")]
    Toml(#[from] toml::ser::Error),
    #[error("starting {exe} serve: {source}")]
    Spawn { exe: String, source: std::io::Error },
    #[error("gyre serve did not name its address (first line {line:?})")]
    NoAddress { line: String },
}

/// `gyre serve` child processes serving a cluster's model shape, killed
/// when dropped.
pub struct ServeFleet {
    children: Vec<Child>,
    pub urls: Vec<String>,
    dir: PathBuf,
}

impl ServeFleet {
    /// Starts [`servers_needed`] servers of `cfg.model` from the `gyre`
    /// binary `exe`, each on a free port.
    pub fn spawn(exe: &Path, cfg: &EmbeddedConfig) -> Result<Self, FleetError> {
        let dir = std::env::temp_dir().join(format!("gyre-train-serve-{}", std::process::id()));
        let write = |e| FleetError::Write {
            path: dir.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(&dir).map_err(write)?;
        let serve = ServeConfig {
            gyre_model: Some(cfg.model.clone()),
            max_running: Some(cfg.sched.cell_capacity.max(cfg.sched.pool_capacity).max(1) as usize),
            served_model_name: Some("gyre-train".into()),
            ..ServeConfig::default()
        };
        let model = dir.join("model.toml");
        std::fs::write(&model, toml::to_string(&serve)?).map_err(write)?;
        let mut fleet = ServeFleet {
            children: Vec::new(),
            urls: Vec::new(),
            dir,
        };
        for _ in 0..servers_needed(cfg) {
            let mut child = Command::new(exe)
                .args(["serve", "--listen", "127.0.0.1:0", "--model"])
                .arg(&model)
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| FleetError::Spawn {
                    exe: exe.display().to_string(),
                    source: e,
                })?;
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            fleet.children.push(child);
            let addr = line
                .trim()
                .strip_prefix("gyre serve listening on ")
                .ok_or_else(|| FleetError::NoAddress { line: line.clone() })?;
            fleet.urls.push(format!("http://{addr}"));
        }
        Ok(fleet)
    }
}

impl Drop for ServeFleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
