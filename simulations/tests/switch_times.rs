//! The scheduler's log of role-switch durations (`SchedLog::switch_times`,
//! what `RUST_LOG=gyre_actors::sched::scheduler=debug` prints as "switch
//! done" on the live host and the cluster's head): filled for both
//! directions, each switch no shorter than the device memory's part of it.

use gyre_actors::sched::scheduler::SwitchTime;
use gyre_runtime::SECS;
use gyre_simulations::scenario::{self, Selection, cluster_config};
use gyre_simulations::world::build;

#[test]
fn every_completed_switch_is_logged_with_its_duration() {
    let s = scenario::load("terminalbench-122b")
        .unwrap()
        .scaled_with(4, 32)
        .unwrap();
    let runs = s.runs(&Selection::parse("elastic"), Some(1.5)).unwrap();
    let cfg = cluster_config(&s, &runs[0], 6, 1);
    let mut cluster = build(&cfg).unwrap();
    let stats = cluster.sim.run().unwrap();
    assert!(!stats.limited);
    let sched = cluster.sim.actor(cluster.sched).unwrap();
    let log = sched.log();
    let moved: usize = log.transitions.iter().map(|t| t.cells.len()).sum();
    let (to_training, to_rollout): (Vec<&SwitchTime>, Vec<&SwitchTime>) =
        log.switch_times.iter().partition(|t| t.to_training);
    assert!(!to_training.is_empty() && !to_rollout.is_empty(), "{log:?}");
    assert!(to_training.len() <= moved);
    // Each direction's memory release and restore alone take part of the
    // scenario's switch cost, in seconds.
    let floor = |secs: f64| (secs * 0.1 * SECS as f64) as u64;
    for t in &to_training {
        assert!(t.took >= floor(s.switch.to_training_s), "{t:?}");
        assert!(
            log.transitions
                .iter()
                .any(|x| x.at == t.began && x.cells.contains(&t.cell))
        );
    }
    for t in &to_rollout {
        assert!(t.took >= floor(s.switch.to_rollout_s), "{t:?}");
    }
}
