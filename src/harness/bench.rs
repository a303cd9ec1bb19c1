//! The pieces of `gyre bench harness`: what starting an execution costs
//! (workspace copy, sandbox, process start, teardown) alone and with many
//! at once, and the runner's memory per live execution.
//!
//! Start-up is measured with `/bin/true` as the harness, so the process
//! phase is almost all fork, exec, exit and the group sweep; memory with a
//! harness that sleeps, sampling this process's resident set while every
//! execution is alive. No gateway is involved (the credentials are
//! placeholders): the gateway's own cost is `gyre bench gateway`'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::access::Credentials;
use super::job::{Limits, NetworkMode, SandboxKind};
use super::runner::{ExecutionRequest, HarnessRunner, RunOutcome, RunnerConfig};
use super::sandbox::SandboxPlan;
use super::tasks::Task;

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct StartupRow {
    pub sandbox: String,
    pub concurrency: usize,
    pub executions: usize,
    pub workspace_files: usize,
    /// Means per execution, milliseconds.
    pub workspace_ms: f64,
    pub spawn_ms: f64,
    pub process_ms: f64,
    pub teardown_ms: f64,
    /// workspace + process + teardown (what an execution costs beyond its
    /// harness's own work), mean and p99.
    pub overhead_ms: f64,
    pub overhead_p99_ms: f64,
    /// Executions started and finished per second of wall time.
    pub per_second: f64,
}

/// Runner memory while `live` harnesses are alive.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    pub live: usize,
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
    pub per_execution_kib: f64,
}

/// A task with `files` small files in its workspace.
pub fn bench_task(dir: &Path, files: usize) -> std::io::Result<Task> {
    let ws = dir.join("task/workspace");
    std::fs::create_dir_all(ws.join("src"))?;
    for i in 0..files {
        std::fs::write(
            ws.join("src").join(format!("f{i}.py")),
            format!("def f{i}():\n    return {i}\n").repeat(20),
        )?;
    }
    std::fs::write(dir.join("task/prompt.md"), "benchmark")?;
    Ok(Task {
        name: "bench".into(),
        dir: dir.join("task"),
        prompt: "benchmark".into(),
        workspace: Some(ws),
        hidden: None,
    })
}

fn runner(dir: &Path, command: Vec<String>, sandbox: SandboxKind, slots: usize) -> HarnessRunner {
    let mut plan = SandboxPlan::none();
    plan.kind = sandbox;
    plan.network = NetworkMode::Host;
    HarnessRunner::new(
        RunnerConfig {
            command,
            timeout: Duration::from_secs(600),
            grace: Duration::from_secs(1),
            env: Vec::new(),
            inherit_env: false,
            sandbox: plan,
            limits: Limits::default(),
            log_dir: dir.join("logs"),
            work_root: dir.join("work"),
            job_dir: dir.to_path_buf(),
            concurrency: slots,
            forwarder: PathBuf::from("gyre"),
        },
        None,
    )
}

fn request(task: &Arc<Task>, i: usize) -> ExecutionRequest {
    ExecutionRequest {
        label: format!("b{i:05}"),
        task: task.clone(),
        group: "bench".into(),
        overall: Duration::from_secs(3600),
        credentials: Some(Credentials {
            execution: format!("bench-{i}"),
            key: "bench".into(),
            api_base: "http://127.0.0.1:9".into(),
        }),
        workspace: None,
        env: Vec::new(),
        status: None,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `executions` runs of `/bin/true`, `concurrency` at a time.
pub async fn startup(
    dir: &Path,
    task: Arc<Task>,
    sandbox: SandboxKind,
    concurrency: usize,
    executions: usize,
    files: usize,
) -> Result<StartupRow, String> {
    let r = runner(dir, vec!["/bin/true".into()], sandbox, concurrency);
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for i in 0..executions {
        let (r, req) = (r.clone(), request(&task, i));
        handles.push(tokio::spawn(async move {
            let run = r.run(req, CancellationToken::new()).await;
            if let Some(d) = run.dirs.clone() {
                r.discard(d, false).await;
            }
            run
        }));
    }
    let mut runs = Vec::new();
    for h in handles {
        runs.push(h.await.map_err(|e| e.to_string())?);
    }
    let wall = t0.elapsed();
    if let Some(bad) = runs.iter().find(|r| r.outcome != RunOutcome::Completed) {
        return Err(format!(
            "a benchmark run did not complete: {:?} (stderr {})",
            bad.outcome,
            bad.stderr.display()
        ));
    }
    let n = runs.len().max(1) as f64;
    let mean = |f: &dyn Fn(&super::runner::StartTimings) -> Duration| {
        runs.iter().map(|r| ms(f(&r.timings))).sum::<f64>() / n
    };
    let mut overheads: Vec<f64> = runs
        .iter()
        .map(|r| ms(r.timings.workspace + r.timings.process + r.timings.teardown))
        .collect();
    overheads.sort_by(f64::total_cmp);
    let p99 = overheads[((overheads.len() as f64 * 0.99) as usize).min(overheads.len() - 1)];
    Ok(StartupRow {
        sandbox: format!("{sandbox:?}").to_lowercase(),
        concurrency,
        executions,
        workspace_files: files,
        workspace_ms: mean(&|t| t.workspace),
        spawn_ms: mean(&|t| t.spawn),
        process_ms: mean(&|t| t.process),
        teardown_ms: mean(&|t| t.teardown),
        overhead_ms: overheads.iter().sum::<f64>() / n,
        overhead_p99_ms: p99,
        per_second: n / wall.as_secs_f64(),
    })
}

/// This process's resident set, KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// `live` harnesses that sleep `hold`, all at once; the peak resident set
/// of this process over the baseline, per execution.
pub async fn memory(
    dir: &Path,
    task: Arc<Task>,
    live: usize,
    hold: Duration,
) -> Result<MemoryRow, String> {
    let r = runner(
        dir,
        vec!["/bin/sleep".into(), format!("{}", hold.as_secs_f64())],
        SandboxKind::None,
        live,
    );
    let before = rss_kib();
    let mut handles = Vec::new();
    for i in 0..live {
        let (r, req) = (r.clone(), request(&task, 100_000 + i));
        handles.push(tokio::spawn(async move {
            let run = r.run(req, CancellationToken::new()).await;
            if let Some(d) = run.dirs.clone() {
                r.discard(d, false).await;
            }
            run
        }));
    }
    let mut peak = before;
    while handles.iter().any(|h| !h.is_finished()) {
        peak = peak.max(rss_kib());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for h in handles {
        let run = h.await.map_err(|e| e.to_string())?;
        if run.outcome != RunOutcome::Completed {
            return Err(format!("a memory run did not complete: {:?}", run.outcome));
        }
    }
    Ok(MemoryRow {
        live,
        rss_before_kib: before,
        rss_peak_kib: peak,
        per_execution_kib: peak.saturating_sub(before) as f64 / live.max(1) as f64,
    })
}

/// A fresh scratch folder for a benchmark.
pub fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!("gyre-bench-harness-{}", std::process::id()))
}
