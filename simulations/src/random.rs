//! Small random configurations for seed sweeps: every policy, K from 1 to
//! 8, with and without a standalone pool, μ from 1 to 4, φ from 0 to 2,
//! streaming on or off, random workloads, failures and switch costs. Each
//! is drawn from the seed alone, so a failing seed names its configuration.

use gyre_actors::sched::{DispatchMode, Policy, SampleMode, SchedConfig};
use gyre_runtime::{MILLIS, SECS};
use rand::{Rng, SeedableRng};

use crate::costs::Span;
use crate::world::ClusterConfig;

/// The configuration seed `seed` stands for; always valid.
pub fn small_config(seed: u64) -> ClusterConfig {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
    let cells = rng.random_range(1..=8u32);
    let mut pool = if rng.random_bool(0.5) {
        0
    } else {
        rng.random_range(1..=4u32)
    };
    let policy = match rng.random_range(0..3) {
        0 => Policy::Elastic,
        1 => Policy::Colocate,
        _ => Policy::Async {
            train_cells: rng.random_range(1..=cells),
        },
    };
    let mu = match policy {
        Policy::Async { .. } => 1,
        _ => rng.random_range(1..=4u32),
    };
    let mut phi = f64::from(rng.random_range(0..=4u32)) / 2.0;
    if policy == Policy::Colocate && pool == 0 {
        phi = 0.0;
    }
    if let Policy::Async { train_cells } = policy
        && train_cells == cells
        && pool == 0
    {
        pool = rng.random_range(1..=4u32);
    }
    let mut batch_groups = rng.random_range(1..=3u32);
    if phi.fract() != 0.0 && batch_groups % 2 == 1 {
        batch_groups += 1;
    }
    let bursts = rng.random_range(1..=3u64);
    let sched = SchedConfig {
        cells,
        cell_capacity: rng.random_range(1..=3),
        pool_capacity: pool,
        group_size: rng.random_range(1..=3),
        oversample: 0,
        batch_groups,
        phi,
        mu,
        policy,
        streaming: rng.random_bool(0.5),
        dispatch: DispatchMode::Boundary,
        rho_min: [0.0, 0.25, 0.5, 1.0][rng.random_range(0..4)],
        tau: rng.random_range(0..=5) * SECS,
        target_steps: bursts * u64::from(mu),
        micro_tokens: [500, 2_000, 8_000][rng.random_range(0..3)],
        short_micro_steps: rng.random_range(1..=3),
        overall_timeout: 1_800 * SECS,
        eval_retry: rng.random_range(1..=30) * SECS,
        samples: SampleMode::Counted,
        retry: None,
        checkpoint_every: None,
        watch_nodes: false,
        rejoin_notices: false,
        reduce_needs_members: false,
        start_version: 0,
    };
    let mut cfg = ClusterConfig::new(sched, seed);
    let costs = &mut cfg.costs;
    costs.workload.calls = Span::new(0, rng.random_range(1..=5));
    costs.workload.think = Span::new(
        rng.random_range(0..=2) * SECS,
        rng.random_range(3..=120) * SECS,
    );
    costs.workload.p_complete_failure = rng.random_range(0.0..0.15);
    costs.workload.p_harness_timeout = rng.random_range(0.0..0.15);
    costs.workload.p_partial_failure = rng.random_range(0.0..0.1);
    costs.workload.p_too_long = rng.random_range(0.0..0.05);
    costs.eval.p_fail = rng.random_range(0.0..0.4);
    costs.memory.release = Span::new(0, rng.random_range(0..=5) * SECS);
    costs.memory.restore = Span::new(0, rng.random_range(0..=10) * SECS);
    costs.engine.unload = rng.random_range(0..=2_000) * MILLIS;
    costs.engine.load = rng.random_range(0..=4_000) * MILLIS;
    costs.trainer.slowdown = (0..cells).map(|_| rng.random_range(0.5..3.0)).collect();
    // Drawn last, so every earlier draw of a seed is what it was before
    // over-sampling existed.
    cfg.sched.oversample = [0, 0, 1, 2][rng.random_range(0..4)];
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_configs_are_valid_and_vary() {
        let mut policies = std::collections::BTreeSet::new();
        for seed in 0..500 {
            let cfg = small_config(seed);
            cfg.sched.validate().unwrap();
            policies.insert(
                format!("{:?}", cfg.sched.policy)
                    .chars()
                    .take(5)
                    .collect::<String>(),
            );
            assert_eq!(cfg.seed, seed);
        }
        assert_eq!(policies.len(), 3);
        assert!((0..500).any(|s| small_config(s).sched.oversample > 0));
        assert_eq!(small_config(7), small_config(7));
    }
}
