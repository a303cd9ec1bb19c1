//! `gyre train` with the gateway in front, as a user runs it: the tiny
//! cluster on the live host, each execution an external harness process
//! (examples/harness/byte_game/agent.py, the `openai` SDK, several calls
//! per execution) that reaches the policy only over HTTP, scored by its
//! grader. Checks that the calls went through the gateway, that every
//! answered call has the gateway's record (the engines write none, so the
//! trained targets come from those records), that the records in the
//! gateway's store name the scheduling plane's engines and versions, and
//! that training steps happen and publish new versions. The same run
//! across processes (`--cluster local`): the engines live in node agents
//! and stream their tokens to the head's gateway over the cluster link.
//! Skips, loudly, only when python3 with `openai` is missing (.ci/run
//! installs it).

mod common;
use common::ok;

use gyre::gateway::store::Store;

const AGENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/harness/byte_game/agent.py"
);
const GRADER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/harness/byte_game/grade.py"
);

fn python_openai_missing(test: &str) -> bool {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    if probe.map(|o| o.status.success()).unwrap_or(false) {
        return false;
    }
    eprintln!(
        "\n*** SKIPPED {test}: python3 with the openai package is not installed (pip install openai) ***\n"
    );
    true
}

/// `gyre train --tiny --steps STEPS` with `harness` (the byte game's
/// agent, or a command around it) and grader behind the gateway, the run
/// folder and the records' store under `dir`.
fn gateway_args(dir: &std::path::Path, steps: &str, harness: &str) -> Vec<String> {
    let evaluator = format!("python3 {GRADER} {{workspace}}");
    let (store, runs) = (dir.join("store"), dir.join("runs"));
    [
        "train",
        "--tiny",
        "--steps",
        steps,
        "--json",
        "--gateway-listen",
        "127.0.0.1:0",
        "--harness-cmd",
        harness,
        "--evaluator-cmd",
        &evaluator,
        "--run-dir",
        runs.to_str().unwrap(),
        "--gateway-store",
        store.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `gateway_args` for 2 steps of the agent, plus `extra`; its JSON report
/// and the folder holding its records' store and run directory.
fn train_through_the_gateway(extra: &[&str]) -> (serde_json::Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let args = gateway_args(dir.path(), "2", &format!("python3 {AGENT}"));
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    let out = ok(&args);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    (r, dir)
}

#[test]
fn external_harnesses_train_the_policy_through_the_gateway() {
    if python_openai_missing("external_harnesses_train_the_policy_through_the_gateway") {
        return;
    }
    let (r, dir) = train_through_the_gateway(&[]);
    check(&r, &r, dir.path());
}

#[test]
fn external_harnesses_train_a_cluster_of_processes_through_the_heads_gateway() {
    if python_openai_missing(
        "external_harnesses_train_a_cluster_of_processes_through_the_heads_gateway",
    ) {
        return;
    }
    let (r, dir) = train_through_the_gateway(&["--cluster", "local"]);
    check(&r, &r["gateway"], dir.path());
    // Every engine ran in a node agent: the head has none, so each
    // streamed token and each recorded call crossed a process boundary.
    let processes = r["processes"].as_array().unwrap();
    assert!(processes.len() >= 2, "{r}");
    let head = r["head_pid"].as_u64().unwrap();
    assert!(
        processes.iter().all(|p| p["agent_pid"]
            .as_u64()
            .is_some_and(|pid| pid != head && pid > 0)),
        "{r}"
    );
    // The trainers in the node agents read the packed rows from the head.
    assert!(r["bytes_moved"]["rows"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["node_losses"].as_array().unwrap().len(), 0, "{r}");
}

/// The checks of a run's report `r` (its gateway counters in `g`) and of
/// the records and workspaces it left under `dir`.
fn check(r: &serde_json::Value, g: &serde_json::Value, dir: &std::path::Path) {
    let store = dir.join("store");
    let runs = dir.join("runs");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    let gn = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{k} in {g}"));
    // Training happened and the policy moved on.
    assert_eq!(n("steps"), 2, "{r}");
    let updates = r["updates"].as_array().unwrap();
    assert_eq!(updates.len(), 2);
    let versions: Vec<u64> = updates
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2]);
    assert!(
        updates.iter().all(|u| u["targets"].as_u64().unwrap() > 0),
        "{r}"
    );
    // Every call went through the gateway and was recorded there.
    let calls = gn("gateway_calls");
    assert!(calls > 0 && gn("plane_calls_answered") >= calls, "{r}");
    assert_eq!(gn("calls_without_record"), 0, "{r}");
    assert!(gn("streamed_tokens") >= calls, "{r}");
    let task = &g["task"];
    assert!(task["scored"].as_u64().unwrap() > 0, "{r}");
    assert!(task["completed"].as_u64().unwrap() > 0, "{r}");
    // The harnesses ran in their workspaces and left what the grader read.
    let answered = std::fs::read_dir(runs.join("workspaces"))
        .unwrap()
        .filter(|d| d.as_ref().unwrap().path().join("answers.json").is_file())
        .count();
    assert!(answered as u64 >= task["scored"].as_u64().unwrap(), "{r}");
    // The gateway's durable records: one per recorded call, each naming
    // the plane engine and the published version that sampled it, with
    // several calls per execution extending one another.
    let loaded = Store::open(&store).unwrap().load().unwrap();
    assert_eq!(loaded.calls.len() as u64, calls);
    let mut per_exec = std::collections::BTreeMap::<String, Vec<_>>::new();
    for (exec, call) in &loaded.calls {
        let rec = &call.record;
        rec.validate().unwrap();
        let engine = rec.engine.as_deref().unwrap_or("");
        assert!(
            engine.starts_with("cell") || engine == "pool",
            "recorded engine {engine:?}"
        );
        assert!(rec.policy_version <= 2);
        per_exec.entry(exec.clone()).or_default().push(rec.clone());
    }
    let extended = per_exec.values().any(|recs| {
        recs.windows(2).any(|w| {
            let mut prefix = w[0].input_ids.clone();
            prefix.extend(&w[0].output_ids);
            w[1].input_ids.starts_with(&prefix)
        })
    });
    assert!(extended, "a second call extends the first token for token");
}

/// How many processes carry `GYRE_RUN=<run>`.
fn of_run(run: &str) -> usize {
    gyre::harness::orphans::find(run).len()
}

/// A 4-step cluster run of `harness` behind the gateway on `listen`,
/// checkpointed every step, that a test kills and resumes.
struct Resumable {
    dir: tempfile::TempDir,
    /// The checkpoints and the run's journal.
    ck: std::path::PathBuf,
    /// The run's tag (`GYRE_RUN`).
    run: String,
    store: std::path::PathBuf,
    runs: std::path::PathBuf,
    args: Vec<String>,
}

fn resumable(harness: &str, listen: &str) -> Resumable {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    let config = dir.path().join("ck.toml");
    std::fs::write(
        &config,
        format!("[checkpoint]\nevery = 1\ndir = \"{}\"\n", ck.display()),
    )
    .unwrap();
    let mut args = gateway_args(dir.path(), "4", harness);
    let at = args.iter().position(|a| a == "127.0.0.1:0").unwrap();
    args[at] = listen.to_string();
    let config = config.display().to_string();
    args.extend(["--cluster", "local", "--config", &config].map(String::from));
    Resumable {
        run: gyre::harness::orphans::tag_of(&ck),
        store: dir.path().join("store"),
        runs: dir.path().join("runs"),
        ck,
        args,
        dir,
    }
}

/// Waits (4 minutes at most) until `done`, while the `head` still runs.
fn wait_for(head: &mut std::process::Child, what: &str, mut done: impl FnMut() -> bool) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(240);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        assert!(
            head.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills (kill -9) the `head` of the run tagged `run` (journal in `ck`)
/// early in its second wave of executions: after the first update the
/// next groups start (boundary dispatch) as slots free, and a second after
/// two of them began, those are early in their 8 calls. Returns the
/// executions whose harnesses outlived it.
///
/// The second wave's harnesses are told apart by age, not by starting
/// after the journal's first update line: the boundary dispatch may
/// start them just before the head writes that line (it did on a loaded
/// machine, and the run then ended with no harness "new" after it),
/// while by then the first wave's have run for 7 s at least (a pause of
/// 1 s before each of their calls after the first).
fn kill_early_in_the_second_wave(
    head: &mut std::process::Child,
    ck: &std::path::Path,
    run: &str,
) -> std::collections::BTreeSet<String> {
    use std::time::{Duration, Instant};
    const YOUNG: Duration = Duration::from_secs(4);
    let mut first_seen: std::collections::BTreeMap<String, Instant> = Default::default();
    let mut young_running = || {
        let now = Instant::now();
        gyre::harness::orphans::leaders(run)
            .into_keys()
            .filter(|e| now - *first_seen.entry(e.clone()).or_insert(now) < YOUNG)
            .count()
    };
    wait_for(head, "the run never updated", || {
        young_running();
        journaled_updates(ck) >= 1
    });
    wait_for(head, "no harnesses began around the first update", || {
        young_running() >= 2
    });
    std::thread::sleep(Duration::from_secs(1));
    head.kill().unwrap();
    head.wait().unwrap();
    let left: std::collections::BTreeSet<String> =
        gyre::harness::orphans::leaders(run).into_keys().collect();
    assert!(!left.is_empty(), "no harness outlived the head");
    left
}

/// `gyre ARGS --resume` with `env`: its report, once it has checked that
/// the run finished with one update per version and adopted running
/// harnesses of the lost head.
fn resumed_warm(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let resume = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .arg("--resume")
        .envs(env.iter().copied())
        .output()
        .expect("gyre runs");
    assert!(
        resume.status.success(),
        "the resume failed: {}",
        String::from_utf8_lossy(&resume.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&resume.stdout).expect("a JSON report");
    eprintln!("adopted: {}", r["resumed"]["adopted"]);
    let versions: Vec<u64> = r["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3, 4], "one update per version: {r}");
    assert!(
        r["resumed"]["adopted"]["running"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "no running harness adopted: {r}"
    );
    r
}

/// How many updates the run's journal in `ck` holds.
fn journaled_updates(ck: &std::path::Path) -> usize {
    std::fs::read_to_string(ck.join("run.jsonl"))
        .map(|j| j.matches(r#""kind":"update""#).count())
        .unwrap_or(0)
}

#[test]
fn a_killed_heads_gateway_run_resumes_and_leaves_no_harness_of_it_running() {
    // kill -9 of the head of a cluster run with the gateway in front: its
    // harness processes (each with a straggler in its group, which the
    // head would have killed with it) outlive it. `--resume` on the same
    // journal kills them first, gives its own workspaces a folder of their
    // own, appends to the same gateway store and trains the rest: one
    // update per version, and no process of the run left afterwards.
    if python_openai_missing(
        "a_killed_heads_gateway_run_resumes_and_leaves_no_harness_of_it_running",
    ) {
        return;
    }
    use std::time::{Duration, Instant};
    let harness = format!("sh -c 'sleep 600 & exec python3 {AGENT}'");
    let Resumable {
        dir: _dir,
        ck,
        run,
        store,
        runs,
        args,
    } = resumable(&harness, "127.0.0.1:0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut head = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gyre runs");
    let updates = || journaled_updates(&ck);
    wait_for(
        &mut head,
        "the run never had 2 updates with harnesses running",
        || updates() >= 2 && of_run(&run) > 0,
    );
    head.kill().unwrap();
    head.wait().unwrap();
    let journaled = updates() as u64;
    // The stragglers outlive their head: nobody kills their groups.
    std::thread::sleep(Duration::from_millis(500));
    let left = of_run(&run);
    assert!(left > 0, "no harness process outlived the head");
    let lost = Store::open(&store).unwrap().load().unwrap();
    let first_calls = lost.calls.len();
    assert!(
        lost.executions.iter().any(|e| !e.closed),
        "the lost head left executions open"
    );

    let out = ok(&[args.as_slice(), &["--resume"]].concat());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let resumed = &r["resumed"];
    let from = resumed["from_version"]
        .as_u64()
        .expect("resumed.from_version");
    assert!(from >= 1 && from <= journaled, "{r}");
    assert!(
        resumed["harnesses_killed"].as_u64().unwrap() >= 1,
        "the lost head's harnesses were killed: {r}"
    );
    let versions: Vec<u64> = r["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3, 4], "one update per version: {r}");
    assert_eq!(r["redone_updates"].as_u64(), Some(journaled - from), "{r}");
    // Every answered call of the resumed run has its record, appended to
    // the records the lost head committed.
    let g = &r["gateway"];
    assert_eq!(g["calls_without_record"], 0, "{r}");
    let calls = g["gateway_calls"].as_u64().unwrap() as usize;
    assert!(calls > 0, "{r}");
    let loaded = Store::open(&store).unwrap().load().unwrap();
    assert_eq!(loaded.calls.len(), first_calls + calls, "{r}");
    // The lost head's executions were open when it died; the resume
    // closed them (their keys refused) and its own as they ended.
    assert!(
        loaded.executions.iter().all(|e| e.closed),
        "executions left open: {:?}",
        loaded
            .executions
            .iter()
            .filter(|e| !e.closed)
            .map(|e| &e.id)
            .collect::<Vec<_>>()
    );
    // Workspaces of the two heads in folders of their own.
    for w in [runs.join("workspaces"), runs.join("resume-1/workspaces")] {
        assert!(
            std::fs::read_dir(&w).is_ok_and(|mut d| d.next().is_some()),
            "{} holds workspaces",
            w.display()
        );
    }
    // Nothing of the run is left running: neither the lost head's
    // harnesses nor the stragglers of the resumed run's own.
    let deadline = Instant::now() + Duration::from_secs(10);
    while of_run(&run) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(of_run(&run), 0, "processes of the run still running");
}

#[test]
fn a_resumed_head_adopts_the_harnesses_a_killed_head_left_running() {
    // A warm resume: kill -9 of the head while harnesses run (each pauses
    // a second before every call and retries through the restart); the
    // resumed head listens on the same address, adopts every group with
    // a harness still running (their records go to its executions, their
    // calls reach its plane) and trains the rest: the adopted harnesses
    // finish the work they began under the lost head.
    if python_openai_missing("a_resumed_head_adopts_the_harnesses_a_killed_head_left_running") {
        return;
    }
    use std::time::{Duration, Instant};
    // The resumed gateway must listen where the lost one did.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Resumable {
        dir: _dir,
        ck,
        run,
        store,
        runs,
        args,
    } = resumable(&format!("python3 {AGENT}"), &format!("127.0.0.1:{port}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent_env = [
        ("AGENT_TURNS", "8"),
        ("AGENT_PAUSE", "1"),
        ("AGENT_MAX_RETRIES", "40"),
        ("RUST_LOG", "warn"),
    ];
    let mut head = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(&args)
        .envs(agent_env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gyre runs");
    let left = kill_early_in_the_second_wave(&mut head, &ck, &run);
    let lost = Store::open(&store).unwrap().load().unwrap();
    let calls_of = |calls: &[(String, gyre::gateway::execution::StoredCall)], e: &str| {
        calls.iter().filter(|(x, _)| x == e).count()
    };

    let r = resumed_warm(&args, &agent_env);
    let adopted = &r["resumed"]["adopted"];
    let n = |k: &str| adopted[k].as_u64().unwrap_or_else(|| panic!("{k}: {r}"));
    assert!(n("groups") >= 1, "{r}");
    assert_eq!(r["gateway"]["calls_without_record"], 0, "{r}");
    // The adopted harnesses went on calling the same gateway executions
    // (their keys still worked) and finished their work in the lost
    // head's workspaces.
    let loaded = Store::open(&store).unwrap().load().unwrap();
    let went_on: Vec<&String> = left
        .iter()
        .filter(|e| calls_of(&loaded.calls, e) > calls_of(&lost.calls, e))
        .collect();
    assert!(
        !went_on.is_empty(),
        "no adopted harness made a call through the resumed gateway: {r}"
    );
    let finished = std::fs::read_dir(runs.join("workspaces"))
        .unwrap()
        .filter(|d| d.as_ref().unwrap().path().join("answers.json").is_file())
        .count();
    assert!(
        finished >= went_on.len(),
        "{finished} answers in the lost head's workspaces"
    );
    assert!(
        loaded.executions.iter().all(|e| e.closed),
        "executions left open"
    );
    // No group trained twice in the model's history, checked from the
    // journal and the store: the groups each step's last sealing names
    // are distinct, and no adopted execution came from a group a step the
    // checkpoint held had trained.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(ck.join("run.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let resume_at = lines.iter().position(|l| l["kind"] == "resume").unwrap();
    let from = lines[resume_at]["version"].as_u64().unwrap();
    let sealings = |lines: &[serde_json::Value]| {
        let mut by_step = std::collections::BTreeMap::new();
        for l in lines.iter().filter(|l| l["kind"] == "sealed") {
            let i = l["incarnation"].as_u64().unwrap();
            let groups: Vec<(u64, u64)> = l["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| (i, g.as_u64().unwrap()))
                .collect();
            by_step.insert(l["step"].as_u64().unwrap(), groups);
        }
        by_step
    };
    let durable: std::collections::BTreeSet<(u64, u64)> = sealings(&lines[..resume_at])
        .range(..from)
        .flat_map(|(_, g)| g.clone())
        .collect();
    let history = sealings(&lines);
    assert_eq!(history.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    let trained: Vec<(u64, u64)> = history.values().flatten().copied().collect();
    let distinct: std::collections::BTreeSet<_> = trained.iter().collect();
    assert_eq!(
        distinct.len(),
        trained.len(),
        "a group trained twice: {history:?}"
    );
    let adopted: Vec<gyre::embedded::external::adopt::Launched> = loaded
        .executions
        .iter()
        .filter_map(gyre::embedded::external::adopt::Launched::of)
        .filter(|l| !l.adopted_from.is_empty())
        .collect();
    assert!(adopted.len() as u64 >= n("running"), "{r}");
    for l in &adopted {
        assert_eq!(l.incarnation, 1);
        assert!(
            l.adopted_from.iter().all(|g| !durable.contains(g)),
            "adopted from a trained group: {l:?} ({durable:?})"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while of_run(&run) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(of_run(&run), 0, "processes of the run still running");
}

#[test]
fn a_resumed_job_head_adopts_its_sandboxed_harnesses() {
    // The warm resume of a `--job` run: its harnesses run through the job
    // runner, in the bwrap sandbox with only the gateway reachable where
    // bwrap works (its bridge to the gateway dies with the head and the
    // resumed head binds it again), else unsandboxed. Adopted harnesses
    // finish, and the job's scorer scores their workspaces.
    let test = "a_resumed_job_head_adopts_its_sandboxed_harnesses";
    if python_openai_missing(test) {
        return;
    }
    use std::time::Duration;
    let sandboxed = gyre::harness::sandbox::bwrap_works(gyre::harness::job::NetworkMode::Gateway);
    let (run_sandbox, sandbox) = match &sandboxed {
        Ok(()) => ("sandbox = \"bwrap\"", "[sandbox]\nnetwork = \"gateway\"\n"),
        Err(why) => {
            eprintln!(
                "\n*** {test}: bwrap unusable here ({why}); the harnesses run unsandboxed ***\n"
            );
            ("", "")
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    // The job's folder holds its scripts: the sandbox shows it, while a
    // checkout under /tmp is hidden by the sandbox's fresh /tmp.
    let (agent, grader) = (dir.path().join("agent.py"), dir.path().join("grade.py"));
    std::fs::copy(AGENT, &agent).unwrap();
    std::fs::copy(GRADER, &grader).unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            r#"
[tasks]
dir = "{examples}/tasks/byte_game"
[harness]
command = ["python3", "{agent}"]
timeout = "120s"
kill_grace = "1s"
env = {{ AGENT_TURNS = "8", AGENT_PAUSE = "1", AGENT_MAX_RETRIES = "40" }}
[evaluator]
command = ["python3", "{grader}", "{{workspace}}"]
[run]
overall_timeout = "300s"
concurrency = 64
log_dir = "logs"
work_dir = "work"
gateway_store = "store"
listen = "127.0.0.1:{port}"
{run_sandbox}
{sandbox}
[train]
steps = 4
[train.embedded.checkpoint]
every = 1
dir = "{ck}"
"#,
            ck = ck.display(),
            agent = agent.display(),
            grader = grader.display(),
        ),
    )
    .unwrap();
    let run = gyre::harness::orphans::tag_of(&ck);
    let args = [
        "train",
        "--tiny",
        "--json",
        "--job",
        job.to_str().unwrap(),
        "--cluster",
        "local",
    ];
    let mut head = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gyre runs");
    let left = kill_early_in_the_second_wave(&mut head, &ck, &run);

    let r = resumed_warm(&args, &[("RUST_LOG", "warn")]);
    // An adopted harness's workspace was scored by the job's evaluator
    // (the scorer knew it: the adopting launcher kept it for it).
    let bindings = std::fs::read_to_string(dir.path().join("logs/bindings.jsonl")).unwrap();
    let scored: std::collections::BTreeSet<String> = bindings
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|b| b["execution"].as_str().map(String::from))
        .collect();
    assert!(
        left.iter().any(|e| scored.contains(e)),
        "no adopted harness was scored: {r}"
    );
    assert_eq!(r["job"]["dummies"], 0, "{r}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while of_run(&run) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(of_run(&run), 0, "processes of the run still running");
}

#[test]
fn ctrl_c_or_sigterm_ends_a_gateway_runs_harnesses_and_their_stragglers() {
    // Harnesses run in process groups of their own, so the terminal's
    // Ctrl-C never reaches them: `gyre train` ends them itself before it
    // exits on SIGINT or SIGTERM, stragglers and a hung evaluator
    // included, in one process and as the head of a cluster.
    if python_openai_missing("ctrl_c_or_sigterm_ends_a_gateway_runs_harnesses_and_their_stragglers")
    {
        return;
    }
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    for (signal, extra, code) in [
        (Signal::SIGINT, &[][..], 130),
        (Signal::SIGTERM, &["--cluster", "local"][..], 143),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        std::fs::create_dir_all(&runs).unwrap();
        let run = gyre::harness::orphans::tag_of(&runs);
        let harness = format!("sh -c 'sleep 600 & exec python3 {AGENT}'");
        let mut args = gateway_args(dir.path(), "50", &harness);
        args.extend(extra.iter().map(|s| s.to_string()));
        // An evaluator that hangs (it carries no run tag): the signal
        // must end it too.
        let hang = format!("sleep {}", 6000 + code);
        let at = args.iter().position(|a| a == "--evaluator-cmd").unwrap();
        args[at + 1] = hang.clone();
        let evaluators = || processes_running(&hang);
        let mut gyre = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gyre runs");
        // Harnesses and their stragglers running.
        let deadline = Instant::now() + Duration::from_secs(180);
        while of_run(&run) < 4 || evaluators() == 0 {
            assert!(
                Instant::now() < deadline,
                "no harnesses and evaluator running"
            );
            assert!(gyre.try_wait().unwrap().is_none(), "the run ended early");
            std::thread::sleep(Duration::from_millis(50));
        }
        kill(Pid::from_raw(gyre.id() as i32), signal).unwrap();
        let out = gyre.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{signal}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("stopped by {signal}")),
            "{signal}: {stderr}"
        );
        // SIGKILL is asynchronous: give the kernel a moment to reap.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (of_run(&run) > 0 || evaluators() > 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            of_run(&run),
            0,
            "{signal}: processes of the run left running"
        );
        assert_eq!(evaluators(), 0, "{signal}: an evaluator left running");
    }
}

/// How many processes run exactly `command` (its words).
fn processes_running(command: &str) -> usize {
    let want: Vec<u8> = command
        .split(' ')
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
                .count()
        })
        .unwrap_or(0)
}
