//! Issue 11's first must-show: the byte game, played by an external
//! `openai`-SDK harness process through the gateway
//! (`examples/jobs/byte_game_elastic.toml`), learns: the mean reward of
//! the last quarter of versions is at least 3× that of the first within
//! 40 steps, for two seeds, while every elastic mechanism is at work (in
//! every run cells switch roles and a satellite joins the core's steps;
//! over the test's runs displaced calls are resumed on other engines and
//! KV prefixes exported and adopted), every answered call has its gateway
//! record, and the critique calls are never trained on.
//!
//! The live host runs in real time, so the figures vary from run to run:
//! 2.2–14.4× measured at the job's lr 0.02 against the 3× asked (README,
//! byte game, "Session 11"), so two seeds of at most three must rise 3×
//! (see the test). Each seed takes 4–6 minutes in a debug build on two
//! cores.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python_has_openai() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// What one run showed beyond the assertions every run must pass.
struct Run {
    /// The reward rose 3×.
    rose: bool,
    summary: String,
    /// KV prefixes exported, and adopted by the retried calls' engines.
    kv: (u64, u64),
    /// Attempts of displaced calls resumed on another engine.
    resumed: u64,
}

/// Runs the job for `seed` and asserts everything that must hold for every
/// run (all but the rise, the resumed attempts and the KV migrations,
/// which the test judges over its runs).
fn learns(seed: u64) -> Run {
    let d = std::env::temp_dir().join(format!("gyre-bgl-{seed}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let job_dir = repo().join("examples/jobs");
    let text = std::fs::read_to_string(job_dir.join("byte_game_elastic.toml"))
        .unwrap()
        .replace(
            "\"../../target/gyre-jobs/byte_game_elastic/logs\"",
            &format!("\"{}/logs\"", d.display()),
        )
        .replace(
            "\"../../target/gyre-jobs/byte_game_elastic/work\"",
            &format!("\"{}/work\"", d.display()),
        )
        .replace("\"../", &format!("\"{}/../", job_dir.display()))
        .replace("{job_dir}", &job_dir.display().to_string());
    let job = d.join("job.toml");
    std::fs::write(&job, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args([
            "train",
            "--tiny",
            "--json",
            "--seed",
            &seed.to_string(),
            "--job",
        ])
        .arg(&job)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gyre runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "seed {seed}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    let early = r["early_reward"].as_f64().unwrap();
    let late = r["late_reward"].as_f64().unwrap();
    let summary = format!(
        "seed {seed}: reward {early:.3} -> {late:.3} ({:.1}x); role changes {}, KV exported/adopted {}/{}, satellite steps {}, resumed attempts {}, calls {} without a record {}",
        late / early,
        n("role_changes"),
        n("kv_exported"),
        n("kv_adopted"),
        n("satellite_steps"),
        n("resumed_attempts"),
        n("gateway_calls"),
        n("calls_without_record"),
    );
    // Straight to the process's stderr, which the test harness does not
    // capture: CI logs show every run's figures, on a pass too.
    let _ = writeln!(std::io::stderr(), "{summary}");
    assert_eq!(n("steps"), 40, "{summary}");
    for k in ["role_changes", "satellite_steps"] {
        assert!(n(k) > 0, "{k} = 0: {summary}");
    }
    assert!(n("kv_adopted") <= n("kv_exported"), "{summary}");
    assert_eq!(n("calls_without_record"), 0, "{summary}");
    assert!(n("gateway_calls") >= n("plane_calls_answered"), "{summary}");
    // A step trains one group of 4 executions: at most 4 × (4 main calls
    // + 1 sub-agent call) × 8 tokens. Trained critiques (192 tokens each)
    // would be far more.
    for u in r["updates"].as_array().unwrap() {
        let t = u["targets"].as_u64().unwrap();
        assert!(t > 0 && t <= 4 * 5 * 8, "{t} targets in {u}");
    }
    let _ = std::fs::remove_dir_all(&d);
    Run {
        rose: late >= 3.0 * early,
        summary,
        kv: (n("kv_exported"), n("kv_adopted")),
        resumed: n("resumed_attempts"),
    }
}

/// Two seeds must rise 3×: seeds 1 and 2, and seed 3 only if one of
/// them did not, or if neither run migrated a call (so at most three
/// runs, and two below 3× fail at once).
/// A real-time run's rise spreads widely (README, byte game, "Session
/// 11": 2.2–14.4× for the shipped job, one of twelve runs below 3×), so a
/// third seed stands in for one low run; so do calls in flight at a
/// switch (0–5 migrated a run since session 22's faster trainer), so a
/// third seed is also run when two runs migrated none. Every other
/// assertion holds for every run. The seeds run one after the other: two real-time runs
/// sharing two cores learn less per step.
#[test]
fn the_byte_game_learns_through_the_gateway_with_every_mechanism_for_two_seeds() {
    if !python_has_openai() {
        eprintln!("\n*** SKIPPED the byte game learning test: python3 without openai ***\n");
        return;
    }
    let (mut rose, mut low) = (Vec::new(), Vec::new());
    let (mut exported, mut adopted, mut resumed) = (0, 0, 0);
    for seed in [1, 2, 3] {
        let migrated = resumed > 0 && exported > 0;
        if (rose.len() >= 2 && migrated) || low.len() == 2 {
            break;
        }
        let run = learns(seed);
        exported += run.kv.0;
        adopted += run.kv.1;
        resumed += run.resumed;
        if run.rose { &mut rose } else { &mut low }.push(run.summary);
    }
    let all = || [rose.clone(), low.clone()].concat().join("\n");
    assert!(
        rose.len() >= 2,
        "the reward did not rise 3x for two seeds:\n{}",
        low.join("\n")
    );
    // Resumed attempts and KV migration need a call in flight on a cell
    // when it switches, which the real-time runs give a few times each
    // since the fused kernels sped the engine up (0-16 exports and 1-18
    // resumed attempts a run): judged over the runs, so one run without
    // any does not fail the test. Each export's retried call waits for its
    // blocks (`ExpectKv`), so nearly all are adopted; before that the call
    // usually outran the read (CI: 10 exported, 2 adopted).
    assert!(resumed > 0, "no attempt resumed:\n{}", all());
    assert!(exported > 0, "no KV prefix exported:\n{}", all());
    assert!(
        adopted * 4 >= exported * 3,
        "{adopted} of {exported} exported KV prefixes adopted:\n{}",
        all()
    );
}
