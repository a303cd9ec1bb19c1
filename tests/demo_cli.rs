//! `gyre demo` as a user runs it: the same seed in two separate processes
//! prints the same trace hash; another seed prints another; `--json` has the
//! documented fields.

use std::process::Command;

fn demo_json(seed: u64) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["demo", "--json", "--rounds", "5", "--seed"])
        .arg(seed.to_string())
        .output()
        .expect("gyre runs");
    assert!(
        out.status.success(),
        "gyre demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

#[test]
fn trace_hash_is_reproducible_across_processes() {
    let a = demo_json(7);
    let b = demo_json(7);
    let c = demo_json(8);
    for key in ["seed", "sim_trace_hash", "sim_result", "live_result"] {
        assert!(a.get(key).is_some(), "missing {key}: {a}");
    }
    assert_eq!(a["sim_trace_hash"], b["sim_trace_hash"]);
    assert_eq!(a["sim_result"], b["sim_result"]);
    assert_ne!(a["sim_trace_hash"], c["sim_trace_hash"]);
    assert_eq!(a["sim_result"], a["live_result"]);
    assert_eq!(a["agree"], true);
}

#[test]
fn version_and_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .arg("version")
        .output()
        .expect("gyre runs");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("wire protocol"));
    let help = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .arg("--help")
        .output()
        .expect("gyre runs");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("demo") && text.contains("--log-format"),
        "{text}"
    );
}

#[test]
fn bad_arguments_are_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["demo", "--seed", "not-a-number"])
        .output()
        .expect("gyre runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seed"));
}
