//! gyre-actors: every protocol participant of Gyre (scheduler, cells, proxy
//! router, executions, evaluator, buffers, the core optimizer owner) as a
//! sans-IO actor, plus the pure algorithms they use.
//!
//! Nothing here may read a clock, spawn a thread or use a randomly seeded
//! hasher: `actors/clippy.toml` forbids it, so the same code replays exactly
//! in the simulator.

pub mod demo;
pub mod sched;
pub mod trajectory;
