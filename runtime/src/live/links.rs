//! Which peer nodes are reachable, over which connection our messages to
//! each of them go, and who wants to hear when one is lost.
//!
//! A node dials the peers in its configuration and sends to them over that
//! connection only; a peer that dialed us and that we do not dial is answered
//! over its own connection. Either way exactly one connection carries our
//! messages to a given node at a time, which is what keeps them in order.
//! A peer is *up* while at least one handshaken connection to it is open;
//! watchers hear `on_peer_down` on each up-to-down transition, so a killed
//! peer is reported once even when both directions break.

use std::collections::BTreeSet;
use std::sync::Mutex;

use dashmap::DashMap;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::id::{ActorId, NodeId};

use super::lock;

/// The queue of encoded frames for the connection that carries our
/// messages to one node.
#[derive(Clone)]
pub(crate) struct OutLink {
    pub conn: u64,
    pub tx: mpsc::Sender<Vec<u8>>,
}

/// Which side opened a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Dialed,
    Accepted,
}

impl std::fmt::Display for Dir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dir::Dialed => "dialed",
            Dir::Accepted => "accepted",
        })
    }
}

#[derive(Default)]
struct LinkState {
    dialed: Option<u64>,
    accepted: Option<(u64, CancellationToken)>,
}

impl LinkState {
    fn is_up(&self) -> bool {
        self.dialed.is_some() || self.accepted.is_some()
    }
}

pub(crate) struct Links {
    out: DashMap<NodeId, OutLink, FxBuildHasher>,
    state: Mutex<FxHashMap<NodeId, LinkState>>,
    watchers: Mutex<FxHashMap<NodeId, BTreeSet<ActorId>>>,
    /// Bumped whenever `out` gains a link, so `connected` can wait for it.
    changed: watch::Sender<u64>,
    dials: FxHashSet<NodeId>,
}

impl Links {
    pub fn new(dials: impl IntoIterator<Item = NodeId>) -> Self {
        Self {
            out: DashMap::default(),
            state: Mutex::default(),
            watchers: Mutex::default(),
            changed: watch::Sender::new(0),
            dials: dials.into_iter().collect(),
        }
    }

    /// The connection our messages to `node` currently go over.
    pub fn out(&self, node: NodeId) -> Option<OutLink> {
        self.out.get(&node).map(|l| l.clone())
    }

    pub fn can_send(&self, node: NodeId) -> bool {
        self.out.contains_key(&node)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Records a connection that completed its handshake. A newer accepted
    /// connection from the same node replaces (and closes) an older one: the
    /// peer only redials once it has given the old one up.
    pub fn register(
        &self,
        node: NodeId,
        conn: u64,
        dir: Dir,
        tx: mpsc::Sender<Vec<u8>>,
        token: CancellationToken,
    ) {
        let mut state = lock(&self.state);
        let link = state.entry(node).or_default();
        let carries_out = match dir {
            Dir::Dialed => {
                link.dialed = Some(conn);
                true
            }
            Dir::Accepted => {
                if let Some((old, old_token)) = link.accepted.replace((conn, token)) {
                    tracing::info!(peer = %node, old, new = conn, "peer reconnected; closing its older connection");
                    old_token.cancel();
                }
                !self.dials.contains(&node)
            }
        };
        if carries_out {
            self.out.insert(node, OutLink { conn, tx });
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Forgets a closed connection; true when `node` thereby went down.
    pub fn unregister(&self, node: NodeId, conn: u64) -> bool {
        let mut state = lock(&self.state);
        self.out.remove_if(&node, |_, l| l.conn == conn);
        let Some(link) = state.get_mut(&node) else {
            return false;
        };
        let was_up = link.is_up();
        if link.dialed == Some(conn) {
            link.dialed = None;
        }
        if link.accepted.as_ref().is_some_and(|(c, _)| *c == conn) {
            link.accepted = None;
        }
        let down = was_up && !link.is_up();
        if down {
            state.remove(&node);
        }
        down
    }

    pub fn watch(&self, node: NodeId, actor: ActorId) {
        lock(&self.watchers).entry(node).or_default().insert(actor);
    }

    pub fn unwatch_all(&self, actor: ActorId) {
        lock(&self.watchers).retain(|_, set| {
            set.remove(&actor);
            !set.is_empty()
        });
    }

    pub fn watchers(&self, node: NodeId) -> Vec<ActorId> {
        lock(&self.watchers)
            .get(&node)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_once_when_the_last_connection_closes() {
        let links = Links::new([NodeId(2)]);
        let (tx, _rx) = mpsc::channel(1);
        let n2 = NodeId(2);
        links.register(n2, 1, Dir::Dialed, tx.clone(), CancellationToken::new());
        links.register(n2, 2, Dir::Accepted, tx.clone(), CancellationToken::new());
        assert_eq!(
            links.out(n2).map(|l| l.conn),
            Some(1),
            "dialed peers use the dialed link"
        );
        assert!(!links.unregister(n2, 1));
        assert!(!links.can_send(n2));
        assert!(links.unregister(n2, 2));
        assert!(
            !links.unregister(n2, 2),
            "a second close is not a second down"
        );
    }

    #[test]
    fn newer_accepted_connection_supersedes_older() {
        let links = Links::new([]);
        let (tx, _rx) = mpsc::channel(1);
        let n3 = NodeId(3);
        let old = CancellationToken::new();
        links.register(n3, 1, Dir::Accepted, tx.clone(), old.clone());
        links.register(n3, 2, Dir::Accepted, tx, CancellationToken::new());
        assert!(old.is_cancelled());
        assert_eq!(links.out(n3).map(|l| l.conn), Some(2));
        assert!(
            !links.unregister(n3, 1),
            "the superseded link closing is not a down"
        );
        assert!(links.can_send(n3));
        assert!(links.unregister(n3, 2));
    }

    #[test]
    fn watchers_are_per_node_and_forgotten_with_the_actor() {
        let links = Links::new([]);
        let a = ActorId::new(1, 1);
        links.watch(NodeId(2), a);
        links.watch(NodeId(3), a);
        assert_eq!(links.watchers(NodeId(2)), vec![a]);
        links.unwatch_all(a);
        assert!(links.watchers(NodeId(2)).is_empty());
        assert!(links.watchers(NodeId(3)).is_empty());
    }
}
