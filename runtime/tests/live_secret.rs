//! The cluster secret on live links: nodes that hold it connect and talk;
//! a node without it, or with another one, is refused in the handshake in
//! either direction, and nothing it sends reaches an actor.

use std::time::Duration;

use gyre_runtime::live::{LinkSecret, LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};
use serde::{Deserialize, Serialize};

const HEAD: NodeId = NodeId(0);
const NODE: NodeId = NodeId(7);

#[derive(Debug, Serialize, Deserialize)]
struct Hit(u64);

/// Answers `Hit(n)` with `n` to its sender.
struct Echo;

impl Actor for Echo {
    type Msg = Hit;
    type Timer = ();
    fn on_msg(&mut self, from: ActorId, Hit(n): Hit, cx: &mut Cx<'_, Self>) {
        cx.send(Addr::<External<u64>>::new(from), n);
    }
}

fn secret(byte: u8) -> Option<LinkSecret> {
    Some(LinkSecret::new([byte; 32]).unwrap())
}

fn config(node: NodeId, secret: Option<LinkSecret>) -> LiveConfig {
    let mut cfg = LiveConfig::local(node, 3);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.heartbeat = Duration::from_millis(100);
    cfg.peer_timeout = Duration::from_millis(800);
    cfg.reconnect_min = Duration::from_millis(20);
    cfg.reconnect_max = Duration::from_millis(100);
    cfg.secret = secret;
    cfg
}

/// Starts a head with `head_secret` and a node dialing it with
/// `node_secret`; true if the node's messages reach the head's echo.
async fn joins(head_secret: Option<LinkSecret>, node_secret: Option<LinkSecret>) -> (bool, u64) {
    let head = LiveNode::start(config(HEAD, head_secret)).await.unwrap();
    let echo = head.spawn(Echo);
    let mut cfg = config(NODE, node_secret);
    cfg.peers = vec![(HEAD, head.local_addr().unwrap())];
    let node = LiveNode::start(cfg).await.unwrap();
    let connected = node.connected(HEAD, Duration::from_millis(1500)).await;
    let (probe, mut rx) = node.probe::<u64>(4);
    let mut answered = false;
    if node.send(probe.id(), echo, Hit(5)).await.is_ok() {
        answered = tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_ok_and(|m| m == Some((echo.id(), 5)));
    }
    let refused = head.stats().handshake_errors + node.stats().handshake_errors;
    node.shutdown().await;
    head.shutdown().await;
    (connected && answered, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_holding_the_secret_connect_and_talk() {
    let (ok, refused) = joins(secret(1), secret(1)).await;
    assert!(ok, "same secret: the link must come up");
    assert_eq!(refused, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_secret_is_refused() {
    let (ok, refused) = joins(secret(1), None).await;
    assert!(!ok, "a node without the secret must not join");
    assert!(refused > 0, "the refusal is counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_secret_is_refused() {
    let (ok, refused) = joins(secret(1), secret(2)).await;
    assert!(!ok);
    assert!(refused > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_without_the_secret_is_not_trusted_by_a_node_that_has_one() {
    let (ok, refused) = joins(None, secret(1)).await;
    assert!(!ok, "the dialer requires the acceptor's proof");
    assert!(refused > 0);
}
