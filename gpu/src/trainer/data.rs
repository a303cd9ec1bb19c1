//! Training input as the trainer receives it: token rows and micro-steps,
//! field for field the stream packer's (`TokenRow`, `RowChunk`,
//! `MicroStep` of the trajectory plane), kept here as plain structs because
//! this crate depends on nothing of ours but the runtime.
//!
//! Position `u` of a row holds token `u`; its target flag, behaviour
//! log-prob and coefficient are about predicting token `u` from tokens
//! `..u`. A chunk `start..end` trains the targets inside it, with the whole
//! row before `end` as context (recomputed here).

use serde::{Deserialize, Serialize};

use super::TrainerError;

/// One materialised trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainRow {
    /// Index of the execution in the batch.
    pub execution: u32,
    pub input_ids: Vec<u32>,
    pub target: Vec<bool>,
    /// Recorded behaviour log-probabilities (read on targets only).
    pub behaviour_logprobs: Vec<f32>,
    /// c_u = 1/(L_i·B·N) on targets.
    pub coefficients: Vec<f32>,
    /// Â_i of the row's execution.
    pub advantage: f32,
}

impl TrainRow {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

/// Tokens `start..end` of row `row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowChunk {
    pub row: u32,
    pub start: u32,
    pub end: u32,
}

/// One unit of training input, claimed atomically by one training cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroStep {
    pub chunks: Vec<RowChunk>,
}

impl MicroStep {
    /// Every row whole, in order.
    pub fn whole(rows: &[TrainRow]) -> Self {
        MicroStep {
            chunks: rows
                .iter()
                .enumerate()
                .map(|(r, row)| RowChunk {
                    row: r as u32,
                    start: 0,
                    end: row.len() as u32,
                })
                .collect(),
        }
    }

    pub fn tokens(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| u64::from(c.end.saturating_sub(c.start)))
            .sum()
    }
}

/// One target token of a micro-step, in the packer's flattening order
/// (chunks in order, positions ascending).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    /// Chunk index inside the micro-step.
    pub chunk: usize,
    pub position: usize,
    pub token: u32,
    pub execution: u32,
    pub behaviour_logprob: f32,
    pub coefficient: f32,
    pub advantage: f32,
}

/// Checks rows and chunks and lists the targets.
pub fn targets(
    rows: &[TrainRow],
    step: &MicroStep,
    vocab: usize,
    context: usize,
) -> Result<Vec<Target>, TrainerError> {
    let bad = |m: String| Err(TrainerError::BadInput(m));
    let mut out = Vec::new();
    for (ci, ch) in step.chunks.iter().enumerate() {
        let Some(row) = rows.get(ch.row as usize) else {
            return bad(format!(
                "chunk {ci} names row {}, there are {}",
                ch.row,
                rows.len()
            ));
        };
        let n = row.len();
        if row.target.len() != n || row.behaviour_logprobs.len() != n || row.coefficients.len() != n
        {
            return bad(format!("row {} has fields of different lengths", ch.row));
        }
        let (start, end) = (ch.start as usize, ch.end as usize);
        if start > end || end > n {
            return bad(format!(
                "chunk {ci} ({start}..{end}) is outside row {} of {n} tokens",
                ch.row
            ));
        }
        if end > context {
            return bad(format!(
                "chunk {ci} needs {end} tokens of context, the model has {context}"
            ));
        }
        if !row.advantage.is_finite() {
            return bad(format!("row {} has a non-finite advantage", ch.row));
        }
        if let Some(t) = row.input_ids[..end].iter().find(|t| **t as usize >= vocab) {
            return bad(format!(
                "row {} holds token {t}, outside the vocabulary of {vocab}",
                ch.row
            ));
        }
        for u in start..end {
            if !row.target[u] {
                continue;
            }
            if u == 0 {
                return bad(format!(
                    "row {} has a target at position 0, which has no context",
                    ch.row
                ));
            }
            let (b, c) = (row.behaviour_logprobs[u], row.coefficients[u]);
            if !b.is_finite() || !c.is_finite() {
                return bad(format!(
                    "row {} position {u}: non-finite log-prob or coefficient",
                    ch.row
                ));
            }
            out.push(Target {
                chunk: ci,
                position: u,
                token: row.input_ids[u],
                execution: row.execution,
                behaviour_logprob: b,
                coefficient: c,
                advantage: row.advantage,
            });
        }
    }
    Ok(out)
}
