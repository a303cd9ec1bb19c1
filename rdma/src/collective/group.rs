//! A collective's participants: rank `i` is reached through `peers[i]`
//! (`None` at this node's own rank). The K−1 training prefixes are groups
//! of the first k participants of one list.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::engine::TransferEngine;
use crate::error::{RequestError, TransferError};
use crate::notify::Notification;
use crate::request::{PeerId, SegmentRef};

/// How long a collective waits for a peer's signal before giving up.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// While waiting for a rank's signal, how often the rank is probed: a lost
/// one fails the wait within about this long, not after [`STEP_TIMEOUT`].
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// A segment name no member registers: describing it answers "unknown"
/// from a live peer and fails from a lost one.
const PROBE: &str = "gyre.collective.probe";

#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("group `{tag}`: waited {waited:?} for {what}")]
    Timeout {
        tag: String,
        what: String,
        waited: Duration,
    },
    #[error("group `{tag}`: {len} values exceed the {max} the group was built for")]
    TooLong { tag: String, len: usize, max: usize },
    #[error("group `{tag}`: rank {rank} is not inside a group of {size}")]
    NotMember {
        tag: String,
        rank: usize,
        size: usize,
    },
    #[error("group `{tag}`: peer for rank {rank} is missing")]
    MissingPeer { tag: String, rank: usize },
    #[error("group `{tag}`: rank {rank} was lost while waiting for {what}: {error}")]
    PeerLost {
        tag: String,
        rank: usize,
        what: String,
        error: String,
    },
    #[error("group `{tag}`: malformed signal on `{topic}` ({len} bytes)")]
    BadSignal {
        tag: String,
        topic: String,
        len: usize,
    },
}

/// The members of one collective, seen from one of them.
#[derive(Clone)]
pub struct Group {
    pub engine: TransferEngine,
    pub rank: usize,
    pub peers: Vec<Option<PeerId>>,
    /// Distinguishes this group's segments and topics on shared engines.
    pub tag: String,
}

impl Group {
    pub fn new(
        engine: TransferEngine,
        rank: usize,
        peers: Vec<Option<PeerId>>,
        tag: &str,
    ) -> Result<Self, CollectiveError> {
        let group = Self {
            engine,
            rank,
            peers,
            tag: tag.to_string(),
        };
        if rank >= group.size() {
            return Err(group.not_member(rank));
        }
        for r in (0..group.size()).filter(|&r| r != rank) {
            group.peer(r)?;
        }
        Ok(group)
    }

    pub fn size(&self) -> usize {
        self.peers.len()
    }

    /// The group of the first `k` members, under its own tag; `None` when this
    /// node is not among them.
    pub fn prefix(&self, k: usize) -> Option<Self> {
        (self.rank < k && k <= self.size()).then(|| Self {
            engine: self.engine.clone(),
            rank: self.rank,
            peers: self.peers[..k].to_vec(),
            tag: format!("{}/prefix{k}", self.tag),
        })
    }

    fn not_member(&self, rank: usize) -> CollectiveError {
        CollectiveError::NotMember {
            tag: self.tag.clone(),
            rank,
            size: self.size(),
        }
    }

    pub(crate) fn peer(&self, rank: usize) -> Result<PeerId, CollectiveError> {
        self.peers
            .get(rank)
            .copied()
            .flatten()
            .ok_or_else(|| CollectiveError::MissingPeer {
                tag: self.tag.clone(),
                rank,
            })
    }

    pub(crate) fn topic(&self, what: &str) -> String {
        format!("{}/{what}", self.tag)
    }

    /// Opens a peer's segment, waiting for the peer to register it (members
    /// start at different times).
    pub(crate) fn open_when_ready(
        &self,
        rank: usize,
        name: &str,
    ) -> Result<SegmentRef, CollectiveError> {
        let peer = self.peer(rank)?;
        let start = Instant::now();
        loop {
            match self.engine.open_segment(peer, name) {
                Ok(r) => return Ok(r),
                Err(TransferError::Request(RequestError::UnknownSegment { .. }))
                    if start.elapsed() < STEP_TIMEOUT =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits for a notification that `rank` sends, failing as soon as
    /// `rank` is found lost (probed every [`PROBE_EVERY`]).
    pub(crate) fn recv_from(
        &self,
        notes: &Receiver<Notification>,
        rank: usize,
        what: impl Fn() -> String,
    ) -> Result<Notification, CollectiveError> {
        self.recv_watching(notes, &[rank], what)
    }

    /// Waits for a notification from any member, failing as soon as one of
    /// them is found lost: a root waiting for its members does not know
    /// which one is missing.
    pub(crate) fn recv_probing(
        &self,
        notes: &Receiver<Notification>,
        what: impl Fn() -> String,
    ) -> Result<Notification, CollectiveError> {
        let others: Vec<usize> = (0..self.size()).filter(|&r| r != self.rank).collect();
        self.recv_watching(notes, &others, what)
    }

    /// Waits for a notification, probing `ranks` every [`PROBE_EVERY`] and
    /// failing as soon as one is lost, or after [`STEP_TIMEOUT`].
    fn recv_watching(
        &self,
        notes: &Receiver<Notification>,
        ranks: &[usize],
        what: impl Fn() -> String,
    ) -> Result<Notification, CollectiveError> {
        let start = Instant::now();
        loop {
            match notes.recv_timeout(PROBE_EVERY) {
                Ok(note) => return Ok(note),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CollectiveError::Timeout {
                        tag: self.tag.clone(),
                        what: format!("{} (subscription closed)", what()),
                        waited: start.elapsed(),
                    });
                }
                Err(RecvTimeoutError::Timeout) if start.elapsed() >= STEP_TIMEOUT => {
                    return Err(CollectiveError::Timeout {
                        tag: self.tag.clone(),
                        what: what(),
                        waited: STEP_TIMEOUT,
                    });
                }
                Err(RecvTimeoutError::Timeout) => {
                    for &rank in ranks {
                        self.probe(rank, &what)?;
                    }
                }
            }
        }
    }

    /// Fails if `rank` cannot be reached any more.
    fn probe(&self, rank: usize, what: &impl Fn() -> String) -> Result<(), CollectiveError> {
        let peer = self.peer(rank)?;
        match self.engine.open_segment(peer, PROBE) {
            Ok(_) | Err(TransferError::Request(RequestError::UnknownSegment { .. })) => Ok(()),
            Err(e) => Err(CollectiveError::PeerLost {
                tag: self.tag.clone(),
                rank,
                what: what(),
                error: e.to_string(),
            }),
        }
    }

    pub(crate) fn recv(
        &self,
        notes: &Receiver<Notification>,
        what: impl FnOnce() -> String,
    ) -> Result<Notification, CollectiveError> {
        notes
            .recv_timeout(STEP_TIMEOUT)
            .map_err(|e| CollectiveError::Timeout {
                tag: self.tag.clone(),
                what: match e {
                    RecvTimeoutError::Timeout => what(),
                    RecvTimeoutError::Disconnected => format!("{} (subscription closed)", what()),
                },
                waited: STEP_TIMEOUT,
            })
    }
}

/// Packs the (call, step) signal a collective sends after a write.
pub(crate) fn signal(call: u64, step: u64) -> bytes::Bytes {
    let mut b = call.to_le_bytes().to_vec();
    b.extend_from_slice(&step.to_le_bytes());
    b.into()
}

pub(crate) fn parse_signal(
    group: &Group,
    topic: &str,
    note: &Notification,
) -> Result<(u64, u64), CollectiveError> {
    let p = &note.payload;
    if p.len() != 16 {
        return Err(CollectiveError::BadSignal {
            tag: group.tag.clone(),
            topic: topic.to_string(),
            len: p.len(),
        });
    }
    let word = |at: usize| u64::from_le_bytes(p[at..at + 8].try_into().unwrap_or_default());
    Ok((word(0), word(8)))
}
