//! A running hash of everything that happened in a run.
//!
//! Two runs with the same hash took the same schedule. Each event folds a
//! handful of integers (time, sequence, kind, the two ends, a token) through
//! [`mix64`]; nothing is formatted or encoded, so hashing costs a few
//! nanoseconds per event and is identical across processes and platforms.

use crate::id::ActorId;
use crate::rng::mix64;
use crate::time::Nanos;

/// What kind of event a trace record is; part of the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mark {
    Start = 1,
    Deliver = 2,
    DropDead = 3,
    DropPartition = 4,
    Mistyped = 5,
    Timer = 6,
    Io = 7,
    IoFailed = 8,
    IoDropped = 9,
    PeerDown = 10,
    Fault = 11,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        Self(0x7472_6163_655f_6879) // "trace_hy"
    }
}

impl TraceHash {
    pub(crate) fn record(
        &mut self,
        at: Nanos,
        seq: u64,
        mark: Mark,
        from: ActorId,
        to: ActorId,
        token: u64,
    ) {
        let mut h = mix64(self.0 ^ at);
        h = mix64(h ^ seq.rotate_left(8) ^ mark as u64);
        h = mix64(h ^ from.as_u64());
        h = mix64(h ^ to.as_u64() ^ token.rotate_left(32));
        self.0 = h;
    }

    pub(crate) fn value(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_fields_matter() {
        let a = ActorId::new(0, 1);
        let b = ActorId::new(1, 1);
        let mut x = TraceHash::default();
        x.record(1, 0, Mark::Deliver, a, b, 0);
        x.record(2, 1, Mark::Deliver, b, a, 0);
        let mut y = TraceHash::default();
        y.record(1, 0, Mark::Deliver, b, a, 0);
        y.record(2, 1, Mark::Deliver, a, b, 0);
        assert_ne!(x.value(), y.value());
        let mut z = TraceHash::default();
        z.record(1, 0, Mark::Deliver, a, b, 0);
        z.record(2, 1, Mark::Deliver, b, a, 0);
        assert_eq!(x.value(), z.value());
    }
}
