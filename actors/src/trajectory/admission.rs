//! Admission by masking (SPEC 3.6): which candidate trajectories of one
//! execution train, and which tokens each one trains.
//!
//! Start from the source mask (only trainable tokens can be targets). Repeat:
//! take the highest-priority class that still has a candidate with unmasked
//! trainable tokens; draw one of its candidates with probability proportional
//! to that count; its targets are the trainable tokens of its path still
//! unmasked; mask its whole root-to-leaf path. Stop when nothing trainable
//! is left unmasked or `jmax` trajectories are admitted. A shared prefix thus
//! trains once, fixed targets never change, and later draws see reduced
//! counts.
//!
//! Masking whole paths keeps the masked set closed under ancestors, so the
//! mask is per node and a candidate's unmasked count is its path's trainable
//! total minus that of its deepest masked ancestor: no token is touched.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::profile::{ClassId, LeafClass};
use super::tree::{NodeId, TrajectoryTree};

/// SPEC's default cap on admitted trajectories per execution.
pub const DEFAULT_JMAX: usize = 5;

/// One admitted trajectory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Admitted {
    pub leaf: NodeId,
    pub class: ClassId,
    /// Root-to-leaf nodes: the row's context.
    pub path: Vec<NodeId>,
    /// Path nodes whose trainable tokens are this trajectory's targets.
    pub target_nodes: Vec<NodeId>,
    /// L_r: how many target tokens.
    pub targets: u64,
}

/// The admitted set R_i of one execution.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Admission {
    pub trajectories: Vec<Admitted>,
    /// Trainable tokens in the whole tree.
    pub trainable_tokens: u64,
    /// L_i = Σ L_r.
    pub targets: u64,
}

/// Runs admission over `candidates` (normally [`super::profile::classify_leaves`]'s
/// output, in that order). Deterministic for a given `rng` state.
pub fn admit(
    tree: &TrajectoryTree,
    candidates: &[LeafClass],
    jmax: usize,
    rng: &mut ChaCha8Rng,
) -> Admission {
    let n = tree.nodes.len();
    let cum = cumulative_trainable(tree);
    let mut masked = vec![false; n];
    masked[NodeId::SENTINEL.index()] = true;
    let mut out = Admission {
        trainable_tokens: tree.trainable_tokens(),
        ..Admission::default()
    };
    while out.trajectories.len() < jmax {
        let weights: Vec<u64> = candidates
            .iter()
            .map(|c| {
                let mut at = c.leaf;
                while !masked[at.index()] {
                    at = tree.nodes[at.index()].parent;
                }
                cum[c.leaf.index()] - cum[at.index()]
            })
            .collect();
        let Some(class) = candidates
            .iter()
            .zip(&weights)
            .filter(|(_, w)| **w > 0)
            .map(|(c, _)| c.class)
            .min()
        else {
            break;
        };
        let total: u64 = candidates
            .iter()
            .zip(&weights)
            .filter(|(c, _)| c.class == class)
            .map(|(_, w)| w)
            .sum();
        let mut r = rng.random_range(0..total);
        let Some(chosen) = candidates
            .iter()
            .zip(&weights)
            .filter(|(c, w)| c.class == class && **w > 0)
            .find(|(_, w)| {
                if r < **w {
                    true
                } else {
                    r -= **w;
                    false
                }
            })
            .map(|(c, _)| *c)
        else {
            break;
        };
        let path = tree.path(chosen.leaf);
        let mut target_nodes = Vec::new();
        let mut targets = 0;
        for &id in &path {
            if !masked[id.index()] {
                masked[id.index()] = true;
                let t = u64::from(tree.trainable(id));
                if t > 0 {
                    target_nodes.push(id);
                    targets += t;
                }
            }
        }
        out.targets += targets;
        out.trajectories.push(Admitted {
            leaf: chosen.leaf,
            class: chosen.class,
            path,
            target_nodes,
            targets,
        });
    }
    out
}

/// Trainable tokens from the root to the end of each node.
fn cumulative_trainable(tree: &TrajectoryTree) -> Vec<u64> {
    let mut cum = vec![0u64; tree.nodes.len()];
    let mut stack = vec![NodeId::SENTINEL];
    while let Some(id) = stack.pop() {
        for &(_, child) in &tree.nodes[id.index()].children {
            cum[child.index()] = cum[id.index()] + u64::from(tree.trainable(child));
            stack.push(child);
        }
    }
    cum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::tito::TitoRecord;
    use crate::trajectory::tree::TreeConfig;
    use rand::SeedableRng;

    fn rec(call: &str, input: &[u32], output: &[u32]) -> TitoRecord {
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
            input_message_ends: vec![],
            output_ids: output.to_vec(),
            output_logprobs: vec![-1.0; output.len()],
            output_sources: vec![],
        }
    }

    fn forked() -> TrajectoryTree {
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1], &[2, 3, 4])).unwrap();
        t.insert(&rec("b", &[1, 2, 3, 4, 5], &[6, 7])).unwrap();
        t.insert(&rec("c", &[1, 2, 3, 4, 8], &[9])).unwrap();
        t
    }

    #[test]
    fn shared_prefix_trains_once_and_priority_goes_first() {
        let t = forked();
        let leaves = t.leaves();
        // The short leaf has the higher class: it must be drawn first.
        let cands = [
            LeafClass {
                leaf: leaves[0],
                class: ClassId(1),
            },
            LeafClass {
                leaf: leaves[1],
                class: ClassId(0),
            },
        ];
        let a = admit(&t, &cands, 5, &mut ChaCha8Rng::seed_from_u64(1));
        assert_eq!(a.trajectories.len(), 2);
        assert_eq!(a.trajectories[0].leaf, leaves[1]);
        assert_eq!(a.trajectories[0].targets, 4); // 2, 3, 4 and 9
        assert_eq!(a.trajectories[1].targets, 2); // 6, 7
        assert_eq!(a.targets, a.trainable_tokens);
    }

    #[test]
    fn jmax_caps_and_draws_are_seeded() {
        let t = forked();
        let cands: Vec<LeafClass> = t
            .leaves()
            .into_iter()
            .map(|leaf| LeafClass {
                leaf,
                class: ClassId(0),
            })
            .collect();
        let one = admit(&t, &cands, 1, &mut ChaCha8Rng::seed_from_u64(3));
        assert_eq!(one.trajectories.len(), 1);
        let again = admit(&t, &cands, 1, &mut ChaCha8Rng::seed_from_u64(3));
        assert_eq!(one, again);
        let none = admit(&t, &cands, 0, &mut ChaCha8Rng::seed_from_u64(3));
        assert!(none.trajectories.is_empty());
    }

    #[test]
    fn draws_follow_unmasked_counts() {
        // Leaf weights 5 (4 shared + 1) and 7 (4 shared + 3): first draw
        // picks the heavier one 7/12 of the time.
        let mut t = TrajectoryTree::new("e", TreeConfig::default());
        t.insert(&rec("a", &[1], &[2, 3, 4, 5])).unwrap();
        t.insert(&rec("b", &[1, 2, 3, 4, 5, 6], &[7])).unwrap();
        t.insert(&rec("c", &[1, 2, 3, 4, 5, 8], &[9, 10, 11]))
            .unwrap();
        let leaves = t.leaves();
        let cands: Vec<LeafClass> = leaves
            .iter()
            .map(|&leaf| LeafClass {
                leaf,
                class: ClassId(0),
            })
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let trials = 6000;
        let heavy = (0..trials)
            .filter(|_| admit(&t, &cands, 1, &mut rng).trajectories[0].leaf == leaves[1])
            .count();
        let p = heavy as f64 / trials as f64;
        assert!((p - 7.0 / 12.0).abs() < 0.03, "p = {p}");
    }
}
