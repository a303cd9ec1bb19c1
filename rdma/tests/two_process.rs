//! The TCP transfer engine between two OS processes: byte-exact batched
//! reads and writes, version and bounds refusals, a peer killed mid-transfer,
//! and a node without the cluster secret.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Peer, secret};
use gyre_rdma::pattern::pattern;
use gyre_rdma::{
    ClusterSecret, RequestError, RequestStatus, SegmentRef, TcpOptions, TransferEngine,
    TransferError, TransferRequest,
};
use rand::{Rng, SeedableRng};

const WEIGHTS: usize = 3 << 20;
const INBOX: usize = 1 << 20;

fn options() -> TcpOptions {
    // Small stripes so moderate requests already spread over connections.
    TcpOptions {
        connections: 3,
        stripe_bytes: 64 << 10,
    }
}

fn peer_with_segments() -> Peer {
    Peer::spawn(&[
        "--name",
        "far",
        "--frozen",
        &format!("weights:{WEIGHTS}:11"),
        "--mutable",
        &format!("inbox:{INBOX}:12"),
    ])
}

#[test]
fn batched_reads_and_writes_between_two_processes_are_byte_exact() {
    let peer = peer_with_segments();
    let engine = TransferEngine::new("near");
    let id = engine
        .connect_tcp(&peer.addr, &secret(), options())
        .unwrap();
    let weights = engine.open_segment(id, "weights").unwrap();
    let inbox = engine.open_segment(id, "inbox").unwrap();
    assert_eq!((weights.len, inbox.len), (WEIGHTS as u64, INBOX as u64));
    let expected = pattern(11, WEIGHTS);
    let mut mirror = pattern(12, INBOX);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);

    for round in 0..3 {
        // Random reads of the frozen segment, some spanning many stripes.
        let ranges: Vec<(u64, u64)> = (0..48)
            .map(|_| {
                let len = rng.random_range(0..=(if round == 2 { WEIGHTS } else { 300_000 }));
                let off = rng.random_range(0..=WEIGHTS - len);
                (off as u64, len as u64)
            })
            .collect();
        let batch = engine.submit_transfer(
            ranges
                .iter()
                .map(|&(o, l)| TransferRequest::read(&weights, o, l))
                .collect(),
        );
        let done = engine
            .wait_batch(batch, Some(Duration::from_secs(60)))
            .unwrap();
        for ((off, len), c) in ranges.iter().zip(done) {
            let got = c.unwrap();
            assert_eq!(got.bytes, *len);
            let (o, l) = (*off as usize, *len as usize);
            assert!(
                got.data.unwrap() == expected[o..o + l],
                "read [{o}, +{l}) differs"
            );
        }

        // Random writes into the mutable segment, then the whole of it back.
        let mut writes = Vec::new();
        for _ in 0..32 {
            let len = rng.random_range(0..=200_000);
            let off = rng.random_range(0..=INBOX - len);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            mirror[off..off + len].copy_from_slice(&data);
            writes.push(TransferRequest::write(
                &inbox,
                off as u64,
                Bytes::from(data),
            ));
        }
        // Overlapping writes are applied in no fixed order; do them one at a
        // time so the mirror is well defined.
        for w in writes {
            let len = w.len();
            assert_eq!(engine.transfer(vec![w]).pop().unwrap().unwrap().bytes, len);
        }
        let back = engine.transfer(vec![TransferRequest::read(&inbox, 0, INBOX as u64)]);
        assert!(back[0].as_ref().unwrap().data.as_ref().unwrap() == &mirror[..]);
    }

    // A notification sent after the writes reaches the peer's subscribers.
    engine
        .send_notification(id, "peer", Bytes::from_static(b"writes-done"))
        .unwrap();
    assert_eq!(peer.next_line(), "note near peer writes-done");
}

#[test]
fn a_stale_segment_version_is_refused_and_reopening_recovers() {
    let peer = peer_with_segments();
    let engine = TransferEngine::new("near");
    let id = engine
        .connect_tcp(&peer.addr, &secret(), options())
        .unwrap();
    let old = engine.open_segment(id, "weights").unwrap();
    engine
        .send_notification(id, "peer", Bytes::from_static(b"reregister weights"))
        .unwrap();
    assert_eq!(
        peer.next_line(),
        format!("reregistered weights {}", old.version + 1)
    );

    let refused = engine.transfer(vec![TransferRequest::read(&old, 0, 16)]);
    match &refused[0] {
        Err(RequestError::StaleVersion {
            requested,
            current,
            name,
            ..
        }) => {
            assert_eq!(
                (*requested, *current, name.as_str()),
                (old.version, old.version + 1, "weights")
            );
        }
        other => panic!("expected a stale-version refusal, got {other:?}"),
    }
    let fresh = engine.open_segment(id, "weights").unwrap();
    let ok = engine.transfer(vec![TransferRequest::read(&fresh, 0, 16)]);
    assert_eq!(
        ok[0].as_ref().unwrap().data.as_deref(),
        Some(&pattern(11, 16)[..])
    );
}

#[test]
fn the_server_refuses_bad_requests_clearly_and_keeps_serving() {
    let peer = peer_with_segments();
    let engine = TransferEngine::new("near");
    let id = engine
        .connect_tcp(&peer.addr, &secret(), options())
        .unwrap();
    let weights = engine.open_segment(id, "weights").unwrap();
    assert!(matches!(
        engine.open_segment(id, "nope"),
        Err(TransferError::Request(RequestError::UnknownSegment { .. }))
    ));
    // A handle claiming more bytes than the peer holds passes the local
    // check; the server's bounds check refuses it.
    let forged = SegmentRef {
        len: u64::MAX,
        ..weights.clone()
    };
    let out = engine.transfer(vec![
        TransferRequest::read(&forged, WEIGHTS as u64 - 4, 8),
        TransferRequest::read(&forged, u64::MAX - 2, 4),
        TransferRequest::write(&weights, 0, Bytes::from_static(b"nope")),
        TransferRequest::read(&weights, 0, 4),
    ]);
    // The first is refused by the server (it knows the real length), the
    // second, whose end overflows u64, already by the engine.
    match &out[0] {
        Err(RequestError::OutOfBounds { segment_len, .. }) => {
            assert_eq!(*segment_len, WEIGHTS as u64)
        }
        other => panic!("expected out-of-bounds from the server, got {other:?}"),
    }
    assert!(matches!(out[1], Err(RequestError::OutOfBounds { .. })));
    assert!(matches!(out[2], Err(RequestError::ReadOnly { .. })));
    assert_eq!(
        out[3].as_ref().unwrap().data.as_deref(),
        Some(&pattern(11, 4)[..])
    );
    let msg = out[0].as_ref().unwrap_err().to_string();
    assert!(msg.contains("outside segment `weights`"), "{msg}");
}

#[test]
fn a_peer_killed_mid_transfer_fails_exactly_its_requests() {
    let doomed = peer_with_segments();
    let healthy = peer_with_segments();
    let engine = TransferEngine::new("near");
    let a = engine
        .connect_tcp(&doomed.addr, &secret(), options())
        .unwrap();
    let b = engine
        .connect_tcp(&healthy.addr, &secret(), options())
        .unwrap();
    let wa = engine.open_segment(a, "weights").unwrap();
    let wb = engine.open_segment(b, "weights").unwrap();

    // Frozen, the doomed peer holds its requests in flight.
    doomed.freeze();
    let mut requests = Vec::new();
    for i in 0..8u64 {
        requests.push(TransferRequest::read(&wa, i * 1000, 200_000));
        requests.push(TransferRequest::read(&wb, i * 1000, 200_000));
    }
    let batch = engine.submit_transfer(requests);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = engine.transfer_status(batch).unwrap();
        let healthy_done = status
            .iter()
            .skip(1)
            .step_by(2)
            .all(|s| matches!(s, RequestStatus::Completed { .. }));
        if healthy_done {
            assert!(
                status
                    .iter()
                    .step_by(2)
                    .all(|s| *s == RequestStatus::Pending)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "healthy peer's requests never completed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    doomed.signal("-KILL");
    let done = engine
        .wait_batch(batch, Some(Duration::from_secs(30)))
        .unwrap();
    let expected = pattern(11, WEIGHTS);
    for (i, c) in done.iter().enumerate() {
        let at = (i / 2) * 1000;
        if i % 2 == 0 {
            match c {
                Err(RequestError::PeerLost { peer, .. }) => {
                    assert!(peer.starts_with("far@"), "{peer}")
                }
                other => panic!("request to the killed peer: expected PeerLost, got {other:?}"),
            }
        } else {
            assert!(c.as_ref().unwrap().data.as_ref().unwrap() == &expected[at..at + 200_000]);
        }
    }
    // The healthy peer keeps serving; the dead one fails new requests at once.
    let after = engine.transfer(vec![
        TransferRequest::read(&wb, 0, 8),
        TransferRequest::read(&wa, 0, 8),
    ]);
    assert_eq!(
        after[0].as_ref().unwrap().data.as_deref(),
        Some(&expected[..8])
    );
    assert!(matches!(after[1], Err(RequestError::PeerLost { .. })));
}

#[test]
fn a_node_without_the_cluster_secret_is_refused() {
    let peer = peer_with_segments();
    let intruder = TransferEngine::new("intruder");
    let wrong = ClusterSecret::new("not-the-cluster-secret!!").unwrap();
    match intruder.connect_tcp(&peer.addr, &wrong, options()) {
        Err(TransferError::AuthRefused { .. }) => {}
        Err(other) => panic!("expected AuthRefused, got {other}"),
        Ok(_) => panic!("a node without the secret was let in"),
    }

    // Raw frames without a handshake get nothing but the challenge and a refusal.
    use std::io::{Read, Write};
    let mut raw = std::net::TcpStream::connect(&peer.addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // A READ header and name, padded to exactly what the server reads as a
    // handshake answer (nonce, name length, proof), so it closes cleanly.
    let mut frame = vec![2u8, 7, 0];
    frame.extend_from_slice(&[0u8; 32]);
    frame.extend_from_slice(b"weights");
    frame.resize(32 + 2 + 32, 0);
    raw.write_all(&frame).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert_eq!(&got[..5], b"GYRT\x01");
    assert_eq!(
        got.len(),
        5 + 32 + 1,
        "only the challenge and a refusal byte"
    );
    assert_eq!(got[37], 0);

    // The peer still serves nodes holding the secret.
    let engine = TransferEngine::new("near");
    let id = engine
        .connect_tcp(&peer.addr, &secret(), options())
        .unwrap();
    assert!(engine.open_segment(id, "weights").is_ok());
}
