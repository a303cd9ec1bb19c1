//! The live harness and evaluator runners against a real `gyre gateway`
//! (script engine): harness timeouts kill the whole process group and the
//! workspace is still scored; exit 127 is a complete failure; evaluator
//! crashes are retried, never zeros; 256 concurrent harness processes each
//! make two HTTP calls and leave no process, descriptor or directory
//! behind; the bwrap sandbox hides hidden/ and keeps the rest read-only,
//! and with `network = "gateway"` reaches the gateway and no other port.

mod gateway;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::*;
use gyre::harness::workspace::content_hash;
use gyre::harness::{
    AdminHttp, EvalTarget, EvaluatorConfig, EvaluatorRunner, ExecutionRequest, GatewayAccess,
    HarnessRun, HarnessRunner, JobFile, RunOutcome, RunnerConfig, TaskSet, Verdict,
};
use gyre_actors::sched::proto::harness::HarnessOutcome;
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-hr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A task set of one task, `t`, with a workspace file and a hidden file.
fn task_set(dir: &Path) -> PathBuf {
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(tasks.join("t/workspace")).unwrap();
    std::fs::create_dir_all(tasks.join("t/hidden")).unwrap();
    std::fs::write(tasks.join("t/prompt.md"), "write done.txt").unwrap();
    std::fs::write(tasks.join("t/workspace/start.txt"), "start\n").unwrap();
    std::fs::write(tasks.join("t/hidden/answer.txt"), "secret\n").unwrap();
    tasks
}

fn sh(script: &Path, body: &str) -> String {
    std::fs::write(script, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

/// A job file in `dir` with the harness and evaluator commands given.
/// `timeout` is the harness timeout.
fn make_job(
    dir: &Path,
    harness: &[&str],
    evaluator: &[&str],
    timeout: &str,
    extra: &str,
) -> (JobFile, PathBuf) {
    task_set(dir);
    let text = format!(
        r#"
[tasks]
dir = "tasks"
[harness]
command = {harness}
timeout = "{timeout}"
kill_grace = "300ms"
[evaluator]
command = {evaluator}
timeout = "10s"
retry_delay = "50ms"
[run]
overall_timeout = "300s"
concurrency = 256
log_dir = "logs"
work_dir = "work"
{extra}
"#,
        harness = json!(harness),
        evaluator = json!(evaluator),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, &text).unwrap();
    (JobFile::load(&path).unwrap(), path)
}

struct Setup {
    runner: HarnessRunner,
    evaluator: EvaluatorRunner,
    tasks: TaskSet,
}

fn setup(g: &Gateway, job: &JobFile, path: &Path) -> Setup {
    let mut cfg = RunnerConfig::from_job(job, path);
    // The sandbox's forwarder (`network = "gateway"`) is gyre's own
    // hidden command, not this test binary's.
    cfg.forwarder = PathBuf::from(env!("CARGO_BIN_EXE_gyre"));
    let access: Arc<dyn GatewayAccess> = Arc::new(AdminHttp::new(
        &format!("http://{}", g.admin),
        &format!("http://{}", g.api),
        ADMIN_TOKEN,
    ));
    let evaluator = EvaluatorRunner::new(EvaluatorConfig::from_job(job, path, &cfg));
    let tasks = TaskSet::load(&JobFile::resolve(path, &job.tasks.dir)).unwrap();
    Setup {
        runner: HarnessRunner::new(cfg, Some(access)),
        evaluator,
        tasks,
    }
}

impl Setup {
    fn request(&self, label: &str) -> ExecutionRequest {
        ExecutionRequest {
            label: label.into(),
            task: Arc::new(self.tasks.tasks[0].clone()),
            group: "g0".into(),
            overall: Duration::from_secs(30),
            credentials: None,
            workspace: None,
            env: Vec::new(),
            status: None,
        }
    }

    fn target(&self, run: &HarnessRun) -> EvalTarget {
        EvalTarget {
            label: run.label.clone(),
            task: Arc::new(self.tasks.tasks[0].clone()),
            dirs: run.dirs.clone().expect("a preserved workspace"),
            execution: run.execution.clone(),
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; count it as alive (not reaped).
    Path::new(&format!("/proc/{pid}")).exists()
}

fn script_gateway(dir: &Path) -> Gateway {
    start(&[
        "--engine",
        &write_script(
            dir,
            &[
                json!({"text": "first answer"}),
                json!({"text": "second answer"}),
            ],
        ),
    ])
}

#[test]
fn a_hanging_harness_is_killed_with_its_group_and_its_workspace_is_scored() {
    let dir = temp("hang");
    let g = script_gateway(&dir);
    let harness = sh(
        &dir.join("hang.sh"),
        "echo partial > partial.txt\n\
         (trap '' TERM; sleep 1000) & echo $! > \"$GYRE_WORKSPACE/../bg.pid\"\n\
         trap '' TERM\n\
         echo started\n\
         sleep 1000",
    );
    let grade = sh(
        &dir.join("grade.sh"),
        "test -f \"$1/partial.txt\" && echo '{\"score\": 0.5, \"detail\": \"partial\"}' || echo '{\"score\": 0}'",
    );
    let (job, path) = make_job(&dir, &[&harness], &[&grade, "{workspace}"], "1s", "");
    let s = setup(&g, &job, &path);
    let rt = rt();
    let run = rt.block_on(s.runner.run(s.request("hang"), CancellationToken::new()));
    assert_eq!(run.outcome, RunOutcome::HarnessTimeout);
    assert_eq!(
        run.outcome.harness_outcome(),
        Some(HarnessOutcome::HarnessTimeout)
    );
    let dirs = run.dirs.clone().expect("the workspace is kept");
    let bg: i32 = std::fs::read_to_string(dirs.root.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(bg), "the background process of the group is gone");
    assert!(!dirs.home.exists() && !dirs.tmp.exists(), "scratch removed");
    assert_eq!(
        std::fs::read_to_string(&run.stdout).unwrap(),
        "started\n",
        "stdout went to its log"
    );
    let hash = content_hash(&dirs.workspace).unwrap();
    let eval = rt.block_on(
        s.evaluator
            .evaluate(&s.target(&run), Instant::now() + Duration::from_secs(20)),
    );
    let b = eval.binding.expect("scored");
    assert_eq!(b.score, 0.5);
    assert_eq!(b.workspace_hash, hash);
    assert_eq!(b.execution, run.execution);
    assert_eq!(b.detail, json!("partial"));
    // The execution is closed at the gateway: its key no longer works.
    let (_, body) = admin(&g, "GET", "/admin/executions");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let me = list["executions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["execution"] == json!(run.execution))
        .cloned()
        .unwrap();
    assert_eq!(me["closed"], json!(true));
    assert_eq!(me["group"], json!("g0"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exit_127_or_a_missing_program_is_a_complete_failure() {
    let dir = temp("127");
    let g = script_gateway(&dir);
    let harness = sh(&dir.join("missing.sh"), "no-such-harness-binary --go");
    let (job, path) = make_job(&dir, &[&harness], &["true"], "60s", "");
    let s = setup(&g, &job, &path);
    let rt = rt();
    let run = rt.block_on(s.runner.run(s.request("e127"), CancellationToken::new()));
    assert!(
        matches!(run.outcome, RunOutcome::CompleteFailure { ref why } if why.contains("exit 127")),
        "{:?}",
        run.outcome
    );
    assert_eq!(
        run.outcome.harness_outcome(),
        Some(HarnessOutcome::Failed { complete: true })
    );
    assert!(run.dirs.is_none(), "nothing to score is kept");
    assert!(!dir.join("work/e127").exists());

    let (job, path) = make_job(&dir, &["/no/such/program"], &["true"], "60s", "");
    let s = setup(&g, &job, &path);
    let run = rt.block_on(s.runner.run(s.request("enoent"), CancellationToken::new()));
    assert!(matches!(run.outcome, RunOutcome::CompleteFailure { .. }));

    // A non-zero exit after doing work is a failed run that is still scored.
    let harness = sh(&dir.join("fail.sh"), "echo x > out.txt; exit 2");
    let (job, path) = make_job(&dir, &[&harness], &["true"], "60s", "");
    let s = setup(&g, &job, &path);
    let run = rt.block_on(s.runner.run(s.request("e2"), CancellationToken::new()));
    assert_eq!(
        run.outcome,
        RunOutcome::Failed {
            code: Some(2),
            signal: None
        }
    );
    assert!(run.dirs.is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn evaluator_crashes_are_retried_and_a_never_valid_one_excludes() {
    let dir = temp("evalretry");
    let g = script_gateway(&dir);
    let counter = dir.join("attempts");
    let grade = sh(
        &dir.join("flaky.sh"),
        &format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}\n\
             case $n in 1) exit 3;; 2) echo 'not json'; exit 4;; esac\n\
             echo '{{\"score\": 0, \"valid\": true}}'",
            c = counter.display()
        ),
    );
    let (job, path) = make_job(&dir, &["true"], &[&grade], "60s", "");
    let s = setup(&g, &job, &path);
    let rt = rt();
    let run = rt.block_on(s.runner.run(s.request("flaky"), CancellationToken::new()));
    assert_eq!(run.outcome, RunOutcome::Completed);
    let eval = rt.block_on(
        s.evaluator
            .evaluate(&s.target(&run), Instant::now() + Duration::from_secs(20)),
    );
    assert_eq!(eval.attempts.len(), 3, "{:?}", eval.attempts);
    assert!(matches!(eval.attempts[0], Verdict::Crashed { .. }));
    assert!(matches!(eval.attempts[1], Verdict::Crashed { .. }));
    let b = eval.binding.expect("the third attempt scores");
    assert_eq!((b.score, b.attempt), (0.0, 2), "a valid zero is a zero");

    let never = sh(
        &dir.join("never.sh"),
        "echo '{\"score\": 1, \"valid\": false}'",
    );
    let (job, path) = make_job(&dir, &["true"], &[&never], "60s", "");
    let s = setup(&g, &job, &path);
    let run = rt.block_on(s.runner.run(s.request("never"), CancellationToken::new()));
    let eval = rt.block_on(
        s.evaluator
            .evaluate(&s.target(&run), Instant::now() + Duration::from_millis(600)),
    );
    assert!(eval.binding.is_none(), "no valid score: excluded");
    assert!(eval.attempts.len() >= 2, "retried within the budget");
    assert!(
        eval.attempts
            .iter()
            .all(|a| matches!(a, Verdict::Crashed { .. }))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Processes whose environment names one of `executions`.
fn processes_of(executions: &[String]) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let env = String::from_utf8_lossy(&env);
        if env
            .split('\0')
            .filter_map(|kv| kv.strip_prefix("GYRE_EXECUTION="))
            .any(|v| executions.iter().any(|x| x == v))
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn two_hundred_fifty_six_concurrent_harnesses_leave_nothing_behind() {
    let dir = temp("many");
    let g = script_gateway(&dir);
    let harness = sh(
        &dir.join("two_calls.sh"),
        "set -e\n\
         call() { curl -sf -H \"authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' \\\n\
           -d \"$1\" \"$OPENAI_BASE_URL/chat/completions\"; }\n\
         call '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"one\"}]}' > a.json\n\
         call '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"assistant\",\"content\":\"first answer\"},{\"role\":\"user\",\"content\":\"two\"}]}' > b.json\n\
         grep -q 'second answer' b.json",
    );
    let (job, path) = make_job(&dir, &[&harness], &["true"], "300s", "");
    let rt = rt();
    let fds_before = rt.block_on(async { fd_count() });
    let s = setup(&g, &job, &path);
    let runs: Vec<HarnessRun> = rt.block_on(async {
        let mut handles = Vec::new();
        for i in 0..256 {
            let (runner, req) = (s.runner.clone(), s.request(&format!("m{i:03}")));
            handles.push(tokio::spawn(async move {
                runner.run(req, CancellationToken::new()).await
            }));
        }
        let mut runs = Vec::new();
        for h in handles {
            runs.push(h.await.unwrap());
        }
        runs
    });
    let failed: Vec<_> = runs
        .iter()
        .filter(|r| r.outcome != RunOutcome::Completed)
        .map(|r| {
            (
                r.label.clone(),
                r.outcome.clone(),
                std::fs::read_to_string(&r.stderr).unwrap_or_default(),
            )
        })
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let ids: Vec<String> = runs.iter().filter_map(|r| r.execution.clone()).collect();
    assert_eq!(ids.len(), 256);
    // Every execution made its two calls, and is closed.
    let (_, body) = admin(&g, "GET", "/admin/executions");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ours: Vec<_> = list["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| ids.iter().any(|i| e["execution"] == json!(i)))
        .collect();
    assert_eq!(ours.len(), 256);
    assert!(
        ours.iter()
            .all(|e| e["calls"] == json!(2) && e["closed"] == json!(true)),
        "{ours:?}"
    );
    assert!(processes_of(&ids).is_empty(), "no harness process is left");
    // Workspaces are kept for the evaluator; discarding them leaves the
    // work dir empty, and HOME/TMPDIR were gone already.
    for r in &runs {
        let d = r.dirs.clone().unwrap();
        assert!(!d.home.exists() && !d.tmp.exists());
        rt.block_on(s.runner.discard(d, false));
    }
    let left: Vec<_> = std::fs::read_dir(dir.join("work")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    drop(s);
    // The admin client's pooled connections close with it.
    let fds_after = rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fd_count()
    });
    assert!(
        fds_after <= fds_before,
        "descriptors: {fds_before} before, {fds_after} after"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bwrap_keeps_hidden_away_and_the_rest_read_only() {
    if let Err(why) = gyre::harness::sandbox::bwrap_works(gyre::harness::job::NetworkMode::None) {
        eprintln!("\n*** SKIPPED bwrap_keeps_hidden_away_and_the_rest_read_only: {why} ***\n");
        return;
    }
    let dir = temp("bwrap");
    let g = script_gateway(&dir);
    let hidden = dir.join("tasks/t/hidden/answer.txt");
    let outside = dir.join("outside.txt");
    let harness = sh(
        &dir.join("probe.sh"),
        &format!(
            "echo ws > ws.txt && echo ws-ok\n\
             echo home > \"$HOME/h\" && echo home-ok\n\
             echo tmp > /tmp/t && echo tmp-ok\n\
             cat {hidden} 2>/dev/null && echo hidden-visible\n\
             echo x > {outside} 2>/dev/null && echo outside-writable\n\
             curl -s -m 2 -o /dev/null http://{api}/v1/models && echo net-reachable\n\
             cat start.txt\n\
             exit 0",
            hidden = hidden.display(),
            outside = outside.display(),
            api = g.api,
        ),
    );
    let grade = sh(
        &dir.join("grade.sh"),
        "cat \"$2/answer.txt\" >/dev/null && test -f \"$1/ws.txt\" && echo '{\"score\": 1}'",
    );
    let (job, path) = make_job(
        &dir,
        &[&harness],
        &[&grade, "{workspace}", "{hidden}"],
        "60s",
        "sandbox = \"bwrap\"\n[sandbox]\nnetwork = \"none\"\n",
    );
    let s = setup(&g, &job, &path);
    let rt = rt();
    let run = rt.block_on(s.runner.run(s.request("bw"), CancellationToken::new()));
    let out = std::fs::read_to_string(&run.stdout).unwrap();
    let err = std::fs::read_to_string(&run.stderr).unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed, "{out}\n{err}");
    assert_eq!(out, "ws-ok\nhome-ok\ntmp-ok\nstart\n", "stderr: {err}");
    assert!(!outside.exists());
    let eval = rt.block_on(
        s.evaluator
            .evaluate(&s.target(&run), Instant::now() + Duration::from_secs(20)),
    );
    assert_eq!(
        eval.binding.map(|b| b.score),
        Some(1.0),
        "the evaluator sees hidden/: {:?}",
        eval.attempts
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bwrap_with_the_gateway_network_reaches_the_gateway_and_nothing_else() {
    let test = "bwrap_with_the_gateway_network_reaches_the_gateway_and_nothing_else";
    if let Err(why) = gyre::harness::sandbox::bwrap_works(gyre::harness::job::NetworkMode::Gateway)
    {
        eprintln!("\n*** SKIPPED {test}: {why} ***\n");
        return;
    }
    let dir = temp("bwgw");
    let g = script_gateway(&dir);
    // A port of the host the harness must not reach, besides the
    // gateway's own admin listener.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let harness = sh(
        &dir.join("net.sh"),
        &format!(
            "echo \"base $OPENAI_BASE_URL\"\n\
             curl -sf -m 10 -H \"authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' \\\n\
               -d '{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"one\"}}]}}' \\\n\
               \"$OPENAI_BASE_URL/chat/completions\" | grep -q 'first answer' && echo gateway-answered\n\
             curl -s -m 2 -o /dev/null http://{other}/ && echo other-reachable\n\
             curl -s -m 2 -o /dev/null http://{admin}/admin/executions && echo admin-reachable\n\
             exit 0",
            other = other.local_addr().unwrap(),
            admin = g.admin,
        ),
    );
    let (job, path) = make_job(
        &dir,
        &[&harness],
        &["true"],
        "60s",
        "sandbox = \"bwrap\"\n[sandbox]\nnetwork = \"gateway\"\n",
    );
    let s = setup(&g, &job, &path);
    let run = rt().block_on(s.runner.run(s.request("gw"), CancellationToken::new()));
    let out = std::fs::read_to_string(&run.stdout).unwrap();
    let err = std::fs::read_to_string(&run.stderr).unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed, "{out}\n{err}");
    let port = g.api.rsplit(':').next().unwrap();
    assert_eq!(
        out,
        format!("base http://127.0.0.1:{port}/v1\ngateway-answered\n"),
        "stderr: {err}"
    );
    // The call went through and was recorded against this execution.
    let id = run.execution.clone().unwrap();
    let (_, body) = admin(&g, "GET", "/admin/executions");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ours = list["executions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["execution"] == json!(id))
        .cloned()
        .unwrap();
    assert_eq!(ours["calls"], json!(1), "{ours}");
    assert!(
        !run.dirs.unwrap().root.join("gateway/gateway.sock").exists(),
        "the bridge's socket goes with the run"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_command_prefix_wraps_the_harness() {
    let dir = temp("prefix");
    let g = script_gateway(&dir);
    let harness = sh(&dir.join("env.sh"), "echo \"$WRAPPED $PWD\"");
    let (job, path) = make_job(
        &dir,
        &[&harness],
        &["true"],
        "60s",
        "sandbox = \"command\"\n[sandbox]\nprefix = [\"env\", \"WRAPPED=yes\"]\n",
    );
    let s = setup(&g, &job, &path);
    let run = rt().block_on(s.runner.run(s.request("px"), CancellationToken::new()));
    assert_eq!(run.outcome, RunOutcome::Completed);
    let ws = run.dirs.unwrap().workspace;
    assert_eq!(
        std::fs::read_to_string(&run.stdout).unwrap(),
        format!("yes {}\n", ws.display())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
