//! The staleness identity of SPEC 2.2, measured: under boundary dispatch the
//! group-weighted mean staleness of trained groups settles at φ + (μ − 1)/2.
//! Each of the six (φ, μ) pairs of the reference comparison runs 240 steps
//! with the policy that pair belongs to (Async for μ = 1, Colocate for
//! φ = 0, the elastic policy for the rest), every invariant checked after
//! every event. The maximum and the token-weighted mean, which the identity
//! does not cover, are reported alongside.

use gyre_actors::sched::maths::staleness::expected_staleness;
use gyre_actors::sched::{Policy, SchedConfig};
use gyre_runtime::SECS;
use gyre_simulations::costs::Span;
use gyre_simulations::run::run_checked;
use gyre_simulations::world::ClusterConfig;

const STEPS: u64 = 240;

fn pair(phi: f64, mu: u32, seed: u64) -> ClusterConfig {
    let policy = if mu == 1 {
        Policy::Async { train_cells: 1 }
    } else if phi == 0.0 {
        Policy::Colocate
    } else {
        Policy::Elastic
    };
    let sched = SchedConfig {
        cells: 4,
        cell_capacity: 2,
        pool_capacity: 0,
        group_size: 2,
        batch_groups: 2,
        phi,
        mu,
        policy,
        streaming: true,
        rho_min: 0.5,
        tau: SECS,
        target_steps: STEPS,
        ..SchedConfig::default()
    };
    let mut cfg = ClusterConfig::new(sched, seed);
    cfg.costs.workload.calls = Span::new(1, 3);
    cfg.costs.workload.think = Span::new(SECS, 20 * SECS);
    // The identity is about dispatch, not about stragglers: a run that hits
    // the overall timeout keeps its group out of training for hours of
    // virtual time, which shifts which groups a window of steps consumes.
    cfg.costs.workload.p_too_long = 0.0;
    cfg.max_events = 5_000_000;
    cfg
}

#[test]
fn group_weighted_mean_staleness_matches_the_identity_for_all_six_pairs() {
    let pairs = [(1.5, 1), (0.0, 4), (0.5, 3), (1.0, 1), (0.0, 3), (0.5, 2)];
    let mut failures = Vec::new();
    for (i, (phi, mu)) in pairs.into_iter().enumerate() {
        let cfg = pair(phi, mu, 100 + i as u64);
        let r = run_checked(&cfg).unwrap_or_else(|e| panic!("(φ, μ) = ({phi}, {mu}): {e}"));
        let want = expected_staleness(phi, mu);
        let s = r.staleness;
        eprintln!(
            "(φ, μ) = ({phi}, {mu}) {:?}: E[d] = {want}; steady mean {:.3} over {} groups \
             (all steps {:.3}), max {}, token-weighted {:.3}; core returns {}",
            cfg.sched.policy,
            s.steady.mean(),
            s.steady.groups,
            s.all.mean(),
            s.steady.max,
            s.steady.token_mean(),
            r.core_returns,
        );
        assert_eq!(r.steps, STEPS);
        assert!(s.steady.groups >= 2 * (STEPS - 6));
        if (s.steady.mean() - want).abs() > 0.05 {
            failures.push(format!("({phi}, {mu}): {} vs {want}", s.steady.mean()));
        }
        // The identity says nothing about the maximum, but it can never be
        // below the mean.
        assert!(s.steady.max as f64 >= s.steady.mean());
    }
    assert!(
        failures.is_empty(),
        "staleness off the identity: {failures:?}"
    );
}

/// Over-sampling leaves the identity alone: a group's staleness is set by
/// the version published when it was dispatched and the step that trains
/// it, and over-sampling changes neither; it only decides which N of the
/// N + M executions make up the group. Two extra executions per group, the
/// three elastic-era pairs, two seeds each, 120 steps, the same tolerance.
#[test]
fn over_sampling_keeps_the_staleness_identity_and_counts_the_surplus() {
    let mut failures = Vec::new();
    for (phi, mu) in [(0.5, 3), (0.5, 2), (1.0, 1)] {
        for seed in [7, 8] {
            let mut cfg = pair(phi, mu, seed);
            cfg.sched.oversample = 2;
            cfg.sched.target_steps = STEPS / 2;
            let r = run_checked(&cfg).unwrap_or_else(|e| panic!("({phi}, {mu}) seed {seed}: {e}"));
            let want = expected_staleness(phi, mu);
            let s = r.staleness;
            eprintln!(
                "oversample 2, (φ, μ) = ({phi}, {mu}) seed {seed}: E[d] = {want}; steady mean {:.3} \
                 over {} groups, max {}, token-weighted {:.3}; surplus cancelled {}, withdrawn {}, \
                 discarded {}",
                s.steady.mean(),
                s.steady.groups,
                s.steady.max,
                s.steady.token_mean(),
                r.surplus_cancelled,
                r.surplus_withdrawn,
                r.surplus_discarded,
            );
            assert_eq!(r.steps, STEPS / 2);
            // d counts every dispatched execution, surplus included: groups
            // of N + M; the surplus really ran and was cut short.
            assert_eq!(
                r.dispatched % u64::from(cfg.sched.dispatched_per_group()),
                0
            );
            assert!(r.surplus_cancelled > 0, "no surplus was ever cancelled");
            if (s.steady.mean() - want).abs() > 0.05 {
                failures.push(format!(
                    "({phi}, {mu}) seed {seed}: {} vs {want}",
                    s.steady.mean()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "staleness off the identity: {failures:?}"
    );
}
