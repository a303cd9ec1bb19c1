//! gyre-simulations: workload and cost models calibrated to the published
//! runs, simulated backends for every protocol the actors speak, the scenario
//! files and the experiment runner behind `gyre simulate`.
//!
//! Filled in by the simulation-lab work; for now the crate only fixes its
//! place in the dependency graph (runtime <- actors <- simulations).
