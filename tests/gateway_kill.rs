//! kill -9 of `gyre gateway` under concurrent load, then a restart on the
//! same store: every call a client saw answered is in the trace, and every
//! record in the trace is whole.

mod gateway;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway::*;
use serde_json::{Value, json};

#[test]
fn kill_9_under_load_loses_no_answered_call() {
    let dir = temp_dir("gw-kill");
    let store = dir.join("store");
    let engine = write_script(
        &dir,
        &[json!({"text": "a reply of a few tokens", "token_delay_ms": 1})],
    );
    let mut g = start(&["--engine", &engine, "--store", store.to_str().unwrap()]);
    let execs: Vec<(String, String)> = (0..8).map(|_| execution(&g)).collect();
    let answered = Arc::new(Mutex::new(BTreeSet::new()));
    let threads: Vec<_> = execs
        .iter()
        .cloned()
        .map(|(id, key)| {
            let api = g.api.clone();
            let answered = answered.clone();
            std::thread::spawn(move || {
                let body = json!({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "go"}]}).to_string();
                for _ in 0..1000 {
                    let r = try_request(&api, "POST", "/v1/messages", &[("x-api-key", &key)], body.as_bytes());
                    let Ok((200, b)) = r else { break };
                    let Ok(v) = serde_json::from_str::<Value>(&b) else { break };
                    let msg = v["id"].as_str().unwrap().to_string();
                    let index = msg.rsplit('_').next().unwrap().to_string();
                    answered.lock().unwrap().insert((id.clone(), format!("call-{index}")));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    g.child.kill().unwrap(); // SIGKILL
    g.child.wait().unwrap();
    for t in threads {
        let _ = t.join();
    }
    let answered = answered.lock().unwrap().clone();
    assert!(
        answered.len() > 8,
        "load ran: {} answered calls",
        answered.len()
    );
    let g = start(&["--engine", &engine, "--store", store.to_str().unwrap()]);
    let mut recorded = BTreeSet::new();
    for (id, _) in &execs {
        for r in trace(&g, id) {
            let out = r["output_ids"].as_array().unwrap().len();
            assert!(
                out > 0 && r["output_logprobs"].as_array().unwrap().len() == out,
                "whole record: {r}"
            );
            recorded.insert((id.clone(), r["call_id"].as_str().unwrap().to_string()));
        }
    }
    eprintln!(
        "{} calls answered before the kill, {} recorded",
        answered.len(),
        recorded.len()
    );
    let missing: Vec<_> = answered.difference(&recorded).collect();
    assert!(missing.is_empty(), "answered but not recorded: {missing:?}");
}
