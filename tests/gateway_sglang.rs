//! `gyre gateway --engine sglang=URL,URL` against two `gyre serve`
//! processes: both APIs answer, streamed and not, every call is recorded
//! with the servers' sampled ids and log-probs, calls spread over both
//! servers, and with one server killed the gateway's retry lands on the
//! other.

mod common;
mod gateway;

use common::{Serve, tiny_serve_model};
use gateway::*;
use serde_json::{Value, json};

fn generated_tokens(s: &Serve) -> u64 {
    let (status, body) = request(s.addr(), "GET", "/get_server_info", &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["internal_states"][0]["generated_tokens"]
        .as_u64()
        .unwrap()
}

#[test]
fn sglang_servers_answer_behind_the_gateway_and_a_dead_one_is_routed_around() {
    let dir = temp_dir("gw-sglang");
    let model = tiny_serve_model(&dir, 1024);
    let a = Serve::start(&model);
    let b = Serve::start(&model);
    let g = start(&["--engine", &format!("sglang={},{}", a.url, b.url)]);
    let (id, key) = execution(&g);
    let mut messages = vec![json!({"role": "user", "content": "say something"})];
    let (s, body) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 12, "messages": messages}),
    );
    assert_eq!(s, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    let text: String = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "text")
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    messages.push(json!({"role": "assistant", "content": text}));
    messages.push(json!({"role": "user", "content": "more"}));
    let (s, body) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 12, "stream": true, "messages": messages}),
    );
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("event: message_stop"), "{body}");
    let (s, body) = post(
        &g,
        "/v1/chat/completions",
        &key,
        &json!({"model": "m", "max_tokens": 8, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("[DONE]"), "{body}");
    let records = trace(&g, &id);
    assert_eq!(records.len(), 3);
    assert_extends(&records[..2]);
    for r in &records {
        assert_eq!(r["engine"], "sglang");
        let out = r["output_ids"].as_array().unwrap();
        let lps = r["output_logprobs"].as_array().unwrap();
        assert!(!out.is_empty() && out.len() == lps.len(), "{r}");
        assert!(lps.iter().all(|x| x.as_f64().unwrap() <= 0.0), "{r}");
    }
    assert!(generated_tokens(&a) > 0 && generated_tokens(&b) > 0);

    // One server dies: every call still answers, from the other.
    let before = generated_tokens(&a);
    drop(b);
    for i in 0..3 {
        let (s, body) = post(
            &g,
            "/v1/chat/completions",
            &key,
            &json!({"model": "m", "max_tokens": 6,
                "messages": [{"role": "user", "content": format!("again {i}")}]}),
        );
        assert_eq!(s, 200, "{body}");
    }
    assert!(generated_tokens(&a) > before);
    assert_eq!(trace(&g, &id).len(), 6);
}
