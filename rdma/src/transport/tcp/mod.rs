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
//! - `conn`: one connection's writer and reader threads and its pending
//!   requests, failed together when it breaks.
//! - `striped`: a request's stripes and their reassembly.

mod auth;
mod client;
mod conn;
mod server;
mod striped;
mod wire;

pub use auth::ClusterSecret;
pub use client::{TcpOptions, TcpPeer};
pub use server::TcpServer;
