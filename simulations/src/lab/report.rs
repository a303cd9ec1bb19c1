//! Reports of a comparison: the terminal table, the speed-ups beside the
//! published ones, the workload profile beside its targets, and CSV files.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::scenario::Scenario;
use crate::workload::profile::{Profile, Targets};

use super::Comparison;
use super::breakdown::Phase;
use super::timeline::CellState;

/// The baselines each run is compared with: Async and Colocate for a policy
/// comparison; for variants, the first variant of each policy.
pub fn baselines(c: &Comparison) -> Vec<String> {
    let policies = ["async", "colocate"];
    if policies.iter().all(|p| c.result(p).is_some()) {
        return policies.iter().map(|p| (*p).to_owned()).collect();
    }
    let mut out: Vec<String> = Vec::new();
    for policy in ["async", "colocate", "elastic"] {
        if let Some(r) = c.results.iter().find(|r| r.policy == policy) {
            out.push(r.name.clone());
        }
    }
    out
}

/// The table of `gyre simulate`.
pub fn table(c: &Comparison, scenario: &Scenario) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {}: {}\n{} steps, target E[d] = {}, seed {}\n",
        scenario.name, scenario.description, c.steps, c.staleness, c.seed
    );
    let _ = writeln!(
        s,
        "{:<9} {:>9} {:>8} {:>7} {:>21} {:>25} {:>8} {:>9}",
        "run",
        "(φ, μ)",
        "total h",
        "step h",
        "staleness mean/max/tok",
        "GPU roll/train/switch/idle",
        "reroute",
        "trans/bst"
    );
    for r in &c.results {
        let _ = writeln!(
            s,
            "{:<9} {:>9} {:>8.2} {:>7.3} {:>8.2}/{:>2}/{:>4.2} ({:.1}) {:>4.0}%/{:>3.0}%/{:>3.1}%/{:>3.0}% {:>8.3} {:>9.2}",
            r.name,
            format!("({}, {})", r.phi, r.mu),
            r.total_hours,
            r.median_step_hours,
            r.mean_staleness,
            r.max_staleness,
            r.token_weighted_staleness,
            r.target_staleness,
            r.gpu_rollout_fraction * 100.0,
            r.gpu_training_fraction * 100.0,
            r.gpu_switching_fraction * 100.0,
            r.gpu_idle_fraction * 100.0,
            r.reroutes_per_execution,
            r.transitions_per_burst,
        );
    }
    let _ = writeln!(
        s,
        "\n(step h: median step time; staleness: steady-state group-weighted mean / max / \
         token-weighted mean (target); reroute: reroutes per execution; trans/bst: cells \
         moved to training per burst)"
    );
    let bases = baselines(c);
    if !bases.is_empty() {
        let _ = write!(s, "\nspeed-up  ");
        for b in &bases {
            let _ = write!(s, " {:>12}", format!("vs {b}"));
        }
        let _ = writeln!(s);
        for r in &c.results {
            let _ = write!(s, "{:<10}", r.name);
            for b in &bases {
                match c.speedup(&r.name, b) {
                    Some(x) => {
                        let _ = write!(s, " {x:>12.3}");
                    }
                    None => {
                        let _ = write!(s, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(s);
        }
    }
    if let Some(p) = scenario
        .published
        .iter()
        .find(|p| (p.staleness - c.staleness).abs() < 1e-9)
        && c.result("elastic").is_some()
    {
        let range = |r: [f64; 2]| {
            if r[0] == r[1] {
                format!("{:.3}", r[0])
            } else {
                format!("{:.2}–{:.2}", r[0], r[1])
            }
        };
        let _ = writeln!(
            s,
            "published (SPEC 5): elastic vs async {}, vs colocate {}",
            range(p.vs_async),
            range(p.vs_colocate)
        );
        if let Some(h) = p.hours {
            let _ = writeln!(
                s,
                "published hours: elastic {:.2}, colocate {:.2}, async {:.2}",
                h.elastic, h.colocate, h.fixed
            );
        }
    }
    s.push_str(&breakdown_table(c));
    let _ = writeln!(s, "\nrealised workload in the cluster:");
    for r in &c.results {
        let _ = writeln!(
            s,
            "  {:<9} {} executions, mean {:.2} h, harness timeouts {:.2}%, overall timeouts {:.2}%, {:.0}K tokens, {} events",
            r.name,
            r.executions_finished,
            r.mean_execution_hours,
            r.harness_timeout_share * 100.0,
            r.overall_timeout_share * 100.0,
            r.mean_lifetime_tokens / 1e3,
            r.events
        );
    }
    s
}

/// GPU-hours by role and phase, one row per run, as shares of the run's
/// GPU-hours (see `lab::breakdown`).
pub fn breakdown_table(c: &Comparison) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nGPU-hours by phase (% of the run's GPU-hours; integrated from events):"
    );
    let _ = write!(s, "{:<9} {:>9}", "run", "GPU-h");
    let short = [
        "busy", "tail", "wait-tr", "idle", "sw→tr", "sw→ro", "wu/dr", "train", "optim", "publ",
        "tr-idle",
    ];
    for h in short {
        let _ = write!(s, " {h:>7}");
    }
    let _ = write!(s, " {:>7}", "tail-mv");
    let _ = writeln!(s);
    for r in &c.results {
        let g = &r.gpu_hours;
        let _ = write!(s, "{:<9} {:>9.0}", r.name, g.total);
        for p in Phase::ALL {
            let share = if g.total > 0.0 {
                g.get(p) / g.total
            } else {
                0.0
            };
            let _ = write!(s, " {:>6.1}%", share * 100.0);
        }
        let movable = if g.total > 0.0 {
            g.waiting_last_groups_movable / g.total
        } else {
            0.0
        };
        let _ = writeln!(s, " {:>6.1}%", movable * 100.0);
    }
    let _ = writeln!(
        s,
        "(busy: occupied rollout slots; tail: free slots while the batch waits for its last \
         groups; wait-tr: free slots while training or publication is on the critical path; \
         idle: free slots with work queued; sw→tr / sw→ro: switching; wu/dr: pipeline warm-up, \
         drain and group set-up; optim: gather, update, broadcast; publ: waiting on a \
         publication; tr-idle: a training cell with nothing to compute; tail-mv: the part of tail \
         during which the watermark rule already allowed the next cell to leave rollout)"
    );
    s
}

/// The profile beside its targets.
pub fn profile_table(p: &Profile, targets: &Targets, tolerance: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "workload profile: {} queries, {} executions sampled from the model\n",
        p.queries, p.executions
    );
    let _ = writeln!(
        s,
        "{:<38} {:>12} {:>12} {:>9}",
        "statistic", "model", "target", "error"
    );
    for row in p.rows(targets) {
        let fmt = |v: f64| {
            if row.share {
                format!("{:.2}%", v * 100.0)
            } else if v >= 1_000.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        let (target, err) = match (row.target, row.rel_error) {
            (Some(t), Some(e)) => (
                fmt(t),
                format!(
                    "{:.1}%{}",
                    e * 100.0,
                    if row.within(tolerance) { "" } else { " !" }
                ),
            ),
            _ => ("-".to_owned(), String::new()),
        };
        let _ = writeln!(
            s,
            "{:<38} {:>12} {:>12} {:>9}",
            row.name,
            fmt(row.value),
            target,
            err
        );
    }
    s
}

/// Writes `runs.csv`, `steps.csv` and `timeline.csv` into `dir`.
pub fn write_csv(c: &Comparison, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut runs = std::fs::File::create(dir.join("runs.csv"))?;
    writeln!(
        runs,
        "name,policy,phi,mu,streaming,total_hours,median_step_hours,target_staleness,mean_staleness,max_staleness,token_weighted_staleness,gpu_rollout,gpu_training,gpu_switching,gpu_idle,reroutes_per_execution,transitions_per_burst,executions,mean_execution_hours,events"
    )?;
    for r in &c.results {
        writeln!(
            runs,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.name,
            r.policy,
            r.phi,
            r.mu,
            r.streaming,
            r.total_hours,
            r.median_step_hours,
            r.target_staleness,
            r.mean_staleness,
            r.max_staleness,
            r.token_weighted_staleness,
            r.gpu_rollout_fraction,
            r.gpu_training_fraction,
            r.gpu_switching_fraction,
            r.gpu_idle_fraction,
            r.reroutes_per_execution,
            r.transitions_per_burst,
            r.executions_finished,
            r.mean_execution_hours,
            r.events
        )?;
    }
    let mut steps = std::fs::File::create(dir.join("steps.csv"))?;
    writeln!(steps, "name,step,end_hours,step_hours")?;
    for r in &c.results {
        let mut prev = 0.0;
        for (i, e) in r.step_end_hours.iter().enumerate() {
            writeln!(steps, "{},{},{},{}", r.name, i, e, e - prev)?;
            prev = *e;
        }
    }
    let mut tl = std::fs::File::create(dir.join("timeline.csv"))?;
    writeln!(tl, "name,row,from_hours,to_hours,state,occupancy")?;
    let h = |t: u64| t as f64 / 3.6e12;
    for r in &c.results {
        for row in &r.timeline.rows {
            for seg in &row.segments {
                let (state, occ) = match seg.state {
                    CellState::Rollout(t) => ("rollout", f64::from(t) / 10.0),
                    CellState::Switching => ("switching", 0.0),
                    CellState::Training => ("training", 0.0),
                    CellState::Idle => ("idle", 0.0),
                };
                writeln!(
                    tl,
                    "{},{},{},{},{},{}",
                    r.name,
                    row.label,
                    h(seg.from),
                    h(seg.to),
                    state,
                    occ
                )?;
            }
        }
    }
    Ok(())
}
