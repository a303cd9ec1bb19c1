//! The head's journal, `<checkpoint dir>/head.jsonl`: what a restarted head
//! needs to resume a run its predecessor lost (`gyre train --cluster …
//! --resume`).
//!
//! The core's checkpoint (`core.ckpt`) already holds what the model is:
//! weights, optimizer state, step and version. The journal holds what the
//! run *did*: which configuration it runs (a digest, so a resume with
//! another configuration is refused), every update as it was published,
//! and every resume. A restarted head keeps the updates up to the
//! checkpoint's version and counts the ones after it as lost: the core
//! makes them again from the checkpoint, so the report's history holds one
//! update per version, as for a core restored mid-run.
//!
//! Append-only JSON lines, each written whole and synced before the head
//! goes on, so a crash leaves at most a torn last line, which is ignored
//! (and logged); a bad line anywhere else is refused, naming it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::embedded::trainer::UpdateSummary;

/// The journal's file name in the checkpoint directory.
pub const FILE: &str = "head.jsonl";

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
    /// The run trained its last step (and, where one was due, the core's
    /// checkpoint of it is durable): there is nothing to resume.
    Finished { version: u64 },
}

/// What an earlier head journaled, as a resumed head starts from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resumed {
    /// The updates up to the checkpoint's version, one per version.
    pub updates: Vec<UpdateSummary>,
    /// Updates journaled after the checkpoint's version (made again), over
    /// every earlier head.
    pub lost_updates: u64,
    /// Heads that resumed the run before this one.
    pub resumes: u64,
}

/// The journal, open for appending.
#[derive(Debug)]
pub struct HeadJournal {
    path: PathBuf,
    file: File,
}

/// The digest a journal names its run's configuration by.
pub fn config_digest(config_toml: &str) -> String {
    let d = Sha256::digest(config_toml.as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

impl HeadJournal {
    /// A new run's journal in `dir`, which must hold no earlier run's
    /// journal or core checkpoint (a later restore would load it).
    pub fn create(dir: &Path, digest: &str, target_steps: u64) -> Result<Self, JournalError> {
        for (name, what) in [
            (FILE, "journal (head.jsonl)"),
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
        let lines = parse(&path, &text)?;
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
                Line::Finished { version } => {
                    return Err(JournalError::Finished {
                        path,
                        version: *version,
                    });
                }
                Line::Run { .. } => {}
            }
        }
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
        UpdateSummary {
            step: version - 1,
            version,
            loss: 0.5,
            grad_norm: 1.0,
            clipped: false,
            micro_steps: 2,
            targets: 10,
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_resume_keeps_the_updates_up_to_the_checkpoint_and_counts_the_rest_lost() {
        let d = dir("resume");
        let mut j = HeadJournal::create(&d, "abc", 10).unwrap();
        for v in 1..=5 {
            j.append(&Line::Update(update(v))).unwrap();
        }
        drop(j);
        let (mut j, r) = HeadJournal::resume(&d, "abc", 10, 4).unwrap();
        assert_eq!(
            r.updates.iter().map(|u| u.version).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!((r.lost_updates, r.resumes), (1, 0));
        // The second head makes 5 and 6 again, then dies; a third resumes
        // from 6: the first head's 5 is replaced, nothing more is lost.
        j.append(&Line::Update(update(5))).unwrap();
        j.append(&Line::Update(update(6))).unwrap();
        drop(j);
        let (_, r) = HeadJournal::resume(&d, "abc", 10, 6).unwrap();
        assert_eq!(r.updates.len(), 6);
        assert_eq!((r.lost_updates, r.resumes), (1, 1));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_line_elsewhere_is_named() {
        let d = dir("torn");
        let mut j = HeadJournal::create(&d, "abc", 10).unwrap();
        j.append(&Line::Update(update(1))).unwrap();
        drop(j);
        let path = d.join(FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"kind":"update","st"#).unwrap();
        drop(f);
        let (mut j, r) = HeadJournal::resume(&d, "abc", 10, 1).unwrap();
        assert_eq!(r.updates.len(), 1);
        j.append(&Line::Update(update(2))).unwrap();
        drop(j);
        // The torn line was cut off, so the next resume reads every line.
        let (_, r) = HeadJournal::resume(&d, "abc", 10, 2).unwrap();
        assert_eq!((r.updates.len(), r.resumes), (2, 1));
        // A bad line in the middle is refused, naming it.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("\"update\"", "\"upd\"", 1)).unwrap();
        let e = HeadJournal::resume(&d, "abc", 10, 2).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn another_configuration_or_an_occupied_directory_is_refused() {
        let d = dir("other");
        drop(HeadJournal::create(&d, "abc", 10).unwrap());
        let e = HeadJournal::resume(&d, "xyz", 10, 0).unwrap_err();
        assert!(matches!(e, JournalError::OtherRun { .. }), "{e}");
        let e = HeadJournal::create(&d, "abc", 10).unwrap_err();
        assert!(e.to_string().contains("--resume"), "{e}");
        let (mut j, _) = HeadJournal::resume(&d, "abc", 10, 0).unwrap();
        j.append(&Line::Finished { version: 10 }).unwrap();
        drop(j);
        let e = HeadJournal::resume(&d, "abc", 10, 10).unwrap_err();
        assert!(e.to_string().contains("nothing left to train"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
