//! Payload transfers are effects: an actor writes and reads bytes by handle
//! through its host, hears the results as its own messages, and the
//! simulator charges the modelled cost (nothing by default).

use std::sync::Arc;
use std::time::Duration;

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::sim::{Latency, PayloadCost, Sim, SimConfig};
use gyre_runtime::{
    Actor, ActorId, Addr, BlobId, BlobStore, Cx, External, IoError, MILLIS, MemBlobs, Nanos,
    NodeId, PayloadRead, PayloadWrite,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Written(Result<BlobId, IoError>),
    Read(Result<Vec<u8>, IoError>),
}

/// Writes `bytes`, reads them back (consuming them), reports what it read
/// and when.
struct RoundTrip {
    store: Arc<dyn BlobStore>,
    bytes: Vec<u8>,
    report: Addr<External<(Nanos, Vec<u8>)>>,
}

impl Actor for RoundTrip {
    type Msg = Msg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        let write = PayloadWrite::new(self.store.clone(), self.bytes.clone());
        cx.io(write, Msg::Written);
    }

    fn on_msg(&mut self, _from: ActorId, msg: Msg, cx: &mut Cx<'_, Self>) {
        match msg {
            Msg::Written(Ok(id)) => {
                let read = PayloadRead::new(self.store.clone(), id).consume();
                cx.io(read, |r| Msg::Read(r.map(|b| b.to_vec())));
            }
            Msg::Written(Err(e)) | Msg::Read(Err(e)) => panic!("transfer failed: {e}"),
            Msg::Read(Ok(bytes)) => {
                let now = cx.now();
                cx.send(self.report, (now, bytes));
            }
        }
    }
}

fn sim_round_trip(cost: PayloadCost) -> (Nanos, Vec<u8>, usize) {
    let mut cfg = SimConfig::new(2);
    cfg.payload = cost;
    let mut sim = Sim::new(cfg);
    let store = MemBlobs::shared();
    let report = sim.probe(NodeId(0));
    sim.spawn(
        NodeId(0),
        RoundTrip {
            store: store.clone(),
            bytes: vec![5; 2000],
            report,
        },
    );
    sim.run().unwrap();
    let got = sim.take_probe(report);
    assert_eq!(got.len(), 1);
    let (at, bytes) = got.into_iter().next().unwrap().msg;
    (at, bytes, store.live())
}

#[test]
fn transfers_are_free_by_default_and_priced_when_modelled() {
    let (at, bytes, live) = sim_round_trip(PayloadCost::default());
    assert_eq!((at, bytes.len(), live), (0, 2000, 0));

    // 1 ms a transfer, plus 2,000 bytes at 1 MB/s = 2 ms: twice.
    let priced = PayloadCost {
        latency: Latency::Const(MILLIS),
        bytes_per_sec: 1_000_000,
        fail: 0.0,
    };
    let (at, bytes, live) = sim_round_trip(priced);
    assert_eq!(at, 2 * (MILLIS + 2 * MILLIS));
    assert_eq!((bytes, live), (vec![5; 2000], 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_host_runs_transfers_on_its_pool() {
    let node = LiveNode::start(LiveConfig::local(NodeId(1), 2))
        .await
        .unwrap();
    let store = MemBlobs::shared();
    let (report, mut rx) = node.probe::<(Nanos, Vec<u8>)>(4);
    node.spawn(RoundTrip {
        store: store.clone(),
        bytes: b"payload".to_vec(),
        report,
    });
    let (_, (_, bytes)) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("timed out")
        .expect("closed");
    assert_eq!(bytes, b"payload");
    assert_eq!(store.live(), 0);
    node.shutdown().await;
}
