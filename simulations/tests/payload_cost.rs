//! The simulator's price of payload-transfer effects (`SimConfig::payload`)
//! as a scenario sets it: zero unless `[transfer] payload_latency_us,
//! payload_gbps` (or `gyre simulate --payload-cost`) say otherwise, carried
//! into the simulator, and — because the lab's simulated backends move no
//! payloads (`SampleMode::Counted`) — without effect on a lab run.

use gyre_runtime::MICROS;
use gyre_runtime::sim::{Latency, PayloadCost};
use gyre_simulations::lab::{self, RunOptions};
use gyre_simulations::scenario::{self, Selection, cluster_config};
use gyre_simulations::world::build;

#[test]
fn zero_payload_cost_is_the_default_and_a_set_cost_reaches_the_simulator() {
    let mut s = scenario::load("nl2repo-122b").unwrap();
    let runs = s.runs(&Selection::All, Some(1.0)).unwrap();
    let zero = cluster_config(&s, &runs[0], 4, 1);
    assert_eq!(zero.payload, PayloadCost::default());
    assert_eq!(
        build(&zero).unwrap().sim.config().payload,
        PayloadCost::default()
    );

    s.transfer.set_payload_cost("50,10").unwrap();
    let priced = cluster_config(&s, &runs[0], 4, 1);
    let want = PayloadCost {
        latency: Latency::Const(50 * MICROS),
        bytes_per_sec: 10_000_000_000,
        fail: 0.0,
    };
    assert_eq!(priced.payload, want);
    assert_eq!(build(&priced).unwrap().sim.config().payload, want);
    assert_eq!(want.transfer_time(10_000), 1_000);
}

#[test]
fn a_payload_cost_must_be_two_numbers_at_least_zero() {
    let mut s = scenario::load("nl2repo-122b").unwrap();
    for bad in ["50", "-1,10", "50,x", "inf,1", ""] {
        let err = s.transfer.set_payload_cost(bad).unwrap_err();
        assert!(err.contains("LATENCY_US,GBPS"), "{bad}: {err}");
    }
    s.transfer.set_payload_cost(" 0 , 0 ").unwrap();
    assert_eq!(s.transfer.payload_latency_us, 0.0);
}

#[test]
fn a_lab_run_moves_no_payloads_so_their_cost_leaves_its_hours_unchanged() {
    let hours = |cost: &str| {
        let mut s = scenario::load("terminalbench-122b")
            .unwrap()
            .scaled_with(4, 32)
            .unwrap();
        s.transfer.set_payload_cost(cost).unwrap();
        let runs = s.runs(&Selection::All, Some(1.5)).unwrap();
        let c = lab::compare(&s, &runs, 1.5, &RunOptions::new(6, 1), 2, &|_, _| {}).unwrap();
        c.results
            .iter()
            .map(|r| (r.name.clone(), r.total_hours, r.events))
            .collect::<Vec<_>>()
    };
    let zero = hours("0,0");
    assert_eq!(zero.len(), 3);
    assert_eq!(hours("50,10"), zero);
    // A cost large enough to matter if any payload moved.
    assert_eq!(hours("1000000,0.001"), zero);
}
