//! The shipped job files' harnesses, unmodified, run by the harness runner
//! against a real `gyre gateway` whose script engine answers with a tool
//! call that writes a file and then a final answer: Claude Code (`claude
//! -p`, examples/jobs/python_claude_code.toml) and mini-swe-agent
//! (examples/jobs/python_mini_swe_agent.toml). Each reaches the gateway
//! with the execution's key from the environment the runner gives it,
//! executes the tool call in its own workspace, and is scored there. Each
//! skips loudly when its harness is not installed.

mod gateway;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::*;
use gyre::harness::{
    AdminHttp, EvalTarget, EvaluatorConfig, EvaluatorRunner, ExecutionRequest, GatewayAccess,
    HarnessRunner, JobFile, RunOutcome, RunnerConfig, TaskSet,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-ad-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the first Python task through `job` with `program` as the
/// harness's argv[0]; the script writes `solution.py` with a correct
/// fizzbuzz through the harness's own file or shell tool.
fn run_job(job_name: &str, program: &str, script: &[serde_json::Value], dir: &Path) {
    let path = repo().join("examples/jobs").join(job_name);
    let job = JobFile::load(&path).unwrap();
    let mut cfg = RunnerConfig::from_job(&job, &path);
    cfg.command[0] = program.into();
    // The job caps answers for the embedded model; the script's tool call
    // is longer than that cap.
    if let Some(i) = cfg
        .command
        .iter()
        .position(|a| a.starts_with("model.model_kwargs.max_tokens"))
    {
        cfg.command.drain(i - 1..=i);
    }
    cfg.log_dir = dir.join("logs");
    cfg.work_root = dir.join("work");
    let g = start(&[
        "--engine",
        &write_script(dir, script),
        "--context-window",
        "1000000",
    ]);
    let access: Arc<dyn GatewayAccess> = Arc::new(AdminHttp::new(
        &format!("http://{}", g.admin),
        &format!("http://{}", g.api),
        ADMIN_TOKEN,
    ));
    let evaluator = EvaluatorRunner::new(EvaluatorConfig::from_job(&job, &path, &cfg));
    let runner = HarnessRunner::new(cfg, Some(access));
    let tasks = TaskSet::load(&JobFile::resolve(&path, &job.tasks.dir)).unwrap();
    let task = Arc::new(
        tasks
            .tasks
            .iter()
            .find(|t| t.name == "fizzbuzz")
            .unwrap()
            .clone(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let run = rt.block_on(runner.run(
        ExecutionRequest {
            label: "fb".into(),
            task: task.clone(),
            group: "0".into(),
            overall: Duration::from_secs(300),
            credentials: None,
            workspace: None,
            env: Vec::new(),
            status: None,
        },
        CancellationToken::new(),
    ));
    let out = std::fs::read_to_string(&run.stdout).unwrap_or_default();
    let err = std::fs::read_to_string(&run.stderr).unwrap_or_default();
    assert_eq!(run.outcome, RunOutcome::Completed, "{out}\n{err}");
    let dirs = run.dirs.clone().unwrap();
    assert!(
        std::fs::read_to_string(dirs.workspace.join("solution.py"))
            .unwrap()
            .contains("FizzBuzz"),
        "the harness wrote solution.py: {out}\n{err}"
    );
    let eval = rt.block_on(evaluator.evaluate(
        &EvalTarget {
            label: run.label.clone(),
            task,
            dirs,
            execution: run.execution.clone(),
        },
        Instant::now() + Duration::from_secs(120),
    ));
    assert_eq!(
        eval.binding.map(|b| b.score),
        Some(1.0),
        "{:?}",
        eval.attempts
    );
    let (_, body) = admin(&g, "GET", "/admin/executions");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let me = &list["executions"][0];
    assert_eq!(me["execution"], json!(run.execution));
    assert!(me["calls"].as_u64().unwrap() >= 2, "{me}");
    assert_eq!(me["closed"], json!(true));
    // The gateway's own time per call (its records' start to end, engine
    // included: the script engine's is nearly nil) against the harness's
    // wall time, printed for the README (not asserted: no timed asserts).
    let id = run.execution.clone().unwrap();
    let (_, trace) = admin(&g, "GET", &format!("/admin/executions/{id}/trace"));
    let gateway_ms: f64 = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|r| {
            (r["end_ns"].as_u64().unwrap_or(0) - r["start_ns"].as_u64().unwrap_or(0)) as f64 / 1e6
        })
        .sum();
    eprintln!(
        "{job_name}: harness process {:.0} ms, gateway {:.1} ms over {} calls ({:.2}% of the wall time)",
        run.timings.process.as_secs_f64() * 1e3,
        gateway_ms,
        me["calls"],
        100.0 * gateway_ms / (run.timings.process.as_secs_f64() * 1e3)
    );
}

const FIZZBUZZ: &str = "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, n + 1)]\n";

#[test]
fn claude_code_solves_a_task_through_the_runner() {
    let claude = repo().join("target/gateway-npm/node_modules/.bin/claude");
    if !claude.exists() {
        eprintln!(
            "\n*** SKIPPED claude_code_solves_a_task_through_the_runner: no {} (.ci/run installs it) ***\n",
            claude.display()
        );
        return;
    }
    let dir = temp("claude");
    // Claude Code's Write tool wants an absolute path: the workspace is
    // <work>/<label>/workspace.
    let target = dir.join("work/fb/workspace/solution.py");
    // It writes an existing file only after reading it.
    let script = [
        json!({"text": "Reading the stub.", "tool_calls": [{"name": "Read",
            "arguments": {"file_path": target.to_str().unwrap()}}]}),
        json!({"text": "Writing the solution.", "tool_calls": [{"name": "Write",
            "arguments": {"file_path": target.to_str().unwrap(), "content": FIZZBUZZ}}]}),
        json!({"text": "Implemented fizzbuzz in solution.py."}),
    ];
    run_job(
        "python_claude_code.toml",
        claude.to_str().unwrap(),
        &script,
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mini_swe_agent_solves_a_task_through_the_runner() {
    let has_mini = std::process::Command::new("mini")
        .arg("--help")
        .env("MSWEA_CONFIGURED", "true")
        .stdin(std::process::Stdio::null())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_mini {
        eprintln!(
            "\n*** SKIPPED mini_swe_agent_solves_a_task_through_the_runner: `mini` not on PATH (pip install mini-swe-agent) ***\n"
        );
        return;
    }
    let dir = temp("mini");
    let write = format!("cat > solution.py <<'EOF'\n{FIZZBUZZ}EOF");
    let script = [
        json!({"text": "Writing the solution.", "tool_calls": [{"name": "bash",
            "arguments": {"command": write}}]}),
        json!({"text": "Done.", "tool_calls": [{"name": "bash",
            "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]}),
    ];
    run_job("python_mini_swe_agent.toml", "mini", &script, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}
