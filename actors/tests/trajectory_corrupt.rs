//! Corrupt or inconsistent input is rejected with a clear error, and the
//! tree (or cache) stays exactly as if it had never been offered.

use gyre_actors::trajectory::synth::template::VOCAB;
use gyre_actors::trajectory::synth::{SynthConfig, generate};
use gyre_actors::trajectory::tool_cache::{
    ChatMessage, Role, ToolCacheError, ToolCall, ToolCallCache,
};
use gyre_actors::trajectory::{InsertError, RecordError, TitoRecord, TrajectoryTree, TreeConfig};

fn config() -> TreeConfig {
    TreeConfig {
        vocab_size: Some(VOCAB),
        ..TreeConfig::anchored(8)
    }
}

/// Bad variants of a good record, each with the error it must produce.
fn corruptions(good: &TitoRecord, earlier: &TitoRecord) -> Vec<(TitoRecord, &'static str)> {
    let mut out = Vec::new();
    let mut r = good.clone();
    r.output_logprobs.pop();
    out.push((r, "log-probabilities"));
    let mut r = good.clone();
    r.output_logprobs[0] = f32::INFINITY;
    out.push((r, "not a finite value"));
    let mut r = good.clone();
    r.execution = "someone-else".into();
    out.push((r, "belongs to execution"));
    let mut r = good.clone();
    r.call_id = earlier.call_id.clone();
    out.push((r, "already recorded"));
    let mut r = good.clone();
    r.parent_call = Some("c-never".into());
    out.push((r, "causal parent"));
    let mut r = good.clone();
    let last = r.input_ids.len() - 1;
    r.input_ids[last] = VOCAB + 5;
    out.push((r, "outside the vocabulary"));
    let mut r = good.clone();
    r.input_message_ends = vec![5, 3];
    out.push((r, "input_message_ends"));
    let mut r = good.clone();
    r.input_ids.clear();
    out.push((r, "empty input_ids"));
    out
}

#[test]
fn bad_records_are_rejected_and_leave_no_trace() {
    let cfg = SynthConfig::small(3, "e");
    let ex = generate(&cfg).unwrap();
    let mut clean = TrajectoryTree::new("e", config());
    let mut dirty = TrajectoryTree::new("e", config());
    let mut rejected = 0;
    for (i, r) in ex.records.iter().enumerate() {
        if i > 0 && i % 3 == 0 {
            for (bad, needle) in corruptions(r, &ex.records[i - 1]) {
                let before = dirty.stats();
                let err = dirty.insert(&bad).unwrap_err();
                assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
                assert_eq!(dirty.stats(), before);
                dirty.check_invariants().unwrap();
                rejected += 1;
            }
        }
        clean.insert(r).unwrap();
        dirty.insert(r).unwrap();
    }
    assert!(rejected >= 40);
    assert_eq!(clean.stats(), dirty.stats());
    assert_eq!(clean.calls(), dirty.calls());
}

#[test]
fn mismatched_lengths_name_the_call_and_both_counts() {
    let ex = generate(&SynthConfig::small(4, "e")).unwrap();
    let mut r = ex.records[2].clone();
    r.output_logprobs.truncate(1);
    let n = r.output_ids.len();
    let mut t = TrajectoryTree::new("e", TreeConfig::default());
    match t.insert(&r) {
        Err(InsertError::Record(RecordError::LogprobLength {
            call_id,
            outputs,
            logprobs,
        })) => {
            assert_eq!(
                (call_id.as_str(), outputs, logprobs),
                (r.call_id.as_str(), n, 1)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(t.node_count(), 0);
}

#[test]
fn a_tool_response_for_an_unknown_call_is_rejected() {
    let mut cache = ToolCallCache::new();
    let call = ToolCall {
        id: "call_1".into(),
        name: "Bash".into(),
        arguments: r#"{"command":"ls"}"#.into(),
    };
    cache.record(std::slice::from_ref(&call)).unwrap();
    let assistant = ChatMessage {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "renamed".into(),
            ..call.clone()
        }],
        tool_call_id: None,
    };
    let orphan = ChatMessage {
        role: Role::Tool,
        content: "?".into(),
        tool_calls: vec![],
        tool_call_id: Some("call_999".into()),
    };
    let err = cache.restore(&[assistant.clone(), orphan]).unwrap_err();
    assert_eq!(
        err,
        ToolCacheError::UnknownToolResponse {
            message: 1,
            id: "call_999".into()
        }
    );
    assert!(err.to_string().contains("call_999"));
    // Nothing was learned from the failed request; a good one still works.
    assert!(cache.original("renamed").is_none());
    let answer = ChatMessage {
        tool_call_id: Some("renamed".into()),
        role: Role::Tool,
        content: "ok".into(),
        tool_calls: vec![],
    };
    let (restored, _) = cache.restore(&[assistant, answer]).unwrap();
    assert_eq!(restored[1].tool_call_id.as_deref(), Some("call_1"));
}
