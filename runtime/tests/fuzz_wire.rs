//! Fuzzing the live host's input side: the frame decoder, the wire-frame
//! and message decoders, and the handshake of a listening node.
//!
//! Bytes from a peer are untrusted. Whatever arrives (garbage, truncated or
//! oversized frames, valid frames with bits flipped, a hello followed by
//! junk), decoding must end in a value or an error, never a panic, and a
//! node must keep serving a well-behaved peer afterwards. Each test prints
//! how many inputs it tried (`cargo test -p gyre-runtime --test fuzz_wire
//! -- --nocapture`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use gyre_runtime::live::{Frame, LiveConfig, LiveNode, MAGIC, WireCodec, WireFrame};
use gyre_runtime::{Actor, ActorId, Addr, Bincode, Codec, Cx, External, NodeId, PROTOCOL_VERSION};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRng, TestRunner};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

#[allow(dead_code)] // the live tests' shared helpers; this one uses a few
mod common;

const MAX_FRAME: usize = 4096;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum SinkMsg {
    Hit(u64),
    Text(String),
    Many(Vec<(u32, Option<i64>)>),
}

fn valid_frames() -> Vec<WireFrame> {
    let payload = Bincode::encode(&SinkMsg::Many(vec![(1, Some(-2)), (3, None)])).unwrap();
    vec![
        WireFrame::Hello {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            node: NodeId(7),
        },
        WireFrame::HelloAck {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            node: NodeId(1),
        },
        WireFrame::Msg(Frame {
            src: ActorId::new(7, 1),
            dst: ActorId::new(1, 1),
            payload: payload.clone(),
        }),
        WireFrame::Heartbeat,
        WireFrame::Goodbye,
        WireFrame::Tell {
            key: 0xfeed,
            frame: Frame {
                src: ActorId::new(7, 1),
                dst: ActorId::new(1, 1),
                payload,
            },
        },
    ]
}

/// A valid length-prefixed stream of frames, for mutating.
fn framed(frames: &[WireFrame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        let body = f.encode().unwrap();
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// Bytes a hostile or broken peer might send: pure garbage, or a valid
/// stream with some bytes overwritten, inserted or cut off.
fn hostile_stream() -> impl Strategy<Value = Vec<u8>> {
    let garbage = proptest::collection::vec(any::<u8>(), 0..300);
    let mutated = (
        proptest::sample::subsequence(valid_frames(), 1..=6),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        any::<usize>(),
        any::<bool>(),
    )
        .prop_map(|(frames, edits, cut, do_cut)| {
            let mut bytes = framed(&frames);
            for (at, b) in edits {
                if !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] = b;
                }
            }
            if do_cut && !bytes.is_empty() {
                bytes.truncate(cut % bytes.len());
            }
            bytes
        });
    prop_oneof![garbage, mutated]
}

/// Feeds `bytes` to the frame decoder in chunks of the given sizes, then
/// ends the stream, decoding every frame cut out; returns how far it got.
fn decode_stream(bytes: &[u8], chunks: &[usize]) -> Result<usize, String> {
    let mut codec = WireCodec::new(MAX_FRAME);
    let mut buf = BytesMut::new();
    let mut rest = bytes;
    let mut sizes = chunks.iter().cycle();
    let mut frames = 0;
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    frames += 1;
                    // Either a frame or an error, both fine.
                    if let Ok(WireFrame::Msg(f) | WireFrame::Tell { frame: f, .. }) =
                        WireFrame::decode(&frame)
                    {
                        let _ = Bincode::decode::<SinkMsg>(&f.payload);
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    match codec.decode_eof(&mut buf) {
        Ok(_) => Ok(frames),
        Err(e) => Err(e.to_string()),
    }
}

const DECODER_CASES: u32 = 4000;

#[test]
fn the_frame_decoder_never_panics() {
    let tried = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: DECODER_CASES,
        ..Config::default()
    });
    let strategy = (
        hostile_stream(),
        proptest::collection::vec(1usize..64, 1..6),
    );
    runner
        .run(&strategy, |(bytes, chunks)| {
            tried.fetch_add(1, Ordering::Relaxed);
            // A value or an error are both fine; a panic fails the case.
            let _ = decode_stream(&bytes, &chunks);
            Ok(())
        })
        .unwrap();
    let n = tried.load(Ordering::Relaxed);
    eprintln!("frame decoder fuzz: {n} hostile streams, no panic");
    assert!(n >= u64::from(DECODER_CASES));
}

proptest! {
    #[test]
    fn valid_streams_decode_whole_in_any_chunking(
        frames in proptest::sample::subsequence(valid_frames(), 0..=6),
        chunks in proptest::collection::vec(1usize..16, 1..6),
    ) {
        let bytes = framed(&frames);
        prop_assert_eq!(decode_stream(&bytes, &chunks), Ok(frames.len()));
    }
}

// ---------- the handshake of a listening node ----------

/// Answers every `Hit(n)` with `n`.
struct Sink;

impl Actor for Sink {
    type Msg = SinkMsg;
    type Timer = ();
    fn on_msg(&mut self, from: ActorId, msg: SinkMsg, cx: &mut Cx<'_, Self>) {
        if let SinkMsg::Hit(n) = msg {
            cx.send(Addr::<External<u64>>::new(from), n);
        }
    }
}

fn config(node: NodeId) -> LiveConfig {
    common::strict_config(node, MAX_FRAME)
}

/// One hostile connection: connect, write, end our side, and wait (briefly)
/// for the node to close it.
async fn hostile_connection(addr: std::net::SocketAddr, bytes: &[u8]) {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return;
    };
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_survives_hostile_handshakes_and_keeps_serving() {
    let mut cfg = config(NodeId(1));
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    let server = LiveNode::start(cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    let sink = server.spawn(Sink);

    // Streams that open with a hello of a random node and version more
    // often than not, so the fuzz reaches past the first check.
    let strategy = (
        any::<bool>(),
        2u32..1000,
        prop_oneof![Just(PROTOCOL_VERSION), any::<u32>()],
        hostile_stream(),
    )
        .prop_map(|(greet, node, version, rest)| {
            let mut bytes = Vec::new();
            if greet {
                bytes = framed(&[WireFrame::Hello {
                    magic: MAGIC,
                    protocol_version: version,
                    node: NodeId(node),
                }]);
            }
            bytes.extend_from_slice(&rest);
            bytes
        });
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let tried = 300;
    for _ in 0..tried {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        hostile_connection(addr, &bytes).await;
    }

    // A well-behaved peer still gets through and is answered.
    let mut good_cfg = config(NodeId(999_999));
    good_cfg.peers.push((NodeId(1), addr));
    let good = LiveNode::start(good_cfg).await.unwrap();
    assert!(good.connected(NodeId(1), Duration::from_secs(3)).await);
    let (probe, mut replies) = good.probe::<u64>(4);
    good.send(probe.id(), sink, SinkMsg::Hit(42)).await.unwrap();
    let (from, n) = tokio::time::timeout(Duration::from_secs(3), replies.recv())
        .await
        .expect("the node stopped answering after the fuzz")
        .unwrap();
    assert_eq!((from, n), (sink.id(), 42));
    let stats = server.stats();
    eprintln!("handshake fuzz: {tried} hostile connections, node stats after: {stats:?}");
    assert!(stats.closed_bad_input > 0, "{stats:?}");
    good.shutdown().await;
    server.shutdown().await;
}
