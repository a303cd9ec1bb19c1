//! `gyre train --cluster slurm` under a real Slurm: each node agent is one
//! `srun` step. Needs a running Slurm (`scripts/slurm-one-node.sh start`
//! as root on this machine; `.ci/run` does it and sets
//! `GYRE_REQUIRE_SLURM=1`, which turns "no Slurm here" into a failure).

use std::process::Command;

mod common;
use common::ok;

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

#[test]
fn a_tiny_run_trains_with_each_node_agent_an_srun_step() {
    if !slurm_is_up() {
        assert!(
            std::env::var_os("GYRE_REQUIRE_SLURM").is_none(),
            "GYRE_REQUIRE_SLURM is set but no Slurm node is up (sinfo)"
        );
        eprintln!("skipped: no Slurm node is up (run scripts/slurm-one-node.sh start as root)");
        return;
    }
    let out = ok(&[
        "train",
        "--tiny",
        "--steps",
        "3",
        "--cluster",
        "slurm",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(r["placement"], "slurm");
    assert_eq!(r["steps"], 3);
    let versions: Vec<u64> = r["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [1, 2, 3]);
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3);
    for p in procs {
        assert_ne!(
            p["pid"], p["agent_pid"],
            "the launcher started srun, which started the node agent: {p}"
        );
    }
    assert!(r["bytes_moved"]["weights"].as_u64().unwrap() > 0);
}
