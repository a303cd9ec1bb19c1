//! Test actors shared by the live-host integration tests.

use std::time::Duration;

use gyre_runtime::live::LiveConfig;
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};

/// Watches `node` from the start and forwards each `on_peer_down` to a probe.
pub struct Watcher {
    pub node: NodeId,
    pub report: Addr<External<NodeId>>,
}

impl Actor for Watcher {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.watch_node(self.node);
    }
    fn on_msg(&mut self, _from: ActorId, _: (), _cx: &mut Cx<'_, Self>) {}
    fn on_peer_down(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        cx.send(self.report, node);
    }
}

/// A local node's settings for tests that feed it bad input: frames of at
/// most `max_frame` bytes, a silent peer dropped after 600 ms.
#[allow(dead_code)] // not every test crate sharing this module uses it
pub fn strict_config(node: NodeId, max_frame: usize) -> LiveConfig {
    let mut cfg = LiveConfig::local(node, 5);
    cfg.max_frame = max_frame;
    cfg.heartbeat = Duration::from_millis(100);
    cfg.peer_timeout = Duration::from_millis(600);
    cfg
}
