//! An operator pauses the scheduler's dispatch and resumes it
//! (`SchedMsg::PauseDispatch` / `ResumeDispatch`), on the embedded tiny
//! cluster under the simulator: while paused no execution is accepted,
//! and after the resume the run trains every step.

use gyre::embedded::cluster::{EmbeddedConfig, build};
use gyre::embedded::run::run_built;
use gyre_actors::sched::msg::scheduler::SchedMsg;
use gyre_runtime::ActorId;
use gyre_runtime::time::SECS;

#[test]
fn no_execution_is_dispatched_while_paused_and_the_run_completes_after_resume() {
    let cfg = EmbeddedConfig::tiny(1).with_steps(12);
    let mut c = build(&cfg).expect("the tiny cluster builds");
    let dispatched = |c: &gyre::embedded::cluster::EmbeddedCluster| {
        c.sim
            .actor(c.sched)
            .expect("the scheduler")
            .counters()
            .dispatched()
    };
    c.sim.run_until(SECS / 2).expect("runs");
    let operator = ActorId::new(0, u64::MAX);
    c.sim.inject(operator, c.sched, SchedMsg::PauseDispatch);
    // Delivered after the modelled network latency.
    c.sim.run_until(SECS).expect("runs");
    let at_pause = dispatched(&c);
    assert!(at_pause > 0, "the first batch was dispatched");
    assert!(c.sim.actor(c.sched).unwrap().dispatch_paused());
    // Long enough for the first steps' executions to finish and the
    // dispatch rule to release more.
    c.sim.run_until(120 * SECS).expect("runs");
    assert_eq!(dispatched(&c), at_pause, "nothing accepted while paused");
    let steps_paused = c.sim.actor(c.sched).unwrap().steps_done();
    assert!(
        steps_paused < 12,
        "the run cannot finish without new executions"
    );

    c.sim.inject(operator, c.sched, SchedMsg::ResumeDispatch);
    let (c, report) = run_built(c, &cfg, std::time::Instant::now(), &mut |_, _| {})
        .expect("the run completes after the resume");
    assert!(!c.sim.actor(c.sched).unwrap().dispatch_paused());
    assert!(dispatched(&c) > at_pause, "dispatch went on");
    assert_eq!(report.updates.len(), 12, "every step trained");
}
