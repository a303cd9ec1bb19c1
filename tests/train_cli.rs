//! `gyre train` as a user runs it, on the tiny cluster: the same seed gives
//! byte-identical `--json` reports in two processes, apart from the wall
//! time; the report has the documented fields; `--print-config` prints a
//! file `--config` reads back; a bad configuration file is refused with the
//! field named and a non-zero exit.

mod common;
use common::{gyre, ok};

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
