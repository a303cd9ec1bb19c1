//! The training prefix's collectives across processes: the core's gradient
//! reduction as a ring all-reduce over the processes hosting cells
//! `0..members`, and the parameter broadcast that follows an update, both
//! over gyre-rdma's collectives (`gyre_rdma::collective`).
//!
//! The scheduler asks only the core (cell 0's trainer) to reduce or
//! broadcast; here the core's process asks every other process of the
//! prefix to take part (a notification), and each answers with the counts
//! of what its cells drained, then joins the ring with its gradients (zeros
//! when a cell computed nothing). A process hosting several cells of the
//! prefix adds them in cell order first, so a ring rank is a process.
//! The ring's summation order is pinned (`ring_order_sum`); with every cell
//! in its own process and two members it is today's sum in cell order, bit
//! for bit. Every call runs inside an I/O job or the agent thread, never a
//! handler. The rings of each prefix size are built on first use and kept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use gyre_actors::sched::ids::{Step, Version};
use gyre_gpu::trainer::GradBuffer;
use gyre_rdma::Notification;
use gyre_rdma::collective::{Group, RingAllReduce};
use gyre_runtime::NodeId;

use super::plane::{Plane, PlaneGrads, PlaneWeights, u64_of};
use crate::embedded::shared::{GradStore, WeightStore, lock};

/// Asks a process of the prefix to join a reduction or a broadcast.
const TOPIC_ASK: &str = "gyre.prefix.ask";
/// A member's counts of what its cells drained, to the core.
const TOPIC_META: &str = "gyre.prefix.meta";
const ASK_REDUCE: u8 = 1;
const ASK_BROADCAST: u8 = 2;

/// One process's side of the prefix collectives.
pub struct Collectives {
    plane: Arc<Plane>,
    /// Values in a gradient (the model's parameter count).
    len: usize,
    rings: Mutex<BTreeMap<u32, RingAllReduce>>,
    metas: Mutex<Receiver<Notification>>,
    /// Steps reduced over more than one cell's gradients.
    shared: AtomicU64,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// What one cell of a member process drained for a step: its counts (a
/// gradient buffer's header), or nothing.
type CellMeta = (u32, Option<GradBuffer>);

impl Collectives {
    /// Starts answering the core's requests on this process (a thread for
    /// the process's lifetime; it ends when the plane does).
    pub fn start(plane: Arc<Plane>, len: usize) -> Arc<Self> {
        let asks = plane.engine().subscribe(TOPIC_ASK);
        let metas = Mutex::new(plane.engine().subscribe(TOPIC_META));
        let me = Arc::new(Self {
            plane,
            len,
            rings: Mutex::default(),
            metas,
            shared: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("prefix-collectives".into())
            .spawn(move || serve_asks(&weak, &asks))
            .map_err(|e| tracing::error!(error = %e, "prefix collective thread did not start"))
            .ok();
        me
    }

    /// The processes hosting cells `0..members`, in order of their first
    /// cell: the ranks of the prefix's ring (the core's process first).
    fn ranks(&self, members: u32) -> Vec<NodeId> {
        let cells = self.plane.directory_cells();
        let mut nodes = Vec::new();
        for &n in cells.iter().take(members as usize) {
            if !nodes.contains(&n) {
                nodes.push(n);
            }
        }
        nodes
    }

    fn group(&self, members: u32, nodes: &[NodeId]) -> Result<Group, String> {
        let me = self.plane.me();
        let rank = nodes
            .iter()
            .position(|&n| n == me)
            .ok_or_else(|| format!("node {me} is not in the prefix of {members}"))?;
        let peers = nodes
            .iter()
            .map(|&n| {
                (n != me)
                    .then(|| self.plane.peer_of(n).map_err(|e| e.to_string()))
                    .transpose()
            })
            .collect::<Result<Vec<_>, String>>()?;
        Group::new(
            self.plane.engine().clone(),
            rank,
            peers,
            &format!("prefix{members}"),
        )
        .map_err(|e| e.to_string())
    }

    /// Drops every ring `node` is a rank of and withdraws this rank's inbox
    /// of each: `node` was restarted, and the ring's call counts and inbox
    /// handles belong to its lost process. Waits for a reduction in
    /// progress (it holds the rings); none uses such a ring, since the
    /// prefix was cut below the node when it was lost. Rebuilt on next use,
    /// by every member, from the first call.
    pub fn forget_rings_with(&self, node: NodeId) {
        let mut rings = lock(&self.rings);
        let stale: Vec<u32> = rings
            .keys()
            .copied()
            .filter(|&m| self.ranks(m).contains(&node))
            .collect();
        for m in stale {
            if let Some(ring) = rings.remove(&m) {
                ring.withdraw();
                tracing::info!(members = m, %node, "prefix ring dropped: a rank restarted");
            }
        }
    }

    /// Sums `data` over the ring of the prefix of `members`, building it on
    /// first use; counts what this process wrote as gradient bytes moved.
    fn all_reduce(&self, members: u32, nodes: &[NodeId], data: &mut [f32]) -> Result<(), String> {
        let mut rings = lock(&self.rings);
        let ring = match rings.entry(members) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => v.insert(
                RingAllReduce::new(self.group(members, nodes)?, self.len)
                    .map_err(|e| e.to_string())?,
            ),
        };
        let before = ring.bytes_written();
        ring.all_reduce(data).map_err(|e| e.to_string())?;
        self.plane
            .count_gradients(ring.bytes_written().saturating_sub(before));
        Ok(())
    }

    /// This process's cells of the prefix and what each drained for `step`.
    fn local_cells(&self, step: Step, members: u32) -> Vec<(u32, Option<GradBuffer>)> {
        let me = self.plane.me();
        let cells = self.plane.directory_cells();
        (0..members)
            .filter(|&c| cells.get(c as usize) == Some(&me))
            .map(|c| (c, self.plane.local_grads(step, c)))
            .collect()
    }

    /// This process's contribution: its cells' gradients added in cell
    /// order onto zeros (as `GradBuffer::sum` does), zeros if none.
    fn contribution(&self, cells: &[(u32, Option<GradBuffer>)]) -> Result<Vec<f32>, String> {
        let parts: Vec<GradBuffer> = cells.iter().filter_map(|(_, g)| g.clone()).collect();
        if parts.is_empty() {
            return Ok(vec![0.0; self.len]);
        }
        let sum = GradBuffer::sum(&parts).map_err(|e| e.to_string())?;
        if sum.data.len() != self.len {
            return Err(format!(
                "gradients of {} values, the model has {}",
                sum.data.len(),
                self.len
            ));
        }
        Ok(sum.data)
    }

    /// The core's reduction of step `step` over cells `0..members`: the
    /// summed gradients with the counts of every member (`None` when no
    /// member drained anything), and the members that drained nothing.
    pub fn reduce(
        &self,
        step: Step,
        members: u32,
    ) -> Result<(Option<GradBuffer>, Vec<u32>), String> {
        let nodes = self.ranks(members);
        for &n in nodes.iter().skip(1) {
            let mut ask = vec![ASK_REDUCE];
            ask.extend_from_slice(&step.to_le_bytes());
            ask.extend_from_slice(&u64::from(members).to_le_bytes());
            self.plane.notify_node(n, TOPIC_ASK, ask)?;
        }
        let mut cells = self.local_cells(step, members);
        let mut data = self.contribution(&cells)?;
        if nodes.len() > 1 {
            let started = std::time::Instant::now();
            self.all_reduce(members, &nodes, &mut data)?;
            tracing::debug!(
                step,
                ranks = nodes.len(),
                values = data.len(),
                micros = started.elapsed().as_micros() as u64,
                "prefix all-reduce"
            );
            cells.extend(self.gather_metas(step, nodes.len() - 1)?);
        }
        cells.sort_by_key(|(c, _)| *c);
        combine(cells, data)
    }

    fn gather_metas(&self, step: Step, from: usize) -> Result<Vec<CellMeta>, String> {
        let rx = lock(&self.metas);
        let mut out = Vec::new();
        let mut heard = 0;
        while heard < from {
            let note = rx
                .recv_timeout(gyre_rdma::collective::STEP_TIMEOUT)
                .map_err(|e| format!("waiting for members' counts of step {step}: {e}"))?;
            match decode_meta(&note.payload) {
                Some((s, cells)) if s == step => {
                    out.extend(cells);
                    heard += 1;
                }
                Some(_) => {}
                None => tracing::warn!(from = %note.from, "malformed prefix counts"),
            }
        }
        Ok(out)
    }

    /// A member's part of the core's reduction.
    fn join_reduce(&self, step: Step, members: u32) -> Result<(), String> {
        let nodes = self.ranks(members);
        let cells = self.local_cells(step, members);
        let mut data = self.contribution(&cells)?;
        let core = nodes
            .first()
            .copied()
            .ok_or_else(|| format!("no core for the prefix of {members}"))?;
        self.plane
            .notify_node(core, TOPIC_META, encode_meta(step, &cells))?;
        self.all_reduce(members, &nodes, &mut data)
    }

    /// The core's broadcast of version `version` (registered as `bytes`)
    /// to the other processes of the prefix of `members`.
    pub fn broadcast(&self, members: u32, version: Version, bytes: Bytes) -> Result<(), String> {
        let nodes = self.ranks(members);
        if nodes.len() < 2 {
            return Ok(());
        }
        for &n in nodes.iter().skip(1) {
            let mut ask = vec![ASK_BROADCAST];
            ask.extend_from_slice(&version.to_le_bytes());
            ask.extend_from_slice(&u64::from(members).to_le_bytes());
            self.plane.notify_node(n, TOPIC_ASK, ask)?;
        }
        self.group(members, &nodes)?
            .broadcast(0, version, Some(bytes))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// A member's part of a broadcast: the parameters land in the plane's
    /// weight cache, where the next warm-up and weight load find them.
    fn join_broadcast(&self, members: u32, version: Version) -> Result<(), String> {
        let nodes = self.ranks(members);
        self.group(members, &nodes)?
            .broadcast_then(0, version, None, |bytes| {
                self.plane.received_weights(version, bytes);
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// The gradient board across processes: deposits stay on the cell's
/// process; the core's reduce is the prefix's ring all-reduce.
#[derive(Debug, Clone)]
pub struct PrefixGrads {
    pub store: PlaneGrads,
    pub prefix: Arc<Collectives>,
}

impl GradStore for PrefixGrads {
    fn deposit(&self, step: Step, cell: u32, grads: GradBuffer) {
        self.store.deposit(step, cell, grads);
    }

    fn take(&self, step: Step, members: u32) -> (Vec<GradBuffer>, Vec<u32>) {
        self.store.take(step, members)
    }

    fn reduce(&self, step: Step, members: u32) -> Result<(Option<GradBuffer>, Vec<u32>), String> {
        let reduced = self.prefix.reduce(step, members)?;
        if reduced.0.as_ref().is_some_and(|g| g.cells > 1) {
            self.prefix.shared.fetch_add(1, Ordering::Relaxed);
        }
        Ok(reduced)
    }

    fn shared_steps(&self) -> u64 {
        self.prefix.shared.load(Ordering::Relaxed)
    }
}

/// Published weights across processes, with the core's broadcast to the
/// prefix over the transfer engine.
#[derive(Debug, Clone)]
pub struct PrefixWeights {
    pub store: PlaneWeights,
    pub prefix: Arc<Collectives>,
}

impl WeightStore for PrefixWeights {
    fn publish(&self, version: Version, bytes: Arc<[u8]>) {
        self.store.publish(version, bytes);
    }

    fn get(&self, version: Version) -> Option<Arc<[u8]>> {
        self.store.get(version)
    }

    fn latest(&self) -> Option<(Version, Arc<[u8]>)> {
        self.store.latest()
    }

    fn roll_back(&self, to: Version) {
        self.store.roll_back(to);
    }

    fn at_least(&self, version: Version) -> Option<Arc<[u8]>> {
        self.store.at_least(version)
    }

    fn broadcasts(&self) -> bool {
        true
    }

    fn broadcast(&self, members: u32) -> Result<Option<Version>, String> {
        let Some((version, bytes)) = self.store.published() else {
            return Err("broadcast before any weights were published here".into());
        };
        self.prefix.broadcast(members, version, bytes)?;
        Ok(Some(version))
    }
}

fn serve_asks(me: &Weak<Collectives>, asks: &Receiver<Notification>) {
    while let Ok(note) = asks.recv() {
        let Some(me) = me.upgrade() else {
            break;
        };
        let p = &note.payload;
        let (Some(&kind), Some(a), Some(b)) = (
            p.first(),
            p.get(1..).and_then(u64_of),
            p.get(9..).and_then(u64_of),
        ) else {
            tracing::warn!(from = %note.from, "malformed prefix request");
            continue;
        };
        let members = b as u32;
        let done = match kind {
            ASK_REDUCE => me.join_reduce(a, members),
            ASK_BROADCAST => me.join_broadcast(members, a),
            other => Err(format!("unknown prefix request {other}")),
        };
        if let Err(e) = done {
            tracing::error!(kind, step_or_version = a, members, error = %e, "prefix collective failed");
        }
    }
}

/// The reduced gradients with every member's counts added in cell order
/// (as `GradBuffer::sum` adds them).
fn combine(cells: Vec<CellMeta>, data: Vec<f32>) -> Result<(Option<GradBuffer>, Vec<u32>), String> {
    let missing: Vec<u32> = cells
        .iter()
        .filter(|(_, g)| g.is_none())
        .map(|(c, _)| *c)
        .collect();
    let present: Vec<GradBuffer> = cells.into_iter().filter_map(|(_, g)| g).collect();
    let Some(first) = present.first() else {
        return Ok((None, missing));
    };
    let mut out = GradBuffer {
        cells: 0,
        micro_steps: 0,
        targets: 0,
        loss: 0.0,
        data: Vec::new(),
        ..first.clone()
    };
    for p in &present {
        // Counts only: the data is already summed.
        out.add(&GradBuffer {
            data: Vec::new(),
            ..p.clone()
        })
        .map_err(|e| e.to_string())?;
    }
    out.data = data;
    Ok((Some(out), missing))
}

fn encode_meta(step: Step, cells: &[CellMeta]) -> Vec<u8> {
    let mut out = step.to_le_bytes().to_vec();
    for (c, g) in cells {
        out.extend_from_slice(&c.to_le_bytes());
        match g {
            Some(g) => {
                out.push(1);
                out.extend_from_slice(
                    &GradBuffer {
                        data: Vec::new(),
                        ..g.clone()
                    }
                    .encode(),
                );
            }
            None => out.push(0),
        }
    }
    out
}

fn decode_meta(p: &[u8]) -> Option<(Step, Vec<CellMeta>)> {
    let step = u64_of(p)?;
    let header = GradBuffer {
        version: 0,
        fingerprint: 0,
        cells: 0,
        micro_steps: 0,
        targets: 0,
        loss: 0.0,
        data: Vec::new(),
    }
    .encode()
    .len();
    let mut at = 8;
    let mut cells = Vec::new();
    while at < p.len() {
        let cell = u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?);
        let present = *p.get(at + 4)?;
        at += 5;
        let g = if present == 1 {
            let g = GradBuffer::decode(p.get(at..at + header)?).ok()?;
            at += header;
            Some(g)
        } else {
            None
        };
        cells.push((cell, g));
    }
    Some((step, cells))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plane::Directory;
    use gyre_rdma::ClusterSecret;
    use gyre_rdma::collective::ring_order_sum;
    use rand::{Rng, SeedableRng};

    const LEN: usize = 1003;

    /// A head (node 0) and one process per cell (nodes 10, 11, …), each
    /// with its plane and collectives, as `gyre train --cluster local` runs.
    fn cluster(cells: usize) -> Vec<(Arc<Plane>, Arc<Collectives>)> {
        let secret = ClusterSecret::new([5u8; 32]).unwrap();
        let nodes: Vec<NodeId> = std::iter::once(NodeId(0))
            .chain((0..cells).map(|c| NodeId(10 + c as u32)))
            .collect();
        let planes: Vec<_> = nodes
            .iter()
            .map(|&n| Plane::start(n, "127.0.0.1:0".parse().unwrap(), secret.clone()).unwrap())
            .collect();
        let dir = Directory {
            endpoints: planes
                .iter()
                .map(|p| (p.me(), p.local_addr().unwrap()))
                .collect(),
            core: NodeId(10),
            cells: nodes[1..].to_vec(),
        };
        planes
            .into_iter()
            .map(|p| {
                p.connect(&dir).unwrap();
                let c = Collectives::start(p.clone(), LEN);
                (p, c)
            })
            .collect()
    }

    /// Gradients whose sums depend on the order they are added in.
    fn grads(cell: u32, step: Step) -> GradBuffer {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(u64::from(cell) * 31 + step);
        GradBuffer {
            version: 4,
            fingerprint: 77,
            cells: 1,
            micro_steps: 2 + u64::from(cell),
            targets: 10 * u64::from(cell + 1),
            loss: 0.1 * f64::from(cell + 1),
            data: (0..LEN)
                .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-5..5)))
                .collect(),
        }
    }

    fn board(c: &(Arc<Plane>, Arc<Collectives>)) -> PrefixGrads {
        PrefixGrads {
            store: PlaneGrads(c.0.clone()),
            prefix: c.1.clone(),
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn two_cells_reduce_over_the_ring_to_the_one_process_sum_bit_for_bit() {
        let c = cluster(2);
        for step in 0..3 {
            let parts = [grads(0, step), grads(1, step)];
            board(&c[1]).deposit(step, 0, parts[0].clone());
            board(&c[2]).deposit(step, 1, parts[1].clone());
            let (sum, missing) = board(&c[1]).reduce(step, 2).unwrap();
            let sum = sum.unwrap();
            let expected = GradBuffer::sum(&parts).unwrap();
            assert_eq!(bits(&sum.data), bits(&expected.data), "step {step}");
            assert_eq!(
                GradBuffer {
                    data: Vec::new(),
                    ..sum
                },
                GradBuffer {
                    data: Vec::new(),
                    ..expected
                }
            );
            assert!(missing.is_empty());
        }
        assert_eq!(board(&c[1]).shared_steps(), 3);
        // Each rank writes half the gradient twice per call. The member's
        // side of the ring may still be counting its last write when the
        // reducing rank returns, so its count is awaited (bounded).
        let expected = 3 * 2 * (LEN as u64 / 2) * 4;
        for p in [&c[1].0, &c[2].0] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while p.moved().gradients < expected && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(
                p.moved().gradients >= expected,
                "{} of {expected} gradient bytes counted",
                p.moved().gradients
            );
        }
        assert_eq!(c[0].0.moved().gradients, 0, "the head takes no part");
    }

    #[test]
    fn three_cells_reduce_in_the_pinned_ring_order_and_a_silent_member_adds_zeros() {
        let c = cluster(3);
        let parts: Vec<GradBuffer> = (0..3).map(|cell| grads(cell, 1)).collect();
        for cell in 0..3 {
            board(&c[1 + cell]).deposit(1, cell as u32, parts[cell].clone());
        }
        let (sum, missing) = board(&c[1]).reduce(1, 3).unwrap();
        let sum = sum.unwrap();
        let normalised: Vec<Vec<f32>> = parts
            .iter()
            .map(|p| GradBuffer::sum(std::slice::from_ref(p)).unwrap().data)
            .collect();
        let slices: Vec<&[f32]> = normalised.iter().map(Vec::as_slice).collect();
        assert_eq!(bits(&sum.data), bits(&ring_order_sum(&slices)));
        assert_ne!(
            bits(&sum.data),
            bits(&GradBuffer::sum(&parts).unwrap().data),
            "three ranks sum in the ring's order, not cell order"
        );
        assert_eq!((sum.cells, sum.micro_steps, sum.targets), (3, 9, 60));
        assert!(missing.is_empty());

        // Step 2: cell 2 drained nothing; the prefix of 2 is its own ring.
        board(&c[1]).deposit(2, 0, parts[0].clone());
        board(&c[2]).deposit(2, 1, parts[1].clone());
        let (sum, missing) = board(&c[1]).reduce(2, 3).unwrap();
        assert_eq!(missing, vec![2]);
        let zeros = vec![0.0; LEN];
        let with_zeros = ring_order_sum(&[&normalised[0], &normalised[1], &zeros]);
        assert_eq!(bits(&sum.unwrap().data), bits(&with_zeros));
        let (sum, _) = board(&c[1]).reduce(2, 2).unwrap();
        let two = GradBuffer::sum(&parts[..2]).unwrap();
        assert_eq!(bits(&sum.unwrap().data), bits(&two.data));
    }

    #[test]
    fn a_broadcast_leaves_the_cores_parameters_with_every_member() {
        let c = cluster(3);
        let core = PrefixWeights {
            store: PlaneWeights(c[1].0.clone()),
            prefix: c[1].1.clone(),
        };
        let params: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        core.publish(6, params.clone().into());
        assert_eq!(core.broadcast(3).unwrap(), Some(6));
        for member in &c[2..] {
            assert_eq!(member.0.moved().weights, params.len() as u64);
            let got = PlaneWeights(member.0.clone()).get(6).unwrap();
            assert_eq!(&got[..], &params[..]);
            assert_eq!(
                member.0.moved().weights,
                params.len() as u64,
                "the load found the broadcast's bytes and read nothing more"
            );
        }
    }

    #[test]
    fn member_counts_round_trip() {
        let g = GradBuffer {
            version: 3,
            fingerprint: 9,
            cells: 1,
            micro_steps: 4,
            targets: 17,
            loss: 0.125,
            data: vec![1.0; 5],
        };
        let cells = vec![(1, Some(g.clone())), (3, None)];
        let (step, back) = decode_meta(&encode_meta(12, &cells)).unwrap();
        assert_eq!(step, 12);
        assert_eq!(back.len(), 2);
        let got = back[0].1.clone().unwrap();
        assert_eq!((got.version, got.targets, got.loss), (3, 17, 0.125));
        assert!(got.data.is_empty());
        assert_eq!(back[1], (3, None));
        assert_eq!(decode_meta(&[1, 2, 3]), None);
    }
}
