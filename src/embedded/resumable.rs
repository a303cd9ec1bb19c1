//! One-process runs that journal their updates and can be resumed
//! (`gyre train [--host live] --resume` with `[checkpoint] every, dir`):
//! the same run journal as a cluster's head (see [`super::run_journal`]),
//! fed by a [`Follower`] thread from the trainers' shared list of updates
//! and the task's reward tallies, so a crash of the process leaves the
//! history up to its last update on disk beside the core's checkpoint, and
//! a resumed run reports the reward by version over the whole run.

use std::time::{Duration, Instant};

use super::cluster::{BuildError, EmbeddedConfig, build};
use super::live::{LiveReport, LiveRunError, run_live_watched};
use super::run::{RunError, TrainReport, rewards, run_built};
use super::run_journal::{self, Follower, JournalError, Opened, Resumed};
use super::trainer::UpdateSummary;

#[derive(Debug, thiserror::Error)]
pub enum ResumableError {
    #[error("run journal: {0}")]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Live(#[from] LiveRunError),
}

/// How long the end waits for the core's last checkpoint to be durable.
const FINAL_WAIT: Duration = Duration::from_secs(60);

/// The simulator host's run of `cfg` (`resume`: from the checkpoint and
/// the journal in `[checkpoint] dir`).
pub fn run_sim(
    cfg: &EmbeddedConfig,
    resume: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrainReport, ResumableError> {
    let opened = run_journal::open(cfg, resume)?;
    let started = Instant::now();
    let c = build(&opened.cfg)?;
    let follower = opened
        .journal
        .map(|j| Follower::spawn(j, c.shared.updates.clone(), c.workspaces.clone()));
    let result = run_built(c, &opened.cfg, started, progress);
    let journal = follower.map(Follower::stop).transpose()?;
    let (c, mut report) = result?;
    if let Some(mut j) = journal {
        run_journal::finish(&mut j, &opened.cfg, FINAL_WAIT)?;
    }
    report.seed = cfg.seed;
    if let Some(r) = &opened.resumed {
        (
            report.reward_by_version,
            report.early_reward,
            report.late_reward,
        ) = rewards(&r.with_rewards(c.workspaces.stats()));
    }
    report.updates = history(opened.resumed, report.updates);
    report.resumed = opened.report;
    Ok(report)
}

/// The live host's run of `cfg`, as [`run_sim`].
pub fn run_live(
    cfg: &EmbeddedConfig,
    resume: bool,
    stall: Duration,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LiveReport, ResumableError> {
    let Opened {
        journal,
        resumed,
        report: resume_report,
        cfg: run_cfg,
    } = run_journal::open(cfg, resume)?;
    let (mut follower, mut workspaces) = (None, None);
    let result = run_live_watched(&run_cfg, stall, progress, None, |shared, w| {
        follower = journal.map(|j| Follower::spawn(j, shared.updates.clone(), w.clone()));
        workspaces = Some(w.clone());
    });
    let journal = follower.map(Follower::stop).transpose()?;
    let mut report = result?;
    if let Some(mut j) = journal {
        run_journal::finish(&mut j, &run_cfg, FINAL_WAIT)?;
    }
    report.seed = cfg.seed;
    if let (Some(r), Some(w)) = (&resumed, &workspaces) {
        (
            report.reward_by_version,
            report.early_reward,
            report.late_reward,
        ) = rewards(&r.with_rewards(w.stats()));
    }
    report.updates = history(resumed, report.updates);
    report.steps = report.updates.len() as u64;
    report.resumed = resume_report;
    Ok(report)
}

/// The earlier runs' journaled updates, then this run's.
fn history(resumed: Option<Resumed>, updates: Vec<UpdateSummary>) -> Vec<UpdateSummary> {
    match resumed {
        Some(r) => r.updates.into_iter().chain(updates).collect(),
        None => updates,
    }
}
