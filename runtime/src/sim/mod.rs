//! The deterministic simulator host.
//!
//! One thread runs a whole cluster of actors in virtual time (integer
//! nanoseconds). Every input an actor gets is an event in one agenda ordered
//! by (time, sequence), so a run is a total order; every random choice the
//! host makes (latency, loss, duplication, I/O failure, fault targets) comes
//! from one stream seeded by the run seed, and every actor's own stream is
//! derived from it too. The same seed and configuration therefore give the
//! same run, event for event, which a running trace hash confirms; a failing
//! run reports its seed, and `GYRE_SEED=<n>` replays it.
//!
//! The world is modelled, not mocked: a network per link (latency shape,
//! loss, duplication, FIFO or reordering, partitions), actor crashes and
//! restarts, I/O with per-kind latency and failure, an optional codec
//! round-trip that catches messages the wire would mangle, and invariants
//! checked after every event. [`FaultPlan`] turns a seed into a fault mix and
//! [`check_seeds`] sweeps seeds in tests (the discipline of FoundationDB's
//! simulator and TigerBeetle's VOPR).

mod config;
mod control;
mod dispatch;
mod draw;
mod error;
mod event;
mod faults;
mod net;
mod send;
mod slot;
mod sweep;
mod trace;
mod view;
mod world;

pub use config::{IoKindModel, IoModel, Latency, LinkModel, PayloadCost, SimConfig};
pub use error::{SimError, SimFailure};
pub use faults::{DEFAULT_HORIZON, FaultPlan, TimedFault};
pub use net::NetStats;
pub use slot::Received;
pub use sweep::{SweepError, check_seeds, parse_seed, sweep_seeds};
pub use view::SimView;
pub use world::{RunStats, Sim};

use crate::time::{MICROS, MILLIS, Nanos, SECS};

/// The environment variable that names a seed to replay.
pub const SEED_ENV: &str = "GYRE_SEED";

/// Renders a duration for people: `250ns`, `1.5us`, `12ms`, `2.25s`.
pub fn fmt_nanos(n: Nanos) -> String {
    let (unit, name) = match n {
        _ if n >= SECS => (SECS, "s"),
        _ if n >= MILLIS => (MILLIS, "ms"),
        _ if n >= MICROS => (MICROS, "us"),
        _ => return format!("{n}ns"),
    };
    if n % unit == 0 {
        return format!("{}{name}", n / unit);
    }
    let text = format!("{:.3}", n as f64 / unit as f64);
    format!("{}{name}", text.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_nanos(0), "0ns");
        assert_eq!(fmt_nanos(250), "250ns");
        assert_eq!(fmt_nanos(1_500), "1.5us");
        assert_eq!(fmt_nanos(12 * MILLIS), "12ms");
        assert_eq!(fmt_nanos(2_250 * MILLIS), "2.25s");
    }
}
