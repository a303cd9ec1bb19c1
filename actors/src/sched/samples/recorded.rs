//! The recorded sample source: each execution's TITO records as a
//! trajectory tree, admitted and materialised on demand.
//!
//! Records arrive one model call at a time and go straight into their
//! execution's [`TrajectoryTree`], so a shared prefix is stored once however
//! many calls repeat it. Nothing becomes a training row before the packer
//! asks (SPEC: rows exist only after the execution is closed and scored);
//! then admission by masking picks at most J_max trajectories, drawn from a
//! seed fixed per execution, and the admitted paths are materialised with
//! the execution's advantage and coefficient on every target token. The
//! tree is dropped as soon as its rows exist.

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{ExecRows, Rows, Sample, SampleError, SampleSource, Weighting};
use crate::sched::ids::ExecId;
use crate::trajectory::admission::{DEFAULT_JMAX, admit};
use crate::trajectory::packing::materialise;
use crate::trajectory::profile::{ProfileConfig, ProfileError, RuleProfile, classify_leaves};
use crate::trajectory::{TitoRecord, TrajectoryTree, TreeConfig};

/// How recorded executions become rows.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedConfig {
    /// J_max: admitted trajectories per execution at most.
    pub jmax: usize,
    /// Classes leaves into the priority order admission follows.
    pub profile: ProfileConfig,
    pub tree: TreeConfig,
}

impl Default for RecordedConfig {
    fn default() -> Self {
        Self {
            jmax: DEFAULT_JMAX,
            profile: ProfileConfig::generic(None),
            tree: TreeConfig::default(),
        }
    }
}

#[derive(Debug)]
pub struct Recorded {
    jmax: usize,
    profile: RuleProfile,
    tree: TreeConfig,
    trees: BTreeMap<ExecId, TrajectoryTree>,
}

impl Recorded {
    /// Fails when the profile is inconsistent (unknown or repeated classes).
    pub fn new(cfg: RecordedConfig) -> Result<Self, ProfileError> {
        Ok(Self {
            jmax: cfg.jmax,
            profile: RuleProfile::new(cfg.profile)?,
            tree: cfg.tree,
            trees: BTreeMap::new(),
        })
    }

    /// The tree recorded so far for `exec`.
    pub fn tree(&self, exec: ExecId) -> Option<&TrajectoryTree> {
        self.trees.get(&exec)
    }
}

impl SampleSource for Recorded {
    fn record(&mut self, exec: ExecId, record: &TitoRecord) -> Result<(), SampleError> {
        let tree = self
            .trees
            .entry(exec)
            .or_insert_with(|| TrajectoryTree::new(record.execution.clone(), self.tree));
        match tree.insert(record) {
            Ok(_) => Ok(()),
            Err(source) => {
                // A bad first record must not leave an empty tree (named
                // after it) behind for the good ones.
                if tree.calls().is_empty() {
                    self.trees.remove(&exec);
                }
                Err(SampleError::Insert { exec, source })
            }
        }
    }

    fn rows(&mut self, sample: &Sample, w: &Weighting) -> Result<ExecRows, SampleError> {
        let exec = sample.exec;
        let tree = self
            .trees
            .remove(&exec)
            .ok_or(SampleError::NotRecorded { exec })?;
        let candidates = classify_leaves(&tree, &self.profile)
            .map_err(|source| SampleError::Profile { exec, source })?;
        let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
        let admission = admit(&tree, &candidates, self.jmax, &mut rng);
        let rows = materialise(
            &tree,
            &admission,
            w.execution,
            w.advantage,
            w.batch_executions,
        );
        Ok(ExecRows {
            targets: admission.targets,
            rows: Rows::Tokens(rows),
        })
    }

    fn forget(&mut self, exec: ExecId) {
        self.trees.remove(&exec);
    }

    fn held(&self) -> usize {
        self.trees.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::scoring::Outcome;
    use crate::trajectory::synth::{SynthConfig, generate, profile};

    fn source(jmax: usize) -> Recorded {
        Recorded::new(RecordedConfig {
            jmax,
            profile: profile(),
            tree: TreeConfig::default(),
        })
        .unwrap()
    }

    fn weighting(seed: u64) -> Weighting {
        Weighting {
            execution: 2,
            advantage: -0.5,
            batch_executions: 8,
            seed,
        }
    }

    fn sample(exec: u64) -> Sample {
        Sample {
            exec: ExecId(exec),
            outcome: Outcome::Valid {
                score: 0.0,
                partial: false,
            },
            tokens: 0,
        }
    }

    fn recorded(src: &mut Recorded, exec: u64, seed: u64) {
        let trace = generate(&SynthConfig::small(seed, format!("e{exec}"))).unwrap();
        for r in &trace.records {
            src.record(ExecId(exec), r).unwrap();
        }
    }

    #[test]
    fn admits_at_most_jmax_weighted_rows_and_drops_the_tree() {
        let mut src = source(2);
        recorded(&mut src, 1, 7);
        let trainable = src.tree(ExecId(1)).unwrap().trainable_tokens();
        let r = src.rows(&sample(1), &weighting(3)).unwrap();
        let Rows::Tokens(rows) = &r.rows else {
            panic!("a recorded source materialises tokens");
        };
        assert!(!rows.is_empty() && rows.len() <= 2);
        assert!(r.targets > 0 && r.targets <= trainable);
        let targets: usize = rows.iter().map(|row| row.targets()).sum();
        assert_eq!(targets as u64, r.targets);
        let c = crate::trajectory::objective::coefficient(r.targets, 8);
        for row in rows {
            assert_eq!((row.execution, row.advantage), (2, -0.5));
            for (t, coef) in row.target.iter().zip(&row.coefficients) {
                assert_eq!(*coef, if *t { c } else { 0.0 });
            }
        }
        assert_eq!(src.held(), 0);
        assert!(matches!(
            src.rows(&sample(1), &weighting(3)),
            Err(SampleError::NotRecorded { .. })
        ));
    }

    #[test]
    fn the_seed_fixes_the_draws() {
        let rows = |seed| {
            let mut src = source(1);
            recorded(&mut src, 1, 7);
            src.rows(&sample(1), &weighting(seed)).unwrap()
        };
        assert_eq!(rows(5), rows(5));
        // One trajectory of many candidates: some seed must draw another.
        assert!((6..40).any(|s| rows(s) != rows(5)));
    }

    #[test]
    fn a_bad_record_leaves_nothing_behind() {
        let mut src = source(5);
        let mut rec = generate(&SynthConfig::small(1, "e1")).unwrap().records[0].clone();
        rec.output_logprobs.pop();
        assert!(matches!(
            src.record(ExecId(1), &rec),
            Err(SampleError::Insert { .. })
        ));
        assert_eq!(src.held(), 0);
        recorded(&mut src, 1, 1);
        let mut other = generate(&SynthConfig::small(2, "someone-else"))
            .unwrap()
            .records[0]
            .clone();
        other.call_id = "fresh".into();
        assert!(src.record(ExecId(1), &other).is_err());
        assert_eq!(src.held(), 1);
        src.forget(ExecId(1));
        assert_eq!(src.held(), 0);
    }
}
