//! The run's journal, `<checkpoint dir>/run.jsonl`: what a restarted
//! `gyre train` needs to resume a run its predecessor lost (`--resume`;
//! in one process, or a cluster's head).
//!
//! The core's checkpoint (`core.ckpt`) already holds what the model is:
//! weights, optimizer state, step and version. The journal holds what the
//! run *did*: which configuration it runs (a digest, so a resume with
//! another configuration is refused), every update as it was published,
//! every resume, and its end. A resumed run keeps the updates up to the
//! checkpoint's version and counts the ones after it as lost: the core
//! makes them again from the checkpoint, so the report's history holds one
//! update per version, as for a core restored mid-run.
//!
//! Append-only JSON lines, each written whole and synced before the head
//! goes on, so a crash leaves at most a torn last line, which is ignored
//! (and logged); a bad line anywhere else is refused, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gyre_actors::sched::ConfigError;
use gyre_actors::sched::scheduler::Publication;
use gyre_gpu::trainer::checkpoint::CoreCheckpoint;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::cluster::{ConfigFileError, EmbeddedConfig};
use super::external::side::AdoptionReport;
use super::last_word::{LastWordReport, LostHead, Taken};
use super::shared::lock;
use super::task::{RewardTally, TaskStats, Workspaces};
use super::trainer::UpdateSummary;

/// The journal's file name in the checkpoint directory.
pub const FILE: &str = "run.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {why}")]
    Bad {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error(
        "{path} is the journal of a run with another configuration (digest {found}, this one {want}): resume it with the configuration it was started with"
    )]
    OtherRun {
        path: PathBuf,
        found: String,
        want: String,
    },
    #[error(
        "{path}: the run finished (version {version} trained and published); there is nothing left to train"
    )]
    Finished { path: PathBuf, version: u64 },
    #[error(
        "{dir} holds an earlier run's {what}: resume it with --resume, or give [checkpoint] dir an empty directory"
    )]
    Occupied { dir: PathBuf, what: &'static str },
    #[error("--resume needs the core's checkpoints: set [checkpoint] every and dir")]
    ResumeWithoutCheckpoints,
    #[error("the core's checkpoint {path}: {why}")]
    Checkpoint { path: PathBuf, why: String },
    #[error("configuration: {0}")]
    Config(#[from] ConfigFileError),
    #[error("configuration: {0}")]
    Sched(#[from] ConfigError),
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// The first line: the run's configuration (SHA-256 of its TOML).
    Run { config: String, target_steps: u64 },
    /// A head resumed the run from the core's checkpoint of `version`;
    /// `lost_updates` were journaled after it and are made again.
    Resume { version: u64, lost_updates: u64 },
    /// An update, as the core published it.
    Update(UpdateSummary),
    /// The task's reward tallies by the version executions were
    /// dispatched under, for the versions whose tally changed since the
    /// last such line (whole values, so the last line of a version wins).
    Rewards { tallies: Vec<(u64, RewardTally)> },
    /// The run trained its last step (and, where one was due, the core's
    /// checkpoint of it is durable): there is nothing to resume.
    Finished { version: u64 },
    /// The head of `incarnation` (0 for the run's first, n for its n-th
    /// resume) sealed step `step`'s batch from these groups (that head's
    /// group ids): once the step's update is in a checkpoint they are
    /// trained for good, so a later resume never adopts them.
    Sealed {
        incarnation: u64,
        step: u64,
        groups: Vec<u64>,
    },
    /// A publication as the scheduler made it: its counters d, p, f over
    /// the whole run ([`continued`]) and whether the core stayed in
    /// training (a cluster head's).
    Published(Publication),
}

/// What an earlier head journaled, as a resumed head starts from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resumed {
    /// The updates up to the checkpoint's version, one per version.
    pub updates: Vec<UpdateSummary>,
    /// Updates journaled after the checkpoint's version (made again), over
    /// every earlier head.
    pub lost_updates: u64,
    /// Resumes of the run before this one.
    pub resumes: u64,
    /// The reward tallies of the versions up to the checkpoint's, as the
    /// earlier runs scored them.
    pub rewards: BTreeMap<u64, RewardTally>,
    /// (incarnation, group) of every group a step the checkpoint holds
    /// trained (the last sealing of each step counts).
    pub trained: BTreeSet<(u64, u64)>,
    /// The publication of the checkpoint's version (or the newest before
    /// it), as journaled.
    pub counters: Option<Publication>,
}

/// The scheduler's counters over a whole run, across its heads.
///
/// A resumed head's scheduler starts a burst at the version resumed from
/// with counters at zero: its rules read differences (d − p queued, p − f
/// running, w = d − f), and its boundary dispatch of (φ+μ)·N·B puts the
/// outstanding groups where the lost head had them right after publishing
/// that version (the ones it had not trained are among them, adopted or
/// afresh). The run's counters continue the lost head's: every execution
/// it finished by that publication is kept (in d, p and f alike), and the
/// ones it had not finished count again as they are dispatched again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RunCounters {
    pub dispatched: u64,
    pub started: u64,
    pub finished: u64,
    /// The last publication's burst-end decision.
    pub core_training: bool,
}

/// `now` (a resumed head's scheduler's publication) over the whole run:
/// after `base`, the journaled publication it resumed from (whole-run
/// counters themselves).
pub fn continued(base: Option<&Publication>, now: Publication) -> Publication {
    let kept = base.map_or(0, |b| b.finished);
    Publication {
        dispatched: kept + now.dispatched,
        started: kept + now.started,
        finished: kept + now.finished,
        ..now
    }
}

impl From<Publication> for RunCounters {
    fn from(p: Publication) -> Self {
        Self {
            dispatched: p.dispatched,
            started: p.started,
            finished: p.finished,
            core_training: p.core_stays,
        }
    }
}

impl Resumed {
    /// `stats` with the earlier runs' reward tallies added, so the reward
    /// by version spans the whole run.
    pub fn with_rewards(&self, mut stats: TaskStats) -> TaskStats {
        for (v, t) in &self.rewards {
            let here = stats.by_version.entry(*v).or_default();
            here.scored += t.scored;
            here.reward_sum += t.reward_sum;
        }
        stats
    }
}

/// What of the task's reward tallies is not journaled yet.
#[derive(Debug, Default)]
pub struct RewardsSeen {
    seen: BTreeMap<u64, RewardTally>,
}

impl RewardsSeen {
    /// Journals the tallies of `stats` (the task's, now) that changed
    /// since the last call, if any did.
    pub fn journal(
        &mut self,
        journal: &mut RunJournal,
        stats: TaskStats,
    ) -> Result<(), JournalError> {
        let now = stats.by_version;
        let tallies: Vec<(u64, RewardTally)> = now
            .iter()
            .filter(|(v, t)| self.seen.get(v) != Some(t))
            .map(|(v, t)| (*v, *t))
            .collect();
        if tallies.is_empty() {
            return Ok(());
        }
        journal.append(&Line::Rewards { tallies })?;
        self.seen = now;
        Ok(())
    }
}

/// What a run reports of its resume (`--resume`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ResumeReport {
    /// The version of the core's checkpoint the run resumed from.
    pub from_version: u64,
    /// Resumes before this one.
    pub earlier_resumes: u64,
    /// Updates earlier runs journaled after their last checkpoint, made
    /// again.
    pub lost_updates: u64,
    /// Harness processes earlier heads left running, killed before this
    /// run started its own ([`crate::harness::orphans`]).
    pub harnesses_killed: u64,
    /// What of the lost head's running groups this run adopted
    /// ([`crate::embedded::external::adopt`]).
    pub adopted: AdoptionReport,
    /// Node agents the lost head left waiting for it, adopted by this one
    /// instead of started anew (a cluster run's `agents_adopted`).
    pub agents_adopted: u64,
    /// What the lost head's core left when it lost its head, and whether
    /// this run resumed from it (a cluster run's; see
    /// [`super::last_word`]).
    pub core_last_word: Option<LastWordReport>,
    /// The scheduler's state at the version resumed from, as the lost
    /// head journaled it: its counters and whether the core stayed in
    /// training (this run's scheduler starts a burst there, every cell in
    /// rollout, and the watermark rules move them again).
    pub counters_from: Option<RunCounters>,
}

/// A run's journal as opened for it: none without checkpoints; with
/// `--resume`, what earlier runs did and the configuration moved to the
/// checkpoint's version.
#[derive(Debug)]
pub struct Opened {
    pub journal: Option<RunJournal>,
    pub resumed: Option<Resumed>,
    pub report: Option<ResumeReport>,
    /// The configuration to run: `cfg`, or, resumed, starting at the
    /// checkpoint's version (`SchedConfig::start_version`: every process
    /// builds from the checkpoint) with a seed of its own for the work the
    /// resumed run does, so its executions are not those the run began
    /// with.
    pub cfg: EmbeddedConfig,
}

/// Opens the run's journal when the core writes checkpoints: a new run's
/// in an unused directory, or, with `resume`, the lost run's.
pub fn open(cfg: &EmbeddedConfig, resume: bool) -> Result<Opened, JournalError> {
    open_with(cfg, resume, None)
}

/// How a resumed cluster head takes the core's last word
/// ([`super::last_word::take`] with its wait and its view of the core's
/// process): given the checkpoint directory and what the lost head
/// journaled.
pub type TakeWord<'a> = &'a dyn Fn(&Path, &LostHead) -> Result<Option<Taken>, String>;

/// [`open`], a resume first taking the core's last word with `take_word`.
pub fn open_with(
    cfg: &EmbeddedConfig,
    resume: bool,
    take_word: Option<TakeWord<'_>>,
) -> Result<Opened, JournalError> {
    let mut cfg = cfg.clone();
    let Some(ckpt) = cfg.checkpoint.path() else {
        if resume {
            return Err(JournalError::ResumeWithoutCheckpoints);
        }
        return Ok(Opened {
            journal: None,
            resumed: None,
            report: None,
            cfg,
        });
    };
    let dir = Path::new(&cfg.checkpoint.dir).to_owned();
    // The target is left out: a finished run may be resumed to train
    // further (`--steps` larger than before).
    let digest = {
        let mut same = cfg.clone();
        same.sched.target_steps = 0;
        config_digest(&same.to_toml()?)
    };
    let target = cfg.sched.target_steps;
    if !resume {
        let journal = RunJournal::create(&dir, &digest, target)?;
        return Ok(Opened {
            journal: Some(journal),
            resumed: None,
            report: None,
            cfg,
        });
    }
    let word = match (take_word, lost_head(&dir, &digest)?) {
        (Some(take), Some(lost)) => take(&dir, &lost).map_err(|why| JournalError::Checkpoint {
            path: dir.join(super::last_word::WORD),
            why,
        })?,
        _ => None,
    };
    if let Some(w) = &word {
        tracing::info!(word = ?w.report, "the core's last word");
    }
    let version = if ckpt.exists() {
        CoreCheckpoint::load(&ckpt)
            .map_err(|e| JournalError::Checkpoint {
                path: ckpt.clone(),
                why: e.to_string(),
            })?
            .version
    } else {
        0
    };
    // Checked before the resume is journaled: one that cannot run (nothing
    // left to train) must not count as a resume.
    cfg.sched.start_version = version;
    cfg.sched.validate()?;
    let carried = word.as_ref().map_or(&[][..], |w| &w.journal[..]);
    let (journal, resumed) = RunJournal::resume_with(&dir, &digest, target, version, carried)?;
    tracing::info!(
        version,
        kept = resumed.updates.len(),
        lost = resumed.lost_updates,
        "resuming the run from the core's checkpoint"
    );
    // 63 bits: the configuration travels to a cluster's agents as TOML,
    // whose integers are signed.
    cfg.seed = gyre_runtime::rng::mix64(cfg.seed ^ version.rotate_left(32) ^ 0x5e5e) >> 1;
    let report = ResumeReport {
        from_version: version,
        earlier_resumes: resumed.resumes,
        lost_updates: resumed.lost_updates,
        harnesses_killed: 0,
        adopted: AdoptionReport::default(),
        agents_adopted: 0,
        core_last_word: word.map(|w| w.report),
        counters_from: resumed.counters.map(RunCounters::from),
    };
    Ok(Opened {
        journal: Some(journal),
        resumed: Some(resumed),
        report: Some(report),
        cfg,
    })
}

/// The run trained its last step: waits until the core's checkpoint of it
/// is durable (where one is due: `cfg`'s target is a multiple of S), so
/// the final model is on disk, then journals the end.
pub fn finish(
    journal: &mut RunJournal,
    cfg: &EmbeddedConfig,
    within: Duration,
) -> Result<(), JournalError> {
    let target = cfg.sched.target_steps;
    if let Some(path) = cfg.checkpoint.path()
        && target % cfg.checkpoint.every == 0
    {
        wait_durable(&path, target, within)?;
    }
    journal.append(&Line::Finished { version: target })
}

/// Waits until the core's checkpoint at `path` holds `version`.
fn wait_durable(path: &Path, version: u64, within: Duration) -> Result<(), JournalError> {
    let deadline = Instant::now() + within;
    loop {
        match CoreCheckpoint::peek_version(path) {
            Ok(v) if v >= version => return Ok(()),
            // Not written yet, or an older one: the core is writing it.
            Ok(_) => {}
            Err(e) if !path.exists() => tracing::debug!(error = %e, "no checkpoint yet"),
            Err(e) => {
                return Err(JournalError::Checkpoint {
                    path: path.to_owned(),
                    why: e.to_string(),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(JournalError::Checkpoint {
                path: path.to_owned(),
                why: format!(
                    "the last update's checkpoint (version {version}) was not durable within {} s",
                    within.as_secs()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Journals the updates an in-process run's trainers publish (the
/// backends' shared list), from a thread of its own, as they appear; a
/// journal write that fails is kept and returned by [`Follower::stop`].
pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(RunJournal, Result<(), JournalError>)>,
}

impl Follower {
    /// Follows `updates`, and with each journaled update the reward
    /// tallies of `workspaces`.
    pub fn spawn(
        mut journal: RunJournal,
        updates: Arc<Mutex<Vec<UpdateSummary>>>,
        workspaces: Arc<Workspaces>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = 0;
            let mut rewards = RewardsSeen::default();
            loop {
                let last = stopping.load(Ordering::Acquire);
                let new: Vec<UpdateSummary> = lock(&updates)[seen..].to_vec();
                let written = new
                    .iter()
                    .try_for_each(|u| journal.append(&Line::Update(*u)))
                    .and_then(|()| {
                        if new.is_empty() && !last {
                            return Ok(());
                        }
                        rewards.journal(&mut journal, workspaces.stats())
                    });
                if let Err(e) = written {
                    // Said now, not only at the end: the run trains on,
                    // but a crash from here on resumes with less history.
                    tracing::error!(error = %e, "the run journal could not be written; journaling stops");
                    return (journal, Err(e));
                }
                seen += new.len();
                if last {
                    return (journal, Ok(()));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { stop, thread }
    }

    /// Journals what is left and hands the journal back.
    pub fn stop(self) -> Result<RunJournal, JournalError> {
        self.stop.store(true, Ordering::Release);
        match self.thread.join() {
            Ok((journal, Ok(()))) => Ok(journal),
            Ok((_, Err(e))) => Err(e),
            Err(_) => Err(JournalError::Bad {
                path: PathBuf::from(FILE),
                line: 0,
                why: "the journal's thread panicked".into(),
            }),
        }
    }
}

/// The journal, open for appending.
#[derive(Debug)]
pub struct RunJournal {
    path: PathBuf,
    file: File,
}

/// The digest a journal names its run's configuration by.
pub fn config_digest(config_toml: &str) -> String {
    let d = Sha256::digest(config_toml.as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// What the head before this resume journaled, judged by the core's last
/// word; `None` without a journal of this run.
fn lost_head(dir: &Path, digest: &str) -> Result<Option<LostHead>, JournalError> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let lines = parse(&path, &text)?;
    if !matches!(lines.first(), Some(Line::Run { config, .. }) if config == digest) {
        // Refused, naming why, by the resume itself.
        return Ok(None);
    }
    let mut lost = LostHead {
        incarnation: 0,
        started: 0,
        updates: BTreeSet::new(),
        sealed: BTreeSet::new(),
    };
    for line in &lines[1..] {
        match line {
            Line::Resume { version, .. } => {
                lost = LostHead {
                    incarnation: lost.incarnation + 1,
                    started: *version,
                    updates: BTreeSet::new(),
                    sealed: BTreeSet::new(),
                };
            }
            Line::Update(u) => {
                // A core restored mid-run makes versions again: the ones
                // past it were rolled back.
                lost.updates.retain(|v| *v < u.version);
                lost.updates.insert(u.version);
            }
            Line::Sealed {
                incarnation, step, ..
            } if *incarnation == lost.incarnation => {
                lost.sealed.insert(*step);
            }
            _ => {}
        }
    }
    Ok(Some(lost))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

impl RunJournal {
    /// A new run's journal in `dir`, which must hold no earlier run's
    /// journal or core checkpoint (a later restore would load it).
    pub fn create(dir: &Path, digest: &str, target_steps: u64) -> Result<Self, JournalError> {
        for (name, what) in [
            (FILE, "journal (run.jsonl)"),
            ("core.ckpt", "core checkpoint (core.ckpt)"),
        ] {
            if dir.join(name).exists() {
                return Err(JournalError::Occupied {
                    dir: dir.to_owned(),
                    what,
                });
            }
        }
        Self::start(dir, digest, target_steps)
    }

    /// A journal with its first line, in `dir`, where none is.
    fn start(dir: &Path, digest: &str, target_steps: u64) -> Result<Self, JournalError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(FILE);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut j = Self { path, file };
        j.append(&Line::Run {
            config: digest.to_owned(),
            target_steps,
        })?;
        Ok(j)
    }

    /// Opens the journal in `dir` to resume the run from the checkpoint of
    /// `version`: checks it is this configuration's run, reads what it
    /// holds, and journals the resume. A missing journal (the head died
    /// before writing one, or the directory only held a checkpoint) starts
    /// a new one.
    pub fn resume(
        dir: &Path,
        digest: &str,
        target_steps: u64,
        version: u64,
    ) -> Result<(Self, Resumed), JournalError> {
        Self::resume_with(dir, digest, target_steps, version, &[])
    }

    /// [`RunJournal::resume`], first journaling `carried`: updates the
    /// lost head's core made that the lost head had not journaled (the
    /// core's last word, [`super::last_word`]).
    pub fn resume_with(
        dir: &Path,
        digest: &str,
        target_steps: u64,
        version: u64,
        carried: &[UpdateSummary],
    ) -> Result<(Self, Resumed), JournalError> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path)(e)),
        };
        let Some(text) = text else {
            let mut j = Self::start(dir, digest, target_steps)?;
            j.append(&Line::Resume {
                version,
                lost_updates: 0,
            })?;
            return Ok((j, Resumed::default()));
        };
        let mut lines = parse(&path, &text)?;
        lines.extend(carried.iter().map(|u| Line::Update(*u)));
        match lines.first() {
            Some(Line::Run { config, .. }) if config == digest => {}
            Some(Line::Run { config, .. }) => {
                return Err(JournalError::OtherRun {
                    path,
                    found: config.clone(),
                    want: digest.to_owned(),
                });
            }
            _ => {
                return Err(JournalError::Bad {
                    path,
                    line: 1,
                    why: "the first line is not the run's".into(),
                });
            }
        }
        let mut resumed = Resumed::default();
        let mut history: Vec<UpdateSummary> = Vec::new();
        let mut sealed: BTreeMap<u64, (u64, &[u64])> = BTreeMap::new();
        let mut published: Vec<Publication> = Vec::new();
        for line in &lines[1..] {
            match line {
                Line::Update(u) => {
                    // A version made again replaces what it named before.
                    history.retain(|x| x.version < u.version);
                    history.push(*u);
                }
                Line::Resume { lost_updates, .. } => {
                    resumed.resumes += 1;
                    resumed.lost_updates += lost_updates;
                }
                Line::Rewards { tallies } => {
                    resumed.rewards.extend(tallies.iter().copied());
                }
                // Finished at the target asked now: nothing left. A larger
                // target trains on from the final checkpoint.
                Line::Finished { version } if *version >= target_steps => {
                    return Err(JournalError::Finished {
                        path,
                        version: *version,
                    });
                }
                Line::Finished { .. } => {}
                Line::Run { .. } => {}
                // A step sealed again (after a resume) trained the new
                // batch, not the lost one.
                Line::Sealed {
                    incarnation,
                    step,
                    groups,
                } => {
                    sealed.insert(*step, (*incarnation, groups));
                }
                Line::Published(p) => {
                    published.retain(|x| x.version < p.version);
                    published.push(*p);
                }
            }
        }
        // The checkpoint's publication, or, if the lost head died before
        // the scheduler's word of it reached the journal, the newest
        // before it (the executions finished by then are kept).
        resumed.counters = published.into_iter().rev().find(|p| p.version <= version);
        // Step s makes version s + 1.
        resumed.trained = sealed
            .range(..version)
            .flat_map(|(_, (i, groups))| groups.iter().map(move |g| (*i, *g)))
            .collect();
        // Executions under versions past the checkpoint ran policies the
        // resume discards.
        resumed.rewards.retain(|v, _| *v <= version);
        let lost = history.iter().filter(|u| u.version > version).count() as u64;
        history.retain(|u| u.version <= version);
        resumed.updates = history;
        resumed.lost_updates += lost;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        // A torn last line would glue onto the next: cut it off.
        if !text.ends_with('\n') {
            let whole = text.rfind('\n').map_or(0, |i| i + 1);
            file.set_len(whole as u64).map_err(io(&path))?;
        }
        let mut j = Self { path, file };
        for u in carried {
            j.append(&Line::Update(*u))?;
        }
        j.append(&Line::Resume {
            version,
            lost_updates: lost,
        })?;
        Ok((j, resumed))
    }

    /// Appends `line` and syncs it, so it outlives this process.
    pub fn append(&mut self, line: &Line) -> Result<(), JournalError> {
        let mut bytes = serde_json::to_vec(line).map_err(|e| JournalError::Bad {
            path: self.path.clone(),
            line: 0,
            why: e.to_string(),
        })?;
        bytes.push(b'\n');
        self.file.write_all(&bytes).map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }
}

/// Every whole line of `text`; a torn last one (no newline, not JSON) is
/// what a crash mid-write leaves, and is skipped.
fn parse(path: &Path, text: &str) -> Result<Vec<Line>, JournalError> {
    let torn_tail = !text.ends_with('\n');
    let raw: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(raw.len());
    for (i, l) in raw.iter().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(l) {
            Ok(line) => out.push(line),
            Err(_) if torn_tail && i + 1 == raw.len() => {
                tracing::warn!(path = %path.display(), line = i + 1, "the journal's last line is torn (a crash mid-write); skipped");
            }
            Err(e) => {
                return Err(JournalError::Bad {
                    path: path.to_owned(),
                    line: i + 1,
                    why: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(version: u64) -> UpdateSummary {
        UpdateSummary::example(version)
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_resume_keeps_the_updates_up_to_the_checkpoint_and_counts_the_rest_lost() {
        let d = dir("resume");
        let mut j = RunJournal::create(&d, "abc", 10).unwrap();
        for v in 1..=5 {
            j.append(&Line::Update(update(v))).unwrap();
        }
        let tally = |scored, reward_sum| RewardTally { scored, reward_sum };
        j.append(&Line::Rewards {
            tallies: vec![(0, tally(4, 1.0)), (5, tally(2, 2.0))],
        })
        .unwrap();
        j.append(&Line::Rewards {
            tallies: vec![(0, tally(6, 1.5))],
        })
        .unwrap();
        drop(j);
        let (mut j, r) = RunJournal::resume(&d, "abc", 10, 4).unwrap();
        assert_eq!(
            r.updates.iter().map(|u| u.version).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // The last tally of a version wins; those past the checkpoint go.
        assert_eq!(
            r.rewards.clone().into_iter().collect::<Vec<_>>(),
            [(0, tally(6, 1.5))]
        );
        assert_eq!((r.lost_updates, r.resumes), (1, 0));
        // The second head makes 5 and 6 again, then dies; a third resumes
        // from 6: the first head's 5 is replaced, nothing more is lost.
        j.append(&Line::Update(update(5))).unwrap();
        j.append(&Line::Update(update(6))).unwrap();
        drop(j);
        let (_, r) = RunJournal::resume(&d, "abc", 10, 6).unwrap();
        assert_eq!(r.updates.len(), 6);
        assert_eq!((r.lost_updates, r.resumes), (1, 1));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_lost_heads_updates_are_those_its_core_still_holds() {
        let d = dir("lost-head");
        let mut j = RunJournal::create(&d, "abc", 10).unwrap();
        for v in 1..=3 {
            j.append(&Line::Update(update(v))).unwrap();
        }
        drop(j);
        let (mut j, _) = RunJournal::resume(&d, "abc", 10, 2).unwrap();
        // The second head: 3..=7, its core restored to 4 mid-run, then 5
        // and 6 made again before the head was lost.
        for v in (3..=7).chain(5..=6) {
            j.append(&Line::Sealed {
                incarnation: 1,
                step: v - 1,
                groups: vec![v],
            })
            .unwrap();
            j.append(&Line::Update(update(v))).unwrap();
        }
        drop(j);
        let lost = lost_head(&d, "abc").unwrap().unwrap();
        assert_eq!((lost.incarnation, lost.started), (1, 2));
        assert_eq!(lost.updates, (3..=6).collect());
        assert_eq!(lost.sealed, (2..=6).collect());
        assert_eq!(lost_head(&d, "another").unwrap(), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_counters_continue_from_the_publication_resumed_from() {
        let d = dir("counters");
        let published = |version, d, p, f| Publication {
            step: version - 1,
            version,
            dispatched: d,
            started: p,
            finished: f,
            core_stays: version % 2 == 0,
        };
        let mut j = RunJournal::create(&d, "abc", 10).unwrap();
        for v in 1..=5 {
            j.append(&Line::Update(update(v))).unwrap();
            j.append(&Line::Published(published(
                v,
                16 + 8 * v,
                12 + 8 * v,
                8 * v,
            )))
            .unwrap();
        }
        drop(j);
        let (mut j, r) = RunJournal::resume(&d, "abc", 10, 4).unwrap();
        assert_eq!(r.counters, Some(published(4, 48, 44, 32)));
        // The resumed head's scheduler counts from zero; the run's counters
        // keep the 32 executions finished by version 4, and the resumed
        // head journals them over the whole run.
        let now = published(5, 24, 20, 6);
        let whole = continued(r.counters.as_ref(), now);
        assert_eq!(
            (whole.dispatched, whole.started, whole.finished),
            (56, 52, 38)
        );
        assert_eq!(
            RunCounters::from(whole),
            RunCounters {
                dispatched: 56,
                started: 52,
                finished: 38,
                core_training: false,
            }
        );
        // Version 5 made again replaces the first head's; a resume from 6,
        // whose publication never reached the journal, starts from 5's.
        j.append(&Line::Update(update(5))).unwrap();
        j.append(&Line::Published(whole)).unwrap();
        j.append(&Line::Update(update(6))).unwrap();
        drop(j);
        let (_, r) = RunJournal::resume(&d, "abc", 10, 6).unwrap();
        assert_eq!(r.counters, Some(whole));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_groups_a_checkpointed_step_trained_are_the_last_sealing_of_it() {
        let d = dir("sealed");
        let mut j = RunJournal::create(&d, "abc", 10).unwrap();
        let seal = |incarnation, step, groups: &[u64]| Line::Sealed {
            incarnation,
            step,
            groups: groups.to_vec(),
        };
        for (step, groups) in [(0, [0, 1]), (1, [2, 3]), (2, [4, 5])] {
            j.append(&seal(0, step, &groups)).unwrap();
            j.append(&Line::Update(update(step + 1))).unwrap();
        }
        drop(j);
        // The checkpoint holds version 2: steps 0 and 1.
        let (mut j, r) = RunJournal::resume(&d, "abc", 10, 2).unwrap();
        let set = |v: &[(u64, u64)]| v.iter().copied().collect::<BTreeSet<_>>();
        assert_eq!(r.trained, set(&[(0, 0), (0, 1), (0, 2), (0, 3)]));
        // The resumed head seals step 2 again from its own groups.
        j.append(&seal(1, 2, &[0, 7])).unwrap();
        j.append(&Line::Update(update(3))).unwrap();
        drop(j);
        let (_, r) = RunJournal::resume(&d, "abc", 10, 3).unwrap();
        assert!(r.trained.contains(&(1, 7)) && r.trained.contains(&(1, 0)));
        assert!(!r.trained.contains(&(0, 4)), "the lost sealing of step 2");
        assert_eq!(r.trained.len(), 6);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_line_elsewhere_is_named() {
        let d = dir("torn");
        let mut j = RunJournal::create(&d, "abc", 10).unwrap();
        j.append(&Line::Update(update(1))).unwrap();
        drop(j);
        let path = d.join(FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"kind":"update","st"#).unwrap();
        drop(f);
        let (mut j, r) = RunJournal::resume(&d, "abc", 10, 1).unwrap();
        assert_eq!(r.updates.len(), 1);
        j.append(&Line::Update(update(2))).unwrap();
        drop(j);
        // The torn line was cut off, so the next resume reads every line.
        let (_, r) = RunJournal::resume(&d, "abc", 10, 2).unwrap();
        assert_eq!((r.updates.len(), r.resumes), (2, 1));
        // A bad line in the middle is refused, naming it.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("\"update\"", "\"upd\"", 1)).unwrap();
        let e = RunJournal::resume(&d, "abc", 10, 2).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A resume that cannot run (the checkpoint is at the target, the
    /// `finished` line never written) is refused and not journaled.
    #[test]
    fn a_resume_with_nothing_left_to_train_is_refused_and_not_journaled() {
        let d = dir("nothing-left");
        let mut cfg = EmbeddedConfig::tiny(1);
        cfg.sched.target_steps = 4;
        cfg.checkpoint.every = 2;
        cfg.checkpoint.dir = d.display().to_string();
        drop(open(&cfg, false).unwrap().journal);
        let ckpt = CoreCheckpoint {
            fingerprint: 1,
            step: 3,
            version: 4,
            adam_t: 4,
            params: vec![0.5; 4],
            moments: vec![0.0; 8],
        };
        ckpt.save(&d.join("core.ckpt")).unwrap();
        let before = std::fs::read_to_string(d.join(FILE)).unwrap();
        let e = open(&cfg, true).unwrap_err();
        assert!(e.to_string().contains("nothing left to train"), "{e}");
        assert_eq!(std::fs::read_to_string(d.join(FILE)).unwrap(), before);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn another_configuration_or_an_occupied_directory_is_refused() {
        let d = dir("other");
        drop(RunJournal::create(&d, "abc", 10).unwrap());
        let e = RunJournal::resume(&d, "xyz", 10, 0).unwrap_err();
        assert!(matches!(e, JournalError::OtherRun { .. }), "{e}");
        let e = RunJournal::create(&d, "abc", 10).unwrap_err();
        assert!(e.to_string().contains("--resume"), "{e}");
        let (mut j, _) = RunJournal::resume(&d, "abc", 10, 0).unwrap();
        j.append(&Line::Finished { version: 10 }).unwrap();
        drop(j);
        let e = RunJournal::resume(&d, "abc", 10, 10).unwrap_err();
        assert!(e.to_string().contains("nothing left to train"), "{e}");
        // Asked to train further, a finished run goes on.
        let (_, r) = RunJournal::resume(&d, "abc", 12, 10).unwrap();
        assert_eq!((r.resumes, r.lost_updates), (1, 0));
        let _ = std::fs::remove_dir_all(&d);
    }
}
