//! Device memory by role: one region per [`Tag`], released and restored
//! as a cell changes role, with an accounting report (bytes per tag, peak).
//!
//! Releasing a region frees its device buffer; its contents either go to a
//! host backup (restored bit-exact later, like SGLang's memory saver with
//! CPU backup) or are discarded (a KV cache, whose contents are rebuilt).
//! An optional capacity makes a restore that does not fit fail with a clear
//! error instead of oversubscribing the device: the cell answers `Refused`.

mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
mod report;
mod tag;

use std::collections::BTreeMap;

pub use backend::{Backend, HostBackend};
pub use report::{MemoryReport, TagUsage};
pub use tag::{Role, Tag};

/// What a release does with the contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Copy to host first; restore brings the same bits back.
    Backup,
    /// Drop; restore gives zeros.
    Discard,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("no region tagged {0}")]
    NoRegion(Tag),
    #[error("a region tagged {0} already exists")]
    Exists(Tag),
    #[error("region {0} is released; restore it first")]
    Released(Tag),
    #[error("region {0} is already resident")]
    Resident(Tag),
    #[error(
        "out of device memory: {tag} needs {requested} bytes, {free} of {capacity} free (release the other role first)"
    )]
    OutOfMemory {
        tag: Tag,
        requested: u64,
        free: u64,
        capacity: u64,
    },
    #[error("copy of {len} floats at offset {offset} overruns a buffer of {buf_len}")]
    OutOfRange {
        offset: usize,
        len: usize,
        buf_len: usize,
    },
    #[error("no CUDA driver on this machine: {0}")]
    NoDriver(String),
    #[error("device backend: {0}")]
    Backend(String),
}

enum State<B> {
    Resident(B),
    Released(Option<Vec<f32>>),
}

struct Region<B> {
    len: usize,
    state: State<B>,
    peak: u64,
    releases: u64,
}

/// Regions by tag on one backend.
pub struct DeviceMemory<B: Backend> {
    backend: B,
    regions: BTreeMap<Tag, Region<B::Buf>>,
    capacity: Option<u64>,
    peak: u64,
}

fn bytes(len: usize) -> u64 {
    len as u64 * 4
}

impl<B: Backend> DeviceMemory<B> {
    pub fn new(backend: B) -> Self {
        DeviceMemory {
            backend,
            regions: BTreeMap::new(),
            capacity: None,
            peak: 0,
        }
    }

    /// Caps resident bytes (all tags together).
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Bytes resident on the device now.
    pub fn resident_bytes(&self) -> u64 {
        self.regions
            .values()
            .filter(|r| matches!(r.state, State::Resident(_)))
            .map(|r| bytes(r.len))
            .sum()
    }

    fn reserve(&self, tag: Tag, len: usize) -> Result<(), MemoryError> {
        if let Some(capacity) = self.capacity {
            let used = self.resident_bytes();
            if used + bytes(len) > capacity {
                return Err(MemoryError::OutOfMemory {
                    tag,
                    requested: bytes(len),
                    free: capacity.saturating_sub(used),
                    capacity,
                });
            }
        }
        Ok(())
    }

    fn note_peak(&mut self, tag: Tag) {
        let now = self.resident_bytes();
        self.peak = self.peak.max(now);
        if let Some(r) = self.regions.get_mut(&tag) {
            r.peak = r.peak.max(bytes(r.len));
        }
    }

    /// A new zeroed region of `len` floats.
    pub fn allocate(&mut self, tag: Tag, len: usize) -> Result<(), MemoryError> {
        if self.regions.contains_key(&tag) {
            return Err(MemoryError::Exists(tag));
        }
        self.reserve(tag, len)?;
        let buf = self.backend.alloc(len)?;
        self.regions.insert(
            tag,
            Region {
                len,
                state: State::Resident(buf),
                peak: 0,
                releases: 0,
            },
        );
        self.note_peak(tag);
        tracing::debug!(%tag, bytes = bytes(len), backend = self.backend.name(), "allocated");
        Ok(())
    }

    /// Frees a region for good (no backup, no restore).
    pub fn free(&mut self, tag: Tag) -> Result<(), MemoryError> {
        self.regions
            .remove(&tag)
            .map(|_| ())
            .ok_or(MemoryError::NoRegion(tag))
    }

    pub fn contains(&self, tag: Tag) -> bool {
        self.regions.contains_key(&tag)
    }

    pub fn is_resident(&self, tag: Tag) -> bool {
        matches!(
            self.regions.get(&tag).map(|r| &r.state),
            Some(State::Resident(_))
        )
    }

    /// Length in floats of a region, resident or not.
    pub fn len(&self, tag: Tag) -> Result<usize, MemoryError> {
        self.regions
            .get(&tag)
            .map(|r| r.len)
            .ok_or(MemoryError::NoRegion(tag))
    }

    fn buf_mut(&mut self, tag: Tag) -> Result<(&mut B, &mut B::Buf), MemoryError> {
        match self.regions.get_mut(&tag) {
            None => Err(MemoryError::NoRegion(tag)),
            Some(Region {
                state: State::Resident(b),
                ..
            }) => Ok((&mut self.backend, b)),
            Some(_) => Err(MemoryError::Released(tag)),
        }
    }

    pub fn write(&mut self, tag: Tag, offset: usize, src: &[f32]) -> Result<(), MemoryError> {
        let (be, buf) = self.buf_mut(tag)?;
        be.write(buf, offset, src)
    }

    pub fn read(&mut self, tag: Tag, offset: usize, dst: &mut [f32]) -> Result<(), MemoryError> {
        let (be, buf) = self.buf_mut(tag)?;
        be.read(buf, offset, dst)
    }

    /// The whole region copied to the host.
    pub fn read_all(&mut self, tag: Tag) -> Result<Vec<f32>, MemoryError> {
        let mut out = vec![0.0; self.len(tag)?];
        self.read(tag, 0, &mut out)?;
        Ok(out)
    }

    /// Frees the region's device buffer; returns the bytes freed.
    pub fn release(&mut self, tag: Tag, keep: Keep) -> Result<u64, MemoryError> {
        let region = self
            .regions
            .get_mut(&tag)
            .ok_or(MemoryError::NoRegion(tag))?;
        let State::Resident(buf) = &region.state else {
            return Err(MemoryError::Released(tag));
        };
        let backup = match keep {
            Keep::Backup => {
                let mut host = vec![0.0; region.len];
                self.backend.read(buf, 0, &mut host)?;
                Some(host)
            }
            Keep::Discard => None,
        };
        region.state = State::Released(backup);
        region.releases += 1;
        tracing::debug!(%tag, bytes = bytes(region.len), ?keep, "released");
        Ok(bytes(region.len))
    }

    /// Allocates the region again and copies its backup back (zeros if it
    /// was discarded).
    pub fn restore(&mut self, tag: Tag) -> Result<(), MemoryError> {
        let region = self.regions.get(&tag).ok_or(MemoryError::NoRegion(tag))?;
        if matches!(region.state, State::Resident(_)) {
            return Err(MemoryError::Resident(tag));
        }
        let len = region.len;
        self.reserve(tag, len)?;
        let mut buf = self.backend.alloc(len)?;
        let region = self
            .regions
            .get_mut(&tag)
            .ok_or(MemoryError::NoRegion(tag))?;
        if let State::Released(Some(host)) = &region.state {
            self.backend.write(&mut buf, 0, host)?;
        }
        region.state = State::Resident(buf);
        self.note_peak(tag);
        tracing::debug!(%tag, bytes = bytes(len), "restored");
        Ok(())
    }

    /// Releases every resident region of a role; returns the bytes freed.
    pub fn release_role(
        &mut self,
        role: Role,
        keep: impl Fn(Tag) -> Keep,
    ) -> Result<u64, MemoryError> {
        let mut freed = 0;
        for &tag in role.tags() {
            if self.is_resident(tag) {
                freed += self.release(tag, keep(tag))?;
            }
        }
        Ok(freed)
    }

    /// Restores every released region of a role.
    pub fn restore_role(&mut self, role: Role) -> Result<(), MemoryError> {
        for &tag in role.tags() {
            if self.contains(tag) && !self.is_resident(tag) {
                self.restore(tag)?;
            }
        }
        Ok(())
    }

    /// Bytes per tag (resident, released, backed up), peaks, capacity.
    pub fn report(&self) -> MemoryReport {
        let tags = self
            .regions
            .iter()
            .map(|(&tag, r)| {
                let (resident, backup) = match &r.state {
                    State::Resident(_) => (bytes(r.len), 0),
                    State::Released(b) => (0, b.as_ref().map_or(0, |b| bytes(b.len()))),
                };
                TagUsage {
                    tag,
                    bytes: bytes(r.len),
                    resident,
                    host_backup: backup,
                    peak: r.peak,
                    releases: r.releases,
                }
            })
            .collect();
        MemoryReport {
            backend: self.backend.name(),
            tags,
            resident: self.resident_bytes(),
            peak: self.peak,
            capacity: self.capacity,
        }
    }
}

impl DeviceMemory<HostBackend> {
    /// Direct access to a resident host region: the embedded engine reads
    /// and writes its KV blocks in place.
    pub fn host(&self, tag: Tag) -> Result<&[f32], MemoryError> {
        match self.regions.get(&tag) {
            None => Err(MemoryError::NoRegion(tag)),
            Some(Region {
                state: State::Resident(b),
                ..
            }) => Ok(b),
            Some(_) => Err(MemoryError::Released(tag)),
        }
    }

    pub fn host_mut(&mut self, tag: Tag) -> Result<&mut [f32], MemoryError> {
        self.buf_mut(tag).map(|(_, b)| b.as_mut_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_and_restore_keep_or_drop_contents() {
        let mut m = DeviceMemory::new(HostBackend);
        m.allocate(Tag::RolloutWeights, 4).unwrap();
        m.allocate(Tag::KvCache, 8).unwrap();
        m.write(Tag::RolloutWeights, 1, &[1.0, 2.0]).unwrap();
        m.write(Tag::KvCache, 0, &[5.0]).unwrap();
        assert_eq!(m.resident_bytes(), 48);
        assert_eq!(m.release(Tag::RolloutWeights, Keep::Backup).unwrap(), 16);
        assert_eq!(m.release(Tag::KvCache, Keep::Discard).unwrap(), 32);
        assert_eq!(m.resident_bytes(), 0);
        assert!(matches!(
            m.write(Tag::KvCache, 0, &[1.0]),
            Err(MemoryError::Released(Tag::KvCache))
        ));
        let r = m.report();
        assert_eq!(r.peak, 48);
        assert_eq!(r.usage(Tag::RolloutWeights).unwrap().host_backup, 16);
        m.restore_role(Role::Rollout).unwrap();
        assert_eq!(
            m.read_all(Tag::RolloutWeights).unwrap(),
            vec![0.0, 1.0, 2.0, 0.0]
        );
        assert_eq!(m.read_all(Tag::KvCache).unwrap(), vec![0.0; 8]);
        assert!(matches!(
            m.restore(Tag::KvCache),
            Err(MemoryError::Resident(_))
        ));
        assert!(matches!(
            m.write(Tag::KvCache, 7, &[1.0, 2.0]),
            Err(MemoryError::OutOfRange { .. })
        ));
    }

    #[test]
    fn capacity_refuses_the_second_role_until_the_first_is_released() {
        let mut m = DeviceMemory::new(HostBackend).with_capacity(100);
        m.allocate(Tag::RolloutWeights, 20).unwrap();
        assert!(matches!(
            m.allocate(Tag::TrainParams, 10),
            Err(MemoryError::OutOfMemory { free: 20, .. })
        ));
        m.release_role(Role::Rollout, |_| Keep::Backup).unwrap();
        m.allocate(Tag::TrainParams, 10).unwrap();
        m.allocate(Tag::Gradients, 10).unwrap();
        assert!(matches!(
            m.restore(Tag::RolloutWeights),
            Err(MemoryError::OutOfMemory { .. })
        ));
        m.release_role(Role::Training, |_| Keep::Discard).unwrap();
        m.restore_role(Role::Rollout).unwrap();
        let r = m.report();
        assert_eq!(r.resident, 80);
        assert_eq!(r.peak, 80);
        assert_eq!(r.usage(Tag::Gradients).unwrap().resident, 0);
        assert_eq!(r.usage(Tag::RolloutWeights).unwrap().releases, 1);
    }
}
