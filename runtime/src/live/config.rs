//! How a live node is set up: its identity, seed, sockets and the limits that
//! keep it from buffering without bound.
//!
//! Every knob that bounds memory (mailboxes, outbound queues, frame size) or
//! decides how fast a dead peer is noticed lives here, so a deployment can
//! tune them in one place and a test can shrink them.

use std::net::SocketAddr;
use std::time::Duration;

use crate::codec::MAX_PAYLOAD;
use crate::error::RuntimeError;
use crate::id::NodeId;

use super::auth::LinkSecret;

#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// This process's node id; every actor it spawns carries it.
    pub node: NodeId,
    /// The run seed every actor's random stream is derived from.
    pub seed: u64,
    /// Where to accept peer connections; `None` for an in-process-only node.
    pub listen: Option<SocketAddr>,
    /// Peers this node dials (and redials) itself. A peer that dials us and
    /// is not listed here is answered over the connection it opened.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// Dedicated threads the node runs its actors on (round-robin by id);
    /// 0 runs them on the tokio runtime that called `LiveNode::start`.
    pub actor_threads: usize,
    /// Messages an actor's mailbox holds before senders wait for room.
    pub mailbox_capacity: usize,
    /// Encoded frames queued per connection before senders wait for room.
    pub outbound_capacity: usize,
    /// Largest frame accepted or sent (bytes, without the 4-byte length).
    pub max_frame: usize,
    /// How often a connection proves it is alive when otherwise idle.
    pub heartbeat: Duration,
    /// Silence after which a peer is declared down; also bounds the handshake.
    pub peer_timeout: Duration,
    /// First pause before redialling a lost peer; doubles up to the maximum.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// The cluster secret: when set, every connection (either direction)
    /// must prove both ends hold it before any frame is accepted.
    pub secret: Option<LinkSecret>,
}

impl LiveConfig {
    /// A node that hosts actors in this process only: no listener, no peers.
    pub fn local(node: NodeId, seed: u64) -> Self {
        Self {
            node,
            seed,
            listen: None,
            peers: Vec::new(),
            actor_threads: 1,
            mailbox_capacity: 1024,
            outbound_capacity: 4096,
            max_frame: 8 << 20,
            heartbeat: Duration::from_millis(500),
            peer_timeout: Duration::from_secs(3),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            secret: None,
        }
    }

    /// Rejects settings that would make a channel or a timer panic, or that
    /// the codec could never satisfy.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let bad = |what: &str| Err(RuntimeError::Config(format!("live config: {what}")));
        if self.actor_threads > 256 {
            return bad(&format!("actor_threads {} is over 256", self.actor_threads));
        }
        if self.mailbox_capacity == 0 {
            return bad("mailbox_capacity must be at least 1");
        }
        if self.outbound_capacity == 0 {
            return bad("outbound_capacity must be at least 1");
        }
        if self.max_frame < 64 || self.max_frame > MAX_PAYLOAD {
            return bad(&format!(
                "max_frame {} must lie between 64 and the codec limit {MAX_PAYLOAD}",
                self.max_frame
            ));
        }
        if self.heartbeat.is_zero() || self.peer_timeout <= self.heartbeat {
            return bad(&format!(
                "heartbeat ({:?}) must be non-zero and shorter than peer_timeout ({:?})",
                self.heartbeat, self.peer_timeout
            ));
        }
        if self.reconnect_min.is_zero() || self.reconnect_max < self.reconnect_min {
            return bad("reconnect_min must be non-zero and at most reconnect_max");
        }
        if let Some((node, _)) = self.peers.iter().find(|(n, _)| *n == self.node) {
            return bad(&format!("peer list contains this node's own id {node}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_is_valid_and_zero_capacity_is_not() {
        let cfg = LiveConfig::local(NodeId(1), 7);
        assert!(cfg.validate().is_ok());
        let mut bad = cfg.clone();
        bad.mailbox_capacity = 0;
        assert!(bad.validate().is_err());
        let mut bad = cfg.clone();
        bad.heartbeat = bad.peer_timeout;
        assert!(bad.validate().is_err());
        let mut bad = cfg;
        bad.peers.push((NodeId(1), "127.0.0.1:1".parse().unwrap()));
        assert!(bad.validate().is_err());
    }
}
