//! Property tests of the trajectory plane: the tree against the naive
//! expand-everything oracle, admission's guarantees, and the objective's
//! weighting rules (SPEC 3.6, 3.7).

use gyre_actors::trajectory::naive::NaiveTrie;
use gyre_actors::trajectory::objective::{
    ObjectiveConfig, TargetTokens, batch_weights, freeze, group_advantages, loss_and_grad,
    surrogate_loss,
};
use gyre_actors::trajectory::packing::{TokenRow, flatten_targets, materialise, pack, whole_rows};
use gyre_actors::trajectory::profile::{ClassId, LeafClass};
use gyre_actors::trajectory::scoring::Outcome;
use gyre_actors::trajectory::tree::flag;
use gyre_actors::trajectory::{
    Admission, CallPurpose, TitoRecord, TokenSource, TrajectoryTree, TreeConfig, admit,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// One step of a random trace: extend a prefix of an earlier call's full
/// sequence (or start fresh) with a suffix, then produce an output.
#[derive(Clone, Debug)]
struct Op {
    base: Option<(usize, u8)>,
    suffix: Vec<u32>,
    output: Vec<u32>,
    external: Vec<bool>,
    critique: bool,
}

/// Small alphabets make accidental sharing (and node splits) frequent.
fn op() -> impl Strategy<Value = Op> {
    op_over(4)
}

fn op_over(alphabet: u32) -> impl Strategy<Value = Op> {
    (
        proptest::option::weighted(0.8, (any::<usize>(), any::<u8>())),
        proptest::collection::vec(0u32..alphabet, 0..6),
        proptest::collection::vec(0u32..alphabet, 0..6),
        proptest::collection::vec(proptest::bool::weighted(0.15), 6),
        proptest::bool::weighted(0.05),
    )
        .prop_map(|(base, suffix, output, external, critique)| Op {
            base,
            suffix,
            output,
            external,
            critique,
        })
}

fn records(ops: &[Op]) -> Vec<TitoRecord> {
    let mut out: Vec<TitoRecord> = Vec::new();
    for (i, o) in ops.iter().enumerate() {
        let mut input = match (o.base, out.is_empty()) {
            (Some((b, cut)), false) => {
                let prev = &out[b % out.len()];
                let full: Vec<u32> = prev
                    .input_ids
                    .iter()
                    .chain(&prev.output_ids)
                    .copied()
                    .collect();
                let keep = 1 + cut as usize % full.len();
                full[..keep].to_vec()
            }
            _ => Vec::new(),
        };
        input.extend(&o.suffix);
        if input.is_empty() {
            input.push(o.output.first().copied().unwrap_or(0));
        }
        let n = o.output.len();
        out.push(TitoRecord {
            execution: "e".into(),
            call_id: format!("c{i}"),
            thread: None,
            parent_call: None,
            role: None,
            purpose: if o.critique {
                CallPurpose::Critique
            } else {
                CallPurpose::Policy
            },
            policy_version: 0,
            engine: None,
            start_ns: 0,
            end_ns: 0,
            input_ids: input,
            input_message_ends: vec![],
            output_ids: o.output.clone(),
            output_logprobs: (0..n).map(|j| -0.1 - (i * 7 + j) as f32 % 3.0).collect(),
            output_sources: (0..n)
                .map(|j| {
                    if o.external[j] {
                        TokenSource::External
                    } else {
                        TokenSource::Sampled
                    }
                })
                .collect(),
        });
    }
    out
}

fn tree_of(recs: &[TitoRecord], cfg: TreeConfig) -> TrajectoryTree {
    let mut t = TrajectoryTree::new("e", cfg);
    for r in recs {
        t.insert(r).unwrap();
    }
    t
}

/// (tokens, trainable, logprobs) of every candidate, sorted.
fn tree_paths(t: &TrajectoryTree) -> Vec<(Vec<u32>, Vec<bool>, Vec<f32>)> {
    let mut v: Vec<_> = t
        .leaves()
        .into_iter()
        .map(|leaf| {
            let (mut tok, mut tr, mut lp) = (Vec::new(), Vec::new(), Vec::new());
            for n in t.path(leaf) {
                tok.extend_from_slice(t.tokens(n));
                for (&f, &l) in t.flags(n).iter().zip(t.logprobs(n)) {
                    tr.push(flag::trainable(f));
                    lp.push(if flag::trainable(f) { l } else { 0.0 });
                }
            }
            (tok, tr, lp)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// (unique tokens, candidate paths) of the naive oracle.
#[allow(clippy::type_complexity)]
fn naive_paths(recs: &[TitoRecord]) -> (usize, Vec<(Vec<u32>, Vec<bool>, Vec<f32>)>) {
    let mut naive = NaiveTrie::new();
    for r in recs {
        naive.insert(r).unwrap();
    }
    let paths = naive
        .paths()
        .into_iter()
        .map(|p| (p.tokens, p.trainable, p.logprobs))
        .collect();
    (naive.len(), paths)
}

fn candidates(t: &TrajectoryTree, classes: &[u16]) -> Vec<LeafClass> {
    t.leaves()
        .into_iter()
        .enumerate()
        .map(|(i, leaf)| LeafClass {
            leaf,
            class: ClassId(classes.get(i).copied().unwrap_or(0)),
        })
        .collect()
}

/// A deterministic stand-in for the trainer's log π(y_u | c_u): a function
/// of the row prefix up to and including u, so equal contexts agree.
fn policy_logprobs(row: &TokenRow) -> Vec<f32> {
    let mut h: u64 = 1469598103934665603;
    row.input_ids
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t)).wrapping_mul(1099511628211);
            -0.05 - (h % 1000) as f32 / 400.0
        })
        .collect()
}

fn batch_loss(rows: &[TokenRow], advantages: &[f32]) -> (f64, Vec<f32>) {
    let flat = flatten_targets(rows, &whole_rows(rows));
    let lp_rows: Vec<Vec<f32>> = rows.iter().map(policy_logprobs).collect();
    let logp: Vec<f32> = flat
        .at
        .iter()
        .map(|&(r, u)| lp_rows[r as usize][u as usize])
        .collect();
    let rep = loss_and_grad(&flat.view(), advantages, &logp, &ObjectiveConfig::default()).unwrap();
    (rep.loss, rep.frozen.seq_ratio)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    #[test]
    fn tree_agrees_with_naive(ops in proptest::collection::vec(op(), 1..40)) {
        let recs = records(&ops);
        let want = naive_paths(&recs);
        // Windows longer than any node, at every boundary, make anchor
        // verification exact.
        let thorough = TreeConfig {
            anchor_boundary_checks: usize::MAX,
            ..TreeConfig::anchored(64)
        };
        for cfg in [TreeConfig::default(), thorough] {
            let t = tree_of(&recs, cfg);
            t.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(&tree_paths(&t), &want.1, "{:?}", cfg.match_mode);
            prop_assert_eq!(t.unique_tokens() as usize, want.0);
        }
        // A short window may accept a wrong anchor on a 4-token alphabet
        // (documented), but never breaks the structure.
        tree_of(&recs, TreeConfig::anchored(1)).check_invariants().map_err(TestCaseError::fail)?;
    }

    #[test]
    fn short_anchor_windows_agree_on_realistic_vocabularies(
        ops in proptest::collection::vec(op_over(150_000), 1..40),
    ) {
        let recs = records(&ops);
        let want = naive_paths(&recs);
        let t = tree_of(&recs, TreeConfig::anchored(2));
        t.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(&tree_paths(&t), &want.1);
    }

    #[test]
    fn admitted_targets_are_disjoint_trainable_and_in_priority_order(
        ops in proptest::collection::vec(op(), 1..40),
        classes in proptest::collection::vec(0u16..3, 40),
        jmax in 0usize..7,
        seed in any::<u64>(),
    ) {
        let t = tree_of(&records(&ops), TreeConfig::default());
        let cands = candidates(&t, &classes);
        let a = admit(&t, &cands, jmax, &mut ChaCha8Rng::seed_from_u64(seed));
        prop_assert!(a.trajectories.len() <= jmax);
        let mut seen = std::collections::BTreeSet::new();
        let mut total = 0;
        for r in &a.trajectories {
            let mut l_r = 0;
            for n in &r.target_nodes {
                prop_assert!(seen.insert(*n), "target node in two trajectories");
                prop_assert!(r.path.contains(n));
                prop_assert!(t.trainable(*n) > 0);
                l_r += u64::from(t.trainable(*n));
            }
            prop_assert_eq!(l_r, r.targets);
            prop_assert!(r.targets > 0);
            total += l_r;
        }
        prop_assert_eq!(total, a.targets);
        // Rows: every target token is trainable in the tree.
        let rows = materialise(&t, &a, 0, 1.0, 16);
        for (row, r) in rows.iter().zip(&a.trajectories) {
            let tr: Vec<bool> = r.path.iter()
                .flat_map(|&n| t.flags(n).iter().map(|&f| flag::trainable(f)))
                .collect();
            for (u, &is_t) in row.target.iter().enumerate() {
                prop_assert!(!is_t || tr[u]);
            }
        }
        // Classes never go back up in priority.
        prop_assert!(a.trajectories.windows(2).all(|w| w[0].class <= w[1].class));
        // Stopping early means nothing trainable was left.
        if a.trajectories.len() < jmax {
            prop_assert_eq!(a.targets, t.trainable_tokens());
        }
        let again = admit(&t, &cands, jmax, &mut ChaCha8Rng::seed_from_u64(seed));
        prop_assert_eq!(a, again);
    }

    #[test]
    fn reassigning_a_shared_target_changes_nothing(
        ops in proptest::collection::vec(op(), 2..40),
        seed in any::<u64>(),
        pick in any::<usize>(),
        adv in -2.0f32..2.0,
    ) {
        let t = tree_of(&records(&ops), TreeConfig::default());
        let a = admit(&t, &candidates(&t, &[]), 5, &mut ChaCha8Rng::seed_from_u64(seed));
        let rows = materialise(&t, &a, 0, adv, 4);
        // Targets of row i that also lie on row j's path (same node).
        let mut movable = Vec::new();
        for (i, ri) in a.trajectories.iter().enumerate() {
            for (j, rj) in a.trajectories.iter().enumerate() {
                if i == j {
                    continue;
                }
                let mut depth = 0usize;
                for n in &ri.path {
                    let len = t.node_len(*n) as usize;
                    if rj.path.contains(n) && ri.target_nodes.contains(n) {
                        for u in depth..depth + len {
                            if rows[i].target[u] {
                                movable.push((i, j, u));
                            }
                        }
                    }
                    depth += len;
                }
            }
        }
        prop_assume!(!movable.is_empty());
        let (i, j, u) = movable[pick % movable.len()];
        let mut moved = rows.clone();
        moved[i].target[u] = false;
        moved[j].target[u] = true;
        moved[j].behaviour_logprobs[u] = rows[i].behaviour_logprobs[u];
        moved[j].coefficients[u] = rows[i].coefficients[u];
        moved[i].coefficients[u] = 0.0;
        let (before, s_before) = batch_loss(&rows, &[adv]);
        let (after, s_after) = batch_loss(&moved, &[adv]);
        prop_assert!((before - after).abs() <= 1e-9 * before.abs().max(1.0));
        prop_assert_eq!(s_before, s_after);
    }

    #[test]
    fn execution_weight_does_not_depend_on_trajectory_count(
        ops in proptest::collection::vec(op(), 1..40),
        seed in any::<u64>(),
        jmax in 1usize..6,
        batch in 1u64..64,
    ) {
        let t = tree_of(&records(&ops), TreeConfig::default());
        let cands = candidates(&t, &[]);
        let total = |a: &Admission| -> f64 {
            materialise(&t, a, 0, 1.0, batch)
                .iter()
                .flat_map(|r| r.coefficients.iter().map(|&c| f64::from(c)))
                .sum()
        };
        let one = admit(&t, &cands, 1, &mut ChaCha8Rng::seed_from_u64(seed));
        let many = admit(&t, &cands, jmax, &mut ChaCha8Rng::seed_from_u64(seed));
        if one.targets == 0 {
            // L_i = 0: no rows, no weight.
            prop_assert!(one.trajectories.is_empty());
            prop_assert_eq!(total(&one), 0.0);
        } else {
            let want = 1.0 / batch as f64;
            prop_assert!((total(&one) - want).abs() < 1e-5 * want);
            prop_assert!((total(&many) - want).abs() < 1e-5 * want);
        }
    }

    #[test]
    fn packing_keeps_every_token_weight(
        ops in proptest::collection::vec(op(), 1..40),
        seed in any::<u64>(),
        budget in 1u32..24,
    ) {
        let t = tree_of(&records(&ops), TreeConfig::default());
        let a = admit(&t, &candidates(&t, &[]), 5, &mut ChaCha8Rng::seed_from_u64(seed));
        let rows = materialise(&t, &a, 0, 0.7, 8);
        let steps = pack(&rows, budget).unwrap();
        prop_assert!(steps.iter().all(|s| s.tokens <= budget && s.tokens > 0));
        let whole = flatten_targets(&rows, &whole_rows(&rows));
        let split = flatten_targets(&rows, steps.iter().flat_map(|s| &s.chunks));
        let mut w: Vec<_> = whole.at.iter().zip(&whole.coefficients).map(|(a, c)| (*a, c.to_bits())).collect();
        let mut s: Vec<_> = split.at.iter().zip(&split.coefficients).map(|(a, c)| (*a, c.to_bits())).collect();
        w.sort_unstable();
        s.sort_unstable();
        prop_assert_eq!(w, s);
        // Chunks of one row appear in strictly later micro-steps.
        for (r, row) in rows.iter().enumerate() {
            let mut at: Vec<(u32, usize)> = steps.iter().enumerate()
                .flat_map(|(i, st)| st.chunks.iter().filter(|c| c.row == r as u32).map(move |c| (c.start, i)))
                .collect();
            at.sort_unstable();
            prop_assert!(at.windows(2).all(|p| p[0].1 < p[1].1));
            let covered: u32 = steps.iter().flat_map(|s| &s.chunks).filter(|c| c.row == r as u32).map(|c| c.len()).sum();
            prop_assert_eq!(covered as usize, row.len());
        }
    }

    #[test]
    fn zero_targets_give_zero_loss(adv in -3.0f32..3.0) {
        let tokens = TargetTokens { execution: &[], behaviour_logprobs: &[], coefficients: &[] };
        let r = loss_and_grad(&tokens, &[adv], &[], &ObjectiveConfig::default()).unwrap();
        prop_assert_eq!(r.loss, 0.0);
        prop_assert_eq!(r.frozen.seq_ratio, vec![1.0]);
    }

    #[test]
    fn dummies_count_in_the_batch_and_pending_never_trains(
        rewards in proptest::collection::vec(0.0f32..1.0, 2..8),
        dummies in proptest::collection::vec(any::<bool>(), 8),
        targets in proptest::collection::vec(1u64..500, 8),
        groups in 1usize..4,
    ) {
        let cfg = ObjectiveConfig::default();
        let n = rewards.len();
        let group: Vec<Outcome> = rewards.iter().zip(&dummies)
            .map(|(&r, &d)| if d { Outcome::Dummy } else { Outcome::Valid { score: r, partial: false } })
            .collect();
        let all: Vec<Vec<Outcome>> = vec![group.clone(); groups];
        let tg: Vec<Vec<u64>> = vec![targets[..n].to_vec(); groups];
        let w = batch_weights(&all, &tg, &cfg).unwrap();
        let bn = (groups * n) as f64;
        for (k, o) in group.iter().enumerate() {
            let c = f64::from(w[0][k].coefficient);
            match o {
                Outcome::Dummy => prop_assert_eq!(c, 0.0),
                _ => prop_assert!((c * targets[k] as f64 - 1.0 / bn).abs() < 1e-6 / bn),
            }
        }
        // Dummies are valid zeros in the group mean.
        let mean = group.iter().filter_map(Outcome::reward).map(f64::from).sum::<f64>() / n as f64;
        for (k, o) in group.iter().enumerate() {
            let want = f64::from(o.reward().unwrap()) - mean;
            prop_assert!((f64::from(w[0][k].advantage.unwrap()) - want).abs() < 1e-5);
        }
        // A pending member blocks the batch: it neither trains nor is a zero.
        let mut pend = all.clone();
        pend[0][0] = Outcome::Pending { attempts: 1 };
        prop_assert!(batch_weights(&pend, &tg, &cfg).is_err());
        // Once excluded, it is left out of the statistics, not counted as zero.
        let mut excl = group.clone();
        excl[0] = Outcome::Excluded { attempts: 2 };
        let adv = group_advantages(&excl, &cfg).unwrap();
        prop_assert_eq!(adv[0], None);
        let rest: Vec<f64> = excl[1..].iter().filter_map(Outcome::reward).map(f64::from).collect();
        let m = rest.iter().sum::<f64>() / rest.len() as f64;
        for (k, o) in excl.iter().enumerate().skip(1) {
            let want = f64::from(o.reward().unwrap()) - m;
            prop_assert!((f64::from(adv[k].unwrap()) - want).abs() < 1e-5);
        }
        let ew = batch_weights(&[excl], &[targets[..n].to_vec()], &cfg).unwrap();
        prop_assert_eq!(ew[0][0].coefficient, 0.0);
    }

    #[test]
    fn gradient_matches_finite_differences(
        toks in proptest::collection::vec((0u32..3, -6.0f32..-0.01, -6.0f32..-0.01, 0.001f32..0.1), 1..40),
        adv in proptest::collection::vec(-2.0f32..2.0, 3),
    ) {
        let cfg = ObjectiveConfig::default();
        let execution: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let old: Vec<f32> = toks.iter().map(|t| t.1).collect();
        let new: Vec<f32> = toks.iter().map(|t| t.2).collect();
        let coef: Vec<f32> = toks.iter().map(|t| t.3).collect();
        let tokens = TargetTokens { execution: &execution, behaviour_logprobs: &old, coefficients: &coef };
        let rep = loss_and_grad(&tokens, &adv, &new, &cfg).unwrap();
        let frozen = freeze(&tokens, &adv, &new, &cfg).unwrap();
        prop_assert_eq!(&frozen, &rep.frozen);
        let h = 1e-2f32;
        for u in 0..new.len() {
            let i = execution[u] as usize;
            let x = -f64::from(frozen.clip_mask[i]) * f64::from(frozen.rho_bar[u]) * f64::from(adv[i]) * f64::from(new[u]);
            let slope = (f64::from(frozen.rho_bar[u]) * f64::from(adv[i])).abs();
            // Stay away from the loss cap's kink.
            prop_assume!((x - f64::from(cfg.token_loss_cap)).abs() > 2.0 * slope * f64::from(h));
            let (mut up, mut down) = (new.clone(), new.clone());
            up[u] += h;
            down[u] -= h;
            let fd = (surrogate_loss(&tokens, &adv, &frozen, &up, &cfg)
                - surrogate_loss(&tokens, &adv, &frozen, &down, &cfg))
                / (f64::from(up[u]) - f64::from(down[u]));
            let g = f64::from(rep.grad[u]);
            prop_assert!((fd - g).abs() <= 1e-4 * g.abs().max(1e-3), "u={u} fd={fd} g={g}");
        }
        prop_assert!((surrogate_loss(&tokens, &adv, &frozen, &new, &cfg) - rep.loss).abs() < 1e-12);
    }
}
