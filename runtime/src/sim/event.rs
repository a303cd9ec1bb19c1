//! The simulator's agenda: events totally ordered by (time, sequence).
//!
//! A sequence number is handed out when an event is scheduled, so two events
//! due at the same nanosecond run in the order they were scheduled, and a
//! run is one total order that a seed reproduces. The queue (a radix heap,
//! see [`Radix`]) holds only small keys, (time, sequence) and a slot; the
//! events wait in a slab whose slots are reused, so queue operations never
//! move whole events. Messages stay boxed and are never encoded here.

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

impl Key {
    fn order(&self) -> u128 {
        (u128::from(self.at) << 64) | u128::from(self.seq)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    /// Reversed, so that std's max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.order().cmp(&self.order())
    }
}

/// A radix heap over the 128-bit (time, sequence) order: a key lives in the
/// bucket of the highest bit where it differs from the last minimum, so
/// finding the next minimum only ever moves keys to lower buckets and each
/// operation costs amortised O(1) instead of a binary heap's O(log n). It
/// needs keys no smaller than the last minimum, which holds for everything
/// the simulator schedules at or after `now`; the rare key below it (a
/// message injected from outside after stale timers were skipped past
/// `now`) waits in a small binary heap, so the order stays exact.
struct Radix {
    last: u128,
    buckets: Vec<Vec<(u128, u32)>>,
    /// Bit b set: bucket b holds keys.
    nonempty: [u64; 3],
    len: usize,
}

impl Default for Radix {
    fn default() -> Self {
        Self {
            last: 0,
            buckets: (0..=128).map(|_| Vec::new()).collect(),
            nonempty: [0; 3],
            len: 0,
        }
    }
}

impl Radix {
    fn bucket(&self, key: u128) -> usize {
        let x = key ^ self.last;
        if x == 0 {
            0
        } else {
            128 - x.leading_zeros() as usize
        }
    }

    fn put(&mut self, b: usize, key: u128, slot: u32) {
        self.buckets[b].push((key, slot));
        self.nonempty[b / 64] |= 1 << (b % 64);
    }

    fn push(&mut self, key: u128, slot: u32) {
        let b = self.bucket(key);
        self.put(b, key, slot);
        self.len += 1;
    }

    fn first_nonempty(&self) -> Option<usize> {
        self.nonempty
            .iter()
            .enumerate()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| i * 64 + w.trailing_zeros() as usize)
    }

    /// Moves the minimum into bucket 0 (where it is the only key) and
    /// returns it.
    fn settle(&mut self) -> Option<(u128, u32)> {
        if self.len == 0 {
            return None;
        }
        if self.buckets[0].is_empty() {
            let i = self.first_nonempty()?;
            let mut items = std::mem::take(&mut self.buckets[i]);
            self.nonempty[i / 64] &= !(1 << (i % 64));
            self.last = items.iter().map(|(k, _)| *k).min()?;
            // Every key now differs from the minimum below bit i.
            for (k, s) in items.drain(..) {
                let b = self.bucket(k);
                self.put(b, k, s);
            }
            // Bucket i stays empty; give it back its allocation.
            self.buckets[i] = items;
        }
        self.buckets[0].last().copied()
    }

    fn pop(&mut self) -> Option<(u128, u32)> {
        self.settle()?;
        self.len -= 1;
        let top = self.buckets[0].pop();
        if self.buckets[0].is_empty() {
            self.nonempty[0] &= !1;
        }
        top
    }
}

#[derive(Default)]
pub(crate) struct Agenda {
    radix: Radix,
    /// Keys below the radix heap's last minimum (rare, see [`Radix`]).
    early: BinaryHeap<Key>,
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
        let key = Key { at, seq, slot };
        if key.order() < self.radix.last {
            self.early.push(key);
        } else {
            self.radix.push(key.order(), slot);
        }
    }

    /// The earliest key, from whichever store holds it.
    fn next_key(&mut self) -> Option<(u128, bool)> {
        let radix = self.radix.settle().map(|(k, _)| k);
        let early = self.early.peek().map(Key::order);
        match (radix, early) {
            (Some(r), Some(e)) if e < r => Some((e, true)),
            (Some(r), _) => Some((r, false)),
            (None, Some(e)) => Some((e, true)),
            (None, None) => None,
        }
    }

    pub(crate) fn pop(&mut self) -> Option<Event> {
        let (order, early) = self.next_key()?;
        let slot = if early {
            self.early.pop()?.slot
        } else {
            self.radix.pop()?.1
        };
        let kind = self.slab.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(Event {
            at: (order >> 64) as Nanos,
            seq: order as u64,
            kind,
        })
    }

    pub(crate) fn peek_time(&mut self) -> Option<Nanos> {
        self.next_key().map(|(k, _)| (k >> 64) as Nanos)
    }

    pub(crate) fn len(&self) -> usize {
        self.radix.len + self.early.len()
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
    fn pops_what_a_sorted_set_would_under_random_schedules() {
        // What the simulator does: pop the earliest, push at or after it,
        // now and then a key from the past (an injection behind skipped
        // stale timers). A sorted set in lockstep is the reference.
        let mut a = Agenda::default();
        let mut reference = std::collections::BTreeSet::new();
        let mut x: u64 = 7;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut now: Nanos = 0;
        for i in 0..20_000u64 {
            let at = if rand() % 50 == 0 {
                now.saturating_sub(rand() % 100)
            } else {
                now + rand() % 1_000
            };
            a.push(at, start(i));
            reference.insert((at, i));
            if rand() % 3 != 0 {
                let e = a.pop().unwrap();
                assert_eq!(Some((e.at, e.seq)), reference.pop_first());
                now = now.max(e.at);
            }
            assert_eq!(a.len(), reference.len());
        }
        while let Some(e) = a.pop() {
            assert_eq!(Some((e.at, e.seq)), reference.pop_first());
        }
        assert!(reference.is_empty());
    }

    #[test]
    fn a_key_behind_the_last_minimum_still_comes_first() {
        let mut a = Agenda::default();
        a.push(100, start(1));
        a.push(200, start(2));
        assert_eq!(a.peek_time(), Some(100));
        let e = a.pop().unwrap();
        assert_eq!((e.at, e.seq), (100, 0));
        // Pushed behind the minimum the queue has moved to.
        a.push(50, start(3));
        a.push(150, start(4));
        let order: Vec<Nanos> = std::iter::from_fn(|| a.pop()).map(|e| e.at).collect();
        assert_eq!(order, vec![50, 150, 200]);
        assert_eq!(a.len(), 0);
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
