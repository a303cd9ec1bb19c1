//! What a harness (or evaluator) process is allowed to see: the argv that
//! wraps its command in the chosen sandbox.
//!
//! - `none`: the command as written; isolation is the process group, the
//!   rlimits and its own HOME/TMPDIR (it can read and write whatever the
//!   runner's user can, and reach any network).
//! - `bwrap`: bubblewrap. The whole file system read-only, a private /tmp,
//!   /dev and /proc of its own, its own PID, IPC and UTS namespaces (so
//!   nothing it starts survives it, even a process that leaves the
//!   session), and writable only: its workspace, HOME and TMPDIR. The task
//!   set (every `hidden/`), the other executions' folders and the logs are
//!   covered by empty tmpfs mounts. Network: the host's, none
//!   (`sandbox.network = "none"`: loopback only), or only the gateway
//!   (`"gateway"`: loopback only, plus the forwarder of [`super::forward`]
//!   as the sandbox's first process, its Unix socket bound in).
//! - `command`: a user prefix (`docker run …`, `podman run …`, `bwrap …`)
//!   in front of the command; that runtime decides what is isolated.

use std::path::{Path, PathBuf};

use super::job::{NetworkMode, SandboxKind};
use super::placeholders::substitute;
use super::workspace::ExecDirs;

/// The sandbox settings of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPlan {
    pub kind: SandboxKind,
    pub network: NetworkMode,
    pub prefix: Vec<String>,
    pub bwrap_args: Vec<String>,
    /// Covered inside bwrap (the task set, the work root, the log dir).
    pub masked: Vec<PathBuf>,
    /// Read-only and visible inside bwrap even under /tmp (the job's
    /// folder, where its scripts are).
    pub visible: Vec<PathBuf>,
}

/// Extra read-only paths a sandboxed command needs (the evaluator's hidden/).
#[derive(Debug, Clone, Default)]
pub struct Extra<'a> {
    pub read_only: Vec<&'a Path>,
    /// The workspace is read-only too (the evaluator).
    pub workspace_read_only: bool,
    /// With `network = "gateway"`: the forwarder to start the command
    /// behind (a harness; an evaluator gets no network at all).
    pub forward: Option<Forward>,
}

/// The in-sandbox forwarder of `network = "gateway"`.
#[derive(Debug, Clone)]
pub struct Forward {
    /// A `gyre` binary (it has the hidden `sandbox-forward` command).
    pub program: PathBuf,
    /// Loopback address inside the sandbox the harness is pointed at.
    pub listen: std::net::SocketAddr,
    /// The host's [`super::forward::GatewayBridge`] socket.
    pub socket: PathBuf,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl SandboxPlan {
    pub fn none() -> Self {
        Self {
            kind: SandboxKind::None,
            network: NetworkMode::Host,
            prefix: Vec::new(),
            bwrap_args: Vec::new(),
            masked: Vec::new(),
            visible: Vec::new(),
        }
    }

    /// `argv` wrapped for this sandbox; `values` fills the prefix's
    /// placeholders.
    pub fn wrap(
        &self,
        argv: Vec<String>,
        dirs: &ExecDirs,
        values: &[(&str, &str)],
        extra: &Extra<'_>,
    ) -> Vec<String> {
        match self.kind {
            SandboxKind::None => argv,
            SandboxKind::Command => self
                .prefix
                .iter()
                .map(|a| substitute(a, values))
                .chain(argv)
                .collect(),
            SandboxKind::Bwrap => {
                let mut a: Vec<String> = [
                    "bwrap",
                    "--die-with-parent",
                    "--unshare-pid",
                    "--unshare-ipc",
                    "--unshare-uts",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                ]
                .iter()
                .map(|x| x.to_string())
                .collect();
                if self.network != NetworkMode::Host {
                    a.push("--unshare-net".into());
                }
                for v in &self.visible {
                    if v.starts_with("/tmp") && v.exists() {
                        a.extend(["--ro-bind".into(), s(v), s(v)]);
                    }
                }
                for m in &self.masked {
                    // Under /tmp it is already hidden by the fresh /tmp,
                    // unless a visible folder brought it back.
                    let shown =
                        !m.starts_with("/tmp") || self.visible.iter().any(|v| m.starts_with(v));
                    if shown && m.exists() {
                        a.extend(["--tmpfs".into(), s(m)]);
                    }
                }
                let ws_bind = if extra.workspace_read_only {
                    "--ro-bind"
                } else {
                    "--bind"
                };
                a.extend([ws_bind.into(), s(&dirs.workspace), s(&dirs.workspace)]);
                for d in [&dirs.home, &dirs.tmp] {
                    if d.exists() {
                        a.extend(["--bind".into(), s(d), s(d)]);
                    }
                }
                a.extend([
                    "--ro-bind".into(),
                    s(&dirs.prompt_file),
                    s(&dirs.prompt_file),
                ]);
                for p in &extra.read_only {
                    a.extend(["--ro-bind".into(), s(p), s(p)]);
                }
                let argv = match (&extra.forward, self.network) {
                    (Some(f), NetworkMode::Gateway) => {
                        // The socket's own folder, not the socket: a
                        // resumed head binds a new socket there for a
                        // harness it adopts, which a bind of the old
                        // socket file would not show.
                        let dir = f.socket.parent().unwrap_or(&f.socket);
                        a.extend(["--bind".into(), s(dir), s(dir)]);
                        // A forwarder under /tmp (a build there) is hidden
                        // by the fresh /tmp unless brought back.
                        if f.program.starts_with("/tmp") && f.program.exists() {
                            a.extend(["--ro-bind".into(), s(&f.program), s(&f.program)]);
                        }
                        super::forward::forwarded_argv(&f.program, f.listen, &f.socket, argv)
                    }
                    _ => argv,
                };
                a.extend(["--chdir".into(), s(&dirs.workspace)]);
                a.extend(self.bwrap_args.iter().cloned());
                a.push("--".into());
                a.extend(argv);
                a
            }
        }
    }
}

/// Whether bubblewrap runs here with these namespaces; `Err` says why not
/// (a kernel without unprivileged user namespaces, no bwrap installed).
pub fn bwrap_works(network: NetworkMode) -> Result<(), String> {
    let mut cmd = std::process::Command::new("bwrap");
    cmd.args([
        "--die-with-parent",
        "--unshare-pid",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]);
    if network != NetworkMode::Host {
        cmd.arg("--unshare-net");
    }
    match cmd.args(["--", "true"]).output() {
        Err(e) => Err(format!("cannot run bwrap: {e}")),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "bwrap refused: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> ExecDirs {
        let root = PathBuf::from("/w/e1");
        ExecDirs {
            workspace: root.join("workspace"),
            home: root.join("home"),
            tmp: root.join("tmp"),
            prompt_file: root.join("prompt.md"),
            root,
        }
    }

    #[test]
    fn none_and_command_prefixes() {
        let argv = vec!["agent".to_string(), "x".into()];
        let d = dirs();
        assert_eq!(
            SandboxPlan::none().wrap(argv.clone(), &d, &[], &Extra::default()),
            argv
        );
        let plan = SandboxPlan {
            kind: SandboxKind::Command,
            prefix: vec![
                "docker".into(),
                "run".into(),
                "-v".into(),
                "{workspace}:/w".into(),
            ],
            ..SandboxPlan::none()
        };
        assert_eq!(
            plan.wrap(
                argv,
                &d,
                &[("workspace", "/w/e1/workspace")],
                &Extra::default()
            ),
            ["docker", "run", "-v", "/w/e1/workspace:/w", "agent", "x"]
        );
    }

    #[test]
    fn bwrap_binds_the_workspace_and_ends_with_the_command() {
        let plan = SandboxPlan {
            kind: SandboxKind::Bwrap,
            network: NetworkMode::None,
            ..SandboxPlan::none()
        };
        let a = plan.wrap(vec!["agent".into()], &dirs(), &[], &Extra::default());
        let joined = a.join(" ");
        assert!(joined.starts_with("bwrap --die-with-parent --unshare-pid"));
        assert!(joined.contains("--unshare-net"));
        assert!(joined.contains("--bind /w/e1/workspace /w/e1/workspace"));
        assert!(joined.contains("--chdir /w/e1/workspace"));
        assert!(joined.ends_with("-- agent"));
        let ro = plan.wrap(
            vec!["grade".into()],
            &dirs(),
            &[],
            &Extra {
                read_only: vec![Path::new("/t/hidden")],
                workspace_read_only: true,
                forward: None,
            },
        );
        let joined = ro.join(" ");
        assert!(joined.contains("--ro-bind /w/e1/workspace /w/e1/workspace"));
        assert!(joined.contains("--ro-bind /t/hidden /t/hidden"));
    }

    #[test]
    fn bwrap_with_the_gateway_network_starts_the_forwarder_first() {
        let plan = SandboxPlan {
            kind: SandboxKind::Bwrap,
            network: NetworkMode::Gateway,
            ..SandboxPlan::none()
        };
        let forward = Forward {
            program: "/bin/gyre".into(),
            listen: "127.0.0.1:8080".parse().unwrap(),
            socket: "/w/e1/gateway/gateway.sock".into(),
        };
        let extra = Extra {
            forward: Some(forward),
            ..Extra::default()
        };
        let joined = plan
            .wrap(vec!["agent".into()], &dirs(), &[], &extra)
            .join(" ");
        assert!(joined.contains("--unshare-net"));
        assert!(joined.contains("--bind /w/e1/gateway /w/e1/gateway"));
        assert!(joined.ends_with(
            "-- /bin/gyre sandbox-forward --listen 127.0.0.1:8080 --unix /w/e1/gateway/gateway.sock -- agent"
        ));
        assert!(!joined.contains("--ro-bind /bin/gyre"));
        // A forwarder built under /tmp is brought back into the fresh /tmp.
        let tmp = tempfile::NamedTempFile::new_in("/tmp").unwrap();
        let extra = Extra {
            forward: Some(Forward {
                program: tmp.path().into(),
                listen: "127.0.0.1:8080".parse().unwrap(),
                socket: "/w/e1/gateway/gateway.sock".into(),
            }),
            ..Extra::default()
        };
        let joined = plan
            .wrap(vec!["agent".into()], &dirs(), &[], &extra)
            .join(" ");
        let p = tmp.path().display();
        assert!(joined.contains(&format!("--ro-bind {p} {p}")), "{joined}");
        // The evaluator: no forwarder, no network.
        let eval = plan.wrap(vec!["grade".into()], &dirs(), &[], &Extra::default());
        assert!(eval.contains(&"--unshare-net".to_string()));
        assert!(eval.ends_with(&["--".to_string(), "grade".to_string()]));
    }
}
