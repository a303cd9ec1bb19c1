//! The paged KV cache: fixed-size blocks of token slots in one region,
//! reference-counted so a pin (KV migration, SPEC 2.5 step 4) keeps blocks
//! alive after their request is cancelled, and snapshots that carry a
//! prefix's keys and values to another engine instance.

use std::collections::BTreeSet;

use crate::error::ModelError;
use crate::model::forward::{KvStore, Segment};

/// Where a (block, layer, key-or-value, slot) row lives in the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub layers: usize,
    pub width: usize,
    pub block_size: usize,
}

impl KvGeometry {
    pub fn block_floats(&self) -> usize {
        self.layers * 2 * self.block_size * self.width
    }

    /// First float of `slot` of `block` for `layer`, keys (`kv` = 0) or
    /// values (1).
    pub fn offset(&self, block: u32, layer: usize, kv: usize, slot: usize) -> usize {
        (((block as usize * self.layers + layer) * 2 + kv) * self.block_size + slot) * self.width
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Copies rows `from..from+n` of a sequence between the paged region
    /// and a dense buffer.
    fn rows(&self, blocks: &[u32], r: Rows, mut f: impl FnMut(usize, usize, usize)) {
        let mut pos = r.from;
        while pos < r.from + r.n {
            let slot = pos % self.block_size;
            let run = (self.block_size - slot).min(r.from + r.n - pos);
            let at = self.offset(blocks[pos / self.block_size], r.layer, r.kv, slot);
            f(at, (pos - r.from) * self.width, run * self.width);
            pos += run;
        }
    }

    pub fn read_rows(&self, region: &[f32], blocks: &[u32], r: Rows, out: &mut [f32]) {
        self.rows(blocks, r, |at, o, len| {
            out[o..o + len].copy_from_slice(&region[at..at + len]);
        });
    }

    pub fn write_rows(&self, region: &mut [f32], blocks: &[u32], r: Rows, src: &[f32]) {
        self.rows(blocks, r, |at, o, len| {
            region[at..at + len].copy_from_slice(&src[o..o + len]);
        });
    }
}

/// Rows `from..from+n` of one layer's keys (`kv` = 0) or values (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    pub layer: usize,
    pub kv: usize,
    pub from: usize,
    pub n: usize,
}

impl Rows {
    pub fn new(layer: usize, kv: usize, from: usize, n: usize) -> Self {
        Rows { layer, kv, from, n }
    }
}

/// Free list and reference counts of the blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    free: BTreeSet<u32>,
    refs: Vec<u32>,
}

impl BlockPool {
    pub fn new(blocks: usize) -> Self {
        BlockPool {
            free: (0..blocks as u32).collect(),
            refs: vec![0; blocks],
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// `n` blocks (lowest ids first), or `None` if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.free.len() < n {
            return None;
        }
        let out: Vec<u32> = self.free.iter().take(n).copied().collect();
        for &b in &out {
            self.free.remove(&b);
            self.refs[b as usize] = 1;
        }
        Some(out)
    }

    /// One more holder of each block.
    pub fn retain(&mut self, blocks: &[u32]) {
        for &b in blocks {
            self.refs[b as usize] += 1;
        }
    }

    /// One holder fewer; blocks nobody holds go back to the free list.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks {
            let r = &mut self.refs[b as usize];
            *r = r.saturating_sub(1);
            if *r == 0 {
                self.free.insert(b);
            }
        }
    }

    /// Blocks held by more than one owner (a sequence and a pin, or pins).
    pub fn shared(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 1).count()
    }
}

/// The paged region seen by one forward pass: segment `i` uses
/// `blocks[i]`, with its new rows going to positions `past..past+len`.
pub struct PagedKv<'a> {
    pub geo: KvGeometry,
    pub region: &'a mut [f32],
    pub blocks: Vec<Vec<u32>>,
    pub segs: &'a [Segment],
}

impl KvStore for PagedKv<'_> {
    fn load(&self, seg_ix: usize, layer: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let s = self.segs[seg_ix];
        let mut k = vec![0.0; s.past * self.geo.width];
        let mut v = vec![0.0; s.past * self.geo.width];
        let b = &self.blocks[seg_ix];
        self.geo
            .read_rows(self.region, b, Rows::new(layer, 0, 0, s.past), &mut k);
        self.geo
            .read_rows(self.region, b, Rows::new(layer, 1, 0, s.past), &mut v);
        Ok((k, v))
    }

    fn store(
        &mut self,
        seg_ix: usize,
        layer: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ModelError> {
        let s = self.segs[seg_ix];
        let b = &self.blocks[seg_ix];
        if self.geo.blocks_for(s.past + s.len) > b.len() {
            return Err(ModelError::Config(
                "KV write past a sequence's blocks".into(),
            ));
        }
        self.geo
            .write_rows(self.region, b, Rows::new(layer, 0, s.past, s.len), k);
        self.geo
            .write_rows(self.region, b, Rows::new(layer, 1, s.past, s.len), v);
        Ok(())
    }

    fn rows_in_place(
        &self,
        seg_ix: usize,
        layer: usize,
        kv: usize,
        n: usize,
    ) -> Option<Vec<&[f32]>> {
        let b = self.blocks.get(seg_ix)?;
        if self.geo.blocks_for(n) > b.len() {
            return None;
        }
        let mut runs = Vec::with_capacity(self.geo.blocks_for(n));
        self.geo.rows(b, Rows::new(layer, kv, 0, n), |at, _, len| {
            runs.push(&self.region[at..at + len]);
        });
        Some(runs)
    }
}

const MAGIC: &[u8; 8] = b"GYREKV01";

/// A prefix's keys and values, independent of block size: `data` is
/// `[layer][key, value][token][width]`. Valid only for the model (layout
/// fingerprint) and weight version that computed it.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSnapshot {
    pub fingerprint: u64,
    pub version: u64,
    pub layers: usize,
    pub width: usize,
    pub tokens: Vec<u32>,
    pub data: Vec<f32>,
}

impl KvSnapshot {
    pub fn row_offset(&self, layer: usize, kv: usize) -> usize {
        (layer * 2 + kv) * self.tokens.len() * self.width
    }

    /// The keys and values of the first `n` tokens only (all of them when
    /// `n` is larger): a later request that shares just that much of the
    /// prompt can still reuse them, where the whole snapshot would not fit
    /// its prompt. Fails when `data` does not match the shape it claims.
    pub fn prefix(&self, n: usize) -> Result<KvSnapshot, ModelError> {
        let old = self.tokens.len();
        let n = n.min(old);
        let rows = self.layers * 2;
        if self.data.len() != rows * old * self.width {
            return Err(ModelError::Bytes(format!(
                "KV snapshot: {} floats for {rows} rows of {old} tokens of width {}",
                self.data.len(),
                self.width
            )));
        }
        let mut data = Vec::with_capacity(rows * n * self.width);
        for row in 0..rows {
            let at = row * old * self.width;
            data.extend_from_slice(&self.data[at..at + n * self.width]);
        }
        Ok(KvSnapshot {
            fingerprint: self.fingerprint,
            version: self.version,
            layers: self.layers,
            width: self.width,
            tokens: self.tokens[..n].to_vec(),
            data,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + self.tokens.len() * 4 + self.data.len() * 4);
        out.extend_from_slice(MAGIC);
        for w in [
            self.fingerprint,
            self.version,
            self.layers as u64,
            self.width as u64,
            self.tokens.len() as u64,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for x in &self.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ModelError> {
        let bad = |m: &str| ModelError::Bytes(format!("KV snapshot: {m}"));
        if bytes.len() < 48 || &bytes[..8] != MAGIC {
            return Err(bad("missing GYREKV01 header"));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let (fingerprint, version) = (word(0), word(1));
        let (layers, width, n) = (word(2) as usize, word(3) as usize, word(4) as usize);
        let floats = layers
            .checked_mul(2)
            .and_then(|x| x.checked_mul(n))
            .and_then(|x| x.checked_mul(width))
            .ok_or_else(|| bad("sizes overflow"))?;
        let need = n
            .checked_mul(4)
            .and_then(|t| floats.checked_mul(4).and_then(|f| f.checked_add(t)))
            .and_then(|x| x.checked_add(48))
            .ok_or_else(|| bad("sizes overflow"))?;
        if bytes.len() != need {
            return Err(bad(&format!("{} bytes, header needs {need}", bytes.len())));
        }
        let body = &bytes[48..];
        let le = |c: &[u8]| [c[0], c[1], c[2], c[3]];
        let tokens = body[..n * 4]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(le(c)))
            .collect();
        let data = body[n * 4..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(le(c)))
            .collect();
        Ok(KvSnapshot {
            fingerprint,
            version,
            layers,
            width,
            tokens,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_counts_references() {
        let mut p = BlockPool::new(4);
        let a = p.allocate(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(p.allocate(2).is_none());
        p.retain(&a[..1]);
        assert_eq!(p.shared(), 1);
        p.release(&a);
        assert_eq!(p.free_count(), 3);
        p.release(&a[..1]);
        assert_eq!(p.free_count(), 4);
    }

    #[test]
    fn rows_cross_block_boundaries() {
        let geo = KvGeometry {
            layers: 2,
            width: 3,
            block_size: 2,
        };
        let mut region = vec![0.0; 4 * geo.block_floats()];
        let blocks = [3, 1, 2];
        let src: Vec<f32> = (0..15).map(|x| x as f32).collect();
        geo.write_rows(&mut region, &blocks, Rows::new(1, 1, 0, 5), &src);
        let mut out = vec![0.0; 9];
        geo.read_rows(&region, &blocks, Rows::new(1, 1, 2, 3), &mut out);
        assert_eq!(out, src[6..15].to_vec());
        // Keys of layer 1 untouched.
        let mut keys = vec![9.0; 15];
        geo.read_rows(&region, &blocks, Rows::new(1, 0, 0, 5), &mut keys);
        assert!(keys.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn prefix_keeps_each_rows_first_tokens() {
        // 2 layers, width 2, 3 tokens: rows [l0 k, l0 v, l1 k, l1 v].
        let s = KvSnapshot {
            fingerprint: 7,
            version: 3,
            layers: 2,
            width: 2,
            tokens: vec![10, 11, 12],
            data: (0..24).map(|x| x as f32).collect(),
        };
        let p = s.prefix(2).unwrap();
        assert_eq!(p.tokens, vec![10, 11]);
        assert_eq!(
            p.data,
            vec![
                0., 1., 2., 3., 6., 7., 8., 9., 12., 13., 14., 15., 18., 19., 20., 21.
            ]
        );
        assert_eq!((p.fingerprint, p.version, p.layers, p.width), (7, 3, 2, 2));
        // Every row of the prefix is where row_offset says it is.
        for layer in 0..2 {
            for kv in 0..2 {
                let (a, b) = (p.row_offset(layer, kv), s.row_offset(layer, kv));
                assert_eq!(p.data[a..a + 4], s.data[b..b + 4]);
            }
        }
        assert_eq!(s.prefix(9).unwrap(), s);
        assert!(s.prefix(0).unwrap().data.is_empty());
        let bad = KvSnapshot {
            data: vec![0.0; 5],
            ..s
        };
        assert!(bad.prefix(1).is_err());
    }

    #[test]
    fn snapshot_bytes_round_trip() {
        let s = KvSnapshot {
            fingerprint: 1,
            version: 2,
            layers: 1,
            width: 2,
            tokens: vec![5, 6],
            data: (0..8).map(|x| x as f32).collect(),
        };
        let b = s.encode();
        assert_eq!(KvSnapshot::decode(&b).unwrap(), s);
        assert!(KvSnapshot::decode(&b[..b.len() - 4]).is_err());
        assert!(KvSnapshot::decode(b"GYREKV01").is_err());
    }
}
