//! Durable checkpoints of the core: what a new core needs to continue the
//! model's history after the old one died.
//!
//! A checkpoint holds the parameters, the AdamW moments and step counter,
//! the training step the last update belonged to and the policy version
//! after it. It is written whole or not at all (a temporary file in the
//! same directory, fsync, rename over the old one, fsync of the directory),
//! so a crash mid-write leaves the previous checkpoint in place. The format
//! carries its own length and a SHA-256 of everything before the digest, so
//! a truncated, padded or corrupted file, or one of another model, is
//! refused on load with a message naming what is wrong, never half-loaded.
//!
//! Layout (little-endian): `GYRECKP1`, format version (u32), fingerprint,
//! step, version, Adam's t, parameter count n (u64 each), n parameters and
//! 2n moments (f32), then the 32-byte digest.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"GYRECKP1";
const FORMAT: u32 = 1;
const HEADER: usize = 8 + 4 + 5 * 8;
const DIGEST: usize = 32;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "checkpoint is {len} bytes, shorter than its {min}-byte header and digest (truncated?)"
    )]
    Truncated { len: usize, min: usize },
    #[error("not a Gyre core checkpoint (no GYRECKP1 header)")]
    Magic,
    #[error("checkpoint format {got}, this build reads format {FORMAT}")]
    Format { got: u32 },
    #[error("checkpoint announces {values} values ({expected} bytes in all), the file has {got}")]
    Length {
        values: u64,
        expected: u64,
        got: usize,
    },
    #[error("checkpoint digest does not match its contents (corrupted)")]
    Digest,
    #[error("checkpoint of another model: layout {got:#x}, this model is {expected:#x}")]
    Model { expected: u64, got: u64 },
    #[error("checkpoint value #{0} is not finite")]
    NotFinite(usize),
}

/// The core's state after one optimizer update.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreCheckpoint {
    /// The layout fingerprint of the model the parameters belong to.
    pub fingerprint: u64,
    /// The training step whose update produced `version`.
    pub step: u64,
    /// The policy version: updates made since the initial parameters.
    pub version: u64,
    /// AdamW's step counter (bias correction).
    pub adam_t: u64,
    pub params: Vec<f32>,
    /// m then v, each the length of `params`.
    pub moments: Vec<f32>,
}

impl CoreCheckpoint {
    pub fn encode(&self) -> Vec<u8> {
        let n = self.params.len();
        let mut out = Vec::with_capacity(HEADER + 12 * n + DIGEST);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        for w in [
            self.fingerprint,
            self.step,
            self.version,
            self.adam_t,
            n as u64,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for x in self.params.iter().chain(&self.moments) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        out
    }

    /// The version a checkpoint file holds, from its header alone (the
    /// file is replaced whole, never written in place; [`Self::load`]
    /// checks the rest). For waiting on a checkpoint without reading the
    /// model each time.
    pub fn peek_version(path: &Path) -> Result<u64, CheckpointError> {
        use std::io::Read;
        let io = |source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        };
        let mut head = [0u8; HEADER];
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut got = 0;
        while got < HEADER {
            match f.read(&mut head[got..]).map_err(io)? {
                0 => break,
                n => got += n,
            }
        }
        if got >= 8 && &head[..8] != MAGIC {
            return Err(CheckpointError::Magic);
        }
        if got < HEADER {
            return Err(CheckpointError::Truncated {
                len: got,
                min: HEADER + DIGEST,
            });
        }
        let format = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if format != FORMAT {
            return Err(CheckpointError::Format { got: format });
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[12 + 16..20 + 16]);
        Ok(u64::from_le_bytes(w))
    }

    /// Parses [`CoreCheckpoint::encode`]'s bytes, checking the header, the
    /// length, the digest and that every value is finite.
    pub fn decode(bytes: &[u8]) -> Result<Self, CheckpointError> {
        let min = HEADER + DIGEST;
        if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            return Err(CheckpointError::Magic);
        }
        if bytes.len() < min {
            return Err(CheckpointError::Truncated {
                len: bytes.len(),
                min,
            });
        }
        let format = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if format != FORMAT {
            return Err(CheckpointError::Format { got: format });
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[12 + 8 * i..20 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let (fingerprint, step, version, adam_t, n) = (word(0), word(1), word(2), word(3), word(4));
        let values = n.saturating_mul(3);
        let expected = values
            .saturating_mul(4)
            .saturating_add((HEADER + DIGEST) as u64);
        if u64::try_from(bytes.len()).ok() != Some(expected) {
            return Err(CheckpointError::Length {
                values,
                expected,
                got: bytes.len(),
            });
        }
        let (body, digest) = bytes.split_at(bytes.len() - DIGEST);
        if Sha256::digest(body).as_slice() != digest {
            return Err(CheckpointError::Digest);
        }
        let floats: Vec<f32> = body[HEADER..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = floats.iter().position(|x| !x.is_finite()) {
            return Err(CheckpointError::NotFinite(i));
        }
        let mut params = floats;
        let moments = params.split_off(n as usize);
        Ok(CoreCheckpoint {
            fingerprint,
            step,
            version,
            adam_t,
            params,
            moments,
        })
    }

    /// Refuses a checkpoint of another model.
    pub fn check_model(&self, fingerprint: u64) -> Result<(), CheckpointError> {
        if self.fingerprint != fingerprint {
            return Err(CheckpointError::Model {
                expected: fingerprint,
                got: self.fingerprint,
            });
        }
        Ok(())
    }

    /// Writes the checkpoint to `path` atomically; returns the bytes written.
    pub fn save(&self, path: &Path) -> Result<u64, CheckpointError> {
        let bytes = self.encode();
        write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::decode(&bytes)
    }
}

/// Replaces `path` with `bytes` so that a crash at any point leaves either
/// the old file or the new one: write a sibling temporary file, fsync it,
/// rename it over `path`, fsync the directory (the rename itself).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |p: &Path| {
        let p = p.to_owned();
        move |source| CheckpointError::Io { path: p, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    // The rename is durable once the directory is; some platforms cannot
    // open a directory, which leaves only the rename's own guarantee.
    if let Ok(d) = std::fs::File::open(&dir) {
        d.sync_all().map_err(io(&dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(n: usize) -> CoreCheckpoint {
        CoreCheckpoint {
            fingerprint: 0xfeed,
            step: 6,
            version: 7,
            adam_t: 7,
            params: (0..n).map(|i| i as f32 * 0.5).collect(),
            moments: (0..2 * n).map(|i| i as f32 * 1e-3).collect(),
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() -> Result<(), CheckpointError> {
        let c = sample(10);
        assert_eq!(CoreCheckpoint::decode(&c.encode())?, c);
        Ok(())
    }

    #[test]
    fn the_version_is_read_from_the_header_alone() {
        let dir = std::env::temp_dir().join(format!("gyre-peek-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("core.ckpt");
        let bytes = sample(10).encode();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(CoreCheckpoint::peek_version(&path).unwrap(), 7);
        std::fs::write(&path, &bytes[..HEADER - 1]).unwrap();
        assert!(matches!(
            CoreCheckpoint::peek_version(&path),
            Err(CheckpointError::Truncated { .. })
        ));
        std::fs::write(
            &path,
            b"not a checkpoint at all, but long enough to have a header",
        )
        .unwrap();
        assert!(matches!(
            CoreCheckpoint::peek_version(&path),
            Err(CheckpointError::Magic)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_kind_of_damage_is_refused_by_name() {
        let good = sample(10).encode();
        let cut = &good[..good.len() - 5];
        assert!(matches!(
            CoreCheckpoint::decode(cut),
            Err(CheckpointError::Length { .. })
        ));
        assert!(matches!(
            CoreCheckpoint::decode(&good[..20]),
            Err(CheckpointError::Truncated { .. })
        ));
        let mut flipped = good.clone();
        flipped[HEADER + 3] ^= 0x40;
        assert!(matches!(
            CoreCheckpoint::decode(&flipped),
            Err(CheckpointError::Digest)
        ));
        let mut foreign = good.clone();
        foreign[0] = b'X';
        assert!(matches!(
            CoreCheckpoint::decode(&foreign),
            Err(CheckpointError::Magic)
        ));
        let mut later = good.clone();
        later[8] = 9;
        assert!(matches!(
            CoreCheckpoint::decode(&later),
            Err(CheckpointError::Format { got: 9 })
        ));
        let mut padded = good;
        padded.push(0);
        assert!(matches!(
            CoreCheckpoint::decode(&padded),
            Err(CheckpointError::Length { .. })
        ));
        assert!(matches!(
            sample(1).check_model(1),
            Err(CheckpointError::Model { .. })
        ));
    }

    #[test]
    fn a_non_finite_value_is_refused_even_with_a_good_digest() {
        let mut c = sample(4);
        c.moments[3] = f32::NAN;
        let e = CoreCheckpoint::decode(&c.encode());
        assert!(matches!(e, Err(CheckpointError::NotFinite(7))), "{e:?}");
    }

    #[test]
    fn saving_replaces_the_old_file_and_leaves_no_temporary() -> Result<(), CheckpointError> {
        let dir = std::env::temp_dir().join(format!("gyre-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| CheckpointError::Io {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join("core.ckpt");
        sample(3).save(&path)?;
        let mut newer = sample(3);
        newer.version = 9;
        newer.adam_t = 9;
        newer.save(&path)?;
        assert_eq!(CoreCheckpoint::load(&path)?, newer);
        assert!(!dir.join("core.ckpt.tmp").exists());
        let missing = CoreCheckpoint::load(&dir.join("absent.ckpt"));
        assert!(matches!(missing, Err(CheckpointError::Io { .. })));
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    proptest! {
        #[test]
        fn any_cut_or_flipped_byte_is_refused(n in 1usize..20, at in 0usize..10_000, bit in 0u8..8) {
            let good = sample(n).encode();
            let at = at % good.len();
            prop_assert!(CoreCheckpoint::decode(&good[..at]).is_err());
            let mut bad = good.clone();
            bad[at] ^= 1 << bit;
            prop_assert!(CoreCheckpoint::decode(&bad).is_err());
        }
    }
}
