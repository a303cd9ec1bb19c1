//! `gyre train`: online RL of the embedded policy on the built-in agent
//! task, through the whole elastic system (scheduler, cells switching
//! between rollout and training, proxy, trajectory trees, streaming
//! micro-steps, the core's updates), in the deterministic simulator.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::cluster::head::{ClusterOptions, run_cluster_with as run_cluster_processes};
use crate::cluster::placement::Launch;
use crate::embedded::cluster::EmbeddedConfig;
use crate::embedded::live::LiveReport;
use crate::embedded::record::{run_live_recorded, run_recorded};
use crate::embedded::resumable;
use crate::embedded::run::TrainReport;
use crate::embedded::run_journal::ResumeReport;
use crate::embedded::serve::{ServeFleet, ServeOptions, run_live_serve, run_serve};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::embedded::external::{
    CommandLauncher, GatewayCounters, GatewayOptions, GatewayReport, run_with_gateway,
};
use crate::harness::train::JobReport;
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
    /// blocking pool; not reproducible bit for bit); `actix`: the whole
    /// cluster on the actix adapter (feature `actix`), real time too.
    #[arg(long, value_enum, default_value_t = HostKind::Sim)]
    pub host: HostKind,
    /// Print the complete configuration (defaults, the file and the flags
    /// applied) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// `embedded`: engines in this process; `serve`: one `gyre serve`
    /// process per cell and one for the pool, behind the SGLang adapter.
    #[arg(long, value_enum, default_value_t = EngineKind::Embedded)]
    pub engines: EngineKind,
    /// SGLang servers (or `gyre serve` processes) to use as the engines,
    /// one per cell in order, then the pool's: `URL,URL,…`.
    #[arg(long, value_delimiter = ',')]
    pub engine_urls: Vec<String>,
    /// How published versions reach SGLang engines: `tensor` (Gyre's flat
    /// buffer, `/update_weights_from_tensor`; `gyre serve` only) or `disk`
    /// (a checkpoint directory under `--publish-dir`, loaded by
    /// `/update_weights_from_disk`, as a real SGLang server takes it).
    #[arg(long, value_enum, default_value_t = PublishKind::Tensor)]
    pub publish: PublishKind,
    /// Where `--publish disk` writes versions (the servers must read the
    /// same path); default a directory under the system's temp dir.
    #[arg(long)]
    pub publish_dir: Option<PathBuf>,
    /// Retries of a rejected call on the same SGLang engine (first after
    /// 50 ms, then doubling) before the proxy holds it for a reroute.
    #[arg(long, default_value_t = 0)]
    pub reject_retries: u32,
    /// Run across OS processes: `local[:N]` (node agents as child
    /// processes), `slurm[:N]` (one `srun` step each), `slurm-batch[:N]`
    /// (`sbatch` of the generated script; agents connect back) or
    /// `k8s[:N]` (`kubectl apply` of the generated Jobs, image
    /// `$GYRE_K8S_IMAGE`); N packs the cells and the pool into N node
    /// agents (default one each).
    #[arg(long, value_name = "local[:N]|slurm[:N]|slurm-batch[:N]|k8s[:N]")]
    pub cluster: Option<String>,
    /// Where the head listens for node agents (with `--cluster`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub cluster_listen: std::net::SocketAddr,
    /// An extra `srun` argument (with `--cluster slurm`; an `sbatch`
    /// argument with `slurm-batch`), repeatable.
    #[arg(long)]
    pub srun_arg: Vec<String>,
    /// With `--cluster`: how many times a lost node agent
    /// (not the core's) is started again, per node, after its process
    /// ended; the node rejoins the run. 0: it stays lost.
    #[arg(long, default_value_t = 3)]
    pub node_restarts: u32,
    /// With `--cluster local` or `slurm` and `[checkpoint] dir`: seconds
    /// node agents wait for a resumed head (`--resume`) after losing
    /// theirs, which then adopts them instead of starting new ones. 0:
    /// they exit with their head.
    #[arg(long, default_value_t = 60)]
    pub agent_wait_s: u64,
    /// With `--cluster`: resume the run whose head was lost, from the
    /// core's checkpoint and the head's journal in `[checkpoint] dir`
    /// (same configuration; the updates after the checkpoint are made
    /// again).
    #[arg(long)]
    pub resume: bool,
    /// Put the gateway in front, listening here (`127.0.0.1:0`: a free
    /// port): every execution is an external harness process
    /// (`--harness-cmd`) that reaches the policy only over HTTP. Runs on
    /// the live host.
    #[arg(long, requires_all = ["harness_cmd", "evaluator_cmd"])]
    pub gateway_listen: Option<String>,
    /// The harness command of each execution, split into words as a shell
    /// does (quotes and backslashes; no expansion), an argument naming a
    /// file relative to here made absolute;
    /// `{query}`, `{group}`, `{workspace}`, `{execution}` are filled in. It
    /// runs in a fresh workspace with OPENAI_BASE_URL, OPENAI_API_KEY,
    /// ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, GYRE_EXECUTION, GYRE_QUERY and
    /// GYRE_RUN (the run, see `gyre::harness::orphans`).
    #[arg(long, requires = "gateway_listen")]
    pub harness_cmd: Option<String>,
    /// The evaluator command, split as `--harness-cmd` (`{workspace}`,
    /// `{query}`); prints `{"score": x, "valid": bool}`.
    #[arg(long, requires = "gateway_listen")]
    pub evaluator_cmd: Option<String>,
    /// The harness timeout, seconds.
    #[arg(long, default_value_t = 300)]
    pub harness_timeout_s: u64,
    /// The evaluator command's timeout, seconds: past it the command is
    /// killed and the attempt fails (retried within the execution's
    /// budget, never read as a zero).
    #[arg(long, default_value_t = 300)]
    pub evaluator_timeout_s: u64,
    /// Where workspaces and harness logs go (kept); default a temporary
    /// directory removed at the end.
    #[arg(long, requires = "gateway_listen")]
    pub run_dir: Option<PathBuf>,
    /// The gateway's durable store (redb); default in memory.
    #[arg(long, requires = "gateway_listen")]
    pub gateway_store: Option<PathBuf>,
    /// A job file (README "Training your own harness"): the user's harness
    /// command, task folder, evaluator command, timeouts and sandbox; the
    /// gateway in front, on the live host. `--seed`, `--steps` and `--tiny`
    /// apply on top of its `[train]`.
    #[arg(long, conflicts_with_all = ["gateway_listen", "config", "print_config"])]
    pub job: Option<PathBuf>,
    /// Write what the run did (executions and their calls, backend
    /// operations, role switches, steps) to this JSON-lines file, for
    /// `gyre simulate --replay` (README "Record and replay"). Embedded
    /// engines, `--host sim` or `live`.
    #[arg(long, value_name = "RUN.jsonl")]
    pub record: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    Embedded,
    Serve,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PublishKind {
    Tensor,
    Disk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostKind {
    Sim,
    Live,
    /// The actix adapter, in an actix system of the run's own (a `gyre`
    /// built with the `actix` feature).
    Actix,
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
    let sglang = args.engines == EngineKind::Serve || !args.engine_urls.is_empty();
    let external = args.job.is_some() || args.gateway_listen.is_some();
    if sglang && args.cluster.is_some() {
        bail!("--cluster does not combine with --engines serve or --engine-urls (yet)");
    }
    if sglang && external {
        bail!(
            "--engines serve / --engine-urls do not combine with --job or --gateway-listen (yet)"
        );
    }
    if !sglang
        && (args.publish != PublishKind::Tensor
            || args.publish_dir.is_some()
            || args.reject_retries > 0)
    {
        bail!(
            "--publish, --publish-dir and --reject-retries apply to --engines serve / --engine-urls"
        );
    }
    if external {
        // Harnesses run in process groups of their own, out of reach of
        // the terminal's Ctrl-C: end them before exiting on a signal.
        crate::harness::orphans::end_on_signal()
            .context("installing the SIGINT/SIGTERM handler")?;
    }
    let plain = !sglang && !external && args.record.is_none() && args.host != HostKind::Actix;
    if args.resume && args.cluster.is_none() && !plain {
        bail!(
            "--resume works with the embedded engines on --host sim or live, or with --cluster (not with --record, --engines serve, --engine-urls, --job, --gateway-listen or --host actix)"
        );
    }
    if let Some(spec) = &args.cluster {
        let opts = cluster_options(spec, &args)?;
        let (cfg, gateway, job) = match (&args.job, &args.gateway_listen) {
            (Some(path), _) => {
                let (plan, gw, counters) = job_setup(&args, path)?;
                (plan.cfg.clone(), Some(gw), Some((plan, counters)))
            }
            (None, Some(listen)) => (cfg.clone(), Some(gateway_options(&args, listen)?), None),
            (None, None) => (cfg.clone(), None, None),
        };
        let report = run_cluster_processes(&cfg, &opts, gateway, &mut progress)
            .context("multi-process training run")?;
        let job = job.map(|(plan, counters)| counters.report(&plan));
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if args.json {
            let mut json = serde_json::to_value(&report)?;
            if let Some(job) = &job {
                json["job"] = serde_json::to_value(job)?;
            }
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            print_live(&report.run);
            if let Some(g) = &report.gateway {
                print_gateway_seen(g);
            }
            let m = &report.bytes_moved;
            println!(
                "cluster ({}): head pid {} and {} node agents {:?}; bytes moved across processes: weights {}, kv {}, gradients {}, rows {}",
                report.placement,
                report.head_pid,
                report.processes.len(),
                report
                    .processes
                    .iter()
                    .map(|p| format!("{} [{}] pid {}", p.node, p.roles.join(", "), p.pid))
                    .collect::<Vec<_>>(),
                m.weights,
                m.kv,
                m.gradients,
                m.rows
            );
            if let Some(c) = &report.counters {
                println!(
                    "executions over the run at the last publication: {} dispatched, {} started, {} finished; the core {}",
                    c.dispatched,
                    c.started,
                    c.finished,
                    if c.core_training {
                        "stayed in training"
                    } else {
                        "returned to rollout"
                    }
                );
            }
            if let Some(job) = &job {
                print_job(job);
            }
        }
        return Ok(());
    }
    if let Some(job) = &args.job {
        let (report, job) = run_job(&args, job, &mut progress)?;
        let mut json = serde_json::to_value(&report)?;
        json["job"] = serde_json::to_value(&job)?;
        show(bar, serde_json::to_string_pretty(&json)?, &|| {
            print_gateway(&report);
            print_job(&job);
        });
        return Ok(());
    }
    if let Some(listen) = &args.gateway_listen {
        let report = run_gateway(&cfg, &args, listen, &mut progress)?;
        show(bar, serde_json::to_string_pretty(&report)?, &|| {
            print_gateway(&report)
        });
        return Ok(());
    }
    if args.record.is_some() && (sglang || external || args.cluster.is_some()) {
        bail!("--record works with the embedded engines in one process (--host sim or live)");
    }
    if sglang && args.host == HostKind::Actix {
        bail!("--engines serve / --engine-urls run on the simulator and live hosts only");
    }
    if args.host == HostKind::Actix {
        if args.record.is_some() {
            bail!("--record works with --host sim or live, not actix");
        }
        let report = run_actix(&cfg)?;
        show(bar, serde_json::to_string_pretty(&report)?, &|| {
            print_live(&report)
        });
        return Ok(());
    }
    if args.host == HostKind::Live && !sglang {
        let report = match &args.record {
            Some(path) => {
                let (report, rec) = run_live_recorded(&cfg, LIVE_STALL, &mut progress)
                    .context("live embedded training run")?;
                write_record(&rec, path)?;
                report
            }
            None => resumable::run_live(&cfg, args.resume, LIVE_STALL, &mut progress)
                .context("live embedded training run")?,
        };
        show(bar, serde_json::to_string_pretty(&report)?, &|| {
            print_live(&report)
        });
        return Ok(());
    }
    let report = if sglang {
        let fleet = if args.engine_urls.is_empty() {
            let exe = std::env::current_exe().context("locating the gyre binary")?;
            Some(ServeFleet::spawn(&exe, &cfg).context("starting the gyre serve engines")?)
        } else {
            None
        };
        let urls = fleet.as_ref().map_or(&args.engine_urls, |f| &f.urls);
        let (opts, _publish_dir) = serve_options(&args, &cfg);
        if args.host == HostKind::Live {
            let report = run_live_serve(&cfg, urls, &opts, LIVE_STALL, &mut progress)
                .context("live training with SGLang engines")?;
            show(bar, serde_json::to_string_pretty(&report)?, &|| {
                print_live(&report)
            });
            return Ok(());
        }
        run_serve(&cfg, urls, &opts, &mut progress)
            .context("training with SGLang engines")?
            .1
    } else if let Some(path) = &args.record {
        let (report, rec) = run_recorded(&cfg, &mut progress).context("embedded training run")?;
        write_record(&rec, path)?;
        report
    } else {
        resumable::run_sim(&cfg, args.resume, &mut progress).context("embedded training run")?
    };
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

/// A publication directory the run chose itself (no `--publish-dir`):
/// nobody else reads its versions, so it goes when the run ends, also on
/// an error. One the user named is theirs and stays.
struct OwnedPublishDir(Option<PathBuf>);

impl Drop for OwnedPublishDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0
            && let Err(error) = std::fs::remove_dir_all(d)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %d.display(), %error, "publication directory not removed");
        }
    }
}

/// The SGLang engines' publication mode and same-engine retries.
fn serve_options(args: &TrainArgs, cfg: &EmbeddedConfig) -> (ServeOptions, OwnedPublishDir) {
    use crate::backends::sglang::adapter::{DiskPublish, Publish};
    let mut owned = OwnedPublishDir(None);
    let publish = match args.publish {
        PublishKind::Tensor => Publish::Tensor,
        PublishKind::Disk => Publish::Disk(DiskPublish {
            dir: args.publish_dir.clone().unwrap_or_else(|| {
                let d = std::env::temp_dir().join(format!("gyre-publish-{}", std::process::id()));
                owned.0 = Some(d.clone());
                d
            }),
            model: cfg.model.clone(),
        }),
    };
    let mut opts = ServeOptions::default();
    opts.adapter.publish = publish;
    opts.reject_retry = gyre_actors::sched::proxy::RejectRetry {
        retries: args.reject_retries,
        backoff: 50 * gyre_runtime::MILLIS,
    };
    (opts, owned)
}

#[cfg(feature = "actix")]
fn run_actix(cfg: &EmbeddedConfig) -> Result<LiveReport> {
    crate::embedded::actix::run_on_actix(cfg, LIVE_STALL).context("embedded training run on actix")
}

#[cfg(not(feature = "actix"))]
fn run_actix(_: &EmbeddedConfig) -> Result<LiveReport> {
    bail!(
        "--host actix: this gyre was built without the `actix` feature (cargo build --features actix)"
    )
}

fn write_record(rec: &gyre_simulations::replay::Recording, path: &std::path::Path) -> Result<()> {
    crate::embedded::record::write(rec, path)
        .with_context(|| format!("writing the record {}", path.display()))?;
    eprintln!(
        "recorded {} executions, {} operations, {} role switches, {} steps to {}",
        rec.executions.len(),
        rec.ops.len(),
        rec.switches.len(),
        rec.steps.len(),
        path.display()
    );
    Ok(())
}

/// `local[:N]` / `slurm[:N]` as placement options.
fn cluster_options(spec: &str, args: &TrainArgs) -> Result<ClusterOptions> {
    let (kind, n) = match spec.split_once(':') {
        Some((k, n)) => {
            let n: usize = n
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("--cluster {spec}: N must be a positive integer"))?;
            (k, Some(n))
        }
        None => (spec, None),
    };
    let exe = std::env::current_exe().context("locating the gyre binary for node agents")?;
    let mut opts = ClusterOptions::local(exe);
    opts.launch = match kind {
        "local" => Launch::Local,
        "slurm" => Launch::Slurm {
            extra: args.srun_arg.clone(),
        },
        "slurm-batch" => Launch::SlurmBatch {
            extra: args.srun_arg.clone(),
        },
        "k8s" => Launch::Kubernetes {
            image: std::env::var("GYRE_K8S_IMAGE").unwrap_or_else(|_| "gyre:latest".into()),
            head_host: args.cluster_listen.ip().to_string(),
        },
        other => anyhow::bail!(
            "--cluster {other}: expected local[:N], slurm[:N], slurm-batch[:N] or k8s[:N]"
        ),
    };
    opts.processes = n;
    opts.listen = args.cluster_listen;
    opts.stall = LIVE_STALL;
    opts.restarts = args.node_restarts;
    opts.agent_wait = std::time::Duration::from_secs(args.agent_wait_s);
    opts.resume = args.resume;
    Ok(opts)
}

fn words(flag: &str, cmd: Option<&String>) -> Result<Vec<String>> {
    let argv: Vec<String> = match cmd {
        Some(c) => shlex::split(c)
            .with_context(|| format!("{flag} {c:?}: an unterminated quote or escape"))?,
        None => Vec::new(),
    };
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
    let opts = gateway_options(args, listen)?;
    let mut started = |addr: &str| tracing::info!("gyre train: gateway {addr}");
    run_with_gateway(cfg, opts, progress, &mut started)
        .context("training with the gateway in front")
}

/// How `--harness-cmd` and `--evaluator-cmd` run behind a gateway on
/// `listen` (`--gateway-listen`).
fn gateway_options(args: &TrainArgs, listen: &str) -> Result<GatewayOptions> {
    let listen: SocketAddr = listen
        .parse()
        .with_context(|| format!("--gateway-listen {listen:?}: expected HOST:PORT"))?;
    let launcher = CommandLauncher::new(
        words("--harness-cmd", args.harness_cmd.as_ref())?,
        Duration::from_secs(args.harness_timeout_s.max(1)),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(GatewayOptions {
        listen,
        launcher: Arc::new(launcher),
        evaluator: words("--evaluator-cmd", args.evaluator_cmd.as_ref())?,
        evaluator_timeout: Duration::from_secs(args.evaluator_timeout_s.max(1)),
        scorer: None,
        dir: args.run_dir.clone(),
        store: args.gateway_store.clone(),
        stall: LIVE_STALL,
        max_tokens: None,
    })
}

fn run_job(
    args: &TrainArgs,
    path: &std::path::Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(GatewayReport, JobReport)> {
    let (plan, opts, counters) = job_setup(args, path)?;
    let mut started = |addr: &str| tracing::info!("gyre train --job: gateway {addr}");
    let report = run_with_gateway(&plan.cfg, opts, progress, &mut started)
        .with_context(|| format!("training job {}", path.display()))?;
    Ok((report, counters.report(&plan)))
}

/// A job file's run: its configuration (with `--seed`, `--steps` and
/// `--tiny` applied), how its harnesses and evaluator run, and the
/// counters of its report.
fn job_setup(
    args: &TrainArgs,
    path: &std::path::Path,
) -> Result<(
    crate::harness::train::JobPlan,
    GatewayOptions,
    Arc<crate::harness::train::JobCounters>,
)> {
    let base = if args.tiny {
        EmbeddedConfig::tiny(1)
    } else {
        EmbeddedConfig::default()
    };
    let mut plan = crate::harness::train::plan(path, base)?;
    if let Some(seed) = args.seed {
        plan.cfg.seed = seed;
    }
    if let Some(steps) = args.steps {
        plan.cfg.sched.target_steps = steps;
    }
    let (launcher, scorer, counters) = crate::harness::train::backends(&plan);
    let listen: SocketAddr = plan
        .job
        .run
        .listen
        .parse()
        .with_context(|| format!("run.listen {:?}", plan.job.run.listen))?;
    let store = plan
        .job
        .run
        .gateway_store
        .as_ref()
        .map(|p| crate::harness::JobFile::resolve(path, p));
    let opts = GatewayOptions {
        listen,
        launcher,
        evaluator: Vec::new(),
        evaluator_timeout: crate::embedded::external::evaluator::DEFAULT_TIMEOUT,
        scorer: Some(scorer),
        dir: Some(plan.runner.work_root.clone()),
        store,
        stall: LIVE_STALL,
        max_tokens: plan.job.model.max_tokens,
    };
    Ok((plan, opts, counters))
}

fn print_job(j: &JobReport) {
    println!(
        "job {} ({} tasks, sandbox {}): {} completed, {} failed (scored), {} harness timeouts (scored), {} overall timeouts, {} aborted, {} dummies; evaluator {} attempts, {} retried, {} scored; {} runs left background processes (killed)",
        j.job,
        j.tasks,
        j.sandbox,
        j.completed,
        j.failed,
        j.harness_timeouts,
        j.overall_timeouts,
        j.aborted,
        j.dummies,
        j.evaluator_attempts,
        j.evaluator_retries,
        j.scored,
        j.stragglers_killed
    );
    println!(
        "logs {}, workspaces {}, score bindings {}",
        j.log_dir, j.work_dir, j.bindings
    );
}

fn print_gateway_seen(g: &GatewayCounters) {
    let t = &g.task;
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
        g.gateway,
        g.gateway_calls,
        g.plane_calls_answered,
        g.calls_without_record,
        g.streamed_tokens,
        g.resumed_attempts,
        g.engine_changes
    );
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
    print_gateway_seen(&r.seen);
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

fn print_resumed(r: Option<&ResumeReport>) {
    if let Some(r) = r {
        println!(
            "resumed from the core's checkpoint of version {} ({} earlier resumes; {} journaled updates after the checkpoint made again)",
            r.from_version, r.earlier_resumes, r.lost_updates
        );
        let a = &r.adopted;
        if a.groups > 0 {
            println!(
                "adopted {} groups of the lost head: {} harnesses still running, {} ended ones scored again, {} recorded calls kept",
                a.groups, a.running, a.ended, a.records
            );
        }
        if r.harnesses_killed > 0 {
            println!(
                "killed {} harness processes the lost head left running",
                r.harnesses_killed
            );
        }
        if let Some(w) = &r.core_last_word {
            match &w.why {
                None => println!(
                    "the core's last word (version {}) taken: nothing made again{}",
                    w.version,
                    if w.journaled > 0 {
                        format!(", {} updates it carried journaled", w.journaled)
                    } else {
                        String::new()
                    }
                ),
                Some(why) => println!(
                    "the core's last word (version {}) not taken: {why}",
                    w.version
                ),
            }
        }
        if r.agents_adopted > 0 {
            println!(
                "adopted {} node agents the lost head left waiting",
                r.agents_adopted
            );
        }
    }
}

fn print_report(cfg: &EmbeddedConfig, r: &TrainReport) {
    print_resumed(r.resumed.as_ref());
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
        "elastic: {} role changes, {} reroutes, {} retried calls, KV pinned {} / adopted {} ({} prompt tokens not recomputed) / recomputed without KV {}, largest training prefix {}",
        e.transitions,
        e.reroutes,
        e.retries,
        e.kv_pinned,
        e.kv_adopted,
        e.adopted_tokens,
        e.kv_recomputed,
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
    if r.checkpoints > 0 {
        println!(
            "checkpoints: {} durable core checkpoints, {:.1} MiB written",
            r.checkpoints,
            r.checkpoint_bytes as f64 / 1048576.0
        );
    }
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
    print_resumed(r.resumed.as_ref());
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
