//! The folders of one execution: a fresh copy of the task's workspace, its
//! own HOME and temp dir, the prompt file; and the content hash that binds
//! a score to exactly the state that was scored.
//!
//! Layout under the run's work dir: `<exec>/workspace/` (the harness's
//! cwd, kept for the evaluator), `<exec>/home/`, `<exec>/tmp/` (removed
//! when the harness ends), `<exec>/prompt.md`. Logs live apart, under the
//! log dir, and outlive the execution on purpose.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The folders of one execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecDirs {
    pub root: PathBuf,
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub tmp: PathBuf,
    pub prompt_file: PathBuf,
}

impl ExecDirs {
    /// Makes `<work_root>/<label>/…`, copying `seed` into the workspace.
    /// A folder left by an earlier run under the same label is replaced.
    pub fn create(
        work_root: &Path,
        label: &str,
        seed: Option<&Path>,
        prompt: &str,
    ) -> std::io::Result<ExecDirs> {
        Self::create_at(work_root, label, None, seed, prompt)
    }

    /// Like [`ExecDirs::create`], with the workspace at `workspace` (a
    /// caller's own place for it, e.g. the gateway front's) when given.
    pub fn create_at(
        work_root: &Path,
        label: &str,
        workspace: Option<&Path>,
        seed: Option<&Path>,
        prompt: &str,
    ) -> std::io::Result<ExecDirs> {
        let root = work_root.join(label);
        for stale in [Some(root.as_path()), workspace].into_iter().flatten() {
            remove_if_present(stale)?;
        }
        let dirs = ExecDirs {
            workspace: workspace
                .map(Path::to_path_buf)
                .unwrap_or_else(|| root.join("workspace")),
            home: root.join("home"),
            tmp: root.join("tmp"),
            prompt_file: root.join("prompt.md"),
            root,
        };
        std::fs::create_dir_all(&dirs.home)?;
        std::fs::create_dir_all(&dirs.tmp)?;
        match seed {
            Some(src) => copy_tree(src, &dirs.workspace)?,
            None => std::fs::create_dir_all(&dirs.workspace)?,
        }
        std::fs::write(&dirs.prompt_file, prompt)?;
        Ok(dirs)
    }

    /// The folders [`ExecDirs::create_at`] made for `label` with its
    /// workspace at `workspace`, named again (nothing is created): a
    /// resumed head adopting the run tidies them when it ends.
    pub fn existing(work_root: &Path, label: &str, workspace: &Path) -> ExecDirs {
        let root = work_root.join(label);
        ExecDirs {
            workspace: workspace.to_path_buf(),
            home: root.join("home"),
            tmp: root.join("tmp"),
            prompt_file: root.join("prompt.md"),
            root,
        }
    }

    /// Removes HOME and the temp dir (the harness has ended).
    pub fn remove_scratch(&self) -> std::io::Result<()> {
        remove_if_present(&self.home)?;
        remove_if_present(&self.tmp)
    }

    /// Removes everything of this execution (after it was scored).
    pub fn remove_all(&self) -> std::io::Result<()> {
        remove_if_present(&self.root)
    }
}

fn remove_if_present(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Copies `src` into a new folder `dst`: files with their permission bits,
/// symlinks as symlinks (never followed), folders recursively.
pub fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else if kind.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            std::fs::copy(&from, &to)?;
        }
    }
    let mode = std::fs::metadata(src)?.permissions().mode();
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode | 0o700))
}

/// A SHA-256 over the workspace's content: every entry's relative path,
/// kind, executable bit, and file bytes or link target, in path order. Two
/// workspaces with the same files hash the same wherever they live.
pub fn content_hash(dir: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    hash_into(dir, Path::new(""), &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn hash_into(dir: &Path, rel: &Path, h: &mut Sha256) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        h.update(name.as_os_str().as_encoded_bytes());
        h.update([0]);
        if kind.is_symlink() {
            h.update(b"L");
            h.update(std::fs::read_link(&path)?.as_os_str().as_encoded_bytes());
        } else if kind.is_dir() {
            h.update(b"D");
            hash_into(&path, &name, h)?;
        } else {
            let exec = entry.metadata()?.permissions().mode() & 0o111 != 0;
            h.update(if exec { b"X" } else { b"F" });
            let mut f = std::fs::File::open(&path)?;
            let mut buf = [0u8; 64 * 1024];
            let mut len = 0u64;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                len += n as u64;
                h.update(&buf[..n]);
            }
            h.update(len.to_le_bytes());
        }
        h.update([0xff]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-ws-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn copies_fresh_and_hashes_content_not_location() {
        let d = temp("copy");
        let seed = d.join("seed");
        std::fs::create_dir_all(seed.join("sub")).unwrap();
        std::fs::write(seed.join("a.py"), "print(1)\n").unwrap();
        std::fs::write(seed.join("sub/run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            seed.join("sub/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("a.py", seed.join("link")).unwrap();
        let one = ExecDirs::create(&d.join("work"), "e1", Some(&seed), "do it").unwrap();
        let two = ExecDirs::create(&d.join("work"), "e2", Some(&seed), "do it").unwrap();
        assert_eq!(
            std::fs::read_link(one.workspace.join("link")).unwrap(),
            PathBuf::from("a.py")
        );
        let mode = std::fs::metadata(one.workspace.join("sub/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert_eq!(std::fs::read_to_string(&one.prompt_file).unwrap(), "do it");
        let h1 = content_hash(&one.workspace).unwrap();
        assert_eq!(h1, content_hash(&two.workspace).unwrap());
        assert_eq!(h1, content_hash(&seed).unwrap());
        std::fs::write(two.workspace.join("a.py"), "print(2)\n").unwrap();
        assert_ne!(h1, content_hash(&two.workspace).unwrap());
        std::fs::set_permissions(
            one.workspace.join("a.py"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_ne!(h1, content_hash(&one.workspace).unwrap(), "mode counts");
        one.remove_scratch().unwrap();
        assert!(!one.home.exists() && !one.tmp.exists() && one.workspace.exists());
        one.remove_all().unwrap();
        assert!(!one.root.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_empty_workspace_without_a_seed() {
        let d = temp("empty");
        let e = ExecDirs::create(&d, "x", None, "p").unwrap();
        assert_eq!(std::fs::read_dir(&e.workspace).unwrap().count(), 0);
        let again = ExecDirs::create(&d, "x", None, "p").unwrap();
        assert_eq!(e, again);
        // A caller's place for the workspace is emptied before the copy.
        let place = d.join("place");
        std::fs::create_dir_all(&place).unwrap();
        std::fs::write(place.join("stale.txt"), "old run").unwrap();
        let at = ExecDirs::create_at(&d, "y", Some(&place), None, "p").unwrap();
        assert_eq!(at.workspace, place);
        assert!(!place.join("stale.txt").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
