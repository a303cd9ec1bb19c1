//! The trajectory tree of one execution: recorded calls organised by shared
//! token prefix (SPEC 3.2).
//!
//! Radix-compressed: a node is a run of tokens with one parent; a token is
//! stored once however many requests share it. Token data lives in three
//! parallel arenas (ids, behaviour log-probs, flags) and a node is a range of
//! them, so splitting a node when a later request diverges inside it moves no
//! data. A split keeps the old id for the lower half, so the end of every node
//! (where a call's input or output ended) stays where it was: call records and
//! match anchors never need rewriting.
//!
//! Prefix parentage is the tree; causal parentage (which call spawned which
//! thread) is separate metadata on the calls. Inserting lives in `insert.rs`,
//! reports in `stats.rs`.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::tito::CallPurpose;

/// Per-token flags stored in the tree.
pub mod flag {
    /// Sampled by the engine at this position on this path.
    pub const SAMPLED: u8 = 1;
    /// Never a target (a critique's output, see SPEC 3.3).
    pub const EXCLUDED: u8 = 2;
    /// The last token of a message, for message-level statistics.
    pub const MESSAGE_END: u8 = 4;

    /// A training target candidate: sampled and not excluded.
    pub fn trainable(f: u8) -> bool {
        f & (SAMPLED | EXCLUDED) == SAMPLED
    }
}

/// A node of one execution's tree. Ids are dense, in creation order, and
/// mean something only to the tree that issued them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub(super) u32);

impl NodeId {
    /// The invisible node above every root.
    pub(super) const SENTINEL: NodeId = NodeId(0);

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A recorded call of one execution, in insertion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CallIdx(pub(super) u32);

impl CallIdx {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a request's context is located in the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MatchMode {
    /// Walk from the root comparing every context token (slice compares, one
    /// child lookup per node). Exact; costs memory bandwidth proportional to
    /// the context.
    Exact,
    /// Start from the end of an earlier call (its input or output) that the
    /// context extends, then walk only what follows. The anchor is verified
    /// by its length and by `window` tokens before the anchor, before each
    /// of its nearest node boundaries (`TreeConfig::anchor_boundary_checks`,
    /// 16 by default) and at both ends of its root, so
    /// cost grows with the new tokens (plus one parent hop per node on the
    /// path), not with the context. Any length change before the anchor
    /// shifts the anchor's own window and is caught; what it cannot see is a
    /// same-length, in-place edit away from the checked windows (say, a date
    /// rewritten inside the system prompt). Use it for harnesses whose
    /// histories are append-only (the usual case); a context that fails
    /// every anchor falls back to the exact walk.
    Anchored { window: u32 },
}

/// Settings of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeConfig {
    pub match_mode: MatchMode,
    /// Token ids must be below this, when set.
    pub vocab_size: Option<u32>,
    /// Anchors tried (longest first) before falling back to the exact walk.
    pub max_anchor_candidates: usize,
    /// Node boundaries nearest an anchor whose windows are compared (the
    /// root's always are); `usize::MAX` checks every boundary of the path.
    pub anchor_boundary_checks: usize,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            match_mode: MatchMode::Exact,
            vocab_size: None,
            max_anchor_candidates: 64,
            anchor_boundary_checks: 16,
        }
    }
}

impl TreeConfig {
    pub fn anchored(window: u32) -> Self {
        TreeConfig {
            match_mode: MatchMode::Anchored { window },
            ..TreeConfig::default()
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) parent: NodeId,
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) depth_end: u32,
    pub(super) trainable: u32,
    pub(super) creator: CallIdx,
    /// (first token, child); few per node, so a vector beats a map.
    pub(super) children: Vec<(u32, NodeId)>,
}

/// What the tree keeps about a recorded call.
#[derive(Clone, Debug, PartialEq)]
pub struct CallMeta {
    pub call_id: String,
    pub thread: Option<String>,
    pub role: Option<String>,
    pub purpose: CallPurpose,
    /// The call whose output spawned this call's thread.
    pub causal_parent: Option<CallIdx>,
    pub policy_version: u64,
    pub engine: Option<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The node that ends where the call's input ends.
    pub input_end: NodeId,
    /// The node that ends where the call's output ends (`input_end` when the
    /// output is empty).
    pub output_end: NodeId,
    pub input_len: u32,
    pub output_len: u32,
    /// Input tokens this call added to the tree.
    pub new_input_tokens: u32,
    /// Output tokens this call added to the tree.
    pub new_output_tokens: u32,
}

/// One execution's tree. See the module doc.
#[derive(Clone, Debug)]
pub struct TrajectoryTree {
    pub(super) execution: String,
    pub(super) config: TreeConfig,
    pub(super) nodes: Vec<Node>,
    pub(super) tokens: Vec<u32>,
    pub(super) logprobs: Vec<f32>,
    pub(super) flags: Vec<u8>,
    pub(super) calls: Vec<CallMeta>,
    pub(super) call_index: FxHashMap<String, CallIdx>,
    /// Path depth -> nodes ending there that ended a call's input or output.
    pub(super) anchors: BTreeMap<u32, Vec<NodeId>>,
}

impl TrajectoryTree {
    pub fn new(execution: impl Into<String>, config: TreeConfig) -> Self {
        TrajectoryTree {
            execution: execution.into(),
            config,
            nodes: vec![Node {
                parent: NodeId::SENTINEL,
                start: 0,
                len: 0,
                depth_end: 0,
                trainable: 0,
                creator: CallIdx(0),
                children: Vec::new(),
            }],
            tokens: Vec::new(),
            logprobs: Vec::new(),
            flags: Vec::new(),
            calls: Vec::new(),
            call_index: FxHashMap::default(),
            anchors: BTreeMap::new(),
        }
    }

    pub fn execution(&self) -> &str {
        &self.execution
    }

    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    /// Real nodes (the sentinel above the roots is not counted).
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Every real node id, in creation order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (1..self.nodes.len() as u32).map(NodeId)
    }

    /// Tokens stored once each: the size of the shared form.
    pub fn unique_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }

    pub fn calls(&self) -> &[CallMeta] {
        &self.calls
    }

    pub fn call(&self, idx: CallIdx) -> &CallMeta {
        &self.calls[idx.index()]
    }

    pub fn call_by_id(&self, call_id: &str) -> Option<CallIdx> {
        self.call_index.get(call_id).copied()
    }

    /// Calls whose causal parent is `idx` (the threads it spawned).
    pub fn causal_children(&self, idx: CallIdx) -> Vec<CallIdx> {
        (0..self.calls.len() as u32)
            .map(CallIdx)
            .filter(|&c| self.calls[c.index()].causal_parent == Some(idx))
            .collect()
    }

    /// Nodes directly under the sentinel: one per distinct first token.
    pub fn roots(&self) -> Vec<NodeId> {
        self.children(NodeId::SENTINEL)
    }

    /// Children in creation order (deterministic, independent of hashing).
    pub fn children(&self, id: NodeId) -> Vec<NodeId> {
        let mut c: Vec<NodeId> = self.nodes[id.index()]
            .children
            .iter()
            .map(|&(_, n)| n)
            .collect();
        c.sort_unstable();
        c
    }

    pub fn is_leaf(&self, id: NodeId) -> bool {
        id != NodeId::SENTINEL && self.nodes[id.index()].children.is_empty()
    }

    /// None for a root.
    pub fn parent(&self, id: NodeId) -> Option<NodeId> {
        let p = self.nodes[id.index()].parent;
        (p != NodeId::SENTINEL).then_some(p)
    }

    pub fn node_len(&self, id: NodeId) -> u32 {
        self.nodes[id.index()].len
    }

    /// Tokens on the path from the root to the end of `id`.
    pub fn depth_end(&self, id: NodeId) -> u32 {
        self.nodes[id.index()].depth_end
    }

    /// Trainable (sampled, not excluded) tokens held by `id` itself.
    pub fn trainable(&self, id: NodeId) -> u32 {
        self.nodes[id.index()].trainable
    }

    /// The call that created `id`'s tokens.
    pub fn creator(&self, id: NodeId) -> CallIdx {
        self.nodes[id.index()].creator
    }

    pub fn tokens(&self, id: NodeId) -> &[u32] {
        &self.tokens[self.range(id)]
    }

    pub fn logprobs(&self, id: NodeId) -> &[f32] {
        &self.logprobs[self.range(id)]
    }

    pub fn flags(&self, id: NodeId) -> &[u8] {
        &self.flags[self.range(id)]
    }

    pub(super) fn range(&self, id: NodeId) -> std::ops::Range<usize> {
        let n = &self.nodes[id.index()];
        n.start as usize..(n.start + n.len) as usize
    }

    /// Root-to-`id` node ids.
    pub fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut p = Vec::new();
        let mut at = id;
        while at != NodeId::SENTINEL {
            p.push(at);
            at = self.nodes[at.index()].parent;
        }
        p.reverse();
        p
    }

    /// Leaves in depth-first order, children in creation order. This order is
    /// what admission draws over, so it must not depend on hashing.
    pub fn leaves(&self) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut stack = vec![NodeId::SENTINEL];
        while let Some(id) = stack.pop() {
            let kids = self.children(id);
            if kids.is_empty() {
                if id != NodeId::SENTINEL {
                    out.push(id);
                }
                continue;
            }
            stack.extend(kids.into_iter().rev());
        }
        out
    }

    /// Trainable tokens in the whole tree.
    pub fn trainable_tokens(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.trainable)).sum()
    }

    /// Expanded tokens of the path ending at `id` (its depth).
    pub fn path_tokens(&self, id: NodeId) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.depth_end(id) as usize);
        for n in self.path(id) {
            out.extend_from_slice(self.tokens(n));
        }
        out
    }

    /// Up to `n` tokens of the path ending at `id`, counted back from its end.
    pub fn tail_tokens(&self, id: NodeId, n: usize) -> Vec<u32> {
        let mut rev: Vec<u32> = Vec::with_capacity(n);
        let mut at = id;
        while at != NodeId::SENTINEL && rev.len() < n {
            let t = self.tokens(at);
            let take = (n - rev.len()).min(t.len());
            rev.extend(t[t.len() - take..].iter().rev());
            at = self.nodes[at.index()].parent;
        }
        rev.reverse();
        rev
    }

    /// Up to `n` tokens of the path ending at `id`, counted from its root.
    pub fn head_tokens(&self, id: NodeId, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n);
        for node in self.path(id) {
            if out.len() >= n {
                break;
            }
            let t = self.tokens(node);
            let take = (n - out.len()).min(t.len());
            out.extend_from_slice(&t[..take]);
        }
        out
    }

    /// Approximate heap bytes held: arenas, nodes and call metadata.
    pub fn heap_bytes(&self) -> usize {
        let arenas =
            self.tokens.capacity() * 4 + self.logprobs.capacity() * 4 + self.flags.capacity();
        let nodes = self.nodes.capacity() * std::mem::size_of::<Node>()
            + self
                .nodes
                .iter()
                .map(|n| n.children.capacity() * std::mem::size_of::<(u32, NodeId)>())
                .sum::<usize>();
        let calls = self.calls.capacity() * std::mem::size_of::<CallMeta>()
            + self
                .calls
                .iter()
                .map(|c| c.call_id.capacity())
                .sum::<usize>();
        arenas + nodes + calls
    }

    /// Marks every output token of `call` excluded from targets: for a
    /// critique that turned out to be consumed as input after the fact.
    /// Returns how many trainable tokens were withdrawn.
    pub fn exclude_call_outputs(&mut self, call: CallIdx) -> u64 {
        let meta = &self.calls[call.index()];
        let (top, mut at) = (self.depth_end(meta.input_end), meta.output_end);
        let mut withdrawn = 0u64;
        while at != NodeId::SENTINEL && self.nodes[at.index()].depth_end > top {
            let node = &self.nodes[at.index()];
            let depth_start = node.depth_end - node.len;
            let skip = top.saturating_sub(depth_start) as usize;
            let range = self.range(at);
            let mut removed = 0u32;
            for f in &mut self.flags[range.start + skip..range.end] {
                if flag::trainable(*f) {
                    removed += 1;
                }
                *f |= flag::EXCLUDED;
            }
            self.nodes[at.index()].trainable -= removed;
            withdrawn += u64::from(removed);
            at = self.nodes[at.index()].parent;
        }
        withdrawn
    }

    /// Consistency of the structure, for tests and debugging: ranges tile
    /// the arenas, depths add up, counts match flags, children are keyed by
    /// their first token.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut covered = 0u64;
        for id in self.node_ids() {
            let n = &self.nodes[id.index()];
            covered += u64::from(n.len);
            if n.len == 0 {
                return Err(format!("node {id:?} is empty"));
            }
            let parent_depth = self.nodes[n.parent.index()].depth_end;
            if parent_depth + n.len != n.depth_end {
                return Err(format!("node {id:?} depth does not add up"));
            }
            let counted = self
                .flags(id)
                .iter()
                .filter(|&&f| flag::trainable(f))
                .count() as u32;
            if counted != n.trainable {
                return Err(format!(
                    "node {id:?} trainable {} but flags say {counted}",
                    n.trainable
                ));
            }
            if !self.nodes[n.parent.index()]
                .children
                .contains(&(self.tokens(id)[0], id))
            {
                return Err(format!("node {id:?} missing from its parent's children"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let mut firsts: Vec<u32> = n.children.iter().map(|c| c.0).collect();
            firsts.sort_unstable();
            firsts.dedup();
            if firsts.len() != n.children.len() {
                return Err(format!("node {i} has two children with one first token"));
            }
        }
        if covered != self.tokens.len() as u64 {
            return Err("node ranges do not cover the arena".into());
        }
        Ok(())
    }
}
