//! Gyre: elastic online reinforcement learning for long-horizon coding
//! agents, as an actor runtime.
//!
//! This crate is the facade over the workspace (the actor runtime, the
//! protocols, device memory, the transfer engine and the simulation lab) and
//! the home of the `gyre` command line. See README.md for the tour.

pub use gyre_actors as actors;
pub use gyre_gpu as gpu;
pub use gyre_rdma as rdma;
pub use gyre_runtime as runtime;
pub use gyre_simulations as simulations;

pub mod backends;
pub mod cli;
pub mod cluster;
pub mod embedded;
pub mod gateway;
pub mod harness;
