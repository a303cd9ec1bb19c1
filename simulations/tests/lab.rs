//! The lab's claims, at a reduced scale that runs in seconds in debug
//! builds (B and C_e divided by 4, the model calls by 32, same proportions
//! of work to capacity and the same step times; `gyre simulate` runs the
//! full scale):
//! - elastic is faster than both baselines on all four workloads at both
//!   staleness targets, with the staleness of every run measured from the
//!   trained groups and matched to the target;
//! - a comparison is deterministic in its seed;
//! - the fixed split with a multi-step burst (the ablation's A2) keeps every
//!   invariant of SPEC 2.

use gyre_actors::sched::{Policy, SchedConfig};
use gyre_simulations::lab::{self, RunOptions};
use gyre_simulations::run::run_checked;
use gyre_simulations::scenario::{self, Selection};
use gyre_simulations::world::ClusterConfig;

const SCALE: u32 = 4;
const CALLS: u32 = 32;

fn compare(name: &str, staleness: f64, steps: u64, seed: u64) -> lab::Comparison {
    let s = scenario::load(name)
        .unwrap()
        .scaled_with(SCALE, CALLS)
        .unwrap();
    let runs = s.runs(&Selection::All, Some(staleness)).unwrap();
    let opts = RunOptions::new(steps, seed);
    lab::compare(&s, &runs, staleness, &opts, 2, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// Long enough for several bursts of every policy.
const STEPS: u64 = 24;

#[test]
fn elastic_beats_both_baselines_everywhere_at_matched_staleness() {
    let mut failures = Vec::new();
    for name in [
        "nl2repo-122b",
        "deepswe-122b",
        "terminalbench-122b",
        "nl2repo-2.4t",
    ] {
        for staleness in [1.0, 1.5] {
            let c = compare(name, staleness, STEPS, 1);
            let hours = |p: &str| c.result(p).unwrap().total_hours;
            eprintln!(
                "{name} E[d] = {staleness}: elastic {:.1} h, colocate {:.1} h, async {:.1} h; \
                 speed-up {:.2} vs async, {:.2} vs colocate",
                hours("elastic"),
                hours("colocate"),
                hours("async"),
                c.speedup("elastic", "async").unwrap(),
                c.speedup("elastic", "colocate").unwrap(),
            );
            for base in ["async", "colocate"] {
                if hours("elastic") >= hours(base) {
                    failures.push(format!("{name} E[d] = {staleness}: not faster than {base}"));
                }
            }
            for r in &c.results {
                assert_eq!(r.steps, STEPS);
                assert_eq!(r.target_staleness, staleness, "{}", r.name);
                // Measured on the trained groups, over the steady state.
                eprintln!(
                    "  {:<8} staleness mean {:.3} (all steps {:.3}), max {}, token-weighted {:.3}",
                    r.name,
                    r.mean_staleness,
                    r.mean_staleness_all_steps,
                    r.max_staleness,
                    r.token_weighted_staleness
                );
                if (r.mean_staleness - staleness).abs() > 0.15 {
                    failures.push(format!(
                        "{name} {}: staleness {} against {staleness}",
                        r.name, r.mean_staleness
                    ));
                }
                let s = r.shares();
                assert!((s.rollout + s.training + s.switching + s.idle - 1.0).abs() < 1e-9);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_comparison_is_deterministic_in_its_seed() {
    let json = |seed| serde_json::to_string(&compare("terminalbench-122b", 1.0, 3, seed)).unwrap();
    let a = json(5);
    assert_eq!(a, json(5));
    assert_ne!(a, json(6));
    for key in [
        "\"scenario\"",
        "\"seed\"",
        "\"steps\"",
        "\"results\"",
        "\"name\"",
        "\"total_hours\"",
        "\"mean_staleness\"",
        "\"max_staleness\"",
        "\"gpu_idle_fraction\"",
        "\"speedups\"",
    ] {
        assert!(a.contains(key), "{key} missing");
    }
}

#[test]
fn the_ablation_variants_all_run() {
    let s = scenario::load("ablation-nl2repo-122b")
        .unwrap()
        .scaled(16)
        .unwrap();
    let runs = s.runs(&Selection::All, None).unwrap();
    let c = lab::compare(&s, &runs, 1.5, &RunOptions::new(3, 2), 2, &|_, _| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.results.len(), 11);
    for r in &c.results {
        assert_eq!(r.steps, 3, "{}", r.name);
        assert!(r.total_hours > 0.0);
    }
    // E2's 8-node cells train twice as fast per cell as E0's 4-node cells,
    // with half as many cells: the same training throughput.
    assert_eq!(c.result("E2").unwrap().cells, 4);
}

#[test]
fn a_fixed_split_with_multi_step_bursts_keeps_every_invariant() {
    for seed in 0..8 {
        let sched = SchedConfig {
            cells: 4,
            cell_capacity: 3,
            pool_capacity: 2,
            group_size: 2,
            batch_groups: 2,
            phi: 0.5,
            mu: 3,
            policy: Policy::Async { train_cells: 2 },
            target_steps: 6,
            ..SchedConfig::default()
        };
        let r = run_checked(&ClusterConfig::new(sched, seed)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.steps, 6);
        assert_eq!(r.max_members, 2);
    }
}

#[test]
fn calibrated_runs_keep_every_invariant() {
    // The calibrated backends under the per-event checker: a small
    // terminal-tasks cluster, every policy.
    let s = scenario::load("terminalbench-122b")
        .unwrap()
        .scaled(24)
        .unwrap();
    let runs = s.runs(&Selection::All, Some(1.5)).unwrap();
    let mut opts = RunOptions::new(4, 3);
    opts.check = true;
    let c = lab::compare(&s, &runs, 1.5, &opts, 2, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.results.iter().all(|r| r.steps == 4));
}
