//! The simulator's agenda: events totally ordered by (time, sequence).
//!
//! A sequence number is handed out when an event is scheduled, so two events
//! due at the same nanosecond run in the order they were scheduled, and a
//! run is one total order that a seed reproduces. The queue is a radix heap
//! over event times (see [`Radix`]). Messages stay boxed and are never
//! encoded here.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

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

impl EventKind {
    /// The actor whose handler the event runs (`None` for a fault).
    pub(crate) fn actor(&self) -> Option<ActorId> {
        match self {
            EventKind::Start { id, .. }
            | EventKind::Timer { id, .. }
            | EventKind::Io { id, .. }
            | EventKind::PeerDown { id, .. } => Some(*id),
            EventKind::Deliver { to, .. } => Some(*to),
            EventKind::Fault(_) => None,
        }
    }
}

pub(crate) struct Event {
    pub(crate) at: Nanos,
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
}

/// An event as it waits, ordered by (time, sequence).
struct Entry {
    at: Nanos,
    seq: u64,
    kind: EventKind,
}

impl Entry {
    fn order(&self) -> (Nanos, u64) {
        (self.at, self.seq)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.order() == other.order()
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so that std's max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.order().cmp(&self.order())
    }
}

/// A radix heap over event times: an event lives in the bucket of the
/// highest bit where its time differs from the last minimum time, so
/// finding the next minimum only ever moves events to lower buckets and
/// each operation costs amortised O(1) instead of a binary heap's
/// O(log n). Bucket 0 holds the events due at the last minimum time itself,
/// in sequence order: an event scheduled at that time has the largest
/// sequence yet and goes to its back, and the events that settle into it
/// together are sorted once. It needs times no earlier than the last
/// minimum, which holds for everything the simulator schedules at or after
/// `now`; the rare event before it (a message injected from outside after
/// stale timers were skipped past `now`) waits in a small binary heap, so
/// the order stays exact.
///
/// Events wait in the buckets themselves: an event moves a few times on
/// its way down, which costs less than the cache miss of fetching it from
/// a separate store when it is due (measured on the 2.4T scenario).
struct Radix {
    last: Nanos,
    /// Bucket 0, front first.
    due: VecDeque<Entry>,
    /// Buckets 1..=64 at indices 0..64.
    buckets: Vec<Vec<Entry>>,
    /// Bit b set: bucket b + 1 holds events.
    nonempty: u64,
    len: usize,
}

impl Default for Radix {
    fn default() -> Self {
        Self {
            last: 0,
            due: VecDeque::new(),
            buckets: (0..64).map(|_| Vec::new()).collect(),
            nonempty: 0,
            len: 0,
        }
    }
}

impl Radix {
    /// Files an event due at or after the last minimum time.
    fn put(&mut self, e: Entry) {
        let x = e.at ^ self.last;
        if x == 0 {
            self.due.push_back(e);
        } else {
            let b = 63 - x.leading_zeros() as usize;
            self.buckets[b].push(e);
            self.nonempty |= 1 << b;
        }
    }

    fn push(&mut self, e: Entry) {
        self.put(e);
        self.len += 1;
    }

    /// Moves the events due at the next minimum time into bucket 0 and
    /// returns the first.
    fn settle(&mut self) -> Option<&Entry> {
        if self.due.is_empty() {
            if self.nonempty == 0 {
                return None;
            }
            let i = self.nonempty.trailing_zeros() as usize;
            let mut items = std::mem::take(&mut self.buckets[i]);
            self.nonempty &= !(1 << i);
            self.last = items.iter().map(|e| e.at).min()?;
            // Every event now differs from the minimum below bit i.
            for e in items.drain(..) {
                self.put(e);
            }
            // Bucket i stays empty; give it back its allocation.
            self.buckets[i] = items;
            if self.due.len() > 1 {
                self.due.make_contiguous().sort_unstable_by_key(|e| e.seq);
            }
        }
        self.due.front()
    }

    fn pop(&mut self) -> Option<Entry> {
        self.settle()?;
        self.len -= 1;
        self.due.pop_front()
    }
}

#[derive(Default)]
pub(crate) struct Agenda {
    radix: Radix,
    /// Events before the radix heap's last minimum time (rare, see
    /// [`Radix`]).
    early: BinaryHeap<Entry>,
    next_seq: u64,
}

impl Agenda {
    pub(crate) fn push(&mut self, at: Nanos, kind: EventKind) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let e = Entry { at, seq, kind };
        if at < self.radix.last {
            self.early.push(e);
        } else {
            self.radix.push(e);
        }
    }

    /// The earliest event's (time, sequence), and whether the early heap
    /// holds it.
    fn next_key(&mut self) -> Option<((Nanos, u64), bool)> {
        let radix = self.radix.settle().map(Entry::order);
        let early = self.early.peek().map(Entry::order);
        match (radix, early) {
            (Some(r), Some(e)) if e < r => Some((e, true)),
            (Some(r), _) => Some((r, false)),
            (None, Some(e)) => Some((e, true)),
            (None, None) => None,
        }
    }

    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<Event> {
        self.pop_due(Nanos::MAX)
    }

    /// The earliest event, if it is due at or before `limit`.
    pub(crate) fn pop_due(&mut self, limit: Nanos) -> Option<Event> {
        let ((at, _), early) = self.next_key()?;
        if at > limit {
            return None;
        }
        let e = if early {
            self.early.pop()?
        } else {
            self.radix.pop()?
        };
        Some(Event {
            at: e.at,
            seq: e.seq,
            kind: e.kind,
        })
    }

    pub(crate) fn peek_time(&mut self) -> Option<Nanos> {
        self.next_key().map(|((at, _), _)| at)
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
    fn interleaved_pushes_and_pops_keep_the_order() {
        let mut a = Agenda::default();
        let mut popped = Vec::new();
        for round in 0..50u64 {
            // Three in, two out, some due at the time just popped.
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
        // Each pop is the least (time, sequence) of what was waiting, so
        // pops of events that waited together come out sorted.
        let mut sorted = popped[100..].to_vec();
        sorted.sort();
        assert_eq!(&popped[100..], &sorted[..]);
    }
}
