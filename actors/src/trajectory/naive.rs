//! The expand-everything baseline: one trie node per token, and admission
//! over fully expanded paths.
//!
//! It is what the radix tree must agree with (tests compare every candidate
//! path token by token, flags included) and what the benchmarks measure the
//! tree against: matching walks every context token through a hash map, and
//! admission materialises every candidate's root-to-leaf path before
//! masking. Same rules as the tree: new input tokens are external, sampled
//! outputs upgrade what they land on, critique outputs are excluded.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;

use super::tito::{CallPurpose, RecordError, TitoRecord, TokenSource};
use super::tree::flag;

/// A token-per-node trie. Node 0 is the root above all contexts.
#[derive(Clone, Debug)]
pub struct NaiveTrie {
    parent: Vec<u32>,
    token: Vec<u32>,
    flags: Vec<u8>,
    logprob: Vec<f32>,
    child_count: Vec<u32>,
    children: FxHashMap<(u32, u32), u32>,
}

/// One candidate path in full.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpandedPath {
    pub tokens: Vec<u32>,
    pub trainable: Vec<bool>,
    /// Behaviour log-prob where trainable, 0 elsewhere.
    pub logprobs: Vec<f32>,
}

impl Default for NaiveTrie {
    fn default() -> Self {
        NaiveTrie {
            parent: vec![0],
            token: vec![0],
            flags: vec![0],
            logprob: vec![0.0],
            child_count: vec![0],
            children: FxHashMap::default(),
        }
    }
}

impl NaiveTrie {
    pub fn new() -> Self {
        NaiveTrie::default()
    }

    /// Token nodes stored (the unique tokens).
    pub fn len(&self) -> usize {
        self.token.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn step(&mut self, at: u32, t: u32) -> u32 {
        if let Some(&c) = self.children.get(&(at, t)) {
            return c;
        }
        let id = self.token.len() as u32;
        self.parent.push(at);
        self.token.push(t);
        self.flags.push(0);
        self.logprob.push(0.0);
        self.child_count.push(0);
        self.child_count[at as usize] += 1;
        self.children.insert((at, t), id);
        id
    }

    pub fn insert(&mut self, rec: &TitoRecord) -> Result<(), RecordError> {
        rec.validate()?;
        let mut at = 0u32;
        for &t in &rec.input_ids {
            at = self.step(at, t);
        }
        for (j, &t) in rec.output_ids.iter().enumerate() {
            at = self.step(at, t);
            let f = &mut self.flags[at as usize];
            if rec.purpose == CallPurpose::Critique {
                *f |= flag::EXCLUDED;
            } else if rec.output_source(j) == TokenSource::Sampled && *f & flag::SAMPLED == 0 {
                *f |= flag::SAMPLED;
                self.logprob[at as usize] = rec.output_logprobs[j];
            }
        }
        Ok(())
    }

    /// Leaf token nodes, in creation order.
    pub fn leaves(&self) -> Vec<u32> {
        (1..self.token.len() as u32)
            .filter(|&i| self.child_count[i as usize] == 0)
            .collect()
    }

    /// Node ids from the first token to `leaf`.
    pub fn path_nodes(&self, leaf: u32) -> Vec<u32> {
        let mut p = Vec::new();
        let mut at = leaf;
        while at != 0 {
            p.push(at);
            at = self.parent[at as usize];
        }
        p.reverse();
        p
    }

    pub fn expand(&self, leaf: u32) -> ExpandedPath {
        let nodes = self.path_nodes(leaf);
        let trainable: Vec<bool> = nodes
            .iter()
            .map(|&n| flag::trainable(self.flags[n as usize]))
            .collect();
        ExpandedPath {
            tokens: nodes.iter().map(|&n| self.token[n as usize]).collect(),
            logprobs: nodes
                .iter()
                .zip(&trainable)
                .map(|(&n, &t)| if t { self.logprob[n as usize] } else { 0.0 })
                .collect(),
            trainable,
        }
    }

    /// Every candidate expanded, sorted by tokens (an order-free view).
    pub fn paths(&self) -> Vec<ExpandedPath> {
        let mut p: Vec<ExpandedPath> = self.leaves().into_iter().map(|l| self.expand(l)).collect();
        p.sort_by(|a, b| a.tokens.cmp(&b.tokens));
        p
    }

    /// Admission over expanded paths, the baseline for the masking version:
    /// `candidates` are (leaf, class) pairs; returns (leaf, targets) per
    /// admitted trajectory. Same draw rule as [`super::admission::admit`].
    pub fn admit_expanded(
        &self,
        candidates: &[(u32, u16)],
        jmax: usize,
        rng: &mut ChaCha8Rng,
    ) -> Vec<(u32, u64)> {
        let paths: Vec<Vec<u32>> = candidates.iter().map(|c| self.path_nodes(c.0)).collect();
        let mut masked = vec![false; self.token.len()];
        let mut out = Vec::new();
        while out.len() < jmax {
            let weights: Vec<u64> = paths
                .iter()
                .map(|p| {
                    p.iter()
                        .filter(|&&n| {
                            !masked[n as usize] && flag::trainable(self.flags[n as usize])
                        })
                        .count() as u64
                })
                .collect();
            let Some(class) = candidates
                .iter()
                .zip(&weights)
                .filter(|(_, w)| **w > 0)
                .map(|(c, _)| c.1)
                .min()
            else {
                break;
            };
            let total: u64 = candidates
                .iter()
                .zip(&weights)
                .filter(|(c, _)| c.1 == class)
                .map(|(_, w)| w)
                .sum();
            let mut r = rng.random_range(0..total);
            let Some(k) = (0..candidates.len()).find(|&k| {
                if candidates[k].1 != class || weights[k] == 0 {
                    return false;
                }
                if r < weights[k] {
                    true
                } else {
                    r -= weights[k];
                    false
                }
            }) else {
                break;
            };
            for &n in &paths[k] {
                masked[n as usize] = true;
            }
            out.push((candidates[k].0, weights[k]));
        }
        out
    }

    /// Bytes held, for comparing memory with the radix tree.
    pub fn heap_bytes(&self) -> usize {
        self.token.capacity() * (4 + 4 + 1 + 4 + 4)
            + self.children.capacity() * (std::mem::size_of::<((u32, u32), u32)>() + 1)
    }
}
