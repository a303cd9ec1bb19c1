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
//!
//! The same tag ends a run's harnesses when `gyre train` is stopped by
//! SIGINT (Ctrl-C) or SIGTERM: harness groups do not see the terminal's
//! signal, so a run being started [`watch`]es its tag and
//! [`end_on_signal`] reaps every watched tag before the process exits.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid, getpgrp};

/// The environment variable naming the run a harness belongs to.
pub const RUN_VAR: &str = "GYRE_RUN";

/// The processes whose environment holds `GYRE_RUN=<run>`, this one left
/// out (it never does, but a user's wrapper might export it).
pub fn find(run: &str) -> Vec<Pid> {
    scan(run).into_iter().map(|p| p.pid).collect()
}

/// One process of a run, as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunProcess {
    pub pid: Pid,
    /// Its `GYRE_EXECUTION`: the gateway execution whose harness it is
    /// (or a child of).
    pub execution: Option<String>,
}

/// The environment variable naming a harness's gateway execution.
pub const EXECUTION_VAR: &str = "GYRE_EXECUTION";

/// Every process of `run` with the execution it belongs to.
pub fn scan(run: &str) -> Vec<RunProcess> {
    let wanted = format!("{RUN_VAR}={run}");
    let exec_prefix = format!("{EXECUTION_VAR}=");
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
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        if !vars.contains(&wanted.as_bytes()) {
            continue;
        }
        let execution = vars
            .iter()
            .find_map(|v| v.strip_prefix(exec_prefix.as_bytes()))
            .map(|e| String::from_utf8_lossy(e).into_owned());
        if let Ok(pid) = i32::try_from(pid) {
            found.push(RunProcess {
                pid: Pid::from_raw(pid),
                execution,
            });
        }
    }
    found
}

/// Whether `pid` runs (not a zombie) and is still the harness of
/// `execution` of `run`: a process id reused by another process is not.
pub fn is_harness_of(pid: Pid, run: &str, execution: &str) -> bool {
    is_running(pid)
        && scan_one(pid).is_some_and(|vars| {
            vars.contains(&format!("{RUN_VAR}={run}"))
                && vars.contains(&format!("{EXECUTION_VAR}={execution}"))
        })
}

/// Whether `pid` runs: a killed process stays a zombie until its parent
/// waits for it, which counts as gone.
pub fn is_running(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn scan_one(pid: Pid) -> Option<Vec<String>> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect(),
    )
}

/// How many scans a reap makes at most, and the pause after each.
const REAP_ROUNDS: usize = 3;
const REAP_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// SIGKILL to each of `procs`, as a group for those that lead one (but
/// the caller's own group).
fn kill_with_groups(procs: &[Pid]) {
    let ours = getpgrp();
    let mut groups = BTreeSet::new();
    for &pid in procs {
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
}

/// The process-group leaders of `run`'s harnesses, by execution: the
/// process a launcher started (each harness leads a group of its own).
pub fn leaders(run: &str) -> std::collections::BTreeMap<String, Pid> {
    scan(run)
        .into_iter()
        .filter(|p| getpgid(Some(p.pid)).is_ok_and(|g| g == p.pid))
        .filter_map(|p| Some((p.execution?, p.pid)))
        .collect()
}

/// Kills (SIGKILL) every process of `run`, with the process group of each
/// that leads one (a harness's stragglers); returns how many processes
/// were found. The caller's own group is never signalled as a group.
pub fn reap(run: &str) -> usize {
    reap_pids(run, &BTreeSet::new()).len()
}

/// [`reap`], sparing the processes of the executions in `keep` (harnesses
/// a resumed head adopts).
pub fn reap_except(run: &str, keep: &BTreeSet<String>) -> usize {
    reap_pids(run, keep).len()
}

/// [`reap_except`], returning the processes it found (and killed).
fn reap_pids(run: &str, keep: &BTreeSet<String>) -> Vec<Pid> {
    let mut killed: BTreeSet<Pid> = BTreeSet::new();
    // Scanned again until a scan finds nothing new: a process in the
    // middle of an exec shows an empty environment for a moment, and one
    // may fork while the others are killed.
    for round in 0..REAP_ROUNDS {
        let procs: Vec<Pid> = scan(run)
            .into_iter()
            .filter(|p| p.execution.as_ref().is_none_or(|e| !keep.contains(e)))
            .map(|p| p.pid)
            .filter(|p| !killed.contains(p))
            .collect();
        if procs.is_empty() && round > 0 {
            break;
        }
        kill_with_groups(&procs);
        killed.extend(procs);
        std::thread::sleep(REAP_PAUSE);
    }
    let procs: Vec<Pid> = killed.into_iter().collect();
    if !procs.is_empty() {
        tracing::warn!(
            run,
            processes = procs.len(),
            "killed harness processes of this run"
        );
    }
    procs
}

/// The runs of this process whose harnesses a signal must end, each with
/// the temporary folder to remove with them (a run without `--run-dir`).
static WATCHED: Mutex<Vec<(u64, String, Option<PathBuf>)>> = Mutex::new(Vec::new());
static NEXT_WATCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A run's tag watched by [`end_on_signal`] while this lives.
#[must_use = "the run is watched only while the Watch lives"]
pub struct Watch(u64);

/// Watches `run` (and its temporary folder, if any) until the returned
/// [`Watch`] is dropped, which the run does once it has ended its
/// harnesses itself.
pub fn watch(run: &str, temporary: Option<&Path>) -> Watch {
    let id = NEXT_WATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    watched().push((id, run.to_string(), temporary.map(Path::to_path_buf)));
    Watch(id)
}

impl Drop for Watch {
    fn drop(&mut self) {
        watched().retain(|(id, _, _)| *id != self.0);
    }
}

fn watched() -> std::sync::MutexGuard<'static, Vec<(u64, String, Option<PathBuf>)>> {
    WATCHED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Processes this one started and waits for that carry no run tag (an
/// evaluator command), with whether each leads a group of its own: a
/// signal kills them too, or they would outlive the exit.
static CHILDREN: Mutex<BTreeSet<(u32, bool)>> = Mutex::new(BTreeSet::new());

/// A started process [`reap_watched`] kills, while this lives.
#[must_use = "the process is tracked only while the Tracked lives"]
pub struct Tracked((u32, bool));

/// Tracks `pid` (the leader of its own group if `group`) until the
/// returned [`Tracked`] is dropped, once the caller has waited for it.
pub fn track(pid: u32, group: bool) -> Tracked {
    children().insert((pid, group));
    Tracked((pid, group))
}

impl Drop for Tracked {
    fn drop(&mut self) {
        children().remove(&self.0);
    }
}

fn children() -> std::sync::MutexGuard<'static, BTreeSet<(u32, bool)>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills the tracked processes (each once: they stay tracked until their
/// waiter drops them); returns how many.
fn kill_tracked(done: &mut BTreeSet<(u32, bool)>) -> usize {
    let fresh: Vec<(u32, bool)> = children().difference(done).copied().collect();
    for &(pid, group) in &fresh {
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        let pid = Pid::from_raw(raw);
        let _ = if group {
            killpg(pid, Signal::SIGKILL)
        } else {
            kill(pid, Signal::SIGKILL)
        };
    }
    done.extend(fresh.iter().copied());
    fresh.len()
}

static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is ending its runs on a signal: launchers start no
/// harness any more (one started now would outlive the exit).
pub fn stopping() -> bool {
    STOPPING.load(std::sync::atomic::Ordering::SeqCst)
}

/// Stops harness and evaluator launches, kills the harnesses of every
/// watched run and every [`track`]ed process, and removes the runs'
/// temporary folders; returns how many processes were killed. A launch
/// that passed its [`stopping`] check just before may still be between
/// fork and exec (its environment not yet the run's, or not yet tracked),
/// so the scans go on until a few in a row find nothing.
pub fn reap_watched() -> usize {
    STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
    let runs: Vec<_> = watched().clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut quiet = 0;
    // A killed process may still be found by the next scan (it takes a
    // moment to die): it keeps the scans going but is counted once.
    let (mut killed, mut done) = (BTreeSet::new(), BTreeSet::new());
    while quiet < 3 && std::time::Instant::now() < deadline {
        let found: Vec<Pid> = runs
            .iter()
            .flat_map(|(_, run, _)| reap_pids(run, &BTreeSet::new()))
            .collect();
        let tracked = kill_tracked(&mut done);
        quiet = if found.is_empty() && tracked == 0 {
            quiet + 1
        } else {
            0
        };
        killed.extend(found);
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    for (_, _, temporary) in runs {
        if let Some(dir) = temporary {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    killed.len() + done.len()
}

/// From now on SIGINT and SIGTERM end this process only after the
/// harnesses of its watched runs are killed: it exits 130 (SIGINT) or 143
/// (SIGTERM), as a shell reports a process killed by them. The handlers
/// are installed before this returns; a thread of its own waits for them.
pub fn end_on_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut int, mut term) = {
        let _in = rt.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::Builder::new()
        .name("gyre-signals".into())
        .spawn(move || {
            let (name, code) = rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => ("SIGINT", 130),
                    _ = term.recv() => ("SIGTERM", 143),
                }
            });
            let killed = reap_watched();
            eprintln!(
                "gyre: stopped by {name}; killed {killed} harness and evaluator processes of this run"
            );
            std::process::exit(code);
        })?;
    Ok(())
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
        is_running(pid)
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
        // Both past their exec: a process in the middle of one can show
        // an empty environment for a moment, and go unseen by a scan (a CI
        // run once saw one of the two in a second scan right after a first
        // had seen both).
        let execed = |found: &[Pid]| {
            found.len() == 2
                && found.iter().all(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c.trim() == "sleep")
                })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !execed(&find(&run)) && Instant::now() < deadline {
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
