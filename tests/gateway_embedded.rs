//! `gyre gateway --engine embedded`: the gpu crate's engine (seeded
//! weights, small config, the shipped BPE vocabulary) answers both APIs,
//! streamed token by token, and every call's record holds its sampled ids
//! and log-probs, the second turn extending the first and prefilling only
//! what the first did not already compute (the engine's prefix cache, as
//! the gateway's metrics count it).

mod gateway;

use gateway::*;
use serde_json::{Value, json};

/// A counter of the admin listener's Prometheus text.
fn metric(g: &Gateway, name: &str) -> u64 {
    let (s, text) = admin(g, "GET", "/metrics");
    assert_eq!(s, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

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
    let prefilled_first = metric(&g, "gyre_gateway_engine_prefilled_tokens_total");
    assert_eq!(
        metric(&g, "gyre_gateway_engine_prefix_reused_tokens_total"),
        0
    );
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
    // The second turn's KV: the first call's prompt and reply (all but its
    // last sampled token, which was never fed) come from the prefix cache.
    let records = trace(&g, &id);
    let (first_in, first_out) = (
        ids(&records[0]["input_ids"]).len() as u64,
        ids(&records[0]["output_ids"]).len() as u64,
    );
    let second_in = ids(&records[1]["input_ids"]).len() as u64;
    assert_eq!(prefilled_first, first_in);
    let reused = metric(&g, "gyre_gateway_engine_prefix_reused_tokens_total");
    assert_eq!(reused, first_in + first_out - 1);
    assert_eq!(
        metric(&g, "gyre_gateway_engine_prefilled_tokens_total") - prefilled_first,
        second_in - reused,
        "the second call prefills only its new suffix"
    );
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
        "messages": [{"role": "user", "content": "x ".repeat(2000)}]}),
    );
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("prompt is too long"), "{b}");
}
