//! A panicking handler on the live host is caught and reported (node,
//! actor, input, panic text) at once; a supervised actor is rebuilt under
//! the same address with fresh state, up to its restart budget, and an
//! unsupervised one stops. Nobody waits for a stall timeout to find out.

use std::time::Duration;

use gyre_runtime::live::{LiveConfig, LiveNode, PanicReport};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Receiver;

/// Generous bound on how long a report may take; the run under test would
/// otherwise wait for its 300 s stall timeout.
const WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
enum FragileMsg {
    /// Answer with how many pings this incarnation has seen.
    Ping {
        reply_to: Addr<External<u64>>,
    },
    Boom,
}

struct Fragile {
    pings: u64,
}

impl Actor for Fragile {
    type Msg = FragileMsg;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, msg: FragileMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            FragileMsg::Ping { reply_to } => {
                self.pings += 1;
                cx.send(reply_to, self.pings);
            }
            FragileMsg::Boom => panic!("boom on purpose"),
        }
    }
}

async fn ping(
    node: &LiveNode,
    to: Addr<Fragile>,
    probe: Addr<External<u64>>,
    rx: &mut Receiver<(ActorId, u64)>,
) -> Option<u64> {
    node.send(probe.id(), to, FragileMsg::Ping { reply_to: probe })
        .await
        .ok()?;
    tokio::time::timeout(Duration::from_millis(500), rx.recv())
        .await
        .ok()
        .flatten()
        .map(|(_, n)| n)
}

async fn boom(
    node: &LiveNode,
    to: Addr<Fragile>,
    probe: Addr<External<u64>>,
    seen: usize,
) -> PanicReport {
    node.send(probe.id(), to, FragileMsg::Boom).await.unwrap();
    tokio::time::timeout(WAIT, node.next_panic(seen))
        .await
        .expect("no panic report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervised_actor_is_restarted_then_stopped_when_its_budget_is_spent() {
    let node = LiveNode::start(LiveConfig::local(NodeId(4), 1))
        .await
        .unwrap();
    let (probe, mut rx) = node.probe::<u64>(8);
    let a = node.spawn_supervised(1, || Fragile { pings: 0 });
    assert_eq!(ping(&node, a, probe, &mut rx).await, Some(1));
    assert_eq!(ping(&node, a, probe, &mut rx).await, Some(2));

    let first = boom(&node, a, probe, 0).await;
    assert_eq!(first.node, NodeId(4));
    assert_eq!(first.actor, a.id());
    assert!(first.actor_type.ends_with("Fragile"), "{first}");
    assert!(first.input.contains("FragileMsg"), "{first}");
    assert_eq!(first.panic, "boom on purpose");
    assert!(first.restarted, "{first}");
    assert!(first.to_string().contains("restarted"), "{first}");
    // Same address, fresh state.
    assert_eq!(ping(&node, a, probe, &mut rx).await, Some(1));

    let second = boom(&node, a, probe, 1).await;
    assert!(!second.restarted, "{second}");
    assert_eq!(ping(&node, a, probe, &mut rx).await, None);
    assert_eq!(node.panics(), vec![first, second]);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupervised_panic_is_reported_and_the_others_carry_on() {
    let node = LiveNode::start(LiveConfig::local(NodeId(2), 1))
        .await
        .unwrap();
    let (probe, mut rx) = node.probe::<u64>(8);
    let weak = node.spawn(Fragile { pings: 0 });
    let other = node.spawn(Fragile { pings: 0 });
    let report = boom(&node, weak, probe, 0).await;
    assert_eq!((report.actor, report.restarted), (weak.id(), false));
    assert_eq!(ping(&node, weak, probe, &mut rx).await, None);
    assert_eq!(ping(&node, other, probe, &mut rx).await, Some(1));
    node.shutdown().await;
}
