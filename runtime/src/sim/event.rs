//! The simulator's agenda: events totally ordered by (time, sequence).
//!
//! A sequence number is handed out when an event is scheduled, so two events
//! due at the same nanosecond run in the order they were scheduled, and a
//! run is one total order that a seed reproduces. The binary heap holds only
//! small keys (time, sequence, slot); the events wait in a slab whose slots
//! are reused, so a heap operation moves 24 bytes instead of a whole event.
//! Messages stay boxed and are never encoded here.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::hosted::{BoxMsg, ErasedIo};
use crate::id::{ActorId, NodeId};
use crate::time::Nanos;

use super::faults::FaultAction;

/// The incarnation of an actor: bumped by every crash, so that timers, I/O
/// completions and starts of an older incarnation are recognised as stale.
pub(crate) type Incarnation = u32;

pub(crate) enum EventKind {
    Start {
        id: ActorId,
        inc: Incarnation,
    },
    Deliver {
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    },
    Timer {
        id: ActorId,
        inc: Incarnation,
        token: u64,
    },
    Io {
        id: ActorId,
        inc: Incarnation,
        op: Box<dyn ErasedIo>,
        fail: bool,
    },
    PeerDown {
        id: ActorId,
        node: NodeId,
    },
    Fault(FaultAction),
}

pub(crate) struct Event {
    pub(crate) at: Nanos,
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
}

/// Where an event waits, in (time, sequence) order.
#[derive(PartialEq, Eq)]
struct Key {
    at: Nanos,
    seq: u64,
    slot: u32,
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    /// Reversed, so that std's max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
pub(crate) struct Agenda {
    heap: BinaryHeap<Key>,
    slab: Vec<Option<EventKind>>,
    free: Vec<u32>,
    next_seq: u64,
}

impl Agenda {
    pub(crate) fn push(&mut self, at: Nanos, kind: EventKind) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slab[slot as usize] = Some(kind);
                slot
            }
            None => {
                self.slab.push(Some(kind));
                (self.slab.len() - 1) as u32
            }
        };
        self.heap.push(Key { at, seq, slot });
    }

    pub(crate) fn pop(&mut self) -> Option<Event> {
        let Key { at, seq, slot } = self.heap.pop()?;
        let kind = self.slab.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(Event { at, seq, kind })
    }

    pub(crate) fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|e| e.at)
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(local: u64) -> EventKind {
        EventKind::Start {
            id: ActorId::new(0, local),
            inc: 0,
        }
    }

    #[test]
    fn pops_by_time_then_by_schedule_order() {
        let mut a = Agenda::default();
        a.push(5, start(1));
        a.push(3, start(2));
        a.push(5, start(3));
        a.push(3, start(4));
        let order: Vec<(Nanos, u64)> = std::iter::from_fn(|| a.pop())
            .map(|e| match e.kind {
                EventKind::Start { id, .. } => (e.at, id.local),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![(3, 2), (3, 4), (5, 1), (5, 3)]);
    }

    #[test]
    fn reused_slots_keep_the_order() {
        let mut a = Agenda::default();
        let mut popped = Vec::new();
        for round in 0..50u64 {
            // Three in, two out: slots freed by pops are taken again.
            a.push(round * 7 % 11, start(round * 3));
            a.push(round * 5 % 13, start(round * 3 + 1));
            a.push(round, start(round * 3 + 2));
            for _ in 0..2 {
                let e = a.pop().unwrap();
                popped.push((e.at, e.seq));
            }
        }
        while let Some(e) = a.pop() {
            popped.push((e.at, e.seq));
        }
        assert_eq!(popped.len(), 150);
        assert_eq!(a.len(), 0);
        assert!(a.slab.len() < 60, "slots are reused: {}", a.slab.len());
        // Each pop is the least (time, sequence) of what was waiting, so
        // pops of events that waited together come out sorted.
        let mut sorted = popped[100..].to_vec();
        sorted.sort();
        assert_eq!(&popped[100..], &sorted[..]);
    }
}
