//! Deterministic simulator host (in progress).
