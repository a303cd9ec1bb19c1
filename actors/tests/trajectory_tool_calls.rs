//! Re-serialised tool calls (reordered JSON keys, renamed ids) must not
//! create branches once the proxy restores the cached payloads (SPEC 3.1).

use gyre_actors::trajectory::synth::shape::message_shape;
use gyre_actors::trajectory::synth::template::{GENERATION_PROMPT, render_message, render_output};
use gyre_actors::trajectory::synth::{SynthConfig, generate};
use gyre_actors::trajectory::tool_cache::{ChatMessage, Role, ToolCall, ToolCallCache};
use gyre_actors::trajectory::{TrajectoryTree, TreeConfig};

fn tree(cfg: &SynthConfig) -> (TrajectoryTree, usize) {
    let ex = generate(cfg).unwrap();
    let expected_leaves = message_shape(&ex.message_paths).leaf_paths.len();
    let mut t = TrajectoryTree::new(&cfg.execution, TreeConfig::default());
    for r in &ex.records {
        t.insert(r).unwrap();
    }
    (t, expected_leaves)
}

#[test]
fn restored_payloads_leave_no_false_branches() {
    let mut cfg = SynthConfig::small(11, "e");
    cfg.retry_probability = 0.0;

    let (restored, expected_leaves) = tree(&cfg);
    assert_eq!(restored.leaves().len(), expected_leaves);

    // Identical to a harness that never re-serialised anything.
    let mut verbatim = cfg.clone();
    verbatim.reserialize_tool_calls = false;
    let (plain, _) = tree(&verbatim);
    assert_eq!(restored.stats(), plain.stats());

    // Without the cache every tool-calling turn forks the tree.
    let mut raw = cfg.clone();
    raw.restore_tool_calls = false;
    let (forked, _) = tree(&raw);
    // Every turn but a segment's last is answered and sent back reformatted.
    let turns_sent_back: usize = cfg
        .threads
        .iter()
        .flat_map(|t| &t.segments)
        .map(|s| s.calls - 1)
        .sum();
    assert_eq!(
        forked.leaves().len(),
        expected_leaves + turns_sent_back,
        "{} leaves without restoring, {expected_leaves} with",
        forked.leaves().len()
    );
}

#[test]
fn a_reformatted_history_tokenises_to_the_recorded_output() {
    let original = ToolCall {
        id: "call_7".into(),
        name: "Bash".into(),
        arguments: r#"{"command":"cargo test","timeout":120}"#.into(),
    };
    let mut produced = GENERATION_PROMPT.to_vec();
    render_output(
        "running tests",
        std::slice::from_ref(&original),
        &mut produced,
    );

    let mut cache = ToolCallCache::new();
    cache.record(std::slice::from_ref(&original)).unwrap();
    let history = vec![
        ChatMessage {
            role: Role::Assistant,
            content: "running tests".into(),
            tool_calls: vec![ToolCall {
                id: "toolu_01XyZ".into(),
                name: "Bash".into(),
                arguments: r#"{"timeout": 120, "command": "cargo test"}"#.into(),
            }],
            tool_call_id: None,
        },
        ChatMessage {
            role: Role::Tool,
            content: "ok".into(),
            tool_calls: vec![],
            tool_call_id: Some("toolu_01XyZ".into()),
        },
    ];
    let render = |msgs: &[ChatMessage]| {
        let mut v = Vec::new();
        render_message(&msgs[0], &mut v);
        v
    };
    assert_ne!(render(&history), produced);
    let (restored, report) = cache.restore(&history).unwrap();
    assert_eq!(render(&restored), produced);
    assert_eq!(report.reformatted, 1);
    // The renamed id still correlates the response with the original call.
    assert_eq!(restored[1].tool_call_id.as_deref(), Some("call_7"));
    assert_eq!(
        cache.original("toolu_01XyZ").map(|c| c.id.as_str()),
        Some("call_7")
    );
}
