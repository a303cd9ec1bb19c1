//! Trajectory-plane benchmarks: ingesting one reference-shaped execution
//! (636 requests, about 700K unique tokens) into the radix tree, exactly and
//! with anchored matching, against the naive token-per-node trie; the same
//! with a 64K-token longer system prompt (much more context, few more new
//! tokens) and with every message twice as long (twice the new tokens); and
//! admission plus coefficients, against admission over expanded paths.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gyre_actors::trajectory::naive::NaiveTrie;
use gyre_actors::trajectory::objective::{ObjectiveConfig, batch_weights};
use gyre_actors::trajectory::profile::{RuleProfile, classify_leaves};
use gyre_actors::trajectory::scoring::Outcome;
use gyre_actors::trajectory::synth::{self, Sizes, SynthConfig, generate};
use gyre_actors::trajectory::{TitoRecord, TrajectoryTree, TreeConfig, admit};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const SEED: u64 = 42;

fn execution(sizes: Sizes) -> Vec<TitoRecord> {
    generate(&SynthConfig::reference(SEED, sizes))
        .expect("reference plan is valid")
        .records
}

fn ingest(records: &[TitoRecord], cfg: TreeConfig) -> TrajectoryTree {
    let mut t = TrajectoryTree::new(&records[0].execution, cfg);
    for r in records {
        t.insert(r).expect("synthetic records are valid");
    }
    t
}

fn ingest_naive(records: &[TitoRecord]) -> NaiveTrie {
    let mut t = NaiveTrie::new();
    for r in records {
        t.insert(r).expect("synthetic records are valid");
    }
    t
}

fn describe(name: &str, records: &[TitoRecord]) {
    let t = ingest(records, TreeConfig::default());
    let context: u64 = records.iter().map(|r| r.input_ids.len() as u64).sum();
    let max = records.iter().map(|r| r.input_ids.len()).max().unwrap_or(0);
    eprintln!(
        "[{name}] {} requests, {} unique tokens, {} context tokens in all (longest {max}), \
         {} expanded candidate tokens, tree {:.1} MiB = {:.1} B/unique token",
        records.len(),
        t.unique_tokens(),
        context,
        t.stats().expanded_tokens,
        t.heap_bytes() as f64 / (1 << 20) as f64,
        t.heap_bytes() as f64 / t.unique_tokens() as f64,
    );
}

fn bench_ingest(c: &mut Criterion) {
    let anchored = TreeConfig::anchored(8);
    let variants = [
        ("base", Sizes::realistic(), true),
        (
            "long-prefix",
            Sizes {
                system: Sizes::realistic().system + 64_000,
                ..Sizes::realistic()
            },
            false,
        ),
        ("double", Sizes::realistic().scaled(2), false),
    ];
    let mut g = c.benchmark_group("ingest");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6));
    for (name, sizes, with_naive) in variants {
        let records = execution(sizes);
        describe(name, &records);
        g.bench_with_input(BenchmarkId::new("anchored", name), &records, |b, r| {
            b.iter(|| black_box(ingest(r, anchored)))
        });
        g.bench_with_input(BenchmarkId::new("exact", name), &records, |b, r| {
            b.iter(|| black_box(ingest(r, TreeConfig::default())))
        });
        if with_naive {
            let naive = ingest_naive(&records);
            eprintln!(
                "[{name}] naive trie {:.1} MiB for {} token nodes",
                naive.heap_bytes() as f64 / (1 << 20) as f64,
                naive.len()
            );
            drop(naive);
            g.bench_with_input(BenchmarkId::new("naive", name), &records, |b, r| {
                b.iter(|| black_box(ingest_naive(r)))
            });
        }
    }
    g.finish();
}

fn bench_admission(c: &mut Criterion) {
    let records = execution(Sizes::realistic());
    let tree = ingest(&records, TreeConfig::default());
    let naive = ingest_naive(&records);
    let profile = RuleProfile::new(synth::profile()).expect("valid profile");
    let cfg = ObjectiveConfig::default();
    let outcomes = vec![Outcome::Valid {
        score: 1.0,
        partial: false,
    }];
    let mut g = c.benchmark_group("admission");
    g.sample_size(20);
    g.bench_function("masking+coefficients", |b| {
        b.iter(|| {
            let classes = classify_leaves(&tree, &profile).expect("classifies");
            let mut rng = ChaCha8Rng::seed_from_u64(SEED);
            let a = admit(&tree, &classes, 5, &mut rng);
            let w = batch_weights(std::slice::from_ref(&outcomes), &[vec![a.targets]], &cfg)
                .expect("ready");
            black_box((a, w))
        })
    });
    let classes = classify_leaves(&tree, &profile).expect("classifies");
    // The naive trie's leaves in the same class as the tree's leaf ending
    // at the same expanded path.
    let naive_leaves = naive.leaves();
    let by_path: Vec<(Vec<u32>, u16)> = classes
        .iter()
        .map(|c| (tree.path_tokens(c.leaf), c.class.0))
        .collect();
    let naive_cands: Vec<(u32, u16)> = naive_leaves
        .iter()
        .map(|&l| {
            let p = naive.expand(l).tokens;
            let class = by_path.iter().find(|(q, _)| *q == p).map_or(0, |x| x.1);
            (l, class)
        })
        .collect();
    g.bench_function("expanded-paths", |b| {
        b.iter(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(SEED);
            black_box(naive.admit_expanded(&naive_cands, 5, &mut rng))
        })
    });
    g.finish();
}

criterion_group!(benches, bench_ingest, bench_admission);
criterion_main!(benches);
