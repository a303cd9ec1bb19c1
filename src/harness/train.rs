//! `gyre train --job JOB.toml`: a job file turned into the embedded
//! cluster's configuration and the gateway front's harness launcher and
//! evaluator (src/embedded/external), so the scheduling plane's executions
//! are the user's harness processes on the user's tasks.
//!
//! - [`JobLauncher`] is the front's [`HarnessLauncher`]: group `g` draws
//!   its task from the seeded epochs; the run goes through the
//!   [`HarnessRunner`] (sandbox, process group, rlimits, logs, timeouts)
//!   with the credentials the front created and the workspace where the
//!   front wants it.
//! - [`JobScorer`] is the front evaluator's [`WorkspaceScorer`]: one
//!   attempt of the job's evaluator command; a crash is a failed attempt
//!   the evaluator actor retries within the budget; each valid score's
//!   binding (execution, workspace hash, branch) is appended to
//!   `<log_dir>/bindings.jsonl`.
//! - [`JobCounters`] feed the report: outcomes, evaluator retries, where
//!   the logs and workspaces are.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gyre_actors::sched::SampleMode;
use gyre_actors::sched::proto::harness::HarnessOutcome;
use nix::unistd::Pid;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::access::Credentials;
use super::evaluator::{EvalTarget, EvaluatorConfig, EvaluatorRunner, Verdict};
use super::job::{JobError, JobFile};
use super::orphans::RUN_VAR;
use super::runner::COMPLETE_FAILURE_CODES;
use super::runner::{ExecutionRequest, HarnessRunner, RunOutcome, RunnerConfig};
use super::tasks::{Epochs, Task, TaskError, TaskSet};
use super::workspace::ExecDirs;
use crate::embedded::cluster::EmbeddedConfig;
use crate::embedded::external::board::RunInfo;
use crate::embedded::external::evaluator::{Scored, WorkspaceScorer};
use crate::embedded::external::launcher::{AdoptedEnd, time_left, wait_adopted};
use crate::embedded::external::{HarnessLauncher, HarnessRun, LaunchSpec};
use gyre_actors::trajectory::scoring::ArtifactRef;

/// Why a job could not be turned into a run.
#[derive(Debug, thiserror::Error)]
pub enum JobPlanError {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Tasks(#[from] TaskError),
    #[error("job file {path}: field `train.embedded`: {message}")]
    Embedded { path: PathBuf, message: String },
}

/// A job ready to run.
pub struct JobPlan {
    pub path: PathBuf,
    pub job: JobFile,
    pub tasks: TaskSet,
    pub cfg: EmbeddedConfig,
    pub runner: RunnerConfig,
    pub evaluator: EvaluatorConfig,
}

/// Loads the job and its task set, and applies its `[train]` to `base`.
pub fn plan(path: &Path, base: EmbeddedConfig) -> Result<JobPlan, JobPlanError> {
    let job = JobFile::load(path)?;
    let tasks = TaskSet::load(&JobFile::resolve(path, &job.tasks.dir))?;
    let mut cfg = match &job.train.embedded {
        Some(table) => {
            let text = toml::to_string(table).map_err(|e| JobPlanError::Embedded {
                path: path.into(),
                message: e.to_string(),
            })?;
            EmbeddedConfig::from_toml(&text, &base).map_err(|e| JobPlanError::Embedded {
                path: path.into(),
                message: e.to_string(),
            })?
        }
        None => base,
    };
    let t = &job.train;
    if let Some(v) = t.group_size {
        cfg.sched.group_size = v;
    }
    if let Some(v) = t.batch_groups {
        cfg.sched.batch_groups = v;
    }
    if let Some(v) = t.phi {
        cfg.sched.phi = v;
    }
    if let Some(v) = t.mu {
        cfg.sched.mu = v;
    }
    if let Some(v) = t.steps {
        cfg.sched.target_steps = v;
    }
    if let Some(v) = t.seed {
        cfg.seed = v;
    }
    if let (Some(j), SampleMode::Recorded(r)) = (t.j_max, &mut cfg.sched.samples) {
        r.jmax = j;
    }
    cfg.sched.overall_timeout = job.run.overall_timeout.0.as_nanos() as u64;
    cfg.sched.eval_retry = job.evaluator.retry_delay.0.as_nanos() as u64;
    let runner = RunnerConfig::from_job(&job, path);
    let evaluator = EvaluatorConfig::from_job(&job, path, &runner);
    Ok(JobPlan {
        path: path.into(),
        job,
        tasks,
        cfg,
        runner,
        evaluator,
    })
}

/// What the job's runs did, for the report.
#[derive(Debug, Default)]
pub struct JobCounters {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub harness_timeouts: AtomicU64,
    pub overall_timeouts: AtomicU64,
    pub aborted: AtomicU64,
    /// Complete failures: a zero-reward dummy each.
    pub dummies: AtomicU64,
    pub evaluator_attempts: AtomicU64,
    /// Attempts that crashed or gave no valid verdict (retried).
    pub evaluator_retries: AtomicU64,
    pub scored: AtomicU64,
    pub stragglers_killed: AtomicU64,
}

/// The report's job section.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub job: String,
    pub tasks: usize,
    pub completed: u64,
    pub failed: u64,
    pub harness_timeouts: u64,
    pub overall_timeouts: u64,
    pub aborted: u64,
    pub dummies: u64,
    pub evaluator_attempts: u64,
    pub evaluator_retries: u64,
    pub scored: u64,
    pub stragglers_killed: u64,
    pub sandbox: String,
    pub log_dir: String,
    pub work_dir: String,
    pub bindings: String,
}

impl JobCounters {
    pub fn report(&self, plan: &JobPlan) -> JobReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        JobReport {
            job: plan.path.display().to_string(),
            tasks: plan.tasks.len(),
            completed: g(&self.completed),
            failed: g(&self.failed),
            harness_timeouts: g(&self.harness_timeouts),
            overall_timeouts: g(&self.overall_timeouts),
            aborted: g(&self.aborted),
            dummies: g(&self.dummies),
            evaluator_attempts: g(&self.evaluator_attempts),
            evaluator_retries: g(&self.evaluator_retries),
            scored: g(&self.scored),
            stragglers_killed: g(&self.stragglers_killed),
            sandbox: format!("{:?}", plan.job.run.sandbox).to_lowercase(),
            log_dir: plan.runner.log_dir.display().to_string(),
            work_dir: plan.runner.work_root.display().to_string(),
            bindings: bindings_path(&plan.runner.log_dir).display().to_string(),
        }
    }
}

fn bindings_path(log_dir: &Path) -> PathBuf {
    log_dir.join("bindings.jsonl")
}

/// What the scorer needs about each preserved workspace.
type Targets = Mutex<HashMap<PathBuf, EvalTarget>>;

/// The front's harness launcher for a job.
pub struct JobLauncher {
    runner: HarnessRunner,
    tasks: Vec<Arc<Task>>,
    epochs: Mutex<Epochs>,
    overall: Duration,
    targets: Arc<Targets>,
    counters: Arc<JobCounters>,
}

/// The front evaluator's scorer for a job.
#[derive(Debug)]
pub struct JobScorer {
    evaluator: EvaluatorRunner,
    targets: Arc<Targets>,
    counters: Arc<JobCounters>,
    bindings: PathBuf,
    keep_workspaces: bool,
}

/// The launcher and scorer of one job, sharing their counters.
pub fn backends(plan: &JobPlan) -> (Arc<JobLauncher>, Arc<JobScorer>, Arc<JobCounters>) {
    let targets = Arc::new(Targets::default());
    let counters = Arc::new(JobCounters::default());
    let tasks: Vec<Arc<Task>> = plan.tasks.tasks.iter().cloned().map(Arc::new).collect();
    let launcher = JobLauncher {
        runner: HarnessRunner::new(plan.runner.clone(), None),
        epochs: Mutex::new(Epochs::new(tasks.len(), plan.cfg.seed)),
        tasks,
        overall: plan.job.run.overall_timeout.0,
        targets: targets.clone(),
        counters: counters.clone(),
    };
    let scorer = JobScorer {
        evaluator: EvaluatorRunner::new(plan.evaluator.clone()),
        targets,
        counters: counters.clone(),
        bindings: bindings_path(&plan.runner.log_dir),
        keep_workspaces: plan.job.run.keep_workspaces,
    };
    (Arc::new(launcher), Arc::new(scorer), counters)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl JobLauncher {
    /// The task group `g` works on.
    pub fn task_of(&self, group: u64) -> (usize, Arc<Task>) {
        let i = lock(&self.epochs).task_of(group);
        (i, self.tasks[i].clone())
    }

    /// The task of index `query` (what [`HarnessLauncher::query_of`]
    /// said), if the task set has it.
    fn task_at(&self, query: u64) -> Option<(usize, Arc<Task>)> {
        let i = usize::try_from(query).ok()?;
        Some((i, self.tasks.get(i)?.clone()))
    }
}

/// Counts a run's outcome and keeps a scorable workspace for the scorer.
fn ended(targets: &Targets, c: &JobCounters, run: &RunEnd, task: Arc<Task>) {
    let bump = |a: &AtomicU64| a.fetch_add(1, Ordering::Relaxed);
    if run.stragglers_killed {
        bump(&c.stragglers_killed);
    }
    match &run.outcome {
        RunOutcome::Completed => bump(&c.completed),
        RunOutcome::Failed { .. } => bump(&c.failed),
        RunOutcome::HarnessTimeout => bump(&c.harness_timeouts),
        RunOutcome::OverallTimeout => bump(&c.overall_timeouts),
        RunOutcome::Aborted => bump(&c.aborted),
        RunOutcome::CompleteFailure { .. } => bump(&c.dummies),
    };
    if let Some(dirs) = run.dirs.clone() {
        lock(targets).insert(
            dirs.workspace.clone(),
            EvalTarget {
                label: run.label.clone(),
                task,
                dirs,
                execution: run.execution.clone(),
            },
        );
    }
}

/// What [`ended`] reads of a run, launched or adopted.
struct RunEnd {
    label: String,
    execution: Option<String>,
    outcome: RunOutcome,
    dirs: Option<ExecDirs>,
    stragglers_killed: bool,
}

impl HarnessLauncher for JobLauncher {
    fn query_of(&self, group: u64) -> Option<u64> {
        Some(self.task_of(group).0 as u64)
    }

    fn launch(&self, spec: LaunchSpec) -> HarnessRun {
        // The front asked for the group's task (`query_of`), or, for an
        // adopted group's missing member, for that group's.
        let (index, task) = self
            .task_at(spec.query)
            .unwrap_or_else(|| self.task_of(spec.group));
        let label = format!("g{}-{}", spec.group, spec.execution);
        let req = ExecutionRequest {
            label,
            task: task.clone(),
            group: spec.group.to_string(),
            overall: self.overall,
            credentials: Some(Credentials {
                execution: spec.execution.clone(),
                key: spec.key.clone(),
                api_base: spec.api_base.clone(),
            }),
            workspace: Some(spec.workspace.clone()),
            env: vec![
                ("GYRE_QUERY".into(), index.to_string()),
                ("GYRE_GROUP".into(), spec.group.to_string()),
                ("GYRE_TASK".into(), task.name.clone()),
                (RUN_VAR.into(), spec.run.clone()),
            ],
            status: Some(spec.status()),
        };
        let (runner, targets, counters) = (
            self.runner.clone(),
            self.targets.clone(),
            self.counters.clone(),
        );
        Box::pin(async move {
            let run = runner.run(req, CancellationToken::new()).await;
            ended(
                &targets,
                &counters,
                &RunEnd {
                    label: run.label,
                    execution: run.execution,
                    outcome: run.outcome.clone(),
                    dirs: run.dirs,
                    stragglers_killed: run.stragglers_killed,
                },
                task,
            );
            // The execution actor's own overall timer ends an overall
            // timeout; what it hears from here no longer matters then.
            run.outcome
                .harness_outcome()
                .unwrap_or(HarnessOutcome::Failed { complete: false })
        })
    }

    fn adopts(&self) -> bool {
        true
    }

    /// Waits for a run a lost head started through the runner (under the
    /// status shell), with its bridge to the gateway started again for a
    /// `network = "gateway"` sandbox; then tidies and keeps it as
    /// [`HarnessRunner::run`] would have.
    fn adopt(
        &self,
        spec: LaunchSpec,
        leader: Option<Pid>,
        started: SystemTime,
    ) -> Option<HarnessRun> {
        let (_, task) = self.task_at(spec.query)?;
        let cfg = self.runner.config();
        let label = format!("g{}-{}", spec.group, spec.execution);
        let dirs = ExecDirs::existing(&cfg.work_root, &label, &spec.workspace);
        let left = time_left(cfg.timeout, started);
        let bridge = match self.runner.bridge(&dirs, &spec.api_base) {
            Ok(b) => b,
            Err(error) => {
                tracing::warn!(%error, execution = %spec.execution, "the adopted harness's gateway bridge did not start");
                None
            }
        };
        let (targets, counters) = (self.targets.clone(), self.counters.clone());
        let run: HarnessRun = Box::pin(async move {
            let end = wait_adopted(&spec, leader, left).await;
            drop(bridge);
            let outcome = match end {
                AdoptedEnd::Exited(0) => RunOutcome::Completed,
                AdoptedEnd::Exited(c) if COMPLETE_FAILURE_CODES.contains(&c) => {
                    RunOutcome::CompleteFailure {
                        why: format!("exit {c}: the harness could not start"),
                    }
                }
                AdoptedEnd::Exited(c) => RunOutcome::Failed {
                    code: Some(c),
                    signal: None,
                },
                // Killed by something else: scored on what it left, as a
                // launched run killed by a signal is.
                AdoptedEnd::Vanished => RunOutcome::Failed {
                    code: None,
                    signal: None,
                },
                AdoptedEnd::TimedOut => RunOutcome::HarnessTimeout,
            };
            let keep = outcome.scorable();
            let scratch = dirs.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = scratch.remove_scratch();
                if !keep {
                    let _ = scratch.remove_all();
                }
            })
            .await;
            ended(
                &targets,
                &counters,
                &RunEnd {
                    label,
                    execution: Some(spec.execution.clone()),
                    outcome: outcome.clone(),
                    dirs: keep.then_some(dirs),
                    stragglers_killed: false,
                },
                task,
            );
            outcome
                .harness_outcome()
                .unwrap_or(HarnessOutcome::Failed { complete: false })
        });
        Some(run)
    }

    /// The plane's overall timer usually ends a run before the runner's
    /// own deadline (it starts earlier, at dispatch): that run's future is
    /// dropped (its process group killed by the runner's guard) and counted
    /// here, as the runner would have.
    fn stopped(&self, _execution: &str, timed_out: bool) {
        let c = if timed_out {
            &self.counters.overall_timeouts
        } else {
            &self.counters.aborted
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

impl WorkspaceScorer for JobScorer {
    fn score(&self, run: &RunInfo, attempt: u32) -> Result<Scored, String> {
        let target = lock(&self.targets)
            .get(&run.workspace)
            .cloned()
            .ok_or_else(|| format!("no preserved workspace at {}", run.workspace.display()))?;
        // A runtime of its own: the attempt must not depend on the live
        // host's, which may be shutting down while an attempt is running.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no runtime for the evaluator: {e}"))?;
        self.counters
            .evaluator_attempts
            .fetch_add(1, Ordering::Relaxed);
        let verdict = rt.block_on(self.evaluator.attempt(
            &target,
            attempt,
            &CancellationToken::new(),
        ));
        match verdict {
            Verdict::Scored(b) => {
                self.counters.scored.fetch_add(1, Ordering::Relaxed);
                // One write of the whole line: evaluations end on several
                // workers at once, and `writeln!` writes the line and its
                // newline separately, so two lines could interleave
                // (`{..}{..}\n\n`; CI saw it once). A single append of a
                // small buffer is not split by another appender.
                if let Ok(mut line) = serde_json::to_vec(&b)
                    && let Ok(mut f) = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&self.bindings)
                {
                    line.push(b'\n');
                    let _ = f.write_all(&line);
                }
                lock(&self.targets).remove(&run.workspace);
                if !self.keep_workspaces {
                    let _ = target.dirs.remove_all();
                    let _ = std::fs::remove_dir_all(&target.dirs.workspace);
                }
                // The state the plane binds the score to (SPEC 3.3).
                // Version 0: the frozen final state, the same for every
                // attempt; its content hash names it.
                let artifact = ArtifactRef {
                    version: 0,
                    branch: b.branch.clone(),
                    digest: b.workspace_hash.clone(),
                };
                Ok(Scored {
                    reward: b.score,
                    artifact: Some(artifact),
                })
            }
            Verdict::Crashed { why } => {
                self.counters
                    .evaluator_retries
                    .fetch_add(1, Ordering::Relaxed);
                Err(why)
            }
        }
    }
}
