//! The gateway's tool_choice enforcement, streamed Chat Completions
//! log-probs and the durable Responses store, against `gyre gateway` with
//! the script engine (a test double that replays scripted continuations;
//! what is under test is the gateway around it).

mod gateway;

use gateway::*;
use serde_json::{Value, json};

fn tools() -> Value {
    json!([{"name": "bash", "description": "run a command",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
           {"name": "read", "description": "read a file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}])
}

fn chat_tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
           {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}])
}

/// The built-in tokenizer is byte-level: ids below 256 are the bytes.
fn text_of(ids: &[u64]) -> String {
    let bytes: Vec<u8> = ids.iter().filter(|&&i| i < 256).map(|&i| i as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn tool_choice_forces_the_call_or_hides_the_tools() {
    let dir = temp_dir("gw-choice");
    // Continuations of the forced openings: the script engine writes only
    // what the model would sample after them.
    let script = vec![
        json!({"text": "{\"cmd\": \"ls\"}}\n</tool_call>"}),
        json!({"text": "read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>"}),
        json!({"text": "no tools here"}),
    ];
    let g = start(&["--engine", &write_script(&dir, &script)]);
    let (id, key) = execution(&g);
    let user = json!([{"role": "user", "content": "list files"}]);
    // Anthropic, a named tool: the reply is that tool's call.
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 64, "messages": user, "tools": tools(),
                "tool_choice": {"type": "tool", "name": "bash"}}),
    );
    assert_eq!(s, 200, "{b}");
    let r: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(r["stop_reason"], "tool_use", "{b}");
    let call = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["name"], "bash");
    assert_eq!(call["input"], json!({"cmd": "ls"}));
    // OpenAI, required: the model picks the tool after the forced opening.
    let (s, b) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "messages": [{"role": "user", "content": "show a.txt"}],
                "tools": chat_tools(), "tool_choice": "required"}),
    );
    assert_eq!(s, 200, "{b}");
    let r: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{b}");
    let f = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f["name"], "read");
    assert_eq!(f["arguments"], "{\"path\":\"a.txt\"}");
    // none: the tools are not rendered at all.
    let (s, b) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "messages": [{"role": "user", "content": "just talk"}],
                "tools": chat_tools(), "tool_choice": "none"}),
    );
    assert_eq!(s, 200, "{b}");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 3);
    let inputs: Vec<String> = records
        .iter()
        .map(|r| text_of(&ids(&r["input_ids"])))
        .collect();
    assert!(
        inputs[0].ends_with("<tool_call>\n{\"name\": \"bash\", \"arguments\": "),
        "the forced opening ends the recorded input: {:?}",
        &inputs[0][inputs[0].len().saturating_sub(80)..]
    );
    assert!(inputs[1].ends_with("<tool_call>\n{\"name\": \""));
    assert!(inputs[0].contains("# Tools") && inputs[1].contains("# Tools"));
    assert!(!inputs[2].contains("# Tools"), "{}", inputs[2]);
    // A named tool the request does not offer, and required without tools.
    for (path, body) in [
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 8, "messages": user, "tools": tools(),
                   "tool_choice": {"type": "tool", "name": "write"}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": user, "tool_choice": "required"}),
        ),
    ] {
        let (s, b) = post(&g, path, &key, &body);
        assert_eq!(s, 400, "{b}");
        assert!(b.contains("tool_choice"), "{b}");
    }
    assert_eq!(trace(&g, &id).len(), 3, "refused calls are not recorded");
}

#[test]
fn streamed_chat_chunks_carry_the_outputs_logprobs() {
    let dir = temp_dir("gw-stream-logprobs");
    let script = vec![json!({"text": "Hello there, streamed."})];
    let g = start(&["--engine", &write_script(&dir, &script)]);
    let (id, key) = execution(&g);
    let (s, b) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "stream": true, "logprobs": true,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(s, 200, "{b}");
    let mut streamed = Vec::new();
    let mut text = String::new();
    for line in b.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(line).unwrap();
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
        }
        for t in choice["logprobs"]["content"]
            .as_array()
            .into_iter()
            .flatten()
        {
            streamed.push((
                t["token"].as_str().unwrap().to_string(),
                t["logprob"].as_f64().unwrap(),
            ));
        }
    }
    assert_eq!(text, "Hello there, streamed.");
    let record = &trace(&g, &id)[0];
    let recorded: Vec<f64> = record["output_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(streamed.len(), recorded.len(), "one entry per output token");
    for ((_, a), b) in streamed.iter().zip(&recorded) {
        assert!((a - b).abs() < 1e-6);
    }
    let joined: String = streamed.iter().map(|(t, _)| t.as_str()).collect();
    assert!(joined.starts_with("Hello there, streamed."), "{joined}");
    // Without logprobs, chunks carry none.
    let (_, b) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(
        b.contains("\"logprobs\":null") && !b.contains("\"logprob\":"),
        "{b}"
    );
}

#[test]
fn stored_responses_survive_a_restart() {
    let dir = temp_dir("gw-responses-store");
    let store = dir.join("store");
    let script = vec![
        json!({"text": "first answer"}),
        json!({"text": "second answer"}),
        json!({"text": "third answer"}),
    ];
    let engine = write_script(&dir, &script);
    let args = ["--engine", &engine, "--store", store.to_str().unwrap()];
    let g = start(&args);
    let (id, key) = execution(&g);
    let (s, b) = post(
        &g,
        "/v1/responses",
        &key,
        &json!({"model": "m", "instructions": "be brief", "input": "first question"}),
    );
    assert_eq!(s, 200, "{b}");
    let first: Value = serde_json::from_str(&b).unwrap();
    let (s, b) = post(
        &g,
        "/v1/responses",
        &key,
        &json!({"model": "m", "input": "not kept", "store": false}),
    );
    assert_eq!(s, 200, "{b}");
    let unstored: Value = serde_json::from_str(&b).unwrap();
    drop(g);

    let g = start(&args);
    let (s, b) = post(
        &g,
        "/v1/responses",
        &key,
        &json!({"model": "m", "input": "second question",
                "previous_response_id": first["id"]}),
    );
    assert_eq!(s, 200, "{b}");
    let second: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_eq!(second["output"][0]["content"][0]["text"], "third answer");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 3);
    // The continued conversation is the first one, token for token.
    assert_extends(&[records[0].clone(), records[2].clone()]);
    let input = text_of(&ids(&records[2]["input_ids"]));
    assert!(input.contains("be brief") && input.contains("first question"));
    // store: false kept nothing to continue from, before or after restart.
    let (s, b) = post(
        &g,
        "/v1/responses",
        &key,
        &json!({"model": "m", "input": "x", "previous_response_id": unstored["id"]}),
    );
    assert_eq!(s, 404, "{b}");
    assert!(b.contains("previous_response_id"), "{b}");
}
