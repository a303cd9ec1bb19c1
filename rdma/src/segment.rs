//! Registered memory: named, versioned segments that remote peers read and
//! write one-sidedly.
//!
//! Re-registering a name gives it a new version, so a peer still holding a
//! handle to the old memory (an older weight snapshot, a recycled KV block)
//! is refused instead of silently reading bytes that changed meaning. Frozen
//! segments are immutable `Bytes` and are read without copying; mutable
//! segments sit behind a lock so concurrent one-sided writes stay sound Rust.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;

use crate::error::{RequestError, TransferError};

/// The longest segment name accepted, so a frame header stays small.
pub const MAX_SEGMENT_NAME: usize = 256;

/// What a peer learns when it opens a segment by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub name: Arc<str>,
    pub version: u64,
    pub len: u64,
    pub writable: bool,
}

enum Memory {
    Frozen(Bytes),
    Mutable(RwLock<Box<[u8]>>),
}

/// One registration of a name: its bytes and the version it was given.
pub struct Segment {
    name: Arc<str>,
    version: u64,
    memory: Memory,
}

impl Segment {
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn len(&self) -> u64 {
        match &self.memory {
            Memory::Frozen(b) => b.len() as u64,
            Memory::Mutable(m) => read_lock(m).len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn info(&self) -> SegmentInfo {
        SegmentInfo {
            name: self.name.clone(),
            version: self.version,
            len: self.len(),
            writable: matches!(self.memory, Memory::Mutable(_)),
        }
    }

    /// The checks every remote request passes before touching memory.
    pub(crate) fn admit(
        &self,
        peer: &str,
        version: u64,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<(), RequestError> {
        if version != self.version {
            return Err(RequestError::StaleVersion {
                peer: peer.to_string(),
                name: self.name.to_string(),
                requested: version,
                current: self.version,
            });
        }
        let segment_len = self.len();
        if offset.checked_add(len).is_none_or(|end| end > segment_len) {
            return Err(RequestError::OutOfBounds {
                peer: peer.to_string(),
                name: self.name.to_string(),
                offset,
                len,
                segment_len,
            });
        }
        if write && matches!(self.memory, Memory::Frozen(_)) {
            return Err(RequestError::ReadOnly {
                peer: peer.to_string(),
                name: self.name.to_string(),
            });
        }
        Ok(())
    }

    /// The bytes of an admitted range: a zero-copy slice of frozen memory, a
    /// copy of mutable memory.
    pub(crate) fn read_bytes(&self, offset: u64, len: u64) -> Bytes {
        let (start, end) = (offset as usize, (offset + len) as usize);
        match &self.memory {
            Memory::Frozen(b) => b.slice(start..end),
            Memory::Mutable(m) => Bytes::copy_from_slice(&read_lock(m)[start..end]),
        }
    }

    /// Runs `f` over an admitted range without copying it out.
    pub(crate) fn with_range<R>(&self, offset: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R {
        let (start, end) = (offset as usize, (offset + len) as usize);
        match &self.memory {
            Memory::Frozen(b) => f(&b[start..end]),
            Memory::Mutable(m) => f(&read_lock(m)[start..end]),
        }
    }

    /// Runs `f` over an admitted range of mutable memory; `None` for frozen
    /// memory (admission refuses writes to it first).
    pub(crate) fn with_range_mut<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let (start, end) = (offset as usize, (offset + len) as usize);
        match &self.memory {
            Memory::Frozen(_) => None,
            Memory::Mutable(m) => Some(f(&mut write_lock(m)[start..end])),
        }
    }
}

fn read_lock(m: &RwLock<Box<[u8]>>) -> RwLockReadGuard<'_, Box<[u8]>> {
    // A writer that panicked left plain bytes behind; they are still bytes.
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock(m: &RwLock<Box<[u8]>>) -> RwLockWriteGuard<'_, Box<[u8]>> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// A node's own view of one of its segments, for reading and updating its
/// memory in place (a reducer adding into its gradient buffer).
#[derive(Clone)]
pub struct LocalSegment(pub(crate) Arc<Segment>);

impl LocalSegment {
    pub fn info(&self) -> SegmentInfo {
        self.0.info()
    }

    /// A copy (mutable) or zero-copy slice (frozen) of the whole segment.
    pub fn to_bytes(&self) -> Bytes {
        self.0.read_bytes(0, self.0.len())
    }

    /// Address, length and writability of the segment's memory, for pinning
    /// it with a NIC. The allocation never moves while the segment lives.
    #[cfg(feature = "rdma")]
    pub(crate) fn raw_parts(&self) -> (usize, usize, bool) {
        match &self.0.memory {
            Memory::Frozen(b) => (b.as_ptr() as usize, b.len(), false),
            Memory::Mutable(m) => {
                let guard = read_lock(m);
                (guard.as_ptr() as usize, guard.len(), true)
            }
        }
    }

    /// Runs `f` over the whole segment's bytes.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        self.0.with_range(0, self.0.len(), f)
    }

    /// Runs `f` over the whole segment's bytes mutably; a frozen segment is
    /// refused.
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, TransferError> {
        self.0.with_range_mut(0, self.0.len(), f).ok_or_else(|| {
            TransferError::Request(RequestError::ReadOnly {
                peer: "this node".into(),
                name: self.0.name.to_string(),
            })
        })
    }
}

#[derive(Default)]
struct Entry {
    last_version: u64,
    current: Option<Arc<Segment>>,
}

/// The segments a node has registered, looked up by name on every request.
#[derive(Default)]
pub(crate) struct SegmentTable {
    entries: RwLock<HashMap<Arc<str>, Entry>>,
}

impl SegmentTable {
    fn register(&self, name: &str, memory: Memory) -> Result<SegmentInfo, TransferError> {
        validate_name(name)?;
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let name: Arc<str> = name.into();
        let entry = entries.entry(name.clone()).or_default();
        entry.last_version += 1;
        let segment = Arc::new(Segment {
            name,
            version: entry.last_version,
            memory,
        });
        let info = segment.info();
        entry.current = Some(segment);
        Ok(info)
    }

    pub fn register_frozen(&self, name: &str, bytes: Bytes) -> Result<SegmentInfo, TransferError> {
        self.register(name, Memory::Frozen(bytes))
    }

    pub fn register_mutable(
        &self,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<SegmentInfo, TransferError> {
        self.register(name, Memory::Mutable(RwLock::new(bytes.into_boxed_slice())))
    }

    /// Drops the current registration; the name keeps its version counter so
    /// a later registration is still newer than every handle given out.
    pub fn unregister(&self, name: &str) -> bool {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        entries
            .get_mut(name)
            .and_then(|e| e.current.take())
            .is_some()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Segment>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries.get(name).and_then(|e| e.current.clone())
    }

    /// Finds a segment for a remote request, refusing unknown names clearly.
    pub fn lookup(&self, peer: &str, name: &str) -> Result<Arc<Segment>, RequestError> {
        self.get(name).ok_or_else(|| RequestError::UnknownSegment {
            peer: peer.to_string(),
            name: name.to_string(),
        })
    }
}

fn validate_name(name: &str) -> Result<(), TransferError> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > MAX_SEGMENT_NAME {
        "it is longer than 256 bytes"
    } else if name.chars().any(char::is_control) {
        "it contains control characters"
    } else {
        return Ok(());
    };
    Err(TransferError::InvalidSegmentName {
        name: name.chars().take(64).collect(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reregistering_bumps_the_version_and_refuses_the_old_one() {
        let table = SegmentTable::default();
        let v1 = table
            .register_frozen("w", Bytes::from_static(b"abcd"))
            .unwrap();
        let v2 = table.register_mutable("w", vec![0; 8]).unwrap();
        assert_eq!((v1.version, v2.version), (1, 2));
        let seg = table.lookup("me", "w").unwrap();
        let err = seg.admit("me", v1.version, 0, 4, false).unwrap_err();
        assert!(matches!(
            err,
            RequestError::StaleVersion {
                requested: 1,
                current: 2,
                ..
            }
        ));
        assert!(table.unregister("w"));
        let v3 = table.register_frozen("w", Bytes::new()).unwrap();
        assert_eq!(v3.version, 3);
    }

    #[test]
    fn admission_checks_bounds_without_overflow_and_refuses_frozen_writes() {
        let table = SegmentTable::default();
        let info = table
            .register_frozen("s", Bytes::from(vec![7u8; 16]))
            .unwrap();
        let seg = table.lookup("me", "s").unwrap();
        assert!(seg.admit("me", info.version, 0, 16, false).is_ok());
        assert!(seg.admit("me", info.version, 16, 0, false).is_ok());
        for (offset, len) in [(1, 16), (17, 0), (u64::MAX, 2)] {
            let err = seg
                .admit("me", info.version, offset, len, false)
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    RequestError::OutOfBounds {
                        segment_len: 16,
                        ..
                    }
                ),
                "{err}"
            );
        }
        let err = seg.admit("me", info.version, 0, 1, true).unwrap_err();
        assert!(matches!(err, RequestError::ReadOnly { .. }));
        assert!(table.lookup("me", "nope").is_err());
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        let table = SegmentTable::default();
        for name in ["", "a\nb", &"x".repeat(300)] {
            let err = table.register_frozen(name, Bytes::new()).unwrap_err();
            assert!(matches!(err, TransferError::InvalidSegmentName { .. }));
        }
    }
}
