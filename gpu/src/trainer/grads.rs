//! Gradients as a flat buffer in the parameter layout: what a cell exports
//! after its micro-steps and what the core reduces across the training
//! prefix. The coefficient contract puts 1/(B·N) on every token, so the sum
//! of the cells' buffers is the batch gradient, however the micro-steps
//! were shared out.

use super::TrainerError;
use crate::collective::{Collective, CollectiveError};

const MAGIC: &[u8; 8] = b"GYREGRD1";
const HEADER: usize = 56;

/// Accumulated gradients of one cell (or, after reduction, of several).
#[derive(Clone, Debug, PartialEq)]
pub struct GradBuffer {
    /// Policy version of the weights the gradients were taken at.
    pub version: u64,
    pub fingerprint: u64,
    /// Cells that contributed.
    pub cells: u64,
    pub micro_steps: u64,
    pub targets: u64,
    /// Σ of the contributing micro-steps' losses.
    pub loss: f64,
    pub data: Vec<f32>,
}

impl GradBuffer {
    /// Element-wise sum; every part must come from the same weights.
    pub fn sum(parts: &[GradBuffer]) -> Result<GradBuffer, TrainerError> {
        let Some(first) = parts.first() else {
            return Err(TrainerError::BadInput("no gradients to reduce".into()));
        };
        let mut out = GradBuffer {
            cells: 0,
            micro_steps: 0,
            targets: 0,
            loss: 0.0,
            data: vec![0.0; first.data.len()],
            ..first.clone()
        };
        for p in parts {
            out.add(p)?;
        }
        Ok(out)
    }

    /// Adds `other` into this buffer.
    pub fn add(&mut self, other: &GradBuffer) -> Result<(), TrainerError> {
        if other.fingerprint != self.fingerprint || other.data.len() != self.data.len() {
            return Err(TrainerError::BadInput(
                "gradients of a different model".into(),
            ));
        }
        if other.version != self.version {
            return Err(TrainerError::BadInput(format!(
                "gradients taken at v{} and v{}: weights must be fixed during accumulation",
                self.version, other.version
            )));
        }
        for (a, b) in self.data.iter_mut().zip(&other.data) {
            *a += b;
        }
        self.cells += other.cells;
        self.micro_steps += other.micro_steps;
        self.targets += other.targets;
        self.loss += other.loss;
        Ok(())
    }

    /// Sums this buffer across a group in place (every member ends with the
    /// reduced gradients and counts). The loss is reduced in f32: it is for
    /// monitoring only.
    pub fn all_reduce<C: Collective + ?Sized>(&mut self, comm: &C) -> Result<(), CollectiveError> {
        comm.all_reduce_sum(&mut self.data)?;
        let mut meta = [
            self.cells as f32,
            self.micro_steps as f32,
            self.targets as f32,
            self.loss as f32,
        ];
        comm.all_reduce_sum(&mut meta)?;
        self.cells = meta[0] as u64;
        self.micro_steps = meta[1] as u64;
        self.targets = meta[2] as u64;
        self.loss = f64::from(meta[3]);
        Ok(())
    }

    /// Euclidean norm, accumulated in f64.
    pub fn norm(&self) -> f64 {
        self.data
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 4 * self.data.len());
        out.extend_from_slice(MAGIC);
        for w in [
            self.version,
            self.fingerprint,
            self.cells,
            self.micro_steps,
            self.targets,
            self.loss.to_bits(),
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for x in &self.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<GradBuffer, TrainerError> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC || (bytes.len() - HEADER) % 4 != 0 {
            return Err(TrainerError::BadInput("malformed gradient bytes".into()));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        Ok(GradBuffer {
            version: word(0),
            fingerprint: word(1),
            cells: word(2),
            micro_steps: word(3),
            targets: word(4),
            loss: f64::from_bits(word(5)),
            data: bytes[HEADER..]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(v: u64, data: Vec<f32>) -> GradBuffer {
        GradBuffer {
            version: v,
            fingerprint: 1,
            cells: 1,
            micro_steps: 2,
            targets: 3,
            loss: 0.5,
            data,
        }
    }

    #[test]
    fn sums_check_versions_and_bytes_round_trip() {
        let s = GradBuffer::sum(&[g(1, vec![1.0, 2.0]), g(1, vec![3.0, -2.0])]).unwrap();
        assert_eq!(s.data, vec![4.0, 0.0]);
        assert_eq!((s.cells, s.micro_steps, s.targets), (2, 4, 6));
        assert!(GradBuffer::sum(&[g(1, vec![1.0]), g(2, vec![1.0])]).is_err());
        assert!(GradBuffer::sum(&[]).is_err());
        assert_eq!(GradBuffer::decode(&s.encode()).unwrap(), s);
        assert!(GradBuffer::decode(&s.encode()[1..]).is_err());
        assert!((s.norm() - 4.0).abs() < 1e-12);
    }
}
