//! External harness processes as the cluster's executions, through the
//! gateway: what `gyre train --harness-cmd …` runs.
//!
//! An execution of the scheduling plane begins at the harness backend
//! ([`bridge::GatewayHarness`], a sans-IO actor); the [`front`] creates its
//! gateway execution (a key of its own) and starts its program through a
//! [`launcher::HarnessLauncher`] with the OpenAI and Anthropic variables
//! pointing at the gateway. Each HTTP request of that program becomes one
//! model call of the execution's actor ([`plane::PlaneEngine`]), so the
//! proxy router routes it and reroutes and retries it on role changes
//! (SPEC 2.5). The serving engine streams every sampled token to the
//! call's stream ([`streams`], the engines' token tap) as it samples, and
//! a retried attempt continues after those tokens, so the client sees one
//! answer whatever the plane did. The gateway writes each call's TITO
//! record (redb first, then its tree) and hands it to the execution
//! ([`plane::PlaneRecords`]), whose records the trajectory buffer and the
//! packer train on; the engines write none. The program's exit finishes the
//! execution; the [`evaluator`] command scores its workspace. A resumed
//! head adopts the harnesses a lost head left running ([`adopt`]).

pub mod adopt;
pub mod board;
pub mod bridge;
pub mod evaluator;
pub mod front;
pub mod launcher;
pub mod plane;
pub mod run;
pub mod side;
pub mod streams;

pub use launcher::{CommandLauncher, HarnessLauncher, HarnessRun, LaunchSpec};
pub use run::{GatewayOptions, GatewayReport, run_with_gateway};
pub use side::{GatewayCounters, GatewaySide};
