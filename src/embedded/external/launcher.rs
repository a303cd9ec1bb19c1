//! How an external harness is started: the one plug point between the
//! gateway front and whatever runs agent programs.
//!
//! The front creates the gateway execution (its key), a fresh workspace
//! and a log path, and hands them to a [`HarnessLauncher`] as a
//! [`LaunchSpec`]; the launcher returns a future that resolves with the
//! run's [`HarnessOutcome`] once the program has ended. Dropping that
//! future (an abort) must stop the program. [`CommandLauncher`] is the
//! in-tree one: one command per execution, the standard environment, the
//! workspace as its working directory, a timeout. A fuller runner (process
//! groups, rlimits, sandboxes, task folders) implements the same trait.
//!
//! A harness outlives a head killed by kill -9. [`CommandLauncher`] runs
//! each command under a small shell that writes its exit code to the
//! execution's status file ([`LaunchSpec::status`]) when it ends, so a
//! resumed head that finds the harness still running can adopt it
//! ([`HarnessLauncher::adopt`]): it is no longer that process's parent, and
//! the file is how it learns the outcome.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use gyre_actors::sched::proto::harness::HarnessOutcome;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::harness::orphans::{self, EXECUTION_VAR, RUN_VAR};

/// A running harness: resolves when it has ended; dropped, it is stopped.
pub type HarnessRun = Pin<Box<dyn Future<Output = HarnessOutcome> + Send>>;

/// Everything a harness program is told about its execution.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    /// The gateway's execution id (`GYRE_EXECUTION`).
    pub execution: String,
    /// The execution's API key: it reaches only this execution.
    pub key: String,
    /// The gateway's API address, `http://HOST:PORT`.
    pub api_base: String,
    /// The task the run works on: the scheduling plane's query index.
    pub query: u64,
    pub group: u64,
    /// A fresh directory, the program's working directory, kept after it
    /// ends for the evaluator.
    pub workspace: PathBuf,
    /// Where the program's stdout and stderr go.
    pub log: PathBuf,
    /// The run it belongs to (`GYRE_RUN`, see [`crate::harness::orphans`]):
    /// a resumed run kills what a killed head of it left running.
    pub run: String,
}

impl LaunchSpec {
    /// The environment every harness gets: both SDKs' base URL and key
    /// variables point at the gateway with the execution's key.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OPENAI_BASE_URL", format!("{}/v1", self.api_base)),
            ("OPENAI_API_KEY", self.key.clone()),
            ("ANTHROPIC_BASE_URL", self.api_base.clone()),
            ("ANTHROPIC_API_KEY", self.key.clone()),
            (EXECUTION_VAR, self.execution.clone()),
            ("GYRE_QUERY", self.query.to_string()),
            ("GYRE_GROUP", self.group.to_string()),
            (RUN_VAR, self.run.clone()),
        ]
    }

    /// Where the harness's exit code is written when it ends (next to its
    /// log), for a head that did not start it.
    pub fn status(&self) -> PathBuf {
        self.log.with_extension("status")
    }

    /// `arg` with `{query}`, `{group}`, `{workspace}` and `{execution}`
    /// filled in.
    pub fn fill(&self, arg: &str) -> String {
        arg.replace("{query}", &self.query.to_string())
            .replace("{group}", &self.group.to_string())
            .replace("{workspace}", &self.workspace.display().to_string())
            .replace("{execution}", &self.execution)
    }
}

/// Starts one harness per execution.
pub trait HarnessLauncher: Send + Sync + 'static {
    fn launch(&self, spec: LaunchSpec) -> HarnessRun;

    /// The plane is about to drop `execution`'s run (the future
    /// [`HarnessLauncher::launch`] returned never resolves then):
    /// `timed_out` when its overall timeout ended it, else a cancellation.
    /// Lets a launcher that counts outcomes count this one.
    fn stopped(&self, execution: &str, timed_out: bool) {
        let _ = (execution, timed_out);
    }

    /// Waits for a harness an earlier head of the run started with `spec`
    /// at `started` and that still runs as the process-group leader
    /// `leader` (`None`: it has ended, its status file says how): the same
    /// future as [`HarnessLauncher::launch`]'s, under what is left of the
    /// harness timeout. `None`: this launcher cannot learn how such a run
    /// ends (the resumed head kills it instead).
    fn adopt(
        &self,
        spec: LaunchSpec,
        leader: Option<Pid>,
        started: SystemTime,
    ) -> Option<HarnessRun> {
        let _ = (spec, leader, started);
        None
    }

    /// Whether [`HarnessLauncher::adopt`] can take over a lost head's runs.
    fn adopts(&self) -> bool {
        false
    }

    /// The query (task) group `group` works on, where the launcher picks
    /// it (`None`: the run's task decides). The front records it, and a
    /// resumed head starts an adopted group's missing members on it.
    fn query_of(&self, group: u64) -> Option<u64> {
        let _ = group;
        None
    }
}

/// The shell every command runs under: it runs the command (its
/// arguments after the status path), writes the exit code to the status
/// file (whole, by a rename) and exits with it.
const STATUS_WRAPPER: &str = r#"status=$1; shift; "$@"; code=$?; printf '%s\n' "$code" > "$status.tmp" && mv -f "$status.tmp" "$status"; exit $code"#;

/// `argv` run under the status shell writing to `status` (an earlier
/// run's file removed first).
pub fn status_wrapped(status: &std::path::Path, argv: Vec<String>) -> Vec<String> {
    let _ = std::fs::remove_file(status);
    let mut out: Vec<String> = ["sh", "-c", STATUS_WRAPPER, "gyre-harness"]
        .map(String::from)
        .into();
    out.push(status.display().to_string());
    out.extend(argv);
    out
}

/// How an adopted harness ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdoptedEnd {
    /// Its status file: the exit code.
    Exited(i32),
    /// Gone without writing one: killed.
    Vanished,
    /// Its harness timeout passed: its group was killed.
    TimedOut,
}

/// Waits for a harness another head started (`spec`, leading its group
/// as `leader`, or ended already), `left` of its harness timeout
/// remaining; its group is killed once it ends, or if this future is
/// dropped.
pub async fn wait_adopted(spec: &LaunchSpec, leader: Option<Pid>, left: Duration) -> AdoptedEnd {
    const POLL: Duration = Duration::from_millis(100);
    let _group = leader.map(GroupGuard);
    let deadline = tokio::time::Instant::now() + left;
    loop {
        if let Some(end) = adopted_end(spec, leader) {
            return end;
        }
        if tokio::time::Instant::now() >= deadline {
            return AdoptedEnd::TimedOut;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What is left of `timeout` for a harness started at `started`.
pub fn time_left(timeout: Duration, started: SystemTime) -> Duration {
    let ran = SystemTime::now()
        .duration_since(started)
        .unwrap_or_default();
    timeout.saturating_sub(ran)
}

/// Runs `argv` (placeholders filled per execution) in the workspace, as
/// the leader of a process group of its own: when it ends, however it
/// ends, what it left running in the group is killed.
#[derive(Debug, Clone)]
pub struct CommandLauncher {
    pub argv: Vec<String>,
    /// The harness timeout: the program is killed and the run scored as a
    /// harness timeout.
    pub timeout: Duration,
}

impl CommandLauncher {
    pub fn new(argv: Vec<String>, timeout: Duration) -> Result<Self, String> {
        if argv.first().is_none_or(|a| a.trim().is_empty()) {
            return Err("the harness command is empty".into());
        }
        Ok(Self { argv, timeout })
    }
}

/// The outcome of an exit status: 0 completed; 126 and 127 (the shell's
/// cannot-execute and not-found) or a signal a complete failure, nothing to
/// score; any other failure is scored on what the workspace holds. Under
/// the status shell a command killed by signal n exits 128 + n, so codes
/// 129–192 count as killed by a signal too.
pub fn outcome_of(status: std::process::ExitStatus) -> HarnessOutcome {
    status
        .code()
        .map_or(HarnessOutcome::Failed { complete: true }, outcome_of_code)
}

/// [`outcome_of`] for an exit code.
pub fn outcome_of_code(code: i32) -> HarnessOutcome {
    match code {
        0 => HarnessOutcome::Completed,
        126 | 127 | 129..=192 => HarnessOutcome::Failed { complete: true },
        _ => HarnessOutcome::Failed { complete: false },
    }
}

/// The exit code a status file holds, once the harness has ended.
pub fn read_status(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl HarnessLauncher for CommandLauncher {
    fn launch(&self, spec: LaunchSpec) -> HarnessRun {
        let argv: Vec<String> = self.argv.iter().map(|a| spec.fill(a)).collect();
        let timeout = self.timeout;
        Box::pin(async move {
            let log = match std::fs::File::create(&spec.log) {
                Ok(f) => f,
                Err(error) => {
                    tracing::warn!(log = %spec.log.display(), %error, "harness log not created");
                    return HarnessOutcome::Failed { complete: true };
                }
            };
            let err_log = match log.try_clone() {
                Ok(f) => f,
                Err(_) => return HarnessOutcome::Failed { complete: true },
            };
            let argv = status_wrapped(&spec.status(), argv);
            let mut cmd = tokio::process::Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .current_dir(&spec.workspace)
                .envs(spec.env())
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err_log)
                .process_group(0)
                .kill_on_drop(true);
            if crate::harness::orphans::stopping() {
                return HarnessOutcome::Failed { complete: true };
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(error) => {
                    tracing::warn!(command = %argv[0], %error, "harness did not start");
                    return HarnessOutcome::Failed { complete: true };
                }
            };
            let _group = child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(|id| GroupGuard(Pid::from_raw(id)));
            match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(status)) => outcome_of(status),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "waiting for the harness failed");
                    HarnessOutcome::Failed { complete: false }
                }
                Err(_) => {
                    let _ = child.kill().await;
                    HarnessOutcome::HarnessTimeout
                }
            }
        })
    }

    fn adopts(&self) -> bool {
        true
    }

    fn adopt(
        &self,
        spec: LaunchSpec,
        leader: Option<Pid>,
        started: SystemTime,
    ) -> Option<HarnessRun> {
        let left = time_left(self.timeout, started);
        Some(Box::pin(async move {
            match wait_adopted(&spec, leader, left).await {
                AdoptedEnd::Exited(code) => outcome_of_code(code),
                AdoptedEnd::Vanished => HarnessOutcome::Failed { complete: true },
                AdoptedEnd::TimedOut => HarnessOutcome::HarnessTimeout,
            }
        }))
    }
}

/// How an adopted harness ended: its status file, or gone without one;
/// `None` while it runs.
fn adopted_end(spec: &LaunchSpec, leader: Option<Pid>) -> Option<AdoptedEnd> {
    if let Some(code) = read_status(&spec.status()) {
        return Some(AdoptedEnd::Exited(code));
    }
    if leader.is_some_and(|l| orphans::is_harness_of(l, &spec.run, &spec.execution)) {
        return None;
    }
    // It may have written the file just before it went.
    Some(read_status(&spec.status()).map_or(AdoptedEnd::Vanished, AdoptedEnd::Exited))
}

/// Kills a harness's process group when its run ends or is dropped (an
/// abort): the leader may be gone, its stragglers not.
struct GroupGuard(Pid);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &std::path::Path) -> LaunchSpec {
        LaunchSpec {
            execution: "ex-1".into(),
            key: "k".into(),
            api_base: "http://127.0.0.1:9".into(),
            query: 5,
            group: 13,
            workspace: dir.to_path_buf(),
            log: dir.join("log"),
            run: format!("/runs/r1-{}", dir.display()),
        }
    }

    #[tokio::test]
    async fn a_command_sees_its_environment_and_exit_codes_map() {
        let dir = tempfile::tempdir().unwrap();
        let l = CommandLauncher::new(
            vec![
                "sh".into(),
                "-c".into(),
                "echo \"$OPENAI_BASE_URL $ANTHROPIC_API_KEY $GYRE_EXECUTION {query}\" > out; exit 3"
                    .into(),
            ],
            Duration::from_secs(30),
        )
        .unwrap();
        let outcome = l.launch(spec(dir.path())).await;
        assert_eq!(outcome, HarnessOutcome::Failed { complete: false });
        let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert_eq!(out.trim(), "http://127.0.0.1:9/v1 k ex-1 5");
        let missing =
            CommandLauncher::new(vec!["/no/such/harness".into()], Duration::from_secs(5)).unwrap();
        assert_eq!(
            missing.launch(spec(dir.path())).await,
            HarnessOutcome::Failed { complete: true }
        );
        // What the harness left running in its group dies with it.
        let straggling = CommandLauncher::new(
            vec![
                "sh".into(),
                "-c".into(),
                "sleep 300 & echo $! > straggler".into(),
            ],
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(
            straggling.launch(spec(dir.path())).await,
            HarnessOutcome::Completed
        );
        let pid = std::fs::read_to_string(dir.path().join("straggler")).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let running = || {
            std::fs::read_to_string(&stat).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        while running() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!running(), "the harness's straggler outlived it");
        let hang =
            CommandLauncher::new(vec!["sleep".into(), "30".into()], Duration::from_millis(50))
                .unwrap();
        assert_eq!(
            hang.launch(spec(dir.path())).await,
            HarnessOutcome::HarnessTimeout
        );
        assert!(CommandLauncher::new(vec![], Duration::from_secs(1)).is_err());
    }

    /// Starts `script` under the status shell as a launcher would, but as
    /// a process nobody waits for in the test's stead: what a lost head
    /// leaves behind.
    fn orphan(spec: &LaunchSpec, script: &str) -> (std::process::Child, Pid) {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("sh")
            .args(["-c", STATUS_WRAPPER, "gyre-harness"])
            .arg(spec.status())
            .args(["sh", "-c", script])
            .envs(spec.env())
            .current_dir(&spec.workspace)
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        // Until its exec, the child's environment is still the test's.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !orphans::is_harness_of(pid, &spec.run, &spec.execution) {
            assert!(std::time::Instant::now() < deadline, "the orphan never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
        (child, pid)
    }

    #[tokio::test]
    async fn an_adopted_harness_ends_by_its_status_file_or_is_killed_at_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path());
        let l = CommandLauncher::new(vec!["unused".into()], Duration::from_secs(30)).unwrap();
        let now = SystemTime::now();
        // It ends by itself: the code it wrote decides.
        let (_c, leader) = orphan(&spec, "sleep 0.3; exit 3");
        let run = l.adopt(spec.clone(), Some(leader), now).unwrap();
        assert_eq!(run.await, HarnessOutcome::Failed { complete: false });
        assert_eq!(read_status(&spec.status()), Some(3));
        std::fs::remove_file(spec.status()).unwrap();
        let (_c, leader) = orphan(&spec, "sleep 0.2");
        assert_eq!(
            l.adopt(spec.clone(), Some(leader), now).unwrap().await,
            HarnessOutcome::Completed
        );
        std::fs::remove_file(spec.status()).unwrap();
        // Killed with its shell: no status, a complete failure.
        let (_c, leader) = orphan(&spec, "sleep 30");
        let run = tokio::spawn(l.adopt(spec.clone(), Some(leader), now).unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        killpg(leader, Signal::SIGKILL).unwrap();
        assert_eq!(
            run.await.unwrap(),
            HarnessOutcome::Failed { complete: true }
        );
        // Its timeout counts from when the lost head started it: 29.7 of
        // 30 s had passed, so it is killed, group and all, in 0.3 s.
        let (mut c, leader) = orphan(&spec, "sleep 300 & sleep 300");
        let started = now - Duration::from_millis(29_700);
        let t = std::time::Instant::now();
        let outcome = l.adopt(spec.clone(), Some(leader), started).unwrap().await;
        assert_eq!(outcome, HarnessOutcome::HarnessTimeout);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let _ = c.wait();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !orphans::find(&spec.run).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            orphans::find(&spec.run).is_empty(),
            "the timed-out group still runs"
        );
        assert!(read_status(&spec.status()).is_none());
    }
}
