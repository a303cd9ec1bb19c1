//! Harness processes a killed head left behind. A head that dies by
//! kill -9 cannot end the harnesses it started: each runs in a process
//! group of its own and outlives it, still calling a gateway that is gone
//! and writing into a workspace no evaluator will read. Every harness gets
//! [`RUN_VAR`] (its run's journal folder) in its environment, which its
//! children inherit; the next head of that run (`--resume`) finds them by
//! it in /proc and kills them before it starts its own.
//!
//! Matching the environment rather than recorded process ids cannot hit
//! an unrelated process that reused an id, and finds a harness's own
//! children too. Where /proc is not there (not Linux), nothing is found.

use std::collections::BTreeSet;
use std::path::Path;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid, getpgrp};

/// The environment variable naming the run a harness belongs to.
pub const RUN_VAR: &str = "GYRE_RUN";

/// The processes whose environment holds `GYRE_RUN=<run>`, this one left
/// out (it never does, but a user's wrapper might export it).
pub fn find(run: &str) -> Vec<Pid> {
    let wanted = format!("{RUN_VAR}={run}");
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Gone, a zombie, or not ours to read: not one of the run's.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) {
            if let Ok(pid) = i32::try_from(pid) {
                found.push(Pid::from_raw(pid));
            }
        }
    }
    found
}

/// Kills (SIGKILL) every process of `run`, with the process group of each
/// that leads one (a harness's stragglers); returns how many processes
/// were found. The caller's own group is never signalled as a group.
pub fn reap(run: &str) -> usize {
    let procs = find(run);
    let ours = getpgrp();
    let mut groups = BTreeSet::new();
    for &pid in &procs {
        match getpgid(Some(pid)) {
            Ok(g) if g == pid && g != ours => {
                groups.insert(g.as_raw());
            }
            _ => {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
    }
    for g in groups {
        let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
    }
    if !procs.is_empty() {
        tracing::warn!(
            run,
            processes = procs.len(),
            "killed the harness processes an earlier head of this run left behind"
        );
    }
    procs.len()
}

/// The run tag of a run whose journal (or, without one, workspaces) live
/// in `dir`: its absolute path, so a resume given a relative one matches.
pub fn tag_of(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn alive(pid: Pid) -> bool {
        // A killed child stays a zombie until waited for: count it gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    }

    #[test]
    fn the_processes_of_a_run_and_their_groups_are_killed_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let run = tag_of(dir.path());
        // A harness leading its own group, with a straggler in the group
        // that has the variable too, and an unrelated process.
        let mut harness = Command::new("sh")
            .args(["-c", "sleep 300 & exec sleep 300"])
            .env(RUN_VAR, &run)
            .process_group(0)
            .spawn()
            .unwrap();
        let mut other = Command::new("sleep")
            .arg("300")
            .env(RUN_VAR, format!("{run}-other"))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while find(&run).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let found = find(&run);
        assert_eq!(found.len(), 2, "the harness and its straggler: {found:?}");
        assert_eq!(reap(&run), 2);
        let _ = harness.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while found.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(found.iter().all(|&p| !alive(p)), "{found:?} still alive");
        let other_pid = Pid::from_raw(other.id() as i32);
        assert!(alive(other_pid), "another run's process was killed");
        assert_eq!(reap(&run), 0);
        let _ = other.kill();
        let _ = other.wait();
    }
}
