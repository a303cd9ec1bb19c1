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
