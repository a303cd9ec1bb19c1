//! SGLang's native HTTP API (`/generate`, `/abort_request`, memory
//! release/resume, weight updates and versions, health, server info,
//! load), as `gyre serve` speaks it and as SGLang servers do.
//!
//! - [`wire`]: the JSON bodies, written in SGLang's current shape and read
//!   leniently (older SGLang versions name or shape some `meta_info`
//!   fields differently);
//! - [`client`]: an async client over reqwest, streaming included, whose
//!   failures are [`SglangError`]s that say what to do (retry elsewhere,
//!   fix the request, wait for the server);
//! - [`sse`]: the `data:` event framing of streamed generations;
//! - [`adapter`]: a server as an engine of the scheduling plane (the
//!   engine protocol's actor).

pub mod adapter;
pub mod client;
pub mod distributed;
pub mod error;
pub mod sse;
pub mod wire;

pub use client::{ClientConfig, GenerateStream, SglangClient};
pub use error::SglangError;
pub use wire::{Finish, GenerateRequest, Generation, Sampling};
