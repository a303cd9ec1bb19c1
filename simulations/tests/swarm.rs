//! The swarm: small clusters under seed-drawn fault plans (loss,
//! duplication, reordering, partitions), every invariant checked after
//! every event while the faults act, then liveness and exact accounting
//! once they heal (see `gyre_simulations::swarm`).
//!
//! `GYRE_SWARM_SEEDS=N` sets how many seeds run (default below); a failure
//! names its seed, and `GYRE_SEED=<seed> cargo test -p gyre-simulations
//! --test swarm` replays exactly that run.

use gyre_runtime::sim::check_seeds;
use gyre_simulations::run::RunError;
use gyre_simulations::swarm::run_swarm_seed;

const DEFAULT_SEEDS: u64 = 200;

#[test]
fn clusters_under_fault_plans_stay_safe_and_finish_once_healed() {
    let seeds = std::env::var("GYRE_SWARM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    let started = std::time::Instant::now();
    let totals = std::cell::RefCell::new((0u64, 0u64, 0u64, 0u64));
    check_seeds(seeds, 0, |seed| match run_swarm_seed(seed) {
        Ok(o) => {
            let mut t = totals.borrow_mut();
            t.0 += 1;
            t.1 += o.dropped;
            t.2 += o.duplicated;
            t.3 += o.resent;
            match o.error {
                None => Ok(()),
                Some(e) => Err(*e),
            }
        }
        Err(RunError::Sim(e)) => Err(*e),
        Err(RunError::Config(e)) => panic!("seed {seed} drew an invalid config: {e}"),
    });
    let (runs, dropped, copies, resent) = totals.into_inner();
    eprintln!(
        "swarm: {runs} seeds in {:.1} s; {dropped} messages dropped, {copies} duplicated, {resent} requests resent",
        started.elapsed().as_secs_f64()
    );
}
