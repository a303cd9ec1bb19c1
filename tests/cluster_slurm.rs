//! `gyre train --cluster slurm` under a real Slurm: each node agent is one
//! `srun` step. Needs a running Slurm (`scripts/slurm-one-node.sh start`
//! as root on this machine; `.ci/run` does it and sets
//! `GYRE_REQUIRE_SLURM=1`, which turns "no Slurm here" into a failure).

use std::process::Command;

mod common;
use common::{ok, versions};

fn slurm_is_up() -> bool {
    Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|s| ["idle", "mixed", "allocated"].contains(&s.trim()))
        })
}

fn skip_without_slurm() -> bool {
    if slurm_is_up() {
        return false;
    }
    assert!(
        std::env::var_os("GYRE_REQUIRE_SLURM").is_none(),
        "GYRE_REQUIRE_SLURM is set but no Slurm node is up (sinfo)"
    );
    eprintln!("skipped: no Slurm node is up (run scripts/slurm-one-node.sh start as root)");
    true
}

/// A tiny 3-step run placed by `placement` (with `extra` arguments): its
/// report, checked for what every placement must give, and its processes.
fn three_steps(placement: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["train", "--tiny", "--steps", "3", "--cluster", placement];
    args.extend(extra);
    args.push("--json");
    let out = ok(&args);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(r["placement"], placement);
    assert_eq!(r["steps"], 3);
    let versions = versions(&r);
    assert_eq!(versions, [1, 2, 3]);
    assert!(r["bytes_moved"]["weights"].as_u64().unwrap() > 0);
    let procs = r["processes"].as_array().unwrap().clone();
    assert_eq!(procs.len(), 3);
    procs
}

/// `--cluster slurm-batch`: the head submits the generated batch script
/// with `sbatch` (one allocation, every node agent one step of it) and the
/// agents connect back. On the one-node test cluster the script's
/// `--nodes=3` is overridden to one node, its 3 tasks overcommitted.
#[test]
fn a_tiny_run_trains_from_a_submitted_batch_script() {
    if skip_without_slurm() {
        return;
    }
    let procs = three_steps(
        "slurm-batch",
        &["--srun-arg=--nodes=1", "--srun-arg=--overcommit"],
    );
    let job = &procs[0]["pid"];
    for p in &procs {
        assert_eq!(&p["pid"], job, "one batch job holds every node agent: {p}");
        assert!(
            p["agent_pid"].as_u64().unwrap() > 0,
            "each agent joined: {p}"
        );
    }
}

#[test]
fn a_tiny_run_trains_with_each_node_agent_an_srun_step() {
    if skip_without_slurm() {
        return;
    }
    for p in three_steps("slurm", &[]) {
        assert_ne!(
            p["pid"], p["agent_pid"],
            "the launcher started srun, which started the node agent: {p}"
        );
    }
}
