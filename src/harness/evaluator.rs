//! The evaluator runner: the job's rubric command on an execution's
//! preserved workspace, and the binding of its score to exactly what was
//! scored.
//!
//! The command gets `{workspace}` (the preserved folder, read-only inside
//! bwrap), `{hidden}` (the task's `hidden/`, or an empty folder), `{task}`
//! and `{job_dir}`. Its verdict, in this order:
//! 1. the last line of stdout that is a JSON object with a `score`:
//!    `{"score": x, "valid": bool, "detail": …}` (`valid` defaults to
//!    true; `valid: false` means the rubric could not judge: pending);
//! 2. otherwise the exit code: 0 → score 1.0, 1 → score 0.0 (what pytest
//!    and most test runners mean), anything else → a crash;
//! 3. a timeout, a signal or a program that cannot start → a crash.
//!
//! A crash or an unparseable verdict is never a zero: the attempt is
//! pending and retried on the same preserved state while the execution's
//! budget lasts (SPEC 3.3). Each valid score is bound to the execution,
//! the attempt, the workspace's content hash taken just before the attempt
//! and the workspace's branch reference (its git HEAD, if it is a repo).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::job::{JobFile, Limits, SandboxKind};
use super::placeholders::substitute;
use super::process::{self, ProcessEnd, ProcessSpec};
use super::sandbox::{Extra, SandboxPlan};
use super::tasks::Task;
use super::workspace::{ExecDirs, content_hash};

/// The evaluator's settings, paths resolved.
#[derive(Debug, Clone)]
pub struct EvaluatorConfig {
    pub command: Vec<String>,
    pub timeout: Duration,
    pub retry_delay: Duration,
    pub env: Vec<(String, String)>,
    /// `bwrap` when the job's sandbox is; `none` otherwise (the rubric is
    /// the user's own code; a container prefix is for the harness).
    pub sandbox: SandboxPlan,
    pub limits: Limits,
    pub log_dir: PathBuf,
    pub job_dir: PathBuf,
}

impl EvaluatorConfig {
    pub fn from_job(job: &JobFile, job_path: &Path, runner: &super::runner::RunnerConfig) -> Self {
        let mut sandbox = runner.sandbox.clone();
        if sandbox.kind != SandboxKind::Bwrap {
            sandbox = SandboxPlan::none();
        }
        EvaluatorConfig {
            command: job.evaluator.command.clone(),
            timeout: job.evaluator.timeout.0,
            retry_delay: job.evaluator.retry_delay.0,
            env: job
                .evaluator
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            sandbox,
            limits: job.sandbox.limits.clone(),
            log_dir: runner.log_dir.clone(),
            job_dir: JobFile::absolute(&JobFile::base_dir(job_path)),
        }
    }
}

/// What to score.
#[derive(Debug, Clone)]
pub struct EvalTarget {
    pub label: String,
    pub task: Arc<Task>,
    pub dirs: ExecDirs,
    /// The gateway's execution id.
    pub execution: Option<String>,
}

/// A valid score and what it is bound to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Binding {
    pub label: String,
    pub execution: Option<String>,
    pub attempt: u32,
    pub score: f64,
    /// SHA-256 of the workspace content the attempt ran on.
    pub workspace_hash: String,
    /// The workspace's git HEAD (`ref: refs/heads/main`, or a commit), or
    /// empty when it is not a repository.
    pub branch: String,
    pub detail: Value,
}

/// One attempt's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Scored(Binding),
    /// Pending: retry on the same state while the budget lasts.
    Crashed {
        why: String,
    },
}

/// An evaluation to the end of its attempts.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub attempts: Vec<Verdict>,
    /// The valid score, if an attempt gave one within the budget.
    pub binding: Option<Binding>,
}

/// Parses the evaluator's stdout and exit code into a score and detail.
pub fn parse_verdict(stdout: &str, code: Option<i32>) -> Result<(f64, Value), String> {
    for line in stdout.lines().rev() {
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(score) = o.get("score") else {
            continue;
        };
        let score = score
            .as_f64()
            .filter(|s| s.is_finite())
            .ok_or_else(|| format!("`score` is not a finite number: {line}"))?;
        match o.get("valid") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(format!("the evaluator said valid: false: {line}"));
            }
            Some(v) => return Err(format!("`valid` is not a boolean: {v}")),
        }
        return Ok((score, o.get("detail").cloned().unwrap_or(Value::Null)));
    }
    match code {
        Some(0) => Ok((1.0, Value::String("exit 0".into()))),
        Some(1) => Ok((0.0, Value::String("exit 1".into()))),
        Some(c) => Err(format!("no JSON verdict on stdout and exit code {c}")),
        None => Err("no JSON verdict and killed by a signal".into()),
    }
}

/// The workspace's git HEAD, if it is a repository.
pub fn branch_ref(workspace: &Path) -> String {
    std::fs::read_to_string(workspace.join(".git/HEAD"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Runs evaluator attempts.
#[derive(Debug, Clone)]
pub struct EvaluatorRunner {
    cfg: Arc<EvaluatorConfig>,
}

impl EvaluatorRunner {
    pub fn new(cfg: EvaluatorConfig) -> Self {
        Self { cfg: Arc::new(cfg) }
    }

    pub fn config(&self) -> &EvaluatorConfig {
        &self.cfg
    }

    /// One attempt on the preserved workspace; `cancel` ends it as a crash.
    pub async fn attempt(
        &self,
        target: &EvalTarget,
        attempt: u32,
        cancel: &CancellationToken,
    ) -> Verdict {
        let crashed = |why: String| Verdict::Crashed { why };
        let dirs = target.dirs.clone();
        let scratch = dirs.root.join(format!("eval-{attempt}"));
        let empty_hidden = dirs.root.join("no-hidden");
        let (s2, e2, ws) = (
            scratch.clone(),
            empty_hidden.clone(),
            dirs.workspace.clone(),
        );
        let prepared = tokio::task::spawn_blocking(move || -> std::io::Result<(String, String)> {
            std::fs::create_dir_all(&s2)?;
            std::fs::create_dir_all(&e2)?;
            Ok((content_hash(&ws)?, branch_ref(&ws)))
        })
        .await;
        let (hash, branch) = match prepared {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return crashed(format!("cannot read the workspace: {e}")),
            Err(e) => return crashed(format!("cannot read the workspace: {e}")),
        };
        let hidden = target.task.hidden.clone().unwrap_or(empty_hidden);
        let hidden = std::path::absolute(&hidden).unwrap_or(hidden);
        let (ws, hd, td, jd) = (
            dirs.workspace.to_string_lossy().into_owned(),
            hidden.to_string_lossy().into_owned(),
            std::path::absolute(&target.task.dir)
                .unwrap_or_else(|_| target.task.dir.clone())
                .to_string_lossy()
                .into_owned(),
            self.cfg.job_dir.to_string_lossy().into_owned(),
        );
        let values = [
            ("workspace", ws.as_str()),
            ("hidden", hd.as_str()),
            ("task", td.as_str()),
            ("job_dir", jd.as_str()),
        ];
        let argv = self
            .cfg
            .command
            .iter()
            .map(|a| substitute(a, &values))
            .collect();
        let mut plan = self.cfg.sandbox.clone();
        // The evaluator may read the task set (hidden/); keep only the
        // other executions and the logs covered.
        plan.masked
            .retain(|m| !hidden.starts_with(m) && !target.task.dir.starts_with(m));
        let sandbox_dirs = ExecDirs {
            home: scratch.clone(),
            tmp: scratch.clone(),
            ..dirs.clone()
        };
        let argv = plan.wrap(
            argv,
            &sandbox_dirs,
            &values,
            &Extra {
                read_only: vec![hidden.as_path(), target.task.dir.as_path()],
                workspace_read_only: true,
                forward: None,
            },
        );
        let logs = self.cfg.log_dir.join(&target.label);
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                !(k.starts_with("OPENAI_") || k.starts_with("ANTHROPIC_") || k.starts_with("GYRE_"))
            })
            .collect();
        env.extend(self.cfg.env.iter().cloned());
        let scratch_s = scratch.to_string_lossy().into_owned();
        for (k, v) in [
            ("HOME", scratch_s.as_str()),
            ("TMPDIR", scratch_s.as_str()),
            ("GYRE_WORKSPACE", ws.as_str()),
            ("GYRE_HIDDEN", hd.as_str()),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ] {
            env.retain(|(e, _)| e != k);
            env.push((k.into(), v.into()));
        }
        let stdout = logs.join(format!("eval-{attempt}.stdout.log"));
        let spec = ProcessSpec {
            argv,
            cwd: dirs.workspace.clone(),
            env,
            stdout: stdout.clone(),
            stderr: logs.join(format!("eval-{attempt}.stderr.log")),
            limits: self.cfg.limits.clone(),
            timeout: self.cfg.timeout,
            grace: Duration::from_secs(2),
        };
        let p = process::run(&spec, cancel).await;
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(scratch)).await;
        let code = match p.end {
            ProcessEnd::Exited { code, .. } => code,
            ProcessEnd::TimedOut => return crashed(format!("timed out after {:?}", spec.timeout)),
            ProcessEnd::Aborted => return crashed("aborted".into()),
            ProcessEnd::CannotStart(why) => return crashed(format!("cannot start: {why}")),
        };
        let out = tokio::task::spawn_blocking(move || {
            std::fs::read_to_string(&stdout).unwrap_or_default()
        })
        .await
        .unwrap_or_default();
        match parse_verdict(&out, code) {
            Ok((score, detail)) => Verdict::Scored(Binding {
                label: target.label.clone(),
                execution: target.execution.clone(),
                attempt,
                score,
                workspace_hash: hash,
                branch,
                detail,
            }),
            Err(why) => crashed(why),
        }
    }

    /// Attempts until one scores or `deadline` passes (a retry waits
    /// `retry_delay`); no valid score means the execution is excluded.
    pub async fn evaluate(&self, target: &EvalTarget, deadline: Instant) -> Evaluation {
        let mut attempts = Vec::new();
        let cancel = CancellationToken::new();
        for attempt in 0.. {
            if Instant::now() >= deadline {
                break;
            }
            let v = tokio::select! {
                v = self.attempt(target, attempt, &cancel) => v,
                _ = tokio::time::sleep_until(deadline.into()) => {
                    cancel.cancel();
                    attempts.push(Verdict::Crashed { why: "the execution's budget ran out".into() });
                    break;
                }
            };
            let done = matches!(v, Verdict::Scored(_));
            attempts.push(v);
            if done {
                break;
            }
            tracing::debug!(label = %target.label, attempt, "evaluator attempt failed; retrying");
            tokio::time::sleep(self.cfg.retry_delay).await;
        }
        let binding = attempts.iter().rev().find_map(|v| match v {
            Verdict::Scored(b) => Some(b.clone()),
            Verdict::Crashed { .. } => None,
        });
        Evaluation { attempts, binding }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_verdicts() {
        assert_eq!(
            parse_verdict(
                "noise\n{\"score\": 0.5, \"detail\": {\"passed\": 1}}\n",
                Some(3)
            ),
            Ok((0.5, serde_json::json!({"passed": 1})))
        );
        assert_eq!(
            parse_verdict("{\"score\": 0.25}\n{\"other\": 1}\n", Some(0)),
            Ok((0.25, Value::Null)),
            "the last line with a score wins"
        );
        assert!(parse_verdict("{\"score\": 1, \"valid\": false}", Some(0)).is_err());
        assert!(parse_verdict("{\"score\": \"high\"}", Some(0)).is_err());
        assert!(parse_verdict("{\"score\": 1, \"valid\": \"yes\"}", Some(0)).is_err());
    }

    #[test]
    fn the_exit_code_convention() {
        assert_eq!(parse_verdict("all passed", Some(0)).map(|v| v.0), Ok(1.0));
        assert_eq!(parse_verdict("1 failed", Some(1)).map(|v| v.0), Ok(0.0));
        assert!(parse_verdict("", Some(2)).is_err());
        assert!(parse_verdict("Traceback", None).is_err());
        assert!(parse_verdict("{not json", Some(4)).is_err());
    }

    #[test]
    fn branch_of_a_repo_and_of_a_plain_folder() {
        let d = std::env::temp_dir().join(format!("gyre-branch-{}", std::process::id()));
        std::fs::create_dir_all(d.join(".git")).unwrap();
        assert_eq!(branch_ref(&d.join("nothing")), "");
        std::fs::write(d.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(branch_ref(&d), "ref: refs/heads/main");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
