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
//!
//! Records come inline ([`SampleSource::record`]) or by handle
//! ([`SampleSource::attach`]) from a blob store given with
//! [`Recorded::with_blobs`]; a handle is released as soon as its record is
//! read, so the store holds a record only until its group is taken.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_runtime::{BlobId, BlobStore, get_decoded};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{ExecRows, Rows, Sample, SampleError, SampleSource, Weighting};
use crate::sched::ids::ExecId;
use crate::trajectory::admission::{DEFAULT_JMAX, admit};
use crate::trajectory::packing::materialise;
use crate::trajectory::profile::{ProfileConfig, ProfileError, RuleProfile, classify_leaves};
use crate::trajectory::{TitoRecord, TrajectoryTree, TreeConfig};

/// How recorded executions become rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    blobs: Option<Arc<dyn BlobStore>>,
}

impl Recorded {
    /// Fails when the profile is inconsistent (unknown or repeated classes).
    pub fn new(cfg: RecordedConfig) -> Result<Self, ProfileError> {
        Ok(Self {
            jmax: cfg.jmax,
            profile: RuleProfile::new(cfg.profile)?,
            tree: cfg.tree,
            trees: BTreeMap::new(),
            blobs: None,
        })
    }

    /// Reads record handles from `blobs` (and releases them there).
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// Reads and releases one record handle.
    fn take_record(
        store: &dyn BlobStore,
        exec: ExecId,
        blob: BlobId,
    ) -> Result<TitoRecord, SampleError> {
        let got = get_decoded::<TitoRecord>(store, blob);
        store.release(blob);
        got.map_err(|e| SampleError::Blob {
            exec,
            blob,
            reason: e.to_string(),
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

    fn attach(&mut self, exec: ExecId, records: &[BlobId]) -> Result<usize, SampleError> {
        let handles: Vec<BlobId> = records.iter().copied().filter(|b| b.is_some()).collect();
        if handles.is_empty() {
            return Ok(0);
        }
        let Some(store) = self.blobs.clone() else {
            return Err(SampleError::NoBlobStore {
                exec,
                records: handles.len(),
            });
        };
        let mut first_error = None;
        let mut taken = 0;
        for blob in handles {
            // Every handle is released, also after an error: nobody else
            // will read it.
            let rec = Self::take_record(store.as_ref(), exec, blob);
            if first_error.is_some() {
                continue;
            }
            match rec.and_then(|r| self.record(exec, &r)) {
                Ok(()) => taken += 1,
                Err(e) => first_error = Some(e),
            }
        }
        match first_error {
            None => Ok(taken),
            Some(e) => {
                // A trajectory with a call missing is not the one the
                // policy produced: the execution trains nothing.
                self.trees.remove(&exec);
                Err(e)
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
            records: Vec::new(),
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
    fn records_by_handle_build_the_same_tree_and_are_released() {
        let store = gyre_runtime::MemBlobs::shared();
        let trace = generate(&SynthConfig::small(7, "e1")).unwrap();
        let handles: Vec<BlobId> = trace
            .records
            .iter()
            .map(|r| gyre_runtime::put_encoded(store.as_ref(), r).unwrap())
            .collect();
        let mut by_handle = source(2).with_blobs(store.clone());
        let n = by_handle.attach(ExecId(1), &handles).unwrap();
        assert_eq!(n, trace.records.len());
        assert_eq!(store.live(), 0);
        let mut inline = source(2);
        recorded(&mut inline, 1, 7);
        assert_eq!(
            by_handle.rows(&sample(1), &weighting(3)).unwrap(),
            inline.rows(&sample(1), &weighting(3)).unwrap()
        );
    }

    #[test]
    fn a_bad_handle_drops_its_execution_and_still_releases_all() {
        let store = gyre_runtime::MemBlobs::shared();
        let trace = generate(&SynthConfig::small(7, "e1")).unwrap();
        let mut handles: Vec<BlobId> = trace
            .records
            .iter()
            .map(|r| gyre_runtime::put_encoded(store.as_ref(), r).unwrap())
            .collect();
        handles.insert(1, store.put(vec![0xff; 4]));
        handles.push(BlobId(10_000));
        let mut src = source(2).with_blobs(store.clone());
        assert!(matches!(
            src.attach(ExecId(1), &handles),
            Err(SampleError::Blob { .. })
        ));
        assert_eq!((store.live(), src.held()), (0, 0));
        // Only the missing handle: an error naming it.
        let err = src.attach(ExecId(2), &[BlobId(10_000)]).unwrap_err();
        assert!(err.to_string().contains("blob#10000"), "{err}");
        // No store: refused, nothing held; no handles: nothing to do.
        let mut bare = source(2);
        assert!(matches!(
            bare.attach(ExecId(1), &[BlobId(3)]),
            Err(SampleError::NoBlobStore { records: 1, .. })
        ));
        assert_eq!(bare.attach(ExecId(1), &[BlobId::NONE]), Ok(0));
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
