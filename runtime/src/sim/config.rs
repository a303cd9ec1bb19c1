//! What a simulated world looks like: links, I/O backends and run limits.
//!
//! Everything here is plain data so that a failing run can print the exact
//! settings it ran under, and a seed (through [`super::FaultPlan`]) can pick
//! them. Probabilities are plain `f64` in `[0, 1]`; values outside are clamped
//! where they are used, never rejected mid-run.

use std::collections::BTreeMap;
use std::fmt;

use crate::time::{MICROS, MILLIS, Nanos};

use super::fmt_nanos;

/// How long one hop takes. Only [`Latency::Const`] keeps a link ordered by
/// itself; the random ones reorder unless the link is FIFO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    Const(Nanos),
    /// Uniform over `[min, max]` (bounds swapped if given backwards).
    Uniform {
        min: Nanos,
        max: Nanos,
    },
    /// `min` plus an exponential tail, so that the overall mean is `mean`
    /// (a mean below `min` means no tail). Models queueing spikes.
    Exponential {
        min: Nanos,
        mean: Nanos,
    },
}

impl Latency {
    pub(crate) fn is_const(&self) -> bool {
        matches!(self, Latency::Const(_))
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Latency::Const(n) => write!(f, "{}", fmt_nanos(n)),
            Latency::Uniform { min, max } => {
                write!(f, "uniform {}..{}", fmt_nanos(min), fmt_nanos(max))
            }
            Latency::Exponential { min, mean } => {
                write!(f, "exp min {} mean {}", fmt_nanos(min), fmt_nanos(mean))
            }
        }
    }
}

/// One direction of the network between two nodes (or within one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub latency: Latency,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message arrives twice (the copy goes through the
    /// codec, as a retransmitted frame would). Off by default: Gyre's
    /// protocols assume at-most-once delivery unless a test says otherwise.
    pub duplicate: f64,
    /// A message never overtakes an earlier one on the same (src, dst) link.
    pub fifo: bool,
}

impl LinkModel {
    /// Zero latency, ordered, lossless: what two actors on one node see.
    pub const fn instant() -> Self {
        Self::constant(0)
    }

    /// Fixed latency, ordered, lossless.
    pub const fn constant(latency: Nanos) -> Self {
        Self {
            latency: Latency::Const(latency),
            loss: 0.0,
            duplicate: 0.0,
            fifo: true,
        }
    }

    /// An ordered link that loses each message with probability `loss`.
    pub const fn lossy(latency: Latency, loss: f64) -> Self {
        Self {
            latency,
            loss,
            duplicate: 0.0,
            fifo: true,
        }
    }
}

impl Default for LinkModel {
    fn default() -> Self {
        Self::instant()
    }
}

impl fmt::Display for LinkModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "latency {}, loss {:.2}%, dup {:.2}%, {}",
            self.latency,
            self.loss * 100.0,
            self.duplicate * 100.0,
            if self.fifo { "fifo" } else { "reordering" }
        )
    }
}

/// The modelled behaviour of one kind of I/O request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoKindModel {
    pub latency: Latency,
    /// Probability that the request fails with `IoError::Injected`.
    pub fail: f64,
}

impl fmt::Display for IoKindModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, fail {:.2}%", self.latency, self.fail * 100.0)
    }
}

/// Modelled I/O backends, keyed by [`crate::IoRequest::kind`].
#[derive(Debug, Clone, PartialEq)]
pub struct IoModel {
    /// For every kind without an entry in `kinds`.
    pub default: IoKindModel,
    pub kinds: BTreeMap<String, IoKindModel>,
}

impl IoModel {
    /// The model for requests of `kind`.
    pub fn get(&self, kind: &str) -> &IoKindModel {
        self.kinds.get(kind).unwrap_or(&self.default)
    }

    /// Sets the model of one kind (builder style).
    pub fn with_kind(mut self, kind: &str, latency: Latency, fail: f64) -> Self {
        self.kinds
            .insert(kind.to_owned(), IoKindModel { latency, fail });
        self
    }
}

impl Default for IoModel {
    fn default() -> Self {
        Self {
            default: IoKindModel {
                latency: Latency::Const(MILLIS),
                fail: 0.0,
            },
            kinds: BTreeMap::new(),
        }
    }
}

impl fmt::Display for IoModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "io default {}", self.default)?;
        for (kind, m) in &self.kinds {
            write!(f, "; io {kind} {m}")?;
        }
        Ok(())
    }
}

/// The modelled cost of one payload transfer: a latency, plus its bytes over
/// a bandwidth. Zero by default (instant, never failing), so a run's
/// schedule does not depend on transfers unless a scenario prices them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PayloadCost {
    pub latency: Latency,
    /// Bytes per second; 0 means unlimited.
    pub bytes_per_sec: u64,
    /// Probability that a transfer fails.
    pub fail: f64,
}

impl Default for PayloadCost {
    fn default() -> Self {
        Self {
            latency: Latency::Const(0),
            bytes_per_sec: 0,
            fail: 0.0,
        }
    }
}

impl PayloadCost {
    /// Time to move `bytes` at the bandwidth (0 when unlimited).
    pub fn transfer_time(&self, bytes: u64) -> Nanos {
        if self.bytes_per_sec == 0 {
            return 0;
        }
        let ns = u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_sec);
        Nanos::try_from(ns).unwrap_or(Nanos::MAX)
    }
}

/// Everything a run depends on besides the actors: with the same config and
/// the same actors, a run is the same run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    /// Between two different nodes, unless overridden with `Sim::set_link`.
    pub default_link: LinkModel,
    /// Within one node.
    pub local_link: LinkModel,
    pub io: IoModel,
    /// What a payload transfer costs (see [`crate::payload`]).
    pub payload: PayloadCost,
    /// Encode every message and decode it with the receiver's decoder before
    /// delivering it, so a message that would not survive the wire fails the
    /// run. Costs an encode and a decode per message.
    pub codec_roundtrip: bool,
    /// With `codec_roundtrip`, also compare the `Debug` renderings before and
    /// after the trip, which catches fields the codec silently drops
    /// (`#[serde(skip)]`). Off by default: types whose `Debug` output depends
    /// on hashing order (std `HashMap`) would fail it spuriously.
    pub codec_compare_debug: bool,
    /// Stop `run` after this many events in total (a liveness bound).
    pub max_events: Option<u64>,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            default_link: LinkModel::constant(100 * MICROS),
            local_link: LinkModel::instant(),
            io: IoModel::default(),
            payload: PayloadCost::default(),
            codec_roundtrip: false,
            codec_compare_debug: false,
            max_events: None,
        }
    }

    /// `new(seed)`, unless `GYRE_SEED` names another seed (replaying a
    /// failure). An unparsable `GYRE_SEED` is reported and ignored.
    pub fn from_env_or(seed: u64) -> Self {
        let env = std::env::var(super::SEED_ENV).ok();
        Self::new(seed_from(env.as_deref(), seed))
    }
}

/// The seed a `GYRE_SEED` value names, else `fallback` (unset, empty, or
/// unparsable, which is reported).
fn seed_from(env: Option<&str>, fallback: u64) -> u64 {
    match env {
        Some(text) if !text.trim().is_empty() => match super::parse_seed(text) {
            Ok(seed) => seed,
            Err(err) => {
                tracing::warn!(%err, "ignoring {}", super::SEED_ENV);
                fallback
            }
        },
        _ => fallback,
    }
}

impl fmt::Display for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}; links: remote {}, local {}; {}; payloads {} + bytes at {} B/s (fail {}); codec round-trip {}",
            self.seed,
            self.default_link,
            self.local_link,
            self.io,
            self.payload.latency,
            self.payload.bytes_per_sec,
            self.payload.fail,
            if self.codec_roundtrip { "on" } else { "off" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_kind_override_and_default() {
        let io = IoModel::default().with_kind("disk", Latency::Const(5), 0.5);
        assert_eq!(io.get("disk").latency, Latency::Const(5));
        assert_eq!(io.get("disk").fail, 0.5);
        assert_eq!(io.get("other"), &io.default);
    }

    #[test]
    fn env_seed_overrides_unless_unset_or_bad() {
        assert_eq!(seed_from(Some("17"), 3), 17);
        assert_eq!(seed_from(Some("0xff"), 3), 255);
        assert_eq!(seed_from(None, 3), 3);
        assert_eq!(seed_from(Some(" "), 3), 3);
        assert_eq!(seed_from(Some("seventeen"), 3), 3);
    }

    #[test]
    fn config_display_names_the_settings() {
        let cfg = SimConfig::new(42);
        let text = cfg.to_string();
        assert!(text.contains("seed 42"), "{text}");
        assert!(text.contains("fifo"), "{text}");
    }
}
