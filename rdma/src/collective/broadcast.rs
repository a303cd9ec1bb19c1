//! Parameter broadcast: the root registers the bytes as a frozen segment
//! (a new version per call, so a late reader of an older call is refused
//! rather than handed newer bytes), signals every member with the version
//! and length, and returns once each member has read it and signalled back.

use std::collections::HashSet;

use bytes::Bytes;

use super::group::{CollectiveError, Group, parse_signal, signal};
use crate::request::{SegmentRef, TransferRequest};

impl Group {
    fn bcast_segment(&self) -> String {
        format!("{}/broadcast", self.tag)
    }

    /// Sends `data` from `root` to every member; members pass `None` and get
    /// the root's bytes back. `call` numbers the broadcasts of this group.
    pub fn broadcast(
        &self,
        root: usize,
        call: u64,
        data: Option<Bytes>,
    ) -> Result<Bytes, CollectiveError> {
        self.broadcast_then(root, call, data, |_| ())
    }

    /// [`Self::broadcast`], where a member hands the bytes to `received`
    /// before telling the root it has them, so the root returns only once
    /// every member has put them where it needs them.
    pub fn broadcast_then(
        &self,
        root: usize,
        call: u64,
        data: Option<Bytes>,
        received: impl FnOnce(&Bytes),
    ) -> Result<Bytes, CollectiveError> {
        let (ready, read) = (self.topic("bcast-ready"), self.topic("bcast-read"));
        if root >= self.size() {
            return Err(CollectiveError::NotMember {
                tag: self.tag.clone(),
                rank: root,
                size: self.size(),
            });
        }
        if self.rank == root {
            let data = data.unwrap_or_default();
            let done = self.engine.subscribe(&read);
            let info = self
                .engine
                .register_frozen(&self.bcast_segment(), data.clone())?;
            for r in (0..self.size()).filter(|&r| r != root) {
                self.engine
                    .send_notification(self.peer(r)?, &ready, signal(call, info.version))?;
            }
            let mut readers = HashSet::new();
            while readers.len() + 1 < self.size() {
                let note =
                    self.recv_probing(&done, || format!("members to read broadcast {call}"))?;
                if parse_signal(self, &read, &note)?.0 == call {
                    readers.insert(note.from.clone());
                }
            }
            return Ok(data);
        }
        let notes = self.engine.subscribe(&ready);
        let version = loop {
            let note = self.recv(&notes, || format!("the root to announce broadcast {call}"))?;
            let (c, version) = parse_signal(self, &ready, &note)?;
            if c == call {
                break version;
            }
        };
        let root_peer = self.peer(root)?;
        let opened = self.engine.open_segment(root_peer, &self.bcast_segment())?;
        let target = SegmentRef { version, ..opened };
        let mut done = self
            .engine
            .transfer(vec![TransferRequest::read(&target, 0, target.len)]);
        let bytes = match done.pop() {
            Some(Ok(t)) => t.data.unwrap_or_default(),
            Some(Err(e)) => return Err(e.into()),
            None => Bytes::new(),
        };
        received(&bytes);
        self.engine
            .send_notification(root_peer, &read, signal(call, 0))?;
        Ok(bytes)
    }

    /// [`Self::broadcast`] of f32 parameters.
    pub fn broadcast_f32(
        &self,
        root: usize,
        call: u64,
        params: &mut Vec<f32>,
    ) -> Result<(), CollectiveError> {
        let data = (self.rank == root).then(|| {
            Bytes::from(
                params
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )
        });
        let bytes = self.broadcast(root, call, data)?;
        if self.rank != root {
            *params = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
        }
        Ok(())
    }
}
