//! `gyre gateway --engine embedded`: the gpu crate's engine (seeded
//! weights, small config) answers both APIs, streamed token by token, and
//! every call's record holds its sampled ids and log-probs, the second turn
//! extending the first.

mod gateway;

use gateway::*;
use serde_json::{Value, json};

#[test]
fn embedded_engine_answers_and_records() {
    let dir = temp_dir("gw-embedded");
    let cfg = dir.join("model.toml");
    std::fs::write(
        &cfg,
        "layers = 2\nheads = 2\nwidth = 32\nffn = 64\ncontext = 1024\nseed = 7\n",
    )
    .unwrap();
    let g = start(&["--engine", &format!("embedded={}", cfg.display())]);
    let (id, key) = execution(&g);
    let mut messages = vec![json!({"role": "user", "content": "say something"})];
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 12, "messages": messages}),
    );
    assert_eq!(s, 200, "{b}");
    let r: Value = serde_json::from_str(&b).unwrap();
    let text = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "text")
        .map(|c| c["text"].as_str().unwrap())
        .collect::<String>();
    messages.push(json!({"role": "assistant", "content": text}));
    messages.push(json!({"role": "user", "content": "more"}));
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 12, "stream": true, "messages": messages}),
    );
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("event: message_stop"), "{b}");
    let (s, b) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(s, 200, "{b}");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 3);
    assert_extends(&records[..2]);
    for r in &records {
        assert_eq!(r["engine"], "embedded");
        let lps = r["output_logprobs"].as_array().unwrap();
        assert!(
            !lps.is_empty() && lps.iter().all(|x| x.as_f64().unwrap() <= 0.0),
            "{r}"
        );
    }
    // A context longer than the model's window is refused in the API's shape.
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 5,
        "messages": [{"role": "user", "content": "x".repeat(2000)}]}),
    );
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("prompt is too long"), "{b}");
}
