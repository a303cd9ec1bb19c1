//! The message-level shape a generated trace must produce, computed from the
//! generator's own bookkeeping (which message instance each request's
//! context holds) with a plain message trie: an oracle independent of the
//! token-level tree it is compared with.

use std::collections::BTreeMap;

/// Message-level statistics of a set of requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageShape {
    pub requests: usize,
    pub unique_messages: u64,
    pub expanded_messages: u64,
    /// Candidate path lengths in messages, sorted.
    pub leaf_paths: Vec<u64>,
    /// Each candidate's longest shared prefix with another, sorted.
    pub shared_prefixes: Vec<u64>,
}

/// `paths[r]`: the message instances of request r's context plus its output.
pub fn message_shape(paths: &[Vec<u64>]) -> MessageShape {
    // Node 0 is the root; (parent, message) -> child.
    let mut edges: BTreeMap<(usize, u64), usize> = BTreeMap::new();
    let mut parent = vec![0usize];
    let mut depth = vec![0u64];
    let mut kids = vec![0u64];
    for p in paths {
        let mut at = 0;
        for &m in p {
            at = *edges.entry((at, m)).or_insert_with(|| {
                parent.push(at);
                depth.push(depth[at] + 1);
                kids.push(0);
                kids[at] += 1;
                parent.len() - 1
            });
        }
    }
    let n = parent.len();
    let mut leaves_below = vec![0u64; n];
    // Children always have larger ids than their parents here.
    for id in (1..n).rev() {
        if kids[id] == 0 {
            leaves_below[id] += 1;
        }
        leaves_below[parent[id]] += leaves_below[id];
    }
    let mut leaf_paths = Vec::new();
    let mut shared_prefixes = Vec::new();
    for id in 1..n {
        if kids[id] == 0 {
            leaf_paths.push(depth[id]);
            let mut at = parent[id];
            while at != 0 && leaves_below[at] < 2 {
                at = parent[at];
            }
            shared_prefixes.push(depth[at]);
        }
    }
    leaf_paths.sort_unstable();
    shared_prefixes.sort_unstable();
    MessageShape {
        requests: paths.len(),
        unique_messages: (n - 1) as u64,
        expanded_messages: leaf_paths.iter().sum(),
        leaf_paths,
        shared_prefixes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_small_forest() {
        let s = message_shape(&[vec![1, 2], vec![1, 2, 3, 4], vec![1, 5], vec![9]]);
        assert_eq!(s.unique_messages, 6);
        assert_eq!(s.leaf_paths, vec![1, 2, 4]);
        assert_eq!(s.expanded_messages, 7);
        assert_eq!(s.shared_prefixes, vec![0, 1, 1]);
    }
}
