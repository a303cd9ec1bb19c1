//! The embedded policy as live backends of the scheduling plane.
//!
//! The actors of `gyre_actors::sched` talk to an inference engine, a
//! trainer, device memory, a transfer engine, a harness and an evaluator
//! only through small protocols. The simulator answers them with cost
//! models; this module answers them with the real small transformer of
//! `gyre_gpu` (generation with exact log-probs, KV pin/export/import,
//! forward/backward under the exact objective, AdamW on the core), a
//! built-in agent task and its evaluator. Model work runs as I/O, so the
//! same cluster runs under the deterministic simulator (virtual time, real
//! compute, exact replay) or the live host (real time).
//!
//! Each backend is one actor: its message enum accepts its protocol's
//! requests (listed in its `accepts!` table, so the scheduling plane holds a
//! `Recipient<EngineReq>` of it) together with the completions of its own
//! I/O jobs.
//!
//! Hosts: [`cluster`] (the simulator), [`live`] (the live host) and, with
//! the feature `actix`, `actix` (a user's actix system).

#[cfg(feature = "actix")]
pub mod actix;
pub mod cluster;
pub mod engine;
pub mod external;
pub mod journal;
pub mod last_word;
pub mod live;
pub mod memory;
pub mod record;
pub mod resumable;
pub mod run;
pub mod run_journal;
pub mod serve;
pub mod shared;
pub mod task;
pub mod trainer;
pub mod transfer;
pub mod work;

pub use engine::EngineWorker;
pub use memory::MemoryWorker;
pub use shared::{
    EngineHandle, GradBoard, GradStore, KvBoard, KvStore, Shared, TrainerHandle, WeightBoard,
    WeightStore,
};
pub use trainer::TrainerWorker;
pub use transfer::TransferWorker;
pub use work::Work;
