//! `gyre train --cluster local` as a user runs it: the head and one node
//! agent per cell and for the pool, each its own OS process. A tiny run
//! trains (the policy version advances with every update, each update
//! trained targets) and reports what the one-process live run reports,
//! plus its processes and the payload bytes that crossed between them; no
//! node agent outlives the head. A rollout cell's, the pool's or a
//! satellite's agent killed mid-run costs capacity, not the run, which
//! reports the loss; the launcher starts the agent again and the node
//! rejoins. The core's, with checkpoints, is restarted and resumes from
//! its last durable checkpoint; without, it fails the run naming it and how
//! it ended.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{field, ok, strip_ansi, versions};

fn json(args: &[&str]) -> serde_json::Value {
    let out = ok(args);
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn gone(pid: u64) -> bool {
    // Reaped children leave no /proc entry (pids are not reused this fast).
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_tiny_run_trains_across_processes_and_reports_like_the_one_process_run() {
    // Micro-steps of 64 tokens (512 by default) give each step a dozen or
    // so: with the default's few, the core trained a whole step before a
    // switching cell was ready to join, once the fused kernels had made
    // training fast (session 17: a satellite joined none of 3 steps in
    // 7 runs of 7 on a fresh VM; with 64, every step of 8 runs, 5 of them
    // beside two busy loops).
    let config = std::env::temp_dir().join(format!("gyre-ct-{}.toml", std::process::id()));
    std::fs::write(&config, "[sched]\nmicro_tokens = 64\n").unwrap();
    let config = config.to_str().unwrap();
    let cluster = json(&[
        "train",
        "--tiny",
        "--config",
        config,
        "--steps",
        "3",
        "--cluster",
        "local",
        "--json",
    ]);
    let live = json(&[
        "train", "--tiny", "--config", config, "--steps", "3", "--host", "live", "--json",
    ]);
    let _ = std::fs::remove_file(config);

    assert_eq!(cluster["steps"], 3);
    let updates = cluster["updates"].as_array().expect("updates");
    let versions: Vec<u64> = updates
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(
        versions,
        [1, 2, 3],
        "one update per step, each a new version"
    );
    for u in updates {
        assert!(
            u["targets"].as_u64().unwrap() > 0,
            "every update trained: {u}"
        );
    }
    assert!(cluster["scored"].as_u64().unwrap() > 0);
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    };
    let missing: Vec<_> = keys(&live).difference(&keys(&cluster)).cloned().collect();
    assert!(missing.is_empty(), "the cluster report lacks {missing:?}");

    let head = cluster["head_pid"].as_u64().unwrap();
    let procs = cluster["processes"].as_array().expect("processes");
    assert_eq!(
        procs.len(),
        3,
        "cell 0, cell 1 and the pool each in a node agent"
    );
    let mut pids: BTreeSet<u64> = procs.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    pids.insert(head);
    assert_eq!(pids.len(), 4, "four distinct OS processes: {procs:?}");
    let roles: Vec<_> = procs
        .iter()
        .map(|p| p["roles"][0].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["cell 0", "cell 1", "pool"]);

    let moved = &cluster["bytes_moved"];
    for kind in ["weights", "kv", "gradients", "rows"] {
        assert!(moved[kind].is_u64(), "bytes_moved.{kind}: {moved}");
    }
    assert!(
        moved["weights"].as_u64().unwrap() > 0,
        "published weights reached other processes' engines"
    );
    assert!(
        moved["rows"].as_u64().unwrap() > 0,
        "prompts, records and rows crossed"
    );
    // A satellite in another process joined at least one step: its
    // gradient crossed in the ring all-reduce (283,904 bytes a step for
    // the tiny model's 35,488 f32 gradients, each sent and received once;
    // with 64-token micro-steps, 8 runs here moved 3 steps' worth).
    assert!(
        moved["gradients"].as_u64().unwrap() > 0,
        "gradients crossed between the core's and a satellite's processes: {moved}"
    );
    for p in procs {
        assert!(
            gone(p["pid"].as_u64().unwrap()),
            "node agent {p} outlived the head"
        );
    }
}

/// A head training `steps` steps (with `extra` arguments) whose log lines
/// arrive on the receiver, ANSI stripped; its stdout is piped.
fn head_with_log(
    steps: &str,
    extra: &[&str],
) -> (
    std::process::Child,
    mpsc::Receiver<String>,
    std::thread::JoinHandle<()>,
) {
    let mut head = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["train", "--tiny", "--steps", steps, "--cluster", "local"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gyre runs");
    let stderr = head.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Read to the end even once nobody listens: node agents that outlive
    // a killed head inherited this pipe, and would block on a full one.
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(strip_ansi(&line));
        }
    });
    (head, rx, reader)
}

#[test]
fn a_node_agent_without_the_cluster_secret_is_refused() {
    let (mut head, rx, reader) = head_with_log("10", &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the head starts");
        if line.contains("head listening") {
            break field(&line, "head_addr").unwrap();
        }
    };
    let intruder = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args([
            "node",
            "--head",
            &addr,
            "--node",
            "12",
            "--join-timeout-s",
            "2",
        ])
        .env("GYRE_CLUSTER_SECRET", "ab".repeat(32))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&intruder.stderr);
    assert!(!intruder.status.success(), "an intruder must not join");
    assert!(err.contains("could not join the head"), "{err}");
    let status = head.wait().unwrap();
    reader.join().unwrap();
    let log: Vec<String> = rx.try_iter().collect();
    assert!(
        status.success(),
        "the run goes on without the intruder:\n{}",
        log.join("\n")
    );
    assert!(
        log.iter()
            .any(|l| l.contains("the dialer does not hold the cluster secret")),
        "the head logged the refusal"
    );
}

/// A head whose node agent was killed: the head, its log receiver and
/// reader, the log so far and the agents' pids by node.
type KilledRun = (
    std::process::Child,
    mpsc::Receiver<String>,
    std::thread::JoinHandle<()>,
    Vec<String>,
    std::collections::BTreeMap<String, String>,
);

/// Starts a run, waits until it has published `after` updates with every
/// node agent started, and kill -9s node `victim`'s agent. Returns the
/// head, its log so far, the reader and the agents' pids by node.
fn kill_mid_run(steps: &str, victim: &str, after: usize, extra: &[&str]) -> KilledRun {
    signal_mid_run(steps, victim, after, extra, "-KILL")
}

/// [`kill_mid_run`] with another signal.
fn signal_mid_run(
    steps: &str,
    victim: &str,
    after: usize,
    extra: &[&str],
    signal: &str,
) -> KilledRun {
    let args: Vec<&str> = std::iter::once("--json")
        .chain(extra.iter().copied())
        .collect();
    let (head, rx, reader) = head_with_log(steps, &args);
    let mut pids = std::collections::BTreeMap::new();
    let mut published = 0;
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !(published >= after && pids.len() == 3) {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("the run never got going:\n{}", log.join("\n")));
        if line.contains("node agent started") {
            let node = field(&line, "node").unwrap();
            pids.insert(node, field(&line, "pid").unwrap());
        }
        published += usize::from(line.contains("update published"));
        log.push(line);
    }
    let killed = Command::new("kill")
        .args([signal, &pids[victim]])
        .status()
        .unwrap();
    assert!(killed.success());
    (head, rx, reader, log, pids)
}

fn finish(
    mut head: std::process::Child,
    rx: &mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    mut log: Vec<String>,
) -> (std::process::ExitStatus, String, Vec<u8>) {
    let mut stdout = Vec::new();
    if let Some(mut out) = head.stdout.take() {
        std::io::Read::read_to_end(&mut out, &mut stdout).unwrap();
    }
    let status = head.wait().unwrap();
    reader.join().unwrap();
    log.extend(rx.try_iter());
    let text = log.join("\n");
    // The core checks every step's micro-steps were each consumed once,
    // no group trained twice and the restored versions; the scheduler's
    // ledger refuses impossible role changes. Either logs an error.
    for broken in [
        "core protocol violation",
        "the ledger refused a scheduling decision",
    ] {
        assert!(!text.contains(broken), "{broken}:\n{text}");
    }
    (status, text, stdout)
}

#[test]
fn a_killed_rollout_node_costs_capacity_and_the_run_finishes() {
    // The pool's agent (node 5) serves rollouts only: its loss moves its
    // executions' calls to the cells and the run trains every step.
    let (head, rx, reader, log, pids) = kill_mid_run("12", "5", 2, &["--node-restarts", "0"]);
    let (status, text, stdout) = finish(head, &rx, reader, log);
    assert!(
        status.success(),
        "the run survives the pool's loss:\n{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(&stdout).expect("a JSON report");
    assert_eq!(report["steps"], 12, "every step trained");
    let versions = versions(&report);
    assert_eq!(
        versions,
        (1..=12).collect::<Vec<u64>>(),
        "one update per step"
    );
    let losses = report["node_losses"].as_array().expect("node_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["node"], 5);
    assert_eq!(losses[0]["roles"][0], "pool");
    assert!(losses[0]["after_steps"].as_u64().unwrap() >= 2);
    assert_eq!(
        losses[0]["restarts"], 0,
        "--node-restarts 0: not started again"
    );
    assert!(losses[0]["back_at_secs"].is_null());
    assert!(
        text.contains("node lost"),
        "the scheduler took the node out of the ledger:\n{text}"
    );
    for pid in pids.values() {
        assert!(
            gone(pid.parse().unwrap()),
            "node agent {pid} outlived the head"
        );
    }
}

/// Every pid a "node agent started" line of `text` names.
fn started_pids(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| l.contains("node agent started"))
        .filter_map(|l| Some((field(l, "node")?, field(l, "pid")?)))
        .collect()
}

#[test]
fn a_killed_cell_node_mid_run_is_restarted_and_rejoins_whatever_its_role() {
    // Cell 1 is in rollout or training (a satellite) when it dies: either
    // way the run trains on what is left, the launcher starts its agent
    // again, and the node rejoins the run: its new process loads the
    // published weights and serves or trains again.
    let (head, rx, reader, log, pids) = kill_mid_run("40", "11", 3, &[]);
    let (status, text, stdout) = finish(head, &rx, reader, log);
    assert!(status.success(), "the run survives cell 1's loss:\n{text}");
    let report: serde_json::Value = serde_json::from_slice(&stdout).expect("a JSON report");
    assert_eq!(report["steps"], 40, "every step trained");
    let versions = versions(&report);
    assert_eq!(
        versions,
        (1..=40).collect::<Vec<u64>>(),
        "one update per step"
    );
    let losses = report["node_losses"].as_array().expect("node_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["node"], 11);
    assert_eq!(losses[0]["restarts"], 1, "{losses:?}");
    let (lost, back) = (
        losses[0]["at_secs"].as_f64().unwrap(),
        losses[0]["back_at_secs"]
            .as_f64()
            .expect("cell 1 came back"),
    );
    assert!(back > lost, "{losses:?}");
    assert!(
        text.contains("node rejoined engine=cell1"),
        "the scheduler put cell 1 back into rollout:\n{text}"
    );
    let proc11 = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["node"] == 11)
        .expect("node 11 in the report");
    assert_ne!(
        proc11["agent_pid"].to_string(),
        pids["11"],
        "the report names the restarted agent"
    );
    assert!(
        proc11["bytes_moved"]["weights"].as_u64().unwrap() > 0,
        "the restarted agent loaded weights from the core: {proc11}"
    );
    let started = started_pids(&text);
    assert_eq!(
        started.iter().filter(|(n, _)| n == "11").count(),
        2,
        "node 11's agent started twice: {started:?}"
    );
    for (_, pid) in started {
        assert!(
            gone(pid.parse().unwrap()),
            "node agent {pid} outlived the head"
        );
    }
}

#[test]
fn a_hung_node_agent_is_fenced_restarted_and_rejoins() {
    // SIGSTOP: the process lives on but answers nothing. Its link times
    // out, the launcher kills it (fencing: it could not be trusted back),
    // and, since it exited, starts it again.
    let (head, rx, reader, log, pids) = signal_mid_run("80", "11", 3, &[], "-STOP");
    let (status, text, stdout) = finish(head, &rx, reader, log);
    assert!(status.success(), "the run survives a hung agent:\n{text}");
    let report: serde_json::Value = serde_json::from_slice(&stdout).expect("a JSON report");
    assert_eq!(versions(&report), (1..=80).collect::<Vec<u64>>());
    assert!(
        text.contains("fencing a node agent whose link was lost"),
        "the hung agent was killed:\n{text}"
    );
    let losses = report["node_losses"].as_array().expect("node_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["restarts"], 1, "{losses:?}");
    assert!(losses[0]["back_at_secs"].is_f64(), "{losses:?}");
    assert!(gone(pids["11"].parse().unwrap()), "the hung agent is gone");
    for (_, pid) in started_pids(&text) {
        assert!(
            gone(pid.parse().unwrap()),
            "node agent {pid} outlived the head"
        );
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A configuration file in `dir` that has the core checkpoint into `dir`
/// after every 2 updates; returns its path.
/// Starts a 40-step head with `extra` and kills it (-9) once `updates`
/// are published and its three agents started: its log so far, and the
/// thread still reading its output (which the agents inherited).
fn kill_head_after(updates: usize, extra: &[&str]) -> (String, std::thread::JoinHandle<()>) {
    kill_head_and(updates, extra, None)
}

/// [`kill_head_after`], killing first the agent of node `node` (the
/// machine lost with the head).
fn kill_head_and(
    updates: usize,
    extra: &[&str],
    node: Option<&str>,
) -> (String, std::thread::JoinHandle<()>) {
    let (mut head, rx, reader) = head_with_log("40", extra);
    let mut log = Vec::new();
    let mut published = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while !(published >= updates && started_pids(&log.join("\n")).len() == 3) {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("the run never got going:\n{}", log.join("\n")));
        published += usize::from(line.contains("update published"));
        log.push(line);
    }
    if let Some(node) = node {
        let pid = started_pids(&log.join("\n"))
            .into_iter()
            .find(|(n, _)| n == node)
            .map(|(_, pid)| pid)
            .expect("the node's agent");
        let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
        assert!(killed.success());
    }
    head.kill().unwrap();
    head.wait().unwrap();
    (log.join("\n"), reader)
}

fn checkpoint_every_2(dir: &std::path::Path) -> String {
    let config = dir.join("ck.toml");
    std::fs::write(
        &config,
        format!("[checkpoint]\nevery = 2\ndir = \"{}\"\n", dir.display()),
    )
    .unwrap();
    config.display().to_string()
}

#[test]
fn a_killed_core_node_resumes_from_its_last_checkpoint_on_a_restarted_agent() {
    // With checkpoints every 2 updates, the core's node (cell 0: the
    // trainer holding the weights and AdamW state) is a loss the run
    // survives: the launcher starts its agent again, the new trainer loads
    // `core.ckpt`, every process forgets the versions after it, and the
    // updates since it are made again. Whether cell 0 trained or served
    // when it died, the history is one update per version, 1..=40.
    let dir = tempfile::tempdir().unwrap();
    let config = checkpoint_every_2(dir.path());
    let (head, rx, reader, log, _) = kill_mid_run("40", "10", 3, &["--config", &config]);
    let (status, text, stdout) = finish(head, &rx, reader, log);
    assert!(
        status.success(),
        "the run survives the core's loss:\n{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(&stdout).expect("a JSON report");
    assert_eq!(
        versions(&report),
        (1..=40).collect::<Vec<u64>>(),
        "one update per version in the model's history"
    );
    let losses = report["node_losses"].as_array().expect("node_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["node"], 10);
    assert!(losses[0]["back_at_secs"].is_f64(), "{losses:?}");
    assert!(
        text.contains("core trainer restored") && text.contains("kept=false"),
        "a new core process restored from the checkpoint:\n{text}"
    );
    // Every publication is durable, so at most S − 1 = 1 completed update
    // is made again.
    assert!(report["redone_updates"].as_u64().unwrap() <= 1, "{report}");
    assert!(
        !text.contains("trains nothing"),
        "every micro-step trained, the redone ones too:\n{text}"
    );
    assert!(dir.path().join("core.ckpt").exists());
    for (_, pid) in started_pids(&text) {
        assert!(
            gone(pid.parse().unwrap()),
            "node agent {pid} outlived the head"
        );
    }
}

#[test]
fn a_killed_core_node_fails_the_run_naming_it() {
    // Without checkpoints there is nothing a new core could resume from.
    let (head, rx, reader, log, pids) = kill_mid_run("40", "10", 1, &[]);
    let (status, text, _) = finish(head, &rx, reader, log);
    assert!(!status.success(), "the core's loss fails the run");
    assert!(
        text.contains("node 10 (cell 0) failed: its process exited (signal: 9 (SIGKILL))")
            || text.contains("node 10 (cell 0) failed: its link to the head went down"),
        "the failure names the node and how it ended:\n{text}"
    );
    for pid in pids.values() {
        assert!(
            gone(pid.parse().unwrap()),
            "node agent {pid} outlived the head"
        );
    }
}

#[test]
fn a_resumed_head_adopts_the_node_agents_its_lost_head_left_waiting() {
    // A resumable run's agents outlive a killed head (they wait for a new
    // one, --agent-wait-s 60 by default) and the resumed head, listening
    // where the lost one did with the same secret (both kept in the
    // checkpoint directory), adopts them instead of starting new
    // processes: same pids, the history one update per version, and the
    // adopted agents stopped at the end like launched ones.
    let dir = tempfile::tempdir().unwrap();
    let config = checkpoint_every_2(dir.path());
    let (log, reader) = kill_head_after(5, &["--json", "--config", &config]);
    let agents: Vec<u64> = started_pids(&log)
        .iter()
        .map(|(_, pid)| pid.parse().unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for pid in &agents {
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "agent {pid} did not wait for a new head"
        );
    }
    for f in ["cluster.secret", "head.addr", "agents.json"] {
        assert!(dir.path().join(f).exists(), "{f} not kept");
    }

    let args: Vec<String> = ["train", "--tiny", "--steps", "40", "--cluster", "local"]
        .iter()
        .map(|a| a.to_string())
        .chain([
            "--config".into(),
            config.clone(),
            "--json".into(),
            "--resume".into(),
        ])
        .collect();
    let report = json(&strs(&args));
    assert_eq!(report["resumed"]["agents_adopted"], 3, "{report}");
    // The core's agent, finding its head gone, left its state: the resume
    // continues from the core's version, not from the periodic checkpoint
    // (every 2 updates), and makes no update again. Updates the lost head
    // had not journaled are carried by the word into the journal before
    // the resume's line.
    let word = &report["resumed"]["core_last_word"];
    assert_eq!(word["taken"], true, "{report}");
    let from = report["resumed"]["from_version"].as_u64().unwrap();
    assert_eq!(word["version"].as_u64(), Some(from), "{report}");
    assert!(from >= 5, "{report}");
    let journal = std::fs::read_to_string(dir.path().join("run.jsonl")).unwrap();
    let before_resume = journal.split(r#""kind":"resume""#).next().unwrap();
    assert_eq!(
        before_resume.matches(r#""kind":"update""#).count() as u64,
        from,
        "{journal}"
    );
    assert_eq!(report["redone_updates"], 0, "{report}");
    assert_eq!(report["resumed"]["lost_updates"], 0, "{report}");
    // The scheduler's counters continue the lost head's: the executions
    // it finished by the version resumed from are kept.
    let kept = report["resumed"]["counters_from"]["finished"]
        .as_u64()
        .unwrap_or_else(|| panic!("counters_from: {report}"));
    assert!(kept > 0, "{report}");
    let counter = |k: &str| report["counters"][k].as_u64().unwrap();
    assert!(
        counter("dispatched") >= counter("started")
            && counter("started") >= counter("finished")
            && counter("finished") > kept,
        "{report}"
    );
    let mut pids: Vec<u64> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    let mut before = agents.clone();
    pids.sort_unstable();
    before.sort_unstable();
    assert_eq!(pids, before, "the same processes, adopted");
    assert_eq!(
        versions(&report),
        (1..=40).collect::<Vec<u64>>(),
        "one update per version in the model's history"
    );
    for pid in &agents {
        assert!(gone(*pid), "adopted agent {pid} outlived the resumed run");
    }
    reader.join().unwrap();
}

#[test]
fn a_killed_head_is_resumed_from_the_core_checkpoint_and_its_journal() {
    // The head hosts the scheduling plane: kill -9 of it ends the run's
    // control, and its node agents, finding their head gone, exit. Run
    // again with `--resume` on the same `[checkpoint] dir`, a new head
    // starts every process from the core's last checkpoint (weights,
    // AdamW state, version c), keeps the journaled updates up to c, and
    // trains the rest: the history is one update per version, 1..=40.
    let dir = tempfile::tempdir().unwrap();
    let config = checkpoint_every_2(dir.path());
    // Agents that do not wait for a new head (with waiting ones, the next
    // test), and the core's node lost with the head: no last word from
    // the core (that case is the next test's), so the resume is from the
    // periodic checkpoint.
    let (log, reader) = kill_head_and(
        7,
        &["--json", "--config", &config, "--agent-wait-s", "0"],
        Some("10"),
    );
    let agents = started_pids(&log);
    for (node, pid) in &agents {
        let pid: u64 = pid.parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(gone(pid), "node {node}'s agent {pid} outlived its head");
    }
    reader.join().unwrap();
    let journal = std::fs::read_to_string(dir.path().join("run.jsonl")).unwrap();
    let journaled = journal.matches(r#""kind":"update""#).count();
    assert!(journaled >= 7, "{journal}");

    let run = ["train", "--tiny", "--steps", "40", "--cluster", "local"];
    let with = |more: &[&'static str]| -> Vec<String> {
        run.iter()
            .chain(&["--config"])
            .map(|a| a.to_string())
            .chain([config.clone()])
            .chain(more.iter().map(|a| a.to_string()))
            .collect()
    };
    // The directory holds a run: a new one there is refused.
    let out = common::gyre(&strs(&with(&[])));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--resume"), "{err}");

    let report = json(&strs(&with(&["--json", "--resume"])));
    let from = report["resumed"]["from_version"]
        .as_u64()
        .expect("resumed.from_version");
    assert!(from >= 6 && from % 2 == 0, "{report}");
    assert_eq!(
        versions(&report),
        (1..=40).collect::<Vec<u64>>(),
        "one update per version in the model's history"
    );
    assert_eq!(
        report["redone_updates"].as_u64(),
        Some(journaled as u64 - from),
        "the journaled updates after the checkpoint are made again"
    );
    assert_eq!(report["resumed"]["earlier_resumes"], 0);
    assert_eq!(report["resumed"]["lost_updates"], journaled as u64 - from);
    assert!(report["resumed"]["core_last_word"].is_null(), "{report}");
    // Every step after the checkpoint trained targets from it.
    let updates = report["updates"].as_array().unwrap();
    assert!(
        updates[from as usize..]
            .iter()
            .all(|u| u["targets"].as_u64().unwrap() > 0),
        "{report}"
    );

    // The run is over: resuming it again has nothing left to train.
    let out = common::gyre(&strs(&with(&["--resume"])));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nothing left to train"),
        "{err}"
    );
}
