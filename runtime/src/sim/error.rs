//! How a simulated run fails: always with the seed and the settings that
//! reproduce it.

use crate::codec::CodecError;
use crate::id::ActorId;
use crate::time::Nanos;

use super::SEED_ENV;

/// What went wrong in a run.
#[derive(Debug, thiserror::Error)]
pub enum SimFailure {
    #[error("invariant violated at t={at}ns after event {event}: {message}")]
    Invariant {
        at: Nanos,
        event: u64,
        message: String,
    },
    #[error("message {ty} to {to} does not survive the wire: {source}")]
    Codec {
        ty: &'static str,
        to: ActorId,
        #[source]
        source: CodecError,
    },
    #[error("message {ty} to {to} changed across the wire: sent {sent}, received {received}")]
    Changed {
        ty: &'static str,
        to: ActorId,
        sent: String,
        received: String,
    },
    /// A check the test itself made (see `Sim::fail`).
    #[error("check failed at t={at}ns: {message}")]
    Check { at: Nanos, message: String },
}

/// A failed run, with what it takes to replay it.
#[derive(Debug, thiserror::Error)]
#[error(
    "simulation failed with seed {seed}: {failure}\n  settings: {settings}\n  rerun with {SEED_ENV}={seed}"
)]
pub struct SimError {
    pub seed: u64,
    /// The configuration and fault plan of the run, in words.
    pub settings: String,
    pub failure: SimFailure,
}
