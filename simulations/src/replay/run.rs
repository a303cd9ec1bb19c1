//! Replaying a record: the simulated cluster of the recorded scheduling
//! configuration, driven by the recorded workload and priced by the
//! recorded costs, run until it has trained as many steps and is quiet
//! (as `gyre train` runs); then its step times and role changes beside the
//! recorded ones.

use std::sync::Arc;

use gyre_actors::sched::SampleMode;
use gyre_runtime::sim::{Latency, LinkModel};
use gyre_runtime::{MILLIS, Nanos};
use serde::Serialize;

use super::costs::replay_costs;
use super::observe::{observe, switches};
use super::schema::{Recording, Role, Switch};
use super::workload::ReplayWorkload;
use crate::world::{ClusterConfig, build};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("the record holds no execution to replay")]
    Empty,
    #[error("the record holds no training step to compare with")]
    NoSteps,
    #[error("invalid cluster: {0}")]
    Config(String),
    #[error(transparent)]
    Sim(#[from] Box<gyre_runtime::sim::SimError>),
    #[error("the replay stalled after {done} of {steps} steps")]
    Stalled { done: u64, steps: u64 },
}

/// One step, recorded and simulated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepRow {
    pub step: u64,
    /// Step time: since the previous step's end (the start, for step 1).
    pub recorded_ns: Nanos,
    pub simulated_ns: Nanos,
    /// (simulated − recorded) / recorded.
    pub error: f64,
}

/// One burst's role changes, recorded and simulated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BurstRow {
    pub burst: u64,
    /// `cell 1 → training`, in order.
    pub recorded: Vec<String>,
    pub simulated: Vec<String>,
    pub same: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub host: String,
    pub seed: u64,
    pub steps: Vec<StepRow>,
    pub bursts: Vec<BurstRow>,
    /// Mean and largest |error| over the steps.
    pub mean_abs_error: f64,
    pub max_abs_error: f64,
    /// Error of the time to the last step.
    pub total_error: f64,
    pub same_role_changes: bool,
    pub recorded_switches: Vec<Switch>,
    pub simulated_switches: Vec<Switch>,
    /// When each step ended, recorded and simulated.
    pub recorded_ends: Vec<Nanos>,
    pub simulated_ends: Vec<Nanos>,
    /// When the replay dispatched execution `i` (the recorded times are
    /// the record's `dispatch_ns`).
    pub simulated_dispatch: Vec<Nanos>,
    pub cells: u32,
    pub events: u64,
    pub trace_hash: u64,
}

/// The simulated cluster's configuration for replaying `rec`.
pub fn replay_config(rec: &Recording) -> Result<ClusterConfig, ReplayError> {
    let workload = Arc::new(ReplayWorkload::from_recording(rec).ok_or(ReplayError::Empty)?);
    let h = &rec.header;
    let mut sched = h.sched.clone();
    sched.samples = SampleMode::Counted;
    sched.micro_tokens = counted_budget(rec, sched.micro_tokens);
    let mut cfg = ClusterConfig::new(sched, h.seed);
    cfg.costs = replay_costs(rec, workload);
    cfg.link = LinkModel {
        latency: Latency::Const(h.link_ns),
        loss: 0.0,
        duplicate: 0.0,
        fifo: true,
    };
    cfg.max_events = 50_000_000;
    Ok(cfg)
}

/// The simulator packs each execution as its output tokens; a recorded
/// run packed whole rows (prompts and outputs of its trajectory trees).
/// The micro-step budget is scaled by the recorded ratio of packed tokens
/// to output tokens, so a step takes as many micro-steps as it did.
fn counted_budget(rec: &Recording, budget: u64) -> u64 {
    let packed: u64 = rec
        .steps
        .iter()
        .flat_map(|s| &s.micro_steps)
        .map(|m| m.tokens)
        .sum();
    let steps = rec.steps.len() as u64;
    let h = &rec.header.sched;
    let per_step_execs = u64::from(h.batch_groups) * u64::from(h.group_size);
    let outputs: Vec<u64> = rec
        .executions
        .iter()
        .map(|e| e.calls.iter().map(|c| c.output_tokens).sum())
        .collect();
    if packed == 0 || steps == 0 || outputs.is_empty() {
        return budget;
    }
    let mean_output = outputs.iter().sum::<u64>() as f64 / outputs.len() as f64;
    let counted_per_step = mean_output * per_step_execs as f64;
    let packed_per_step = packed as f64 / steps as f64;
    if counted_per_step <= 0.0 {
        return budget;
    }
    ((budget as f64 * counted_per_step / packed_per_step).round() as u64).max(1)
}

fn step_times(ends: &[Nanos]) -> Vec<Nanos> {
    let mut prev = 0;
    ends.iter()
        .map(|e| {
            let d = e.saturating_sub(prev);
            prev = *e;
            d
        })
        .collect()
}

fn label(s: &Switch) -> String {
    let to = match s.to {
        Role::Training => "training",
        Role::Rollout => "rollout",
    };
    format!("cell {} → {to}", s.cell)
}

/// Replays `rec` and compares.
pub fn replay(rec: &Recording) -> Result<ReplayReport, ReplayError> {
    if rec.steps.is_empty() {
        return Err(ReplayError::NoSteps);
    }
    let cfg = replay_config(rec)?;
    let steps = rec.steps.len() as u64;
    let mut cluster = build(&cfg).map_err(|e| ReplayError::Config(e.to_string()))?;
    let seen = observe(&mut cluster.sim, cluster.sched);
    loop {
        let until = cluster.sim.now().saturating_add(100 * MILLIS);
        let stats = cluster.sim.run_until(until).map_err(Box::new)?;
        let done = cluster
            .sim
            .actor(cluster.sched)
            .map_or(0, |s| s.steps_done());
        // As the recorded run did: on until the cluster is quiet, so the
        // cells' last return to rollout is compared too.
        if cluster.sim.pending() == 0 && done >= steps {
            break;
        }
        if stats.limited || cluster.sim.pending() == 0 {
            return Err(ReplayError::Stalled { done, steps });
        }
    }
    let sim_ends: Vec<Nanos> = cluster
        .backends
        .trainers
        .first()
        .and_then(|t| cluster.sim.actor(*t))
        .map(|t| t.updates().iter().map(|(_, at)| *at).collect())
        .unwrap_or_default();
    let rec_ends: Vec<Nanos> = rec.steps.iter().map(|s| s.end_ns).collect();
    let mu = rec.header.sched.mu;
    let simulated_switches = switches(&seen.borrow().changes, &sim_ends, mu, &[]);
    let rows: Vec<StepRow> = step_times(&rec_ends)
        .into_iter()
        .zip(step_times(&sim_ends))
        .zip(&rec.steps)
        .map(|((r, s), st)| StepRow {
            step: st.step,
            recorded_ns: r,
            simulated_ns: s,
            error: (s as f64 - r as f64) / (r.max(1)) as f64,
        })
        .collect();
    let bursts = burst_rows(&rec.switches, &simulated_switches);
    let sim_ends: Vec<Nanos> = sim_ends.into_iter().take(rec_ends.len()).collect();
    let errs: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    let total_error = match (rec_ends.last(), sim_ends.get(rows.len().saturating_sub(1))) {
        (Some(r), Some(s)) => (*s as f64 - *r as f64) / (*r).max(1) as f64,
        _ => 0.0,
    };
    Ok(ReplayReport {
        host: rec.header.host.clone(),
        seed: rec.header.seed,
        mean_abs_error: errs.iter().sum::<f64>() / errs.len().max(1) as f64,
        max_abs_error: errs.iter().copied().fold(0.0, f64::max),
        total_error,
        same_role_changes: bursts.iter().all(|b| b.same),
        steps: rows,
        bursts,
        recorded_switches: rec.switches.clone(),
        simulated_switches,
        cells: rec.header.sched.cells,
        recorded_ends: rec_ends,
        simulated_ends: sim_ends,
        simulated_dispatch: seen.borrow().dispatch.clone(),
        events: cluster.sim.events(),
        trace_hash: cluster.sim.trace_hash(),
    })
}

fn burst_rows(recorded: &[Switch], simulated: &[Switch]) -> Vec<BurstRow> {
    let last = recorded
        .iter()
        .chain(simulated)
        .map(|s| s.burst)
        .max()
        .unwrap_or(0);
    let of = |all: &[Switch], b: u64| -> Vec<String> {
        let mut v: Vec<&Switch> = all.iter().filter(|s| s.burst == b).collect();
        v.sort_by_key(|s| (s.begin_ns, s.cell));
        v.into_iter().map(label).collect()
    };
    (0..=last)
        .map(|b| {
            let (r, s) = (of(recorded, b), of(simulated, b));
            BurstRow {
                burst: b,
                same: r == s,
                recorded: r,
                simulated: s,
            }
        })
        .filter(|row| !row.recorded.is_empty() || !row.simulated.is_empty())
        .collect()
}

/// The side-by-side report, as text.
pub fn table(r: &ReplayReport) -> String {
    use std::fmt::Write;
    let ms = |n: Nanos| n as f64 / MILLIS as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replay of a {} run (seed {}): step times, recorded vs simulated",
        r.host, r.seed
    );
    let _ = writeln!(
        out,
        "{:>5} {:>14} {:>14} {:>8}",
        "step", "recorded ms", "simulated ms", "error"
    );
    for s in &r.steps {
        let _ = writeln!(
            out,
            "{:>5} {:>14.3} {:>14.3} {:>7.1}%",
            s.step,
            ms(s.recorded_ns),
            ms(s.simulated_ns),
            s.error * 100.0
        );
    }
    let _ = writeln!(
        out,
        "per-step error: mean {:.1}%, max {:.1}%; time to the last step {:+.1}%",
        r.mean_abs_error * 100.0,
        r.max_abs_error * 100.0,
        r.total_error * 100.0
    );
    let _ = writeln!(out, "\nrole changes per burst, recorded | simulated");
    for b in &r.bursts {
        let _ = writeln!(
            out,
            "{:>5} {} {} | {}",
            b.burst,
            if b.same { " " } else { "≠" },
            b.recorded.join(", "),
            b.simulated.join(", ")
        );
    }
    let same = r.bursts.iter().filter(|b| b.same).count();
    let _ = writeln!(
        out,
        "same role changes in {same} of {} bursts; {} simulator events",
        r.bursts.len(),
        r.events
    );
    out
}
