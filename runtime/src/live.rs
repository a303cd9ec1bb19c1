//! Live tokio host (in progress).
