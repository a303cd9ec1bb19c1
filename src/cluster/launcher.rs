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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gyre_runtime::{Actor, ActorId, Addr, Cx, External, IoError, IoRequest, NodeId};
use serde::{Deserialize, Serialize};

use super::placement::Placement;
use super::proto::{NodeEvent, NodeSpec};

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
    /// The process last started for each node.
    pids: BTreeMap<NodeId, u32>,
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
        }
    }

    fn launch(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        let Some(spec) = self.specs.get(&node) else {
            return;
        };
        let req = LaunchNode {
            placement: self.placement.clone(),
            spec: spec.clone(),
        };
        cx.io(req, move |r| LauncherMsg::Launched {
            node,
            result: r.map_err(|e| e.to_string()),
        });
    }

    fn label(&self, node: NodeId) -> String {
        self.specs
            .get(&node)
            .map_or_else(|| format!("node {}", node.0), NodeSpec::label)
    }
}

impl Actor for Launcher {
    type Msg = LauncherMsg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        let nodes: Vec<NodeId> = self.specs.keys().copied().collect();
        for node in nodes {
            self.launch(node, cx);
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: LauncherMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            LauncherMsg::Node(event) => {
                if let NodeEvent::Joined { node, .. } = &event {
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
                    let req = WaitNode {
                        placement: self.placement.clone(),
                        node,
                    };
                    cx.io(req, move |r| LauncherMsg::Ended {
                        node,
                        result: r.map_err(|e| e.to_string()),
                    });
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
}
