//! Running the `gyre` binary the way a user does, for the CLI tests.
// Each test file uses the helpers it needs.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `gyre args`, logs at `warn` (the level bad-input reports use).
pub fn gyre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gyre runs")
}

/// Runs `gyre args` and requires success, showing stderr otherwise.
pub fn ok(args: &[&str]) -> Output {
    let out = gyre(args);
    assert!(
        out.status.success(),
        "gyre {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
