//! The trajectory plane (SPEC 3): from recorded model calls to weighted
//! training rows, as pure data structures and algorithms.
//!
//! The flow, one execution at a time:
//! 1. [`tito`]: the proxy writes a [`TitoRecord`] per model call; before it
//!    tokenises a request it restores re-serialised tool calls through the
//!    [`tool_cache`] so a harness's reformatting does not look like a branch.
//! 2. [`tree`] / [`insert`]: records go into the execution's
//!    [`TrajectoryTree`], sharing token prefixes; [`stats`] reports its shape.
//! 3. [`scoring`]: the closed execution is evaluated into an outcome
//!    (valid, pending, excluded, dummy).
//! 4. [`profile`] classifies leaves; [`admission`] picks at most J_max
//!    trajectories by masking; [`objective`] turns group outcomes into
//!    advantages, per-token coefficients and the reference loss.
//! 5. [`packing`] materialises admitted trajectories into token rows and
//!    packs them into micro-steps.
//!
//! [`synth`] generates harness-like traces for tests and benchmarks, and
//! [`naive`] is the expand-everything baseline they are checked against.

pub mod admission;
pub mod insert;
pub mod naive;
pub mod objective;
pub mod packing;
pub mod profile;
pub mod scoring;
pub mod stats;
pub mod synth;
pub mod tito;
pub mod tool_cache;
pub mod tree;

pub use admission::{Admission, Admitted, admit};
pub use insert::InsertError;
pub use tito::{CallPurpose, RecordError, TitoRecord, TokenSource};
pub use tree::{CallIdx, CallMeta, MatchMode, NodeId, TrajectoryTree, TreeConfig};
