//! Inserting one recorded call into its execution's tree.
//!
//! The context is located first (read-only): either by an exact walk from the
//! root, or from an anchor (the end of an earlier call the context extends,
//! see [`MatchMode::Anchored`]). Only then does the tree change, so a record
//! rejected by validation leaves it untouched. Matched context tokens keep
//! the source they already have: an input token is sampled only where an
//! earlier call produced it at the same position on the same path; every new
//! input token is external. Output tokens are walked the same way; a sampled
//! output token that lands on an existing external token upgrades it (the
//! policy did sample it in exactly that context), so a retry that repeats
//! tokens adds nothing.

use super::tito::{CallPurpose, RecordError, TitoRecord, TokenSource};
use super::tree::{CallIdx, CallMeta, MatchMode, Node, NodeId, TrajectoryTree, flag};

/// Why a record was not inserted. The tree is unchanged when this is returned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InsertError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("call {call_id} belongs to execution {got}, not to {expected}")]
    WrongExecution {
        call_id: String,
        expected: String,
        got: String,
    },
    #[error("call id {call_id} was already recorded in this execution")]
    DuplicateCall { call_id: String },
    #[error("call {call_id} names causal parent {parent}, which this execution has not recorded")]
    UnknownParent { call_id: String, parent: String },
    #[error(
        "call {call_id}: token {token} at {place} #{index} is outside the vocabulary of {vocab}"
    )]
    TokenOutOfVocab {
        call_id: String,
        place: &'static str,
        index: usize,
        token: u32,
        vocab: u32,
    },
    #[error("execution {execution} would exceed 2^32 stored tokens")]
    Full { execution: String },
}

/// Where a walk stopped: fully through `at`, plus possibly part of a child.
struct Walk {
    at: NodeId,
    partial: Option<(NodeId, u32)>,
    matched: usize,
}

/// A matched stretch of a sequence: arena offset, length, sequence offset.
struct Segment {
    node: NodeId,
    arena: usize,
    len: usize,
    seq: usize,
}

/// Length of the common prefix; compares in blocks so the compiler emits
/// memcmp-like code, then finds the mismatch inside the last block.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    const BLOCK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= n && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Equality of two short windows, inlined: a libc memcmp call per node
/// boundary costs more than the comparison itself.
fn same(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(true, |eq, (x, y)| eq & (x == y))
}

impl TrajectoryTree {
    /// Records one call. Cost: the new tokens it adds, the output it walks,
    /// plus locating its context (see [`MatchMode`]).
    pub fn insert(&mut self, rec: &TitoRecord) -> Result<CallIdx, InsertError> {
        rec.validate()?;
        if rec.execution != self.execution {
            return Err(InsertError::WrongExecution {
                call_id: rec.call_id.clone(),
                expected: self.execution.clone(),
                got: rec.execution.clone(),
            });
        }
        if self.call_index.contains_key(&rec.call_id) {
            return Err(InsertError::DuplicateCall {
                call_id: rec.call_id.clone(),
            });
        }
        let causal_parent =
            match &rec.parent_call {
                None => None,
                Some(p) => Some(self.call_index.get(p).copied().ok_or_else(|| {
                    InsertError::UnknownParent {
                        call_id: rec.call_id.clone(),
                        parent: p.clone(),
                    }
                })?),
            };
        let input = &rec.input_ids[..];
        let output = &rec.output_ids[..];
        let (from, depth) = match self.config.match_mode {
            MatchMode::Exact => (NodeId::SENTINEL, 0),
            MatchMode::Anchored { window } => self.find_anchor(input, window as usize),
        };
        let walk = self.walk(from, input, depth, None);
        self.check_vocab(rec, walk.matched)?;
        let grow = input.len() - walk.matched + output.len();
        if self.tokens.len() + grow > u32::MAX as usize || self.calls.len() >= u32::MAX as usize {
            return Err(InsertError::Full {
                execution: self.execution.clone(),
            });
        }

        // From here on nothing can fail.
        let call = CallIdx(self.calls.len() as u32);
        let new_input = (input.len() - walk.matched) as u32;
        let mut input_end = self.boundary(&walk);
        if walk.matched < input.len() {
            let first = walk.matched;
            let mut flags = vec![0u8; input.len() - first];
            if rec.input_message_ends.is_empty() {
                if let Some(last) = flags.last_mut() {
                    *last |= flag::MESSAGE_END;
                }
            } else {
                for &e in &rec.input_message_ends {
                    let last = e as usize - 1;
                    if last >= first {
                        flags[last - first] |= flag::MESSAGE_END;
                    }
                }
            }
            let lps = vec![0.0; flags.len()];
            input_end = self.append(input_end, &input[first..], &flags, &lps, call);
        }

        let mut segments = Vec::new();
        let out_walk = self.walk(input_end, output, 0, Some(&mut segments));
        for s in &segments {
            self.absorb_output(rec, s);
        }
        let mut output_end = self.boundary(&out_walk);
        if out_walk.matched < output.len() {
            let first = out_walk.matched;
            let flags: Vec<u8> = (first..output.len())
                .map(|j| match (rec.purpose, rec.output_source(j)) {
                    (CallPurpose::Critique, TokenSource::Sampled) => flag::SAMPLED | flag::EXCLUDED,
                    (CallPurpose::Critique, TokenSource::External) => flag::EXCLUDED,
                    (CallPurpose::Policy, TokenSource::Sampled) => flag::SAMPLED,
                    (CallPurpose::Policy, TokenSource::External) => 0,
                })
                .collect();
            output_end = self.append(
                output_end,
                &output[first..],
                &flags,
                &rec.output_logprobs[first..],
                call,
            );
        }
        if !output.is_empty() {
            let last = self.range(output_end).end - 1;
            self.flags[last] |= flag::MESSAGE_END;
        }

        self.calls.push(CallMeta {
            call_id: rec.call_id.clone(),
            thread: rec.thread.clone(),
            role: rec.role.clone(),
            purpose: rec.purpose,
            causal_parent,
            policy_version: rec.policy_version,
            engine: rec.engine.clone(),
            start_ns: rec.start_ns,
            end_ns: rec.end_ns,
            input_end,
            output_end,
            input_len: input.len() as u32,
            output_len: output.len() as u32,
            new_input_tokens: new_input,
            new_output_tokens: (output.len() - out_walk.matched) as u32,
        });
        self.call_index.insert(rec.call_id.clone(), call);
        if matches!(self.config.match_mode, MatchMode::Anchored { .. }) {
            for id in [input_end, output_end] {
                let at = self.anchors.entry(self.depth_end(id)).or_default();
                if !at.contains(&id) {
                    at.push(id);
                }
            }
        }
        Ok(call)
    }

    fn check_vocab(&self, rec: &TitoRecord, matched: usize) -> Result<(), InsertError> {
        let Some(vocab) = self.config.vocab_size else {
            return Ok(());
        };
        let bad = |place, base: usize, ids: &[u32]| {
            ids.iter()
                .position(|&t| t >= vocab)
                .map(|i| InsertError::TokenOutOfVocab {
                    call_id: rec.call_id.clone(),
                    place,
                    index: base + i,
                    token: ids[i],
                    vocab,
                })
        };
        // Matched tokens were checked when they were first stored.
        if let Some(e) = bad("input", matched, &rec.input_ids[matched..]) {
            return Err(e);
        }
        bad("output", 0, &rec.output_ids).map_or(Ok(()), Err)
    }

    pub(super) fn child(&self, at: NodeId, token: u32) -> Option<NodeId> {
        self.nodes[at.index()]
            .children
            .iter()
            .find(|c| c.0 == token)
            .map(|c| c.1)
    }

    fn walk(
        &self,
        from: NodeId,
        seq: &[u32],
        start: usize,
        mut segments: Option<&mut Vec<Segment>>,
    ) -> Walk {
        let (mut at, mut i) = (from, start);
        loop {
            let Some(child) = seq.get(i).and_then(|&t| self.child(at, t)) else {
                return Walk {
                    at,
                    partial: None,
                    matched: i,
                };
            };
            let stored = &self.tokens[self.range(child)];
            let c = common_prefix(stored, &seq[i..]);
            if let Some(s) = segments.as_deref_mut() {
                s.push(Segment {
                    node: child,
                    arena: self.nodes[child.index()].start as usize,
                    len: c,
                    seq: i,
                });
            }
            if c < stored.len() {
                return Walk {
                    at,
                    partial: Some((child, c as u32)),
                    matched: i + c,
                };
            }
            i += c;
            at = child;
        }
    }

    /// The longest recorded call end the input extends, verified as
    /// [`MatchMode::Anchored`] documents; the sentinel when none is found.
    fn find_anchor(&self, input: &[u32], window: usize) -> (NodeId, usize) {
        let limit = u32::try_from(input.len()).unwrap_or(u32::MAX);
        let mut tried = 0;
        for (&depth, ids) in self.anchors.range(..=limit).rev() {
            for &id in ids {
                tried += 1;
                if tried > self.config.max_anchor_candidates {
                    return (NodeId::SENTINEL, 0);
                }
                if self.verify_anchor(id, input, window.max(1)) {
                    return (id, depth as usize);
                }
            }
        }
        (NodeId::SENTINEL, 0)
    }

    fn verify_anchor(&self, anchor: NodeId, input: &[u32], window: usize) -> bool {
        let mut at = anchor;
        while at != NodeId::SENTINEL {
            let node = &self.nodes[at.index()];
            let (end, len) = (node.depth_end as usize, node.len as usize);
            let w = window.min(len);
            let stored_end = (node.start + node.len) as usize;
            if !same(
                &self.tokens[stored_end - w..stored_end],
                &input[end - w..end],
            ) {
                return false;
            }
            if node.parent == NodeId::SENTINEL {
                let start = node.start as usize;
                return same(&self.tokens[start..start + w], &input[..w]);
            }
            at = node.parent;
        }
        true
    }

    /// Makes the walk's stopping point a node end and returns that node.
    fn boundary(&mut self, walk: &Walk) -> NodeId {
        match walk.partial {
            None => walk.at,
            Some((child, c)) => self.split(child, c),
        }
    }

    /// Splits `id` after `at` tokens. The upper half gets a new id; `id` keeps
    /// the lower half, and with it its end, children, and every reference.
    fn split(&mut self, id: NodeId, at: u32) -> NodeId {
        let old = self.nodes[id.index()].clone();
        debug_assert!(at > 0 && at < old.len);
        let count = |tree: &Self, from: u32, len: u32| {
            let s = from as usize;
            tree.flags[s..s + len as usize]
                .iter()
                .filter(|&&f| flag::trainable(f))
                .count() as u32
        };
        let upper_trainable = if at <= old.len / 2 {
            count(self, old.start, at)
        } else {
            old.trainable - count(self, old.start + at, old.len - at)
        };
        let upper = NodeId(self.nodes.len() as u32);
        let lower_first = self.tokens[(old.start + at) as usize];
        self.nodes.push(Node {
            parent: old.parent,
            start: old.start,
            len: at,
            depth_end: old.depth_end - (old.len - at),
            trainable: upper_trainable,
            creator: old.creator,
            children: vec![(lower_first, id)],
        });
        if let Some(slot) = self.nodes[old.parent.index()]
            .children
            .iter_mut()
            .find(|c| c.1 == id)
        {
            slot.1 = upper;
        }
        let lower = &mut self.nodes[id.index()];
        lower.parent = upper;
        lower.start += at;
        lower.len -= at;
        lower.trainable -= upper_trainable;
        upper
    }

    fn append(
        &mut self,
        parent: NodeId,
        toks: &[u32],
        flags: &[u8],
        lps: &[f32],
        creator: CallIdx,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let start = self.tokens.len() as u32;
        self.tokens.extend_from_slice(toks);
        self.flags.extend_from_slice(flags);
        self.logprobs.extend_from_slice(lps);
        let depth_end = self.nodes[parent.index()].depth_end + toks.len() as u32;
        self.nodes.push(Node {
            parent,
            start,
            len: toks.len() as u32,
            depth_end,
            trainable: flags.iter().filter(|&&f| flag::trainable(f)).count() as u32,
            creator,
            children: Vec::new(),
        });
        self.nodes[parent.index()].children.push((toks[0], id));
        id
    }

    /// Applies a call's knowledge to output tokens that matched stored ones.
    fn absorb_output(&mut self, rec: &TitoRecord, s: &Segment) {
        let mut delta: i64 = 0;
        for k in 0..s.len {
            let (a, j) = (s.arena + k, s.seq + k);
            let f = self.flags[a];
            let was = flag::trainable(f);
            let mut nf = f;
            if rec.purpose == CallPurpose::Critique {
                nf |= flag::EXCLUDED;
            } else if rec.output_source(j) == TokenSource::Sampled && f & flag::SAMPLED == 0 {
                nf |= flag::SAMPLED;
                self.logprobs[a] = rec.output_logprobs[j];
            }
            self.flags[a] = nf;
            delta += i64::from(flag::trainable(nf)) - i64::from(was);
        }
        let node = &mut self.nodes[s.node.index()];
        node.trainable = (i64::from(node.trainable) + delta) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::tree::TreeConfig;

    pub(crate) fn rec(call: &str, input: &[u32], output: &[u32]) -> TitoRecord {
        TitoRecord {
            execution: "e".into(),
            call_id: call.into(),
            thread: None,
            parent_call: None,
            role: None,
            purpose: CallPurpose::Policy,
            policy_version: 0,
            engine: None,
            start_ns: 0,
            end_ns: 0,
            input_ids: input.to_vec(),
            input_message_ends: vec![],
            output_ids: output.to_vec(),
            output_logprobs: vec![-0.5; output.len()],
            output_sources: vec![],
        }
    }

    fn both_modes() -> [TreeConfig; 2] {
        [TreeConfig::default(), TreeConfig::anchored(2)]
    }

    #[test]
    fn extension_reuses_prefix_and_marks_sampled_inputs() {
        for cfg in both_modes() {
            let mut t = TrajectoryTree::new("e", cfg);
            t.insert(&rec("a", &[1, 2, 3], &[4, 5])).unwrap();
            let b = t.insert(&rec("b", &[1, 2, 3, 4, 5, 6], &[7])).unwrap();
            t.check_invariants().unwrap();
            assert_eq!(t.unique_tokens(), 7);
            assert_eq!(t.call(b).new_input_tokens, 1);
            let leaves = t.leaves();
            assert_eq!(leaves.len(), 1);
            assert_eq!(t.path_tokens(leaves[0]), vec![1, 2, 3, 4, 5, 6, 7]);
            // 4, 5 (sampled by a) and 7 (sampled by b) are trainable.
            assert_eq!(t.trainable_tokens(), 3);
        }
    }

    #[test]
    fn divergence_splits_and_branches() {
        for cfg in both_modes() {
            let mut t = TrajectoryTree::new("e", cfg);
            t.insert(&rec("a", &[1, 2, 3], &[4, 5, 6])).unwrap();
            t.insert(&rec("b", &[1, 2, 3, 4, 9], &[8])).unwrap();
            t.check_invariants().unwrap();
            let leaves = t.leaves();
            assert_eq!(leaves.len(), 2);
            assert_eq!(t.path_tokens(leaves[0]), vec![1, 2, 3, 4, 5, 6]);
            assert_eq!(t.path_tokens(leaves[1]), vec![1, 2, 3, 4, 9, 8]);
            // The call record of `a` still ends where its output ended.
            let a = t.call_by_id("a").unwrap();
            assert_eq!(t.depth_end(t.call(a).output_end), 6);
            assert_eq!(t.trainable_tokens(), 4);
        }
    }

    #[test]
    fn unmatched_request_starts_a_new_root() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1, 2], &[3])).unwrap();
        t.insert(&rec("b", &[7, 2], &[3])).unwrap();
        assert_eq!(t.roots().len(), 2);
        // The same token ids in another context are a separate copy.
        assert_eq!(t.unique_tokens(), 6);
    }

    #[test]
    fn retry_with_same_output_adds_nothing_and_external_becomes_sampled() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1, 2, 3, 4], &[5])).unwrap();
        assert_eq!(t.trainable_tokens(), 1);
        // b sampled 3, 4 in the context [1, 2]: they become trainable.
        t.insert(&rec("b", &[1, 2], &[3, 4])).unwrap();
        t.check_invariants().unwrap();
        assert_eq!(t.trainable_tokens(), 3);
        assert_eq!(t.unique_tokens(), 5);
        t.insert(&rec("c", &[1, 2], &[3, 4])).unwrap();
        assert_eq!(t.unique_tokens(), 5);
        assert_eq!(t.leaves().len(), 1);
    }

    #[test]
    fn pasted_output_in_a_new_context_is_external() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1, 2], &[5, 6, 7])).unwrap();
        // A summary [5, 6, 7] re-injected after a different prefix.
        t.insert(&rec("b", &[1, 9, 5, 6, 7], &[8])).unwrap();
        let leaves = t.leaves();
        let b_leaf = leaves[1];
        let path = t.path(b_leaf);
        let sampled: Vec<bool> = path
            .iter()
            .flat_map(|&n| t.flags(n).iter().map(|&f| flag::trainable(f)))
            .collect();
        assert_eq!(sampled, vec![false, false, false, false, false, true]);
    }

    #[test]
    fn critique_outputs_never_train() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        let mut c = rec("crit", &[1, 2], &[3, 4]);
        c.purpose = CallPurpose::Critique;
        t.insert(&c).unwrap();
        t.insert(&rec("p", &[1, 2, 3, 4, 5], &[6])).unwrap();
        assert_eq!(t.trainable_tokens(), 1);
        let a = t.insert(&rec("q", &[1, 7], &[8, 9])).unwrap();
        assert_eq!(t.trainable_tokens(), 3);
        assert_eq!(t.exclude_call_outputs(a), 2);
        assert_eq!(t.trainable_tokens(), 1);
        t.check_invariants().unwrap();
    }

    #[test]
    fn rejected_records_leave_the_tree_unchanged() {
        let mut t = TrajectoryTree::new(
            "e",
            TreeConfig {
                vocab_size: Some(100),
                ..TreeConfig::default()
            },
        );
        t.insert(&rec("a", &[1, 2, 3], &[4, 5])).unwrap();
        let before = (t.unique_tokens(), t.node_count(), t.calls().len());
        let mut bad = rec("b", &[1, 2, 3, 4, 5, 6], &[7, 8]);
        bad.output_logprobs.pop();
        assert!(matches!(t.insert(&bad), Err(InsertError::Record(_))));
        assert!(matches!(
            t.insert(&rec("a", &[1], &[2])),
            Err(InsertError::DuplicateCall { .. })
        ));
        let mut wrong = rec("c", &[1], &[2]);
        wrong.execution = "other".into();
        assert!(matches!(
            t.insert(&wrong),
            Err(InsertError::WrongExecution { .. })
        ));
        let mut orphan = rec("d", &[1], &[2]);
        orphan.parent_call = Some("nope".into());
        assert!(matches!(
            t.insert(&orphan),
            Err(InsertError::UnknownParent { .. })
        ));
        assert!(matches!(
            t.insert(&rec("f", &[1, 2, 3, 4, 5, 600], &[1])),
            Err(InsertError::TokenOutOfVocab { index: 5, .. })
        ));
        assert_eq!(before, (t.unique_tokens(), t.node_count(), t.calls().len()));
        t.check_invariants().unwrap();
    }

    #[test]
    fn anchored_mode_falls_back_when_anchor_fails() {
        let mut t = TrajectoryTree::new("e", TreeConfig::anchored(1));
        t.insert(&rec("a", &[1, 2, 3], &[4, 5])).unwrap();
        // Same length as a's end, same last token, different middle: the
        // boundary check at depth 3 rejects the anchor and the exact walk runs.
        t.insert(&rec("b", &[1, 2, 9, 4, 5], &[6])).unwrap();
        t.check_invariants().unwrap();
        assert_eq!(t.leaves().len(), 2);
    }

    #[test]
    fn causal_parentage_is_separate_from_prefix() {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        let a = t.insert(&rec("a", &[1, 2], &[3])).unwrap();
        let mut s = rec("s", &[50, 51], &[52]);
        s.parent_call = Some("a".into());
        let s = t.insert(&s).unwrap();
        assert_eq!(t.call(s).causal_parent, Some(a));
        assert_eq!(t.causal_children(a), vec![s]);
        assert_eq!(t.roots().len(), 2);
    }
}
