//! Bad input on the wire: each kind is logged as a clear error, closes only
//! the offending connection, is counted, and never disturbs a well-behaved
//! peer that keeps exchanging messages meanwhile. Also: a peer that goes
//! silent is dropped after `peer_timeout` and reported down to watchers.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gyre_runtime::live::{Frame, LiveConfig, LiveNode, LiveStats, MAGIC, WireFrame};
use gyre_runtime::{Actor, ActorId, Addr, Bincode, Codec, Cx, External, NodeId, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::Receiver;

mod common;
use common::Watcher;

const SERVER: NodeId = NodeId(1);
const GOOD: NodeId = NodeId(3);
const MAX_FRAME: usize = 64 * 1024;
const WAIT: Duration = Duration::from_secs(3);

// ---------- captured logs ----------

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter(Arc::clone(&self.0))
    }
}

impl Logs {
    fn get() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::DEBUG)
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            logs
        })
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn text_since(&self, mark: usize) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()[mark..]).into_owned()
    }

    /// Waits for an ERROR line written after `mark` that contains `needle`.
    async fn expect_error(&self, mark: usize, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self.text_since(mark);
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("ERROR") && l.contains(needle))
            {
                return line.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no ERROR log containing {needle:?}; logs since mark:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---------- the server's actor and the good peer ----------

#[derive(Debug, Serialize, Deserialize)]
enum SinkMsg {
    Hit(u64),
}

/// Answers every `Hit(n)` with `n` to its sender.
struct Sink;

impl Actor for Sink {
    type Msg = SinkMsg;
    type Timer = ();
    fn on_msg(&mut self, from: ActorId, SinkMsg::Hit(n): SinkMsg, cx: &mut Cx<'_, Self>) {
        cx.send(Addr::<External<u64>>::new(from), n);
    }
}

fn config(node: NodeId) -> LiveConfig {
    common::strict_config(node, MAX_FRAME)
}

struct Good {
    node: LiveNode,
    probe: Addr<External<u64>>,
    replies: Receiver<(ActorId, u64)>,
    next: u64,
}

impl Good {
    /// One round trip through the server's sink and back.
    async fn round_trip(&mut self, sink: Addr<Sink>) {
        let n = self.next;
        self.next += 1;
        self.node
            .send(self.probe.id(), sink, SinkMsg::Hit(n))
            .await
            .unwrap();
        let (from, got) = tokio::time::timeout(WAIT, self.replies.recv())
            .await
            .expect("good peer got no reply")
            .unwrap();
        assert_eq!((from, got), (sink.id(), n));
    }
}

// ---------- a raw client ----------

struct Raw(TcpStream);

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        Raw(TcpStream::connect(addr).await.unwrap())
    }

    /// Connects and completes the handshake as `node`.
    async fn handshaken(addr: SocketAddr, node: NodeId) -> Raw {
        let mut raw = Raw::connect(addr).await;
        raw.send_wire(&hello(node, PROTOCOL_VERSION)).await;
        match raw.read_frame().await {
            Some(WireFrame::HelloAck {
                node: SERVER,
                protocol_version: PROTOCOL_VERSION,
                ..
            }) => raw,
            other => panic!("expected HelloAck, got {other:?}"),
        }
    }

    async fn send_bytes(&mut self, bytes: &[u8]) {
        // The node may already have closed on us; that is fine.
        let _ = self.0.write_all(bytes).await;
    }

    async fn send_frame(&mut self, body: &[u8]) {
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        self.send_bytes(&bytes).await;
    }

    async fn send_wire(&mut self, frame: &WireFrame) {
        self.send_frame(&frame.encode().unwrap()).await;
    }

    async fn read_frame(&mut self) -> Option<WireFrame> {
        let read = async {
            let mut len = [0u8; 4];
            self.0.read_exact(&mut len).await.ok()?;
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            self.0.read_exact(&mut body).await.ok()?;
            WireFrame::decode(&body).ok()
        };
        tokio::time::timeout(WAIT, read).await.ok().flatten()
    }

    /// True once the node has closed the connection (reading past any
    /// heartbeats it sent before).
    async fn closed_by_node(&mut self) -> bool {
        let drain = async {
            let mut buf = [0u8; 4096];
            loop {
                match self.0.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(WAIT, drain).await.is_ok()
    }
}

fn hello(node: NodeId, protocol_version: u32) -> WireFrame {
    WireFrame::Hello {
        magic: MAGIC,
        protocol_version,
        node,
    }
}

fn msg(src: ActorId, dst: ActorId, payload: Vec<u8>) -> WireFrame {
    WireFrame::Msg(Frame { src, dst, payload })
}

async fn stats_until(node: &LiveNode, what: &str, ok: impl Fn(&LiveStats) -> bool) -> LiveStats {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stats = node.stats();
        if ok(&stats) {
            return stats;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_the_offending_connection() {
    let logs = Logs::get();
    let mut cfg = config(SERVER);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    let server = LiveNode::start(cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    let sink = server.spawn(Sink);

    let mut good_cfg = config(GOOD);
    good_cfg.peers.push((SERVER, addr));
    let good_node = LiveNode::start(good_cfg).await.unwrap();
    assert!(good_node.connected(SERVER, WAIT).await);
    let (probe, replies) = good_node.probe::<u64>(16);
    let mut good = Good {
        node: good_node,
        probe,
        replies,
        next: 0,
    };
    good.round_trip(sink).await;

    let bad_src = |node: u32| ActorId::new(node, 1);
    let valid_hit = Bincode::encode(&SinkMsg::Hit(7)).unwrap();
    let mut peer_no = 10u32;
    let mut next_peer = || {
        peer_no += 1;
        NodeId(peer_no)
    };

    // (a) a truncated frame, then the client closes.
    let mark = logs.len();
    let node = next_peer();
    let mut raw = Raw::handshaken(addr, node).await;
    let body = msg(bad_src(node.0), sink.id(), valid_hit.clone())
        .encode()
        .unwrap();
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body[..body.len() / 2]);
    raw.send_bytes(&bytes).await;
    raw.0.shutdown().await.unwrap();
    assert!(raw.closed_by_node().await);
    let line = logs.expect_error(mark, "stream ended inside a frame").await;
    assert!(line.contains(&node.to_string()), "names the peer: {line}");
    stats_until(&server, "truncated", |s| s.truncated_frames == 1).await;
    good.round_trip(sink).await;

    // (b1) a frame that is not a wire frame at all (corrupt bincode).
    let mark = logs.len();
    let mut raw = Raw::handshaken(addr, next_peer()).await;
    raw.send_frame(&[0xFF; 24]).await;
    assert!(raw.closed_by_node().await, "(b1) connection left open");
    logs.expect_error(mark, "undecodable frame").await;
    stats_until(&server, "corrupt frame", |s| s.decode_errors == 1).await;
    good.round_trip(sink).await;

    // (b2) a valid wire frame whose message payload is corrupt (cut short).
    let mark = logs.len();
    let node = next_peer();
    let mut raw = Raw::handshaken(addr, node).await;
    raw.send_wire(&msg(bad_src(node.0), sink.id(), valid_hit[..6].to_vec()))
        .await;
    assert!(raw.closed_by_node().await, "(b2) connection left open");
    let line = logs.expect_error(mark, "does not decode").await;
    assert!(
        line.contains(&sink.id().to_string()),
        "names the destination: {line}"
    );
    stats_until(&server, "corrupt payload", |s| s.decode_errors == 2).await;
    good.round_trip(sink).await;

    // (c) a message to a real actor with an unknown variant tag.
    let mark = logs.len();
    let node = next_peer();
    let mut raw = Raw::handshaken(addr, node).await;
    let mut unknown = valid_hit.clone();
    unknown[0] = 9; // SinkMsg has one variant
    raw.send_wire(&msg(bad_src(node.0), sink.id(), unknown))
        .await;
    assert!(raw.closed_by_node().await, "(c) connection left open");
    let line = logs.expect_error(mark, "does not decode").await;
    assert!(line.contains("SinkMsg"), "names the message type: {line}");
    stats_until(&server, "unknown tag", |s| s.decode_errors == 3).await;
    good.round_trip(sink).await;

    // (d) a length prefix over max_frame.
    let mark = logs.len();
    let mut raw = Raw::handshaken(addr, next_peer()).await;
    raw.send_bytes(&((MAX_FRAME as u32) + 1).to_be_bytes())
        .await;
    assert!(raw.closed_by_node().await, "(d) connection left open");
    logs.expect_error(mark, &format!("over the limit of {MAX_FRAME} bytes"))
        .await;
    stats_until(&server, "oversized", |s| s.oversized_frames == 1).await;
    good.round_trip(sink).await;

    // (e) a hello with the wrong protocol version: answered with ours, closed.
    let mark = logs.len();
    let mut raw = Raw::connect(addr).await;
    raw.send_wire(&hello(next_peer(), PROTOCOL_VERSION + 1))
        .await;
    match raw.read_frame().await {
        Some(WireFrame::HelloAck {
            protocol_version, ..
        }) => assert_eq!(protocol_version, PROTOCOL_VERSION),
        other => panic!("expected the server's HelloAck, got {other:?}"),
    }
    assert!(raw.closed_by_node().await, "(e) connection left open");
    logs.expect_error(
        mark,
        &format!(
            "this node speaks version {PROTOCOL_VERSION}, the peer speaks {}",
            PROTOCOL_VERSION + 1
        ),
    )
    .await;
    stats_until(&server, "version", |s| s.handshake_errors == 1).await;
    good.round_trip(sink).await;

    // (f) garbage before any handshake: text (a huge length) and binary.
    let mark = logs.len();
    let mut raw = Raw::connect(addr).await;
    raw.send_bytes(b"GET / HTTP/1.1\r\nHost: gyre\r\n\r\n")
        .await;
    assert!(raw.closed_by_node().await, "(f) connection left open");
    logs.expect_error(mark, "handshake failed").await;
    let mark = logs.len();
    let mut raw = Raw::connect(addr).await;
    raw.send_frame(&[1, 2, 3, 4, 5, 6, 7]).await;
    assert!(raw.closed_by_node().await, "(f) connection left open");
    logs.expect_error(mark, "handshake failed").await;
    good.round_trip(sink).await;

    // (g) a message claiming to come from another node.
    let mark = logs.len();
    let mut raw = Raw::handshaken(addr, next_peer()).await;
    raw.send_wire(&msg(ActorId::new(GOOD.0, 1), sink.id(), valid_hit.clone()))
        .await;
    assert!(raw.closed_by_node().await, "(g) connection left open");
    logs.expect_error(mark, "claims a node other than the peer's")
        .await;
    good.round_trip(sink).await;

    let stats = stats_until(&server, "totals", |s| s.closed_bad_input == 9).await;
    assert_eq!(
        stats.oversized_frames, 2,
        "(d) and the text in (f): {stats:?}"
    );
    assert_eq!(
        stats.decode_errors, 4,
        "(b1), (b2), (c) and the binary in (f): {stats:?}"
    );
    // The good peer never lost its connection.
    let good_stats = good.node.stats();
    assert_eq!(good_stats.handshakes, 1, "{good_stats:?}");
    assert_eq!(good_stats.peer_downs, 0, "{good_stats:?}");
    assert_eq!(good_stats.closed_bad_input, 0, "{good_stats:?}");

    good.node.shutdown().await;
    server.shutdown().await;
    assert!(!logs.text_since(0).contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_timed_out_and_reported_down() {
    let logs = Logs::get();
    let mut cfg = config(SERVER);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    let server = LiveNode::start(cfg).await.unwrap();
    let (report, mut downs) = server.probe::<NodeId>(4);
    let silent = NodeId(40);
    server.spawn(Watcher {
        node: silent,
        report,
    });
    let mark = logs.len();

    // Handshakes, then says nothing and reads nothing.
    let raw = Raw::handshaken(server.local_addr().unwrap(), silent).await;
    let t0 = tokio::time::Instant::now();
    let (_, down) = tokio::time::timeout(Duration::from_secs(3), downs.recv())
        .await
        .expect("silent peer never reported down")
        .unwrap();
    assert_eq!(down, silent);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "declared down too early: {waited:?}"
    );
    let text = logs.text_since(mark);
    assert!(text.contains("peer silent for 600ms"), "{text}");
    assert_eq!(server.stats().peer_timeouts, 1);
    assert_eq!(server.stats().closed_bad_input, 0);
    drop(raw);
    server.shutdown().await;
}
