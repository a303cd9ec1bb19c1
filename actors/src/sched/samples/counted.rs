//! The count-only sample source of the simulator.
//!
//! The simulator models neither contexts nor admission: an execution that
//! trains is one admitted trajectory whose every token is a target, as long
//! as the output tokens the evaluator counted. It keeps nothing per
//! execution, so memory stays flat however many tokens a run simulates.

use gyre_runtime::BlobId;

use super::{ExecRows, Rows, Sample, SampleError, SampleSource, Weighting};
use crate::sched::ids::ExecId;
use crate::trajectory::TitoRecord;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted;

impl SampleSource for Counted {
    fn record(&mut self, exec: ExecId, _record: &TitoRecord) -> Result<(), SampleError> {
        Err(SampleError::CountsOnly { exec })
    }

    /// Counts need no records: the handles are ignored (the simulator sends
    /// none).
    fn attach(&mut self, _exec: ExecId, _records: &[BlobId]) -> Result<usize, SampleError> {
        Ok(0)
    }

    fn rows(&mut self, sample: &Sample, _weighting: &Weighting) -> Result<ExecRows, SampleError> {
        let tokens = sample.trainable_tokens();
        let lengths = if tokens > 0 { vec![tokens] } else { Vec::new() };
        Ok(ExecRows {
            targets: tokens,
            rows: Rows::Lengths(lengths),
        })
    }

    fn forget(&mut self, _exec: ExecId) {}

    fn held(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::scoring::Outcome;

    #[test]
    fn one_row_of_the_counted_tokens_and_no_records() {
        let w = Weighting {
            execution: 0,
            advantage: 1.0,
            batch_executions: 4,
            seed: 0,
        };
        let valid = Sample {
            exec: ExecId(3),
            outcome: Outcome::Valid {
                score: 1.0,
                partial: true,
            },
            tokens: 120,
            records: Vec::new(),
        };
        let r = Counted.rows(&valid, &w).unwrap();
        assert_eq!(r.targets, 120);
        assert_eq!(r.rows, Rows::Lengths(vec![120]));
        let dummy = Sample {
            outcome: Outcome::Dummy,
            ..valid.clone()
        };
        assert!(Counted.rows(&dummy, &w).unwrap().rows.is_empty());
        let rec = crate::trajectory::synth::generate(
            &crate::trajectory::synth::SynthConfig::small(1, "e"),
        )
        .unwrap()
        .records
        .remove(0);
        assert_eq!(Counted.attach(ExecId(3), &[BlobId(4)]), Ok(0));
        assert!(matches!(
            Counted.record(ExecId(3), &rec),
            Err(SampleError::CountsOnly { .. })
        ));
    }
}
