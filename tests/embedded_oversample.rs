//! Over-sampling in the embedded system: the same scheduling-plane actors
//! on the real small policy and the built-in agent task. Each group
//! dispatches N + 2 executions; the first N valid form it, and the surplus
//! is cancelled through to the task's harness backend, which ends the run.

use gyre::embedded::cluster::EmbeddedConfig;
use gyre::embedded::run::run;

#[test]
fn surplus_executions_are_cancelled_at_the_harness_and_never_train() {
    let mut cfg = EmbeddedConfig::tiny(3);
    cfg.sched.target_steps = 4;
    cfg.sched.oversample = 2;
    let (cluster, r) = run(&cfg, &mut |_, _| {}).expect("the embedded run completes");
    assert_eq!(r.steps, 4);
    assert_eq!(r.updates.len(), 4);
    assert!(
        r.updates
            .iter()
            .all(|u| u.targets > 0 && u.loss.is_finite())
    );
    assert_eq!(r.backend_errors, 0);
    assert_eq!(r.failed_micro_steps, 0);
    let sched = cluster.sim.actor(cluster.sched).expect("the scheduler");
    let log = sched.log();
    assert!(log.errors.is_empty(), "{:?}", log.errors);
    // Surplus that was running was cancelled and its harness run aborted
    // (a run whose harness had just finished on its own has nothing left to
    // abort, so the two counts need not be equal).
    assert!(log.surplus_cancelled > 0, "no surplus cancelled");
    assert!(
        r.task.aborted > 0 && r.task.aborted <= log.surplus_cancelled,
        "{} cancelled, {:?}",
        log.surplus_cancelled,
        r.task
    );
    // d counts whole groups of N + M.
    let per_group = u64::from(cfg.sched.dispatched_per_group());
    assert_eq!(sched.counters().dispatched() % per_group, 0);
    // Surplus records are released, not kept: what is left stays bounded.
    assert!(r.blobs_left < 200, "{} blobs left", r.blobs_left);
    // Staleness is measured on the groups trained, as without over-sampling.
    assert!(r.staleness.groups > 0);
}
