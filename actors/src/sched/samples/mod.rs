//! Training samples: what one execution contributes, and where the stream
//! packer gets its token rows from.
//!
//! The trajectory buffer keeps one [`Sample`] per execution: its SPEC 3.3
//! outcome (the trajectory plane's [`Outcome`], one concept for the whole
//! system) and the trainable token count the evaluator reported. What else
//! exists about an execution depends on the run. The simulator keeps token
//! counts only, so memory never grows with the tokens it simulates; a real
//! run keeps each execution's recorded calls as a trajectory tree. A
//! [`SampleSource`] hides that difference from the packer: asked for one
//! execution's rows, it answers with lengths ([`Counted`]) or with token rows
//! produced by admission and materialisation ([`Recorded`]), and
//! [`plan_group`] does everything else the same way for both: group-relative
//! advantages over valid results, coefficients 1/(L_i·B·N), and packing
//! under the micro-step token budget.

mod counted;
mod group;
mod recorded;

use std::fmt;

use gyre_runtime::BlobId;
use serde::{Deserialize, Serialize};

use crate::sched::ids::ExecId;
use crate::trajectory::objective::ObjectiveError;
use crate::trajectory::packing::{PackingError, TokenRow};
use crate::trajectory::profile::ProfileError;
use crate::trajectory::scoring::Outcome;
use crate::trajectory::{InsertError, TitoRecord};

pub use counted::Counted;
pub use group::{GroupCtx, GroupPlan, exec_seed, plan_group};
pub use recorded::{Recorded, RecordedConfig};

/// One execution of a group, as the buffer hands it to the packer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub exec: ExecId,
    pub outcome: Outcome,
    /// Output tokens the policy sampled, as the evaluator counted them.
    pub tokens: u64,
    /// Handles of the execution's TITO records (empty in the simulator):
    /// kept for dummies and excluded executions too, since the source must
    /// release what it does not use.
    pub records: Vec<BlobId>,
}

impl Sample {
    /// Trainable tokens by count: only an outcome that trains has any.
    pub fn trainable_tokens(&self) -> u64 {
        if self.outcome.trains() {
            self.tokens
        } else {
            0
        }
    }
}

/// How one execution is weighted in its batch. Fixed before its rows are
/// materialised, because every target token carries it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weighting {
    /// Index of the execution in its batch, in `0..B·N`.
    pub execution: u32,
    /// Â_i: the group-relative advantage.
    pub advantage: f32,
    /// B·N: every original execution of the batch.
    pub batch_executions: u64,
    /// Seeds this execution's admission draws.
    pub seed: u64,
}

/// An execution's admitted rows, in one of two forms.
#[derive(Debug, Clone, PartialEq)]
pub enum Rows {
    /// Lengths only, in tokens: what a count-only source knows.
    Lengths(Vec<u64>),
    /// Materialised rows, weighted and ready to train.
    Tokens(Vec<TokenRow>),
}

impl Rows {
    pub fn len(&self) -> usize {
        match self {
            Rows::Lengths(l) => l.len(),
            Rows::Tokens(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a source answers for one execution that trains.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRows {
    /// L_i: admitted target tokens, disjoint across the rows.
    pub targets: u64,
    pub rows: Rows,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error(
        "{exec:?}: this packer trains from token counts only; recorded calls need a recorded sample source"
    )]
    CountsOnly { exec: ExecId },
    #[error("{exec:?}: record rejected: {source}")]
    Insert {
        exec: ExecId,
        #[source]
        source: InsertError,
    },
    #[error("{exec:?}: no recorded calls; the execution trains nothing")]
    NotRecorded { exec: ExecId },
    #[error("{exec:?}: {source}")]
    Profile {
        exec: ExecId,
        #[source]
        source: ProfileError,
    },
    #[error("{exec:?}: record {blob}: {reason}")]
    Blob {
        exec: ExecId,
        blob: BlobId,
        reason: String,
    },
    #[error("{exec:?}: {records} record handles but the source has no blob store to read them")]
    NoBlobStore { exec: ExecId, records: usize },
    #[error("{exec:?}: the source mixed token rows with bare lengths in one group")]
    MixedRows { exec: ExecId },
    #[error("group objective: {0}")]
    Objective(#[from] ObjectiveError),
    #[error("packing: {0}")]
    Packing(#[from] PackingError),
}

/// Where the packer gets an execution's rows. One source per packer: the
/// simulator's [`Counted`], or [`Recorded`] trees for real runs.
pub trait SampleSource: fmt::Debug + Send + 'static {
    /// Takes one recorded model call of `exec` (the proxy's TITO record).
    fn record(&mut self, exec: ExecId, record: &TitoRecord) -> Result<(), SampleError>;

    /// Takes an execution's record handles (`Sample::records`); returns how
    /// many records it took in. A source that reads records releases every
    /// handle it is given, also on error; an error leaves `exec` with
    /// nothing to train.
    fn attach(&mut self, exec: ExecId, records: &[BlobId]) -> Result<usize, SampleError>;

    /// The admitted rows of an execution whose outcome trains. Consumes
    /// whatever the source held for it.
    fn rows(&mut self, sample: &Sample, weighting: &Weighting) -> Result<ExecRows, SampleError>;

    /// Drops what the source holds for `exec`: it will never train.
    fn forget(&mut self, exec: ExecId);

    /// Executions the source holds data for.
    fn held(&self) -> usize;
}
