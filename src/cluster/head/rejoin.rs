//! A lost node agent, started again and brought back into the run.
//!
//! Once a survivable node's process has ended (its exit, not only a lost
//! link: the launcher fences a process whose link was lost, killing it by
//! pid, so a hung agent ends too), the head asks the launcher to start it
//! again, up to `ClusterOptions::restarts` times per node. The new agent
//! joins like the first one, and then:
//! 1. every process's transfer plane (the head's and each other agent's,
//!    [`NodeCmd::PeerBack`]) connects to its new transfer address and drops
//!    the prefix rings it was a rank of;
//! 2. it is assigned the node's roles with the directory as it is now, and
//!    builds fresh backends (an engine holding nothing, device memory in
//!    the rollout role), which answer at the same addresses as the first
//!    process's: the agent spawns them in the same order, and the head
//!    checks it;
//! 3. once it is ready and every other process has reconnected, the head
//!    tells the scheduler `SchedMsg::NodeBack`: the node's cells resend
//!    their return to rollout there, load the published weights, and the
//!    node's slots count in C_R again.
//!
//! Until then the node stays lost in the scheduler's ledger, as if it had
//! never come back. A restarted agent that dies again is started again
//! while restarts remain.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use gyre_actors::sched::scheduler::{SchedMsg, Scheduler};
use gyre_runtime::{Addr, External, NodeId, Recipient};

use super::super::launcher::LauncherMsg;
use super::super::plane::{Directory, Plane, PlaneError};
use super::super::proto::{NodeCmd, NodeEvent, NodePorts};
use super::super::tap::TapMsg;
use super::{ClusterError, Head};
use crate::embedded::trainer::UpdateSummary;

/// Where each node stands after losses, and the restarts under way.
#[derive(Debug)]
pub(super) struct Rejoins {
    /// Lost and not back yet.
    down: BTreeSet<NodeId>,
    restarts_left: BTreeMap<NodeId, u32>,
    /// Restarts asked of the launcher and not yet sent.
    to_launch: Vec<NodeId>,
    /// Restarted agents that joined, by node: the processes that have not
    /// reconnected to it yet, and whether its backends are built.
    joining: BTreeMap<NodeId, (BTreeSet<NodeId>, bool)>,
}

impl Rejoins {
    pub(super) fn new(specs: &[super::super::proto::NodeSpec], restarts: u32) -> Self {
        Self {
            down: BTreeSet::new(),
            restarts_left: specs.iter().map(|s| (s.node, restarts)).collect(),
            to_launch: Vec::new(),
            joining: BTreeMap::new(),
        }
    }

    /// Whether `node`'s agent would be started again if its process ended.
    pub(super) fn can_restart(&self, node: NodeId) -> bool {
        self.restarts_left.get(&node).is_some_and(|l| *l > 0)
    }

    pub(super) fn is_down(&self, node: NodeId) -> bool {
        self.down.contains(&node)
    }

    /// `node` is lost; false if it was already.
    pub(super) fn down(&mut self, node: NodeId) -> bool {
        // A process that has not reconnected to a restarted peer never
        // will: the rejoin goes on without its answer.
        for (waiting, _) in self.joining.values_mut() {
            waiting.remove(&node);
        }
        self.down.insert(node)
    }

    /// `node`'s process ended mid-run: start it again if restarts remain.
    pub(super) fn exited(&mut self, node: NodeId) {
        self.joining.remove(&node);
        let Some(left) = self.restarts_left.get_mut(&node) else {
            return;
        };
        if *left == 0 {
            tracing::warn!(node = node.0, "node agent not restarted: no restarts left");
            return;
        }
        *left -= 1;
        self.to_launch.push(node);
    }
}

/// What the run phase keeps to bring a node back.
pub(super) struct Running {
    pub config: String,
    pub directory: Directory,
    /// Every agent's transfer address and command endpoint, as last joined.
    pub joined: BTreeMap<NodeId, (SocketAddr, Addr<External<NodeCmd>>)>,
    /// The ports each node's first process answered.
    pub ports: BTreeMap<NodeId, NodePorts>,
    pub observer: Recipient<UpdateSummary>,
    /// The head's token tap, in a run with the gateway.
    pub tap: Option<Addr<External<TapMsg>>>,
    pub plane: Arc<Plane>,
    pub sched: Addr<Scheduler>,
}

impl Head {
    /// A node agent's event while the run goes on.
    pub(super) async fn on_run_event(
        &mut self,
        event: NodeEvent,
        run: &mut Running,
    ) -> Result<(), ClusterError> {
        match event {
            NodeEvent::Joined {
                node,
                pid,
                transfer,
                commands,
                ..
            } if self.is_lost(node) && !self.rejoins.joining.contains_key(&node) => {
                tracing::info!(node = node.0, pid, %transfer, "restarted node agent joined");
                self.agents.insert(node, pid);
                run.joined.insert(node, (transfer, commands));
                match run.directory.endpoints.iter_mut().find(|(n, _)| *n == node) {
                    Some(e) => e.1 = transfer,
                    None => run.directory.endpoints.push((node, transfer)),
                }
                let plane = run.plane.clone();
                tokio::task::spawn_blocking(move || plane.reconnect(node, transfer))
                    .await
                    .map_err(|e| PlaneError::Join(e.to_string()))??;
                let others: BTreeSet<NodeId> = run
                    .joined
                    .keys()
                    .copied()
                    .filter(|n| *n != node && !self.is_lost(*n))
                    .collect();
                for other in &others {
                    let cmd = NodeCmd::PeerBack { node, transfer };
                    self.tell(run.joined[other].1, cmd).await?;
                }
                let roles = self
                    .specs
                    .iter()
                    .find(|s| s.node == node)
                    .map(|s| s.roles.clone())
                    .unwrap_or_default();
                let cmd = NodeCmd::Assign {
                    config: run.config.clone(),
                    roles,
                    directory: run.directory.clone(),
                    observer: run.observer,
                    tap: run.tap,
                    incarnation: self.incarnation,
                };
                self.tell(commands, cmd).await?;
                self.rejoins.joining.insert(node, (others, false));
            }
            NodeEvent::PeerBack { node, peer } => {
                if let Some((waiting, _)) = self.rejoins.joining.get_mut(&peer) {
                    waiting.remove(&node);
                }
            }
            NodeEvent::Ready { node, ports } => {
                if run.ports.get(&node) != Some(&ports) {
                    return Err(ClusterError::RejoinPorts {
                        label: self.label(node),
                    });
                }
                if let Some((_, built)) = self.rejoins.joining.get_mut(&node) {
                    *built = true;
                }
            }
            other => tracing::debug!(?other, "node agent event ignored while running"),
        }
        Ok(())
    }

    /// Starts the restarts asked for and tells the scheduler of every node
    /// that is back.
    pub(super) async fn flush_rejoins(&mut self, run: &Running) -> Result<(), ClusterError> {
        for node in std::mem::take(&mut self.rejoins.to_launch) {
            tracing::warn!(node = node.0, roles = %self.label(node), "starting the lost node agent again");
            if let Some(l) = self.lost.iter_mut().rev().find(|l| l.node == node.0) {
                l.restarts += 1;
            }
            self.live
                .send(self.from, self.launcher, LauncherMsg::Restart { node })
                .await?;
        }
        let back: Vec<NodeId> = self
            .rejoins
            .joining
            .iter()
            .filter(|(_, (waiting, built))| *built && waiting.is_empty())
            .map(|(n, _)| *n)
            .collect();
        for node in back {
            self.rejoins.joining.remove(&node);
            self.rejoins.down.remove(&node);
            let at = self.running.map(|t: Instant| t.elapsed().as_secs_f64());
            if let Some(l) = self.lost.iter_mut().rev().find(|l| l.node == node.0) {
                l.back_at_secs = at;
            }
            tracing::info!(node = node.0, roles = %self.label(node), "node agent back; the scheduler rejoins it");
            self.live
                .send(self.from, run.sched, SchedMsg::NodeBack { node })
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::proto::{NodeSpec, Role};

    fn rejoins(restarts: u32) -> Rejoins {
        let spec = |n, r| NodeSpec {
            node: NodeId(n),
            roles: vec![r],
        };
        Rejoins::new(
            &[
                spec(10, Role::Cell(0)),
                spec(11, Role::Cell(1)),
                spec(5, Role::Pool),
            ],
            restarts,
        )
    }

    #[test]
    fn an_exited_node_is_restarted_while_restarts_remain() {
        let mut r = rejoins(2);
        let n = NodeId(11);
        assert!(r.down(n) && !r.down(n), "a loss is recorded once");
        assert!(r.is_down(n) && r.can_restart(n));
        r.exited(n);
        assert_eq!(std::mem::take(&mut r.to_launch), vec![n]);
        r.exited(n);
        assert_eq!(std::mem::take(&mut r.to_launch), vec![n]);
        assert!(!r.can_restart(n), "two restarts spent");
        r.exited(n);
        assert!(r.to_launch.is_empty(), "no third restart");
        assert!(rejoins(0).to_launch.is_empty() && !rejoins(0).can_restart(n));
    }

    #[test]
    fn a_process_lost_while_a_peer_rejoins_is_not_waited_for() {
        let mut r = rejoins(1);
        let (back, other) = (NodeId(11), NodeId(5));
        r.down(back);
        r.joining
            .insert(back, (BTreeSet::from([NodeId(10), other]), true));
        r.down(other);
        assert_eq!(r.joining[&back].0, BTreeSet::from([NodeId(10)]));
        // Its own exit while joining starts it over.
        r.exited(back);
        assert!(!r.joining.contains_key(&back));
        assert_eq!(r.to_launch, vec![back]);
    }
}
