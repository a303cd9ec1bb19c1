//! `gyre simulate` as a user runs it, on a shrunk scenario so that debug
//! builds answer in seconds: the same seed gives byte-identical `--json`
//! output in two processes and another seed changes it; the JSON has the
//! documented fields; `--profile` sets the statistics beside the SPEC 5
//! targets; plots (the GPU-time breakdown and critical path among them) and
//! CSV files are written; a bad scenario file is
//! rejected with an error naming the field.

use std::path::PathBuf;
mod common;
use common::{gyre, ok};

/// A small, quick comparison: TerminalBench shrunk 24-fold (B = 2, C_e = 8).
const QUICK: [&str; 8] = [
    "simulate",
    "--scenario",
    "terminalbench-122b",
    "--scale",
    "24",
    "--steps",
    "3",
    "--staleness=1",
];

fn quick_json(seed: &str) -> Vec<u8> {
    let mut args = QUICK.to_vec();
    args.extend(["--json", "--seed", seed]);
    ok(&args).stdout
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gyre-simulate-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let a = quick_json("11");
    let b = quick_json("11");
    let c = quick_json("12");
    assert_eq!(a, b, "the same seed must print the same bytes");
    assert_ne!(a, c, "another seed must change the output");
}

#[test]
fn json_has_the_documented_schema() {
    let v: serde_json::Value = serde_json::from_slice(&quick_json("3")).unwrap();
    assert!(
        v["scenario"]
            .as_str()
            .unwrap()
            .starts_with("terminalbench-122b")
    );
    assert_eq!(v["seed"], 3);
    assert_eq!(v["steps"], 3);
    assert_eq!(v["staleness"], 1.0);
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["elastic", "colocate", "async"]);
    for r in results {
        for key in [
            "total_hours",
            "median_step_hours",
            "mean_staleness",
            "max_staleness",
            "token_weighted_staleness",
            "gpu_rollout_fraction",
            "gpu_training_fraction",
            "gpu_switching_fraction",
            "gpu_idle_fraction",
            "reroutes_per_execution",
            "transitions_per_burst",
            "step_end_hours",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
        assert!(r["total_hours"].as_f64().unwrap() > 0.0);
        let g = &r["gpu_hours"];
        let phases: f64 = [
            "rollout_busy",
            "waiting_last_groups",
            "waiting_on_training",
            "rollout_idle",
            "switching_to_training",
            "switching_to_rollout",
            "warmup_drain",
            "training",
            "optimizer",
            "publication",
            "training_idle",
        ]
        .iter()
        .map(|k| {
            g[k].as_f64()
                .unwrap_or_else(|| panic!("gpu_hours.{k} missing"))
        })
        .sum();
        let total = g["total"].as_f64().unwrap();
        assert!(total > 0.0 && (phases - total).abs() < 1e-6 * total, "{g}");
        assert_eq!(r["step_paths"].as_array().unwrap().len(), 3);
    }
    let elastic_vs_async = v["speedups"]["elastic"]["async"].as_f64().unwrap();
    let hours = |i: usize| results[i]["total_hours"].as_f64().unwrap();
    assert!((elastic_vs_async - hours(2) / hours(0)).abs() < 1e-9);
}

#[test]
fn oversample_dispatches_surplus_that_is_cancelled_untrained() {
    let surplus = |policy: &str, extra: &[&str]| -> u64 {
        let mut args = QUICK.to_vec();
        args.extend(["--json", "--policy", policy]);
        args.extend(extra);
        let v: serde_json::Value = serde_json::from_slice(&ok(&args).stdout).unwrap();
        let r = &v["results"][0];
        ["surplus_cancelled", "surplus_withdrawn"]
            .iter()
            .map(|k| {
                r[*k]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{k} missing in {r}"))
            })
            .sum()
    };
    // The shipped scenario over-samples Gyre's policy and not the baselines.
    assert!(
        surplus("elastic", &[]) > 0,
        "elastic over-samples by default"
    );
    assert_eq!(surplus("elastic", &["--oversample", "0"]), 0);
    assert_eq!(
        surplus("colocate", &[]),
        0,
        "the baselines do not by default"
    );
    assert!(
        surplus("colocate", &["--baseline-oversample", "2"]) > 0,
        "--baseline-oversample 2 left Colocate no surplus"
    );
}

#[test]
fn the_table_names_runs_and_speed_ups() {
    let out = ok(&QUICK);
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "elastic",
        "colocate",
        "async",
        "speed-up",
        "vs async",
        "published",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

#[test]
fn profile_prints_the_statistics_beside_the_targets() {
    let out = ok(&[
        "simulate",
        "--scenario",
        "nl2repo-122b",
        "--profile",
        "--profile-queries",
        "3000",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "mean execution (h)",
        "1.93",
        "mean query (h)",
        "2.96",
        "queries over 4 h",
        "9.51%",
        "harness timeouts",
        "6.25%",
        "overall timeouts",
        "0.87%",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

#[test]
fn plots_and_csv_files_are_written() {
    let dir = scratch("plots");
    let timeline = dir.join("roles.svg");
    let mut args = QUICK.to_vec();
    let t = timeline.to_str().unwrap().to_owned();
    let p = dir.join("all").to_str().unwrap().to_owned();
    let c = dir.join("csv").to_str().unwrap().to_owned();
    args.extend(["--timeline", &t, "--plots", &p, "--csv", &c]);
    ok(&args);
    let svg = std::fs::read_to_string(&timeline).unwrap();
    assert!(svg.contains("<svg") && svg.contains("cell 0 (core)") && svg.contains("training"));
    for f in [
        "timeline.svg",
        "steps.svg",
        "durations.svg",
        "breakdown.svg",
        "critical_path.svg",
    ] {
        let s = std::fs::read_to_string(dir.join("all").join(f)).unwrap();
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }
    let runs = std::fs::read_to_string(dir.join("csv/runs.csv")).unwrap();
    assert!(runs.starts_with("name,policy,phi,mu"));
    assert_eq!(runs.lines().count(), 4);
    let steps = std::fs::read_to_string(dir.join("csv/steps.csv")).unwrap();
    assert_eq!(steps.lines().count(), 1 + 3 * 3);
    assert!(
        std::fs::read_to_string(dir.join("csv/timeline.csv"))
            .unwrap()
            .contains("rollout")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_scenario_file_is_rejected_naming_the_field() {
    let dir = scratch("bad");
    let path = dir.join("bad.toml");
    let good = ok(&[
        "simulate",
        "--scenario",
        "nl2repo-122b",
        "--profile",
        "--profile-queries",
        "10",
    ]);
    assert!(good.status.success());
    let text = gyre_scenario_text();
    std::fs::write(
        &path,
        text.replace("cell_capacity = 144", "cell_capacity = 0"),
    )
    .unwrap();
    let out = gyre(&["simulate", "--scenario", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.cell_capacity"), "{err}");
    std::fs::write(&path, text.replace("[cluster]\n", "[cluster]\ncels = 8\n")).unwrap();
    let out = gyre(&["simulate", "--scenario", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cels"));
    let out = gyre(&["simulate", "--scenario", "no-such-scenario"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nl2repo-2.4t"));
    let mut args = QUICK.to_vec();
    args.extend(["--policy", "fastest"]);
    let out = gyre(&args);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run `fastest`"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn gyre_scenario_text() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("simulations/scenarios/nl2repo-122b.toml"),
    )
    .unwrap()
}

#[test]
fn swarm_prints_one_row_per_seed_and_a_summary() {
    let out = ok(&["simulate", "--swarm", "6", "--seed", "40"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.contains("loss") && h.contains("outcome")),
        "{text}"
    );
    for seed in 40..46 {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&seed.to_string()) && l.ends_with(" ok")),
            "no ok row for seed {seed}:\n{text}"
        );
    }
    assert!(text.contains("6 seeds: 6 ok, 0 failed"), "{text}");
}
