//! Placements that hand the node agents to a cluster manager's own job
//! submission and let them connect back to the head: `slurm-batch` submits
//! the generated batch script with `sbatch` (every agent one step of one
//! allocation), `k8s` applies the generated Kubernetes Jobs, with the
//! cluster secret as a Secret, through `kubectl`.
//!
//! The head does not own these processes, so "waiting for a node" is
//! polling the manager: under Slurm until the node's step (named
//! `gyre-node-N`) is gone from the job's steps, under Kubernetes until the
//! job has ended; a node agent that dies inside a job that goes on is also
//! caught by its link (`watch_node`), as with every placement. Under
//! Slurm a lost agent is started again as a new step of the same
//! allocation (`srun --jobid=JOB --overlap`, a child of the head like the
//! `slurm` placement's steps), and a hung one is fenced by cancelling its
//! step (`scancel --signal=KILL JOB.STEP`). Under Kubernetes a lost agent's
//! Job (which never restarts its pod) is deleted and applied again alone,
//! and a hung one is fenced by deleting its Job (its pod goes with it).
//! The secret reaches the manager
//! only through the environment (`sbatch --export`) or `kubectl`'s stdin,
//! never a command line.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gyre_runtime::NodeId;

use super::placement::{
    HeadInfo, Launch, Placement, Processes, SECRET_ENV, kubernetes_manifest, sbatch_script,
    step_name,
};
use super::proto::NodeSpec;
use crate::embedded::shared::lock;

/// How often a manager is asked whether a job is still running.
const POLL: Duration = Duration::from_millis(500);

/// Runs `program args`, feeding `stdin`, with the secret in the
/// environment; its stdout, or an error naming the command and its stderr.
fn run_tool(
    program: &str,
    args: &[String],
    stdin: Option<&str>,
    secret: &str,
) -> Result<String, String> {
    let shown = format!("`{program} {}`", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .env(SECRET_ENV, secret)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {shown}: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("writing to {shown}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `sbatch` of [`sbatch_script`]: one submission for every node agent.
pub struct SlurmBatch {
    head: HeadInfo,
    specs: Vec<NodeSpec>,
    /// Extra `sbatch` arguments (they override the script's directives).
    extra: Vec<String>,
    /// The submitted job's id, once submitted.
    job: Mutex<Option<Result<u32, String>>>,
    /// Nodes the batch script started, and those started again since as
    /// steps of their own (`again`).
    launched: Mutex<BTreeSet<NodeId>>,
    restarted: Mutex<BTreeSet<NodeId>>,
    again: Mutex<Option<std::sync::Arc<Processes>>>,
    /// The job's steps (`squeue -s`: `ID NAME` lines) as last read, and
    /// when, shared by every node's wait so the controller is asked once
    /// per poll however many nodes there are.
    steps: Mutex<Option<(Instant, String)>>,
}

impl SlurmBatch {
    pub fn new(head: HeadInfo, specs: Vec<NodeSpec>, extra: Vec<String>) -> Self {
        Self {
            head,
            specs,
            extra,
            job: Mutex::default(),
            launched: Mutex::default(),
            restarted: Mutex::default(),
            again: Mutex::default(),
            steps: Mutex::default(),
        }
    }

    /// The job's steps as `ID NAME` lines, read at most once per poll.
    fn steps(&self, job: u32) -> Result<String, String> {
        let mut cached = lock(&self.steps);
        if let Some((at, text)) = cached.as_ref()
            && at.elapsed() < POLL
        {
            return Ok(text.clone());
        }
        let args = ["-h", "-s", "-j", &job.to_string(), "-o", "%i %j"].map(String::from);
        let text = match run_tool("squeue", &args, None, "") {
            Ok(text) => text,
            Err(e) if e.contains("Invalid job id") => String::new(),
            Err(e) => return Err(e),
        };
        *cached = Some((Instant::now(), text.clone()));
        Ok(text)
    }

    /// The job's state (`PENDING`, `RUNNING`, …; empty once squeue has
    /// forgotten a finished job).
    fn state(job: u32) -> Result<String, String> {
        let args = ["-h", "-j", &job.to_string(), "-o", "%T"].map(String::from);
        match run_tool("squeue", &args, None, "") {
            Ok(state) => Ok(state),
            Err(e) if e.contains("Invalid job id") => Ok(String::new()),
            Err(e) => Err(e),
        }
    }

    /// The backend that starts agents again as steps of `job`.
    fn again(&self, job: u32) -> std::sync::Arc<Processes> {
        lock(&self.again)
            .get_or_insert_with(|| {
                let launch = Launch::Slurm {
                    extra: vec![format!("--jobid={job}")],
                };
                std::sync::Arc::new(Processes::new(launch, self.head.clone()))
            })
            .clone()
    }

    fn was_restarted(&self, node: NodeId) -> bool {
        lock(&self.restarted).contains(&node)
    }

    /// The `sbatch` arguments; the script comes on stdin.
    pub fn sbatch_args(&self) -> Vec<String> {
        let out = std::env::temp_dir().join("gyre-batch-%j.out");
        let mut args = vec![
            "--parsable".to_string(),
            format!("--export=ALL,{SECRET_ENV}"),
            format!("--output={}", out.display()),
        ];
        args.extend(self.extra.iter().cloned());
        args
    }

    fn submit(&self) -> Result<u32, String> {
        let script = sbatch_script(&self.head, &self.specs, "gyre");
        let out = run_tool(
            "sbatch",
            &self.sbatch_args(),
            Some(&script),
            &self.head.secret_hex,
        )?;
        // `--parsable` prints `id` or `id;cluster`.
        out.split(';')
            .next()
            .and_then(|id| id.trim().parse().ok())
            .ok_or_else(|| format!("sbatch printed no job id: {out:?}"))
    }

    fn job(&self) -> Result<u32, String> {
        lock(&self.job)
            .clone()
            .unwrap_or_else(|| Err("the batch job was never submitted".into()))
    }
}

/// A Slurm job state after which nothing of the job runs.
fn slurm_job_over(state: &str) -> bool {
    !matches!(
        state,
        "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "RESIZING"
    )
}

impl Placement for SlurmBatch {
    fn name(&self) -> &'static str {
        "slurm-batch"
    }

    /// Submits the one batch job on the first call; every node agent is
    /// one of its steps, so later calls answer the same job id. A node
    /// launched before is being restarted: a new step of the same job,
    /// whose `srun` is the head's child (its pid is returned).
    fn launch(&self, spec: &NodeSpec) -> Result<u32, String> {
        let id = {
            let mut job = lock(&self.job);
            job.get_or_insert_with(|| self.submit()).clone()?
        };
        if !lock(&self.launched).insert(spec.node) {
            lock(&self.restarted).insert(spec.node);
            return self.again(id).launch(spec);
        }
        Ok(id)
    }

    /// Until the node's step is gone from the job (or the job is over).
    fn wait(&self, node: NodeId) -> Result<String, String> {
        let id = self.job()?;
        if self.was_restarted(node) {
            return self.again(id).wait(node);
        }
        let name = step_name(node);
        let mut seen = false;
        loop {
            let running = step_of(&self.steps(id)?, &name).is_some();
            seen |= running;
            // A step never seen may not have started yet: only the job's
            // end ends it.
            if !running {
                let state = Self::state(id)?;
                if state.is_empty() || slurm_job_over(&state) {
                    let state = if state.is_empty() { "gone" } else { &state };
                    return Ok(format!("batch job {id} ended ({state})"));
                }
                if seen {
                    return Ok(format!("its step {name} of batch job {id} ended"));
                }
            }
            std::thread::sleep(POLL);
        }
    }

    fn restarts(&self) -> bool {
        true
    }

    /// Cancels the node's step with SIGKILL (its `srun`, if restarted).
    fn kill(&self, node: NodeId, pid: u32) -> bool {
        let Ok(id) = self.job() else {
            return false;
        };
        if self.was_restarted(node) {
            return self.again(id).kill(node, pid);
        }
        lock(&self.steps).take();
        let Ok(steps) = self.steps(id) else {
            return false;
        };
        let Some(step) = step_of(&steps, &step_name(node)) else {
            return false;
        };
        tracing::warn!(
            node = node.0,
            step,
            "fencing a node agent whose link was lost"
        );
        let args = ["--signal=KILL".to_string(), step.to_string()];
        match run_tool("scancel", &args, None, "") {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(node = node.0, step, error = %e, "cancelling the step");
                false
            }
        }
    }

    fn stop_all(&self) {
        if let Ok(id) = self.job()
            && let Err(e) = run_tool("scancel", &[id.to_string()], None, "")
        {
            tracing::warn!(job = id, error = %e, "cancelling the batch job");
        }
        if let Some(again) = lock(&self.again).as_ref() {
            again.stop_all();
        }
    }
}

/// The id (`JOB.STEP`) of the step named `name` in `squeue -s -o "%i %j"`
/// lines.
fn step_of<'a>(steps: &'a str, name: &str) -> Option<&'a str> {
    steps.lines().find_map(|l| {
        let (id, n) = l.trim().split_once(' ')?;
        (n.trim() == name).then_some(id)
    })
}

/// The Secret holding the cluster secret (key `secret`, hex), for the
/// Jobs of [`kubernetes_manifest`].
pub fn kubernetes_secret(name: &str, secret_hex: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  labels:\n    app: gyre\n\
         type: Opaque\nstringData:\n  secret: \"{secret_hex}\"\n"
    )
}

/// `kubectl apply` of the Secret and one Job per node agent.
pub struct KubernetesJobs {
    head: HeadInfo,
    specs: Vec<NodeSpec>,
    image: String,
    /// The head's address as pods reach it.
    head_host: String,
    applied: Mutex<Option<Result<(), String>>>,
    /// Nodes whose Job was applied (a second launch is a restart).
    launched: Mutex<BTreeSet<NodeId>>,
    /// The `kubectl` program (a test names a double).
    kubectl: String,
}

/// The Secret's name.
const K8S_SECRET: &str = "gyre-cluster-secret";

impl KubernetesJobs {
    pub fn new(head: HeadInfo, specs: Vec<NodeSpec>, image: String, head_host: String) -> Self {
        Self {
            head,
            specs,
            image,
            head_host,
            applied: Mutex::default(),
            launched: Mutex::default(),
            kubectl: "kubectl".into(),
        }
    }

    /// Runs `program` instead of `kubectl`.
    pub fn with_kubectl(mut self, program: &str) -> Self {
        self.kubectl = program.into();
        self
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let args: Vec<String> = args.iter().map(ToString::to_string).collect();
        run_tool(&self.kubectl, &args, stdin, "")
    }

    /// Node `node`'s Job, as `kubectl` names it.
    fn job(node: NodeId) -> String {
        format!("job/{}", step_name(node))
    }

    /// Deletes `node`'s Job and with it its pod, if any is left.
    fn delete(&self, node: NodeId) -> Result<String, String> {
        let job = Self::job(node);
        self.kubectl(&["delete", &job, "--ignore-not-found", "--wait=true"], None)
    }

    /// Everything `kubectl apply -f -` is fed: the Secret, then the Jobs.
    pub fn documents(&self) -> String {
        format!(
            "{}---\n{}",
            kubernetes_secret(K8S_SECRET, &self.head.secret_hex),
            kubernetes_manifest(
                &self.specs,
                &self.image,
                &self.head_host,
                self.head.addr.port(),
                K8S_SECRET,
            )
        )
    }

    /// Applies every document, after deleting the Jobs an earlier run
    /// left (a lost head's: a Job's template cannot be changed in place,
    /// and a resumed run's agents join another head).
    fn apply(&self) -> Result<(), String> {
        let leftovers = [
            "delete",
            "job",
            "-l",
            "app=gyre",
            "--ignore-not-found",
            "--wait=true",
        ];
        self.kubectl(&leftovers, None)?;
        self.kubectl(&["apply", "-f", "-"], Some(&self.documents()))
            .map(|_| ())
    }
}

impl Placement for KubernetesJobs {
    fn name(&self) -> &'static str {
        "k8s"
    }

    /// Applies every document on the first call. A node launched before is
    /// being restarted: its old Job (ended, or fenced) is deleted and its
    /// Job alone applied again (the Secret stays).
    fn launch(&self, spec: &NodeSpec) -> Result<u32, String> {
        lock(&self.applied)
            .get_or_insert_with(|| self.apply())
            .clone()?;
        if !lock(&self.launched).insert(spec.node) {
            self.delete(spec.node)?;
            let job = kubernetes_manifest(
                std::slice::from_ref(spec),
                &self.image,
                &self.head_host,
                self.head.addr.port(),
                K8S_SECRET,
            );
            self.kubectl(&["apply", "-f", "-"], Some(&job))?;
        }
        Ok(0)
    }

    fn wait(&self, node: NodeId) -> Result<String, String> {
        let job = Self::job(node);
        let jsonpath = "jsonpath={.status.succeeded},{.status.failed}";
        loop {
            let status = match self.kubectl(&["get", &job, "-o", jsonpath], None) {
                Ok(status) => status,
                // Deleted (fenced, or by hand): nothing of it runs.
                Err(e) if e.contains("NotFound") || e.contains("not found") => {
                    return Ok(format!("{job} was deleted"));
                }
                Err(e) => return Err(e),
            };
            match status.split_once(',') {
                Some((ok, _)) if !ok.is_empty() && ok != "0" => {
                    return Ok(format!("{job} succeeded"));
                }
                Some((_, failed)) if !failed.is_empty() && failed != "0" => {
                    return Ok(format!("{job} failed"));
                }
                _ => std::thread::sleep(POLL),
            }
        }
    }

    fn restarts(&self) -> bool {
        true
    }

    /// Deletes the node's Job (its pod with it); `pid` is unknown here.
    fn kill(&self, node: NodeId, _pid: u32) -> bool {
        tracing::warn!(node = node.0, "fencing a node agent whose link was lost");
        match self.kubectl(&["delete", &Self::job(node), "--wait=false"], None) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(node = node.0, error = %e, "deleting the node's Job");
                false
            }
        }
    }

    fn stop_all(&self) {
        for what in [["job", "-l", "app=gyre"], ["secret", "-l", "app=gyre"]] {
            let mut args = vec!["delete"];
            args.extend(what);
            if let Err(e) = self.kubectl(&args, None) {
                tracing::warn!(error = %e, "cleaning up the Kubernetes Jobs");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::placement::tests::{head, specs};

    #[test]
    fn sbatch_gets_the_secret_by_environment_and_extra_arguments_last() {
        let b = SlurmBatch::new(head(), specs(), vec!["--nodes=1".into()]);
        let args = b.sbatch_args();
        assert_eq!(args[0], "--parsable");
        assert!(args.contains(&format!("--export=ALL,{SECRET_ENV}")));
        assert_eq!(args.last().unwrap(), "--nodes=1");
        assert!(!args.iter().any(|a| a.contains(&head().secret_hex)));
        assert!(slurm_job_over("COMPLETED") && slurm_job_over("CANCELLED"));
        assert!(!slurm_job_over("PENDING") && !slurm_job_over("RUNNING"));
    }

    /// A test double of `kubectl` (the cluster manager is not what the
    /// test is about): it logs each command line and what `apply` reads,
    /// and answers `get job/X` from the file `job_X` in its directory,
    /// or with kubectl's NotFound error when there is none.
    fn kubectl_double(dir: &std::path::Path) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("kubectl");
        let d = dir.display();
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"$*\" >> {d}/log\ncase \"$1\" in\n\
                 apply) cat >> {d}/log; echo '=== end' >> {d}/log;;\n\
                 get) f={d}/$(echo \"$2\" | tr / _); if [ -f \"$f\" ]; then cat \"$f\"; else \
                 echo 'Error from server (NotFound): jobs.batch not found' >&2; exit 1; fi;;\nesac\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    #[test]
    fn kubernetes_restarts_a_lost_agent_by_its_job_alone_and_fences_by_deleting_it() {
        let dir = std::env::temp_dir().join(format!("gyre-kubectl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let k = KubernetesJobs::new(head(), specs(), "gyre:dev".into(), "gyre-head".into())
            .with_kubectl(&kubectl_double(&dir));
        let log = || std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        assert!(k.restarts());
        let (cell0, pool) = (&specs()[0], &specs()[1]);
        k.launch(cell0).unwrap();
        k.launch(pool).unwrap();
        assert!(
            log()
                .starts_with("delete job -l app=gyre --ignore-not-found --wait=true\napply -f -\n"),
            "an earlier run's Jobs go first: {}",
            log()
        );
        assert_eq!(log().matches("apply -f -").count(), 1, "{}", log());
        assert_eq!(log().matches("kind: Job").count(), 2);
        // The pod died: its Job failed.
        std::fs::write(dir.join("job_gyre-node-10"), ",1").unwrap();
        assert_eq!(k.wait(NodeId(10)).unwrap(), "job/gyre-node-10 failed");
        // Restarted: the old Job goes, the node's Job alone comes back.
        k.launch(cell0).unwrap();
        let text = log();
        let (_, restart) = text.split_once("=== end\n").unwrap();
        assert!(
            restart
                .contains("\ndelete job/gyre-node-10 --ignore-not-found --wait=true\napply -f -\n"),
            "{restart}"
        );
        assert_eq!(restart.matches("kind: Job").count(), 1, "{restart}");
        assert!(restart.contains("name: gyre-node-10") && !restart.contains("kind: Secret"));
        // Hung: fenced by deleting its Job, which then reads as ended.
        std::fs::remove_file(dir.join("job_gyre-node-10")).unwrap();
        assert!(k.kill(NodeId(10), 0));
        assert!(
            log().ends_with("delete job/gyre-node-10 --wait=false\n"),
            "{}",
            log()
        );
        assert_eq!(k.wait(NodeId(10)).unwrap(), "job/gyre-node-10 was deleted");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_nodes_step_is_found_by_its_name() {
        let steps = "29.0 gyre-node-11\n29.1 gyre-node-12\n29.batch batch\n";
        assert_eq!(step_of(steps, &step_name(NodeId(12))), Some("29.1"));
        assert_eq!(step_of(steps, &step_name(NodeId(1))), None);
        assert_eq!(step_of("", "gyre-node-11"), None);
    }

    /// Golden: the exact documents `kubectl apply -f -` is fed for a cell
    /// and the pool: the Secret first (the cluster secret, hex, as
    /// `stringData.secret`), then one Job per node agent, each naming its
    /// node and roles, joining the head at the given host and the head's
    /// port, binding 0.0.0.0, never restarted, reading the secret from the
    /// Secret. Regenerate with `GYRE_BLESS=1` after a deliberate change.
    #[test]
    fn the_kubernetes_documents_match_the_golden_file() {
        let k = KubernetesJobs::new(head(), specs(), "gyre:dev".into(), "gyre-head".into());
        let got = k.documents();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/k8s-jobs.yaml");
        if std::env::var_os("GYRE_BLESS").is_some() {
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap();
        assert_eq!(got, want, "the manifest changed; see {}", path.display());
        assert_eq!(got.matches("kind: Job\n").count(), 2);
        assert_eq!(got.matches("kind: Secret\n").count(), 1);
    }
}
