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
//! - [`random`]: small random configurations for seed sweeps;
//! - [`swarm`]: the same clusters under seed-drawn fault plans, checked for
//!   safety while the faults act and for liveness once they heal.
//!
//! The simulation lab builds on them:
//! - [`workload`]: the calibrated workload model and its profile;
//! - [`scenario`]: the published scenarios as editable TOML files;
//! - [`lab`]: policy comparisons, reports and plots (`gyre simulate`);
//! - [`replay`]: a recorded run's workload and costs driving the simulated
//!   cluster, compared step by step (`gyre simulate --replay`).

pub mod backends;
pub mod checker;
pub mod costs;
pub mod lab;
pub mod random;
pub mod replay;
pub mod run;
pub mod scenario;
pub mod swarm;
pub mod workload;
pub mod world;
