//! RDMA verbs (feature `rdma`): device discovery, protection domain and
//! memory registration of segments through `sideway`.
//!
//! `sideway`'s `rdma-mummy-sys` loads libibverbs at run time, so this builds
//! and runs on machines without rdma-core or a NIC; there every entry point
//! answers [`TransferError::NoRdmaDevice`] with the reason. What exists here
//! is the registration half of a verbs backend (a segment's address, length
//! and rkey, what a peer needs for one-sided READ/WRITE); queue-pair setup
//! and posting work requests are not written yet, so the engine does not
//! route requests over verbs.

use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use crate::error::TransferError;
use crate::segment::LocalSegment;

fn no_device(detail: impl Into<String>) -> TransferError {
    TransferError::NoRdmaDevice {
        detail: detail.into(),
    }
}

/// Names of the RDMA devices libibverbs reports on this machine.
pub fn device_names() -> Result<Vec<String>, TransferError> {
    let list = DeviceList::new().map_err(|e| {
        no_device(format!(
            "libibverbs could not list devices ({e}); is rdma-core installed?"
        ))
    })?;
    Ok(list.iter().map(|d| d.name()).collect())
}

/// An opened device with one protection domain for all registrations.
pub struct RdmaDevice {
    name: String,
    _context: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
}

impl RdmaDevice {
    /// Opens the named device, or the first one.
    pub fn open(name: Option<&str>) -> Result<Self, TransferError> {
        let list = DeviceList::new().map_err(|e| {
            no_device(format!(
                "libibverbs could not list devices ({e}); is rdma-core installed?"
            ))
        })?;
        if list.is_empty() {
            return Err(no_device(
                "libibverbs reports no RDMA devices on this machine",
            ));
        }
        let device = match name {
            None => list.iter().next(),
            Some(want) => list.iter().find(|d| d.name() == want),
        }
        .ok_or_else(|| {
            let have: Vec<String> = list.iter().map(|d| d.name()).collect();
            no_device(format!("no device named {name:?}; found {have:?}"))
        })?;
        let name = device.name();
        let context = device
            .open()
            .map_err(|e| TransferError::Rdma(format!("opening {name}: {e}")))?;
        let pd = context.alloc_pd().map_err(|e| {
            TransferError::Rdma(format!("allocating a protection domain on {name}: {e}"))
        })?;
        Ok(Self {
            name,
            _context: context,
            pd,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pins a segment's memory for remote access; the registration keeps the
    /// segment's memory alive.
    pub fn register(&self, segment: &LocalSegment) -> Result<RdmaRegion, TransferError> {
        let (ptr, len, writable) = segment.raw_parts();
        let mut access = AccessFlags::LocalWrite | AccessFlags::RemoteRead;
        if writable {
            access |= AccessFlags::RemoteWrite;
        }
        // SAFETY: `ptr..ptr+len` is the segment's heap allocation, which never
        // moves or shrinks; `RdmaRegion` holds the segment, so the memory
        // outlives the registration.
        let mr = unsafe { self.pd.reg_mr(ptr, len, access) }.map_err(|e| {
            TransferError::Rdma(format!(
                "registering `{}` ({len} bytes): {e}",
                segment.info().name
            ))
        })?;
        Ok(RdmaRegion {
            mr,
            _segment: segment.clone(),
        })
    }
}

/// A registered segment: what a peer needs to address it one-sidedly.
pub struct RdmaRegion {
    mr: Arc<MemoryRegion>,
    _segment: LocalSegment,
}

impl RdmaRegion {
    pub fn addr(&self) -> u64 {
        self.mr.get_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.mr.region_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_reports_a_clear_error_without_a_device_and_registers_with_one() {
        match RdmaDevice::open(None) {
            Err(TransferError::NoRdmaDevice { detail }) => {
                eprintln!("no RDMA device: {detail}");
                assert!(!detail.is_empty());
                assert!(device_names().map(|d| d.is_empty()).unwrap_or(true));
            }
            Err(other) => panic!("expected NoRdmaDevice or a device, got {other}"),
            Ok(device) => {
                let engine = crate::TransferEngine::new("verbs-test");
                engine.register_zeroed("buf", 4096).unwrap();
                let seg = engine.local_segment("buf").unwrap();
                let region = device.register(&seg).unwrap();
                assert_eq!(region.len(), 4096);
            }
        }
        assert!(matches!(
            RdmaDevice::open(Some("no-such-device-xyz")),
            Err(TransferError::NoRdmaDevice { .. })
        ));
    }
}
