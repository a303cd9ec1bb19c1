//! `gyre trace`: inspect recorded model calls the way the trajectory plane
//! sees them. `stats` prints each execution's trajectory tree, `admit` runs
//! admission by masking (SPEC 3.6) and prints what would train, `synth`
//! writes a synthetic harness trace.
//!
//! # Trace format (JSONL)
//!
//! One model call per line, UTF-8 JSON objects; blank lines are ignored.
//!
//! | field | type | |
//! |---|---|---|
//! | `execution` | string | required: the harness execution |
//! | `call_id` | string | required, unique within the execution |
//! | `input_ids` | integer array | required, non-empty: exact context tokens |
//! | `output_ids` | integer array | required: exact generated tokens |
//! | `output_logprobs` | float array | required, same length as `output_ids`, each ≤ 0 |
//! | `policy_version` | integer | required |
//! | `thread` | string | optional: agent thread (`main`, a sub-agent) |
//! | `role` | string | optional: `main`, `main-summary`, `sub-agent`, `sub-agent-summary`; decides the class of the leaf this call produces, otherwise the profile classifies |
//! | `parent_call` | string | optional: the call whose output spawned this thread (must appear earlier) |
//! | `purpose` | string | optional: `policy` (default) or `critique` (outputs never train) |
//! | `engine` | string | optional |
//! | `start_ns`, `end_ns` | integer | optional timing |
//! | `input_message_ends` | integer array | optional: offsets where each input message ends, for message-level statistics |
//! | `output_sources` | string array | optional: `sampled`/`external` per output token (default: all sampled) |
//!
//! Lines of one execution are inserted in file order. An input token counts
//! as sampled only where the tree matches it to an earlier recorded output at
//! the same position on the same path; every other input token is external,
//! including an earlier output pasted into a new context. A malformed or
//! inconsistent line is reported on stderr with its line number and skipped
//! (and listed under `skipped` with `--json`); the rest is still processed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use gyre_actors::trajectory::admission::admit;
use gyre_actors::trajectory::profile::{
    HarnessProfile, LeafClass, ProfileConfig, RuleProfile, classify_leaves,
};
use gyre_actors::trajectory::stats::TreeStats;
use gyre_actors::trajectory::synth::{self, Sizes, SynthConfig, generate};
use gyre_actors::trajectory::{TitoRecord, TrajectoryTree, TreeConfig};
use gyre_runtime::rng::mix64;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub command: TraceCommand,
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Print each execution's tree: roots, nodes, leaves by class, unique vs
    /// expanded tokens, trainable tokens, shared-prefix lengths.
    Stats {
        /// JSONL trace file (`-` for stdin).
        file: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Print the trajectories admission would train, per execution.
    Admit {
        file: PathBuf,
        /// Most trajectories admitted per execution.
        #[arg(long, default_value_t = 5)]
        jmax: usize,
        /// Seed of the draws; each execution's stream is derived from it and
        /// the execution's name, so it does not depend on the other lines.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Write a synthetic harness trace (JSONL) on stdout.
    Synth {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 1)]
        executions: usize,
        #[arg(long, value_enum, default_value_t = Preset::Small)]
        preset: Preset,
        /// Leave out the `role` field, so that a profile must classify.
        #[arg(long)]
        no_roles: bool,
    },
}

#[derive(Debug, Args)]
pub struct Common {
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Harness profile: `claude-code` (thread `main` or no thread is the main
    /// agent), `generic`, `synthetic` (token markers of `gyre trace synth`),
    /// or the path of a JSON profile (see `ProfileConfig`).
    #[arg(long, default_value = "claude-code")]
    pub profile: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// About 25 calls: a main agent, one compaction, two sub-agents.
    Small,
    /// The reference execution of SPEC 3.2 (636 calls) with tiny messages.
    Reference,
}

pub fn run(args: TraceArgs) -> Result<()> {
    match args.command {
        TraceCommand::Stats { file, common } => {
            let profile = load_profile(&common.profile)?;
            let loaded = load(&file, &profile)?;
            let report = stats_report(&loaded, &profile)?;
            print(&report, common.json, render_stats)
        }
        TraceCommand::Admit {
            file,
            jmax,
            seed,
            common,
        } => {
            let profile = load_profile(&common.profile)?;
            let loaded = load(&file, &profile)?;
            let report = admit_report(&loaded, &profile, jmax, seed)?;
            print(&report, common.json, render_admit)
        }
        TraceCommand::Synth {
            seed,
            executions,
            preset,
            no_roles,
        } => write_synth(seed, executions, preset, !no_roles),
    }
}

fn load_profile(spec: &str) -> Result<RuleProfile> {
    let config = match spec {
        "claude-code" => ProfileConfig::claude_code_by_thread(None),
        "generic" => ProfileConfig::generic(None),
        "synthetic" => synth::profile(),
        path => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading profile {path}"))?;
            serde_json::from_str(&text).with_context(|| format!("parsing profile {path}"))?
        }
    };
    Ok(RuleProfile::new(config)?)
}

/// A line that was not used, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub line: usize,
    pub error: String,
}

struct Loaded {
    trees: Vec<TrajectoryTree>,
    skipped: Vec<Skipped>,
}

fn load(path: &Path, profile: &RuleProfile) -> Result<Loaded> {
    let reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?)
    };
    let mut trees: Vec<TrajectoryTree> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line_no = i + 1;
        let line = line.with_context(|| format!("{}: reading line {line_no}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let outcome = serde_json::from_str::<TitoRecord>(&line)
            .map_err(|e| e.to_string())
            .and_then(|rec| {
                if let Some(role) = &rec.role
                    && profile.class_by_name(role).is_none()
                {
                    return Err(format!(
                        "role {role:?} is not a class of profile {} ({})",
                        profile.name(),
                        profile.classes().join(", ")
                    ));
                }
                let at = *index.entry(rec.execution.clone()).or_insert_with(|| {
                    trees.push(TrajectoryTree::new(&rec.execution, TreeConfig::default()));
                    trees.len() - 1
                });
                trees[at]
                    .insert(&rec)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        if let Err(error) = outcome {
            eprintln!("{}:{line_no}: skipped: {error}", path.display());
            skipped.push(Skipped {
                line: line_no,
                error,
            });
        }
    }
    // An execution whose every line was rejected has an empty tree.
    trees.retain(|t| !t.calls().is_empty());
    Ok(Loaded { trees, skipped })
}

fn print<T: Serialize>(report: &T, json: bool, text: fn(&T) -> String) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, report)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", text(report))?;
    }
    Ok(())
}

/// One candidate trajectory in `stats`.
#[derive(Debug, Serialize)]
pub struct CandidateReport {
    pub leaf: u32,
    pub class: String,
    pub call_id: String,
    pub thread: Option<String>,
    pub path_tokens: u64,
    pub path_messages: u64,
    pub trainable_on_path: u64,
    pub shared_prefix_tokens: u64,
    pub shared_prefix_messages: u64,
}

#[derive(Debug, Serialize)]
pub struct ExecutionStats {
    pub execution: String,
    pub calls: usize,
    /// Distinct first messages (see `TreeStats::roots`).
    pub roots: usize,
    pub token_roots: usize,
    pub nodes: usize,
    pub leaves: usize,
    pub leaves_by_class: BTreeMap<String, usize>,
    pub unique_tokens: u64,
    pub expanded_tokens: u64,
    pub trainable_tokens: u64,
    pub unique_messages: u64,
    pub expanded_messages: u64,
    pub candidates: Vec<CandidateReport>,
}

#[derive(Debug, Serialize)]
pub struct StatsReport {
    pub executions: Vec<ExecutionStats>,
    pub skipped: Vec<Skipped>,
}

fn class_name(profile: &RuleProfile, c: &LeafClass) -> String {
    profile.classes()[usize::from(c.class.0)].clone()
}

fn stats_report(loaded: &Loaded, profile: &RuleProfile) -> Result<StatsReport> {
    let mut executions = Vec::new();
    for tree in &loaded.trees {
        let s: TreeStats = tree.stats();
        let classes = classify_leaves(tree, profile)
            .with_context(|| format!("classifying leaves of {}", tree.execution()))?;
        let mut leaves_by_class: BTreeMap<String, usize> =
            profile.classes().iter().map(|c| (c.clone(), 0)).collect();
        let mut candidates = Vec::new();
        for (l, c) in s.leaves.iter().zip(&classes) {
            let class = class_name(profile, c);
            *leaves_by_class.entry(class.clone()).or_default() += 1;
            candidates.push(CandidateReport {
                leaf: l.leaf.index() as u32,
                class,
                call_id: l.call_id.clone(),
                thread: l.thread.clone(),
                path_tokens: l.path_tokens,
                path_messages: l.path_messages,
                trainable_on_path: l.trainable_on_path,
                shared_prefix_tokens: l.shared_prefix_tokens,
                shared_prefix_messages: l.shared_prefix_messages,
            });
        }
        executions.push(ExecutionStats {
            execution: s.execution,
            calls: s.calls,
            roots: s.roots,
            token_roots: s.token_roots,
            nodes: s.nodes,
            leaves: candidates.len(),
            leaves_by_class,
            unique_tokens: s.unique_tokens,
            expanded_tokens: s.expanded_tokens,
            trainable_tokens: s.trainable_tokens,
            unique_messages: s.unique_messages,
            expanded_messages: s.expanded_messages,
            candidates,
        });
    }
    Ok(StatsReport {
        executions,
        skipped: loaded.skipped.clone(),
    })
}

fn render_stats(r: &StatsReport) -> String {
    let mut s = String::new();
    for e in &r.executions {
        let by_class: Vec<String> = e
            .leaves_by_class
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        s += &format!(
            "execution {}: {} calls, {} roots, {} nodes, {} leaves ({})\n",
            e.execution,
            e.calls,
            e.roots,
            e.nodes,
            e.leaves,
            by_class.join(", ")
        );
        s += &format!(
            "  tokens: {} unique, {} expanded ({:.2}x), {} trainable\n",
            e.unique_tokens,
            e.expanded_tokens,
            e.expanded_tokens as f64 / e.unique_tokens.max(1) as f64,
            e.trainable_tokens
        );
        s += &format!(
            "  messages: {} unique, {} expanded\n",
            e.unique_messages, e.expanded_messages
        );
        s += &format!(
            "  {:>6}  {:<18} {:<10} {:<10} {:>9} {:>6} {:>9} {:>13} {:>10}\n",
            "leaf",
            "class",
            "call",
            "thread",
            "tokens",
            "msgs",
            "trainable",
            "shared tokens",
            "shared msgs"
        );
        for c in &e.candidates {
            s += &format!(
                "  {:>6}  {:<18} {:<10} {:<10} {:>9} {:>6} {:>9} {:>13} {:>10}\n",
                c.leaf,
                c.class,
                c.call_id,
                c.thread.as_deref().unwrap_or("-"),
                c.path_tokens,
                c.path_messages,
                c.trainable_on_path,
                c.shared_prefix_tokens,
                c.shared_prefix_messages
            );
        }
    }
    if !r.skipped.is_empty() {
        s += &format!("{} line(s) skipped (see stderr)\n", r.skipped.len());
    }
    s
}

/// One admitted trajectory in `admit`.
#[derive(Debug, Serialize)]
pub struct AdmittedReport {
    pub leaf: u32,
    pub class: String,
    /// Target tokens fixed for this trajectory.
    pub targets: u64,
    pub path_tokens: u64,
    pub call_id: String,
}

#[derive(Debug, Serialize)]
pub struct ExecutionAdmission {
    pub execution: String,
    pub trainable_tokens: u64,
    pub unique_tokens: u64,
    pub expanded_tokens: u64,
    pub candidates: usize,
    pub admitted: Vec<AdmittedReport>,
}

#[derive(Debug, Serialize)]
pub struct AdmitReport {
    pub jmax: usize,
    pub seed: u64,
    pub executions: Vec<ExecutionAdmission>,
    pub skipped: Vec<Skipped>,
}

/// FNV-1a: a stable hash of an execution name for its draw stream.
fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn admit_report(
    loaded: &Loaded,
    profile: &RuleProfile,
    jmax: usize,
    seed: u64,
) -> Result<AdmitReport> {
    let mut executions = Vec::new();
    for tree in &loaded.trees {
        let classes = classify_leaves(tree, profile)
            .with_context(|| format!("classifying leaves of {}", tree.execution()))?;
        let mut rng = ChaCha8Rng::seed_from_u64(mix64(seed ^ name_hash(tree.execution())));
        let a = admit(tree, &classes, jmax, &mut rng);
        let stats = tree.stats();
        executions.push(ExecutionAdmission {
            execution: tree.execution().to_string(),
            trainable_tokens: a.trainable_tokens,
            unique_tokens: stats.unique_tokens,
            expanded_tokens: stats.expanded_tokens,
            candidates: classes.len(),
            admitted: a
                .trajectories
                .iter()
                .map(|r| AdmittedReport {
                    leaf: r.leaf.index() as u32,
                    class: profile.classes()[usize::from(r.class.0)].clone(),
                    targets: r.targets,
                    path_tokens: u64::from(tree.depth_end(r.leaf)),
                    call_id: tree.call(tree.creator(r.leaf)).call_id.clone(),
                })
                .collect(),
        });
    }
    Ok(AdmitReport {
        jmax,
        seed,
        executions,
        skipped: loaded.skipped.clone(),
    })
}

fn render_admit(r: &AdmitReport) -> String {
    let mut s = String::new();
    for e in &r.executions {
        let targeted: u64 = e.admitted.iter().map(|a| a.targets).sum();
        s += &format!(
            "execution {}: {} of {} candidates admitted (jmax {}, seed {}); {} of {} trainable tokens targeted\n",
            e.execution,
            e.admitted.len(),
            e.candidates,
            r.jmax,
            r.seed,
            targeted,
            e.trainable_tokens
        );
        for (i, a) in e.admitted.iter().enumerate() {
            s += &format!(
                "  #{} leaf {} ({}, call {}): {} targets on a {}-token path\n",
                i + 1,
                a.leaf,
                a.class,
                a.call_id,
                a.targets,
                a.path_tokens
            );
        }
    }
    if !r.skipped.is_empty() {
        s += &format!("{} line(s) skipped (see stderr)\n", r.skipped.len());
    }
    s
}

fn write_synth(seed: u64, executions: usize, preset: Preset, roles: bool) -> Result<()> {
    if executions == 0 {
        bail!("--executions must be at least 1");
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for i in 0..executions {
        let s = seed.wrapping_add(i as u64);
        let mut cfg = match preset {
            Preset::Small => SynthConfig::small(s, format!("exec-{i}")),
            Preset::Reference => {
                let mut c = SynthConfig::reference(s, Sizes::tiny());
                c.execution = format!("exec-{i}");
                c.retry_probability = 0.02;
                c
            }
        };
        cfg.emit_roles = roles;
        let ex = generate(&cfg).context("generating a synthetic execution")?;
        for r in &ex.records {
            serde_json::to_writer(&mut out, r)?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}
