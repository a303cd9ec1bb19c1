//! `gyre gateway` over HTTP with the script engine: both APIs, streamed
//! and not, multi-turn tool use recorded token-exactly, admin API, bad
//! input in each API's own error shape, and durability across restart.

mod gateway;

use gateway::*;
use serde_json::{Value, json};

fn script() -> Vec<Value> {
    vec![
        json!({"thinking": "look first", "text": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]}),
        json!({"text": "There is one file."}),
        json!({"text": "Done."}),
    ]
}

fn tools_anthropic() -> Value {
    json!([{"name": "bash", "description": "run a command", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
}

#[test]
fn anthropic_multi_turn_tool_use_is_recorded_token_exactly() {
    let dir = temp_dir("gw-anthropic");
    let g = start(&["--engine", &write_script(&dir, &script())]);
    let (id, key) = execution(&g);
    let mut messages = vec![json!({"role": "user", "content": "what is here?"})];
    let (status, body) = post(
        &g,
        "/v1/messages?beta=true",
        &key,
        &json!({
        "model": "m", "max_tokens": 512, "system": "be brief", "tools": tools_anthropic(),
        "messages": messages, "thinking": {"type": "adaptive"}}),
    );
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["stop_reason"], "tool_use");
    let content = r["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[1], json!({"type": "text", "text": "Listing."}));
    assert_eq!(content[2]["name"], "bash");
    assert_eq!(content[2]["input"], json!({"cmd": "ls"}));
    let tool_id = content[2]["id"].as_str().unwrap().to_string();
    // The client re-serialises: drops thinking, string content as blocks.
    messages.push(json!({"role": "assistant", "content": [
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": tool_id, "name": "bash", "input": {"cmd": "ls"}}]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_id, "content": "a.txt", "cache_control": {"type": "ephemeral"}}]}));
    let (status, body) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({
        "model": "m", "max_tokens": 512, "stream": true,
        "system": [{"type": "text", "text": "be brief"}], "tools": tools_anthropic(), "messages": messages}),
    );
    assert_eq!(status, 200, "{body}");
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    let n = events.len();
    assert!(n > 7, "{events:?}");
    assert_eq!(
        events[..3],
        ["message_start", "ping", "content_block_start"]
    );
    assert!(
        events[3..n - 3].iter().all(|e| *e == "content_block_delta"),
        "{events:?}"
    );
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(
        &events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(sse_text(&body), "There is one file.");
    assert!(body.contains(r#""stop_reason":"end_turn""#), "{body}");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 2);
    assert_extends(&records);
    // The trace is `gyre trace` input.
    let tf = dir.join("trace.jsonl");
    let (_, raw) = admin(&g, "GET", &format!("/admin/executions/{id}/trace"));
    std::fs::write(&tf, raw).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["trace", "stats", tf.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn openai_chat_streamed_and_not_with_tool_calls() {
    let dir = temp_dir("gw-openai");
    let g = start(&["--engine", &write_script(&dir, &script())]);
    let (id, key) = execution(&g);
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "hi"}),
    ];
    let (status, body) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({
        "model": "m", "messages": messages, "tools": tools, "stream": true,
        "stream_options": {"include_usage": true}}),
    );
    assert_eq!(status, 200, "{body}");
    let chunks: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(chunks.last(), Some(&"[DONE]"));
    let parsed: Vec<Value> = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    let call = parsed
        .iter()
        .find_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .expect("a tool-call delta");
    let call_id = call[0]["id"].as_str().unwrap().to_string();
    assert!(
        parsed
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "tool_calls")
    );
    assert!(
        parsed.last().unwrap()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    messages.push(json!({"role": "assistant", "content": "Listing.", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "a.txt"}));
    let (status, body) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({
        "model": "m", "messages": messages, "tools": tools, "logprobs": true}),
    );
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["choices"][0]["message"]["content"], "There is one file.");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let lps = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let records = trace(&g, &id);
    assert_eq!(
        lps.len(),
        records[1]["output_ids"].as_array().unwrap().len()
    );
    assert_extends(&records);
    let (status, body) = request(
        &g.api,
        "GET",
        "/v1/models",
        &[("authorization", &format!("Bearer {key}"))],
        b"",
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn bad_input_gets_each_apis_error_shape_and_records_nothing() {
    let dir = temp_dir("gw-bad");
    let g = start(&[
        "--engine",
        &write_script(&dir, &script()),
        "--max-body-bytes",
        "4096",
        "--context-window",
        "400",
    ]);
    let (id, key) = execution(&g);
    let (other, other_key) = execution(&g);
    let ok = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]});
    // (path, headers, body, status, message part)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("/v1/messages", vec![("x-api-key", key.clone())], b"{not json".to_vec(), 400, "not valid JSON"),
        ("/v1/messages", vec![("x-api-key", key.clone())], br#"{"model": 1, "max_tokens": 5, "messages": []}"#.to_vec(), 400, "model: expected a string"),
        ("/v1/messages", vec![("x-api-key", key.clone())], br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400, "max_tokens: field required"),
        ("/v1/messages", vec![("x-api-key", key.clone())], json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "r"}]}]}).to_string().into_bytes(), 400, "toolu_nope"),
        ("/v1/messages", vec![("x-api-key", key.clone())], vec![b' '; 5000], 413, "larger than"),
        ("/v1/messages", vec![("x-api-key", key.clone())], br#"{"model": "m", "max_tokens": 5, "temperature": -1, "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400, "temperature"),
        ("/v1/messages", vec![], ok.to_string().into_bytes(), 401, "no API key"),
        ("/v1/messages", vec![("x-api-key", "gyre-wrong".into())], ok.to_string().into_bytes(), 401, "invalid API key"),
        ("/v1/messages", vec![("x-api-key", other_key.clone()), ("x-gyre-execution", id.clone())], ok.to_string().into_bytes(), 403, "another execution"),
        ("/v1/messages", vec![("x-api-key", key.clone())], json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "y".repeat(1000)}]}).to_string().into_bytes(), 400, "prompt is too long"),
        ("/v1/messages", vec![("x-api-key", key.clone()), ("x-gyre-purpose", "critic".into())], ok.to_string().into_bytes(), 400, "header x-gyre-purpose: \"critic\""),
    ];
    for (path, headers, body, status, want) in &cases {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (s, b) = request(&g.api, "POST", path, &h, body);
        assert_eq!(s, *status, "{want}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("JSON error body: {b}"));
        assert_eq!(v["type"], "error", "{b}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(want),
            "{want}: {b}"
        );
    }
    // OpenAI shape.
    let (s, b) = request(
        &g.api,
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key}"))],
        br#"{"model": "m", "messages": "x"}"#,
    );
    assert_eq!(s, 400);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages: expected an array"),
        "{b}"
    );
    let (s, b) = request(
        &g.api,
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key}"))],
        json!({"model": "m", "messages": [{"role": "user", "content": "y".repeat(1000)}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(s, 400);
    assert!(b.contains("context_length_exceeded"), "{b}");
    assert!(trace(&g, &id).is_empty());
    // The other execution still works; closed executions' keys are refused.
    assert_eq!(post(&g, "/v1/messages", &other_key, &ok).0, 200);
    // A call the harness marks as a critique is recorded as one (never a
    // training target); without the header a call is a policy turn.
    let (s, b) = request(
        &g.api,
        "POST",
        "/v1/messages",
        &[("x-api-key", &other_key), ("x-gyre-purpose", "critique")],
        ok.to_string().as_bytes(),
    );
    assert_eq!(s, 200, "{b}");
    let purposes: Vec<Value> = trace(&g, &other)
        .iter()
        .map(|r| r["purpose"].clone())
        .collect();
    assert_eq!(purposes, [json!("policy"), json!("critique")]);
    assert_eq!(
        admin(&g, "POST", &format!("/admin/executions/{other}/close")).0,
        200
    );
    let (s, b) = post(&g, "/v1/messages", &other_key, &ok);
    assert_eq!(s, 401, "{b}");
    assert!(b.contains("closed"));
    assert_eq!(trace(&g, &other).len(), 2);
    assert_eq!(
        request(&g.admin, "GET", "/admin/executions", &[], b"").0,
        401
    );
    let (s, m) = admin(&g, "GET", "/metrics");
    assert_eq!(s, 200);
    assert!(m.contains("gyre_gateway_calls_committed_total 2"), "{m}");
}

#[test]
fn records_survive_a_restart_on_the_same_store() {
    let dir = temp_dir("gw-store");
    let store = dir.join("store");
    let engine = write_script(&dir, &script());
    let (id, key, first) = {
        let g = start(&["--engine", &engine, "--store", store.to_str().unwrap()]);
        let (id, key) = execution(&g);
        let (s, b) = post(
            &g,
            "/v1/messages",
            &key,
            &json!({"model": "m", "max_tokens": 512, "tools": tools_anthropic(),
            "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(s, 200, "{b}");
        (id, key, serde_json::from_str::<Value>(&b).unwrap())
    };
    let g = start(&["--engine", &engine, "--store", store.to_str().unwrap()]);
    assert_eq!(trace(&g, &id).len(), 1);
    let tool_id = first["content"][2]["id"].as_str().unwrap();
    // The tool cache and history index came back too: the next turn extends.
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 512, "tools": tools_anthropic(),
        "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": tool_id, "name": "bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "a"}]}]}),
    );
    assert_eq!(s, 200, "{b}");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 2);
    assert_extends(&records);
}

/// The same streamed calls against an engine that fails mid-stream and one
/// that does not: identical client-visible streams and identical records.
#[test]
fn reroute_mid_stream_is_invisible_and_the_record_exact() {
    let dir = temp_dir("gw-reroute");
    let line = json!({"text": "A longer answer that streams.", "thinking": "hm"});
    let mut failing = line.clone();
    failing["fail_after"] = json!(7);
    let clean_dir = dir.join("clean");
    std::fs::create_dir_all(&clean_dir).unwrap();
    let flaky = start(&["--engine", &write_script(&dir, &[failing])]);
    let clean = start(&["--engine", &write_script(&clean_dir, &[line])]);
    let mut seen = Vec::new();
    for g in [&flaky, &clean] {
        let (id, key) = execution(g);
        let (s, anth) = post(
            g,
            "/v1/messages",
            &key,
            &json!({"model": "m", "max_tokens": 200, "stream": true,
            "messages": [{"role": "user", "content": "go"}]}),
        );
        assert_eq!(s, 200, "{anth}");
        let (s, chat) = post(
            g,
            "/v1/chat/completions",
            &key,
            &json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "again"}]}),
        );
        assert_eq!(s, 200, "{chat}");
        let chat: Vec<Value> = chat
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .map(|mut v| {
                v["created"] = json!(0);
                v["id"] = json!("");
                v
            })
            .collect();
        let anth: Vec<Value> = anth
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .map(|mut v| {
                v["message"]["id"] = json!("");
                v
            })
            .collect();
        let records: Vec<(Value, Value)> = trace(g, &id)
            .into_iter()
            .map(|r| (r["output_ids"].clone(), r["output_logprobs"].clone()))
            .collect();
        seen.push((anth, chat, records));
    }
    assert_eq!(sse_text_of(&seen[0].0), "A longer answer that streams.");
    assert_eq!(seen[0], seen[1]);
    let (_, m) = admin(&flaky, "GET", "/metrics");
    assert!(m.contains("gyre_gateway_reroutes_total 2"), "{m}");
}

fn sse_text_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|v| v["delta"]["type"] == "text_delta")
        .map(|v| v["delta"]["text"].as_str().unwrap().to_string())
        .collect()
}
