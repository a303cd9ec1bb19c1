//! `gyre train`: online RL of the embedded policy on the built-in agent
//! task, through the whole elastic system (scheduler, cells switching
//! between rollout and training, proxy, trajectory trees, streaming
//! micro-steps, the core's updates), in the deterministic simulator.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::embedded::cluster::EmbeddedConfig;
use crate::embedded::live::{LiveReport, run_live};
use crate::embedded::run::{TrainReport, run as run_cluster};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::embedded::external::{CommandLauncher, GatewayOptions, GatewayReport, run_with_gateway};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML file of `EmbeddedConfig` (any field may be left out; see
    /// README). Without it, the embedded default.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Simulation seed: the same seed reproduces the run exactly.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Training steps (overrides the configuration).
    #[arg(long)]
    pub steps: Option<u64>,
    /// The tiny model and cluster of the tests (seconds, not minutes).
    #[arg(long)]
    pub tiny: bool,
    /// Print the report as JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// `sim`: the deterministic simulator (virtual time, exact replay);
    /// `live`: the live host (real threads and time, model work on the
    /// blocking pool; not reproducible bit for bit).
    #[arg(long, value_enum, default_value_t = HostKind::Sim)]
    pub host: HostKind,
    /// Print the complete configuration (defaults, the file and the flags
    /// applied) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Put the gateway in front, listening here (`127.0.0.1:0`: a free
    /// port): every execution is an external harness process
    /// (`--harness-cmd`) that reaches the policy only over HTTP. Runs on
    /// the live host.
    #[arg(long, requires_all = ["harness_cmd", "evaluator_cmd"])]
    pub gateway_listen: Option<String>,
    /// The harness command of each execution, split on whitespace (an
    /// argument naming a file relative to here is made absolute);
    /// `{query}`, `{group}`, `{workspace}`, `{execution}` are filled in. It
    /// runs in a fresh workspace with OPENAI_BASE_URL, OPENAI_API_KEY,
    /// ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, GYRE_EXECUTION and GYRE_QUERY.
    #[arg(long, requires = "gateway_listen")]
    pub harness_cmd: Option<String>,
    /// The evaluator command, split on whitespace (`{workspace}`,
    /// `{query}`); prints `{"score": x, "valid": bool}`.
    #[arg(long, requires = "gateway_listen")]
    pub evaluator_cmd: Option<String>,
    /// The harness timeout, seconds.
    #[arg(long, default_value_t = 300)]
    pub harness_timeout_s: u64,
    /// Where workspaces and harness logs go (kept); default a temporary
    /// directory removed at the end.
    #[arg(long, requires = "gateway_listen")]
    pub run_dir: Option<PathBuf>,
    /// The gateway's durable store (redb); default in memory.
    #[arg(long, requires = "gateway_listen")]
    pub gateway_store: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostKind {
    Sim,
    Live,
}

/// A live run that publishes nothing for this long is reported stuck.
const LIVE_STALL: std::time::Duration = std::time::Duration::from_secs(300);

fn config(args: &TrainArgs) -> Result<EmbeddedConfig> {
    let base = if args.tiny {
        EmbeddedConfig::tiny(1)
    } else {
        EmbeddedConfig::default()
    };
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            EmbeddedConfig::from_toml(&text, &base)
                .with_context(|| format!("configuration {}", path.display()))?
        }
        None => base,
    };
    if let Some(seed) = args.seed {
        cfg.seed = seed;
    }
    if let Some(steps) = args.steps {
        cfg.sched.target_steps = steps;
    }
    Ok(cfg)
}

pub fn run(args: TrainArgs) -> Result<()> {
    let cfg = config(&args)?;
    if args.print_config {
        print!("{}", cfg.to_toml()?);
        return Ok(());
    }
    let bar = (std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(cfg.sched.target_steps);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} steps",
        ) {
            bar.set_style(style);
        }
        bar
    });
    let mut progress = |done: u64, _target: u64| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    };
    let show = |bar: Option<ProgressBar>, json: String, table: &dyn Fn()| {
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if args.json {
            println!("{json}");
        } else {
            table();
        }
    };
    if let Some(listen) = &args.gateway_listen {
        let report = run_gateway(&cfg, &args, listen, &mut progress)?;
        show(bar, serde_json::to_string_pretty(&report)?, &|| {
            print_gateway(&report)
        });
        return Ok(());
    }
    if args.host == HostKind::Live {
        let report =
            run_live(&cfg, LIVE_STALL, &mut progress).context("live embedded training run")?;
        show(bar, serde_json::to_string_pretty(&report)?, &|| {
            print_live(&report)
        });
        return Ok(());
    }
    let (_cluster, report) = run_cluster(&cfg, &mut progress).context("embedded training run")?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&cfg, &report);
    }
    Ok(())
}

fn words(flag: &str, cmd: Option<&String>) -> Result<Vec<String>> {
    let argv: Vec<String> = cmd
        .map(|c| c.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    if argv.is_empty() {
        bail!("{flag} is empty");
    }
    // Commands run in their workspace: an argument naming a file here
    // means that file.
    Ok(argv
        .into_iter()
        .map(|a| match std::path::Path::new(&a).canonicalize() {
            Ok(p) if !a.starts_with('/') && p.is_file() => p.display().to_string(),
            _ => a,
        })
        .collect())
}

fn run_gateway(
    cfg: &EmbeddedConfig,
    args: &TrainArgs,
    listen: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<GatewayReport> {
    let listen: SocketAddr = listen
        .parse()
        .with_context(|| format!("--gateway-listen {listen:?}: expected HOST:PORT"))?;
    let launcher = CommandLauncher::new(
        words("--harness-cmd", args.harness_cmd.as_ref())?,
        Duration::from_secs(args.harness_timeout_s.max(1)),
    )
    .map_err(anyhow::Error::msg)?;
    let opts = GatewayOptions {
        listen,
        launcher: Arc::new(launcher),
        evaluator: words("--evaluator-cmd", args.evaluator_cmd.as_ref())?,
        dir: args.run_dir.clone(),
        store: args.gateway_store.clone(),
        stall: LIVE_STALL,
    };
    let mut started = |addr: &str| tracing::info!("gyre train: gateway {addr}");
    run_with_gateway(cfg, opts, progress, &mut started)
        .context("training with the gateway in front")
}

fn print_gateway(r: &GatewayReport) {
    print_updates(&r.updates);
    for v in &r.reward_by_version {
        println!(
            "version {:>3}: reward {:.3} over {} runs",
            v.version, v.mean_reward, v.scored
        );
    }
    println!(
        "reward: first quarter of versions {}, last quarter {}",
        opt(r.early_reward),
        opt(r.late_reward)
    );
    let t = &r.task;
    println!(
        "harnesses: {} started, {} completed, {} harness timeouts, {} failed, {} aborted, {} scored, {} evaluator failures",
        t.executions,
        t.completed,
        t.harness_timeouts,
        t.failed,
        t.aborted,
        t.scored,
        t.eval_failures
    );
    println!(
        "gateway {}: {} calls recorded, {} answered by the plane, {} without a record; {} tokens streamed, {} attempts resumed after a role change, {} calls served by two engines",
        r.gateway,
        r.gateway_calls,
        r.plane_calls_answered,
        r.calls_without_record,
        r.streamed_tokens,
        r.resumed_attempts,
        r.engine_changes
    );
    println!(
        "elastic: {} role changes to training, KV prefixes exported {} / adopted {}, {} steps with a satellite",
        r.role_changes, r.kv_exported, r.kv_adopted, r.satellite_steps
    );
    println!(
        "run (live host): seed {}, {} steps, {:.1} s wall, workspaces and logs in {}",
        r.seed, r.steps, r.wall_secs, r.dir
    );
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

fn print_report(cfg: &EmbeddedConfig, r: &TrainReport) {
    let m = &cfg.model;
    let s = &cfg.sched;
    println!(
        "embedded policy: {} layers × {} wide, context {}; K = {} cells (C_e {}), pool C_s {}, N = {}, B = {}, φ = {}, μ = {}, {:?}",
        m.layers,
        m.width,
        m.context,
        s.cells,
        s.cell_capacity,
        s.pool_capacity,
        s.group_size,
        s.batch_groups,
        s.phi,
        s.mu,
        s.policy
    );
    println!();
    println!("step  version  micro-steps  targets   loss       grad-norm  reward(v)");
    let reward_at = |v: u64| {
        r.reward_by_version
            .iter()
            .find(|x| x.version == v)
            .map(|x| format!("{:.3} ({} runs)", x.mean_reward, x.scored))
            .unwrap_or_else(|| "-".into())
    };
    for u in &r.updates {
        println!(
            "{:>4}  {:>7}  {:>11}  {:>7}  {:>9.5}  {:>9.4}  {}",
            u.step,
            u.version,
            u.micro_steps,
            u.targets,
            u.loss,
            u.grad_norm,
            reward_at(u.step)
        );
    }
    println!();
    println!(
        "reward: first quarter of versions {}, last quarter {}; main-call hit rate {}",
        opt(r.early_reward),
        opt(r.late_reward),
        opt(r.task.hit_rate)
    );
    let e = &r.elasticity;
    println!(
        "elastic: {} role changes, {} reroutes, {} retried calls, KV pinned {} / adopted {} ({} prompt tokens not recomputed), largest training prefix {}",
        e.transitions,
        e.reroutes,
        e.retries,
        e.kv_pinned,
        e.kv_adopted,
        e.adopted_tokens,
        e.max_members
    );
    println!(
        "memory released on role changes: rollout {:.1} MiB, training {:.1} MiB",
        e.rollout_bytes_released as f64 / 1048576.0,
        e.training_bytes_released as f64 / 1048576.0
    );
    println!(
        "staleness: mean {:.2}, max {} over {} groups",
        r.staleness.mean(),
        r.staleness.max,
        r.staleness.groups
    );
    println!(
        "work: {} executions ({} compactions, {} sub-agent calls, {} harness timeouts), {} calls, {} tokens generated, {} targets trained, micro-steps by cell {:?}",
        r.task.executions,
        r.task.compactions,
        r.task.sub_agent_calls,
        r.task.harness_timeouts,
        r.calls,
        r.generated_tokens,
        r.trained_targets,
        r.micro_steps_by_cell
    );
    println!(
        "run: seed {}, {} steps, {} events, trace hash {:016x}, {:.1} s virtual, {:.1} s wall",
        r.seed, r.steps, r.events, r.trace_hash, r.virtual_secs, r.wall_secs
    );
}

fn print_updates(updates: &[crate::embedded::trainer::UpdateSummary]) {
    println!("step  version  micro-steps  targets   loss       grad-norm");
    for u in updates {
        println!(
            "{:>4}  {:>7}  {:>11}  {:>7}  {:>9.5}  {:>9.4}",
            u.step, u.version, u.micro_steps, u.targets, u.loss, u.grad_norm
        );
    }
    println!();
}

fn print_live(r: &LiveReport) {
    print_updates(&r.updates);
    println!(
        "reward: first quarter of versions {}, last quarter {}; {} executions, {} scored",
        opt(r.early_reward),
        opt(r.late_reward),
        r.executions,
        r.scored
    );
    println!(
        "run (live host): seed {}, {} steps, {:.1} s wall",
        r.seed, r.steps, r.wall_secs
    );
}
