//! Time as integer nanoseconds.
//!
//! Actors never read a clock: the host passes `now` into every handler. In the
//! simulator it is virtual time, in the live host nanoseconds since the host
//! started. Integers keep simulated schedules exact and hashable.

/// A point in time or a duration, in nanoseconds.
pub type Nanos = u64;

pub const MICROS: Nanos = 1_000;
pub const MILLIS: Nanos = 1_000_000;
pub const SECS: Nanos = 1_000_000_000;

/// Converts to a std duration for hosts that sleep for real.
pub fn to_duration(n: Nanos) -> std::time::Duration {
    std::time::Duration::from_nanos(n)
}

/// Converts a std duration, saturating at `u64::MAX` nanoseconds (584 years).
pub fn from_duration(d: std::time::Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The time a handler sees.
///
/// The simulator knows it exactly. The live hosts read a real clock, which
/// costs about 100 ns a read on some virtual machines, more than the rest of
/// a small handler; so they read it only when the handler (or a timer it
/// arms) asks, and at most once per handler.
pub struct Clock<'a> {
    cached: std::cell::Cell<Option<Nanos>>,
    read: Option<&'a dyn Fn() -> Nanos>,
}

impl<'a> Clock<'a> {
    /// A time known in advance (virtual time).
    pub fn fixed(now: Nanos) -> Self {
        Self {
            cached: std::cell::Cell::new(Some(now)),
            read: None,
        }
    }

    /// A clock read on first use.
    pub fn lazy(read: &'a dyn Fn() -> Nanos) -> Self {
        Self {
            cached: std::cell::Cell::new(None),
            read: Some(read),
        }
    }

    pub fn now(&self) -> Nanos {
        if let Some(now) = self.cached.get() {
            return now;
        }
        let now = self.read.map_or(0, |read| read());
        self.cached.set(Some(now));
        now
    }

    /// The time if it was already read, without reading it.
    pub fn if_read(&self) -> Option<Nanos> {
        self.cached.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_clock_reads_once_and_only_when_asked() {
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            42
        };
        let clock = Clock::lazy(&read);
        assert_eq!(clock.if_read(), None);
        assert_eq!(reads.get(), 0);
        assert_eq!(clock.now(), 42);
        assert_eq!(clock.now(), 42);
        assert_eq!(reads.get(), 1);
        assert_eq!(Clock::fixed(7).if_read(), Some(7));
    }
}
