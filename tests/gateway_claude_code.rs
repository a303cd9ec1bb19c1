//! Unmodified Claude Code (npm `@anthropic-ai/claude-code`, headless)
//! completes a run through `gyre gateway` with the script engine: the
//! model's Write tool call is executed by Claude Code, its tool_result comes
//! back in the next request, and the run's trace extends token for token
//! and parses with `gyre trace stats`. Skips loudly only without node.

mod gateway;

use gateway::*;
use serde_json::json;

#[test]
fn claude_code_runs_a_tool_call_through_the_gateway() {
    let claude = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/gateway-npm/node_modules/.bin/claude");
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!(
            "\n*** SKIPPED claude_code_runs_a_tool_call_through_the_gateway: node is not installed ***\n"
        );
        return;
    }
    if !claude.exists() {
        let ok = std::process::Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(claude.ancestors().nth(3).unwrap())
            .arg("@anthropic-ai/claude-code")
            .status()
            .expect("npm runs");
        assert!(ok.success(), "npm install @anthropic-ai/claude-code failed");
    }
    let dir = temp_dir("gw-claude");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let target = work.join("hello.py");
    let script = vec![
        json!({"text": "I will create the file.", "tool_calls": [{"name": "Write",
            "arguments": {"file_path": target.to_str().unwrap(), "content": "print('hello')\n"}}]}),
        json!({"text": "Created hello.py, which prints hello."}),
    ];
    let g = start(&[
        "--engine",
        &write_script(&dir, &script),
        "--context-window",
        "1000000",
    ]);
    let (id, key) = execution(&g);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = std::process::Command::new(&claude)
        .args([
            "-p",
            "Create a file hello.py that prints hello",
            "--output-format",
            "json",
            "--permission-mode",
            "acceptEdits",
        ])
        .current_dir(&work)
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", format!("http://{}", g.api))
        .env("ANTHROPIC_API_KEY", &key)
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("claude runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "claude failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("JSON result: {stdout}"));
    assert_eq!(result["is_error"], false, "{stdout}");
    assert_eq!(
        result["result"], "Created hello.py, which prints hello.",
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "print('hello')\n"
    );
    let records = trace(&g, &id);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_extends(&records);
    let tf = dir.join("trace.jsonl");
    let (_, raw) = admin(&g, "GET", &format!("/admin/executions/{id}/trace"));
    std::fs::write(&tf, raw).unwrap();
    let stats = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["trace", "stats", tf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
}
