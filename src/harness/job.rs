//! The job file: what a user writes to train their own harness on their own
//! tasks (`gyre train --job JOB.toml`).
//!
//! One TOML file names the task folder, the harness command, the evaluator
//! command, the timeouts, the sandbox and the training shape. Every table
//! refuses keys it does not know, and every error names the dotted path of
//! the offending field, so a typo never silently falls back to a default.
//! Relative paths (`tasks.dir`, `run.log_dir`, `run.work_dir`) are taken
//! from the job file's own folder, which commands can name as `{job_dir}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::duration::Span;

/// A whole job file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub tasks: TasksSection,
    pub harness: HarnessSection,
    pub evaluator: EvaluatorSection,
    pub run: RunSection,
    #[serde(default)]
    pub sandbox: SandboxSection,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub model: ModelSection,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksSection {
    /// One folder per query: `prompt.md`, optional `workspace/` (copied
    /// fresh per execution) and optional `hidden/` (never shown to the
    /// harness, given to the evaluator).
    pub dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessSection {
    /// argv; placeholders `{prompt}`, `{prompt_file}`, `{workspace}`,
    /// `{job_dir}`. Run with the workspace as its working directory.
    pub command: Vec<String>,
    /// The harness timeout: SIGTERM to the process group, then SIGKILL
    /// after `kill_grace`; the workspace is kept and scored (SPEC 3.3).
    pub timeout: Span,
    /// Between SIGTERM and SIGKILL.
    #[serde(default = "default_grace")]
    pub kill_grace: Span,
    /// Extra environment variables (after the inherited ones, before
    /// Gyre's own, which always win).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Start from the runner's environment (minus any OPENAI_*/ANTHROPIC_*
    /// variable) rather than an empty one with only PATH.
    #[serde(default = "yes")]
    pub inherit_env: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluatorSection {
    /// argv; placeholders `{workspace}`, `{hidden}`, `{task}`, `{job_dir}`.
    /// Prints `{"score": x, "valid": bool, "detail": …}` on stdout, or
    /// follows the exit-code convention (0 → 1.0, 1 → 0.0, else a crash).
    pub command: Vec<String>,
    /// One attempt's limit; past it the attempt is a crash (retried).
    #[serde(default = "default_eval_timeout")]
    pub timeout: Span,
    /// Pause before retrying a crashed attempt.
    #[serde(default = "default_retry_delay")]
    pub retry_delay: Span,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// How a harness process is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxKind {
    /// Own session and process group, rlimits, own HOME and TMPDIR.
    #[default]
    None,
    /// bubblewrap: the workspace writable, the rest read-only, hidden/
    /// absent, own PID namespace; network per `sandbox.network`.
    Bwrap,
    /// A user prefix (`sandbox.prefix`, e.g. `docker run …`) in front of
    /// the harness command.
    Command,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// The execution's total budget, evaluation retries included.
    pub overall_timeout: Span,
    #[serde(default)]
    pub sandbox: SandboxKind,
    /// Harness processes alive at once on this node.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Per-execution stdout/stderr logs and the score bindings.
    #[serde(default = "default_log_dir")]
    pub log_dir: PathBuf,
    /// Where workspaces, HOMEs and temp dirs are made (default: the system
    /// temp dir).
    #[serde(default)]
    pub work_dir: Option<PathBuf>,
    /// Keep each scored workspace instead of removing it.
    #[serde(default)]
    pub keep_workspaces: bool,
    /// The gateway's API listener the harnesses are pointed at
    /// (`127.0.0.1:0`: a free port).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The gateway's durable record store (redb folder); in memory when
    /// absent.
    #[serde(default)]
    pub gateway_store: Option<PathBuf>,
}

/// Network inside a bwrap sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The host's network (no isolation).
    #[default]
    Host,
    /// A private network namespace: loopback only. The gateway is
    /// unreachable, so only for harnesses that do not call a model and for
    /// evaluators.
    None,
    /// A private network namespace whose one way out is the gateway: a
    /// forwarder inside listens on loopback and relays over a Unix socket
    /// to the gateway's address (src/harness/forward.rs). bwrap only.
    Gateway,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// bwrap only.
    #[serde(default)]
    pub network: NetworkMode,
    /// The prefix of `sandbox = "command"`; placeholders as the harness's.
    #[serde(default)]
    pub prefix: Vec<String>,
    /// Extra bwrap arguments, appended before `--`.
    #[serde(default)]
    pub bwrap_args: Vec<String>,
    #[serde(default)]
    pub limits: Limits,
}

impl Default for SandboxSection {
    fn default() -> Self {
        Self {
            network: NetworkMode::Host,
            prefix: Vec::new(),
            bwrap_args: Vec::new(),
            limits: Limits::default(),
        }
    }
}

/// rlimits set in the harness (and evaluator) process before exec; inherited
/// by everything it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// RLIMIT_NOFILE.
    #[serde(default = "default_open_files")]
    pub open_files: u64,
    /// RLIMIT_CORE in bytes (0: no core dumps).
    #[serde(default)]
    pub core_bytes: u64,
    /// RLIMIT_AS in MiB.
    #[serde(default)]
    pub address_space_mb: Option<u64>,
    /// RLIMIT_CPU in seconds of CPU time.
    #[serde(default)]
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_FSIZE in MiB: the largest file the harness may write.
    #[serde(default)]
    pub file_size_mb: Option<u64>,
    /// RLIMIT_NPROC (per user id; root ignores it).
    #[serde(default)]
    pub processes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            open_files: default_open_files(),
            core_bytes: 0,
            address_space_mb: None,
            cpu_seconds: None,
            file_size_mb: None,
            processes: None,
        }
    }
}

/// The training shape (SPEC 2): anything left out keeps the embedded
/// default of `gyre train --print-config`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    /// N: executions per group.
    pub group_size: Option<u32>,
    /// B: groups per training step.
    pub batch_groups: Option<u32>,
    /// φ: over-dispatch, in units of B.
    pub phi: Option<f64>,
    /// μ: steps per burst.
    pub mu: Option<u32>,
    /// J_max: admitted trajectories per execution.
    pub j_max: Option<usize>,
    pub steps: Option<u64>,
    /// Seeds the task epochs and the run.
    pub seed: Option<u64>,
    /// Any other field of the embedded configuration, as in `gyre train
    /// --config` (e.g. `[train.embedded.sched] cells = 2`).
    #[serde(default)]
    pub embedded: Option<toml::Table>,
}

/// The policy the harnesses are served by. Only the embedded model trains
/// through `gyre train --job` today; its size is `[train.embedded.model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// `embedded`: the gpu crate's policy, served and trained by the cells.
    #[serde(default = "default_engine")]
    pub engine: String,
    /// The most tokens one call generates, whatever the client asks
    /// (Claude Code asks 64,000): a call that reaches this cap of the
    /// policy's own ends its turn. Absent: the client's `max_tokens`,
    /// bounded by the context.
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            engine: default_engine(),
            max_tokens: None,
        }
    }
}

fn yes() -> bool {
    true
}
fn default_grace() -> Span {
    Span::from_secs(10)
}
fn default_eval_timeout() -> Span {
    Span::from_secs(600)
}
fn default_retry_delay() -> Span {
    Span::from_secs(1)
}
fn default_concurrency() -> usize {
    16
}
fn default_log_dir() -> PathBuf {
    PathBuf::from("gyre-logs")
}
fn default_listen() -> String {
    "127.0.0.1:0".into()
}
fn default_open_files() -> u64 {
    4096
}
fn default_engine() -> String {
    "embedded".into()
}

/// Why a job file was refused; every variant names the field or the file.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("cannot read job file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("job file {path}: TOML syntax: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("job file {path}: field `{field}`: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
}

impl JobFile {
    /// Reads, parses and checks a job file.
    pub fn load(path: &Path) -> Result<JobFile, JobError> {
        let text = std::fs::read_to_string(path).map_err(|source| JobError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses `text` as the job file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<JobFile, JobError> {
        let value: toml::Table = toml::from_str(text).map_err(|e| JobError::Syntax {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
        let job: JobFile =
            serde_path_to_error::deserialize(toml::Value::Table(value)).map_err(|e| {
                let field = e.path().to_string();
                JobError::Field {
                    path: path.to_path_buf(),
                    field: if field == "." {
                        "(top level)".into()
                    } else {
                        field
                    },
                    message: e.into_inner().message().to_string(),
                }
            })?;
        job.check(path)?;
        Ok(job)
    }

    fn check(&self, path: &Path) -> Result<(), JobError> {
        let bad = |field: &str, message: &str| JobError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            message: message.to_string(),
        };
        if self.harness.command.is_empty() || self.harness.command[0].is_empty() {
            return Err(bad("harness.command", "must name a program"));
        }
        if self.evaluator.command.is_empty() || self.evaluator.command[0].is_empty() {
            return Err(bad("evaluator.command", "must name a program"));
        }
        if self.harness.timeout.0.is_zero() {
            return Err(bad("harness.timeout", "must be positive"));
        }
        if self.evaluator.timeout.0.is_zero() {
            return Err(bad("evaluator.timeout", "must be positive"));
        }
        if self.run.overall_timeout.0.is_zero() {
            return Err(bad("run.overall_timeout", "must be positive"));
        }
        if self.run.overall_timeout < self.harness.timeout {
            return Err(bad(
                "run.overall_timeout",
                "is shorter than harness.timeout: no execution could reach its harness timeout",
            ));
        }
        if self.run.concurrency == 0 {
            return Err(bad("run.concurrency", "must be at least 1"));
        }
        if self.run.sandbox == SandboxKind::Command && self.sandbox.prefix.is_empty() {
            return Err(bad(
                "sandbox.prefix",
                "sandbox = \"command\" needs a prefix such as [\"docker\", \"run\", …]",
            ));
        }
        if self.run.sandbox != SandboxKind::Command && !self.sandbox.prefix.is_empty() {
            return Err(bad(
                "sandbox.prefix",
                "is only used with run.sandbox = \"command\"",
            ));
        }
        if self.sandbox.limits.open_files < 16 {
            return Err(bad("sandbox.limits.open_files", "below 16 nothing starts"));
        }
        for (field, known) in [
            (
                "harness.command",
                &["prompt", "prompt_file", "workspace", "job_dir"][..],
            ),
            (
                "evaluator.command",
                &["workspace", "hidden", "task", "job_dir"][..],
            ),
        ] {
            let argv = if field.starts_with("harness") {
                &self.harness.command
            } else {
                &self.evaluator.command
            };
            for arg in argv {
                if let Some(name) = super::placeholders::unknown(arg, known) {
                    return Err(bad(
                        field,
                        &format!(
                            "unknown placeholder {{{name}}} (known: {})",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
        if let Some(p) = &self.train.phi
            && !(p.is_finite() && *p >= 0.0)
        {
            return Err(bad("train.phi", "must be a finite number ≥ 0"));
        }
        for (field, v) in [
            ("train.group_size", self.train.group_size),
            ("train.batch_groups", self.train.batch_groups),
            ("train.mu", self.train.mu),
        ] {
            if v == Some(0) {
                return Err(bad(field, "must be at least 1"));
            }
        }
        if self.train.j_max == Some(0) {
            return Err(bad("train.j_max", "must be at least 1"));
        }
        if self.model.engine != "embedded" {
            return Err(bad(
                "model.engine",
                "must be `embedded` (the model's size: [train.embedded.model])",
            ));
        }
        if self.sandbox.network == NetworkMode::Gateway && self.run.sandbox != SandboxKind::Bwrap {
            return Err(bad(
                "sandbox.network",
                "`gateway` needs run.sandbox = \"bwrap\" (its network namespace)",
            ));
        }
        if self.run.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad("run.listen", "must be HOST:PORT, e.g. 127.0.0.1:0"));
        }
        Ok(())
    }

    /// The folder relative paths of this job are taken from.
    pub fn base_dir(path: &Path) -> PathBuf {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// `p` resolved against the job file's folder.
    pub fn resolve(job_path: &Path, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            Self::base_dir(job_path).join(p)
        }
    }

    /// `p` made absolute with `.` and `..` folded away (lexically: the
    /// folders need not exist yet).
    pub fn absolute(p: &Path) -> PathBuf {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut out = PathBuf::new();
        for c in abs.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::CurDir => {}
                other => out.push(other),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[tasks]
dir = "tasks"
[harness]
command = ["python3", "agent.py", "{prompt_file}"]
timeout = "30m"
[evaluator]
command = ["python3", "{hidden}/grade.py", "{workspace}"]
[run]
overall_timeout = "1h"
sandbox = "none"
"#;

    fn parse(text: &str) -> Result<JobFile, JobError> {
        JobFile::parse(text, Path::new("job.toml"))
    }

    fn field_of(text: &str) -> String {
        match parse(text) {
            Err(JobError::Field { field, message, .. }) => format!("{field}: {message}"),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn the_issue_example_reads_with_defaults() {
        let j = parse(GOOD).unwrap();
        assert_eq!(j.harness.timeout, Span::from_secs(1800));
        assert_eq!(j.run.overall_timeout, Span::from_secs(3600));
        assert_eq!(j.run.sandbox, SandboxKind::None);
        assert_eq!(j.run.concurrency, 16);
        assert_eq!(j.sandbox.limits.open_files, 4096);
        assert_eq!(j.model.engine, "embedded");
    }

    #[test]
    fn unknown_keys_are_named_with_their_path() {
        let e = field_of(&GOOD.replace("timeout = \"30m\"", "timeout = \"30m\"\ntimout = 3"));
        assert!(
            e.starts_with("harness.timout: unknown field `timout`"),
            "{e}"
        );
        let e = field_of(&format!("{GOOD}\n[sandbox.limits]\nopen_file = 3\n"));
        assert!(
            e.starts_with("sandbox.limits.open_file: unknown field `open_file`"),
            "{e}"
        );
        let e = field_of(&format!("{GOOD}\n[extra]\nx = 1\n"));
        assert!(e.starts_with("extra: unknown field `extra`"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = field_of(&GOOD.replace("\"30m\"", "\"30 parsecs\""));
        assert!(e.starts_with("harness.timeout: bad duration"), "{e}");
        let e = field_of(&GOOD.replace("sandbox = \"none\"", "sandbox = \"docker\""));
        assert!(
            e.starts_with("run.sandbox: unknown variant `docker`"),
            "{e}"
        );
        let e = field_of(&GOOD.replace("overall_timeout = \"1h\"", "overall_timeout = \"10m\""));
        assert!(e.starts_with("run.overall_timeout: is shorter"), "{e}");
        let e = field_of(&GOOD.replace("sandbox = \"none\"", "sandbox = \"command\""));
        assert!(e.starts_with("sandbox.prefix:"), "{e}");
        let e = field_of(&GOOD.replace("{prompt_file}", "{promptfile}"));
        assert!(
            e.starts_with("harness.command: unknown placeholder {promptfile}"),
            "{e}"
        );
        let e = field_of(&GOOD.replace("{hidden}/grade.py", "{prompt}"));
        assert!(
            e.starts_with("evaluator.command: unknown placeholder {prompt}"),
            "{e}"
        );
        let e = field_of(&format!("{GOOD}\n[train]\ngroup_size = 0\n"));
        assert!(e.starts_with("train.group_size: must be at least 1"), "{e}");
        let e = field_of(&GOOD.replace("[harness]\n", "[harness]\nenv = 3\n"));
        assert!(e.starts_with("harness.env:"), "{e}");
    }

    #[test]
    fn missing_sections_are_named() {
        let e = field_of(&GOOD.replace("[evaluator]", "[evaluatr]"));
        assert!(e.contains("evaluatr") || e.contains("evaluator"), "{e}");
        let no_run = GOOD.split("[run]").next().unwrap().to_string();
        let e = field_of(&no_run);
        assert!(e.contains("missing field `run`"), "{e}");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let e = parse("[tasks\n").unwrap_err().to_string();
        assert!(e.contains("job.toml") && e.contains("syntax"), "{e}");
    }

    #[test]
    fn relative_paths_resolve_against_the_job_folder() {
        let job = Path::new("examples/jobs/a.toml");
        assert_eq!(
            JobFile::resolve(job, Path::new("../tasks/python")),
            PathBuf::from("examples/jobs/../tasks/python")
        );
        assert_eq!(
            JobFile::resolve(job, Path::new("/abs")),
            PathBuf::from("/abs")
        );
        assert_eq!(JobFile::base_dir(Path::new("a.toml")), PathBuf::from("."));
        assert_eq!(
            JobFile::absolute(Path::new("/a/b/../c/./d")),
            PathBuf::from("/a/c/d")
        );
    }
}
