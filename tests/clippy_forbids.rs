//! The determinism rules of `actors/clippy.toml` really fire: lint a canary
//! crate under `actors/` that breaks each of them and expect every rule in
//! the output. (That the actors themselves pass is `.ci/run`'s clippy step.)

use std::process::Command;

#[test]
fn actors_clippy_config_forbids_clocks_threads_and_random_hashers() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO"))
        .args(["clippy", "--quiet", "--manifest-path"])
        .arg(format!("{root}/actors/lint-canary/Cargo.toml"))
        .arg("--target-dir")
        .arg(format!("{root}/target/lint-canary"))
        .args(["--", "-D", "warnings"])
        .output()
        .expect("cargo clippy runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the canary must fail clippy:\n{stderr}"
    );
    for needle in [
        "disallowed method `std::time::Instant::now`",
        "disallowed method `std::time::SystemTime::now`",
        "disallowed method `std::thread::spawn`",
        "disallowed type `std::collections::HashMap`",
        "disallowed type `std::collections::HashSet`",
    ] {
        assert!(stderr.contains(needle), "missing `{needle}` in:\n{stderr}");
    }
}
