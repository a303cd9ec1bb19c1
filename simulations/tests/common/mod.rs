//! Helpers of the lost-node tests: a cluster checked after every event,
//! and running it until a condition holds.

use std::cell::RefCell;
use std::rc::Rc;

use gyre_runtime::MILLIS;
use gyre_simulations::checker::Checker;
use gyre_simulations::world::{Cluster, ClusterConfig, build};

/// Builds `cfg` with the invariant checker run after every event.
pub fn checked(cfg: &ClusterConfig) -> Cluster {
    let mut cluster = build(cfg).expect("a valid cluster");
    let checker = Rc::new(RefCell::new(Checker::new(&cluster)));
    let c = Rc::clone(&checker);
    cluster
        .sim
        .set_invariant(move |view| c.borrow_mut().check(view));
    cluster
}

/// Runs in small slices of virtual time until `ready` holds; false if the
/// run ended first.
pub fn run_until(cluster: &mut Cluster, ready: impl Fn(&Cluster) -> bool) -> bool {
    for _ in 0..200_000 {
        if ready(cluster) {
            return true;
        }
        let t = cluster.sim.now() + 20 * MILLIS;
        let stats = cluster.sim.run_until(t).expect("invariants hold");
        if stats.events == 0 && cluster.sim.pending() == 0 {
            return false;
        }
    }
    false
}
