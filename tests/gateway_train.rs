//! `gyre train` with the gateway in front, as a user runs it: the tiny
//! cluster on the live host, each execution an external harness process
//! (examples/harness/byte_game/agent.py, the `openai` SDK, several calls
//! per execution) that reaches the policy only over HTTP, scored by its
//! grader. Checks that the calls went through the gateway, that every
//! answered call has the gateway's record (the engines write none, so the
//! trained targets come from those records), that the records in the
//! gateway's store name the scheduling plane's engines and versions, and
//! that training steps happen and publish new versions.
//! Skips, loudly, only when python3 with `openai` is missing (.ci/run
//! installs it).

mod common;
use common::ok;

use gyre::gateway::store::Store;

const AGENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/harness/byte_game/agent.py"
);
const GRADER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/harness/byte_game/grade.py"
);

#[test]
fn external_harnesses_train_the_policy_through_the_gateway() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!(
            "\n*** SKIPPED external_harnesses_train_the_policy_through_the_gateway: python3 with the openai package is not installed (pip install openai) ***\n"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let runs = dir.path().join("runs");
    let harness = format!("python3 {AGENT}");
    let evaluator = format!("python3 {GRADER} {{workspace}}");
    let out = ok(&[
        "train",
        "--tiny",
        "--steps",
        "2",
        "--json",
        "--gateway-listen",
        "127.0.0.1:0",
        "--harness-cmd",
        &harness,
        "--evaluator-cmd",
        &evaluator,
        "--run-dir",
        runs.to_str().unwrap(),
        "--gateway-store",
        store.to_str().unwrap(),
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    // Training happened and the policy moved on.
    assert_eq!(n("steps"), 2, "{r}");
    let updates = r["updates"].as_array().unwrap();
    assert_eq!(updates.len(), 2);
    let versions: Vec<u64> = updates
        .iter()
        .map(|u| u["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2]);
    assert!(
        updates.iter().all(|u| u["targets"].as_u64().unwrap() > 0),
        "{r}"
    );
    // Every call went through the gateway and was recorded there.
    let calls = n("gateway_calls");
    assert!(calls > 0 && n("plane_calls_answered") >= calls, "{r}");
    assert_eq!(n("calls_without_record"), 0, "{r}");
    assert!(n("streamed_tokens") >= calls, "{r}");
    let task = &r["task"];
    assert!(task["scored"].as_u64().unwrap() > 0, "{r}");
    assert!(task["completed"].as_u64().unwrap() > 0, "{r}");
    // The harnesses ran in their workspaces and left what the grader read.
    let answered = std::fs::read_dir(runs.join("workspaces"))
        .unwrap()
        .filter(|d| d.as_ref().unwrap().path().join("answers.json").is_file())
        .count();
    assert!(answered as u64 >= task["scored"].as_u64().unwrap(), "{r}");
    // The gateway's durable records: one per recorded call, each naming
    // the plane engine and the published version that sampled it, with
    // several calls per execution extending one another.
    let loaded = Store::open(&store).unwrap().load().unwrap();
    assert_eq!(loaded.calls.len() as u64, calls);
    let mut per_exec = std::collections::BTreeMap::<String, Vec<_>>::new();
    for (exec, call) in &loaded.calls {
        let rec = &call.record;
        rec.validate().unwrap();
        let engine = rec.engine.as_deref().unwrap_or("");
        assert!(
            engine.starts_with("cell") || engine == "pool",
            "recorded engine {engine:?}"
        );
        assert!(rec.policy_version <= 2);
        per_exec.entry(exec.clone()).or_default().push(rec.clone());
    }
    let extended = per_exec.values().any(|recs| {
        recs.windows(2).any(|w| {
            let mut prefix = w[0].input_ids.clone();
            prefix.extend(&w[0].output_ids);
            w[1].input_ids.starts_with(&prefix)
        })
    });
    assert!(extended, "a second call extends the first token for token");
}
