//! Connections between in-process nodes over loopback: a dialer redials a
//! peer that went away and came back, nodes that dial each other use one
//! connection per direction, and shutdown with live connections is prompt
//! and reported to the other side.

use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId, RuntimeError};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Receiver;

mod common;
use common::Watcher;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const WAIT: Duration = Duration::from_secs(5);

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

fn config(node: NodeId) -> LiveConfig {
    let mut cfg = LiveConfig::local(node, 3);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.heartbeat = Duration::from_millis(100);
    cfg.peer_timeout = Duration::from_millis(800);
    cfg.reconnect_min = Duration::from_millis(20);
    cfg.reconnect_max = Duration::from_millis(200);
    cfg
}

async fn recv<T>(rx: &mut Receiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out")
        .expect("closed")
}

async fn round_trip(
    node: &LiveNode,
    probe: Addr<External<u64>>,
    rx: &mut Receiver<(ActorId, u64)>,
    echo: Addr<Echo>,
    n: u64,
) {
    node.send(probe.id(), echo, Hit(n)).await.unwrap();
    assert_eq!(recv(rx).await, (echo.id(), n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialer_redials_a_peer_that_comes_back() {
    let b = LiveNode::start(config(B)).await.unwrap();
    let b_addr = b.local_addr().unwrap();
    let echo = b.spawn(Echo);

    let mut a_cfg = config(A);
    a_cfg.listen = None;
    a_cfg.peers.push((B, b_addr));
    let a = LiveNode::start(a_cfg).await.unwrap();
    let (probe, mut replies) = a.probe::<u64>(8);
    let (down_probe, mut downs) = a.probe::<NodeId>(8);
    a.spawn(Watcher {
        node: B,
        report: down_probe,
    });
    assert!(a.connected(B, WAIT).await);
    round_trip(&a, probe, &mut replies, echo, 1).await;

    // B shuts down with its connection alive: prompt, and A hears of it.
    let t0 = Instant::now();
    b.shutdown().await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert_eq!(recv(&mut downs).await.1, B);
    assert!(matches!(
        a.send(probe.id(), echo, Hit(2)).await,
        Err(RuntimeError::NoRoute(B))
    ));
    assert_eq!(a.stats().dropped_unreachable, 1);

    // B comes back on the same address; A redials on its own.
    let mut b2_cfg = config(B);
    b2_cfg.listen = Some(b_addr);
    let b2 = LiveNode::start(b2_cfg).await.unwrap();
    let echo2 = b2.spawn(Echo);
    assert_eq!(echo2, echo, "same spawn order, same id");
    assert!(a.connected(B, WAIT).await, "A never redialed");
    round_trip(&a, probe, &mut replies, echo2, 3).await;
    assert_eq!(a.stats().handshakes, 2);
    assert_eq!(a.stats().peer_downs, 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), downs.recv())
            .await
            .is_err(),
        "one loss, one notification"
    );

    a.shutdown().await;
    b2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_dial_each_other_talk_both_ways() {
    let a = LiveNode::start(config(A)).await.unwrap();
    let b = LiveNode::start(config(B)).await.unwrap();
    // Restart each with the other as a peer: configs are fixed at start.
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    a.shutdown().await;
    b.shutdown().await;
    let mut a_cfg = config(A);
    a_cfg.listen = Some(a_addr);
    a_cfg.peers.push((B, b_addr));
    let mut b_cfg = config(B);
    b_cfg.listen = Some(b_addr);
    b_cfg.peers.push((A, a_addr));
    let a = LiveNode::start(a_cfg).await.unwrap();
    let b = LiveNode::start(b_cfg).await.unwrap();
    let echo_a = a.spawn(Echo);
    let echo_b = b.spawn(Echo);
    assert!(a.connected(B, WAIT).await && b.connected(A, WAIT).await);
    let (pa, mut ra) = a.probe::<u64>(8);
    let (pb, mut rb) = b.probe::<u64>(8);
    for n in 0..20 {
        round_trip(&a, pa, &mut ra, echo_b, n).await;
        round_trip(&b, pb, &mut rb, echo_a, n).await;
    }
    // Each dialed the other once and accepted once: two connections each.
    let deadline = Instant::now() + WAIT;
    while a.stats().handshakes < 2 || b.stats().handshakes < 2 {
        assert!(Instant::now() < deadline, "{:?} {:?}", a.stats(), b.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.stats().handshakes, 2);
    assert_eq!(b.stats().handshakes, 2);
    a.shutdown().await;
    b.shutdown().await;
}
