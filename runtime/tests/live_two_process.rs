//! Two OS processes over loopback TCP: 100,000 messages each way arrive
//! complete and in per-sender order, and killing one process gives the
//! other's watching actor `on_peer_down` promptly.
//!
//! The test binary re-executes itself: the parent runs
//! `two_processes_exchange_100k_and_detect_a_kill`, the child runs
//! `child_node` with `GYRE_LIVE_CHILD` set (without it, that test returns at
//! once). The child prints its port on stdout and exits when its stdin
//! closes, so it never outlives a parent that died.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};
use serde::{Deserialize, Serialize};

mod common;
use common::Watcher;

const CHILD_ENV: &str = "GYRE_LIVE_CHILD";
const PARENT: NodeId = NodeId(1);
const CHILD: NodeId = NodeId(2);
const SENDERS: u64 = 2;
const PER_SENDER: u64 = 50_000;
/// Ids fixed by spawn order on each node (counters start at 1).
const COUNTER_LOCAL: u64 = 1;
const REPORT_PROBE: ActorId = ActorId::new(1, 3);

#[derive(Debug, Serialize, Deserialize)]
enum CounterMsg {
    Data(u64),
}

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    node: NodeId,
    count: u64,
    senders: usize,
    /// The first sequence error seen: (sender, expected, got).
    first_gap: Option<(ActorId, u64, u64)>,
}

/// Checks that every sender's numbers arrive as 0, 1, 2, ...
struct Counter {
    expect: u64,
    next: BTreeMap<ActorId, u64>,
    count: u64,
    first_gap: Option<(ActorId, u64, u64)>,
    report_to: Addr<External<Report>>,
}

impl Counter {
    fn new(expect: u64) -> Self {
        Self {
            expect,
            next: BTreeMap::new(),
            count: 0,
            first_gap: None,
            report_to: Addr::new(REPORT_PROBE),
        }
    }
}

impl Actor for Counter {
    type Msg = CounterMsg;
    type Timer = ();
    fn on_msg(&mut self, from: ActorId, CounterMsg::Data(seq): CounterMsg, cx: &mut Cx<'_, Self>) {
        let next = self.next.entry(from).or_insert(0);
        if seq != *next && self.first_gap.is_none() {
            self.first_gap = Some((from, *next, seq));
        }
        *next = seq + 1;
        self.count += 1;
        if self.count == self.expect {
            let report = Report {
                node: cx.id().node,
                count: self.count,
                senders: self.next.len(),
                first_gap: self.first_gap,
            };
            cx.send(self.report_to, report);
        }
    }
}

/// Sends 0..n to `to`, in chunks so that other work interleaves.
struct Sender {
    to: Addr<Counter>,
    next: u64,
    n: u64,
}

const CHUNK: u64 = 500;

impl Actor for Sender {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.send_self(());
    }
    fn on_msg(&mut self, _from: ActorId, _: (), cx: &mut Cx<'_, Self>) {
        let end = (self.next + CHUNK).min(self.n);
        for seq in self.next..end {
            cx.send(self.to, CounterMsg::Data(seq));
        }
        self.next = end;
        if self.next < self.n {
            cx.send_self(());
        }
    }
}

fn net_config(node: NodeId) -> LiveConfig {
    let mut cfg = LiveConfig::local(node, 7);
    cfg.heartbeat = Duration::from_millis(200);
    cfg.peer_timeout = Duration::from_secs(1);
    cfg.reconnect_min = Duration::from_millis(50);
    cfg.reconnect_max = Duration::from_millis(500);
    cfg
}

fn spawn_senders(node: &LiveNode, to: NodeId) {
    let to = Addr::new(ActorId {
        node: to,
        local: COUNTER_LOCAL,
    });
    for _ in 0..SENDERS {
        node.spawn(Sender {
            to,
            next: 0,
            n: PER_SENDER,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_node() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return; // only meaningful when the parent test runs this binary
    }
    let mut cfg = net_config(CHILD);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    let node = LiveNode::start(cfg).await.unwrap();
    let counter = node.spawn(Counter::new(SENDERS * PER_SENDER));
    assert_eq!(
        counter.id(),
        ActorId {
            node: CHILD,
            local: COUNTER_LOCAL
        }
    );
    println!("GYRE_PORT={}", node.local_addr().unwrap().port());
    assert!(
        node.connected(PARENT, Duration::from_secs(10)).await,
        "parent never connected"
    );
    spawn_senders(&node, PARENT);
    // Live until the parent kills us or goes away (stdin closes).
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    });
    tokio::select! {
        _ = stdin_closed => {}
        () = tokio::time::sleep(Duration::from_secs(60)) => {}
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exchange_100k_and_detect_a_kill() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let t0 = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_node", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let port = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let port = lines
            .by_ref()
            .map_while(Result::ok)
            // libtest may have written "test child_node ... " on the same line.
            .find_map(|l| {
                l.split("GYRE_PORT=")
                    .nth(1)
                    .and_then(|p| p.trim().parse::<u16>().ok())
            });
        // Keep draining so the child never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        port
    })
    .await
    .unwrap()
    .expect("child printed no port");

    let mut cfg = net_config(PARENT);
    cfg.peers
        .push((CHILD, format!("127.0.0.1:{port}").parse().unwrap()));
    let node = LiveNode::start(cfg).await.unwrap();
    let counter = node.spawn(Counter::new(SENDERS * PER_SENDER));
    let (down_probe, mut downs) = node.probe::<NodeId>(4);
    let (report_probe, mut reports) = node.probe::<Report>(4);
    assert_eq!(counter.id().local, COUNTER_LOCAL);
    assert_eq!(report_probe.id(), REPORT_PROBE);
    node.spawn(Watcher {
        node: CHILD,
        report: down_probe,
    });

    assert!(
        node.connected(CHILD, Duration::from_secs(10)).await,
        "no connection to the child"
    );
    spawn_senders(&node, CHILD);

    let mut seen = BTreeMap::new();
    while seen.len() < 2 {
        let (from, report) = tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .expect("timed out waiting for the counts")
            .unwrap();
        assert_eq!(from.node, report.node);
        seen.insert(report.node, report);
    }
    for (node_id, report) in &seen {
        assert_eq!(
            report.count,
            SENDERS * PER_SENDER,
            "at {node_id}: lost messages"
        );
        assert_eq!(report.senders as u64, SENDERS, "at {node_id}");
        assert_eq!(report.first_gap, None, "at {node_id}: out of order or lost");
    }
    let exchanged = t0.elapsed();

    let stats = node.stats();
    assert!(stats.frames_out >= SENDERS * PER_SENDER, "{stats:?}");
    assert!(stats.frames_in >= SENDERS * PER_SENDER, "{stats:?}");
    assert_eq!(stats.closed_bad_input, 0, "{stats:?}");
    assert_eq!(stats.dropped_unreachable, 0, "{stats:?}");

    let killed = Instant::now();
    child.kill().unwrap();
    let (_, down) = tokio::time::timeout(Duration::from_secs(5), downs.recv())
        .await
        .expect("no peer-down within 5 s of the kill")
        .unwrap();
    assert_eq!(down, CHILD);
    let noticed = killed.elapsed();
    let _ = child.wait();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), downs.recv())
            .await
            .is_err(),
        "one loss, one notification"
    );
    assert_eq!(node.stats().peer_downs, 1);
    node.shutdown().await;
    eprintln!(
        "exchanged {} messages in {exchanged:?}; kill noticed after {noticed:?}",
        2 * SENDERS * PER_SENDER
    );
}
