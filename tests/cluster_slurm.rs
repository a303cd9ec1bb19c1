//! `gyre train --cluster slurm` under a real Slurm: each node agent is one
//! `srun` step. Needs a running Slurm (`scripts/slurm-one-node.sh start`
//! as root on this machine; `.ci/run` does it and sets
//! `GYRE_REQUIRE_SLURM=1`, which turns "no Slurm here" into a failure).

use std::process::Command;

mod common;
use common::{field, ok, strip_ansi, versions};

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

/// Under `slurm-batch` a node agent killed mid-run is started again as a
/// new step of the same batch job (`srun --jobid=JOB --overlap`, once its
/// old step is gone from the job), joins the head and rejoins the run,
/// which trains every step.
#[test]
fn a_killed_agent_of_a_batch_job_is_restarted_as_a_step_of_that_job() {
    if skip_without_slurm() {
        return;
    }
    signal_a_batch_agent("-KILL");
}

/// A hung agent (SIGSTOP) of a batch job: its link is lost while its step
/// runs on, so the head fences it (`scancel --signal=KILL JOB.STEP`), and
/// once the step is gone starts it again as above.
#[test]
fn a_hung_agent_of_a_batch_job_is_fenced_by_its_step_and_restarted() {
    if skip_without_slurm() {
        return;
    }
    let text = signal_a_batch_agent("-STOP");
    assert!(
        text.contains("fencing a node agent whose link was lost"),
        "{text}"
    );
}

/// Runs 40 steps under `slurm-batch`, sends node 11's agent `signal` after
/// 3 updates, and checks the run finishes with the node restarted once as
/// a step of the head's own; returns the head's log.
fn signal_a_batch_agent(signal: &str) -> String {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut head = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args([
            "train",
            "--tiny",
            "--steps",
            "40",
            "--cluster",
            "slurm-batch",
        ])
        .args(["--srun-arg=--nodes=1", "--srun-arg=--overcommit", "--json"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gyre runs");
    let stderr = BufReader::new(head.stderr.take().unwrap());
    let mut lines = stderr.lines().map_while(Result::ok);
    let (mut agent, mut published, mut joined) = (None, 0, 0);
    let mut log = Vec::new();
    while !(published >= 3 && joined >= 3) {
        let Some(line) = lines.next() else {
            panic!("the head ended early:\n{}", log.join("\n"));
        };
        let line = strip_ansi(&line);
        if line.contains("node agent joined") {
            joined += 1;
            if field(&line, "node").as_deref() == Some("11") {
                agent = field(&line, "pid").and_then(|p| p.parse::<u32>().ok());
            }
        }
        published += usize::from(line.contains("update published"));
        log.push(line);
    }
    let agent = agent
        .filter(|p| *p > 1)
        .unwrap_or_else(|| panic!("node 11 joined:\n{}", log.join("\n")));
    assert!(
        Command::new("kill")
            .args([signal, &agent.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let rest = std::thread::spawn(move || lines.map(|l| strip_ansi(&l)).collect::<Vec<_>>());
    let mut stdout = Vec::new();
    std::io::Read::read_to_end(&mut head.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = head.wait().unwrap();
    log.extend(rest.join().unwrap());
    let text = log.join("\n");
    assert!(status.success(), "the run survives the loss:\n{text}");
    let r: serde_json::Value = serde_json::from_slice(&stdout).expect("a JSON report");
    assert_eq!(versions(&r), (1..=40).collect::<Vec<u64>>());
    let losses = r["node_losses"].as_array().expect("node_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["node"], 11);
    assert_eq!(losses[0]["restarts"], 1, "{losses:?}");
    assert!(losses[0]["back_at_secs"].is_f64(), "{losses:?}");
    let procs = r["processes"].as_array().unwrap();
    let job = &procs.iter().find(|p| p["node"] == 10).unwrap()["pid"];
    let node11 = procs.iter().find(|p| p["node"] == 11).unwrap();
    assert_ne!(
        &node11["pid"], job,
        "the restarted agent is the head's own srun step, not the batch script's: {node11}"
    );
    text
}
