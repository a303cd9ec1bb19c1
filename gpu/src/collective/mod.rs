//! Collectives over the training prefix: the reduction of gradients to the
//! core and the broadcast of new parameters to satellites (SPEC 2.6).
//!
//! K ordered cells build K−1 groups up front, one per prefix {0..1} …
//! {0..K−1}; a step uses the group of its current prefix, so membership
//! changes never rebuild a communicator. [`host`] implements the
//! collectives in memory for CPU runs (cells as threads of one process);
//! `nccl` (feature `cuda`) does the same on GPUs.

pub mod host;
#[cfg(feature = "cuda")]
pub mod nccl;
mod prefix;

pub use host::{HostComm, HostGroup};
pub use prefix::PrefixGroups;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    #[error("rank {rank} brought {got} floats, the collective has {expected}")]
    Length {
        rank: usize,
        expected: usize,
        got: usize,
    },
    #[error("root {root} is not a member of a group of {size}")]
    BadRoot { root: usize, size: usize },
    #[error("collective timed out after {0:?}: a member never arrived")]
    Timeout(std::time::Duration),
    #[error("the collective failed on another rank: {0}")]
    Poisoned(String),
    #[error("no group for a prefix of {members} cells (groups cover 2..={max})")]
    NoGroup { members: usize, max: usize },
    #[error("cell {cell} is not in a prefix of {members}")]
    NotMember { cell: usize, members: usize },
    #[error("NCCL: {0}")]
    Nccl(String),
}

/// One member's handle on a group.
pub trait Collective {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every member ends with the element-wise sum of all members' buffers.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError>;
    /// Every member ends with the root's buffer.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError>;
}
