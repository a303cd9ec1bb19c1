//! From admitted trajectories to token rows, and from rows to micro-steps.
//!
//! A row is one admitted trajectory materialised: its root-to-leaf tokens as
//! input ids, a target mask (this trajectory's targets only; the rest of the
//! path is conditioning context, possibly trained by another row), the
//! recorded behaviour log-probs, the execution's advantage and a per-token
//! coefficient 1/(L_i·B·N) on targets (0 elsewhere). Because coefficients
//! live on tokens, how rows are cut and grouped into micro-steps cannot
//! change any token's weight.
//!
//! Position `u` of a row holds token `u`; its target flag and log-prob are
//! about predicting token `u` from tokens `..u` (trainers shift by one).
//!
//! Packing: rows longer than the micro-step token budget are cut into
//! consecutive chunks that land in strictly increasing micro-steps (a later
//! chunk needs its predecessor's context, carried as KV state or recomputed).
//! Full chunks get their own micro-step; the remaining pieces are placed
//! first-fit in decreasing size order, which fills micro-steps densely.
//!
//! The sequence ratio s_i (SPEC 3.7, eq. 5) needs every target of an
//! execution, so token rows are packed by execution ([`pack_by_execution`]):
//! an execution whose rows fit one micro-step gets them all in one; only
//! an execution larger than the budget is cut. For those, each micro-step
//! also names the execution's chunks that landed elsewhere
//! ([`MicroStepRows::stats_chunks`]): weights are fixed during a step, so
//! the trainer computes their share of s_i with a forward-only pass and
//! clips exactly as if the execution were unsplit. ([`pack_lengths`], the
//! simulator's length-only packing, is unchanged.)

use serde::{Deserialize, Serialize};

use super::admission::Admission;
use super::objective::{TargetTokens, coefficient};
use super::tree::{NodeId, TrajectoryTree, flag};

/// One materialised trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenRow {
    /// Index of the execution in the batch.
    pub execution: u32,
    pub leaf: NodeId,
    pub input_ids: Vec<u32>,
    pub target: Vec<bool>,
    pub behaviour_logprobs: Vec<f32>,
    pub coefficients: Vec<f32>,
    pub advantage: f32,
}

impl TokenRow {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    pub fn targets(&self) -> usize {
        self.target.iter().filter(|&&t| t).count()
    }
}

/// Rows of one execution's admitted trajectories. `batch_executions` is B·N.
pub fn materialise(
    tree: &TrajectoryTree,
    admission: &Admission,
    execution: u32,
    advantage: f32,
    batch_executions: u64,
) -> Vec<TokenRow> {
    let c = coefficient(admission.targets, batch_executions);
    admission
        .trajectories
        .iter()
        .map(|r| {
            let len = r.path.last().map_or(0, |&l| tree.depth_end(l) as usize);
            let mut row = TokenRow {
                execution,
                leaf: r.leaf,
                input_ids: Vec::with_capacity(len),
                target: Vec::with_capacity(len),
                behaviour_logprobs: Vec::with_capacity(len),
                coefficients: Vec::with_capacity(len),
                advantage,
            };
            for &node in &r.path {
                let fixed = r.target_nodes.contains(&node);
                row.input_ids.extend_from_slice(tree.tokens(node));
                for (&f, &lp) in tree.flags(node).iter().zip(tree.logprobs(node)) {
                    let t = fixed && flag::trainable(f);
                    row.target.push(t);
                    row.behaviour_logprobs.push(if t { lp } else { 0.0 });
                    row.coefficients.push(if t { c } else { 0.0 });
                }
            }
            row
        })
        .collect()
}

/// A piece of a row: tokens `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowChunk {
    pub row: u32,
    pub start: u32,
    pub end: u32,
}

impl RowChunk {
    pub fn len(&self) -> u32 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One unit of training input, claimed atomically by one training cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroStep {
    pub chunks: Vec<RowChunk>,
    pub tokens: u32,
}

/// What a trainer reads behind a micro-step's row handle: only the rows the
/// micro-step's chunks touch, so a handle never drags a whole group along.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicroStepRows {
    pub rows: Vec<TokenRow>,
    /// The micro-step's chunks, in order; `row` indexes [`Self::rows`].
    pub chunks: Vec<RowChunk>,
    /// Chunks in other micro-steps of the executions this one shares with
    /// them: forward-only, for their share of s_i (empty when every
    /// execution here lies wholly in this micro-step).
    pub stats_chunks: Vec<RowChunk>,
}

impl MicroStepRows {
    /// Extracts the rows `chunks` and `stats_chunks` touch from `rows` (the
    /// group's), renumbering the chunks into the extract. `None` when a
    /// chunk points past `rows`.
    pub fn extract(
        rows: &[TokenRow],
        chunks: &[RowChunk],
        stats_chunks: &[RowChunk],
    ) -> Option<Self> {
        let mut index: Vec<(u32, u32)> = Vec::new();
        let mut out = MicroStepRows {
            rows: Vec::new(),
            chunks: Vec::with_capacity(chunks.len()),
            stats_chunks: Vec::with_capacity(stats_chunks.len()),
        };
        for (stats, ch) in chunks
            .iter()
            .map(|c| (false, c))
            .chain(stats_chunks.iter().map(|c| (true, c)))
        {
            let at = match index.iter().find(|(from, _)| *from == ch.row) {
                Some(&(_, to)) => to,
                None => {
                    let row = rows.get(ch.row as usize)?;
                    let to = out.rows.len() as u32;
                    out.rows.push(row.clone());
                    index.push((ch.row, to));
                    to
                }
            };
            let renumbered = RowChunk { row: at, ..*ch };
            if stats {
                out.stats_chunks.push(renumbered);
            } else {
                out.chunks.push(renumbered);
            }
        }
        Some(out)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackingError {
    #[error("the micro-step token budget must be positive")]
    ZeroBudget,
    #[error("row {row} has {len} tokens, more than a 32-bit position holds")]
    RowTooLong { row: usize, len: usize },
}

/// Packs rows into micro-steps of at most `budget` tokens. Deterministic.
pub fn pack(rows: &[TokenRow], budget: u32) -> Result<Vec<MicroStep>, PackingError> {
    let lengths: Vec<u64> = rows.iter().map(|r| r.len() as u64).collect();
    pack_lengths(&lengths, budget)
}

/// [`pack`] on row lengths alone: chunk `row` indices refer to `lengths`.
/// A simulator that keeps no per-token state packs with exactly the
/// algorithm a real run uses.
pub fn pack_lengths(lengths: &[u64], budget: u32) -> Result<Vec<MicroStep>, PackingError> {
    if budget == 0 {
        return Err(PackingError::ZeroBudget);
    }
    let mut order: Vec<(usize, u32)> = Vec::with_capacity(lengths.len());
    for (r, &len) in lengths.iter().enumerate() {
        let len = u32::try_from(len).map_err(|_| PackingError::RowTooLong {
            row: r,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        })?;
        if len > 0 {
            order.push((r, len));
        }
    }
    order.sort_by_key(|&(r, len)| (std::cmp::Reverse(len), r));
    let mut steps: Vec<MicroStep> = Vec::new();
    // Pieces left after the full chunks: (row, start, end, first allowed step).
    let mut rest = Vec::new();
    for &(r, len) in &order {
        let mut start = 0;
        let mut min_step = 0;
        while len - start >= budget {
            steps.push(MicroStep {
                chunks: vec![RowChunk {
                    row: r as u32,
                    start,
                    end: start + budget,
                }],
                tokens: budget,
            });
            start += budget;
            min_step = steps.len();
        }
        if start < len {
            rest.push((r as u32, start, len, min_step));
        }
    }
    rest.sort_by_key(|&(r, s, e, _)| (std::cmp::Reverse(e - s), r));
    for (row, start, end, min_step) in rest {
        let len = end - start;
        let chunk = RowChunk { row, start, end };
        match (min_step..steps.len()).find(|&i| steps[i].tokens + len <= budget) {
            Some(i) => {
                steps[i].chunks.push(chunk);
                steps[i].tokens += len;
            }
            None => steps.push(MicroStep {
                chunks: vec![chunk],
                tokens: len,
            }),
        }
    }
    Ok(steps)
}

/// Packs token rows keeping each execution's rows in one micro-step
/// whenever their total fits `budget`; larger executions are cut as
/// [`pack_lengths`] cuts rows. Deterministic.
pub fn pack_by_execution(rows: &[TokenRow], budget: u32) -> Result<Vec<MicroStep>, PackingError> {
    let mut totals: Vec<(u32, u64, usize)> = Vec::new(); // (execution, tokens, first row)
    for (r, row) in rows.iter().enumerate() {
        match totals.iter_mut().find(|t| t.0 == row.execution) {
            Some(t) => t.1 += row.len() as u64,
            None => totals.push((row.execution, row.len() as u64, r)),
        }
    }
    let fits = |e: u32| totals.iter().any(|t| t.0 == e && t.1 <= u64::from(budget));
    // Executions too large for one micro-step: their rows, cut.
    let lengths: Vec<u64> = rows
        .iter()
        .map(|r| if fits(r.execution) { 0 } else { r.len() as u64 })
        .collect();
    let mut steps = pack_lengths(&lengths, budget)?;
    let mut whole: Vec<&(u32, u64, usize)> =
        totals.iter().filter(|t| t.1 > 0 && fits(t.0)).collect();
    whole.sort_by_key(|t| (std::cmp::Reverse(t.1), t.2));
    for &(exec, total, _) in whole {
        let total = total as u32; // fits the budget
        let chunks = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.execution == exec && !r.is_empty())
            .map(|(r, row)| RowChunk {
                row: r as u32,
                start: 0,
                end: row.len() as u32,
            });
        let at = match steps.iter().position(|s| s.tokens + total <= budget) {
            Some(i) => i,
            None => {
                steps.push(MicroStep::default());
                steps.len() - 1
            }
        };
        steps[at].chunks.extend(chunks);
        steps[at].tokens += total;
    }
    Ok(steps)
}

/// For each micro-step, the chunks in other micro-steps of the executions
/// it shares with them ([`MicroStepRows::stats_chunks`]).
pub fn stats_chunks(rows: &[TokenRow], steps: &[MicroStep]) -> Vec<Vec<RowChunk>> {
    let exec_of = |c: &RowChunk| rows.get(c.row as usize).map(|r| r.execution);
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let mine: Vec<u32> = step.chunks.iter().filter_map(exec_of).collect();
            steps
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .flat_map(|(_, other)| other.chunks.iter())
                .filter(|c| exec_of(c).is_some_and(|e| mine.contains(&e)))
                .copied()
                .collect()
        })
        .collect()
}

/// Target tokens of some chunks, flattened for [`super::objective`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlatTargets {
    pub execution: Vec<u32>,
    pub behaviour_logprobs: Vec<f32>,
    pub coefficients: Vec<f32>,
    /// (row, position) of each target.
    pub at: Vec<(u32, u32)>,
}

impl FlatTargets {
    pub fn view(&self) -> TargetTokens<'_> {
        TargetTokens {
            execution: &self.execution,
            behaviour_logprobs: &self.behaviour_logprobs,
            coefficients: &self.coefficients,
        }
    }
}

/// Collects the targets inside `chunks`, in order.
pub fn flatten_targets<'a>(
    rows: &[TokenRow],
    chunks: impl IntoIterator<Item = &'a RowChunk>,
) -> FlatTargets {
    let mut out = FlatTargets::default();
    for ch in chunks {
        let row = &rows[ch.row as usize];
        for u in ch.start..ch.end {
            let i = u as usize;
            if row.target[i] {
                out.execution.push(row.execution);
                out.behaviour_logprobs.push(row.behaviour_logprobs[i]);
                out.coefficients.push(row.coefficients[i]);
                out.at.push((ch.row, u));
            }
        }
    }
    out
}

/// Every row whole, as chunks: the unsplit reference for comparisons.
pub fn whole_rows(rows: &[TokenRow]) -> Vec<RowChunk> {
    rows.iter()
        .enumerate()
        .map(|(r, row)| RowChunk {
            row: r as u32,
            start: 0,
            end: row.len() as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize) -> TokenRow {
        TokenRow {
            execution: 0,
            leaf: NodeId(1),
            input_ids: vec![1; len],
            target: vec![true; len],
            behaviour_logprobs: vec![-1.0; len],
            coefficients: vec![0.5; len],
            advantage: 1.0,
        }
    }

    #[test]
    fn long_rows_split_in_order_and_short_ones_fill_gaps() {
        let rows = vec![row(25), row(3), row(7), row(10)];
        let steps = pack(&rows, 10).unwrap();
        assert!(steps.iter().all(|s| s.tokens <= 10));
        let total: u32 = steps.iter().map(|s| s.tokens).sum();
        assert_eq!(total, 45);
        // 45 tokens fit in 5 steps of 10.
        assert_eq!(steps.len(), 5);
        let where_is = |r: u32, start: u32| {
            steps
                .iter()
                .position(|s| s.chunks.iter().any(|c| c.row == r && c.start == start))
                .unwrap()
        };
        assert!(where_is(0, 0) < where_is(0, 10));
        assert!(where_is(0, 10) < where_is(0, 20));
        assert_eq!(pack(&rows, 0), Err(PackingError::ZeroBudget));
    }

    #[test]
    fn extracted_rows_hold_the_same_tokens_as_the_group() {
        let mut rows = vec![row(25), row(3), row(7), row(10)];
        for (i, r) in rows.iter_mut().enumerate() {
            r.execution = i as u32;
        }
        let steps = pack(&rows, 10).unwrap();
        for s in &steps {
            let m = MicroStepRows::extract(&rows, &s.chunks, &[]).unwrap();
            assert_eq!(m.chunks.len(), s.chunks.len());
            // Each touched row appears once, and only touched rows appear.
            let mut touched: Vec<u32> = s.chunks.iter().map(|c| c.row).collect();
            touched.sort_unstable();
            touched.dedup();
            assert_eq!(m.rows.len(), touched.len());
            assert_eq!(
                flatten_targets(&m.rows, &m.chunks).view().coefficients,
                flatten_targets(&rows, &s.chunks).view().coefficients
            );
            for (a, b) in m.chunks.iter().zip(&s.chunks) {
                assert_eq!((a.start, a.end), (b.start, b.end));
                assert_eq!(m.rows[a.row as usize], rows[b.row as usize]);
            }
        }
        let bad = [RowChunk {
            row: 9,
            start: 0,
            end: 1,
        }];
        assert_eq!(MicroStepRows::extract(&rows, &bad, &[]), None);
        assert_eq!(MicroStepRows::extract(&rows, &[], &bad), None);
    }

    #[test]
    fn executions_that_fit_stay_whole_and_split_ones_name_their_other_chunks() {
        let execs = [0, 0, 1, 1, 2, 2, 3];
        let mut rows = vec![row(4), row(5), row(6), row(3), row(14), row(2), row(1)];
        for (r, e) in rows.iter_mut().zip(execs) {
            r.execution = e;
        }
        let steps = pack_by_execution(&rows, 10).unwrap();
        assert!(steps.iter().all(|s| s.tokens <= 10), "{steps:?}");
        let total: u32 = steps.iter().map(|s| s.tokens).sum();
        assert_eq!(total, 35);
        let steps_of = |e: u32| -> Vec<usize> {
            let mut v: Vec<usize> = (0..steps.len())
                .filter(|&i| {
                    steps[i]
                        .chunks
                        .iter()
                        .any(|c| rows[c.row as usize].execution == e)
                })
                .collect();
            v.dedup();
            v
        };
        for e in [0, 1, 3] {
            assert_eq!(steps_of(e).len(), 1, "execution {e} fits: one micro-step");
        }
        assert!(steps_of(2).len() > 1, "16 tokens cannot fit 10");
        let stats = stats_chunks(&rows, &steps);
        for (i, s) in steps.iter().enumerate() {
            let here_2 = s.chunks.iter().any(|c| c.row == 4 || c.row == 5);
            for c in &stats[i] {
                assert_eq!(rows[c.row as usize].execution, 2, "only the split one");
                assert!(!s.chunks.contains(c), "chunks elsewhere only");
            }
            if here_2 {
                let n2: usize = steps
                    .iter()
                    .flat_map(|t| &t.chunks)
                    .filter(|c| c.row == 4 || c.row == 5)
                    .count();
                let mine = s.chunks.iter().filter(|c| c.row == 4 || c.row == 5).count();
                assert_eq!(stats[i].len(), n2 - mine, "every other chunk of it");
            } else {
                assert!(stats[i].is_empty());
            }
        }
    }

    #[test]
    fn lengths_pack_exactly_like_rows() {
        let rows = vec![row(25), row(0), row(3), row(7), row(10)];
        let lengths: Vec<u64> = rows.iter().map(|r| r.len() as u64).collect();
        assert_eq!(
            pack(&rows, 10).unwrap(),
            pack_lengths(&lengths, 10).unwrap()
        );
        assert!(matches!(
            pack_lengths(&[1, u64::from(u32::MAX) + 1], 10),
            Err(PackingError::RowTooLong { row: 1, .. })
        ));
    }
}
