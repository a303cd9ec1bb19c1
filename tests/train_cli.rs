//! `gyre train` as a user runs it, on the tiny cluster: the same seed gives
//! byte-identical `--json` reports in two processes, apart from the wall
//! time; the report has the documented fields; `--print-config` prints a
//! file `--config` reads back; a bad configuration file is refused with the
//! field named and a non-zero exit.

mod common;
use common::{gyre, ok, versions};

fn report(seed: &str) -> serde_json::Value {
    let out = ok(&["train", "--tiny", "--steps", "2", "--seed", seed, "--json"]);
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    v.as_object_mut().expect("an object").remove("wall_secs");
    v
}

#[test]
fn the_json_report_is_reproducible_and_complete() {
    let a = report("11");
    let b = report("11");
    let c = report("12");
    assert_eq!(a, b, "same seed, same report");
    assert_ne!(a["trace_hash"], c["trace_hash"]);
    assert_eq!(a["steps"], 2);
    assert_eq!(a["updates"].as_array().map(Vec::len), Some(2));
    for key in [
        "seed",
        "events",
        "virtual_secs",
        "reward_by_version",
        "early_reward",
        "late_reward",
        "staleness",
        "elasticity",
        "calls",
        "served",
        "generated_tokens",
        "trained_targets",
        "micro_steps_by_cell",
        "task",
        "blobs_left",
    ] {
        assert!(a.get(key).is_some(), "report has {key}");
    }
}

#[test]
fn printed_configuration_reads_back_and_bad_files_are_named() {
    let dir = std::env::temp_dir().join(format!("gyre-train-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let printed = ok(&["train", "--tiny", "--print-config"]).stdout;
    let full = dir.join("full.toml");
    std::fs::write(&full, &printed).unwrap();
    let again = ok(&[
        "train",
        "--config",
        full.to_str().unwrap(),
        "--print-config",
    ])
    .stdout;
    assert_eq!(
        printed, again,
        "the printed configuration is a complete file"
    );

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[optim]\nlearning_rate = 0.1\n").unwrap();
    let out = gyre(&["train", "--config", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("optim.learning_rate"), "{err}");

    std::fs::write(&bad, "[model]\nwidth = 30\nheads = 4\n").unwrap();
    let out = gyre(&["train", "--config", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `gyre train --host live` with `[checkpoint] every = 2` journals each
/// update to `<dir>/run.jsonl`; kill -9 of the process mid-run leaves the
/// checkpoint and the journal, and `--resume` trains the rest from the
/// checkpoint: one update per version over the whole run, the journaled
/// updates past the checkpoint made again. Then the run is finished, and
/// a second resume has nothing left to train.
#[test]
fn a_killed_one_process_run_resumes_from_its_checkpoint_and_journal() {
    use std::time::{Duration, Instant};
    let dir = std::env::temp_dir().join(format!("gyre-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("ck.toml");
    std::fs::write(
        &config,
        format!(
            "[checkpoint]\nevery = 2\ndir = {:?}\n",
            dir.display().to_string()
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let run = [
        "train", "--tiny", "--steps", "60", "--host", "live", "--config", &config,
    ];
    let mut first = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(run)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let journal = dir.join("run.jsonl");
    let updates = || {
        std::fs::read_to_string(&journal)
            .unwrap_or_default()
            .matches(r#""kind":"update""#)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while updates() < 5 {
        assert!(Instant::now() < deadline, "the run never got going");
        assert!(first.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let journaled = updates() as u64;
    assert!(journaled < 60, "killed mid-run");

    let out = ok(&[run.as_slice(), &["--json", "--resume"]].concat());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let from = r["resumed"]["from_version"].as_u64().expect("resumed");
    assert!(from >= 2 && from % 2 == 0 && from <= journaled, "{r}");
    assert_eq!(versions(&r), (1..=60).collect::<Vec<u64>>());
    assert_eq!(r["resumed"]["lost_updates"], journaled - from, "{r}");
    assert_eq!(r["seed"], 1, "the report names the run's seed");
    // The rewards of the killed run's executions are in the curve too.
    assert!(
        r["reward_by_version"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["version"].as_u64().unwrap() < from),
        "{r}"
    );

    let again = gyre(&[run.as_slice(), &["--resume"]].concat());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("nothing left to train"),
        "{err}"
    );
    let fresh = gyre(&run);
    let err = String::from_utf8_lossy(&fresh.stderr);
    assert!(!fresh.status.success() && err.contains("--resume"), "{err}");
    // Asked for more steps, the finished run trains on from its final
    // checkpoint (the target is not part of the configuration's digest).
    let mut further = run;
    further[3] = "64";
    let out = ok(&[further.as_slice(), &["--json", "--resume"]].concat());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(r["resumed"]["from_version"], 60, "{r}");
    // Counted over every resume: only the killed run's lost some.
    assert_eq!(r["resumed"]["lost_updates"], journaled - from, "{r}");
    assert_eq!(r["resumed"]["earlier_resumes"], 1, "{r}");
    assert_eq!(versions(&r), (1..=64).collect::<Vec<u64>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Options that do not combine are refused before anything starts, and
/// the error names them.
#[test]
fn combinations_not_built_are_refused_naming_them() {
    let refused = |args: &[&str], names: &[&str]| {
        let out = gyre(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran");
        for n in names {
            assert!(err.contains(n), "{args:?}: {err}");
        }
    };
    refused(
        &[
            "train",
            "--tiny",
            "--cluster",
            "local",
            "--engines",
            "serve",
        ],
        &["--cluster", "--engines serve"],
    );
    refused(
        &[
            "train",
            "--tiny",
            "--cluster",
            "local",
            "--gateway-listen",
            "127.0.0.1:0",
            "--harness-cmd",
            "true",
            "--evaluator-cmd",
            "true",
            "--resume",
        ],
        &["--resume", "[checkpoint]"],
    );
    // Commands are split as a shell splits words: an open quote is named.
    refused(
        &[
            "train",
            "--tiny",
            "--gateway-listen",
            "127.0.0.1:0",
            "--harness-cmd",
            "sh -c 'echo hi",
            "--evaluator-cmd",
            "true",
        ],
        &["--harness-cmd", "unterminated quote"],
    );
    refused(
        &[
            "train",
            "--tiny",
            "--gateway-listen",
            "127.0.0.1:0",
            "--resume",
        ],
        &["--resume"],
    );
}

#[test]
fn a_broken_stderr_costs_the_log_not_the_run() {
    // Whoever read a process's log may be gone (a node agent's killed
    // head): writing a log line then fails, and the run goes on without
    // it instead of panicking in whatever task was logging.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["train", "--tiny", "--steps", "2", "--json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gyre runs");
    drop(child.stderr.take());
    let out = child.wait_with_output().expect("gyre ends");
    assert!(out.status.success(), "{:?}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(versions(&report), [1, 2]);
}
