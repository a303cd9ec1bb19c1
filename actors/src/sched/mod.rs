//! The scheduling plane of SPEC 2 as message protocols.
//!
//! Role transitions, proxy rerouting and micro-step claiming are written
//! once, against the runtime's actor contract, so the same code runs in the
//! deterministic simulator and the live host. The pieces:
//! - [`maths`]: the decision rules as pure functions (ledger (1), counters,
//!   dispatch, watermark (2), supply check, burst end (3), prefix, staleness).
//! - [`msg`]: every actor's message enum, addressed by message type
//!   (`Recipient`), so messages import no actor.
//! - [`proto`]: every backend an actor talks to (inference engine, trainer,
//!   device memory, transfer engine, harness, evaluator) as its own small
//!   protocol; simulated and live implementations answer the same messages.
//! - the actors: [`scheduler`], [`cell`], [`proxy`], [`execution`],
//!   [`evaluator`], [`buffer`], [`packer`], [`queue`] and [`core`];
//!   [`samples`] is where the packer's rows come from.
//! - [`plan`]: one cluster plan (cells, pool, node placement) that every
//!   world fills with its own backends.

pub mod buffer;
pub mod cell;
pub mod config;
pub mod core;
pub mod evaluator;
pub mod execution;
pub mod ids;
pub mod maths;
pub mod msg;
pub mod packer;
pub mod plan;
pub mod proto;
pub mod proxy;
pub mod queue;
pub mod retry;
pub mod samples;
pub mod scheduler;

pub use config::{ConfigError, DispatchMode, Policy, SampleMode, SchedConfig};
pub use ids::{CallId, EngineIx, ExecId, GroupId, MicroStepId, Step, SwitchId, Version};
