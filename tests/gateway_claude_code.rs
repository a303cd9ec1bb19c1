//! Unmodified Claude Code (npm `@anthropic-ai/claude-code`, headless)
//! completes runs through `gyre gateway`: with the script engine, the
//! model's Write tool call is executed by Claude Code, its tool_result comes
//! back in the next request, and the run's trace extends token for token;
//! with the embedded engine (the shipped BPE tokenizer, a 32K context), its
//! whole 60–80 KB request is rendered, fits, is generated from and recorded,
//! and Claude Code ends with the untrained model's text as its answer. Each
//! trace parses with `gyre trace stats`. Skips loudly only without node.

mod gateway;

use gateway::*;
use serde_json::json;

/// Claude Code's executable, installed on first use; `None` without node.
fn claude_bin(test: &str) -> Option<std::path::PathBuf> {
    let claude = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/gateway-npm/node_modules/.bin/claude");
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("\n*** SKIPPED {test}: node is not installed ***\n");
        return None;
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
    Some(claude)
}

/// `claude -p PROMPT --output-format json` against the gateway, headless.
fn run_claude(
    claude: &std::path::Path,
    dir: &std::path::Path,
    g: &Gateway,
    key: &str,
    prompt: &str,
) -> (std::process::Output, std::path::PathBuf) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = std::process::Command::new(claude)
        .args([
            "-p",
            prompt,
            "--output-format",
            "json",
            "--permission-mode",
            "acceptEdits",
        ])
        .current_dir(&work)
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", format!("http://{}", g.api))
        .env("ANTHROPIC_API_KEY", key)
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("claude runs");
    (out, work)
}

/// The execution's trace, written out and read by `gyre trace stats`.
fn assert_trace_parses(g: &Gateway, id: &str, dir: &std::path::Path) {
    let tf = dir.join("trace.jsonl");
    let (_, raw) = admin(g, "GET", &format!("/admin/executions/{id}/trace"));
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

#[test]
fn claude_code_runs_a_tool_call_through_the_gateway() {
    let Some(claude) = claude_bin("claude_code_runs_a_tool_call_through_the_gateway") else {
        return;
    };
    let dir = temp_dir("gw-claude");
    let target = dir.join("work").join("hello.py");
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
    let (out, _) = run_claude(
        &claude,
        &dir,
        &g,
        &key,
        "Create a file hello.py that prints hello",
    );
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
    assert_trace_parses(&g, &id, &dir);
}

#[test]
fn claude_code_gets_an_answer_from_the_embedded_engine() {
    let Some(claude) = claude_bin("claude_code_gets_an_answer_from_the_embedded_engine") else {
        return;
    };
    let dir = temp_dir("gw-claude-embedded");
    // The default context (32,768) and the shipped vocabulary, a one-layer,
    // one-head model and a short answer: one prefill of the whole request in
    // seconds of CPU (the default four-layer model's cost is in the README).
    let cfg = dir.join("model.toml");
    std::fs::write(
        &cfg,
        "layers = 1\nheads = 1\nwidth = 32\nffn = 64\nmax_new_tokens = 6\nseed = 3\n",
    )
    .unwrap();
    let g = start(&["--engine", &format!("embedded={}", cfg.display())]);
    let (id, key) = execution(&g);
    let (out, _) = run_claude(&claude, &dir, &g, &key, "Say hello");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "claude failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("JSON result: {stdout}"));
    assert_eq!(result["is_error"], false, "{stdout}");
    assert!(result["result"].is_string(), "{stdout}");
    let records = trace(&g, &id);
    assert!(!records.is_empty());
    for r in &records {
        assert_eq!(r["engine"], "embedded");
        let input = ids(&r["input_ids"]).len();
        // Claude Code's system prompt and tool schemas, all of it, as BPE tokens.
        assert!(input > 8_000 && input < 32_768, "{input} input tokens");
        assert!(!ids(&r["output_ids"]).is_empty());
    }
    assert_trace_parses(&g, &id, &dir);
}
