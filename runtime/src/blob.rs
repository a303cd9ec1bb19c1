//! Payload handles: how large data (prompts, TITO records, token rows,
//! weights, KV blocks) moves between actors without riding in messages.
//!
//! A message carries a [`BlobId`]; the bytes sit in a [`BlobStore`], which is
//! registered memory as the transfer engine sees it: in one process a shared
//! map ([`MemBlobs`]), across processes a segment another party reads
//! one-sidedly. Ids come from a counter, so a deterministic sequence of puts
//! (the simulator's) hands out the same ids on every run. `BlobId::NONE`
//! means "no payload": the simulator, which keeps counts only, sends it
//! everywhere.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{Bincode, Codec, CodecError};

/// A handle to bytes in a [`BlobStore`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct BlobId(pub u64);

impl BlobId {
    /// No payload.
    pub const NONE: BlobId = BlobId(0);

    pub fn is_none(self) -> bool {
        self == Self::NONE
    }

    pub fn is_some(self) -> bool {
        !self.is_none()
    }
}

impl std::fmt::Display for BlobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "blob#{}", self.0)
    }
}

/// Registered memory that actors exchange handles to.
pub trait BlobStore: Send + Sync + Debug {
    /// Stores `bytes`; never returns [`BlobId::NONE`].
    fn put(&self, bytes: Vec<u8>) -> BlobId;
    fn get(&self, id: BlobId) -> Option<Arc<[u8]>>;
    /// Frees the blob; false if it did not exist.
    fn release(&self, id: BlobId) -> bool;
    /// Blobs held now (leak checks).
    fn live(&self) -> usize;
    /// Bytes held now.
    fn bytes(&self) -> u64;
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    blobs: BTreeMap<u64, Arc<[u8]>>,
    bytes: u64,
}

/// The in-process store.
#[derive(Debug, Default)]
pub struct MemBlobs {
    inner: Mutex<Inner>,
}

impl MemBlobs {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn shared() -> Arc<MemBlobs> {
        Arc::new(Self::new())
    }

    /// A panic elsewhere while holding the lock leaves the map consistent
    /// (every mutation is a single insert or remove), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BlobStore for MemBlobs {
    fn put(&self, bytes: Vec<u8>) -> BlobId {
        let mut g = self.lock();
        g.next += 1;
        let id = g.next;
        g.bytes += bytes.len() as u64;
        g.blobs.insert(id, Arc::from(bytes));
        BlobId(id)
    }

    fn get(&self, id: BlobId) -> Option<Arc<[u8]>> {
        self.lock().blobs.get(&id.0).cloned()
    }

    fn release(&self, id: BlobId) -> bool {
        let mut g = self.lock();
        match g.blobs.remove(&id.0) {
            Some(b) => {
                g.bytes -= b.len() as u64;
                true
            }
            None => false,
        }
    }

    fn live(&self) -> usize {
        self.lock().blobs.len()
    }

    fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}

/// Why a payload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("{0} is not in the store (released, or never written)")]
    Missing(BlobId),
    #[error("{id} does not decode: {source}")]
    Decode {
        id: BlobId,
        #[source]
        source: CodecError,
    },
}

/// Encodes `value` with the wire codec and stores it.
pub fn put_encoded<T: Serialize>(store: &dyn BlobStore, value: &T) -> Result<BlobId, CodecError> {
    Ok(store.put(Bincode::encode(value)?))
}

/// Reads and decodes a blob written by [`put_encoded`].
pub fn get_decoded<T: DeserializeOwned>(store: &dyn BlobStore, id: BlobId) -> Result<T, BlobError> {
    let bytes = store.get(id).ok_or(BlobError::Missing(id))?;
    Bincode::decode(&bytes).map_err(|source| BlobError::Decode { id, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_deterministic_and_never_none() {
        let a = MemBlobs::new();
        let b = MemBlobs::new();
        let ia: Vec<_> = (0..5).map(|i| a.put(vec![i; 3])).collect();
        let ib: Vec<_> = (0..5).map(|i| b.put(vec![i; 3])).collect();
        assert_eq!(ia, ib);
        assert!(ia.iter().all(|i| i.is_some()));
        let mut sorted = ia.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 5);
    }

    #[test]
    fn release_frees_and_accounts() {
        let s = MemBlobs::new();
        let x = s.put(vec![1; 10]);
        let y = s.put(vec![2; 6]);
        assert_eq!((s.live(), s.bytes()), (2, 16));
        assert!(s.release(x));
        assert!(!s.release(x));
        assert!(s.get(x).is_none());
        assert_eq!(s.get(y).as_deref(), Some(&[2u8; 6][..]));
        assert_eq!((s.live(), s.bytes()), (1, 6));
    }

    #[test]
    fn encoded_roundtrip_and_errors_name_the_blob() {
        let s = MemBlobs::new();
        let id = put_encoded(&s, &vec![3u32, 4, 5]).unwrap();
        let back: Vec<u32> = get_decoded(&s, id).unwrap();
        assert_eq!(back, vec![3, 4, 5]);
        let garbage = s.put(vec![0xff; 3]);
        let err = get_decoded::<Vec<u32>>(&s, garbage).unwrap_err();
        assert!(matches!(err, BlobError::Decode { id, .. } if id == garbage));
        assert!(err.to_string().contains("blob#"));
        let gone = BlobId(999);
        assert!(matches!(
            get_decoded::<Vec<u32>>(&s, gone),
            Err(BlobError::Missing(i)) if i == gone
        ));
    }
}
