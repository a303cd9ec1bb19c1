//! Fuzzing the parsers that read outside input: the gateway's request
//! parsers (Anthropic Messages, OpenAI Chat Completions, Responses), the
//! `gyre train --config` overlay, scenario files and `gyre trace` records.
//!
//! Inputs start from valid documents and are mutated structurally (a node
//! of the JSON tree replaced by an arbitrary value, an array cut short, a
//! TOML value swapped for a hostile token, lines dropped or repeated), so
//! most of them get past the first check and reach the deeper validation.
//! Every parser must return a value or an error naming what is wrong, never
//! panic. Each test prints how many inputs it tried
//! (`cargo test --test fuzz_parsers -- --nocapture`).

use gyre::actors::trajectory::{TitoRecord, TrajectoryTree, TreeConfig};
use gyre::embedded::cluster::EmbeddedConfig;
use gyre::gateway::fields::Obj;
use gyre::gateway::{anthropic, openai, responses};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

const CASES: u32 = 1000;

/// Keys and strings the parsers look for, so random values hit them.
const WORDS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "user",
    "assistant",
    "system",
    "tool",
    "tools",
    "tool_choice",
    "tool_use",
    "tool_result",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "input",
    "id",
    "tool_use_id",
    "max_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "instructions",
    "input_text",
    "output_text",
    "message",
    "function_call",
    "function_call_output",
    "call_id",
    "output",
    "auto",
    "none",
    "required",
    "any",
    "parameters",
    "input_schema",
    "image",
    "developer",
    "",
    "\u{0}",
    "ü",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        proptest::sample::select(WORDS).prop_map(|s| json!(s)),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(proptest::sample::select(WORDS), inner, 0..4).prop_map(
                |m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            ),
        ]
    })
}

/// Counts the nodes of `v` (preorder).
fn nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(nodes).sum(),
        Value::Object(o) => o.values().map(nodes).sum(),
        _ => 0,
    }
}

/// Replaces the `k`-th node (preorder) of `v` by `with`; returns what is
/// left of `k` when the node is not inside `v`.
fn replace(v: &mut Value, k: usize, with: &Value) -> Option<usize> {
    if k == 0 {
        *v = with.clone();
        return None;
    }
    let mut k = k - 1;
    let children: Vec<&mut Value> = match v {
        Value::Array(a) => a.iter_mut().collect(),
        Value::Object(o) => o.values_mut().collect(),
        _ => Vec::new(),
    };
    for c in children {
        k = replace(c, k, with)?;
    }
    Some(k)
}

/// A mutation: replace node `at`, or (for an object) add key `word`.
type Edit = (usize, bool, &'static str, Value);

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    proptest::collection::vec(
        (
            any::<usize>(),
            any::<bool>(),
            proptest::sample::select(WORDS),
            value(),
        ),
        0..5,
    )
}

fn mutate(mut v: Value, edits: &[Edit]) -> Value {
    for (at, add, word, with) in edits {
        if *add {
            if let Value::Object(o) = &mut v {
                o.insert((*word).to_owned(), with.clone());
            }
        } else {
            let k = at % nodes(&v);
            replace(&mut v, k, with);
        }
    }
    v
}

fn bases() -> Vec<Value> {
    vec![
        json!({"model": "m", "max_tokens": 16, "system": "be brief",
               "messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": [{"type": "text", "text": "yo"},
                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}],
               "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
               "tool_choice": {"type": "auto"}}),
        json!({"model": "m", "max_tokens": 16, "temperature": 0.5, "stop": ["x"],
               "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": null, "tool_calls": [
                                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
               "tool_choice": "auto"}),
        json!({"model": "m", "instructions": "be brief", "max_output_tokens": 16,
               "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                         {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                         {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
               "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
    ]
}

/// Runs `check` on `CASES` inputs from `strategy`; returns how many ran.
fn fuzz<S: Strategy>(strategy: S, check: impl FnMut(S::Value)) -> u64 {
    let tried = std::cell::Cell::new(0u64);
    let check = std::cell::RefCell::new(check);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |input| {
            tried.set(tried.get() + 1);
            (check.borrow_mut())(input);
            Ok(())
        })
        .unwrap();
    assert!(tried.get() >= u64::from(CASES));
    tried.get()
}

#[test]
fn gateway_request_parsers_never_panic() {
    let (mut ok, mut refused) = (0u64, 0u64);
    let strategy = (proptest::sample::select(bases()), edits(), any::<bool>());
    let tried = fuzz(strategy, |(base, edits, flag)| {
        let body = mutate(base, &edits);
        let Value::Object(obj) = body else {
            return; // a body that is not an object is refused before the parsers
        };
        let obj: &Obj = &obj;
        let results = [
            anthropic::parse(obj, 64, flag).is_ok(),
            openai::parse(obj, 64).is_ok(),
            responses::parse(obj, 64, &|id| {
                Err(gyre::gateway::service::CallError::NotFound(format!(
                    "no stored response {id}"
                )))
            })
            .is_ok(),
        ];
        for r in results {
            if r { ok += 1 } else { refused += 1 }
        }
    });
    eprintln!(
        "gateway parser fuzz: {tried} bodies, {ok} parses accepted, {refused} refused with an error, no panic"
    );
    assert!(ok > 0 && refused > 0, "the fuzz should reach both outcomes");
}

/// Hostile TOML values.
const TOKENS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "18446744073709551615",
    "-9223372036854775808",
    "\"x\"",
    "\"\"",
    "[]",
    "[1, 2]",
    "{}",
    "{ a = 1 }",
    "true",
    "0.5",
    "1.0e-300",
    "4294967296",
];

/// Line-level edits of a TOML text: (line, what: 0 swap value, 1 drop, 2 repeat, token).
fn toml_edits() -> impl Strategy<Value = Vec<(usize, u8, &'static str)>> {
    proptest::collection::vec(
        (any::<usize>(), 0u8..3, proptest::sample::select(TOKENS)),
        1..5,
    )
}

fn mutate_toml(text: &str, edits: &[(usize, u8, &str)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for (at, what, token) in edits {
        if lines.is_empty() {
            break;
        }
        let i = at % lines.len();
        match what {
            0 => {
                if let Some((key, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{key}= {token}");
                }
            }
            1 => {
                lines.remove(i);
            }
            _ => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
        }
    }
    lines.join("\n")
}

#[test]
fn the_train_config_overlay_never_panics() {
    let base = EmbeddedConfig::tiny(1);
    let full = base.to_toml().unwrap();
    let mut refused = 0u64;
    let tried = fuzz(toml_edits(), |edits| {
        if EmbeddedConfig::from_toml(&mutate_toml(&full, &edits), &base).is_err() {
            refused += 1;
        }
    });
    eprintln!("train config fuzz: {tried} overlays, {refused} refused with an error, no panic");
    assert!(refused > 0);
}

#[test]
fn scenario_files_never_panic() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/scenarios");
    let texts: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    let mut refused = 0u64;
    let strategy = (proptest::sample::select(texts), toml_edits());
    let tried = fuzz(strategy, |(text, edits)| {
        if gyre::simulations::scenario::parse(&mutate_toml(&text, &edits), "fuzz").is_err() {
            refused += 1;
        }
    });
    eprintln!("scenario fuzz: {tried} files, {refused} refused with an error, no panic");
    assert!(refused > 0);
}

#[test]
fn trace_records_never_panic() {
    let text = include_str!("data/sample-trace.jsonl");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut refused = 0u64;
    let strategy = (
        proptest::collection::vec(proptest::sample::select(lines), 1..6),
        edits(),
    );
    let tried = fuzz(strategy, |(records, edits)| {
        let mut tree = TrajectoryTree::new("exec-0", TreeConfig::default());
        for (i, rec) in records.into_iter().enumerate() {
            // Mutate one record of the batch, the others stay valid.
            let rec = if i == 0 { mutate(rec, &edits) } else { rec };
            match serde_json::from_value::<TitoRecord>(rec) {
                Ok(r) => {
                    if tree.insert(&r).is_err() {
                        refused += 1;
                    }
                }
                Err(_) => refused += 1,
            }
        }
    });
    eprintln!("trace fuzz: {tried} record batches, {refused} records refused, no panic");
    assert!(refused > 0);
}
