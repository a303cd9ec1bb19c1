//! The modelled network: per-link latency, loss, duplication, ordering and
//! partitions, and the counters that say what happened to each message.
//!
//! Links are directional (src node, dst node). A partition cuts both
//! directions and drops messages at send time and, for messages already in
//! flight, at arrival time. A FIFO link delays a message to no earlier than
//! the previous one on the same link; ties are broken by sequence number, so
//! it never overtakes.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::id::NodeId;
use crate::time::Nanos;

use super::config::{LinkModel, SimConfig};
use super::draw::Draw;

/// What happened to the messages of a run, and to its I/O requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Messages handed to the network (sends and injections).
    pub sent: u64,
    /// Messages handed to a live actor or a probe.
    pub delivered: u64,
    pub dropped_loss: u64,
    pub dropped_partition: u64,
    /// Addressed to an actor that is unknown, crashed or stopped.
    pub dropped_dead: u64,
    /// Extra copies the network made.
    pub duplicated: u64,
    /// Delivered to an actor of another message type, and dropped.
    pub mistyped: u64,
    pub io_started: u64,
    pub io_failed: u64,
    /// Completions whose issuer had crashed or stopped meanwhile.
    pub io_dropped: u64,
}

/// The network's verdict on one message.
pub(crate) enum Route {
    Lost,
    Partitioned,
    Arrive { at: Nanos, copy: Option<Nanos> },
}

type Link = (NodeId, NodeId);

#[derive(Default)]
pub(crate) struct Network {
    links: FxHashMap<Link, LinkModel>,
    /// Unordered pairs, stored as (min, max).
    partitions: FxHashSet<Link>,
    /// Latest arrival scheduled on each FIFO link.
    fifo_tail: FxHashMap<Link, Nanos>,
}

fn pair(a: NodeId, b: NodeId) -> Link {
    if a <= b { (a, b) } else { (b, a) }
}

impl Network {
    /// Overrides both directions between `a` and `b`.
    pub(crate) fn set_link(&mut self, a: NodeId, b: NodeId, model: LinkModel) {
        self.links.insert((a, b), model);
        self.links.insert((b, a), model);
    }

    pub(crate) fn partition(&mut self, a: NodeId, b: NodeId) -> bool {
        self.partitions.insert(pair(a, b))
    }

    pub(crate) fn heal(&mut self, a: NodeId, b: NodeId) -> bool {
        self.partitions.remove(&pair(a, b))
    }

    pub(crate) fn is_partitioned(&self, a: NodeId, b: NodeId) -> bool {
        !self.partitions.is_empty() && self.partitions.contains(&pair(a, b))
    }

    pub(crate) fn link<'a>(
        &'a self,
        cfg: &'a SimConfig,
        src: NodeId,
        dst: NodeId,
    ) -> &'a LinkModel {
        if !self.links.is_empty()
            && let Some(m) = self.links.get(&(src, dst))
        {
            return m;
        }
        if src == dst {
            &cfg.local_link
        } else {
            &cfg.default_link
        }
    }

    /// Decides the fate of a message sent now from `src` to `dst`.
    pub(crate) fn route(
        &mut self,
        cfg: &SimConfig,
        draw: &mut Draw,
        src: NodeId,
        dst: NodeId,
        now: Nanos,
    ) -> Route {
        if self.is_partitioned(src, dst) {
            return Route::Partitioned;
        }
        let link = *self.link(cfg, src, dst);
        if draw.chance(link.loss) {
            return Route::Lost;
        }
        let at = self.arrival(&link, draw, src, dst, now);
        let copy = draw
            .chance(link.duplicate)
            .then(|| self.arrival(&link, draw, src, dst, now));
        Route::Arrive { at, copy }
    }

    fn arrival(
        &mut self,
        link: &LinkModel,
        draw: &mut Draw,
        src: NodeId,
        dst: NodeId,
        now: Nanos,
    ) -> Nanos {
        let at = now.saturating_add(draw.latency(&link.latency));
        // A constant-latency link within a node keeps its order by itself;
        // between nodes the model may change mid-run, so the tail is kept.
        if !link.fifo || (src == dst && link.latency.is_const()) {
            return at;
        }
        let tail = self.fifo_tail.entry((src, dst)).or_insert(0);
        let at = at.max(*tail);
        *tail = at;
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::Latency;

    #[test]
    fn fifo_link_never_schedules_earlier_than_its_tail() {
        let mut cfg = SimConfig::new(1);
        cfg.default_link = LinkModel {
            latency: Latency::Uniform { min: 0, max: 1000 },
            loss: 0.0,
            duplicate: 0.0,
            fifo: true,
        };
        let mut net = Network::default();
        let mut draw = Draw::new(1);
        let mut last = 0;
        for now in 0..200 {
            match net.route(&cfg, &mut draw, NodeId(0), NodeId(1), now) {
                Route::Arrive { at, copy: None } => {
                    assert!(at >= last);
                    last = at;
                }
                _ => panic!("lossless link without duplication"),
            }
        }
    }

    #[test]
    fn partition_is_symmetric_and_heals() {
        let cfg = SimConfig::new(1);
        let mut net = Network::default();
        let mut draw = Draw::new(1);
        net.partition(NodeId(2), NodeId(1));
        assert!(matches!(
            net.route(&cfg, &mut draw, NodeId(1), NodeId(2), 0),
            Route::Partitioned
        ));
        assert!(net.is_partitioned(NodeId(2), NodeId(1)));
        assert!(!net.is_partitioned(NodeId(1), NodeId(3)));
        assert!(net.heal(NodeId(1), NodeId(2)));
        assert!(matches!(
            net.route(&cfg, &mut draw, NodeId(2), NodeId(1), 0),
            Route::Arrive { .. }
        ));
    }
}
