//! HTTP calls to an SGLang server as I/O requests.
//!
//! An adapter's handler never waits on the network: it describes a call as
//! a future over [`SglangClient`] and hands it to its host as an
//! [`HttpCall`]. The host runs the request on its I/O pool (the simulator
//! inline); `run` drives the future on one small tokio runtime shared by
//! every adapter in the process (so it works whether or not the calling
//! thread belongs to another runtime) and waits for the answer.
//!
//! [`SglangClient`]: crate::backends::sglang::SglangClient

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use gyre_runtime::{IoError, IoRequest};
use serde::{Deserialize, Serialize};

use crate::backends::sglang::SglangError;

/// What the adapter does with a failed call, sorted as the engine protocol
/// needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The server is dead, slow or failing: another engine may serve it.
    Retryable,
    /// A timeout (also retryable; counted apart).
    Timeout,
    /// The server refused the request itself (4xx): it will not get better.
    Refused,
    /// The answer was unreadable or said `success: false`.
    Other,
}

/// A failed HTTP call, as a message can carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpFailure {
    pub kind: FailureKind,
    pub message: String,
}

impl HttpFailure {
    pub fn other(message: impl Into<String>) -> Self {
        Self {
            kind: FailureKind::Other,
            message: message.into(),
        }
    }

    /// Whether the call may succeed on another server.
    pub fn retryable(&self) -> bool {
        matches!(self.kind, FailureKind::Retryable | FailureKind::Timeout)
    }
}

impl From<SglangError> for HttpFailure {
    fn from(e: SglangError) -> Self {
        let kind = match &e {
            SglangError::Timeout { .. } => FailureKind::Timeout,
            e if e.is_retryable() => FailureKind::Retryable,
            SglangError::Refused { .. } => FailureKind::Refused,
            _ => FailureKind::Other,
        };
        Self {
            kind,
            message: e.to_string(),
        }
    }
}

type Call<T> = Pin<Box<dyn Future<Output = Result<T, HttpFailure>> + Send>>;

/// One HTTP exchange (or a short sequence of them) with a server.
pub struct HttpCall<T> {
    kind: &'static str,
    call: Call<T>,
}

impl<T: Send + 'static> HttpCall<T> {
    pub fn new(
        kind: &'static str,
        call: impl Future<Output = Result<T, HttpFailure>> + Send + 'static,
    ) -> Self {
        Self {
            kind,
            call: Box::pin(call),
        }
    }
}

fn runtime() -> Result<&'static tokio::runtime::Runtime, IoError> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gyre-sglang-http")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the SGLang adapter's HTTP runtime: {e}"))
    })
    .as_ref()
    .map_err(|e| IoError::Failed(e.clone()))
}

impl<T: Send + 'static> IoRequest for HttpCall<T> {
    type Output = Result<T, HttpFailure>;

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn run(self) -> Result<Self::Output, IoError> {
        let rt = runtime()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let call = self.call;
        rt.spawn(async move {
            let _ = tx.send(call.await);
        });
        rx.recv()
            .map_err(|_| IoError::Failed("the HTTP task ended without an answer".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_runs_on_the_shared_runtime_from_any_thread() {
        let ok = HttpCall::new("t", async { Ok::<_, HttpFailure>(7) }).run();
        assert_eq!(ok, Ok(Ok(7)));
        // From inside another runtime's blocking pool, as the live host runs it.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let inside = rt.block_on(async {
            tokio::task::spawn_blocking(|| {
                HttpCall::new("t", async { Err::<u8, _>(HttpFailure::other("no")) }).run()
            })
            .await
            .unwrap()
        });
        assert_eq!(inside, Ok(Err(HttpFailure::other("no"))));
    }

    #[test]
    fn failures_sort_by_what_the_protocol_does_next() {
        let t = HttpFailure::from(SglangError::Timeout {
            url: "u".into(),
            endpoint: "/generate",
            after: std::time::Duration::from_secs(1),
        });
        assert_eq!(t.kind, FailureKind::Timeout);
        assert!(t.retryable());
        let dead = HttpFailure::from(SglangError::Unreachable {
            url: "u".into(),
            message: "refused".into(),
        });
        assert!(dead.retryable());
        let bad = HttpFailure::from(SglangError::Refused {
            endpoint: "/generate",
            status: 400,
            message: "token 999 outside the vocabulary".into(),
        });
        assert_eq!(bad.kind, FailureKind::Refused);
        assert!(!bad.retryable() && bad.message.contains("999"));
    }
}
