//! Seed sweeps for tests: run many seeds, report the first failure with what
//! it takes to replay it, and replay exactly one seed when `GYRE_SEED` says so.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::SEED_ENV;
use super::error::SimError;

/// Why a sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{SEED_ENV}={text:?} is not a seed (expected a decimal or 0x-prefixed hex u64)")]
    BadSeed { text: String },
    #[error("seed {seed} failed: {error}")]
    Failed { seed: u64, error: Box<SimError> },
    #[error("seed {seed} panicked: {message}\n  rerun with {SEED_ENV}={seed}")]
    Panicked { seed: u64, message: String },
}

/// Parses a seed as written in `GYRE_SEED`: decimal, or hex with `0x`.
pub fn parse_seed(text: &str) -> Result<u64, SweepError> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => t.replace('_', "").parse::<u64>(),
    };
    parsed.map_err(|_| SweepError::BadSeed {
        text: text.to_owned(),
    })
}

/// Runs `f` on seeds `base..base + count`, or only on the seed in `env` (the
/// value of `GYRE_SEED`) when given; stops at the first failure or panic.
/// Returns how many seeds ran.
pub fn sweep_seeds(
    env: Option<&str>,
    count: u64,
    base: u64,
    f: impl Fn(u64) -> Result<(), SimError>,
) -> Result<u64, SweepError> {
    let seeds = match env {
        Some(text) if !text.trim().is_empty() => {
            let seed = parse_seed(text)?;
            seed..seed.saturating_add(1)
        }
        _ => base..base.saturating_add(count),
    };
    let mut ran = 0;
    for seed in seeds {
        match catch_unwind(AssertUnwindSafe(|| f(seed))) {
            Ok(Ok(())) => ran += 1,
            Ok(Err(error)) => {
                return Err(SweepError::Failed {
                    seed,
                    error: Box::new(error),
                });
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_owned());
                return Err(SweepError::Panicked { seed, message });
            }
        }
    }
    Ok(ran)
}

/// [`sweep_seeds`] with `GYRE_SEED` from the environment; panics with the
/// failing seed, its settings and the replay command. For tests.
pub fn check_seeds(count: u64, base: u64, f: impl Fn(u64) -> Result<(), SimError>) {
    let env = std::env::var(SEED_ENV).ok();
    if let Err(err) = sweep_seeds(env.as_deref(), count, base, f) {
        panic!("{err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(parse_seed("42").unwrap(), 42);
        assert_eq!(parse_seed(" 0x2a ").unwrap(), 42);
        assert_eq!(parse_seed("1_000").unwrap(), 1000);
        assert!(matches!(parse_seed("x"), Err(SweepError::BadSeed { .. })));
        assert!(parse_seed("-1").is_err());
    }
}
