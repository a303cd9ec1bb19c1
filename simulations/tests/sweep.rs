//! The seed sweep: 1,000 small random clusters (every policy, K from 1 to
//! 8, with and without a standalone pool, μ from 1 to 4, φ from 0 to 2,
//! streaming on and off, random workloads, failures and switch costs), each
//! run to quiescence with SPEC 2's invariants checked after every event and
//! liveness and exactly-once accounting checked at the end.
//!
//! A failure names its seed; `GYRE_SEED=<seed> cargo test -p
//! gyre-simulations --test sweep` replays exactly that run.

use std::cell::RefCell;
use std::collections::BTreeMap;

use gyre_actors::sched::Policy;
use gyre_runtime::sim::check_seeds;
use gyre_simulations::random::small_config;
use gyre_simulations::run::{RunError, run_checked};

#[test]
fn a_thousand_random_clusters_keep_every_invariant() {
    let coverage: RefCell<BTreeMap<&'static str, u64>> = RefCell::new(BTreeMap::new());
    let count = |what: &'static str, yes: bool| {
        if yes {
            *coverage.borrow_mut().entry(what).or_default() += 1;
        }
    };
    check_seeds(1_000, 0, |seed| {
        let cfg = small_config(seed);
        match run_checked(&cfg) {
            Ok(r) => {
                count("runs", true);
                count("core returned at a burst end", r.core_returns > 0);
                count("core stayed at a burst end", r.core_stays > 0);
                count("executions rerouted", r.reroutes > 0);
                count("an execution rerouted twice", r.max_reroutes_per_exec > 1);
                count("calls retried after a role change", r.retries > 0);
                count("KV prefixes handed over", r.kv_handovers > 0);
                count("a step reduced over several cells", r.max_members > 1);
                count("K = 1", cfg.sched.cells == 1);
                count("no standalone pool", cfg.sched.pool_capacity == 0);
                count("streaming off", !cfg.sched.streaming);
                count("over-sampled", cfg.sched.oversample > 0);
                count("surplus cancelled while running", r.surplus_cancelled > 0);
                let policy = match cfg.sched.policy {
                    Policy::Elastic => "policy elastic",
                    Policy::Colocate => "policy colocate",
                    Policy::Async { .. } => "policy async",
                };
                count(policy, true);
                Ok(())
            }
            Err(RunError::Sim(e)) => Err(*e),
            Err(RunError::Config(e)) => panic!("seed {seed} drew an invalid config: {e}"),
        }
    });
    let coverage = coverage.into_inner();
    eprintln!("sweep coverage: {coverage:#?}");
    // A sweep that never exercised the hard paths proves little.
    if std::env::var(gyre_runtime::sim::SEED_ENV).is_err() {
        for path in [
            "core returned at a burst end",
            "core stayed at a burst end",
            "executions rerouted",
            "over-sampled",
            "surplus cancelled while running",
            "an execution rerouted twice",
            "calls retried after a role change",
            "KV prefixes handed over",
            "a step reduced over several cells",
            "K = 1",
            "no standalone pool",
            "streaming off",
            "policy elastic",
            "policy colocate",
            "policy async",
        ] {
            assert!(
                coverage.get(path).copied().unwrap_or(0) > 0,
                "never: {path}"
            );
        }
    }
}
