//! `gyre simulate`: the simulation lab's command. It runs the policies (or
//! the ablation variants) of a scenario side by side in the deterministic
//! simulator and prints a table, or one JSON object with `--json`; it can
//! write SVG plots and CSV files, and `--profile` prints the workload's
//! statistics beside the published targets without running a cluster.
//!
//! With no arguments it runs `nl2repo-122b`, all three policies, 48 steps.
//! The same seed gives byte-identical JSON; wall-clock figures go to stderr.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use gyre_runtime::SECS;
use gyre_simulations::lab::{self, Comparison, RunOptions, plot, report};
use gyre_simulations::scenario::{self, Scenario, Selection};
use gyre_simulations::workload::profile;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A built-in scenario (nl2repo-122b, deepswe-122b, terminalbench-122b,
    /// nl2repo-2.4t, ablation-nl2repo-122b) or the path of a scenario file.
    #[arg(long, default_value = "nl2repo-122b")]
    pub scenario: String,
    /// elastic, colocate, async or all; or a comma-separated list of them,
    /// or of the scenario's variant ids (A0 … E2).
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Target staleness E[d] (the scenario holds the (φ, μ) pairs: 1 or 1.5).
    #[arg(long)]
    pub staleness: Option<f64>,
    /// Training steps (default: the scenario's).
    #[arg(long)]
    pub steps: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the per-cell role timeline here (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Write every plot into this folder: timeline.svg, steps.svg,
    /// durations.svg, breakdown.svg (GPU-hours by phase) and
    /// critical_path.svg (a typical step's critical path).
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Write runs.csv, steps.csv and timeline.csv into this folder.
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,
    /// Print the workload's statistics beside the published targets
    /// (sampled from the model, no cluster run).
    #[arg(long)]
    pub profile: bool,
    /// Queries the profile samples.
    #[arg(long, default_value_t = 20_000)]
    pub profile_queries: u64,
    /// Check SPEC 2's invariants after every simulator event (slow).
    #[arg(long)]
    pub check: bool,
    /// Runs simulated at once (default: one thread per run).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timeline sampling tick, virtual seconds.
    #[arg(long, default_value_t = 5)]
    pub tick_s: u64,
    /// Shrink the scenario by this factor for a quick look: B, C_e, C_s and
    /// the model calls divided by it, same proportions (absolute hours move).
    #[arg(long, default_value_t = 1)]
    pub scale: u32,
    /// Over-sampling of Gyre's policy (elastic): extra executions
    /// dispatched per group (the first N valid form it, the surplus is
    /// cancelled); overrides the scenario's `[policies] oversample`.
    #[arg(long, value_name = "M")]
    pub oversample: Option<u32>,
    /// Over-sampling of the baselines (Colocate, Async); overrides the
    /// scenario's `[policies] baseline_oversample` (0 unless set).
    #[arg(long, value_name = "M")]
    pub baseline_oversample: Option<u32>,
    /// Price payload-transfer effects (`SimConfig::payload`): a latency in
    /// µs and a bandwidth in GB/s; overrides the scenario's `[transfer]
    /// payload_latency_us, payload_gbps` (0,0: instant, the default).
    #[arg(long, value_name = "LATENCY_US,GBPS")]
    pub payload_cost: Option<String>,
    /// Swarm-test N small clusters under seed-drawn fault plans (seeds from
    /// `--seed`): prints the faults injected and the outcome of each, and
    /// fails naming the seeds to replay.
    #[arg(long, value_name = "N")]
    pub swarm: Option<u64>,
    /// Replay a run recorded by `gyre train --record`: the simulated
    /// cluster driven by its workload and costs, step times and role
    /// changes side by side (`--plots DIR`: replay_timeline.svg).
    #[arg(long, value_name = "RUN.jsonl")]
    pub replay: Option<PathBuf>,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    if let Some(n) = args.swarm {
        return swarm(n, args.seed);
    }
    if let Some(path) = &args.replay {
        return replay(path, &args);
    }
    let mut sc = scenario::load(&args.scenario)
        .and_then(|s| s.scaled(args.scale))
        .map_err(anyhow::Error::msg)?;
    if let Some(m) = args.oversample {
        sc.policies.oversample = m;
    }
    if let Some(m) = args.baseline_oversample {
        sc.policies.baseline_oversample = m;
    }
    if let Some(cost) = &args.payload_cost {
        sc.transfer
            .set_payload_cost(cost)
            .map_err(anyhow::Error::msg)?;
    }
    if args.profile {
        return print_profile(&sc, &args);
    }
    let runs = sc
        .runs(&Selection::parse(&args.policy), args.staleness)
        .map_err(anyhow::Error::msg)?;
    let steps = args.steps.unwrap_or(sc.steps);
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let staleness = args.staleness.unwrap_or(sc.staleness);
    let mut opts = RunOptions::new(steps, args.seed);
    opts.check = args.check;
    opts.tick = args.tick_s.max(1) * SECS;
    // One thread per run by default (the OS balances them over the cores,
    // so three runs on two cores finish together); results do not depend
    // on the thread count.
    let threads = args.threads.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        cores.max(runs.len()).min(64)
    });
    let bar = progress_bar(runs.len() as u64 * steps);
    let done: Vec<AtomicU64> = runs.iter().map(|_| AtomicU64::new(0)).collect();
    let started = Instant::now();
    let comparison = lab::compare(&sc, &runs, staleness, &opts, threads, &|i, n| {
        if let Some(d) = done.get(i) {
            d.store(n.min(steps), Ordering::Relaxed);
        }
        if let Some(bar) = &bar {
            bar.set_position(done.iter().map(|d| d.load(Ordering::Relaxed)).sum());
        }
    })
    .map_err(anyhow::Error::msg)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let wall = started.elapsed().as_secs_f64();
    let events: u64 = comparison.results.iter().map(|r| r.events).sum();
    write_outputs(&sc, &comparison, &args)?;
    let speed = format!(
        "simulated {} runs, {events} events in {wall:.2} s wall ({:.2} M events/s, {threads} threads)",
        comparison.results.len(),
        events as f64 / wall.max(1e-9) / 1e6
    );
    if args.json {
        let text = serde_json::to_string_pretty(&comparison).context("encoding the results")?;
        println!("{text}");
        eprintln!("{speed}");
    } else {
        print!("{}", report::table(&comparison, &sc));
        println!("\n{speed}");
    }
    Ok(())
}

fn progress_bar(total: u64) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} steps")
    {
        bar.set_style(style);
    }
    Some(bar)
}

fn write_outputs(sc: &Scenario, c: &Comparison, args: &SimulateArgs) -> Result<()> {
    if let Some(path) = &args.timeline {
        plot::timeline::draw(c, path)?;
    }
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        plot::timeline::draw(c, &dir.join("timeline.svg"))?;
        plot::steps::draw(c, &dir.join("steps.svg"))?;
        plot::breakdown::draw_gpu_hours(c, &dir.join("breakdown.svg"))?;
        plot::breakdown::draw_critical_path(c, &dir.join("critical_path.svg"))?;
        let p = sample_profile(sc, args);
        plot::durations::draw(
            &p,
            &sc.workload,
            &sc.targets,
            Some(c),
            &sc.name,
            &dir.join("durations.svg"),
        )?;
    }
    if let Some(dir) = &args.csv {
        report::write_csv(c, dir).with_context(|| format!("writing CSV into {}", dir.display()))?;
    }
    Ok(())
}

fn sample_profile(sc: &Scenario, args: &SimulateArgs) -> profile::Profile {
    profile::sample(
        &sc.workload,
        sc.cluster.group_size,
        args.profile_queries.max(1),
        args.profile_queries.clamp(1, 500),
        args.seed,
    )
}

fn print_profile(sc: &Scenario, args: &SimulateArgs) -> Result<()> {
    let p = sample_profile(sc, args);
    if args.json {
        let rows = p.rows(&sc.targets);
        let out = serde_json::json!({
            "scenario": sc.name,
            "seed": args.seed,
            "profile": p,
            "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("scenario {}: {}", sc.name, sc.description);
        print!("{}", report::profile_table(&p, &sc.targets, 0.10));
    }
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        plot::durations::draw(
            &p,
            &sc.workload,
            &sc.targets,
            None,
            &sc.name,
            &dir.join("durations.svg"),
        )?;
    }
    Ok(())
}

/// `gyre simulate --replay RUN.jsonl`.
fn replay(path: &std::path::Path, args: &SimulateArgs) -> Result<()> {
    use gyre_simulations::replay;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let rec = replay::read(std::io::BufReader::new(file))
        .with_context(|| format!("record {}", path.display()))?;
    let started = Instant::now();
    let report = replay::replay(&rec).with_context(|| format!("replaying {}", path.display()))?;
    let wall = started.elapsed().as_secs_f64();
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        replay::plot::draw(&report, &dir.join("replay_timeline.svg"))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", replay::run::table(&report));
    }
    eprintln!("replayed in {wall:.2} s wall");
    Ok(())
}

/// `gyre simulate --swarm N`: the table, then an error naming each failing
/// seed with the line that replays it.
fn swarm(count: u64, base: u64) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let failed = gyre_simulations::swarm::run_table(count, base, &mut out)?;
    if let Some((seed, _)) = failed.first() {
        for (_, why) in &failed {
            eprintln!("{why}");
        }
        bail!(
            "{} of {count} swarm seeds failed; replay the first with GYRE_SEED={seed} cargo test -p gyre-simulations --test swarm",
            failed.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    #[test]
    fn no_arguments_mean_nl2repo_all_policies_scenario_steps() {
        let cli = Cli::try_parse_from(["gyre", "simulate"]).unwrap();
        let Command::Simulate(args) = cli.command else {
            panic!("not simulate");
        };
        assert_eq!(args.scenario, "nl2repo-122b");
        assert_eq!(args.policy, "all");
        assert_eq!(args.steps, None);
        assert_eq!(args.scale, 1);
        let sc = gyre_simulations::scenario::load(&args.scenario).unwrap();
        assert_eq!(sc.steps, 48);
        let runs = sc
            .runs(
                &gyre_simulations::scenario::Selection::parse(&args.policy),
                None,
            )
            .unwrap();
        assert_eq!(runs.len(), 3);
    }
}
