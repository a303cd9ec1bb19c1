//! The simulator's agenda: events totally ordered by (time, sequence).
//!
//! A sequence number is handed out when an event is scheduled, so two events
//! due at the same nanosecond run in the order they were scheduled, and a
//! run is one total order that a seed reproduces. Events are small structs
//! in a binary heap; messages stay boxed and are never encoded here.

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

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that std's max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
pub(crate) struct Agenda {
    heap: BinaryHeap<Event>,
    next_seq: u64,
}

impl Agenda {
    pub(crate) fn push(&mut self, at: Nanos, kind: EventKind) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Event { at, seq, kind });
    }

    pub(crate) fn pop(&mut self) -> Option<Event> {
        self.heap.pop()
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
}
