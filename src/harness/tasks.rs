//! The task set: one folder per query, and the seeded order queries are
//! drawn in.
//!
//! A task folder holds `prompt.md` (the task statement handed to the
//! harness), optionally `workspace/` (the starting files, copied fresh for
//! every execution) and optionally `hidden/` (tests or references for the
//! evaluator, never shown to the harness). Anything wrong with a folder is
//! refused at load time naming the path, before any process starts.
//!
//! A run usually needs more groups than the set has tasks, so queries are
//! drawn in epochs: each epoch is a fresh permutation of the whole set,
//! seeded by (run seed, epoch), so group `g` always gets the same task for a
//! seed, every task comes up once per epoch, and no order is privileged.

use std::path::{Path, PathBuf};

use gyre_runtime::rng::mix64;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// One query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The folder name.
    pub name: String,
    pub dir: PathBuf,
    pub prompt: String,
    pub workspace: Option<PathBuf>,
    pub hidden: Option<PathBuf>,
}

/// Why a task set was refused; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task set {path}: {why}")]
    Set { path: PathBuf, why: String },
    #[error("task folder {path}: {why}")]
    Folder { path: PathBuf, why: String },
}

/// The loaded tasks, in folder-name order.
#[derive(Debug, Clone)]
pub struct TaskSet {
    pub dir: PathBuf,
    pub tasks: Vec<Task>,
}

fn folder_err(path: &Path, why: impl Into<String>) -> TaskError {
    TaskError::Folder {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// `dir/name` if it exists, refused unless it is a directory.
fn optional_dir(dir: &Path, name: &str) -> Result<Option<PathBuf>, TaskError> {
    let p = dir.join(name);
    match std::fs::symlink_metadata(&p) {
        Err(_) => Ok(None),
        Ok(m) if m.is_dir() => Ok(Some(p)),
        Ok(_) => Err(folder_err(&p, format!("{name} must be a directory"))),
    }
}

impl Task {
    /// Loads one task folder.
    pub fn load(dir: &Path) -> Result<Task, TaskError> {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| folder_err(dir, "the folder name is not UTF-8"))?
            .to_string();
        let prompt_path = dir.join("prompt.md");
        let bytes = std::fs::read(&prompt_path)
            .map_err(|e| folder_err(&prompt_path, format!("cannot read prompt.md: {e}")))?;
        let prompt = String::from_utf8(bytes)
            .map_err(|_| folder_err(&prompt_path, "prompt.md is not UTF-8"))?;
        if prompt.trim().is_empty() {
            return Err(folder_err(&prompt_path, "prompt.md is empty"));
        }
        Ok(Task {
            name,
            dir: dir.to_path_buf(),
            prompt,
            workspace: optional_dir(dir, "workspace")?,
            hidden: optional_dir(dir, "hidden")?,
        })
    }
}

impl TaskSet {
    /// Loads every sub-folder of `dir` (hidden ones, starting with `.`,
    /// and plain files such as a README are skipped).
    pub fn load(dir: &Path) -> Result<TaskSet, TaskError> {
        let set_err = |why: String| TaskError::Set {
            path: dir.to_path_buf(),
            why,
        };
        let entries =
            std::fs::read_dir(dir).map_err(|e| set_err(format!("cannot read the folder: {e}")))?;
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| set_err(format!("cannot list the folder: {e}")))?;
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            }
        }
        dirs.sort();
        if dirs.is_empty() {
            return Err(set_err(
                "no task folders (each needs prompt.md, optionally workspace/ and hidden/)".into(),
            ));
        }
        let tasks = dirs
            .iter()
            .map(|d| Task::load(d))
            .collect::<Result<_, _>>()?;
        Ok(TaskSet {
            dir: dir.to_path_buf(),
            tasks,
        })
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// The seeded epoch order: which task the `i`-th group draws.
#[derive(Debug, Clone)]
pub struct Epochs {
    tasks: usize,
    seed: u64,
    /// The permutation of the last epoch asked for.
    cached: Option<(u64, Vec<usize>)>,
}

impl Epochs {
    /// `tasks` must be at least 1.
    pub fn new(tasks: usize, seed: u64) -> Self {
        Self {
            tasks: tasks.max(1),
            seed,
            cached: None,
        }
    }

    fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.tasks).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(mix64(self.seed ^ mix64(epoch)));
        order.shuffle(&mut rng);
        order
    }

    /// The task index of draw `i` (draws 0..n-1 are epoch 0, …).
    pub fn task_of(&mut self, i: u64) -> usize {
        let n = self.tasks as u64;
        let epoch = i / n;
        let pos = (i % n) as usize;
        if self.cached.as_ref().map(|(e, _)| *e) != Some(epoch) {
            self.cached = Some((epoch, self.permutation(epoch)));
        }
        match &self.cached {
            Some((_, order)) => order[pos],
            None => pos,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-tasks-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn loads_folders_in_order_and_skips_files() {
        let d = temp("ok");
        for t in ["b", "a"] {
            std::fs::create_dir_all(d.join(t).join("workspace")).unwrap();
            std::fs::write(d.join(t).join("prompt.md"), format!("task {t}")).unwrap();
        }
        std::fs::create_dir_all(d.join("a/hidden")).unwrap();
        std::fs::write(d.join("README.md"), "not a task").unwrap();
        std::fs::create_dir_all(d.join(".git")).unwrap();
        let set = TaskSet::load(&d).unwrap();
        let names: Vec<_> = set.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(set.tasks[0].hidden.is_some() && set.tasks[1].hidden.is_none());
        assert_eq!(set.tasks[1].prompt, "task b");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_folders_are_named() {
        let d = temp("bad");
        assert!(
            TaskSet::load(&d)
                .unwrap_err()
                .to_string()
                .contains("no task folders")
        );
        std::fs::create_dir_all(d.join("t1")).unwrap();
        let e = TaskSet::load(&d).unwrap_err().to_string();
        assert!(
            e.contains("t1/prompt.md") && e.contains("cannot read"),
            "{e}"
        );
        std::fs::write(d.join("t1/prompt.md"), "  \n").unwrap();
        let e = TaskSet::load(&d).unwrap_err().to_string();
        assert!(e.contains("prompt.md is empty"), "{e}");
        std::fs::write(d.join("t1/prompt.md"), [0xff, 0xfe]).unwrap();
        let e = TaskSet::load(&d).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        std::fs::write(d.join("t1/prompt.md"), "ok").unwrap();
        std::fs::write(d.join("t1/workspace"), "a file").unwrap();
        let e = TaskSet::load(&d).unwrap_err().to_string();
        assert!(
            e.contains("t1/workspace") && e.contains("must be a directory"),
            "{e}"
        );
        let missing = d.join("nope");
        let e = TaskSet::load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_seed_fixes_the_draws_and_another_changes_them() {
        let draws = |seed| {
            let mut e = Epochs::new(10, seed);
            (0..40).map(|i| e.task_of(i)).collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
        let d = draws(1);
        assert_ne!(d[..10], d[10..20], "epochs are reshuffled");
    }

    proptest! {
        #[test]
        fn every_epoch_is_a_permutation(n in 1usize..40, seed: u64, epoch in 0u64..5) {
            let mut e = Epochs::new(n, seed);
            let mut seen: Vec<usize> =
                (0..n as u64).map(|i| e.task_of(epoch * n as u64 + i)).collect();
            seen.sort();
            prop_assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
    }
}
