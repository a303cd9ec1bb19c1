//! Test actors shared by the live-host integration tests.

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
