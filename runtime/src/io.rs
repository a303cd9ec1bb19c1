//! I/O requests: long or blocking work an actor asks its host to do.
//!
//! A handler may not block, so a model call, a forward/backward pass or a
//! disk write is described as an [`IoRequest`]; the host runs it (the live
//! host on a worker pool, the simulator after a modelled latency, possibly
//! failing it on purpose) and hands the result back to the actor as one of
//! its own messages.

/// Why an I/O request produced no output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum IoError {
    #[error("{0}")]
    Failed(String),
    #[error("injected fault in {kind}")]
    Injected { kind: String },
    #[error("host shut down before the request completed")]
    Cancelled,
}

/// One unit of outside work.
pub trait IoRequest: Send + 'static {
    type Output: Send + 'static;

    /// A stable label; the simulator keys its latency and failure models on it.
    fn kind(&self) -> &'static str;

    /// Does the work. The live host calls this on a blocking worker; the
    /// simulator calls it inline, so it must be deterministic to be replayable.
    fn run(self) -> Result<Self::Output, IoError>;

    /// `Some(bytes)` for a payload transfer (see [`crate::payload`]), which
    /// the simulator costs with its payload model instead of the I/O model.
    fn payload_bytes(&self) -> Option<u64> {
        None
    }
}
