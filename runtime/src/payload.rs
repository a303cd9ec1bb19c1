//! Payload transfers as effects: how a handler reads or writes the bytes
//! behind a [`BlobId`] without touching a store.
//!
//! A handler never calls a [`BlobStore`]: it asks its host for a transfer
//! with `cx.io(PayloadRead::new(store, id), map)` (or [`PayloadWrite`],
//! [`PayloadRelease`]) and hears the result as one of its own messages, like
//! any other I/O. That keeps handlers free of shared memory and lets each
//! host give a transfer its cost: the simulator charges
//! [`crate::sim::PayloadCost`] (a latency plus bytes over a bandwidth; zero
//! by default, so runs that predate transfers keep their schedule), the live
//! host runs it on its I/O pool.
//!
//! The store is the plug for a transfer engine. [`BlobStore`] is the whole
//! interface a transfer needs — `put` (register bytes, get a handle), `get`
//! (a one-sided read of a handle), `release` — so an engine with named,
//! versioned segments and batched one-sided READ/WRITE (gyre-rdma) plugs in
//! as a `BlobStore` whose handles name its segments; the requests here and
//! the actors that issue them do not change.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::blob::{BlobId, BlobStore};
use crate::codec::{Bincode, Codec};
use crate::io::{IoError, IoRequest};

/// Reads the bytes behind `id` (and frees them when `consume` is set: the
/// reader is the payload's last user).
#[derive(Debug)]
pub struct PayloadRead {
    store: Arc<dyn BlobStore>,
    id: BlobId,
    consume: bool,
}

impl PayloadRead {
    pub fn new(store: Arc<dyn BlobStore>, id: BlobId) -> Self {
        Self {
            store,
            id,
            consume: false,
        }
    }

    /// Frees the payload once read, whether or not it decodes.
    pub fn consume(mut self) -> Self {
        self.consume = true;
        self
    }

    /// A read whose output is decoded as `T`.
    pub fn decoded<T>(self) -> Decoded<T> {
        Decoded {
            read: self,
            _t: std::marker::PhantomData,
        }
    }

    fn read(self) -> Result<Arc<[u8]>, IoError> {
        let got = self.store.get(self.id);
        if self.consume {
            self.store.release(self.id);
        }
        got.ok_or_else(|| {
            IoError::Failed(format!(
                "{} is not in the store (released, or never written)",
                self.id
            ))
        })
    }
}

impl IoRequest for PayloadRead {
    type Output = Arc<[u8]>;
    fn kind(&self) -> &'static str {
        "payload.read"
    }
    fn run(self) -> Result<Arc<[u8]>, IoError> {
        self.read()
    }
    fn payload_bytes(&self) -> Option<u64> {
        Some(self.store.get(self.id).map_or(0, |b| b.len() as u64))
    }
}

/// A [`PayloadRead`] decoded with the wire codec.
#[derive(Debug)]
pub struct Decoded<T> {
    read: PayloadRead,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned + Send + 'static> IoRequest for Decoded<T> {
    type Output = T;
    fn kind(&self) -> &'static str {
        self.read.kind()
    }
    fn run(self) -> Result<T, IoError> {
        let id = self.read.id;
        let bytes = self.read.read()?;
        Bincode::decode(&bytes).map_err(|e| IoError::Failed(format!("{id} does not decode: {e}")))
    }
    fn payload_bytes(&self) -> Option<u64> {
        self.read.payload_bytes()
    }
}

/// Writes bytes into the store; the output is their handle.
#[derive(Debug)]
pub struct PayloadWrite {
    store: Arc<dyn BlobStore>,
    bytes: Vec<u8>,
}

impl PayloadWrite {
    pub fn new(store: Arc<dyn BlobStore>, bytes: Vec<u8>) -> Self {
        Self { store, bytes }
    }

    /// `value` encoded with the wire codec. Encoding is done here, in the
    /// handler: it is a pure function of the value.
    pub fn encoded<T: Serialize>(
        store: Arc<dyn BlobStore>,
        value: &T,
    ) -> Result<Self, crate::codec::CodecError> {
        Ok(Self::new(store, Bincode::encode(value)?))
    }
}

impl IoRequest for PayloadWrite {
    type Output = BlobId;
    fn kind(&self) -> &'static str {
        "payload.write"
    }
    fn run(self) -> Result<BlobId, IoError> {
        Ok(self.store.put(self.bytes))
    }
    fn payload_bytes(&self) -> Option<u64> {
        Some(self.bytes.len() as u64)
    }
}

/// Frees a payload; the output says whether it existed.
#[derive(Debug)]
pub struct PayloadRelease {
    store: Arc<dyn BlobStore>,
    id: BlobId,
}

impl PayloadRelease {
    pub fn new(store: Arc<dyn BlobStore>, id: BlobId) -> Self {
        Self { store, id }
    }
}

impl IoRequest for PayloadRelease {
    type Output = bool;
    fn kind(&self) -> &'static str {
        "payload.release"
    }
    fn run(self) -> Result<bool, IoError> {
        Ok(self.store.release(self.id))
    }
    fn payload_bytes(&self) -> Option<u64> {
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::MemBlobs;

    #[test]
    fn write_read_consume() {
        let store = MemBlobs::shared();
        let w = PayloadWrite::encoded(store.clone(), &vec![1u32, 2, 3]).unwrap();
        assert_eq!(w.payload_bytes(), Some(8 + 12));
        let id = w.run().unwrap();
        let r = PayloadRead::new(store.clone(), id).decoded::<Vec<u32>>();
        assert_eq!(r.payload_bytes(), Some(20));
        assert_eq!(r.run().unwrap(), [1, 2, 3]);
        assert_eq!(store.live(), 1, "a plain read keeps the payload");
        let r = PayloadRead::new(store.clone(), id).consume();
        assert_eq!(r.run().unwrap().len(), 20);
        assert_eq!(store.live(), 0);
        let gone = PayloadRead::new(store.clone(), id).run().unwrap_err();
        assert!(gone.to_string().contains("not in the store"), "{gone}");
        assert!(!PayloadRelease::new(store, id).run().unwrap());
    }

    #[test]
    fn a_payload_that_does_not_decode_is_a_clear_failure() {
        let store = MemBlobs::shared();
        let id = store.put(vec![7; 3]);
        let err = PayloadRead::new(store.clone(), id)
            .consume()
            .decoded::<Vec<u64>>()
            .run()
            .unwrap_err();
        assert!(err.to_string().contains("does not decode"), "{err}");
        assert_eq!(store.live(), 0, "consumed even though unreadable");
    }
}
