//! One child process and everything it starts, as a unit that ends
//! together.
//!
//! The child is made a session and process-group leader before it execs
//! (`setsid`), gets its rlimits there, writes stdout and stderr straight to
//! log files, and inherits no descriptor of ours (Rust opens everything
//! close-on-exec; stdin is /dev/null). Ending it always means the whole
//! group: on a timeout or an abort SIGTERM, then SIGKILL after a grace; after
//! any end a final SIGKILL for stragglers the harness left running in the
//! background. Stragglers re-parent to this process (it is a child
//! subreaper) and are reaped here, so no zombie outlives the execution
//! either. A process that starts its own session escapes the group: only a
//! PID namespace (the bwrap sandbox) contains that.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Once;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

use super::job::Limits;

/// What to run.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// The complete environment (nothing else is inherited).
    pub env: Vec<(String, String)>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub limits: Limits,
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited by itself: its code, or the signal that ended it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Killed (with its group) at `timeout`.
    TimedOut,
    /// Killed (with its group) because the caller cancelled.
    Aborted,
    /// exec failed (no such program, not executable, a bad cwd).
    CannotStart(String),
}

/// A finished process.
#[derive(Debug, Clone)]
pub struct ProcessRun {
    pub end: ProcessEnd,
    /// From the spawn call to its return (fork, pre-exec, exec).
    pub spawn: Duration,
    /// From the spawn call to the group's end.
    pub wall: Duration,
    /// Processes of the group still alive after the leader ended, killed.
    pub stragglers_killed: bool,
}

static SUBREAPER: Once = Once::new();

/// Makes this process the reaper of orphans of its descendants (once).
pub fn become_subreaper() {
    SUBREAPER.call_once(|| {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(error = %e, "cannot become a child subreaper; killed background processes may linger as zombies");
        }
    });
}

fn set_limits(l: &Limits) -> nix::Result<()> {
    let mb = |v: u64| v.saturating_mul(1 << 20);
    setrlimit(Resource::RLIMIT_NOFILE, l.open_files, l.open_files)?;
    setrlimit(Resource::RLIMIT_CORE, l.core_bytes, l.core_bytes)?;
    if let Some(v) = l.address_space_mb {
        setrlimit(Resource::RLIMIT_AS, mb(v), mb(v))?;
    }
    if let Some(v) = l.cpu_seconds {
        setrlimit(Resource::RLIMIT_CPU, v, v)?;
    }
    if let Some(v) = l.file_size_mb {
        setrlimit(Resource::RLIMIT_FSIZE, mb(v), mb(v))?;
    }
    if let Some(v) = l.processes {
        setrlimit(Resource::RLIMIT_NPROC, v, v)?;
    }
    Ok(())
}

fn open_log(p: &PathBuf) -> std::io::Result<std::fs::File> {
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::create(p)
}

/// SIGTERM to the group, SIGKILL after `grace` if the leader still lives.
async fn stop_group(child: &mut tokio::process::Child, pgid: Pid, grace: Duration) {
    let _ = killpg(pgid, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// Kills what is left of the group and reaps what re-parented to us; true
/// if anything was left. Bounded: a member we cannot reap (not our child)
/// is reported, not waited for forever.
async fn sweep_group(pgid: Pid) -> bool {
    let mut found = false;
    for _ in 0..400 {
        match killpg(pgid, Signal::SIGKILL) {
            Err(Errno::ESRCH) => return found,
            _ => found = true,
        }
        loop {
            match waitpid(Pid::from_raw(-pgid.as_raw()), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        if kill(Pid::from_raw(-pgid.as_raw()), None) == Err(Errno::ESRCH) {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::warn!(
        pgid = pgid.as_raw(),
        "process group still has members after SIGKILL"
    );
    found
}

/// Kills the group if the future running it is dropped (an abort by
/// drop): SIGKILL now, the sweep on the runtime if there is one.
struct GroupGuard {
    pgid: Pid,
    armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let pgid = self.pgid;
            rt.spawn(async move {
                sweep_group(pgid).await;
            });
        }
    }
}

/// Runs `spec` to its end, a timeout, or `cancel`. Dropping the future
/// kills the group too.
pub async fn run(spec: &ProcessSpec, cancel: &CancellationToken) -> ProcessRun {
    become_subreaper();
    let started = Instant::now();
    let cannot = |why: String| ProcessRun {
        end: ProcessEnd::CannotStart(why),
        spawn: started.elapsed(),
        wall: started.elapsed(),
        stragglers_killed: false,
    };
    let Some(program) = spec.argv.first() else {
        return cannot("empty command".into());
    };
    let (out, err) = match (open_log(&spec.stdout), open_log(&spec.stderr)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return cannot(format!("cannot open the log files: {e}")),
    };
    if super::orphans::stopping() {
        return cannot("gyre is stopping on a signal".into());
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    let limits = spec.limits.clone();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe system calls (setsid, setrlimit), no
    // allocation or locking.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            set_limits(&limits).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    // The log descriptors live in `cmd` until it is dropped.
    drop(cmd);
    let spawn = started.elapsed();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return cannot(format!("{program}: {e}")),
    };
    let Some(pid) = child.id() else {
        return cannot(format!("{program}: exited before it could be tracked"));
    };
    let pgid = Pid::from_raw(pid as i32);
    let mut guard = GroupGuard { pgid, armed: true };
    // A signal that ends gyre ends the session too (an evaluator carries
    // no run tag to be found by).
    let _tracked = super::orphans::track(pid, true);
    let end = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                ProcessEnd::Exited { code: s.code(), signal: s.signal() }
            }
            Err(e) => ProcessEnd::CannotStart(format!("waiting for {program}: {e}")),
        },
        _ = tokio::time::sleep(spec.timeout) => {
            stop_group(&mut child, pgid, spec.grace).await;
            ProcessEnd::TimedOut
        }
        _ = cancel.cancelled() => {
            stop_group(&mut child, pgid, spec.grace).await;
            ProcessEnd::Aborted
        }
    };
    let stragglers_killed = sweep_group(pgid).await;
    guard.armed = false;
    ProcessRun {
        end,
        spawn,
        wall: started.elapsed(),
        stragglers_killed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &std::path::Path, argv: &[&str], timeout_ms: u64) -> ProcessSpec {
        ProcessSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: dir.to_path_buf(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            stdout: dir.join("out.log"),
            stderr: dir.join("err.log"),
            limits: Limits::default(),
            timeout: Duration::from_millis(timeout_ms),
            grace: Duration::from_millis(200),
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-proc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The pid a test script wrote to `bg.pid`.
    fn background_pid(d: &std::path::Path) -> i32 {
        std::fs::read_to_string(d.join("bg.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn exit_codes_logs_env_and_limits() {
        let d = temp("exit");
        let s = spec(
            &d,
            &[
                "/bin/sh",
                "-c",
                "echo out; echo err >&2; echo $PATH-$HOME; ulimit -n; exit 3",
            ],
            10_000,
        );
        let r = rt().block_on(run(&s, &CancellationToken::new()));
        assert_eq!(
            r.end,
            ProcessEnd::Exited {
                code: Some(3),
                signal: None
            }
        );
        let out = std::fs::read_to_string(d.join("out.log")).unwrap();
        assert_eq!(out, "out\n/usr/bin:/bin-\n4096\n");
        assert_eq!(std::fs::read_to_string(d.join("err.log")).unwrap(), "err\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_program_cannot_start() {
        let d = temp("missing");
        let r = rt().block_on(run(
            &spec(&d, &["/no/such/harness"], 1000),
            &CancellationToken::new(),
        ));
        assert!(matches!(r.end, ProcessEnd::CannotStart(ref w) if w.contains("/no/such/harness")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn timeout_and_abort_kill_the_whole_group() {
        let d = temp("group");
        // A background grandchild that ignores SIGTERM, and a leader that
        // waits forever.
        let script = "trap '' TERM; (trap '' TERM; sleep 300) & echo $! > bg.pid; sleep 300";
        let r = rt().block_on(run(
            &spec(&d, &["/bin/sh", "-c", script], 300),
            &CancellationToken::new(),
        ));
        assert_eq!(r.end, ProcessEnd::TimedOut);
        let bg = background_pid(&d);
        assert_eq!(
            kill(Pid::from_raw(bg), None),
            Err(Errno::ESRCH),
            "grandchild gone"
        );

        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let rt = rt();
        let r = rt.block_on(async {
            let s = spec(&d, &["/bin/sh", "-c", "sleep 300"], 60_000);
            let h = run(&s, &cancel);
            tokio::pin!(h);
            tokio::select! {
                r = &mut h => r,
                _ = tokio::time::sleep(Duration::from_millis(100)) => { c2.cancel(); h.await }
            }
        });
        assert_eq!(r.end, ProcessEnd::Aborted);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dropping_the_run_kills_the_group() {
        let d = temp("drop");
        let rt = rt();
        rt.block_on(async {
            let s = spec(
                &d,
                &["/bin/sh", "-c", "sleep 300 & echo $! > bg.pid; sleep 300"],
                60_000,
            );
            let c = CancellationToken::new();
            let run = run(&s, &c);
            let _ = tokio::time::timeout(Duration::from_millis(300), run).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        let bg = background_pid(&d);
        assert_eq!(kill(Pid::from_raw(bg), None), Err(Errno::ESRCH));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn background_stragglers_are_killed_after_a_normal_exit() {
        let d = temp("straggler");
        let r = rt().block_on(run(
            &spec(
                &d,
                &["/bin/sh", "-c", "sleep 300 & echo $! > bg.pid; exit 0"],
                10_000,
            ),
            &CancellationToken::new(),
        ));
        assert_eq!(
            r.end,
            ProcessEnd::Exited {
                code: Some(0),
                signal: None
            }
        );
        assert!(r.stragglers_killed);
        let bg = background_pid(&d);
        assert_eq!(kill(Pid::from_raw(bg), None), Err(Errno::ESRCH));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
