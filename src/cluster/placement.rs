//! Where node agents run: the placement backends the launcher drives, and
//! the deployment files for cluster managers Gyre does not drive itself.
//!
//! Gyre's runtime does the messaging; an existing manager does placement.
//! `local` starts each node agent as a child process of the head; `slurm`
//! starts each as one `srun` step (inside the caller's allocation, or its
//! own), so the head supervises an `srun` that lives exactly as long as the
//! node agent. Both are watched the same way: the launcher's I/O job waits
//! for the process and reports how it ended. [`sbatch_script`] and
//! [`kubernetes_manifest`] write the same node agents as a batch script and
//! as Kubernetes Jobs, for a head started by the manager instead.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use gyre_runtime::NodeId;

use super::proto::NodeSpec;
use crate::embedded::shared::lock;

/// The environment variable that carries the cluster secret (hex) to node
/// agents: never on a command line, where `ps` would show it.
pub const SECRET_ENV: &str = "GYRE_CLUSTER_SECRET";

/// What every node agent needs to find and join the head.
#[derive(Clone)]
pub struct HeadInfo {
    pub addr: SocketAddr,
    pub secret_hex: String,
    /// The `gyre` binary node agents run.
    pub exe: PathBuf,
    /// How long agents wait for a new head after losing this one (zero:
    /// they exit with it; see `gyre node --head-wait-s`).
    pub head_wait: Duration,
    /// This head's incarnation (0, or n for a run's n-th resume).
    pub incarnation: u64,
}

impl std::fmt::Debug for HeadInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadInfo")
            .field("addr", &self.addr)
            .field("exe", &self.exe)
            .finish_non_exhaustive()
    }
}

/// A backend the launcher places node agents through. Every call blocks,
/// so the launcher runs them as I/O jobs.
pub trait Placement: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Starts the node agent for `spec`; its process id (of `srun` under
    /// Slurm).
    fn launch(&self, spec: &NodeSpec) -> Result<u32, String>;
    /// Blocks until `node`'s process ends; how it ended.
    fn wait(&self, node: NodeId) -> Result<String, String>;
    /// Kills every node process still running.
    fn stop_all(&self);
    /// Whether `launch` may start a node again after its process ended
    /// (a lost node agent restarted). The managed backends start every
    /// agent in one submission and restart one as its own step or Job.
    fn restarts(&self) -> bool {
        false
    }
    /// Kills `node`'s process `pid` if it still runs (a node whose link
    /// was lost is fenced, so that it ends and can be started again; a
    /// process started since under the same node is left alone); whether
    /// a kill was sent.
    fn kill(&self, node: NodeId, pid: u32) -> bool {
        let _ = (node, pid);
        false
    }
    /// Takes over `node`'s process `pid`, which an earlier head of the run
    /// started and which outlived it (its agent waits for a new head):
    /// from now on `wait`, `kill` and `stop_all` cover it as if launched
    /// here. Whether this backend can (it must see the process: `local`
    /// and `slurm`, whose `srun` runs on the head's machine).
    fn adopt(&self, node: NodeId, pid: u32) -> bool {
        let _ = (node, pid);
        false
    }
}

/// How node-agent processes are started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// Child processes of the head.
    Local,
    /// One `srun` step per node agent.
    Slurm { extra: Vec<String> },
    /// `sbatch` of the generated batch script (`super::managed`); `extra`
    /// are `sbatch` arguments.
    SlurmBatch { extra: Vec<String> },
    /// `kubectl apply` of the generated Jobs (`super::managed`), pods
    /// running `image` and reaching the head at `head_host`.
    Kubernetes { image: String, head_host: String },
}

/// The placement backend for `launch`, placing `specs`.
pub fn placement_for(launch: &Launch, head: HeadInfo, specs: &[NodeSpec]) -> Box<dyn Placement> {
    use super::managed::{KubernetesJobs, SlurmBatch};
    match launch {
        Launch::Local | Launch::Slurm { .. } => Box::new(Processes::new(launch.clone(), head)),
        Launch::SlurmBatch { extra } => {
            Box::new(SlurmBatch::new(head, specs.to_vec(), extra.clone()))
        }
        Launch::Kubernetes { image, head_host } => Box::new(KubernetesJobs::new(
            head,
            specs.to_vec(),
            image.clone(),
            head_host.clone(),
        )),
    }
}

/// The `local` and `slurm` backends: node agents as supervised processes.
pub struct Processes {
    launch: Launch,
    head: HeadInfo,
    children: Mutex<BTreeMap<NodeId, Child>>,
    /// Processes an earlier head started, taken over (`Placement::adopt`):
    /// not this process's children, so they are watched through /proc and
    /// signalled by pid.
    adopted: Mutex<BTreeMap<NodeId, u32>>,
}

/// `pid` as nix names it, if it fits.
fn nix_pid(pid: u32) -> Option<nix::unistd::Pid> {
    i32::try_from(pid).ok().map(nix::unistd::Pid::from_raw)
}

/// Whether process `pid` of this machine runs (for a node agent an
/// earlier head started: the agent itself, or its `srun`).
pub(crate) fn process_runs(pid: u32) -> bool {
    adopted_runs(pid)
}

/// Whether the adopted process `pid` still runs.
fn adopted_runs(pid: u32) -> bool {
    nix_pid(pid).is_some_and(crate::harness::orphans::is_running)
}

/// Sends SIGKILL to the adopted process `pid`; whether it was sent.
fn kill_adopted(pid: u32) -> bool {
    nix_pid(pid)
        .is_some_and(|p| nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL).is_ok())
}

impl Processes {
    pub fn new(launch: Launch, head: HeadInfo) -> Self {
        Self {
            launch,
            head,
            children: Mutex::default(),
            adopted: Mutex::default(),
        }
    }

    /// The program and arguments that start `spec`'s node agent.
    pub fn command_line(&self, spec: &NodeSpec) -> Vec<String> {
        let agent = node_agent_args(&self.head, spec);
        match &self.launch {
            // The managed launches are other backends (`placement_for`).
            Launch::Local | Launch::SlurmBatch { .. } | Launch::Kubernetes { .. } => agent,
            Launch::Slurm { extra } => {
                let mut cmd = srun_args(spec);
                cmd.extend(extra.iter().cloned());
                cmd.extend(agent);
                cmd
            }
        }
    }
}

/// `gyre node` for `spec`.
fn node_agent_args(head: &HeadInfo, spec: &NodeSpec) -> Vec<String> {
    let mut args = vec![
        head.exe.display().to_string(),
        "node".into(),
        "--head".into(),
        head.addr.to_string(),
        "--node".into(),
        spec.node.0.to_string(),
    ];
    if !head.head_wait.is_zero() {
        args.extend(["--head-wait-s".into(), head.head_wait.as_secs().to_string()]);
    }
    if head.incarnation > 0 {
        args.extend(["--incarnation".into(), head.incarnation.to_string()]);
    }
    args
}

/// The name of node `node`'s Slurm step (`srun --job-name`), by which
/// a batch job's steps are told apart.
pub(crate) fn step_name(node: NodeId) -> String {
    format!("gyre-node-{}", node.0)
}

/// One job step of one task on one node; `--overlap` lets the steps share
/// an allocation's CPUs, `--kill-on-bad-exit` ends the step with its task.
fn srun_args(spec: &NodeSpec) -> Vec<String> {
    vec![
        "srun".into(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        "--overlap".into(),
        "--kill-on-bad-exit=1".into(),
        format!("--job-name={}", step_name(spec.node)),
        format!("--export=ALL,{SECRET_ENV}"),
    ]
}

impl Placement for Processes {
    fn name(&self) -> &'static str {
        match self.launch {
            Launch::Slurm { .. } => "slurm",
            _ => "local",
        }
    }

    fn launch(&self, spec: &NodeSpec) -> Result<u32, String> {
        let line = self.command_line(spec);
        let (program, args) = line
            .split_first()
            .ok_or_else(|| "empty command line".to_string())?;
        let child = Command::new(program)
            .args(args)
            .env(SECRET_ENV, &self.head.secret_hex)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting `{program}` for {}: {e}", spec.label()))?;
        let pid = child.id();
        lock(&self.children).insert(spec.node, child);
        Ok(pid)
    }

    fn wait(&self, node: NodeId) -> Result<String, String> {
        loop {
            {
                let adopted = lock(&self.adopted).get(&node).copied();
                if let Some(pid) = adopted {
                    if !adopted_runs(pid) {
                        lock(&self.adopted).remove(&node);
                        return Ok(format!(
                            "process {pid} (adopted from an earlier head) ended; its status is its parent's"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let mut children = lock(&self.children);
                let child = children
                    .get_mut(&node)
                    .ok_or_else(|| format!("node {} was never started", node.0))?;
                match child.try_wait() {
                    Ok(Some(status)) => {
                        children.remove(&node);
                        return Ok(status.to_string());
                    }
                    Ok(None) => {}
                    Err(e) => return Err(format!("waiting for node {}: {e}", node.0)),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn restarts(&self) -> bool {
        true
    }

    fn adopt(&self, node: NodeId, pid: u32) -> bool {
        if !adopted_runs(pid) {
            return false;
        }
        lock(&self.adopted).insert(node, pid);
        true
    }

    fn kill(&self, node: NodeId, pid: u32) -> bool {
        if lock(&self.adopted).get(&node) == Some(&pid) {
            tracing::warn!(node = node.0, pid, "fencing an adopted node agent");
            return kill_adopted(pid);
        }
        let mut children = lock(&self.children);
        let Some(child) = children.get_mut(&node).filter(|c| c.id() == pid) else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => {
                tracing::warn!(
                    node = node.0,
                    pid = child.id(),
                    "fencing a node agent whose link was lost"
                );
                child.kill().is_ok()
            }
            _ => false,
        }
    }

    fn stop_all(&self) {
        for (node, pid) in lock(&self.adopted).iter() {
            if adopted_runs(*pid) {
                tracing::warn!(node = node.0, pid, "killing adopted node agent");
                kill_adopted(*pid);
            }
        }
        for (node, child) in lock(&self.children).iter_mut() {
            if let Ok(None) = child.try_wait() {
                tracing::warn!(node = node.0, pid = child.id(), "killing node agent");
                child.kill().ok();
                child.wait().ok();
            }
        }
    }
}

/// A batch script that runs every node agent as one step of one
/// allocation and waits for them, for a head that is already listening
/// at `head.addr` (the secret is read from the submitting environment).
pub fn sbatch_script(head: &HeadInfo, specs: &[NodeSpec], job: &str) -> String {
    let mut s = format!(
        "#!/bin/bash\n#SBATCH --job-name={job}\n#SBATCH --nodes={}\n#SBATCH --ntasks={}\n\
         # {SECRET_ENV} must be set in the submitting environment (sbatch exports it).\n\
         : \"${{{SECRET_ENV}:?set {SECRET_ENV} to the cluster secret of the head}}\"\n",
        specs.len(),
        specs.len()
    );
    for spec in specs {
        let line: Vec<String> = srun_args(spec)
            .into_iter()
            .chain(node_agent_args(head, spec))
            .collect();
        s.push_str(&format!("# {}\n{} &\n", spec.label(), line.join(" ")));
    }
    s.push_str("wait\n");
    s
}

/// Kubernetes Jobs, one per node agent, joining a head reachable at
/// `head_host:port` (a Service in front of the head's pod); the secret
/// comes from the Secret `secret_name` (key `secret`, hex).
pub fn kubernetes_manifest(
    specs: &[NodeSpec],
    image: &str,
    head_host: &str,
    head_port: u16,
    secret_name: &str,
) -> String {
    let mut docs = Vec::new();
    for spec in specs {
        let n = spec.node.0;
        docs.push(format!(
            "apiVersion: batch/v1\n\
             kind: Job\n\
             metadata:\n  name: gyre-node-{n}\n  labels:\n    app: gyre\n    gyre/node: \"{n}\"\n  \
             annotations:\n    gyre/roles: \"{roles}\"\n\
             spec:\n  backoffLimit: 0\n  template:\n    metadata:\n      labels:\n        app: gyre\n        gyre/node: \"{n}\"\n    \
             spec:\n      restartPolicy: Never\n      containers:\n      - name: node\n        image: {image}\n        \
             args: [\"node\", \"--head\", \"{head_host}:{head_port}\", \"--node\", \"{n}\", \"--bind\", \"0.0.0.0\"]\n        \
             env:\n        - name: {SECRET_ENV}\n          valueFrom:\n            secretKeyRef:\n              name: {secret_name}\n              key: secret\n",
            roles = spec
                .roles
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    docs.join("---\n")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::proto::Role;

    pub(crate) fn head() -> HeadInfo {
        HeadInfo {
            addr: "10.0.0.1:7000".parse().unwrap(),
            secret_hex: "00".repeat(32),
            exe: PathBuf::from("/opt/gyre/bin/gyre"),
            head_wait: Duration::ZERO,
            incarnation: 0,
        }
    }

    pub(crate) fn specs() -> Vec<NodeSpec> {
        vec![
            NodeSpec {
                node: NodeId(10),
                roles: vec![Role::Cell(0)],
            },
            NodeSpec {
                node: NodeId(5),
                roles: vec![Role::Pool],
            },
        ]
    }

    #[test]
    fn local_and_slurm_run_the_same_node_agent_and_keep_the_secret_off_the_command_line() {
        let local = Processes::new(Launch::Local, head());
        let agent = local.command_line(&specs()[0]);
        assert_eq!(
            agent,
            [
                "/opt/gyre/bin/gyre",
                "node",
                "--head",
                "10.0.0.1:7000",
                "--node",
                "10"
            ]
        );
        let slurm = Processes::new(
            Launch::Slurm {
                extra: vec!["--partition=gpu".into()],
            },
            head(),
        );
        let line = slurm.command_line(&specs()[0]);
        assert_eq!(line[0], "srun");
        assert!(line.contains(&"--job-name=gyre-node-10".to_string()));
        assert!(line.contains(&format!("--export=ALL,{SECRET_ENV}")));
        assert!(line.contains(&"--partition=gpu".to_string()));
        assert!(line.ends_with(&agent), "srun runs the node agent: {line:?}");
        for l in [&agent, &line] {
            assert!(!l.iter().any(|a| a.contains(&head().secret_hex)));
        }
        assert_eq!(slurm.name(), "slurm");
    }

    #[test]
    fn agents_of_a_resumable_run_are_told_to_wait_for_a_new_head() {
        let waiting = HeadInfo {
            head_wait: Duration::from_secs(60),
            incarnation: 2,
            ..head()
        };
        let line = Processes::new(Launch::Local, waiting).command_line(&specs()[0]);
        assert!(line.ends_with(&[
            "--head-wait-s".to_string(),
            "60".into(),
            "--incarnation".into(),
            "2".into()
        ]));
        let plain = Processes::new(Launch::Local, head()).command_line(&specs()[0]);
        assert!(
            !plain
                .iter()
                .any(|a| a.starts_with("--head-wait") || a == "--incarnation")
        );
    }

    #[test]
    fn an_adopted_process_is_waited_for_and_fenced_by_pid() {
        let p = Processes::new(Launch::Local, head());
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!p.adopt(NodeId(10), u32::MAX), "no such process");
        assert!(p.adopt(NodeId(10), pid));
        assert!(!p.kill(NodeId(10), pid + 1), "another pid is left alone");
        assert!(p.kill(NodeId(10), pid));
        // Reaped here (the test is its parent); an orphan's init reaps it.
        child.wait().unwrap();
        let ended = p.wait(NodeId(10)).unwrap();
        assert!(ended.contains("adopted"), "{ended}");
    }

    #[test]
    fn the_batch_script_starts_one_step_per_node_and_waits() {
        let s = sbatch_script(&head(), &specs(), "gyre");
        assert!(s.starts_with("#!/bin/bash\n#SBATCH --job-name=gyre\n#SBATCH --nodes=2\n"));
        assert_eq!(s.matches("srun ").count(), 2);
        assert!(s.contains("--node 5 &\n"));
        assert!(s.contains("# node 5 (pool)\n"));
        assert!(s.ends_with("wait\n"));
        assert!(!s.contains(&head().secret_hex));
    }

    #[test]
    fn the_kubernetes_manifest_has_one_job_per_node_reading_the_secret() {
        let m = kubernetes_manifest(&specs(), "gyre:dev", "gyre-head", 7000, "gyre-secret");
        let docs: Vec<&str> = m.split("---\n").collect();
        assert_eq!(docs.len(), 2);
        assert!(docs[0].contains("name: gyre-node-10\n"));
        assert!(docs[0].contains("gyre/roles: \"cell 0\""));
        assert!(docs[1].contains(
            "args: [\"node\", \"--head\", \"gyre-head:7000\", \"--node\", \"5\", \"--bind\", \"0.0.0.0\"]"
        ));
        assert!(m.contains(&format!("- name: {SECRET_ENV}\n")));
        assert!(m.contains("name: gyre-secret\n"));
        assert!(m.contains("restartPolicy: Never\n"));
    }
}
