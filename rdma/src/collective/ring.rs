//! Ring all-reduce: n−1 reduce-scatter steps then n−1 all-gather steps; at
//! each step a rank WRITEs one chunk into its right neighbour's inbox slot
//! for that step and notifies it, then waits for its left neighbour's chunk.
//!
//! Each fully reduced chunk is summed at one rank and copied to the others,
//! so every rank ends with bit-identical values. The summation order is
//! pinned: chunk `c` (of `len.div_ceil(n)` values) is summed
//! `((x_c + x_{c+1}) + x_{c+2}) + …` over ranks from `c` round the ring,
//! which [`ring_order_sum`] reproduces on one machine; for two ranks that
//! is the plain sum in rank order, bit for bit. Inbox slots are doubled by
//! call parity: a rank can run at most one call ahead of its neighbour (the
//! ring couples them), so consecutive calls never overwrite a slot still
//! being read.

use std::collections::HashSet;
use std::sync::mpsc::Receiver;

use bytes::Bytes;

use super::group::{CollectiveError, Group, parse_signal, signal};
use crate::notify::Notification;
use crate::request::{SegmentRef, TransferRequest};
use crate::segment::LocalSegment;

fn inbox_name(tag: &str) -> String {
    format!("{tag}/ring-inbox")
}

/// One rank's end of a ring all-reduce over a [`Group`].
pub struct RingAllReduce {
    group: Group,
    max_len: usize,
    inbox: LocalSegment,
    right_inbox: Option<SegmentRef>,
    notes: Receiver<Notification>,
    early: HashSet<(u64, u64)>,
    call: u64,
    written: u64,
}

impl RingAllReduce {
    /// Registers this rank's inbox for gradients of up to `max_len` values
    /// and opens the right neighbour's (waiting for it to exist).
    pub fn new(group: Group, max_len: usize) -> Result<Self, CollectiveError> {
        let n = group.size();
        let slot = max_len.div_ceil(n.max(1)) * 4;
        let slots = 2 * 2 * n.saturating_sub(1);
        let name = inbox_name(&group.tag);
        let notes = group.engine.subscribe(&group.topic("ring"));
        group.engine.register_zeroed(&name, slot * slots)?;
        let inbox = group.engine.local_segment(&name)?;
        let right_inbox = if n > 1 {
            Some(group.open_when_ready((group.rank + 1) % n, &name)?)
        } else {
            None
        };
        Ok(Self {
            group,
            max_len,
            inbox,
            right_inbox,
            notes,
            early: HashSet::new(),
            call: 0,
            written: 0,
        })
    }

    /// Ends this rank's part in the ring: its inbox is withdrawn, so a
    /// neighbour rebuilding the ring waits for the inbox of the new one
    /// instead of opening this one.
    pub fn withdraw(self) {
        self.group.engine.unregister(&inbox_name(&self.group.tag));
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Bytes this rank wrote into its neighbour's inbox over all calls.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Replaces `values` by the element-wise sum over all ranks.
    pub fn all_reduce(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let n = self.group.size();
        if values.len() > self.max_len {
            return Err(CollectiveError::TooLong {
                tag: self.group.tag.clone(),
                len: values.len(),
                max: self.max_len,
            });
        }
        let Some(right_inbox) = self.right_inbox.clone() else {
            return Ok(());
        };
        let right = self.group.peer((self.group.rank + 1) % n)?;
        let topic = self.group.topic("ring");
        let r = self.group.rank;
        let chunk = values.len().div_ceil(n);
        let slot_bytes = (self.max_len.div_ceil(n) * 4) as u64;
        let steps = 2 * (n - 1);
        let len = values.len();
        let range = move |c: usize| (c * chunk).min(len)..((c + 1) * chunk).min(len);
        let call = self.call;
        for s in 0..steps {
            let (send, recv) = if s < n - 1 {
                ((r + n - s) % n, (r + 2 * n - s - 1) % n)
            } else {
                let t = s - (n - 1);
                ((r + 1 + n - t) % n, (r + n - t) % n)
            };
            let slot = ((call % 2) as usize * steps + s) as u64 * slot_bytes;
            let out: Vec<u8> = values[range(send)]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            self.written += out.len() as u64;
            self.group.engine.transfer_then_notify(
                vec![TransferRequest::write(&right_inbox, slot, Bytes::from(out))],
                right,
                &topic,
                signal(call, s as u64),
            )?;
            self.wait_for(call, s as u64, &topic)?;

            let into = &mut values[range(recv)];
            let at = slot as usize;
            self.inbox.with_bytes(|inbox| {
                let got = inbox[at..at + into.len() * 4].chunks_exact(4);
                for (v, b) in into.iter_mut().zip(got) {
                    let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if s < n - 1 {
                        *v += x;
                    } else {
                        *v = x;
                    }
                }
            });
        }
        self.call += 1;
        Ok(())
    }

    fn wait_for(&mut self, call: u64, step: u64, topic: &str) -> Result<(), CollectiveError> {
        let n = self.group.size();
        let left = (self.group.rank + n - 1) % n;
        while !self.early.remove(&(call, step)) {
            let note = self.group.recv_from(&self.notes, left, || {
                format!("ring step {step} of call {call} from the left neighbour")
            })?;
            self.early.insert(parse_signal(&self.group, topic, &note)?);
        }
        Ok(())
    }
}

/// The ring's sum on one machine, in the ring's pinned order: chunk `c` of
/// `parts[0].len().div_ceil(n)` values starts with rank `c`'s values and
/// adds ranks `c+1, c+2, …` (mod n) in turn. What [`RingAllReduce`] leaves
/// on every rank, bit for bit; every part must have the same length.
pub fn ring_order_sum(parts: &[&[f32]]) -> Vec<f32> {
    let n = parts.len();
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    let len = first.len();
    let chunk = len.div_ceil(n).max(1);
    (0..len)
        .map(|i| {
            let c = i / chunk;
            let mut acc = parts[c % n][i];
            for k in 1..n {
                acc += parts[(c + k) % n][i];
            }
            acc
        })
        .collect()
}
