//! The simulation lab: runs the policies (or variants) of a scenario side by
//! side and gathers what a scheduling researcher compares.
//!
//! - [`run`]: one run, sampled and read back into a [`RunResult`];
//! - [`breakdown`]: GPU-hours by role and phase, integrated from events;
//! - [`timeline`]: per-cell states over time, sampled for the plots;
//! - [`report`]: the terminal table, the speed-ups and the CSV files;
//! - [`plot`]: the SVG plots.
//!
//! Runs are independent simulations, so a comparison runs them on several
//! threads; each run is deterministic in its seed, so the comparison is too.

pub mod breakdown;
pub mod plot;
pub mod report;
pub mod run;
pub mod timeline;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::scenario::{RunSpec, Scenario};

pub use run::{LabError, RunOptions, RunResult};

/// A comparison: what `gyre simulate --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub scenario: String,
    pub seed: u64,
    pub steps: u64,
    /// Target E[d] of the pairs compared.
    pub staleness: f64,
    pub results: Vec<RunResult>,
    /// `speedups[a][b]`: run b's total hours over run a's.
    pub speedups: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Comparison {
    /// Run `name`'s speed-up over run `baseline`.
    pub fn speedup(&self, name: &str, baseline: &str) -> Option<f64> {
        self.speedups.get(name)?.get(baseline).copied()
    }

    pub fn result(&self, name: &str) -> Option<&RunResult> {
        self.results.iter().find(|r| r.name == name)
    }
}

/// Speed-ups of every run over every other one.
pub fn speedups(results: &[RunResult]) -> BTreeMap<String, BTreeMap<String, f64>> {
    results
        .iter()
        .map(|a| {
            let row = results
                .iter()
                .filter(|b| b.name != a.name && a.total_hours > 0.0)
                .map(|b| (b.name.clone(), b.total_hours / a.total_hours))
                .collect();
            (a.name.clone(), row)
        })
        .collect()
}

/// Runs `runs` of `scenario` on up to `threads` threads; `progress` hears
/// (run index, steps done).
pub fn compare(
    scenario: &Scenario,
    runs: &[RunSpec],
    staleness: f64,
    opts: &RunOptions,
    threads: usize,
    progress: &(dyn Fn(usize, u64) + Sync),
) -> Result<Comparison, LabError> {
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<Result<RunResult, LabError>>>> =
        Mutex::new((0..runs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, runs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(spec) = runs.get(i) else {
                        break;
                    };
                    let r = run::run(scenario, spec, opts, &|done| progress(i, done));
                    if let Ok(mut s) = slots.lock() {
                        s[i] = Some(r);
                    }
                }
            });
        }
    });
    let slots = slots.into_inner().unwrap_or_default();
    let mut results = Vec::with_capacity(runs.len());
    for (slot, spec) in slots.into_iter().zip(runs) {
        match slot {
            Some(r) => results.push(r?),
            None => {
                return Err(LabError::Broken {
                    run: spec.name.clone(),
                    message: "the run's thread died".to_owned(),
                });
            }
        }
    }
    Ok(Comparison {
        scenario: scenario.name.clone(),
        seed: opts.seed,
        steps: opts.steps,
        staleness,
        speedups: speedups(&results),
        results,
    })
}
