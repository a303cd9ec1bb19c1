//! One ready group, turned into packed training input.
//!
//! The same steps for every sample source: advantages from the group's
//! outcomes (valid results only; a dummy is a valid zero, an excluded result
//! is no zero at all), then each execution that trains is asked for its rows
//! with its weighting fixed in advance, and the rows of the group are packed
//! into micro-steps of the token budget. Coefficients live on tokens, so the
//! packing can never change an execution's weight (SPEC 3.7).

use gyre_runtime::rng::mix64;

use super::{ExecRows, Rows, Sample, SampleError, SampleSource, Weighting};
use crate::sched::ids::ExecId;
use crate::trajectory::objective::{
    ExecutionWeight, ObjectiveConfig, coefficient, group_advantages,
};
use crate::trajectory::packing::{MicroStep, TokenRow, pack_by_execution, pack_lengths};

/// Where a group sits in its batch, and how to pack it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupCtx {
    /// Batch index of the group's first execution.
    pub first_execution: u32,
    /// B·N.
    pub batch_executions: u64,
    /// Micro-step token budget.
    pub budget: u32,
    /// The packer's admission seed; each execution derives its own.
    pub seed: u64,
    pub objective: ObjectiveConfig,
}

/// A group's training input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupPlan {
    /// Â_i and c_i per execution, in sample order.
    pub weights: Vec<ExecutionWeight>,
    /// Σ L_i over the group.
    pub targets: u64,
    /// The token rows micro-step chunks point into; empty when the source
    /// keeps counts only.
    pub rows: Vec<TokenRow>,
    pub steps: Vec<MicroStep>,
    /// What could not be used. An execution whose rows failed trains
    /// nothing; the rest of the group is unaffected.
    pub errors: Vec<SampleError>,
}

/// The admission seed of one execution: independent of the order in which
/// groups are taken, so replays and reorderings admit the same targets.
pub fn exec_seed(seed: u64, exec: ExecId) -> u64 {
    mix64(seed ^ mix64(exec.0))
}

/// Plans one ready group: see the module doc.
pub fn plan_group(source: &mut dyn SampleSource, samples: &[Sample], ctx: &GroupCtx) -> GroupPlan {
    let mut plan = GroupPlan::default();
    let outcomes: Vec<_> = samples.iter().map(|s| s.outcome.clone()).collect();
    let advantages = group_advantages(&outcomes, &ctx.objective).unwrap_or_else(|e| {
        // The buffer hands over ready groups only; if one was not, nothing
        // of it trains rather than a pending result counting as a zero.
        plan.errors.push(e.into());
        vec![None; samples.len()]
    });
    let mut lengths: Vec<u64> = Vec::new();
    for (k, (sample, advantage)) in samples.iter().zip(advantages).enumerate() {
        let mut weight = ExecutionWeight {
            advantage,
            coefficient: 0.0,
        };
        let trains = sample.outcome.trains() && advantage.is_some();
        let got = match (trains, advantage) {
            (true, Some(advantage)) => {
                let w = Weighting {
                    execution: ctx.first_execution.saturating_add(k as u32),
                    advantage,
                    batch_executions: ctx.batch_executions,
                    seed: exec_seed(ctx.seed, sample.exec),
                };
                source.rows(sample, &w)
            }
            _ => {
                source.forget(sample.exec);
                plan.weights.push(weight);
                continue;
            }
        };
        match got.and_then(|r| append(sample.exec, r, &mut lengths, &mut plan.rows)) {
            Ok(targets) => {
                plan.targets += targets;
                weight.coefficient = coefficient(targets, ctx.batch_executions);
            }
            Err(e) => plan.errors.push(e),
        }
        plan.weights.push(weight);
    }
    // Token rows pack by execution (s_i exact, see `packing`); lengths
    // alone, as the simulator keeps them, pack row by row.
    let packed = if plan.rows.is_empty() {
        pack_lengths(&lengths, ctx.budget)
    } else {
        pack_by_execution(&plan.rows, ctx.budget)
    };
    match packed {
        Ok(steps) => plan.steps = steps,
        Err(e) => {
            plan.errors.push(e.into());
            plan.rows.clear();
            plan.targets = 0;
            for w in &mut plan.weights {
                w.coefficient = 0.0;
            }
        }
    }
    plan
}

/// Appends one execution's rows, keeping `rows` either empty or parallel
/// to `lengths` (chunks index both); returns its L_i.
fn append(
    exec: ExecId,
    r: ExecRows,
    lengths: &mut Vec<u64>,
    rows: &mut Vec<TokenRow>,
) -> Result<u64, SampleError> {
    match r.rows {
        Rows::Lengths(l) if rows.is_empty() => lengths.extend(l),
        Rows::Tokens(t) if lengths.len() == rows.len() => {
            lengths.extend(t.iter().map(|row| row.len() as u64));
            rows.extend(t);
        }
        Rows::Lengths(l) if l.is_empty() => {}
        Rows::Tokens(t) if t.is_empty() => {}
        _ => return Err(SampleError::MixedRows { exec }),
    }
    Ok(r.targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::samples::Counted;
    use crate::trajectory::scoring::Outcome;

    fn sample(exec: u64, outcome: Outcome, tokens: u64) -> Sample {
        Sample {
            exec: ExecId(exec),
            outcome,
            tokens,
            records: Vec::new(),
        }
    }

    fn valid(score: f32) -> Outcome {
        Outcome::Valid {
            score,
            partial: false,
        }
    }

    fn ctx() -> GroupCtx {
        GroupCtx {
            first_execution: 4,
            batch_executions: 8,
            budget: 100,
            seed: 1,
            objective: ObjectiveConfig::default(),
        }
    }

    #[test]
    fn counted_group_weights_and_packs_only_what_trains() {
        let samples = [
            sample(0, valid(1.0), 250),
            sample(1, Outcome::Dummy, 40),
            sample(2, Outcome::Excluded { attempts: 2 }, 70),
            sample(3, valid(0.0), 30),
        ];
        let plan = plan_group(&mut Counted, &samples, &ctx());
        assert!(plan.errors.is_empty(), "{:?}", plan.errors);
        // Mean over valid results and the dummy: (1 + 0 + 0) / 3.
        let want = [Some(2.0 / 3.0), Some(-1.0 / 3.0), None, Some(-1.0 / 3.0)];
        for (w, want) in plan.weights.iter().zip(want) {
            match (w.advantage, want) {
                (Some(a), Some(b)) => assert!((f64::from(a) - b).abs() < 1e-6),
                (a, b) => assert_eq!((a, b), (None, None)),
            }
        }
        let coef: Vec<_> = plan.weights.iter().map(|w| w.coefficient).collect();
        let c = |l: f64| (1.0 / (l * 8.0)) as f32;
        assert_eq!(coef, vec![c(250.0), 0.0, 0.0, c(30.0)]);
        assert_eq!(plan.targets, 280);
        assert!(plan.rows.is_empty());
        let tokens: Vec<u32> = plan.steps.iter().map(|s| s.tokens).collect();
        assert_eq!(tokens, vec![100, 100, 80]);
    }

    #[test]
    fn a_group_that_is_not_ready_trains_nothing() {
        let samples = [
            sample(0, valid(1.0), 250),
            sample(1, Outcome::Pending { attempts: 1 }, 40),
        ];
        let plan = plan_group(&mut Counted, &samples, &ctx());
        assert!(matches!(plan.errors[..], [SampleError::Objective(_)]));
        assert!(plan.steps.is_empty());
        assert_eq!(plan.targets, 0);
    }

    #[test]
    fn a_row_too_long_to_pack_empties_the_group_plan() {
        let samples = [
            sample(0, valid(1.0), u64::from(u32::MAX) + 1),
            sample(1, valid(0.0), 5),
        ];
        let plan = plan_group(&mut Counted, &samples, &ctx());
        assert!(matches!(plan.errors[..], [SampleError::Packing(_)]));
        assert!(plan.steps.is_empty());
        assert!(plan.weights.iter().all(|w| w.coefficient == 0.0));
    }

    #[test]
    fn seeds_differ_by_execution_and_packer_seed() {
        assert_ne!(exec_seed(1, ExecId(0)), exec_seed(1, ExecId(1)));
        assert_ne!(exec_seed(1, ExecId(0)), exec_seed(2, ExecId(0)));
        assert_eq!(exec_seed(1, ExecId(5)), exec_seed(1, ExecId(5)));
    }
}
