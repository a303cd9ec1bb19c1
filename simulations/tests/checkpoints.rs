//! Durable checkpoints of the core in the simulator: with
//! `checkpoint_every = Some(S)` the core has the core trainer write one
//! after every S-th update (a modelled I/O effect with its cost), waits for
//! it to be durable, and the run still meets every invariant; off (the
//! default) writes none.

use gyre_actors::sched::SchedConfig;
use gyre_actors::sched::ids::{Step, Version};
use gyre_simulations::run::run_checked;
use gyre_simulations::world::{ClusterConfig, build};

/// Runs `sched` to the end; returns the checkpoints the core counted, the
/// core trainer's writes, and the trace hash.
fn checkpoints(sched: SchedConfig, seed: u64) -> (Vec<(Step, Version)>, u64, u64) {
    let cfg = ClusterConfig::new(sched, seed);
    // The checked run first: every invariant after every event.
    let checked = run_checked(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut cluster = build(&cfg).expect("builds");
    cluster.sim.run().expect("runs");
    assert_eq!(cluster.sim.trace_hash(), checked.trace_hash, "replays");
    let sim = &cluster.sim;
    let peers = sim
        .actor(cluster.sched)
        .and_then(|s| s.peers())
        .expect("peers");
    let core = sim.actor(peers.core).expect("core");
    let trainer = sim.actor(cluster.backends.trainers[0]).expect("trainer");
    assert_eq!(core.version(), cfg.sched.target_steps);
    (
        core.log().checkpoints.clone(),
        trainer.stats().checkpoints,
        sim.trace_hash(),
    )
}

#[test]
fn the_core_checkpoints_after_every_s_th_update() {
    for seed in 0..4 {
        let plain = SchedConfig {
            target_steps: 7,
            ..SchedConfig::default()
        };
        let (none, written, before) = checkpoints(plain.clone(), seed);
        assert!(none.is_empty() && written == 0, "off by default");
        let (ckpts, written, after) = checkpoints(
            SchedConfig {
                checkpoint_every: Some(3),
                ..plain
            },
            seed,
        );
        // Versions 3 and 6, after the updates of steps 2 and 5.
        assert_eq!(ckpts, vec![(2, 3), (5, 6)], "seed {seed}");
        assert_eq!(written, 2);
        // The write is an effect of its own, with its cost.
        assert_ne!(after, before, "seed {seed}");
    }
}

/// A head restarted on the checkpoint of version c starts the scheduling
/// plane there (`start_version`): step c first, one update per step to the
/// target, checkpoints at the same multiples of S as an unbroken run, and
/// every invariant (the checker counts versions from c).
#[test]
fn a_run_resumed_from_version_c_trains_the_steps_after_it_once_each() {
    for seed in 0..4 {
        let cfg = SchedConfig {
            target_steps: 9,
            checkpoint_every: Some(2),
            start_version: 4,
            ..SchedConfig::default()
        };
        let checked = run_checked(&ClusterConfig::new(cfg.clone(), seed))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let cluster = {
            let mut c = build(&ClusterConfig::new(cfg, seed)).expect("builds");
            c.sim.run().expect("runs");
            c
        };
        assert_eq!(cluster.sim.trace_hash(), checked.trace_hash);
        let core = cluster
            .sim
            .actor(cluster.sched)
            .and_then(|s| s.peers())
            .and_then(|p| cluster.sim.actor(p.core))
            .expect("core");
        assert_eq!(core.version(), 9, "seed {seed}");
        assert_eq!(core.log().updates, vec![4, 5, 6, 7, 8], "seed {seed}");
        assert_eq!(core.log().checkpoints, vec![(5, 6), (7, 8)], "seed {seed}");
    }
    let bad = SchedConfig {
        target_steps: 4,
        start_version: 4,
        ..SchedConfig::default()
    };
    let e = bad.validate().expect_err("nothing left to train");
    assert!(e.to_string().contains("starts from version 4"), "{e}");
}
