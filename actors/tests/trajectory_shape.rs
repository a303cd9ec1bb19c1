//! The reference execution's message-level shape (SPEC 3.2), reproduced by
//! the synthetic generator and measured on the token-level tree.

use gyre_actors::trajectory::profile::{HarnessProfile, RuleProfile, classify_leaves};
use gyre_actors::trajectory::synth::shape::message_shape;
use gyre_actors::trajectory::synth::{self, Sizes, SynthConfig, generate};
use gyre_actors::trajectory::{MatchMode, TrajectoryTree, TreeConfig};

#[test]
fn reference_execution_shape_is_reproduced_exactly() {
    let cfg = SynthConfig::reference(7, Sizes::tiny());
    let ex = generate(&cfg).unwrap();
    let expected = message_shape(&ex.message_paths);
    for mode in [MatchMode::Exact, MatchMode::Anchored { window: 8 }] {
        let mut tree = TrajectoryTree::new(
            &cfg.execution,
            TreeConfig {
                match_mode: mode,
                ..TreeConfig::default()
            },
        );
        for r in &ex.records {
            tree.insert(r).unwrap();
        }
        tree.check_invariants().unwrap();
        let s = tree.stats();

        // The tree agrees with the generator's message-level bookkeeping.
        assert_eq!(s.calls, expected.requests);
        assert_eq!(s.unique_messages, expected.unique_messages);
        assert_eq!(s.expanded_messages, expected.expanded_messages);
        let mut paths: Vec<u64> = s.leaves.iter().map(|l| l.path_messages).collect();
        paths.sort_unstable();
        assert_eq!(paths, expected.leaf_paths);
        let mut shared: Vec<u64> = s.leaves.iter().map(|l| l.shared_prefix_messages).collect();
        shared.sort_unstable();
        assert_eq!(shared, expected.shared_prefixes);

        // And both equal the reference figures.
        assert_eq!(s.calls, 636);
        assert_eq!(s.unique_messages, 1_347);
        assert_eq!(s.leaves.len(), 10);
        // Main agent, sub-agents sharing one prompt, one more sub-agent.
        assert_eq!(s.roots, 3);
        assert_eq!(s.path_message_range(), Some((53, 293)));
        assert_eq!(s.expanded_messages, 1_716);
        assert_eq!(s.redundant_messages(), 369);

        let profile = RuleProfile::new(synth::profile()).unwrap();
        let classes = classify_leaves(&tree, &profile).unwrap();
        let shared_of = |name: &str| -> Vec<u64> {
            let id = profile.class_by_name(name).unwrap();
            classes
                .iter()
                .filter(|c| c.class == id)
                .map(|c| {
                    s.leaves
                        .iter()
                        .find(|l| l.leaf == c.leaf)
                        .unwrap()
                        .shared_prefix_messages
                })
                .collect()
        };
        assert_eq!(shared_of("main-summary"), vec![168]);
        assert_eq!(shared_of("sub-agent-summary"), vec![193]);
        assert_eq!(shared_of("main").len(), 2);
        assert_eq!(shared_of("sub-agent").len(), 6);

        println!(
            "{mode:?}: {} requests, {} unique message nodes, {} candidates of {:?} messages, \
             {} occurrences expanded ({} more than shared); {} unique tokens, {} expanded tokens",
            s.calls,
            s.unique_messages,
            s.leaves.len(),
            s.path_message_range().unwrap(),
            s.expanded_messages,
            s.redundant_messages(),
            s.unique_tokens,
            s.expanded_tokens
        );
    }
}
