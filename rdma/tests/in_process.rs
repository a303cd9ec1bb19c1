//! The engine's contract on the in-process backend and on TCP inside one
//! process: random ranges read back exactly, out-of-range requests are
//! refused with a status (never a panic), frozen reads are zero-copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use gyre_rdma::pattern::pattern;
use gyre_rdma::{ClusterSecret, RequestError, TcpOptions, TransferEngine, TransferRequest};
use proptest::prelude::*;

const LEN: usize = 256 << 10;

fn pair(
    tcp: bool,
) -> (
    TransferEngine,
    TransferEngine,
    gyre_rdma::PeerId,
    Option<gyre_rdma::TcpServer>,
) {
    let far = TransferEngine::new("far");
    far.register_frozen("frozen", Bytes::from(pattern(1, LEN)))
        .unwrap();
    far.register_mutable("mutable", pattern(2, LEN)).unwrap();
    let near = TransferEngine::new("near");
    if tcp {
        let secret = ClusterSecret::new("in-process-secret-0123").unwrap();
        let server = far.listen_tcp("127.0.0.1:0", &secret).unwrap();
        let opts = TcpOptions {
            connections: 2,
            stripe_bytes: 16 << 10,
        };
        let id = near
            .connect_tcp(server.local_addr(), &secret, opts)
            .unwrap();
        (near, far, id, Some(server))
    } else {
        let id = near.connect_local(&far);
        (near, far, id, None)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_ranges_read_exactly_or_are_refused(
        tcp in any::<bool>(),
        reqs in prop::collection::vec((0u64..(LEN as u64 + 4096), 0u64..70_000, any::<bool>()), 1..24),
    ) {
        let (near, _far, id, _server) = pair(tcp);
        let frozen = near.open_segment(id, "frozen").unwrap();
        let mutable = near.open_segment(id, "mutable").unwrap();
        let (pf, pm) = (pattern(1, LEN), pattern(2, LEN));
        let batch = reqs
            .iter()
            .map(|&(off, len, which)| TransferRequest::read(if which { &frozen } else { &mutable }, off, len))
            .collect();
        let done = near.transfer(batch);
        for (&(off, len, which), c) in reqs.iter().zip(done) {
            if off + len <= LEN as u64 {
                let src = if which { &pf } else { &pm };
                let got = c.unwrap();
                prop_assert_eq!(got.bytes, len);
                prop_assert!(got.data.unwrap() == src[off as usize..(off + len) as usize]);
            } else {
                let is_oob = matches!(c, Err(RequestError::OutOfBounds { .. }));
                prop_assert!(is_oob, "{:?}", c);
            }
        }
    }

    #[test]
    fn random_writes_land_exactly(
        tcp in any::<bool>(),
        writes in prop::collection::vec((0usize..LEN, 0usize..40_000, any::<u8>()), 1..12),
    ) {
        let (near, far, id, _server) = pair(tcp);
        let target = near.open_segment(id, "mutable").unwrap();
        let mut mirror = pattern(2, LEN);
        for &(off, len, byte) in &writes {
            let len = len.min(LEN - off);
            mirror[off..off + len].fill(byte);
            let c = near.transfer(vec![TransferRequest::write(&target, off as u64, Bytes::from(vec![byte; len]))]);
            prop_assert_eq!(c[0].as_ref().unwrap().bytes, len as u64);
        }
        let local = far.local_segment("mutable").unwrap();
        prop_assert!(local.with_bytes(|b| b == &mirror[..]));
    }
}

#[test]
fn in_process_reads_of_frozen_memory_are_zero_copy() {
    let (near, far, id, _) = pair(false);
    let seg = near.open_segment(id, "frozen").unwrap();
    let whole = far.local_segment("frozen").unwrap().to_bytes();
    let got = near.transfer(vec![TransferRequest::read(&seg, 100, 1000)]);
    let data = got[0].as_ref().unwrap().data.clone().unwrap();
    assert_eq!(
        data.as_ptr(),
        whole[100..].as_ptr(),
        "the read shares the registered memory"
    );
}

#[test]
fn reads_into_a_caller_buffer_reuse_it_and_size_mismatches_are_refused() {
    for tcp in [false, true] {
        let (near, _far, id, _server) = pair(tcp);
        let seg = near.open_segment(id, "mutable").unwrap();
        let buf = BytesMut::zeroed(50_000);
        let ptr = buf.as_ptr();
        let got = near.transfer(vec![TransferRequest::read_into(&seg, 7, buf)]);
        let data = got[0].as_ref().unwrap().data.clone().unwrap();
        assert_eq!(&data[..], &pattern(2, LEN)[7..50_007]);
        assert_eq!(
            data.as_ptr(),
            ptr,
            "tcp={tcp}: the caller's buffer was filled in place"
        );
        let bad = TransferRequest {
            target: seg.clone(),
            offset: 0,
            op: gyre_rdma::Op::Read {
                len: 10,
                into: Some(BytesMut::zeroed(3)),
            },
        };
        assert!(matches!(
            near.transfer(vec![bad])[0],
            Err(RequestError::BufferMismatch { len: 10, buffer: 3 })
        ));
    }
}

#[test]
fn batches_poll_per_request_and_complete_one_callback_each() {
    let (near, _far, id, _server) = pair(true);
    let seg = near.open_segment(id, "frozen").unwrap();
    let batch = near.submit_transfer(
        (0..64)
            .map(|i| TransferRequest::read(&seg, i * 10, 4096))
            .collect(),
    );
    let done = near.wait_batch(batch, None).unwrap();
    assert_eq!(done.len(), 64);
    assert!(
        near.transfer_status(batch).is_err(),
        "a waited batch is freed"
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..32u64 {
        let (calls, tx) = (calls.clone(), tx.clone());
        near.submit_with(
            TransferRequest::read(&seg, i, 8),
            Box::new(move |c| {
                calls.fetch_add(1, Ordering::SeqCst);
                tx.send((i, c)).unwrap();
            }),
        );
    }
    let mut got: Vec<_> = (0..32).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|(i, _)| *i);
    for (i, c) in got {
        assert_eq!(
            &c.unwrap().data.unwrap()[..],
            &pattern(1, LEN)[i as usize..i as usize + 8]
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 32);
}

#[test]
fn overlong_names_and_topics_are_refused_locally_and_the_link_survives() {
    let (near, _far, id, _server) = pair(true);
    let long = "n".repeat(300);
    assert!(matches!(
        near.open_segment(id, &long),
        Err(gyre_rdma::TransferError::Request(
            RequestError::UnknownSegment { .. }
        ))
    ));
    assert!(matches!(
        near.send_notification(id, &long, Bytes::new()),
        Err(RequestError::TopicTooLong { len: 300, .. })
    ));
    assert!(matches!(
        near.send_notification(id, "t", Bytes::from(vec![0; 65 * 1024])),
        Err(RequestError::NotificationTooLarge { .. })
    ));
    let seg = near.open_segment(id, "frozen").unwrap();
    assert!(near.transfer(vec![TransferRequest::read(&seg, 0, 1)])[0].is_ok());
}

#[test]
fn a_notification_follows_its_writes_and_a_failed_write_sends_none() {
    for tcp in [false, true] {
        let (near, far, id, _server) = pair(tcp);
        let inbox = far.subscribe("done");
        let frozen = near.open_segment(id, "frozen").unwrap();
        let mutable = near.open_segment(id, "mutable").unwrap();
        let refused = near.transfer_then_notify(
            vec![TransferRequest::write(&frozen, 0, Bytes::from_static(b"x"))],
            id,
            "done",
            Bytes::from_static(b"1"),
        );
        assert!(matches!(refused, Err(RequestError::ReadOnly { .. })));
        let writes = (0..8u64)
            .map(|i| {
                TransferRequest::write(&mutable, i * 20_000, Bytes::from(vec![i as u8 + 1; 20_000]))
            })
            .collect();
        near.transfer_then_notify(writes, id, "done", Bytes::from_static(b"2"))
            .unwrap();
        let note = inbox
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            (&*note.from, &note.payload[..]),
            ("near", &b"2"[..]),
            "tcp={tcp}"
        );
        let seg = far.local_segment("mutable").unwrap();
        assert!(seg.with_bytes(|b| (0..8).all(|i| {
            b[i * 20_000..(i + 1) * 20_000]
                .iter()
                .all(|&x| x == i as u8 + 1)
        })));
        assert!(inbox.try_recv().is_err(), "the refused batch sent nothing");
    }
}
