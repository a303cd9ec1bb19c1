//! gyre-rdma: the transfer engine that moves large payloads (weights, KV
//! blocks, gradients, token rows) by one-sided reads and writes of
//! registered memory instead of inline in messages.
//!
//! - [`engine`]: [`TransferEngine`]: segments, peers, batches, notifications.
//! - [`segment`]: named, versioned registered memory.
//! - [`request`]: requests, completions, per-request status.
//! - [`batch`]: batch ids and their completion slots.
//! - [`notify`]: small messages delivered after writes, routed by topic.
//! - [`transport`]: the backends (in-process, TCP, RDMA verbs behind `rdma`).
//! - [`collective`]: ring all-reduce and broadcast over the engine.
//! - [`pattern`]: deterministic bytes two processes agree on (tests, benches).
//! - [`error`]: per-request statuses and engine-level errors.

pub mod batch;
pub mod collective;
pub mod engine;
pub mod error;
pub mod notify;
pub mod pattern;
pub mod request;
pub mod segment;
pub mod transport;

pub use batch::BatchId;
pub use engine::TransferEngine;
pub use error::{RequestError, TransferError};
pub use notify::Notification;
pub use request::{
    Completion, Op, PeerId, RequestStatus, SegmentRef, TransferRequest, Transferred,
};
pub use segment::{LocalSegment, SegmentInfo};
pub use transport::Transport;
pub use transport::tcp::{ClusterSecret, TcpOptions, TcpServer};
