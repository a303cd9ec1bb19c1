//! gyre-gpu: device memory managed by role (rollout weights, KV cache, training
//! parameters, optimizer state, gradients), KV block pools, collectives and the
//! embedded policy model.
//!
//! The live counterpart of the simulated device-memory, inference-engine and
//! trainer protocols. Filled in by the embedded-policy work; for now the crate
//! only fixes its place in the dependency graph (it depends on nothing of ours
//! but the runtime's traits).
