//! gyre-simulations: simulated backends for every protocol the actors
//! speak, a cluster builder, and the invariant checker that proves the
//! scheduling plane in the deterministic simulator.
//!
//! - [`costs`]: the simple (uncalibrated) cost and workload models;
//! - [`backends`]: one small actor per backend protocol;
//! - [`world`]: a whole cluster from a [`world::ClusterConfig`];
//! - [`checker`]: SPEC 2's invariants, checked after every event, and the
//!   end-of-run checks (liveness, exactly-once accounting);
//! - [`run`]: runs a cluster to quiescence under the checker and reports,
//!   staleness included;
//! - [`random`]: small random configurations for seed sweeps.
//!
//! Calibrated workload and cost models, scenarios and the experiment runner
//! come with the simulation-lab work.

pub mod backends;
pub mod checker;
pub mod costs;
pub mod random;
pub mod run;
pub mod world;
