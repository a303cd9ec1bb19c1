//! TCP backend, the default across processes.
//!
//! - `auth`: the cluster secret and the mutual HMAC challenge-response every
//!   connection starts with; a node without the secret is refused.
//! - `wire`: fixed little-endian frame headers.
//! - `server`: serves a node's segments; every request is admitted (version,
//!   bounds, writability) before memory is touched.
//! - `client`: several connections per peer; large requests are striped
//!   across them, reads land straight in the destination buffer and writes
//!   go out from the caller's `Bytes` without a copy.

mod auth;
mod client;
mod server;
mod wire;

pub use auth::ClusterSecret;
pub use client::{TcpOptions, TcpPeer};
pub use server::TcpServer;
