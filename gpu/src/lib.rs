//! gyre-gpu: device memory managed by role (rollout weights, KV cache,
//! training parameters, optimizer state, gradients), collectives and the
//! embedded policy model.
//!
//! The live counterpart of the simulated device-memory, inference-engine
//! and trainer protocols. [`model`] is a small decoder-only transformer on
//! candle (CPU) whose parameters are one flat versioned buffer; [`engine`]
//! serves it with continuous batching and a paged KV cache; [`trainer`]
//! computes the execution-level objective over micro-steps and runs the
//! core's optimizer; [`memory`] keeps device regions by tag with a host
//! backend and, behind the `cuda` feature, a cudarc one; [`collective`]
//! reduces gradients across the training prefix (host, and NCCL behind
//! `cuda`). It depends on nothing of ours but the runtime.

pub mod collective;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod memory;
pub mod model;
pub mod trainer;

pub use error::ModelError;
