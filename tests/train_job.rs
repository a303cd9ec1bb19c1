//! `gyre train --job`: a user's harness and evaluator commands as the
//! cluster's executions, through the gateway, on the tiny embedded model.
//!
//! - bad job files and task folders are refused naming the field or path;
//! - the byte game's openai-SDK agent trains through a job, and the job's
//!   odd executions behave as SPEC 3.3 says: one hangs after its work and
//!   is killed at the harness timeout yet scored and trained on, one exits
//!   127 and becomes a dummy, one's evaluator crashes twice and then
//!   scores, one's evaluator never gives a valid score (excluded, never a
//!   zero); every gateway call has its record;
//! - the Python task set trains through the plain openai-SDK agent.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-tj-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gyre(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gyre runs")
}

fn python_has_openai() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

const GOOD: &str = r#"
[tasks]
dir = "tasks"
[harness]
command = ["true"]
timeout = "1m"
[evaluator]
command = ["true"]
[run]
overall_timeout = "2m"
"#;

#[test]
fn bad_job_files_and_task_folders_are_refused_by_name() {
    let d = temp("bad");
    std::fs::create_dir_all(d.join("tasks/t1")).unwrap();
    std::fs::write(d.join("tasks/t1/prompt.md"), "do it").unwrap();
    let cases = [
        (
            GOOD.replace("timeout = \"1m\"", "timout = \"1m\""),
            "field `harness.timout`: unknown field `timout`",
        ),
        (
            GOOD.replace("[run]", "[run]\nsandbox = \"docker\""),
            "field `run.sandbox`: unknown variant `docker`",
        ),
        (
            format!("{GOOD}\n[sandbox.limits]\nopen_files = \"many\"\n"),
            "field `sandbox.limits.open_files`",
        ),
        (
            GOOD.replace("[\"true\"]\ntimeout", "[\"a\", \"{promt}\"]\ntimeout"),
            "field `harness.command`: unknown placeholder {promt}",
        ),
        (
            format!("{GOOD}\n[train.embedded.sched]\ncels = 2\n"),
            "field `train.embedded`: unknown field `sched.cels`",
        ),
        (
            format!("{GOOD}\n[sandbox]\nnetwork = \"gateway\"\n"),
            "field `sandbox.network`: `gateway` needs run.sandbox = \"bwrap\"",
        ),
        (
            GOOD.replace("dir = \"tasks\"", "dir = \"missing\""),
            "missing",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = d.join(format!("job{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = gyre(&["train", "--tiny", "--job", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} was accepted");
        assert!(err.contains(want), "case {i}: wanted {want:?} in {err}");
    }
    // A task folder without its prompt is named.
    std::fs::create_dir_all(d.join("tasks/t2/workspace")).unwrap();
    let path = d.join("job.toml");
    std::fs::write(&path, GOOD).unwrap();
    let out = gyre(&["train", "--tiny", "--job", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("t2/prompt.md"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

fn write_exec(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run_json(args: &[&str]) -> Value {
    let out = gyre(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gyre {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn the_byte_game_trains_through_a_job_and_odd_executions_end_as_spec_says() {
    if !python_has_openai() {
        eprintln!("\n*** SKIPPED the_byte_game_trains_through_a_job: python3 without openai ***\n");
        return;
    }
    let d = temp("byte");
    let ex = repo().join("examples");
    // Each run claims a number: 1 hangs after its work, 2 exits 127, 3's
    // evaluator never succeeds, 4's crashes twice first.
    let harness = d.join("harness.sh");
    write_exec(
        &harness,
        &format!(
            "n=1; while ! mkdir {d}/claim.$n 2>/dev/null; do n=$((n+1)); done\n\
             [ $n = 2 ] && exit 127\n\
             python3 {agent} || exit 1\n\
             [ $n = 3 ] && echo \"$GYRE_EXECUTION\" > {d}/never.id && touch never\n\
             [ $n = 4 ] && touch flaky\n\
             [ $n = 1 ] && echo \"$GYRE_EXECUTION\" > {d}/hung.id && sleep 1000\n\
             exit 0",
            d = d.display(),
            agent = ex.join("harness/byte_game/agent.py").display()
        ),
    );
    let grader = d.join("grade.sh");
    write_exec(
        &grader,
        &format!(
            "[ -f \"$1/never\" ] && exit 3\n\
             if [ -f \"$1/flaky\" ]; then\n\
               c={d}/flaky.count; n=$(cat $c 2>/dev/null || echo 0); echo $((n+1)) > $c\n\
               [ $n -lt 2 ] && {{ echo 'Traceback: boom' >&2; exit 4; }}\n\
             fi\n\
             exec python3 {grade} \"$1\"",
            d = d.display(),
            grade = ex.join("harness/byte_game/grade.py").display()
        ),
    );
    let job = d.join("job.toml");
    let text = format!(
        r#"
[tasks]
dir = "{tasks}"
[harness]
command = ["{harness}"]
timeout = "50s"
kill_grace = "1s"
[evaluator]
command = ["{grader}", "{{workspace}}"]
retry_delay = "200ms"
[run]
overall_timeout = "60s"
concurrency = 64
log_dir = "logs"
work_dir = "work"
# φ = 0: the two steps of the one burst train exactly the four groups
# dispatched, so the hung run's and the never-scored run's groups are among
# them and the run outlasts their timeouts.
[train]
steps = 2
phi = 0.0
mu = 2
batch_groups = 2
"#,
        tasks = ex.join("tasks/byte_game").display(),
        harness = harness.display(),
        grader = grader.display(),
    );
    std::fs::write(&job, text).unwrap();
    let report = run_json(&["train", "--tiny", "--json", "--job", job.to_str().unwrap()]);
    let j = &report["job"];
    assert_eq!(report["steps"], 2, "{report}");
    assert_eq!(j["harness_timeouts"], 1, "{j}");
    assert_eq!(j["dummies"], 1, "{j}");
    assert!(j["evaluator_retries"].as_u64().unwrap() >= 3, "{j}");
    assert_eq!(report["calls_without_record"], 0);
    assert!(report["gateway_calls"].as_u64().unwrap() > 0);
    for u in report["updates"].as_array().unwrap() {
        assert!(u["targets"].as_u64().unwrap() > 0, "{u}");
    }
    let bindings = std::fs::read_to_string(d.join("logs/bindings.jsonl")).unwrap();
    let bound: Vec<Value> = bindings
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let id = |f: &str| {
        std::fs::read_to_string(d.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    let (hung, never) = (id("hung.id"), id("never.id"));
    let hung_binding = bound
        .iter()
        .find(|b| b["execution"] == Value::String(hung.clone()))
        .expect("the hung run's workspace was scored");
    assert_eq!(hung_binding["workspace_hash"].as_str().unwrap().len(), 64);
    assert!(
        bound
            .iter()
            .all(|b| b["execution"] != Value::String(never.clone())),
        "an evaluator that never succeeds binds no score"
    );
    assert!(
        bound.iter().any(|b| b["attempt"] == 2),
        "the flaky evaluator scored on its third attempt"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_overall_timeout_is_counted_its_process_group_killed_and_its_group_trains() {
    if !python_has_openai() {
        eprintln!("\n*** SKIPPED an_overall_timeout_is_counted: python3 without openai ***\n");
        return;
    }
    let d = temp("overall");
    let ex = repo().join("examples");
    // The first run to start never ends, in a child of its own: the whole
    // group must go. Its harness timeout equals the overall timeout, so
    // the plane's overall timer (started at dispatch, before the process)
    // is what ends it. 45 s, not less: a dozen Python agents start at
    // once, and on a loaded two-core CI machine each took over 15 s to
    // finish, so a tighter budget timed out healthy runs too.
    let marker = format!("{}", 86_000_000 + std::process::id());
    let harness = d.join("harness.sh");
    write_exec(
        &harness,
        &format!(
            "if mkdir {d}/claim 2>/dev/null; then\n\
               echo \"$GYRE_EXECUTION\" > {d}/stuck.id\n\
               sleep {marker} & wait\n\
             fi\n\
             exec python3 {agent}",
            d = d.display(),
            agent = ex.join("harness/byte_game/agent.py").display()
        ),
    );
    let job = d.join("job.toml");
    let text = format!(
        r#"
[tasks]
dir = "{tasks}"
[harness]
command = ["{harness}"]
timeout = "45s"
kill_grace = "1s"
[evaluator]
command = ["python3", "{grade}", "{{workspace}}"]
[run]
overall_timeout = "45s"
log_dir = "logs"
work_dir = "work"
# φ = 0: the two steps of the one burst train exactly the four groups
# dispatched, the stuck run's among them.
[train]
steps = 2
phi = 0.0
mu = 2
batch_groups = 2
"#,
        tasks = ex.join("tasks/byte_game").display(),
        harness = harness.display(),
        grade = ex.join("harness/byte_game/grade.py").display(),
    );
    std::fs::write(&job, text).unwrap();
    let report = run_json(&["train", "--tiny", "--json", "--job", job.to_str().unwrap()]);
    let j = &report["job"];
    assert_eq!(report["steps"], 2, "{report}");
    assert_eq!(j["overall_timeouts"], 1, "{j}");
    assert_eq!(j["harness_timeouts"], 0, "{j}");
    assert_eq!(j["completed"], 15, "{j}");
    for u in report["updates"].as_array().unwrap() {
        assert!(u["targets"].as_u64().unwrap() > 0, "{u}");
    }
    assert_eq!(report["calls_without_record"], 0);
    let stuck = std::fs::read_to_string(d.join("stuck.id")).unwrap();
    let bindings = std::fs::read_to_string(d.join("logs/bindings.jsonl")).unwrap();
    assert!(
        !bindings.contains(stuck.trim()),
        "an overall timeout leaves no budget to score in: {bindings}"
    );
    let left = Command::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .expect("pgrep runs");
    assert!(
        left.stdout.is_empty(),
        "the stuck run's child outlived it: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_python_tasks_train_through_the_openai_agent() {
    if !python_has_openai() {
        eprintln!(
            "\n*** SKIPPED the_python_tasks_train_through_the_openai_agent: python3 without openai ***\n"
        );
        return;
    }
    let d = temp("py");
    let text = std::fs::read_to_string(repo().join("examples/jobs/python_openai.toml"))
        .unwrap()
        .replace(
            "log_dir = \"../../target/gyre-jobs/python_openai/logs\"",
            "log_dir = \"logs\"",
        )
        .replace(
            "work_dir = \"../../target/gyre-jobs/python_openai/work\"",
            "work_dir = \"work\"",
        )
        .replace("\"../", &format!("\"{}/examples/", repo().display()))
        .replace("{job_dir}/../", &format!("{}/examples/", repo().display()))
        .replace("AGENT_MAX_TURNS = \"4\"", "AGENT_MAX_TURNS = \"2\"");
    let job = d.join("job.toml");
    std::fs::write(&job, text).unwrap();
    let report = run_json(&[
        "train",
        "--tiny",
        "--json",
        "--steps",
        "1",
        "--job",
        job.to_str().unwrap(),
    ]);
    let j = &report["job"];
    assert_eq!(report["steps"], 1, "{report}");
    assert!(j["completed"].as_u64().unwrap() > 0, "{j}");
    assert!(j["scored"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(report["calls_without_record"], 0);
    assert!(report["updates"][0]["targets"].as_u64().unwrap() > 0);
    let bindings = std::fs::read_to_string(d.join("logs/bindings.jsonl")).unwrap();
    let first: Value = serde_json::from_str(bindings.lines().next().unwrap()).unwrap();
    assert_eq!(first["detail"]["runner"], grader_runner());
    let _ = std::fs::remove_dir_all(&d);
}

/// The Python grader's runner: pytest where it is installed, plain
/// asserts else.
fn grader_runner() -> &'static str {
    let has_pytest = Command::new("python3")
        .args(["-c", "import pytest"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if has_pytest { "pytest" } else { "asserts" }
}
