//! `gyre bench harness`: the cost of starting and ending an execution
//! (workspace copy, sandbox, process start, teardown) one at a time and
//! many at once, and the runner's memory per live execution.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Args;

use crate::harness::bench::{bench_task, memory, scratch, startup};
use crate::harness::job::{NetworkMode, SandboxKind};
use crate::harness::sandbox::bwrap_works;

#[derive(Debug, Args)]
pub struct HarnessBenchArgs {
    /// Executions running at once, one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,256")]
    pub concurrency: Vec<usize>,
    /// Executions per row.
    #[arg(long, default_value_t = 512)]
    pub executions: usize,
    /// Files in the task's workspace (each about 400 bytes).
    #[arg(long, default_value_t = 50)]
    pub files: usize,
    /// Sandboxes to measure (`none`, `bwrap`); bwrap is skipped, said so,
    /// where the kernel refuses it.
    #[arg(long, value_delimiter = ',', default_value = "none,bwrap")]
    pub sandbox: Vec<String>,
    /// Live executions for the memory figure (0 skips it).
    #[arg(long, default_value_t = 256)]
    pub live: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: HarnessBenchArgs) -> Result<()> {
    let dir = scratch();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let task = Arc::new(bench_task(&dir, args.files)?);
    let rt = tokio::runtime::Runtime::new()?;
    // Memory first, while the allocator holds nothing from earlier rows.
    let mem = if args.live > 0 {
        Some(
            rt.block_on(memory(
                &dir,
                task.clone(),
                args.live,
                Duration::from_secs(3),
            ))
            .map_err(|e| anyhow!(e))?,
        )
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for s in &args.sandbox {
        let kind = match s.as_str() {
            "none" => SandboxKind::None,
            "bwrap" => SandboxKind::Bwrap,
            other => return Err(anyhow!("--sandbox {other}: use none or bwrap")),
        };
        if kind == SandboxKind::Bwrap
            && let Err(why) = bwrap_works(NetworkMode::Host)
        {
            eprintln!("skipping bwrap: {why}");
            skipped.push(format!("bwrap: {why}"));
            continue;
        }
        for &c in &args.concurrency {
            let row = rt
                .block_on(startup(
                    &dir,
                    task.clone(),
                    kind,
                    c.max(1),
                    args.executions,
                    args.files,
                ))
                .map_err(|e| anyhow!(e))?;
            rows.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if args.json {
        println!(
            "{}",
            serde_json::json!({"startup": rows, "memory": mem, "skipped": skipped})
        );
        return Ok(());
    }
    println!(
        "| sandbox | concurrent | workspace ms | spawn ms | process ms | teardown ms | overhead mean ms | overhead p99 ms | executions/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |",
            r.sandbox,
            r.concurrency,
            r.workspace_ms,
            r.spawn_ms,
            r.process_ms,
            r.teardown_ms,
            r.overhead_ms,
            r.overhead_p99_ms,
            r.per_second
        );
    }
    if let Some(m) = mem {
        println!(
            "runner memory: {} live executions, resident {} KiB → {} KiB peak: {:.1} KiB per live execution",
            m.live, m.rss_before_kib, m.rss_peak_kib, m.per_execution_kib
        );
    }
    Ok(())
}
