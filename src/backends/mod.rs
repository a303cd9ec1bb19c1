//! Live implementations of the backend protocols.
//!
//! - [`sglang`]: SGLang's native HTTP API — the wire shapes both sides
//!   use, and the client that talks to an SGLang server or `gyre serve`.

pub mod sglang;
