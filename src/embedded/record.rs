//! `gyre train --record RUN.jsonl`: runs the embedded cluster with every
//! backend writing to a [`Journal`] and, on the simulator host, the
//! scheduling plane observed from outside, then writes the run record
//! (`gyre_simulations::replay::schema`) that `gyre simulate --replay`
//! reads. Recording adds no simulator event: a recorded run is the
//! unrecorded one, trace hash included.

use std::path::Path;
use std::time::{Duration, Instant};

use gyre_runtime::MICROS;
use gyre_simulations::replay::observe::observe;
use gyre_simulations::replay::schema::{Header, Recording, SCHEMA_VERSION};

use super::cluster::{EmbeddedConfig, assemble_journaled, build_with};
use super::journal::Journal;
use super::live::{LiveReport, LiveRunError, run_live_journaled};
use super::run::{RunError, TrainReport, run_built};

/// Link latencies of the embedded cluster under the simulator
/// (`cluster::build_with`).
const SIM_LINK: u64 = 100 * MICROS;
const SIM_LOCAL_LINK: u64 = 10 * MICROS;

fn header(cfg: &EmbeddedConfig, host: &str, link_ns: u64, local_link_ns: u64) -> Header {
    Header {
        schema: SCHEMA_VERSION,
        host: host.to_owned(),
        seed: cfg.seed,
        sched: cfg.sched.clone(),
        link_ns,
        local_link_ns,
    }
}

/// [`super::run::run`], recorded.
pub fn run_recorded(
    cfg: &EmbeddedConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(TrainReport, Recording), RunError> {
    let started = Instant::now();
    let journal = Journal::new();
    let j = journal.clone();
    let mut c = build_with(cfg, move |sim, cfg| assemble_journaled(sim, cfg, Some(j)))?;
    let seen = observe(&mut c.sim, c.sched);
    let (_, report) = run_built(c, cfg, started, progress)?;
    let seen = seen.borrow();
    let rec = journal.recording(
        header(cfg, "sim", SIM_LINK, SIM_LOCAL_LINK),
        Some((&seen.dispatch, &seen.changes)),
    );
    Ok((report, rec))
}

/// [`super::live::run_live`], recorded: real time; role changes as the
/// device memories saw them, no dispatch times.
pub fn run_live_recorded(
    cfg: &EmbeddedConfig,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(LiveReport, Recording), LiveRunError> {
    let journal = Journal::new();
    let report = run_live_journaled(cfg, stall, progress, Some(journal.clone()))?;
    // One live node: every actor is local, messages cost what a channel
    // does, which the record's times already hold.
    Ok((report, journal.recording(header(cfg, "live", 0, 0), None)))
}

/// Writes `rec` to `path` as JSON lines.
pub fn write(rec: &Recording, path: &Path) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    rec.write(&mut out)?;
    std::io::Write::flush(&mut out)
}
