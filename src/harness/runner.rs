//! The harness runner: one execution of a user's harness program, from a
//! fresh workspace to a preserved one, with nothing else left behind.
//!
//! Per execution it opens the execution at the gateway (a key of its own),
//! makes the workspace copy, HOME, TMPDIR and prompt file, starts the
//! command in its sandbox with the gateway's URLs and the key in its
//! environment, and waits for it under the harness timeout and the
//! execution's remaining overall budget. Then it sweeps the process group,
//! removes HOME and TMPDIR, closes the execution at the gateway (the key
//! stops working) and hands back the workspace for the evaluator.
//!
//! Outcomes (SPEC 3.3): exit 0 is completed; another exit is a failed run
//! that is still scored; the harness timeout kills the group, keeps the
//! workspace and is scored; exit 125, 126 or 127, or a program that cannot
//! start, is a complete failure (nothing to score: a dummy placeholder);
//! the overall timeout and an abort end it unscored.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use gyre_actors::sched::proto::harness::HarnessOutcome;

use super::access::{Credentials, GatewayAccess};
use super::forward::{GatewayBridge, gateway_addr};
use super::job::NetworkMode;
use super::job::{JobFile, Limits, SandboxKind};
use super::placeholders::substitute;
use super::process::{self, ProcessEnd, ProcessSpec};
use super::sandbox::{Extra, Forward, SandboxPlan};
use super::tasks::Task;
use super::workspace::ExecDirs;
use crate::embedded::external::launcher::status_wrapped;

/// Exit codes that mean the harness never ran: 125 (a container runtime's
/// own failure, e.g. an image that cannot be pulled), 126 (not executable),
/// 127 (not found).
pub const COMPLETE_FAILURE_CODES: [i32; 3] = [125, 126, 127];

/// Everything a runner needs from the job file, paths resolved.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub command: Vec<String>,
    pub timeout: Duration,
    pub grace: Duration,
    pub env: Vec<(String, String)>,
    pub inherit_env: bool,
    pub sandbox: SandboxPlan,
    pub limits: Limits,
    pub log_dir: PathBuf,
    pub work_root: PathBuf,
    pub job_dir: PathBuf,
    pub concurrency: usize,
    /// The `gyre` binary started as a bwrap sandbox's first process with
    /// `sandbox.network = "gateway"` (default: this program).
    pub forwarder: PathBuf,
}

impl RunnerConfig {
    /// The runner's settings from a job file at `job_path` (relative paths
    /// from its folder); `work_root` defaults to a fresh folder in the
    /// system temp dir named after this process.
    pub fn from_job(job: &JobFile, job_path: &std::path::Path) -> Self {
        let job_dir = JobFile::absolute(&JobFile::base_dir(job_path));
        let resolve = |p: &std::path::Path| JobFile::absolute(&JobFile::resolve(job_path, p));
        let work_root = match &job.run.work_dir {
            Some(p) => resolve(p),
            None => std::env::temp_dir().join(format!("gyre-work-{}", std::process::id())),
        };
        let log_dir = resolve(&job.run.log_dir);
        let tasks_dir = resolve(&job.tasks.dir);
        RunnerConfig {
            command: job.harness.command.clone(),
            timeout: job.harness.timeout.0,
            grace: job.harness.kill_grace.0,
            env: job
                .harness
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            inherit_env: job.harness.inherit_env,
            sandbox: SandboxPlan {
                kind: job.run.sandbox,
                network: job.sandbox.network,
                prefix: job.sandbox.prefix.clone(),
                bwrap_args: job.sandbox.bwrap_args.clone(),
                masked: vec![tasks_dir, work_root.clone(), log_dir.clone()],
                visible: vec![job_dir.clone()],
            },
            limits: job.sandbox.limits.clone(),
            log_dir,
            work_root,
            job_dir,
            concurrency: job.run.concurrency,
            forwarder: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gyre")),
        }
    }
}

/// One execution to run.
#[derive(Debug, Clone)]
pub struct ExecutionRequest {
    /// Names its folders and logs (e.g. `e000042`); unique in the run.
    pub label: String,
    pub task: Arc<Task>,
    /// Recorded at the gateway with the execution.
    pub group: String,
    /// What is left of the execution's overall budget.
    pub overall: Duration,
    /// Credentials made by the caller; `None` opens the execution at the
    /// runner's gateway (and closes it at the end).
    pub credentials: Option<Credentials>,
    /// Where the workspace goes, when the caller has a place for it
    /// (default `<work_root>/<label>/workspace`).
    pub workspace: Option<PathBuf>,
    /// Variables for this execution only (after the job's, before Gyre's
    /// own), e.g. `GYRE_QUERY`.
    pub env: Vec<(String, String)>,
    /// Where the harness's exit code is written when it ends (the command
    /// then runs under the status shell,
    /// [`crate::embedded::external::launcher::status_wrapped`]), so a
    /// head that did not start it can learn how it ended.
    pub status: Option<PathBuf>,
}

/// Removes HOME and TMPDIR if the run's future is dropped (an abort by
/// drop); the process group has its own guard.
struct ScratchGuard(Option<ExecDirs>);

impl Drop for ScratchGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = d.remove_scratch();
        }
    }
}

/// How a run ended, in the runner's terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    /// Exited non-zero (not a complete-failure code): still scored.
    Failed {
        code: Option<i32>,
        signal: Option<i32>,
    },
    HarnessTimeout,
    OverallTimeout,
    /// Cancelled by the caller (surplus, or the scheduler's overall timer).
    Aborted,
    /// Nothing ran, nothing to score.
    CompleteFailure {
        why: String,
    },
}

impl RunOutcome {
    /// The harness protocol's outcome; `None` for an ending the execution
    /// actor decided itself (abort, overall timeout).
    pub fn harness_outcome(&self) -> Option<HarnessOutcome> {
        match self {
            RunOutcome::Completed => Some(HarnessOutcome::Completed),
            RunOutcome::Failed { .. } => Some(HarnessOutcome::Failed { complete: false }),
            RunOutcome::HarnessTimeout => Some(HarnessOutcome::HarnessTimeout),
            RunOutcome::CompleteFailure { .. } => Some(HarnessOutcome::Failed { complete: true }),
            RunOutcome::OverallTimeout | RunOutcome::Aborted => None,
        }
    }

    /// Whether the workspace is there to be scored.
    pub fn scorable(&self) -> bool {
        matches!(
            self,
            RunOutcome::Completed | RunOutcome::Failed { .. } | RunOutcome::HarnessTimeout
        )
    }
}

/// Where the time of starting an execution went.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StartTimings {
    /// Waiting for a concurrency slot.
    pub queued: Duration,
    /// Opening the execution at the gateway.
    pub gateway: Duration,
    /// Workspace copy, HOME, TMPDIR, prompt file.
    pub workspace: Duration,
    /// fork + setsid + rlimits + exec (the sandbox's own start-up is part
    /// of the process's run).
    pub spawn: Duration,
    /// The process, from spawn to the group's end.
    pub process: Duration,
    /// Sweep, scratch removal, closing at the gateway.
    pub teardown: Duration,
}

/// A finished run.
#[derive(Debug, Clone, Serialize)]
pub struct HarnessRun {
    pub label: String,
    pub task: String,
    pub execution: Option<String>,
    pub outcome: RunOutcome,
    /// The preserved workspace (`None` after a complete failure).
    #[serde(skip)]
    pub dirs: Option<ExecDirs>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub timings: StartTimings,
    /// Background processes the harness left behind, killed at its end.
    pub stragglers_killed: bool,
}

/// Runs harness executions; cheap to clone, one per node.
#[derive(Clone)]
pub struct HarnessRunner {
    cfg: Arc<RunnerConfig>,
    gateway: Option<Arc<dyn GatewayAccess>>,
    slots: Arc<Semaphore>,
}

/// Variables a harness never inherits from the runner: credentials of
/// other model providers and of Gyre itself.
fn withheld(key: &str) -> bool {
    key.starts_with("OPENAI_") || key.starts_with("ANTHROPIC_") || key.starts_with("GYRE_")
}

impl HarnessRunner {
    pub fn new(cfg: RunnerConfig, gateway: Option<Arc<dyn GatewayAccess>>) -> Self {
        let slots = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        Self {
            cfg: Arc::new(cfg),
            gateway,
            slots,
        }
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    fn environment(
        &self,
        dirs: &ExecDirs,
        creds: &Credentials,
        extra: &[(String, String)],
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = if self.cfg.inherit_env {
            std::env::vars().filter(|(k, _)| !withheld(k)).collect()
        } else {
            vec![(
                "PATH".into(),
                std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
            )]
        };
        env.extend(self.cfg.env.iter().cloned());
        for (k, v) in extra {
            env.retain(|(e, _)| e != k);
            env.push((k.clone(), v.clone()));
        }
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        let ours = [
            ("HOME", path(&dirs.home)),
            ("TMPDIR", path(&dirs.tmp)),
            ("TMP", path(&dirs.tmp)),
            ("TEMP", path(&dirs.tmp)),
            ("PWD", path(&dirs.workspace)),
            ("OPENAI_BASE_URL", format!("{}/v1", creds.api_base)),
            ("OPENAI_API_KEY", creds.key.clone()),
            ("ANTHROPIC_BASE_URL", creds.api_base.clone()),
            ("ANTHROPIC_API_KEY", creds.key.clone()),
            ("GYRE_EXECUTION", creds.execution.clone()),
            ("GYRE_WORKSPACE", path(&dirs.workspace)),
            ("GYRE_PROMPT_FILE", path(&dirs.prompt_file)),
        ];
        env.retain(|(k, _)| !ours.iter().any(|(o, _)| o == k));
        env.extend(ours.into_iter().map(|(k, v)| (k.to_string(), v)));
        env
    }

    /// Runs one execution to its end; `cancel` aborts it (group killed,
    /// outcome `Aborted`).
    pub async fn run(&self, req: ExecutionRequest, cancel: CancellationToken) -> HarnessRun {
        let t0 = Instant::now();
        let mut timings = StartTimings::default();
        let logs = self.cfg.log_dir.join(&req.label);
        let mut run = HarnessRun {
            label: req.label.clone(),
            task: req.task.name.clone(),
            execution: None,
            outcome: RunOutcome::Aborted,
            dirs: None,
            stdout: logs.join("harness.stdout.log"),
            stderr: logs.join("harness.stderr.log"),
            timings,
            stragglers_killed: false,
        };
        let deadline = t0 + req.overall;
        let _slot = tokio::select! {
            s = self.slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return self.fail(run, "the runner is shutting down"),
            },
            _ = cancel.cancelled() => return run,
            _ = tokio::time::sleep_until(deadline.into()) => {
                run.outcome = RunOutcome::OverallTimeout;
                return run;
            }
        };
        timings.queued = t0.elapsed();

        let t = Instant::now();
        let opened_here = req.credentials.is_none();
        let creds = match (req.credentials.clone(), &self.gateway) {
            (Some(c), _) => c,
            (None, Some(gw)) => {
                let query = serde_json::json!({"task": req.task.name, "label": req.label});
                match gw.open(query, req.group.clone()).await {
                    Ok(c) => c,
                    Err(e) => return self.fail(run, &e.to_string()),
                }
            }
            (None, None) => return self.fail(run, "no gateway to open the execution at"),
        };
        run.execution = Some(creds.execution.clone());
        timings.gateway = t.elapsed();

        let t = Instant::now();
        let (root, label, seed, prompt, at) = (
            self.cfg.work_root.clone(),
            req.label.clone(),
            req.task.workspace.clone(),
            req.task.prompt.clone(),
            req.workspace.clone(),
        );
        let made = tokio::task::spawn_blocking(move || {
            ExecDirs::create_at(&root, &label, at.as_deref(), seed.as_deref(), &prompt)
        })
        .await;
        let dirs = match made {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => {
                self.close(&creds, opened_here).await;
                return self.fail(run, &format!("cannot make the workspace: {e}"));
            }
            Err(e) => {
                self.close(&creds, opened_here).await;
                return self.fail(run, &format!("cannot make the workspace: {e}"));
            }
        };
        timings.workspace = t.elapsed();
        let mut scratch_guard = ScratchGuard(Some(dirs.clone()));

        let ws = dirs.workspace.to_string_lossy().into_owned();
        let pf = dirs.prompt_file.to_string_lossy().into_owned();
        let jd = self.cfg.job_dir.to_string_lossy().into_owned();
        let home = dirs.home.to_string_lossy().into_owned();
        let tmp = dirs.tmp.to_string_lossy().into_owned();
        let values = [
            ("prompt", req.task.prompt.as_str()),
            ("prompt_file", pf.as_str()),
            ("workspace", ws.as_str()),
            ("job_dir", jd.as_str()),
            ("home", home.as_str()),
            ("tmp", tmp.as_str()),
        ];
        let argv: Vec<String> = self
            .cfg
            .command
            .iter()
            .map(|a| substitute(a, &values))
            .collect();
        // Network only to the gateway: a bridge from a socket bound into
        // the sandbox to the gateway, and the harness pointed at the
        // forwarder's loopback port inside.
        let (forward, bridge, env_creds) = match self.gateway_only(&dirs, &creds) {
            Ok(Some((f, b, c))) => (Some(f), Some(b), c),
            Ok(None) => (None, None, creds.clone()),
            Err(e) => {
                drop(scratch_guard);
                let _ = dirs.remove_all();
                self.close(&creds, opened_here).await;
                return self.fail(
                    run,
                    &format!("cannot bridge the sandbox to the gateway: {e}"),
                );
            }
        };
        let extra = Extra {
            forward,
            ..Extra::default()
        };
        let argv = self.cfg.sandbox.wrap(argv, &dirs, &values, &extra);
        let argv = match &req.status {
            Some(status) => status_wrapped(status, argv),
            None => argv,
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let overall_first = remaining < self.cfg.timeout;
        let spec = ProcessSpec {
            argv,
            cwd: dirs.workspace.clone(),
            env: self.environment(&dirs, &env_creds, &req.env),
            stdout: run.stdout.clone(),
            stderr: run.stderr.clone(),
            limits: self.cfg.limits.clone(),
            timeout: remaining.min(self.cfg.timeout),
            grace: self.cfg.grace,
        };
        let p = process::run(&spec, &cancel).await;
        drop(bridge);
        timings.spawn = p.spawn;
        timings.process = p.wall;
        run.stragglers_killed = p.stragglers_killed;
        run.outcome = match p.end {
            ProcessEnd::Exited { code: Some(0), .. } => RunOutcome::Completed,
            ProcessEnd::Exited { code: Some(c), .. } if COMPLETE_FAILURE_CODES.contains(&c) => {
                RunOutcome::CompleteFailure {
                    why: format!(
                        "exit {c}: the harness could not start (see {})",
                        run.stderr.display()
                    ),
                }
            }
            ProcessEnd::Exited { code, signal } => RunOutcome::Failed { code, signal },
            ProcessEnd::TimedOut if overall_first => RunOutcome::OverallTimeout,
            ProcessEnd::TimedOut => RunOutcome::HarnessTimeout,
            ProcessEnd::Aborted => RunOutcome::Aborted,
            ProcessEnd::CannotStart(why) => RunOutcome::CompleteFailure { why },
        };

        let t = Instant::now();
        scratch_guard.0 = None;
        let scratch = dirs.clone();
        let keep = run.outcome.scorable();
        let _ = tokio::task::spawn_blocking(move || {
            let r = scratch.remove_scratch();
            if !keep {
                let _ = scratch.remove_all();
            }
            r
        })
        .await;
        self.close(&creds, opened_here).await;
        timings.teardown = t.elapsed();
        run.timings = timings;
        if keep {
            run.dirs = Some(dirs);
        }
        tracing::debug!(label = %run.label, outcome = ?run.outcome, "harness run ended");
        run
    }

    /// With bwrap and `network = "gateway"`: the in-sandbox forwarder, the
    /// host's bridge to the gateway, and the credentials as the harness
    /// sees them (the gateway at the forwarder's loopback port).
    fn gateway_only(
        &self,
        dirs: &ExecDirs,
        creds: &Credentials,
    ) -> std::io::Result<Option<(Forward, GatewayBridge, Credentials)>> {
        let Some((bridge, gateway)) = self.bridge(dirs, &creds.api_base)? else {
            return Ok(None);
        };
        let socket = bridge.path().to_path_buf();
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], gateway.port()));
        let forward = Forward {
            program: self.cfg.forwarder.clone(),
            listen,
            socket,
        };
        let seen = Credentials {
            api_base: format!("http://{listen}"),
            ..creds.clone()
        };
        Ok(Some((forward, bridge, seen)))
    }

    /// With bwrap and `network = "gateway"`: the host's bridge from the
    /// execution's socket to the gateway at `api_base` (started again by a
    /// resumed head for a harness it adopts: the lost head's went with it).
    pub fn bridge(
        &self,
        dirs: &ExecDirs,
        api_base: &str,
    ) -> std::io::Result<Option<(GatewayBridge, std::net::SocketAddr)>> {
        let plan = &self.cfg.sandbox;
        if plan.kind != SandboxKind::Bwrap || plan.network != NetworkMode::Gateway {
            return Ok(None);
        }
        let gateway = gateway_addr(api_base)?;
        // A folder of its own: the sandbox binds the folder (see
        // `SandboxPlan::wrap`), so a socket bound again there is seen.
        let folder = dirs.root.join("gateway");
        std::fs::create_dir_all(&folder)?;
        let bridge = GatewayBridge::start(&folder.join("gateway.sock"), gateway)?;
        Ok(Some((bridge, gateway)))
    }

    async fn close(&self, creds: &Credentials, opened_here: bool) {
        if !opened_here {
            return;
        }
        if let Some(gw) = &self.gateway
            && let Err(e) = gw.close(creds.execution.clone()).await
        {
            tracing::warn!(execution = %creds.execution, error = %e, "could not close the execution at the gateway");
        }
    }

    fn fail(&self, mut run: HarnessRun, why: &str) -> HarnessRun {
        tracing::warn!(label = %run.label, why, "harness run is a complete failure");
        run.outcome = RunOutcome::CompleteFailure { why: why.into() };
        run
    }

    /// Removes a scored execution's folders unless the job keeps them.
    pub async fn discard(&self, dirs: ExecDirs, keep: bool) {
        if keep {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || dirs.remove_all()).await;
    }

    pub fn sandbox_kind(&self) -> SandboxKind {
        self.cfg.sandbox.kind
    }
}
