//! The official `openai` and `anthropic` Python SDKs against `gyre
//! gateway` (tests/sdk/clients.py): multi-turn tool use over Messages, Chat
//! Completions and Responses, streamed and not;
//! every conversation's second call extends the first token for token, and
//! survives an engine failure mid-answer without the client noticing.
//! Skips, loudly, only when python3 or the SDKs are missing (.ci/run
//! installs them).

mod gateway;

use gateway::*;
use serde_json::json;

#[test]
fn python_sdks_drive_multi_turn_tool_use() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import openai, anthropic"])
        .output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!(
            "\n*** SKIPPED python_sdks_drive_multi_turn_tool_use: python3 with the openai and anthropic packages is not installed (pip install openai anthropic) ***\n"
        );
        return;
    }
    let dir = temp_dir("gw-sdk");
    let script = vec![
        json!({"thinking": "look first", "text": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}], "token_delay_ms": 0}),
        // Every second turn is rerouted mid-answer: the clients must not notice.
        json!({"text": "There is one file.", "fail_after": 5}),
    ];
    let g = start(&["--engine", &write_script(&dir, &script)]);
    let execs: Vec<(String, String)> = (0..6).map(|_| execution(&g)).collect();
    let keys: Vec<&str> = execs.iter().map(|(_, k)| k.as_str()).collect();
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/clients.py"))
        .env("GYRE_API", format!("http://{}", g.api))
        .env("GYRE_KEYS", serde_json::to_string(&keys).unwrap())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(" ok")).count(),
        6,
        "{stdout}"
    );
    let (_, metrics) = admin(&g, "GET", "/metrics");
    assert!(
        metrics.contains("gyre_gateway_reroutes_total 6"),
        "{metrics}"
    );
    for (id, _) in &execs {
        let records = trace(&g, id);
        assert_eq!(records.len(), 2, "{id}");
        assert_extends(&records);
    }
}
