//! The core's last word: what the core's trainer leaves on disk when the
//! head it served is lost, so that the resumed head continues from the
//! surviving core's version instead of redoing the updates since the last
//! periodic checkpoint.
//!
//! The core's weights and AdamW state live in a node agent, not in the
//! head. When a cluster's head dies, that agent is usually alive: it holds
//! version v, possibly several updates past `core.ckpt` (written every S
//! steps). Before it drops what the head assigned it, it writes:
//! - `core.last.ckpt`: its state at v (only when v is past `core.ckpt`);
//! - `core.last.json`: the head incarnation it served, v, whether the
//!   checkpoint was saved, and the summaries of its updates past
//!   `core.ckpt` (the lost head may not have journaled the last of them).
//!
//! A head resumed with `--resume` takes the word before it reads the
//! checkpoint ([`take`]): only a word of the lost incarnation counts (an
//! older one names another lineage of the same version numbers), and only
//! if the journal holds, from the lost head, every step's sealing up to v
//! (a later resume must know which groups v trained) and every update up to
//! v but the few the word carries. Then `core.last.ckpt` becomes
//! `core.ckpt` (a rename, atomic) and the carried updates are journaled as
//! the lost head would have. Anything else leaves `core.ckpt` as it was:
//! the resume is the periodic checkpoint's, as without a word.
//!
//! The agent writes its word before it waits for a new head (or exits), so
//! a resumed head that finds the core's process alive waits a little for
//! it; a word that comes later is ignored by this head and consumed by the
//! next one only if it names that one's lost incarnation, which it cannot.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gyre_gpu::trainer::checkpoint::{CoreCheckpoint, write_atomic};
use serde::{Deserialize, Serialize};

use super::shared::{TrainerHandle, lock};
use super::trainer::UpdateSummary;

/// The word's checkpoint, beside `core.ckpt`.
pub const CKPT: &str = "core.last.ckpt";
/// The word itself, written after its checkpoint.
pub const WORD: &str = "core.last.json";
/// How many of the core's latest updates it keeps to carry in its word.
const KEPT: usize = 64;

/// What `core.last.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Word {
    /// The head incarnation the core served when that head was lost.
    pub incarnation: u64,
    /// The core's version then.
    pub version: u64,
    /// Whether `core.last.ckpt` holds it (false: `core.ckpt` already did).
    pub saved: bool,
    /// The core's updates past `core.ckpt`, oldest first.
    pub updates: Vec<UpdateSummary>,
}

/// The core's latest update summaries, newest last: a version made again
/// after a restore replaces what it named before.
#[derive(Debug, Clone, Default)]
pub struct RecentUpdates(Arc<Mutex<VecDeque<UpdateSummary>>>);

impl RecentUpdates {
    pub fn push(&self, u: UpdateSummary) {
        let mut q = lock(&self.0);
        q.retain(|x| x.version < u.version);
        q.push_back(u);
        while q.len() > KEPT {
            q.pop_front();
        }
    }

    /// The kept updates with versions in `(after, upto]`, oldest first,
    /// if they are all there.
    fn between(&self, after: u64, upto: u64) -> Option<Vec<UpdateSummary>> {
        let got: Vec<UpdateSummary> = lock(&self.0)
            .iter()
            .filter(|u| u.version > after && u.version <= upto)
            .copied()
            .collect();
        let whole = got.iter().map(|u| u.version).eq(after + 1..=upto);
        whole.then_some(got)
    }
}

/// What the core's node agent needs to say its last word.
#[derive(Clone)]
pub struct CoreLastWord {
    trainer: TrainerHandle,
    recent: RecentUpdates,
    dir: PathBuf,
}

impl std::fmt::Debug for CoreLastWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreLastWord")
            .field("dir", &self.dir)
            .finish()
    }
}

impl CoreLastWord {
    /// The core's word, written to `ckpt`'s directory.
    pub fn new(trainer: TrainerHandle, recent: RecentUpdates, ckpt: &Path) -> Self {
        let dir = match ckpt.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        Self {
            trainer,
            recent,
            dir,
        }
    }

    /// Writes the word for the head of `incarnation`, just lost. The
    /// trainer's lock is held throughout, so the state saved is one the
    /// core published (an update in progress finishes first, and none
    /// starts after).
    pub fn say(&self, incarnation: u64) -> Result<Word, String> {
        let mut t = lock(&self.trainer);
        let version = t.version();
        let durable = CoreCheckpoint::peek_version(&self.dir.join("core.ckpt")).unwrap_or(0);
        let saved = version > durable;
        if saved {
            let c = match t.checkpoint(version.saturating_sub(1)) {
                Ok(c) => c,
                // Parked on the host while the core serves: bring it back
                // for the read, and park it again.
                Err(_) => {
                    t.restore_memory().map_err(|e| e.to_string())?;
                    let c = t.checkpoint(version.saturating_sub(1));
                    t.release_memory().map_err(|e| e.to_string())?;
                    c.map_err(|e| e.to_string())?
                }
            };
            c.save(&self.dir.join(CKPT)).map_err(|e| e.to_string())?;
        }
        let word = Word {
            incarnation,
            version,
            saved,
            updates: self.recent.between(durable, version).unwrap_or_default(),
        };
        let text = serde_json::to_vec(&word).map_err(|e| e.to_string())?;
        write_atomic(&self.dir.join(WORD), &text).map_err(|e| e.to_string())?;
        Ok(word)
    }
}

/// What the lost head journaled, as [`take`] judges a word by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostHead {
    /// Its incarnation (0 for the run's first head, n for its n-th resume).
    pub incarnation: u64,
    /// The version it started from.
    pub started: u64,
    /// The versions it journaled updates of (past `started`).
    pub updates: std::collections::BTreeSet<u64>,
    /// The steps it journaled a sealing of.
    pub sealed: std::collections::BTreeSet<u64>,
}

/// What became of the core's word, for the resume's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastWordReport {
    /// The version the core said it held.
    pub version: u64,
    /// Whether the resume starts from it (from `core.last.ckpt`, or from
    /// `core.ckpt` where that already held it).
    pub taken: bool,
    /// Updates the word carried that the lost head had not journaled.
    pub journaled: u64,
    /// Why it was not taken.
    pub why: Option<String>,
}

/// A word taken: the resume's report of it and the updates to journal
/// before the resume.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub report: LastWordReport,
    pub journal: Vec<UpdateSummary>,
}

/// Reads the core's word in `dir` for the resume of `lost`: waits up to
/// `wait` for a word of the lost incarnation while `alive` says the core's
/// process still runs, then judges it. A word taken has moved
/// `core.last.ckpt` to `core.ckpt` when it saved one; the word is removed
/// whatever the outcome, so no later resume reads it again.
pub fn take(
    dir: &Path,
    lost: &LostHead,
    wait: Duration,
    alive: &dyn Fn() -> bool,
) -> Result<Option<Taken>, String> {
    let path = dir.join(WORD);
    let deadline = Instant::now() + wait;
    // `Err`: a word that does not parse (it is written atomically, so
    // only damage on disk makes one): refused, not fatal to the resume.
    let word = loop {
        let read = match std::fs::read(&path) {
            Ok(bytes) => Some(
                serde_json::from_slice::<Word>(&bytes)
                    .map_err(|e| format!("{} does not parse: {e}", path.display())),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        match read {
            Some(Ok(w)) if w.incarnation == lost.incarnation => break Some(Ok(w)),
            Some(Err(why)) => break Some(Err(why)),
            _ if Instant::now() < deadline && alive() => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => break None,
        }
    };
    let consumed = |promote: bool| -> Result<(), String> {
        let ckpt = dir.join(CKPT);
        if promote {
            std::fs::rename(&ckpt, dir.join("core.ckpt"))
                .map_err(|e| format!("{}: {e}", ckpt.display()))?;
        } else if let Err(e) = std::fs::remove_file(&ckpt)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(format!("{}: {e}", ckpt.display()));
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: {e}", path.display()))
            }
            _ => Ok(()),
        }
    };
    let word = match word {
        Some(Ok(word)) => word,
        Some(Err(why)) => {
            consumed(false)?;
            return Ok(Some(Taken {
                report: LastWordReport {
                    version: 0,
                    taken: false,
                    journaled: 0,
                    why: Some(why),
                },
                journal: Vec::new(),
            }));
        }
        None => {
            // A stale word (an earlier lineage's) must not outlive this
            // resume.
            if path.exists() {
                consumed(false)?;
            }
            return Ok(None);
        }
    };
    let durable = CoreCheckpoint::peek_version(&dir.join("core.ckpt")).unwrap_or(0);
    // The word's checkpoint replaces `core.ckpt` only once it is known
    // whole (its digest) and of the word's version: a bad one must not
    // cost the good periodic checkpoint.
    let judged = judge(&word, lost, durable).and_then(|journal| {
        if word.saved {
            verify(&dir.join(CKPT), word.version)?;
        }
        Ok(journal)
    });
    consumed(judged.is_ok() && word.saved)?;
    let report = |taken: bool, journaled: u64, why: Option<String>| LastWordReport {
        version: word.version,
        taken,
        journaled,
        why,
    };
    Ok(Some(match judged {
        Ok(journal) => Taken {
            report: report(true, journal.len() as u64, None),
            journal,
        },
        Err(why) => Taken {
            report: report(false, 0, Some(why)),
            journal: Vec::new(),
        },
    }))
}

/// Whether the checkpoint at `path` loads (whole, by its digest) and
/// holds `version`.
fn verify(path: &Path, version: u64) -> Result<(), String> {
    let c = CoreCheckpoint::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if c.version != version {
        return Err(format!(
            "{} holds version {}, the word says {version}",
            path.display(),
            c.version
        ));
    }
    Ok(())
}

/// Whether `word` can be resumed from, with `core.ckpt` at `durable`: the
/// updates it carries that the journal lacks, or why not.
fn judge(word: &Word, lost: &LostHead, durable: u64) -> Result<Vec<UpdateSummary>, String> {
    let v = word.version;
    if !word.saved {
        return Ok(Vec::new());
    }
    if v <= durable {
        return Err(format!("version {v} is not past core.ckpt's {durable}"));
    }
    if v <= lost.started {
        return Err(format!(
            "version {v} is not past the lost head's start ({})",
            lost.started
        ));
    }
    // Step s makes version s + 1.
    if let Some(s) = (lost.started..v).find(|s| !lost.sealed.contains(s)) {
        return Err(format!("the journal holds no sealing of step {s}"));
    }
    let carried: std::collections::BTreeMap<u64, UpdateSummary> =
        word.updates.iter().map(|u| (u.version, *u)).collect();
    let mut journal = Vec::new();
    for version in lost.started + 1..=v {
        if lost.updates.contains(&version) {
            continue;
        }
        match carried.get(&version) {
            Some(u) => journal.push(*u),
            None => {
                return Err(format!(
                    "the journal holds no update {version}, and the word does not carry it"
                ));
            }
        }
    }
    // Journaled updates stop where the word's do: one past it would be a
    // version the word does not hold.
    if let Some(past) = lost.updates.range(v + 1..).next() {
        return Err(format!(
            "the journal holds update {past}, past the word's {v}"
        ));
    }
    Ok(journal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(version: u64) -> UpdateSummary {
        UpdateSummary::example(version)
    }

    fn lost(started: u64, journaled: u64) -> LostHead {
        LostHead {
            incarnation: 1,
            started,
            updates: (started + 1..=journaled).collect(),
            // The next step's batch is sealed before this update lands.
            sealed: (started..journaled + 2).collect(),
        }
    }

    fn word(version: u64, carried: &[u64]) -> Word {
        Word {
            incarnation: 1,
            version,
            saved: true,
            updates: carried.iter().map(|v| update(*v)).collect(),
        }
    }

    #[test]
    fn a_word_at_the_journals_newest_update_is_taken_as_is() {
        assert_eq!(judge(&word(7, &[5, 6, 7]), &lost(2, 7), 4), Ok(Vec::new()));
    }

    #[test]
    fn updates_the_lost_head_had_not_journaled_are_carried_into_the_journal() {
        // The core published 8 and 9; the head died before journaling them.
        assert_eq!(
            judge(&word(9, &[5, 6, 7, 8, 9]), &lost(2, 7), 4),
            Ok(vec![update(8), update(9)])
        );
        // Without the summaries the journal would have a hole: refused.
        let why = judge(&word(9, &[9]), &lost(2, 7), 4).unwrap_err();
        assert!(why.contains("no update 8"), "{why}");
    }

    #[test]
    fn a_word_the_journal_cannot_place_is_refused_naming_why() {
        let why = judge(&word(4, &[]), &lost(2, 7), 4).unwrap_err();
        assert!(why.contains("not past core.ckpt"), "{why}");
        let why = judge(&word(6, &[5, 6]), &lost(2, 7), 4).unwrap_err();
        assert!(why.contains("update 7, past"), "{why}");
        let mut unsealed = lost(2, 7);
        unsealed.sealed.remove(&5);
        let why = judge(&word(7, &[]), &unsealed, 4).unwrap_err();
        assert!(why.contains("sealing of step 5"), "{why}");
    }

    fn checkpoint(v: u64) -> CoreCheckpoint {
        CoreCheckpoint {
            fingerprint: 1,
            step: v.saturating_sub(1),
            version: v,
            adam_t: v,
            params: vec![0.0; 4],
            moments: vec![0.0; 8],
        }
    }

    /// A directory with `word`, its checkpoint (of the word's version) and
    /// `core.ckpt` of `ckpt_version`.
    fn dir_with(word: &Word, ckpt_version: Option<u64>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(WORD), serde_json::to_vec(word).unwrap()).unwrap();
        checkpoint(word.version).save(&d.path().join(CKPT)).unwrap();
        if let Some(v) = ckpt_version {
            checkpoint(v).save(&d.path().join("core.ckpt")).unwrap();
        }
        d
    }

    fn durable(d: &tempfile::TempDir) -> u64 {
        CoreCheckpoint::peek_version(&d.path().join("core.ckpt")).unwrap()
    }

    #[test]
    fn a_taken_word_becomes_core_ckpt_and_is_consumed() {
        let d = dir_with(&word(8, &[7, 8]), Some(4));
        let taken = take(d.path(), &lost(2, 6), Duration::ZERO, &|| false)
            .unwrap()
            .unwrap();
        assert!(taken.report.taken, "{taken:?}");
        assert_eq!(taken.journal, vec![update(7), update(8)]);
        assert_eq!(durable(&d), 8);
        assert!(!d.path().join(WORD).exists() && !d.path().join(CKPT).exists());
        // Consumed: a second resume finds no word.
        assert_eq!(
            take(d.path(), &lost(2, 8), Duration::ZERO, &|| false).unwrap(),
            None
        );
    }

    #[test]
    fn another_incarnations_word_is_not_taken_and_does_not_outlive_the_resume() {
        let mut old = word(8, &[7, 8]);
        old.incarnation = 0;
        let d = dir_with(&old, Some(4));
        assert_eq!(
            take(d.path(), &lost(2, 8), Duration::ZERO, &|| false).unwrap(),
            None
        );
        assert_eq!(
            CoreCheckpoint::peek_version(&d.path().join("core.ckpt")).unwrap(),
            4
        );
        assert!(!d.path().join(WORD).exists() && !d.path().join(CKPT).exists());
    }

    #[test]
    fn a_refused_word_leaves_core_ckpt_as_it_was() {
        let d = dir_with(&word(9, &[9]), Some(4));
        let taken = take(d.path(), &lost(2, 7), Duration::ZERO, &|| false)
            .unwrap()
            .unwrap();
        assert!(!taken.report.taken);
        assert!(taken.report.why.unwrap().contains("no update 8"));
        assert_eq!(
            CoreCheckpoint::peek_version(&d.path().join("core.ckpt")).unwrap(),
            4
        );
        assert!(!d.path().join(WORD).exists() && !d.path().join(CKPT).exists());
    }

    #[test]
    fn the_resume_waits_for_a_living_cores_word_and_not_for_a_dead_ones() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        assert_eq!(
            take(d.path(), &lost(2, 6), Duration::from_secs(5), &|| false).unwrap(),
            None
        );
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "waited for a dead core"
        );
        let path = d.path().to_owned();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            checkpoint(6).save(&path.join(CKPT)).unwrap();
            let w = serde_json::to_vec(&word(6, &[])).unwrap();
            std::fs::write(path.join(WORD), w).unwrap();
        });
        let taken = take(d.path(), &lost(2, 6), Duration::from_secs(10), &|| true)
            .unwrap()
            .unwrap();
        writer.join().unwrap();
        assert!(taken.report.taken, "{taken:?}");
        assert_eq!(durable(&d), 6);
    }

    #[test]
    fn a_damaged_word_or_checkpoint_is_refused_and_core_ckpt_kept() {
        // A word that does not parse: refused naming the file, the resume
        // goes on from core.ckpt.
        let d = dir_with(&word(8, &[7, 8]), Some(4));
        std::fs::write(d.path().join(WORD), b"{\"incarnation\": 1, \"vers").unwrap();
        let taken = take(d.path(), &lost(2, 6), Duration::ZERO, &|| false)
            .unwrap()
            .unwrap();
        assert!(!taken.report.taken);
        let why = taken.report.why.unwrap();
        assert!(
            why.contains(WORD) && why.contains("does not parse"),
            "{why}"
        );
        assert_eq!(durable(&d), 4);
        assert!(!d.path().join(WORD).exists() && !d.path().join(CKPT).exists());
        // A checkpoint cut short, or of another version: refused, and
        // core.ckpt is not replaced by it.
        for bad in ["cut", "other version"] {
            let d = dir_with(&word(8, &[7, 8]), Some(4));
            let ckpt = d.path().join(CKPT);
            if bad == "cut" {
                let bytes = std::fs::read(&ckpt).unwrap();
                std::fs::write(&ckpt, &bytes[..bytes.len() - 3]).unwrap();
            } else {
                checkpoint(7).save(&ckpt).unwrap();
            }
            let taken = take(d.path(), &lost(2, 6), Duration::ZERO, &|| false)
                .unwrap()
                .unwrap();
            assert!(!taken.report.taken, "{bad}: {taken:?}");
            assert!(taken.journal.is_empty());
            let why = taken.report.why.unwrap();
            assert!(why.contains(CKPT), "{bad}: {why}");
            assert_eq!(durable(&d), 4, "{bad}");
        }
    }

    #[test]
    fn recent_updates_replace_a_version_made_again_and_must_be_whole() {
        let r = RecentUpdates::default();
        for v in 1..=6 {
            r.push(update(v));
        }
        // A restore to 4 makes 5 again.
        let mut again = update(5);
        again.loss = 0.25;
        r.push(again);
        assert_eq!(r.between(3, 5), Some(vec![update(4), again]));
        assert_eq!(r.between(3, 6), None, "6 was rolled back");
        assert_eq!(r.between(5, 5), Some(Vec::new()));
    }
}
