//! The launcher actor: starts the node agents through a placement backend,
//! watches them, and tells the head what happened to each.
//!
//! Starting and waiting for a process block, so both are I/O requests:
//! `launcher.launch` starts a node agent and answers its process id, then
//! `launcher.wait` waits for that process to end and answers how it ended.
//! A node agent that joins is also watched over its link (`watch_node`),
//! so a node that hangs or is cut off is reported as well as one that
//! exits. Node agents address the launcher at a well-known id
//! ([`super::proto::launcher_id`]); their events pass through it to the
//! head. Everything unexpected (a process that ends before the head asked
//! it to, a lost link) is reported once, naming the node and its roles;
//! recovery is the scheduler's business, not the launcher's.
//!
//! A resumed head's launcher first waits a while for the agents the lost
//! head left running (they wait for a new head, and every agent says which
//! head incarnation started it): an agent of an earlier incarnation whose
//! process the lost head recorded is adopted (the placement watches and
//! fences it as if launched here, [`Placement::adopt`]), and only the
//! nodes none came back for are launched. An earlier incarnation's agent
//! that comes later, or that nobody expects, is told to stop, so a node
//! never has two agents.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gyre_runtime::{Actor, ActorId, Addr, Cx, External, IoError, IoRequest, NodeId};
use serde::{Deserialize, Serialize};

use super::placement::Placement;
use super::proto::{NodeCmd, NodeEvent, NodeSpec};

/// What the launcher tells the head.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClusterEvent {
    /// A node agent's process is running.
    Started { node: NodeId, pid: u32 },
    /// A node agent could not be started.
    LaunchFailed {
        node: NodeId,
        label: String,
        error: String,
    },
    /// A node agent's own message, passed on.
    Node(NodeEvent),
    /// A node agent's process ended (`expected` once the head stopped it).
    Exited {
        node: NodeId,
        label: String,
        status: String,
        expected: bool,
    },
    /// A joined node agent's link went down.
    LinkDown { node: NodeId, label: String },
    /// The process an earlier head started for `node` joined this head
    /// and was adopted in place of a new one.
    Adopted { node: NodeId, pid: u32 },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum LauncherMsg {
    /// From a node agent.
    Node(NodeEvent),
    /// From the head: the run is over; exits from now on are expected.
    Stopping,
    /// From the head: start `node`'s agent again (its process ended
    /// mid-run). Its next loss is reported like the first.
    Restart {
        node: NodeId,
    },
    Launched {
        node: NodeId,
        result: Result<u32, String>,
    },
    Ended {
        node: NodeId,
        result: Result<String, String>,
    },
    Fenced {
        node: NodeId,
        killed: bool,
    },
}

impl From<NodeEvent> for LauncherMsg {
    fn from(e: NodeEvent) -> Self {
        LauncherMsg::Node(e)
    }
}

struct LaunchNode {
    placement: Arc<dyn Placement>,
    spec: NodeSpec,
}

impl IoRequest for LaunchNode {
    type Output = u32;
    fn kind(&self) -> &'static str {
        "launcher.launch"
    }
    fn run(self) -> Result<u32, IoError> {
        self.placement.launch(&self.spec).map_err(IoError::Failed)
    }
}

/// Kills a node agent whose link was lost (see [`Placement::kill`]).
struct FenceNode {
    placement: Arc<dyn Placement>,
    node: NodeId,
    pid: u32,
}

impl IoRequest for FenceNode {
    type Output = bool;
    fn kind(&self) -> &'static str {
        "launcher.fence"
    }
    fn run(self) -> Result<bool, IoError> {
        Ok(self.placement.kill(self.node, self.pid))
    }
}

struct WaitNode {
    placement: Arc<dyn Placement>,
    node: NodeId,
}

impl IoRequest for WaitNode {
    type Output = String;
    fn kind(&self) -> &'static str {
        "launcher.wait"
    }
    fn run(self) -> Result<String, IoError> {
        self.placement.wait(self.node).map_err(IoError::Failed)
    }
}

pub struct Launcher {
    placement: Arc<dyn Placement>,
    specs: BTreeMap<NodeId, NodeSpec>,
    head: Addr<External<ClusterEvent>>,
    stopping: bool,
    /// Nodes whose loss was already reported.
    reported: BTreeSet<NodeId>,
    /// The process last started (or adopted) for each node.
    pids: BTreeMap<NodeId, u32>,
    /// This head's incarnation ([`NodeEvent::Joined`]).
    incarnation: u64,
    /// Nodes whose earlier process may still join, by that process, until
    /// the adoption window closes.
    expected: BTreeMap<NodeId, u32>,
    adopt_for: std::time::Duration,
    /// When the adoption window closes (the host's clock, ns).
    adopt_until: u64,
    /// Nodes this launcher launched or adopted.
    placed: BTreeSet<NodeId>,
    /// Each node's agent as it last joined (process, transfer address,
    /// command endpoint): an agent says it joined until it hears from the
    /// head, so repeats are dropped here. A restarted agent spawns the same
    /// endpoint ids, so the process and the address tell it apart.
    joined: BTreeMap<NodeId, (u32, std::net::SocketAddr, ActorId)>,
}

impl Launcher {
    pub fn new(
        placement: Arc<dyn Placement>,
        specs: Vec<NodeSpec>,
        head: Addr<External<ClusterEvent>>,
    ) -> Self {
        Self {
            placement,
            specs: specs.into_iter().map(|s| (s.node, s)).collect(),
            head,
            stopping: false,
            reported: BTreeSet::new(),
            pids: BTreeMap::new(),
            incarnation: 0,
            expected: BTreeMap::new(),
            adopt_for: std::time::Duration::ZERO,
            adopt_until: 0,
            placed: BTreeSet::new(),
            joined: BTreeMap::new(),
        }
    }

    /// A resumed head's launcher (`incarnation` > 0): for up to `window`
    /// it waits for the agents an earlier head started for these nodes
    /// (`earlier`, by process, as that head recorded them) before it
    /// launches any of them.
    pub fn adopting(
        mut self,
        incarnation: u64,
        earlier: BTreeMap<NodeId, u32>,
        window: std::time::Duration,
    ) -> Self {
        self.incarnation = incarnation;
        self.expected = earlier;
        self.adopt_for = window;
        self
    }

    fn launch(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        let Some(spec) = self.specs.get(&node) else {
            return;
        };
        self.placed.insert(node);
        let req = LaunchNode {
            placement: self.placement.clone(),
            spec: spec.clone(),
        };
        cx.io(req, move |r| LauncherMsg::Launched {
            node,
            result: r.map_err(|e| e.to_string()),
        });
    }

    /// Waits for `node`'s process to end, as for one launched here.
    fn wait_for(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        let req = WaitNode {
            placement: self.placement.clone(),
            node,
        };
        cx.io(req, move |r| LauncherMsg::Ended {
            node,
            result: r.map_err(|e| e.to_string()),
        });
    }

    /// An agent an earlier head started joined: adopt it if its node
    /// expects it, else stop it. Whether it was adopted.
    fn adopt(
        &mut self,
        node: NodeId,
        commands: Addr<External<NodeCmd>>,
        cx: &mut Cx<'_, Self>,
    ) -> bool {
        let pid = self
            .expected
            .remove(&node)
            .filter(|&pid| !self.placed.contains(&node) && self.placement.adopt(node, pid));
        let Some(pid) = pid else {
            tracing::warn!(
                node = node.0,
                "a node agent of an earlier head joined too late or unexpected: stopping it"
            );
            cx.send(commands, NodeCmd::Stop);
            return false;
        };
        self.placed.insert(node);
        self.pids.insert(node, pid);
        tracing::info!(
            node = node.0,
            pid,
            "adopted the node agent an earlier head left running"
        );
        cx.send(self.head, ClusterEvent::Adopted { node, pid });
        self.wait_for(node, cx);
        if self.expected.is_empty() {
            tracing::info!("every node agent left running was adopted");
        }
        true
    }

    /// Launches the nodes no earlier agent came back for.
    fn close_adoption(&mut self, cx: &mut Cx<'_, Self>) {
        let left: Vec<NodeId> = std::mem::take(&mut self.expected).into_keys().collect();
        for node in left {
            if !self.placed.contains(&node) {
                self.launch(node, cx);
            }
        }
    }

    fn label(&self, node: NodeId) -> String {
        self.specs
            .get(&node)
            .map_or_else(|| format!("node {}", node.0), NodeSpec::label)
    }
}

/// How often the launcher looks, inside the adoption window, whether an
/// awaited agent's process ended.
const ADOPT_POLL_NS: u64 = 100_000_000;

impl Actor for Launcher {
    type Msg = LauncherMsg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        // Only a process still running can come back.
        self.expected
            .retain(|_, pid| super::placement::process_runs(*pid));
        let nodes: Vec<NodeId> = self.specs.keys().copied().collect();
        for node in nodes {
            if !self.expected.contains_key(&node) {
                self.launch(node, cx);
            }
        }
        if !self.expected.is_empty() {
            tracing::info!(
                nodes = self.expected.len(),
                window_s = self.adopt_for.as_secs_f64(),
                "waiting for the node agents an earlier head left running"
            );
            let window = u64::try_from(self.adopt_for.as_nanos()).unwrap_or(u64::MAX);
            self.adopt_until = cx.now().saturating_add(window);
            cx.set_timer((), window.min(ADOPT_POLL_NS));
        }
    }

    /// Inside the adoption window: a node whose awaited process ended (an
    /// agent that exits with its head, or one that crashed) is launched at
    /// once rather than when the window closes.
    fn on_timer(&mut self, _timer: (), cx: &mut Cx<'_, Self>) {
        if self.expected.is_empty() {
            return;
        }
        let now = cx.now();
        if now >= self.adopt_until {
            self.close_adoption(cx);
            return;
        }
        let ended: Vec<NodeId> = self
            .expected
            .iter()
            .filter(|(_, pid)| !super::placement::process_runs(**pid))
            .map(|(node, _)| *node)
            .collect();
        for node in ended {
            self.expected.remove(&node);
            if !self.placed.contains(&node) {
                tracing::info!(
                    node = node.0,
                    "the node agent an earlier head left ended before it came back: launching"
                );
                self.launch(node, cx);
            }
        }
        if !self.expected.is_empty() {
            cx.set_timer((), (self.adopt_until - now).min(ADOPT_POLL_NS));
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: LauncherMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            LauncherMsg::Node(event) => {
                if let NodeEvent::Joined {
                    node,
                    pid,
                    transfer,
                    commands,
                    incarnation,
                } = &event
                {
                    let agent = (*pid, *transfer, commands.id());
                    if self.joined.get(node) == Some(&agent) {
                        return;
                    }
                    self.joined.insert(*node, agent);
                    if *incarnation < self.incarnation && !self.adopt(*node, *commands, cx) {
                        return;
                    }
                    cx.watch_node(*node);
                }
                cx.send(self.head, ClusterEvent::Node(event));
            }
            LauncherMsg::Stopping => self.stopping = true,
            LauncherMsg::Restart { node } if !self.stopping => {
                self.reported.remove(&node);
                self.launch(node, cx);
            }
            LauncherMsg::Restart { .. } => {}
            LauncherMsg::Fenced { node, killed } => {
                tracing::debug!(node = node.0, killed, "fenced");
            }
            LauncherMsg::Launched { node, result } => match result {
                Ok(pid) => {
                    self.pids.insert(node, pid);
                    cx.send(self.head, ClusterEvent::Started { node, pid });
                    self.wait_for(node, cx);
                }
                Err(error) => {
                    let label = self.label(node);
                    cx.send(self.head, ClusterEvent::LaunchFailed { node, label, error });
                }
            },
            LauncherMsg::Ended { node, result } => {
                let status = result.unwrap_or_else(|e| e);
                let expected = self.stopping;
                self.reported.insert(node);
                let label = self.label(node);
                cx.send(
                    self.head,
                    ClusterEvent::Exited {
                        node,
                        label,
                        status,
                        expected,
                    },
                );
            }
        }
    }

    fn on_peer_down(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        if self.stopping || !self.reported.insert(node) {
            return;
        }
        let label = self.label(node);
        cx.send(self.head, ClusterEvent::LinkDown { node, label });
        // A link lost while its process still runs (a hung agent, a cut
        // network): the process is fenced, so its exit is seen and the
        // node can be started again; it would not be trusted back anyway.
        let Some(&pid) = self.pids.get(&node) else {
            return;
        };
        let req = FenceNode {
            placement: self.placement.clone(),
            node,
            pid,
        };
        cx.io(req, move |r| LauncherMsg::Fenced {
            node,
            killed: r.unwrap_or(false),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::proto::Role;
    use gyre_runtime::live::{LiveConfig, LiveNode};
    use std::sync::Mutex;

    /// A placement test double: "processes" that end when the test says.
    #[derive(Default)]
    struct Scripted {
        ends: Mutex<BTreeMap<NodeId, std::sync::mpsc::Receiver<String>>>,
        senders: Mutex<BTreeMap<NodeId, std::sync::mpsc::Sender<String>>>,
    }

    impl Placement for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn launch(&self, spec: &NodeSpec) -> Result<u32, String> {
            if spec.node == NodeId(13) {
                return Err("no such machine".into());
            }
            let (tx, rx) = std::sync::mpsc::channel();
            self.ends.lock().unwrap().insert(spec.node, rx);
            self.senders.lock().unwrap().insert(spec.node, tx);
            Ok(1000 + spec.node.0)
        }
        fn wait(&self, node: NodeId) -> Result<String, String> {
            let rx = self.ends.lock().unwrap().remove(&node).ok_or("unknown")?;
            rx.recv().map_err(|e| e.to_string())
        }
        fn stop_all(&self) {}
        fn adopt(&self, node: NodeId, _pid: u32) -> bool {
            let (tx, rx) = std::sync::mpsc::channel();
            self.ends.lock().unwrap().insert(node, rx);
            self.senders.lock().unwrap().insert(node, tx);
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_launcher_adopts_the_agents_that_come_back_and_stops_late_ones() {
        let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
            .await
            .unwrap();
        let (probe, mut rx) = node.probe::<ClusterEvent>(16);
        let (commands, mut cmds) = node.probe::<NodeCmd>(16);
        let (fresh, _fresh_cmds) = node.probe::<NodeCmd>(16);
        let placement = Arc::new(Scripted::default());
        let spec = |n, r| NodeSpec {
            node: NodeId(n),
            roles: vec![r],
        };
        // Nodes 10 and 11 had processes that still run (this one stands
        // in); node 12's is gone, so it is launched at once.
        let me = std::process::id();
        let gone = {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            pid
        };
        let launcher = node.spawn(
            Launcher::new(
                placement.clone(),
                vec![
                    spec(10, Role::Cell(0)),
                    spec(11, Role::Cell(1)),
                    spec(12, Role::Pool),
                ],
                probe,
            )
            .adopting(
                1,
                BTreeMap::from([(NodeId(10), me), (NodeId(11), me), (NodeId(12), gone)]),
                std::time::Duration::from_millis(300),
            ),
        );
        let launcher = Addr::<Launcher>::new(launcher.id());
        let joined = |n: u32, incarnation: u64| {
            LauncherMsg::Node(NodeEvent::Joined {
                node: NodeId(n),
                pid: 4242,
                transfer: "127.0.0.1:9".parse().unwrap(),
                commands: if incarnation == 0 { commands } else { fresh },
                incarnation,
            })
        };
        let next = async |rx: &mut tokio::sync::mpsc::Receiver<(ActorId, ClusterEvent)>| {
            tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
                .await
                .expect("an event")
                .unwrap()
                .1
        };
        match next(&mut rx).await {
            ClusterEvent::Started { node, .. } => assert_eq!(node, NodeId(12)),
            other => panic!("unexpected {other:?}"),
        }
        // Node 10's earlier agent comes back in time: adopted under the
        // pid the lost head recorded, and its join passed on.
        node.send(commands.id(), launcher, joined(10, 0))
            .await
            .unwrap();
        match next(&mut rx).await {
            ClusterEvent::Adopted { node, pid } => assert_eq!((node, pid), (NodeId(10), me)),
            other => panic!("unexpected {other:?}"),
        }
        match next(&mut rx).await {
            ClusterEvent::Node(NodeEvent::Joined { node, .. }) => assert_eq!(node, NodeId(10)),
            other => panic!("unexpected {other:?}"),
        }
        // It says so again until the head answers: the repeat is dropped.
        node.send(commands.id(), launcher, joined(10, 0))
            .await
            .unwrap();
        // Node 11's does not: once the window closes it is launched.
        match next(&mut rx).await {
            ClusterEvent::Started { node, .. } => assert_eq!(node, NodeId(11)),
            other => panic!("unexpected {other:?}"),
        }
        // Its earlier agent joining now is told to stop; the new one's
        // join (this head's incarnation) goes through.
        node.send(commands.id(), launcher, joined(11, 0))
            .await
            .unwrap();
        let stop = tokio::time::timeout(std::time::Duration::from_secs(10), cmds.recv())
            .await
            .unwrap()
            .unwrap()
            .1;
        assert!(matches!(stop, NodeCmd::Stop), "{stop:?}");
        node.send(commands.id(), launcher, joined(11, 1))
            .await
            .unwrap();
        match next(&mut rx).await {
            ClusterEvent::Node(NodeEvent::Joined {
                node, incarnation, ..
            }) => assert_eq!((node, incarnation), (NodeId(11), 1)),
            other => panic!("unexpected {other:?}"),
        }
        // The adopted process is watched like a launched one.
        let tx = placement.senders.lock().unwrap()[&NodeId(10)].clone();
        tx.send("ended".into()).unwrap();
        match next(&mut rx).await {
            ClusterEvent::Exited { node, .. } => assert_eq!(node, NodeId(10)),
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            cmds.try_recv().is_err(),
            "one stop, node 11's: node 10's repeated join was dropped, not refused"
        );
        // A restarted agent spawns the same endpoint ids: another process
        // is no repeat.
        let restarted = LauncherMsg::Node(NodeEvent::Joined {
            node: NodeId(11),
            pid: 5151,
            transfer: "127.0.0.1:9".parse().unwrap(),
            commands: fresh,
            incarnation: 1,
        });
        node.send(commands.id(), launcher, restarted).await.unwrap();
        match next(&mut rx).await {
            ClusterEvent::Node(NodeEvent::Joined { node, pid, .. }) => {
                assert_eq!((node, pid), (NodeId(11), 5151));
            }
            other => panic!("unexpected {other:?}"),
        }
        node.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_every_node_and_reports_failures_and_exits() {
        let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
            .await
            .unwrap();
        let (probe, mut rx) = node.probe::<ClusterEvent>(16);
        let placement = Arc::new(Scripted::default());
        let spec = |n, r| NodeSpec {
            node: NodeId(n),
            roles: vec![r],
        };
        let _launcher = node.spawn(Launcher::new(
            placement.clone(),
            vec![spec(10, Role::Cell(0)), spec(13, Role::Pool)],
            probe,
        ));
        let mut started = false;
        let mut failed = false;
        while !(started && failed) {
            match rx.recv().await.unwrap().1 {
                ClusterEvent::Started { node, pid } => {
                    assert_eq!((node, pid), (NodeId(10), 1010));
                    started = true;
                }
                ClusterEvent::LaunchFailed { node, label, error } => {
                    assert_eq!(node, NodeId(13));
                    assert_eq!(label, "node 13 (pool)");
                    assert_eq!(error, "no such machine");
                    failed = true;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let tx = placement.senders.lock().unwrap()[&NodeId(10)].clone();
        tx.send("signal: 9 (SIGKILL)".into()).unwrap();
        match rx.recv().await.unwrap().1 {
            ClusterEvent::Exited {
                node,
                label,
                status,
                expected,
            } => {
                assert_eq!(node, NodeId(10));
                assert_eq!(label, "node 10 (cell 0)");
                assert_eq!(status, "signal: 9 (SIGKILL)");
                assert!(!expected, "the head had not asked it to stop");
            }
            other => panic!("unexpected {other:?}"),
        }

        // Started again on the head's request, and its next end reported.
        let launcher = Addr::<Launcher>::new(_launcher.id());
        node.send(
            probe.id(),
            launcher,
            LauncherMsg::Restart { node: NodeId(10) },
        )
        .await
        .unwrap();
        match rx.recv().await.unwrap().1 {
            ClusterEvent::Started { node, pid } => assert_eq!((node, pid), (NodeId(10), 1010)),
            other => panic!("unexpected {other:?}"),
        }
        let tx = placement.senders.lock().unwrap()[&NodeId(10)].clone();
        tx.send("exit status: 1".into()).unwrap();
        match rx.recv().await.unwrap().1 {
            ClusterEvent::Exited { node, status, .. } => {
                assert_eq!((node, status.as_str()), (NodeId(10), "exit status: 1"));
            }
            other => panic!("unexpected {other:?}"),
        }

        node.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_awaited_agent_that_ends_in_the_adoption_window_is_launched_at_once() {
        // Agents that exit with their head (`--agent-wait-s 0`) may still
        // be on their way out when the resumed head starts: waiting out
        // the whole window for them cost a resume 10 s.
        let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
            .await
            .unwrap();
        let (probe, mut rx) = node.probe::<ClusterEvent>(16);
        let placement = Arc::new(Scripted::default());
        let mut exiting = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let spec = NodeSpec {
            node: NodeId(10),
            roles: vec![Role::Cell(0)],
        };
        let _launcher = node.spawn(Launcher::new(placement, vec![spec], probe).adopting(
            1,
            BTreeMap::from([(NodeId(10), exiting.id())]),
            std::time::Duration::from_secs(60),
        ));
        let t0 = std::time::Instant::now();
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("launched before the window closed")
            .unwrap()
            .1;
        assert!(
            matches!(event, ClusterEvent::Started { node, .. } if node == NodeId(10)),
            "{event:?}"
        );
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(250),
            "launched while it ran"
        );
        exiting.wait().unwrap();
        node.shutdown().await;
    }
}
