//! NCCL communicators for the training prefixes (feature `cuda`), behind
//! the same [`Collective`] trait as the host implementation. Host buffers
//! are staged through the device; [`NcclComm::all_reduce_device`] reduces a
//! buffer that already lives there.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::{Collective, CollectiveError};

/// Whether libnccl can be loaded here (cudarc panics on first use when it
/// cannot).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the library and drops it.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn err(e: impl std::fmt::Debug) -> CollectiveError {
    CollectiveError::Nccl(format!("{e:?}"))
}

fn check_present() -> Result<(), CollectiveError> {
    if !crate::memory::cuda::driver_present() {
        return Err(CollectiveError::Nccl(
            "no CUDA driver on this machine".into(),
        ));
    }
    if !nccl_present() {
        return Err(CollectiveError::Nccl("libnccl could not be loaded".into()));
    }
    Ok(())
}

/// A unique id for one communicator; rank 0 creates it and sends it to the
/// other members out of band (as bytes).
pub fn new_id() -> Result<Vec<u8>, CollectiveError> {
    check_present()?;
    let id = Id::new().map_err(err)?;
    Ok(id.internal().iter().map(|&c| c as u8).collect())
}

/// One member of an NCCL group.
pub struct NcclComm {
    comm: Comm,
}

impl NcclComm {
    /// Joins a group of `size` (blocks until every member has joined).
    pub fn join(
        stream: Arc<CudaStream>,
        rank: usize,
        size: usize,
        id: &[u8],
    ) -> Result<Self, CollectiveError> {
        check_present()?;
        if rank >= size || i32::try_from(size).is_err() {
            return Err(CollectiveError::BadRoot { root: rank, size });
        }
        let mut raw = [0 as std::ffi::c_char; 128];
        if id.len() != raw.len() {
            return Err(CollectiveError::Nccl(format!(
                "an NCCL id has 128 bytes, got {}",
                id.len()
            )));
        }
        for (r, &b) in raw.iter_mut().zip(id) {
            *r = b as std::ffi::c_char;
        }
        let comm = Comm::from_rank(stream, rank, size, Id::uninit(raw)).map_err(err)?;
        Ok(NcclComm { comm })
    }

    /// One communicator per stream, all in this process (one per GPU).
    pub fn local(streams: Vec<Arc<CudaStream>>) -> Result<Vec<Self>, CollectiveError> {
        check_present()?;
        Ok(Comm::from_devices(streams)
            .map_err(err)?
            .into_iter()
            .map(|comm| NcclComm { comm })
            .collect())
    }

    /// Sums a device buffer across the group, in place.
    pub fn all_reduce_device(&self, buf: &mut CudaSlice<f32>) -> Result<(), CollectiveError> {
        self.comm
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map_err(err)?;
        self.comm.stream().synchronize().map_err(err)
    }

    fn staged(
        &self,
        buf: &mut [f32],
        f: impl FnOnce(&Comm, &mut CudaSlice<f32>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        if buf.is_empty() {
            return Ok(());
        }
        let stream = self.comm.stream();
        let mut dev = stream.clone_htod(&*buf).map_err(err)?;
        f(&self.comm, &mut dev)?;
        stream.memcpy_dtoh(&dev, buf).map_err(err)?;
        stream.synchronize().map_err(err)
    }
}

impl Collective for NcclComm {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.staged(buf, |c, d| {
            c.all_reduce_in_place(d, &ReduceOp::Sum)
                .map(|_| ())
                .map_err(err)
        })
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let size = self.size();
        if root >= size {
            return Err(CollectiveError::BadRoot { root, size });
        }
        self.staged(buf, |c, d| {
            c.broadcast_in_place(d, root as i32)
                .map(|_| ())
                .map_err(err)
        })
    }
}

/// Cell `cell`'s NCCL handles for every prefix {0..p−1} (p = 2..=`cells`)
/// that contains it. `ids[p]` is the id rank 0 made for prefix p. Every
/// cell joins in ascending prefix order, so the blocking joins cannot
/// deadlock.
pub fn prefix_groups(
    stream: Arc<CudaStream>,
    cell: usize,
    cells: usize,
    ids: &std::collections::BTreeMap<usize, Vec<u8>>,
) -> Result<super::PrefixGroups<NcclComm>, CollectiveError> {
    let mut groups = std::collections::BTreeMap::new();
    for p in (cell + 1).max(2)..=cells {
        let id = ids.get(&p).ok_or(CollectiveError::NoGroup {
            members: p,
            max: cells,
        })?;
        groups.insert(p, NcclComm::join(stream.clone(), cell, p, id)?);
    }
    Ok(super::PrefixGroups::from_groups(cell, cells, groups))
}
