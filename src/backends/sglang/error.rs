//! What can go wrong talking to an SGLang server, sorted by what the
//! caller does next: a dead or slow server is retried elsewhere
//! ([`SglangError::is_retryable`]); a refused request is not.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SglangError {
    #[error("SGLang server {url} is unreachable: {message}")]
    Unreachable { url: String, message: String },
    #[error("SGLang server {url} did not answer {endpoint} within {after:?}")]
    Timeout {
        url: String,
        endpoint: &'static str,
        after: Duration,
    },
    #[error("SGLang {endpoint} refused the request (HTTP {status}): {message}")]
    Refused {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    #[error("SGLang server failed {endpoint} (HTTP {status}): {message}")]
    Server {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    #[error("SGLang {endpoint} answered {status} success = false: {message}")]
    Unsuccessful {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    #[error("SGLang {endpoint} answered something unreadable: {message}")]
    Malformed {
        endpoint: &'static str,
        message: String,
    },
    #[error("SGLang stream from {endpoint} broke off: {message}")]
    StreamBroken {
        endpoint: &'static str,
        message: String,
    },
    #[error("invalid SGLang server URL {url}: {message}")]
    BadUrl { url: String, message: String },
}

impl SglangError {
    /// Whether the same call may succeed on another server (or later):
    /// the server is dead, slow or failing, not the request.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SglangError::Unreachable { .. }
                | SglangError::Timeout { .. }
                | SglangError::Server { .. }
                | SglangError::StreamBroken { .. }
        )
    }
}
