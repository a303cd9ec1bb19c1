//! One actor system (the demo: request/reply with timers, retries and a
//! fan-out) runs in every host with the same observable result, and the
//! simulator's trace is a pure function of the seed.

use gyre::cli::demo::{run_live_blocking, run_sim};
use gyre_actors::demo::DemoConfig;

fn small() -> DemoConfig {
    DemoConfig {
        workers: 5,
        rounds: 6,
        ..DemoConfig::default()
    }
}

#[test]
fn simulator_and_live_host_agree_for_several_seeds() {
    for seed in [1, 2, 42] {
        let sim = run_sim(seed, small()).unwrap();
        let (live, _) = run_live_blocking(seed, small()).unwrap();
        assert_eq!(sim.report.result, live.result, "seed {seed}");
        assert_eq!(sim.report.result.round_sums.len(), 6);
    }
}

#[cfg(feature = "actix")]
#[test]
fn actix_adapter_agrees_with_the_simulator() {
    for seed in [1, 42] {
        let sim = run_sim(seed, small()).unwrap();
        let actix = gyre::cli::demo::run_actix(seed, small()).unwrap();
        assert_eq!(sim.report.result, actix.result, "seed {seed}");
    }
}

#[test]
fn results_depend_on_the_seed() {
    let a = run_sim(1, small()).unwrap();
    let b = run_sim(2, small()).unwrap();
    assert_ne!(a.report.result.checksum, b.report.result.checksum);
}

#[test]
fn same_seed_same_trace_different_seed_different_schedule() {
    let a = run_sim(9, small()).unwrap();
    let b = run_sim(9, small()).unwrap();
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.events, b.events);
    assert_eq!(a.report, b.report);
    let c = run_sim(10, small()).unwrap();
    assert_ne!(a.trace_hash, c.trace_hash);
    // The schedule itself differs, not just the answers: virtual completion
    // times under the reordering, lossy network are seed-dependent.
    assert_ne!(a.report.elapsed, c.report.elapsed);
}
