//! Unmodified Claude Code and mini-swe-agent train the embedded policy:
//! `gyre train --tiny --job` with the shipped CPU-sized job files
//! (examples/jobs/python_claude_code_cpu.toml,
//! python_mini_swe_agent_cpu.toml) on the Python task set, one step. What
//! is checked is that the loop closes, not that the policy codes: the
//! harness processes start, call the gateway (every call recorded), end,
//! are scored by the hidden tests, and their records are trained on.
//! Each skips loudly only when its harness is not installed (.ci/run
//! installs both).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-tja-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The shipped job `name`, its relative paths made absolute, its logs and
/// workspaces in `dir`, and `program` in place of the harness's own name.
fn job(name: &str, program: &str, path: &str, dir: &Path) -> PathBuf {
    let stem = name.trim_end_matches(".toml");
    let examples = repo().join("examples");
    let text = std::fs::read_to_string(examples.join("jobs").join(name))
        .unwrap()
        .replace(
            &format!("\"../../target/gyre-jobs/{stem}/logs\""),
            "\"logs\"",
        )
        .replace(
            &format!("\"../../target/gyre-jobs/{stem}/work\""),
            "\"work\"",
        )
        .replace("{job_dir}/../", &format!("{}/", examples.display()))
        .replace("\"../", &format!("\"{}/", examples.display()))
        .replace(&format!("  \"{program}\","), &format!("  \"{path}\","));
    let out = dir.join(name);
    std::fs::write(&out, text).unwrap();
    out
}

fn train(job: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["train", "--tiny", "--json", "--steps", "1", "--job"])
        .arg(job)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gyre runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gyre train --job {} failed: {stdout}\n{}",
        job.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The loop closed: executions started and called the gateway, every call
/// was recorded, they ended and were scored (each score bound to its
/// workspace's hash), and the step trained on their records.
fn assert_loop_closed(r: &Value, dir: &Path) {
    let j = &r["job"];
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_eq!(n(r, "steps"), 1, "{r}");
    let u = &r["updates"][0];
    assert!(n(u, "targets") > 0, "the step trained sampled tokens: {r}");
    assert!(n(r, "gateway_calls") >= 2, "{r}");
    assert_eq!(n(r, "calls_without_record"), 0, "{r}");
    assert!(n(j, "completed") + n(j, "failed") >= 2, "{j}");
    assert_eq!(n(j, "dummies"), 0, "{j}");
    assert!(n(j, "scored") >= 2, "{j}");
    let bindings = std::fs::read_to_string(dir.join("logs/bindings.jsonl")).unwrap();
    let bound: Vec<Value> = bindings
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(bound.len() >= 2, "{bindings}");
    for b in &bound {
        assert_eq!(b["workspace_hash"].as_str().unwrap().len(), 64, "{b}");
        let score = b["score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&score), "{b}");
    }
    // Every scored execution called the gateway from its own process.
    let logs: Vec<_> = std::fs::read_dir(dir.join("logs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("harness.stdout.log").exists())
        .collect();
    assert!(logs.len() >= 2, "per-execution logs");
}

#[test]
fn claude_code_trains_the_policy_through_a_job() {
    let claude = repo().join("target/gateway-npm/node_modules/.bin/claude");
    if !claude.exists() {
        eprintln!(
            "\n*** SKIPPED claude_code_trains_the_policy_through_a_job: no {} (.ci/run installs it) ***\n",
            claude.display()
        );
        return;
    }
    let dir = temp("claude");
    let path = job(
        "python_claude_code_cpu.toml",
        "claude",
        claude.to_str().unwrap(),
        &dir,
    );
    let r = train(&path);
    assert_loop_closed(&r, &dir);
    // Claude Code printed its JSON result: it ran to its end, on the
    // policy's answer (not on an API error).
    let mut results = 0;
    for e in std::fs::read_dir(dir.join("logs")).unwrap().flatten() {
        let out = std::fs::read_to_string(e.path().join("harness.stdout.log")).unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<Value>(out.trim()) {
            assert_eq!(v["type"], "result", "{v}");
            assert_eq!(v["is_error"], false, "{v}");
            results += 1;
        }
    }
    assert!(results >= 2, "Claude Code's results");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mini_swe_agent_trains_the_policy_through_a_job() {
    let has_mini = Command::new("mini")
        .arg("--help")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_mini {
        eprintln!(
            "\n*** SKIPPED mini_swe_agent_trains_the_policy_through_a_job: `mini` not on PATH (pip install mini-swe-agent) ***\n"
        );
        return;
    }
    let dir = temp("mini");
    let path = job("python_mini_swe_agent_cpu.toml", "mini", "mini", &dir);
    let r = train(&path);
    assert_loop_closed(&r, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}
