//! Simple simulated backends, one small actor per protocol of
//! `gyre_actors::sched::proto`: fixed or seeded-random costs, no
//! calibration. Each keeps statistics the invariant checker reads, and
//! counts the protocol breaches it can see from its side.

pub mod answered;
pub mod disk;
pub mod engine;
pub mod evaluator;
pub mod harness;
pub mod memory;
pub mod trainer;
pub mod transfer;

pub use disk::CheckpointDisk;
pub use engine::SimEngine;
pub use evaluator::SimEvaluator;
pub use harness::SimHarness;
pub use memory::SimMemory;
pub use trainer::SimTrainer;
pub use transfer::SimTransfer;
