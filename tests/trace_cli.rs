//! `gyre trace` end to end: the documented JSONL format in, text and JSON
//! reports out, bad lines reported by number and skipped.

use std::path::PathBuf;
use std::process::Output;

mod common;
use common::gyre;

use serde_json::{Value, json};

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sample-trace.jsonl");

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("gyre-trace-{}-{name}.jsonl", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn call(exec: &str, id: &str, input: &[u32], output: &[u32]) -> Value {
    json!({
        "execution": exec, "call_id": id, "input_ids": input, "output_ids": output,
        "output_logprobs": vec![-0.5; output.len()], "policy_version": 1
    })
}

fn lines(values: &[Value]) -> String {
    values.iter().map(|v| format!("{v}\n")).collect()
}

#[test]
fn stats_on_the_sample_reports_every_execution() {
    let s = json_of(&gyre(&["trace", "stats", SAMPLE, "--json"]));
    let execs = s["executions"].as_array().unwrap();
    assert_eq!(execs.len(), 3);
    for e in execs {
        let unique = e["unique_tokens"].as_u64().unwrap();
        let expanded = e["expanded_tokens"].as_u64().unwrap();
        let trainable = e["trainable_tokens"].as_u64().unwrap();
        assert!(trainable > 0 && trainable < unique && unique < expanded);
        let by_class: u64 = e["leaves_by_class"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(by_class, e["leaves"].as_u64().unwrap());
        // The small preset: main, one main summary, two sub-agents.
        assert_eq!(e["leaves_by_class"]["main-summary"], 1);
        assert!(e["leaves_by_class"]["sub-agent"].as_u64().unwrap() >= 2);
        assert_eq!(e["roots"], 2);
        let cands = e["candidates"].as_array().unwrap();
        let sum: u64 = cands
            .iter()
            .map(|c| c["path_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, expanded);
    }
    assert_eq!(s["skipped"].as_array().unwrap().len(), 0);

    let text = gyre(&["trace", "stats", SAMPLE]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("execution exec-0:"), "{text}");
    assert!(text.contains("unique") && text.contains("expanded"));
}

#[test]
fn admit_is_seeded_capped_and_disjoint_in_count() {
    let a = json_of(&gyre(&[
        "trace", "admit", SAMPLE, "--jmax", "5", "--seed", "3", "--json",
    ]));
    let b = json_of(&gyre(&[
        "trace", "admit", SAMPLE, "--jmax", "5", "--seed", "3", "--json",
    ]));
    assert_eq!(a, b);
    for e in a["executions"].as_array().unwrap() {
        let admitted = e["admitted"].as_array().unwrap();
        assert!(!admitted.is_empty() && admitted.len() <= 5);
        let targets: u64 = admitted
            .iter()
            .map(|x| x["targets"].as_u64().unwrap())
            .sum();
        let trainable = e["trainable_tokens"].as_u64().unwrap();
        assert!(targets <= trainable);
        if admitted.len() < 5 {
            assert_eq!(targets, trainable);
        }
        for x in admitted {
            assert!(
                x["leaf"].is_u64() && x["class"].is_string() && x["targets"].as_u64().unwrap() > 0
            );
        }
        // Priority: the main agent's trajectory comes first.
        assert_eq!(admitted[0]["class"], "main");
    }
    let one = json_of(&gyre(&["trace", "admit", SAMPLE, "--jmax", "1", "--json"]));
    for e in one["executions"].as_array().unwrap() {
        assert_eq!(e["admitted"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn bad_lines_are_reported_by_number_and_skipped() {
    let mut good = call("x", "c0", &[1, 2, 3], &[4, 5]);
    good["thread"] = json!("main");
    let mut bad_len = call("x", "c1", &[1, 2, 3, 4, 5], &[6, 7]);
    bad_len["output_logprobs"] = json!([-0.1]);
    let mut bad_role = call("x", "c2", &[1, 2, 3, 4, 5], &[8]);
    bad_role["role"] = json!("critic");
    let mut orphan = call("x", "c3", &[9], &[8]);
    orphan["parent_call"] = json!("nope");
    let text = format!(
        "{}not json at all\n\n{}{}{}{}{}",
        lines(&[good]),
        lines(&[bad_len]),
        lines(&[bad_role]),
        lines(&[orphan]),
        lines(&[call("x", "c0", &[1], &[2])]),
        lines(&[call("x", "c4", &[1, 2, 3, 4, 5, 6], &[7])]),
    );
    let path = temp_file("bad", &text);
    let out = gyre(&["trace", "stats", path.to_str().unwrap(), "--json"]);
    let s = json_of(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let skipped: Vec<u64> = s["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["line"].as_u64().unwrap())
        .collect();
    assert_eq!(skipped, vec![2, 4, 5, 6, 7]);
    for (line, needle) in [
        (2, "expected"),
        (4, "log-probabilities"),
        (5, "critic"),
        (6, "causal parent"),
        (7, "already recorded"),
    ] {
        assert!(stderr.contains(&format!(":{line}: skipped")), "{stderr}");
        assert!(stderr.contains(needle), "{needle} missing from {stderr}");
    }
    // The good lines still made a consistent tree.
    let e = &s["executions"][0];
    assert_eq!(e["calls"], 2);
    assert_eq!(e["unique_tokens"], 7);
    assert_eq!(e["trainable_tokens"], 3);
    std::fs::remove_file(path).ok();
}

#[test]
fn pasted_outputs_are_external_and_roles_decide_classes() {
    let mut a = call("y", "a", &[1, 2], &[3, 4, 5]);
    a["role"] = json!("main");
    // Extends a: tokens 3, 4, 5 stay sampled on this path.
    let mut b = call("y", "b", &[1, 2, 3, 4, 5, 6], &[7]);
    b["role"] = json!("main");
    // a's output pasted into a new context: external there.
    let mut c = call("y", "c", &[1, 9, 3, 4, 5], &[8, 8]);
    c["role"] = json!("sub-agent-summary");
    let path = temp_file("roles", &lines(&[a, b, c]));
    let s = json_of(&gyre(&["trace", "stats", path.to_str().unwrap(), "--json"]));
    let e = &s["executions"][0];
    assert_eq!(e["trainable_tokens"], 3 + 1 + 2);
    assert_eq!(e["leaves_by_class"]["main"], 1);
    assert_eq!(e["leaves_by_class"]["sub-agent-summary"], 1);
    let trainable: Vec<u64> = e["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["trainable_on_path"].as_u64().unwrap())
        .collect();
    assert_eq!(trainable, vec![4, 2]);
    let adm = json_of(&gyre(&["trace", "admit", path.to_str().unwrap(), "--json"]));
    let adm = &adm["executions"][0]["admitted"];
    assert_eq!(adm[0]["class"], "main");
    assert_eq!(adm[0]["targets"], 4);
    assert_eq!(adm[1]["class"], "sub-agent-summary");
    assert_eq!(adm[1]["targets"], 2);
    std::fs::remove_file(path).ok();
}

#[test]
fn a_profile_classifies_like_recorded_roles() {
    let with_roles = gyre(&["trace", "synth", "--seed", "5", "--executions", "2"]);
    let without = gyre(&[
        "trace",
        "synth",
        "--seed",
        "5",
        "--executions",
        "2",
        "--no-roles",
    ]);
    assert!(with_roles.status.success() && without.status.success());
    assert_ne!(with_roles.stdout, without.stdout);
    let p1 = temp_file("roles-on", &String::from_utf8(with_roles.stdout).unwrap());
    let p2 = temp_file("roles-off", &String::from_utf8(without.stdout).unwrap());
    let a = json_of(&gyre(&["trace", "stats", p1.to_str().unwrap(), "--json"]));
    let b = json_of(&gyre(&[
        "trace",
        "stats",
        p2.to_str().unwrap(),
        "--json",
        "--profile",
        "synthetic",
    ]));
    let classes = |v: &Value| -> Vec<Value> {
        v["executions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["leaves_by_class"].clone())
            .collect()
    };
    assert_eq!(classes(&a), classes(&b));
    // Without roles or markers, the thread-based default sees no summaries.
    let c = json_of(&gyre(&["trace", "stats", p2.to_str().unwrap(), "--json"]));
    assert_eq!(c["executions"][0]["leaves_by_class"]["main-summary"], 0);
    std::fs::remove_file(p1).ok();
    std::fs::remove_file(p2).ok();
}

#[test]
fn a_missing_file_is_an_error() {
    let out = gyre(&["trace", "stats", "/nonexistent/trace.jsonl"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.jsonl"));
}
