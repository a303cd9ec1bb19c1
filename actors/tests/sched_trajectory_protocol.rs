//! The trajectory plane inside the scheduling plane's actors: recorded
//! executions from the synthetic trace generator go through the evaluator,
//! the trajectory buffer, the stream packer and the micro-step queue in the
//! deterministic simulator, and what training would read is checked against
//! SPEC 3.3, 3.6 and 3.7 token by token.

use std::collections::{BTreeMap, BTreeSet};

use gyre_actors::sched::buffer::{Buffer, GroupState};
use gyre_actors::sched::cell::CellMsg;
use gyre_actors::sched::core::CoreMsg;
use gyre_actors::sched::evaluator::{EvalJob, Evaluator, EvaluatorMsg};
use gyre_actors::sched::execution::ExecStatus;
use gyre_actors::sched::ids::{ExecId, GroupId, MicroStepId};
use gyre_actors::sched::packer::{Packer, PackerConfig, PackerLinks, PackerMsg};
use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq};
use gyre_actors::sched::queue::{MicroQueue, QueueMsg};
use gyre_actors::sched::samples::{Recorded, RecordedConfig};
use gyre_actors::sched::scheduler::SchedMsg;
use gyre_actors::trajectory::packing::{RowChunk, TokenRow};
use gyre_actors::trajectory::scoring::Outcome;
use gyre_actors::trajectory::synth::{self, SynthConfig};
use gyre_actors::trajectory::tree::flag;
use gyre_actors::trajectory::{NodeId, TitoRecord, TrajectoryTree, TreeConfig};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, External, Message, NodeId as Node, SECS};

const TESTER: ActorId = ActorId::new(99, 1);
/// N executions per group, B groups per batch.
const N: u64 = 4;
const B: u32 = 2;
const JMAX: usize = 2;
const BUDGET: u64 = 700;
const HOUR: u64 = 3_600 * SECS;

fn as_actor<A, M>(probe: Addr<External<M>>) -> Addr<A> {
    Addr::new(probe.id())
}

fn got<M: Message>(sim: &mut Sim, probe: Addr<External<M>>) -> Vec<M> {
    sim.run().unwrap();
    sim.take_probe(probe).into_iter().map(|r| r.msg).collect()
}

/// The records the proxy would write for execution `exec`.
fn records(exec: u64) -> Vec<TitoRecord> {
    synth::generate(&SynthConfig::small(100 + exec, format!("exec-{exec}")))
        .unwrap()
        .records
}

fn tree_of(exec: u64) -> TrajectoryTree {
    let mut t = TrajectoryTree::new(format!("exec-{exec}"), TreeConfig::default());
    for r in records(exec) {
        t.insert(&r).unwrap();
    }
    t
}

struct Rig {
    sim: Sim,
    buffer: Addr<Buffer>,
    packer: Addr<Packer>,
    queue: Addr<MicroQueue>,
    evaluator: Addr<Evaluator>,
    backend: Addr<External<EvalReq>>,
    core: Addr<External<CoreMsg>>,
    cell: Addr<External<CellMsg>>,
}

impl Rig {
    fn new(seed: u64) -> Self {
        let mut sim = Sim::new(SimConfig::new(seed));
        let core = sim.probe::<CoreMsg>(Node(1));
        let sched = sim.probe::<SchedMsg>(Node(1));
        let backend = sim.probe::<EvalReq>(Node(2));
        let cell = sim.probe::<CellMsg>(Node(3));
        let buffer = sim.spawn(Node(0), Buffer::new(N as u32));
        let queue = sim.spawn(Node(0), MicroQueue::new());
        let source = Recorded::new(RecordedConfig {
            jmax: JMAX,
            profile: synth::profile(),
            tree: TreeConfig::default(),
        })
        .unwrap();
        let packer = sim.spawn(
            Node(0),
            Packer::new(
                PackerConfig {
                    batch_groups: B,
                    micro_tokens: BUDGET,
                    short_micro_steps: 1_000,
                    streaming: true,
                    keep_until_durable: false,
                },
                PackerLinks {
                    buffer,
                    queue,
                    core: as_actor(core),
                    sched: as_actor(sched),
                },
            )
            .with_source(Box::new(source)),
        );
        let evaluator = sim.spawn(Node(0), Evaluator::new(backend.into(), buffer, SECS));
        Rig {
            sim,
            buffer,
            packer,
            queue,
            evaluator,
            backend,
            core,
            cell,
        }
    }

    fn packer(&self) -> &Packer {
        self.sim.actor(self.packer).unwrap()
    }

    fn buffer(&self) -> &Buffer {
        self.sim.actor(self.buffer).unwrap()
    }

    fn record_all(&mut self, exec: u64) {
        for record in records(exec) {
            let msg = PackerMsg::Record {
                exec: ExecId(exec),
                group: ExecId(exec).group(N as u32),
                record: Box::new(record),
            };
            self.sim.inject(TESTER, self.packer, msg);
        }
    }

    fn evaluate(&mut self, exec: u64, status: ExecStatus, deadline: u64) {
        let job = EvalJob {
            exec: ExecId(exec),
            group: ExecId(exec).group(N as u32),
            v_d: 0,
            status,
            tokens: 0,
            deadline,
            records: Vec::new(),
        };
        self.sim
            .inject(TESTER, self.evaluator, EvaluatorMsg::Evaluate(job));
    }

    /// Score requests the backend received: (execution, attempt).
    fn asked(&mut self) -> Vec<(u64, u32)> {
        got(&mut self.sim, self.backend)
            .into_iter()
            .map(|EvalReq::Score { exec, attempt, .. }| (exec.0, attempt))
            .collect()
    }

    fn answer(&mut self, exec: u64, attempt: u32, reward: Option<f64>) {
        let exec = ExecId(exec);
        let event = match reward {
            Some(reward) => EvalEvent::Scored {
                exec,
                attempt,
                reward,
            },
            None => EvalEvent::Failed { exec, attempt },
        };
        self.sim
            .inject(TESTER, self.evaluator, EvaluatorMsg::Backend(event));
    }

    /// Claims step 0's micro-steps as one training cell until the stream
    /// ends; returns the grants in order.
    fn drain(&mut self) -> Vec<(MicroStepId, u64)> {
        let mut grants = Vec::new();
        loop {
            let claim = QueueMsg::Claim {
                step: 0,
                cell: 0,
                reply_to: self.cell.into(),
            };
            self.sim.inject(TESTER, self.queue, claim);
            match got(&mut self.sim, self.cell).pop() {
                Some(CellMsg::Grant { mstep }) => grants.push((mstep.id, mstep.tokens)),
                Some(CellMsg::StreamEnd { step: 0 }) => return grants,
                other => panic!("unexpected answer to a claim: {other:?}"),
            }
        }
    }
}

/// What training reads of one batch: per micro-step its chunks, and the
/// token rows of each group they point into.
#[derive(Debug, PartialEq)]
struct Batch {
    /// Groups in batch order: execution index = position · N + k.
    groups: Vec<GroupId>,
    steps: Vec<(MicroStepId, u64, GroupId, Vec<RowChunk>)>,
    rows: BTreeMap<GroupId, Vec<TokenRow>>,
}

/// Runs the scenario of the module doc and returns the batch, checking the
/// readiness protocol on the way.
fn scenario(seed: u64) -> Batch {
    let mut r = Rig::new(seed);
    for exec in 0..2 * N {
        r.record_all(exec);
    }
    // Group 0: a timed-out run scored with partial credit; a run whose
    // first evaluation fails; a complete failure; a run whose evaluator
    // keeps failing until its budget is gone. Group 1: four clean scores.
    r.evaluate(0, ExecStatus::HarnessTimeout, HOUR);
    r.evaluate(1, ExecStatus::Completed, HOUR);
    r.evaluate(2, ExecStatus::Failed { complete: true }, HOUR);
    r.evaluate(3, ExecStatus::Completed, SECS / 2);
    for exec in N..2 * N {
        r.evaluate(exec, ExecStatus::Completed, HOUR);
    }
    let mut asked = r.asked();
    asked.sort_unstable();
    assert_eq!(
        asked,
        vec![(0, 0), (1, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0)]
    );
    r.answer(0, 0, Some(0.75));
    r.answer(1, 0, None);
    r.answer(3, 0, None);
    for (exec, reward) in [(4, 1.0), (5, 0.0), (6, 0.5), (7, 1.0)] {
        r.answer(exec, 0, Some(reward));
    }
    // Execution 1 is retried on the same state; execution 3's budget ran
    // out before a retry could start.
    assert_eq!(r.asked(), vec![(1, 1)]);
    let (g0, g1) = (GroupId(0), GroupId(1));
    assert_eq!(
        r.buffer().outcome(g0, ExecId(1)),
        Some(&Outcome::Pending { attempts: 1 })
    );
    assert_eq!(
        r.buffer().outcome(g0, ExecId(3)),
        Some(&Outcome::Excluded { attempts: 1 })
    );
    assert_eq!(
        r.buffer().outcome(g0, ExecId(0)),
        Some(&Outcome::Valid {
            score: 0.75,
            partial: true
        })
    );
    assert_eq!(r.buffer().outcome(g0, ExecId(2)), Some(&Outcome::Dummy));
    // Pending is not a zero: group 0 waits, group 1 went ahead.
    assert_eq!(r.buffer().state_of(g0), Some(GroupState::Filling));
    assert_eq!(r.buffer().state_of(g1), Some(GroupState::Taken));
    assert!(got(&mut r.sim, r.core).is_empty(), "sealed without group 0");
    assert_eq!(r.packer().source().held(), N as usize);

    r.answer(1, 1, Some(0.0));
    let sealed = got(&mut r.sim, r.core);
    let [
        CoreMsg::BatchSealed {
            step: 0,
            groups,
            micro_steps,
            ..
        },
    ] = &sealed[..]
    else {
        panic!("one sealed batch expected: {sealed:?}");
    };
    assert_eq!(r.buffer().state_of(g0), Some(GroupState::Taken));
    let ev = r.sim.actor(r.evaluator).unwrap();
    let st = ev.stats();
    assert_eq!(ev.in_progress(), 0);
    assert_eq!(
        (st.scored, st.dummies, st.excluded, st.failed_attempts),
        (6, 1, 1, 2)
    );
    // Every tree became rows or was dropped; a late record is refused.
    assert_eq!(r.packer().source().held(), 0);
    r.record_all(5);
    r.sim.run().unwrap();
    let stats = r.packer().stats();
    assert_eq!(stats.rejected_records + stats.sample_errors, 0);
    assert_eq!(stats.late_records, records(5).len() as u64);
    assert_eq!(r.packer().source().held(), 0);

    let grants = r.drain();
    let granted: Vec<MicroStepId> = grants.iter().map(|g| g.0).collect();
    assert_eq!(
        &granted, micro_steps,
        "every micro-step granted once, in order"
    );
    let mut batch = Batch {
        groups: groups.iter().map(|g| g.group).collect(),
        steps: Vec::new(),
        rows: BTreeMap::new(),
    };
    for (id, tokens) in grants {
        let p = r
            .packer()
            .payload(id)
            .expect("recorded micro-steps keep their rows");
        batch.rows.entry(p.group).or_insert_with(|| p.rows.to_vec());
        batch.steps.push((id, tokens, p.group, p.chunks.to_vec()));
    }
    for g in &groups[..] {
        let rows = &batch.rows[&g.group];
        let targets: usize = rows.iter().map(TokenRow::targets).sum();
        assert_eq!(g.tokens, targets as u64, "the core is told Σ L_i");
    }
    batch
}

/// Maps each position of a materialised row back to its tree token.
fn positions(tree: &TrajectoryTree, leaf: NodeId) -> Vec<(NodeId, usize)> {
    tree.path(leaf)
        .into_iter()
        .flat_map(|n| (0..tree.node_len(n) as usize).map(move |o| (n, o)))
        .collect()
}

#[test]
fn recorded_executions_train_with_spec_weights_through_the_actors() {
    let batch = scenario(11);
    let bn = u64::from(B) * N;
    let exec_of = |index: u32| {
        let (pos, k) = (u64::from(index) / N, u64::from(index) % N);
        batch.groups[pos as usize].0 * N + k
    };

    // Packing: within the budget, chunks tile every row exactly once, and a
    // row's later chunks come in later micro-steps.
    // (start, end, micro-step seq) of each chunk, per (group, row).
    type Pieces = Vec<(u32, u32, u32)>;
    let mut covered: BTreeMap<(GroupId, u32), Pieces> = BTreeMap::new();
    for (id, tokens, group, chunks) in &batch.steps {
        let sum: u32 = chunks.iter().map(RowChunk::len).sum();
        assert_eq!(u64::from(sum), *tokens);
        assert!(*tokens <= BUDGET && *tokens > 0);
        for c in chunks {
            covered
                .entry((*group, c.row))
                .or_default()
                .push((c.start, c.end, id.seq));
        }
    }
    let mut rows_of: BTreeMap<u64, Vec<&TokenRow>> = BTreeMap::new();
    for (group, rows) in &batch.rows {
        for (r, row) in rows.iter().enumerate() {
            let mut pieces = covered.remove(&(*group, r as u32)).unwrap();
            pieces.sort_unstable();
            let mut at = 0;
            let mut seq = None;
            for (start, end, s) in pieces {
                assert_eq!(start, at, "row {r} of {group:?} has a gap or overlap");
                assert!(seq < Some(s), "a row's chunks go forward in micro-steps");
                (at, seq) = (end, Some(s));
            }
            assert_eq!(at as usize, row.len());
            rows_of.entry(exec_of(row.execution)).or_default().push(row);
        }
    }
    assert!(covered.is_empty());
    // The scenario exercises what it claims to: rows cut across micro-steps
    // and executions capped at J_max.
    assert!(
        batch
            .rows
            .values()
            .flatten()
            .any(|r| r.len() as u64 > BUDGET)
    );
    assert!(rows_of.values().any(|rows| rows.len() == JMAX));

    // Advantages over valid results only: group 0 is {0.75, 0.0, dummy 0}
    // (the excluded run is no zero), group 1 is {1, 0, 0.5, 1}.
    let advantage = BTreeMap::from([
        (0, 0.5),
        (1, -0.25),
        (4, 0.375),
        (5, -0.625),
        (6, -0.125),
        (7, 0.375),
    ]);
    let trained: BTreeSet<u64> = rows_of.keys().copied().collect();
    assert_eq!(trained, advantage.keys().copied().collect::<BTreeSet<_>>());

    for (exec, rows) in &rows_of {
        let tree = tree_of(*exec);
        assert!(rows.len() <= JMAX, "{exec}: {} trajectories", rows.len());
        let l_i: usize = rows.iter().map(|r| r.targets()).sum();
        assert!(l_i > 0 && l_i as u64 <= tree.trainable_tokens());
        let c = (1.0 / (l_i as f64 * bn as f64)) as f32;
        let mut weight = 0f64;
        let mut seen = BTreeSet::new();
        for row in rows {
            assert!((f64::from(row.advantage) - advantage[exec]).abs() < 1e-6);
            let at = positions(&tree, row.leaf);
            assert_eq!(at.len(), row.len());
            for (u, &(node, o)) in at.iter().enumerate() {
                assert_eq!(row.input_ids[u], tree.tokens(node)[o]);
                if !row.target[u] {
                    assert_eq!(row.coefficients[u], 0.0);
                    continue;
                }
                assert_eq!(row.coefficients[u], c, "{exec}: 1/(L_i·B·N) exactly");
                assert_eq!(row.behaviour_logprobs[u], tree.logprobs(node)[o]);
                assert!(
                    flag::trainable(tree.flags(node)[o]),
                    "only sampled tokens train"
                );
                assert!(seen.insert((node, o)), "{exec}: a target admitted twice");
                weight += f64::from(row.coefficients[u]);
            }
        }
        let want = 1.0 / bn as f64;
        assert!(
            (weight - want).abs() <= want * 1e-6,
            "{exec}: weight {weight}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_micro_steps() {
    let a = scenario(5);
    assert_eq!(a, scenario(5));
    // The admission seed comes from the run seed: another run draws other
    // trajectories, with the same weights per execution.
    let b = scenario(6);
    assert_eq!(a.groups, b.groups);
    assert_ne!(a.rows, b.rows);
}

/// SPEC 3.3: a backend that names the state it evaluated (a workspace's
/// content hash and branch) has its score bound to that state: the first
/// name given becomes the execution's designated state, a retry on the same
/// state binds there too, and a name for another attempt is ignored.
#[test]
fn a_score_is_bound_to_the_state_its_backend_named() {
    use gyre_actors::sched::proto::evaluator::EvalState;
    use gyre_actors::trajectory::scoring::ArtifactRef;
    let mut r = Rig::new(3);
    for exec in 0..N {
        r.record_all(exec);
        r.evaluate(exec, ExecStatus::Completed, HOUR);
    }
    r.asked();
    let state = |exec: u64, attempt: u32, digest: &str| {
        EvaluatorMsg::State(EvalState {
            exec: ExecId(exec),
            attempt,
            artifact: ArtifactRef {
                version: 0,
                branch: "ref: refs/heads/main".into(),
                digest: digest.into(),
            },
        })
    };
    let (a, b) = ("a".repeat(64), "b".repeat(64));
    // Execution 0: named, then scored.
    r.sim.inject(TESTER, r.evaluator, state(0, 0, &a));
    r.answer(0, 0, Some(0.25));
    // Execution 1: its first attempt fails; a name sent for an attempt it
    // is not on is ignored; the retry names its state and scores.
    r.answer(1, 0, None);
    assert_eq!(r.asked(), vec![(1, 1)]);
    r.sim.inject(TESTER, r.evaluator, state(1, 0, &a));
    r.sim.inject(TESTER, r.evaluator, state(1, 1, &b));
    r.answer(1, 1, Some(1.0));
    // The others score without naming a state (the simulator's backends).
    for exec in 2..N {
        r.answer(exec, 0, Some(0.5));
    }
    r.sim.run().unwrap();
    // Every score was valid: the group is whole and went to training.
    assert_eq!(r.buffer().state_of(GroupId(0)), Some(GroupState::Taken));
    let ev = r.sim.actor(r.evaluator).unwrap();
    let bound: Vec<(String, String, f32)> = ev
        .bindings()
        .iter()
        .map(|x| (x.execution.clone(), x.artifact.digest.clone(), x.score))
        .collect();
    assert_eq!(
        bound,
        vec![
            (format!("{:?}", ExecId(0)), a.clone(), 0.25),
            (format!("{:?}", ExecId(1)), b.clone(), 1.0),
        ]
    );
    assert!(
        ev.bindings()
            .iter()
            .all(|x| x.artifact.branch == "ref: refs/heads/main")
    );
    assert_eq!(ev.stats().scored, N);
}
