//! Reports on a tree's shape: the shared form against the expanded one.
//!
//! "Unique" counts what the tree stores (every token, every message node
//! once); "expanded" counts what materialising every candidate trajectory
//! (leaf plus root-to-leaf path) in full would cost. Message-level figures
//! rely on the message ends the proxy recorded (SPEC 3.2 reports the
//! reference execution that way: 1,347 unique message nodes, 1,716 if
//! expanded). A leaf's shared prefix is its longest common prefix with any
//! other leaf.

use serde::Serialize;

use super::tree::{CallIdx, NodeId, TrajectoryTree, flag};

/// One candidate trajectory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeafStats {
    pub leaf: NodeId,
    /// The call whose tokens end the path.
    pub call: CallIdx,
    pub call_id: String,
    pub thread: Option<String>,
    pub path_tokens: u64,
    pub path_messages: u64,
    pub trainable_on_path: u64,
    pub shared_prefix_tokens: u64,
    pub shared_prefix_messages: u64,
}

/// The whole tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeStats {
    pub execution: String,
    pub calls: usize,
    /// Distinct first messages (contexts that share no message). Chat
    /// templates start every context with the same tokens, so this is the
    /// meaningful count; without recorded message ends it equals
    /// `token_roots`.
    pub roots: usize,
    /// Distinct first tokens.
    pub token_roots: usize,
    pub nodes: usize,
    pub unique_tokens: u64,
    pub expanded_tokens: u64,
    pub trainable_tokens: u64,
    pub unique_messages: u64,
    pub expanded_messages: u64,
    pub leaves: Vec<LeafStats>,
}

impl TreeStats {
    /// Message node occurrences the expanded form repeats.
    pub fn redundant_messages(&self) -> u64 {
        self.expanded_messages - self.unique_messages
    }

    /// (shortest, longest) candidate path in messages.
    pub fn path_message_range(&self) -> Option<(u64, u64)> {
        let it = self.leaves.iter().map(|l| l.path_messages);
        Some((it.clone().min()?, it.max()?))
    }
}

impl TrajectoryTree {
    /// Everything [`TreeStats`] reports; one pass over the stored tokens.
    pub fn stats(&self) -> TreeStats {
        let n = self.nodes.len();
        let mut messages = vec![0u64; n];
        for id in self.node_ids() {
            messages[id.index()] = self
                .flags(id)
                .iter()
                .filter(|&&f| f & flag::MESSAGE_END != 0)
                .count() as u64;
        }
        // Pre-order from the sentinel: parents before children (ids are not
        // topological, a split's upper half is younger than its lower half).
        let mut order = Vec::with_capacity(n);
        let mut stack = vec![NodeId::SENTINEL];
        while let Some(id) = stack.pop() {
            order.push(id);
            stack.extend(self.children(id).into_iter().rev());
        }
        let (mut cum_msgs, mut cum_train) = (vec![0u64; n], vec![0u64; n]);
        for &id in order.iter().skip(1) {
            let p = self.nodes[id.index()].parent.index();
            cum_msgs[id.index()] = cum_msgs[p] + messages[id.index()];
            cum_train[id.index()] = cum_train[p] + u64::from(self.trainable(id));
        }
        let mut leaf_count = vec![0u64; n];
        for &id in order.iter().rev() {
            if self.is_leaf(id) {
                leaf_count[id.index()] += 1;
            }
            if id != NodeId::SENTINEL {
                let p = self.nodes[id.index()].parent.index();
                leaf_count[p] += leaf_count[id.index()];
            }
        }
        // A message root: the first message end on a path, or a path with none.
        let roots = self
            .node_ids()
            .filter(|&id| {
                let p = self.nodes[id.index()].parent.index();
                cum_msgs[p] == 0 && (messages[id.index()] > 0 || self.is_leaf(id))
            })
            .count();
        let leaves: Vec<LeafStats> = self
            .leaves()
            .into_iter()
            .map(|leaf| {
                let mut at = self.nodes[leaf.index()].parent;
                while at != NodeId::SENTINEL && leaf_count[at.index()] < 2 {
                    at = self.nodes[at.index()].parent;
                }
                let call = self.creator(leaf);
                let meta = self.call(call);
                LeafStats {
                    leaf,
                    call,
                    call_id: meta.call_id.clone(),
                    thread: meta.thread.clone(),
                    path_tokens: u64::from(self.depth_end(leaf)),
                    path_messages: cum_msgs[leaf.index()],
                    trainable_on_path: cum_train[leaf.index()],
                    shared_prefix_tokens: u64::from(self.nodes[at.index()].depth_end),
                    shared_prefix_messages: cum_msgs[at.index()],
                }
            })
            .collect();
        TreeStats {
            execution: self.execution.clone(),
            calls: self.calls.len(),
            roots,
            token_roots: self.roots().len(),
            nodes: self.node_count(),
            unique_tokens: self.unique_tokens(),
            expanded_tokens: leaves.iter().map(|l| l.path_tokens).sum(),
            trainable_tokens: self.trainable_tokens(),
            unique_messages: messages.iter().sum(),
            expanded_messages: leaves.iter().map(|l| l.path_messages).sum(),
            leaves,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::tito::TitoRecord;
    use crate::trajectory::tree::TreeConfig;

    fn rec(call: &str, input: &[u32], ends: &[u32], output: &[u32]) -> TitoRecord {
        TitoRecord {
            execution: "e".into(),
            call_id: call.into(),
            thread: None,
            parent_call: None,
            role: None,
            purpose: Default::default(),
            policy_version: 0,
            engine: None,
            start_ns: 0,
            end_ns: 0,
            input_ids: input.to_vec(),
            input_message_ends: ends.to_vec(),
            output_ids: output.to_vec(),
            output_logprobs: vec![-1.0; output.len()],
            output_sources: vec![],
        }
    }

    #[test]
    fn shared_and_expanded_counts() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        // Messages: [1 2] [3] then output [4 5]; a branch after [1 2].
        t.insert(&rec("a", &[1, 2, 3], &[2, 3], &[4, 5])).unwrap();
        t.insert(&rec("b", &[1, 2, 3, 4, 5, 6], &[2, 3, 5, 6], &[7]))
            .unwrap();
        t.insert(&rec("c", &[1, 2, 9], &[2, 3], &[8])).unwrap();
        let s = t.stats();
        assert_eq!(s.calls, 3);
        assert_eq!(s.roots, 1);
        assert_eq!(s.token_roots, 1);
        assert_eq!(s.leaves.len(), 2);
        assert_eq!(s.unique_tokens, 9);
        assert_eq!(s.expanded_tokens, 7 + 4);
        // Unique messages: [1 2], [3], [4 5], [6], [7], [9], [8].
        assert_eq!(s.unique_messages, 7);
        assert_eq!(s.expanded_messages, 5 + 3);
        assert_eq!(s.redundant_messages(), 1);
        assert!(s.leaves.iter().all(|l| l.shared_prefix_tokens == 2));
        assert!(s.leaves.iter().all(|l| l.shared_prefix_messages == 1));
        assert_eq!(s.trainable_tokens, 4);
        assert_eq!(s.leaves[0].trainable_on_path, 3);
        assert_eq!(s.path_message_range(), Some((3, 5)));
    }

    #[test]
    fn roots_count_distinct_first_messages() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        // Same template opening [1, 2], different system messages.
        t.insert(&rec("a", &[1, 2, 3, 4], &[4], &[5])).unwrap();
        t.insert(&rec("b", &[1, 2, 7, 4], &[4], &[5])).unwrap();
        t.insert(&rec("c", &[1, 2, 3, 4, 5, 6], &[4, 5, 6], &[7]))
            .unwrap();
        let s = t.stats();
        assert_eq!((s.roots, s.token_roots), (2, 1));
        // Without message ends the input end stands in for one.
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1, 2], &[], &[3])).unwrap();
        t.insert(&rec("b", &[1, 9], &[], &[3])).unwrap();
        assert_eq!(t.stats().roots, 2);
    }
}
