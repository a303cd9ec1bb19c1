//! TITO records and micro-step rows by handle: executions' records reach the
//! packer through `EvalJob.records` → `BufferMsg::Resolved` → `Sample` as
//! blob handles in a `MemBlobs`, and micro-steps carry their rows as a blob
//! a trainer reads. The same batch must come out as with inline records, a
//! bad handle must cost only its own execution, and every record blob must
//! be released.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gyre_actors::sched::buffer::Buffer;
use gyre_actors::sched::cell::CellMsg;
use gyre_actors::sched::core::CoreMsg;
use gyre_actors::sched::evaluator::{EvalJob, Evaluator, EvaluatorMsg};
use gyre_actors::sched::execution::ExecStatus;
use gyre_actors::sched::ids::{ExecId, GroupId};
use gyre_actors::sched::packer::{Packer, PackerConfig, PackerLinks, PackerMsg, PackerStats};
use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq};
use gyre_actors::sched::proto::payload::MicroStepRows;
use gyre_actors::sched::queue::{MicroQueue, QueueMsg};
use gyre_actors::sched::samples::{Recorded, RecordedConfig};
use gyre_actors::sched::scheduler::{Backends, SchedMsg, Scheduler};
use gyre_actors::sched::{ConfigError, SampleMode, SchedConfig};
use gyre_actors::trajectory::packing::TokenRow;
use gyre_actors::trajectory::synth::{self, SynthConfig};
use gyre_actors::trajectory::{TitoRecord, TreeConfig};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{
    ActorId, Addr, BlobId, BlobStore, External, MemBlobs, Message, NodeId as Node, Recipient, SECS,
    get_decoded, put_encoded,
};

const TESTER: ActorId = ActorId::new(99, 1);
const N: u64 = 4;
const B: u32 = 2;
const BUDGET: u64 = 700;
const HOUR: u64 = 3_600 * SECS;
/// Execution 2 is a complete failure (a dummy); the rest are scored.
const DUMMY: u64 = 2;

fn as_actor<A, M>(probe: Addr<External<M>>) -> Addr<A> {
    Addr::new(probe.id())
}

fn got<M: Message>(sim: &mut Sim, probe: Addr<External<M>>) -> Vec<M> {
    sim.run().unwrap();
    sim.take_probe(probe).into_iter().map(|r| r.msg).collect()
}

/// Like [`got`], but runs only up to one more simulated second.
fn got_by<M: Message>(sim: &mut Sim, clock: &mut u64, probe: Addr<External<M>>) -> Vec<M> {
    *clock += SECS;
    sim.run_until(*clock).unwrap();
    sim.take_probe(probe).into_iter().map(|r| r.msg).collect()
}

fn records(exec: u64) -> Vec<TitoRecord> {
    synth::generate(&SynthConfig::small(100 + exec, format!("exec-{exec}")))
        .unwrap()
        .records
}

fn source() -> Recorded {
    Recorded::new(RecordedConfig {
        jmax: 2,
        profile: synth::profile(),
        tree: TreeConfig::default(),
    })
    .unwrap()
}

/// How records reach the packer.
#[derive(Clone, Copy, PartialEq)]
enum Delivery {
    /// `PackerMsg::Record`, no store.
    Inline,
    /// Handles in `EvalJob.records`; with `corrupt`, execution 1 gets a
    /// garbage blob among its records and execution 5 a missing handle.
    Handles { corrupt: bool },
}

/// What training reads of batch 0, and what the run left behind.
struct Outcome {
    /// Rows per batch execution index, in the order the packer made them.
    rows: BTreeMap<u32, Vec<TokenRow>>,
    /// Σ L_i per group, as the core is told.
    group_tokens: Vec<(GroupId, u64)>,
    stats: PackerStats,
    /// Blobs live once the batch was sealed (micro-step rows only).
    live_after_seal: usize,
    /// Record blobs put in the store.
    records_put: usize,
    micro_steps: usize,
    /// Blobs live after the trainer released every micro-step's rows.
    live_after_training: usize,
    /// With `keep_until_durable`: blobs live once trained, before the
    /// update was durable.
    live_trained_undurable: usize,
}

fn run(delivery: Delivery) -> Outcome {
    run_with(delivery, false)
}

fn run_with(delivery: Delivery, keep_until_durable: bool) -> Outcome {
    let mut sim = Sim::new(SimConfig::new(3));
    let core = sim.probe::<CoreMsg>(Node(1));
    let sched = sim.probe::<SchedMsg>(Node(1));
    let backend = sim.probe::<EvalReq>(Node(2));
    let cell = sim.probe::<CellMsg>(Node(3));
    let store = MemBlobs::shared();
    let dyn_store: Arc<dyn BlobStore> = store.clone();
    let buffer = sim.spawn(Node(0), Buffer::new(N as u32));
    let queue = sim.spawn(Node(0), MicroQueue::new());
    let mut packer = Packer::new(
        PackerConfig {
            batch_groups: B,
            micro_tokens: BUDGET,
            short_micro_steps: 1_000,
            streaming: true,
            keep_until_durable,
        },
        PackerLinks {
            buffer,
            queue,
            core: as_actor(core),
            sched: as_actor(sched),
        },
    );
    packer = match delivery {
        Delivery::Inline => packer.with_source(Box::new(source())),
        Delivery::Handles { .. } => packer
            .with_source(Box::new(source().with_blobs(dyn_store.clone())))
            .with_blobs(dyn_store.clone()),
    };
    let packer = sim.spawn(Node(0), packer);
    let evaluator = sim.spawn(Node(0), Evaluator::new(backend.into(), buffer, SECS));

    let mut records_put = 0;
    for exec in 0..u64::from(B) * N {
        let id = ExecId(exec);
        let mut handles = Vec::new();
        for record in records(exec) {
            match delivery {
                Delivery::Inline => sim.inject(
                    TESTER,
                    packer,
                    PackerMsg::Record {
                        exec: id,
                        group: id.group(N as u32),
                        record: Box::new(record),
                    },
                ),
                Delivery::Handles { .. } => {
                    handles.push(put_encoded(store.as_ref(), &record).unwrap());
                    records_put += 1;
                }
            }
        }
        if delivery == (Delivery::Handles { corrupt: true }) {
            match exec {
                1 => {
                    handles.insert(1, store.put(vec![0xff; 9]));
                    records_put += 1;
                }
                5 => handles.push(BlobId(1 << 40)),
                _ => {}
            }
        }
        let status = if exec == DUMMY {
            ExecStatus::Failed { complete: true }
        } else {
            ExecStatus::Completed
        };
        let job = EvalJob {
            exec: id,
            group: id.group(N as u32),
            v_d: 0,
            status,
            tokens: 0,
            deadline: HOUR,
            records: handles,
        };
        sim.inject(TESTER, evaluator, EvaluatorMsg::Evaluate(job));
    }
    let asked = got(&mut sim, backend);
    assert_eq!(asked.len() as u64, u64::from(B) * N - 1);
    for EvalReq::Score { exec, attempt, .. } in asked {
        let reward = (exec.0 % 3) as f64 / 2.0;
        let event = EvalEvent::Scored {
            exec,
            attempt,
            reward,
        };
        sim.inject(TESTER, evaluator, EvaluatorMsg::Backend(event));
    }
    let sealed = got(&mut sim, core);
    let [CoreMsg::BatchSealed { groups, .. }] = &sealed[..] else {
        panic!("one sealed batch expected: {sealed:?}");
    };
    let group_tokens = groups.iter().map(|g| (g.group, g.tokens)).collect();
    let live_after_seal = store.live();

    // Train batch 0 as one cell: every micro-step's rows, by handle when
    // there is a store, checked against what the packer holds.
    let mut rows: BTreeMap<u32, Vec<TokenRow>> = BTreeMap::new();
    let mut seen_rows: BTreeSet<(GroupId, u32)> = BTreeSet::new();
    let mut micro_steps = 0;
    loop {
        let claim = QueueMsg::Claim {
            step: 0,
            cell: 0,
            reply_to: cell.into(),
        };
        sim.inject(TESTER, queue, claim);
        let mstep = match got(&mut sim, cell).pop() {
            Some(CellMsg::Grant { mstep }) => mstep,
            Some(CellMsg::StreamEnd { step: 0 }) => break,
            other => panic!("unexpected answer to a claim: {other:?}"),
        };
        micro_steps += 1;
        let p = sim.actor(packer).unwrap().payload(mstep.id).unwrap();
        let want = MicroStepRows::extract(p.rows, p.chunks, p.stats_chunks).unwrap();
        match delivery {
            Delivery::Inline => assert!(mstep.rows.is_none()),
            Delivery::Handles { .. } => {
                let blob: MicroStepRows = get_decoded(store.as_ref(), mstep.rows).unwrap();
                assert_eq!(blob, want, "{:?}: the blob is the packer's rows", mstep.id);
                for (a, b) in blob.chunks.iter().zip(p.chunks) {
                    let (x, y) = (&blob.rows[a.row as usize], &p.rows[b.row as usize]);
                    let (s, e) = (a.start as usize, a.end as usize);
                    assert_eq!(x.input_ids[s..e], y.input_ids[s..e]);
                    assert_eq!(x.coefficients[s..e], y.coefficients[s..e]);
                }
            }
        }
        for (r, row) in p.rows.iter().enumerate() {
            if seen_rows.insert((p.group, r as u32)) {
                rows.entry(row.execution).or_default().push(row.clone());
            }
        }
    }
    // The rows stay readable until the step is trained (a cut member's
    // share is read again by the survivors); then the packer frees them.
    let live_before_trained = store.live();
    sim.inject(TESTER, packer, PackerMsg::Trained { step: 0 });
    sim.run().unwrap();
    if matches!(delivery, Delivery::Handles { .. }) {
        assert_eq!(live_before_trained, micro_steps, "rows kept until trained");
    }
    let live_trained_undurable = store.live();
    if keep_until_durable {
        sim.inject(TESTER, packer, PackerMsg::Durable { version: 1 });
        sim.run().unwrap();
    }
    let stats = sim.actor(packer).unwrap().stats();
    Outcome {
        rows,
        group_tokens,
        stats,
        live_after_seal,
        records_put,
        micro_steps,
        live_after_training: store.live(),
        live_trained_undurable,
    }
}

#[test]
fn records_by_handle_train_exactly_like_inline_records_and_are_released() {
    let inline = run(Delivery::Inline);
    let by_handle = run(Delivery::Handles { corrupt: false });
    assert!(!inline.rows.is_empty());
    assert_eq!(by_handle.rows, inline.rows, "same rows and coefficients");
    assert_eq!(by_handle.group_tokens, inline.group_tokens);
    // Every execution's records, the dummy's included, went in.
    assert_eq!(by_handle.stats.records, inline.stats.records);
    assert_eq!(by_handle.stats.records, by_handle.records_put as u64);
    assert_eq!(
        (
            by_handle.stats.rejected_records,
            by_handle.stats.sample_errors
        ),
        (0, 0)
    );
    // Only the micro-steps' rows outlive the take, and the trainer frees
    // those.
    assert!(by_handle.records_put > 0);
    assert_eq!(by_handle.live_after_seal, by_handle.micro_steps);
    assert_eq!(by_handle.live_after_training, 0);
    assert_eq!(inline.live_after_seal, 0);
}

/// A core that recovers from checkpoints may train a step again after a
/// restore: its rows stay until its update is durable, then go.
#[test]
fn with_recovery_rows_outlive_training_until_the_update_is_durable() {
    let kept = run_with(Delivery::Handles { corrupt: false }, true);
    assert!(kept.micro_steps > 0);
    assert_eq!(kept.live_trained_undurable, kept.micro_steps);
    assert_eq!(kept.live_after_training, 0, "released once durable");
    let plain = run(Delivery::Handles { corrupt: false });
    assert_eq!(plain.live_trained_undurable, 0, "released once trained");
}

#[test]
fn a_bad_record_handle_costs_only_its_own_execution() {
    let clean = run(Delivery::Handles { corrupt: false });
    let bad = run(Delivery::Handles { corrupt: true });
    // Executions 1 (garbage blob) and 5 (missing blob) train nothing; the
    // rest of both groups train exactly as before: the group advantages
    // come from outcomes, which a bad record does not change.
    let mut want = clean.rows.clone();
    want.remove(&1).unwrap();
    want.remove(&5).unwrap();
    assert_eq!(bad.rows, want);
    assert_eq!(
        (bad.stats.rejected_records, bad.stats.sample_errors),
        (2, 2)
    );
    for ((g, clean_l), (h, bad_l)) in clean.group_tokens.iter().zip(&bad.group_tokens) {
        assert_eq!(g, h);
        assert!(bad_l < clean_l, "{g:?} lost one execution's targets");
    }
    // The garbage blob was released with the good ones.
    assert_eq!(bad.live_after_seal, bad.micro_steps);
    assert_eq!(bad.live_after_training, 0);
}

fn port<M: Message>(n: u32) -> Recipient<M> {
    Addr::<External<M>>::new(ActorId::new(50, u64::from(n))).into()
}

fn backends(blobs: Option<Arc<dyn BlobStore>>) -> Backends {
    let cfg = SchedConfig::default();
    let k = cfg.cells;
    Backends {
        engines: (0..k).map(port).collect(),
        pool_engine: None,
        trainers: (0..k).map(|i| port(10 + i)).collect(),
        memories: (0..k).map(|i| port(20 + i)).collect(),
        transfer: port(30),
        harness: port(31),
        evaluator: port(32),
        kv_bytes_per_token: 1,
        blobs,
    }
}

#[test]
fn recorded_samples_need_a_blob_store() {
    let cfg = SchedConfig {
        samples: SampleMode::Recorded(RecordedConfig::default()),
        ..SchedConfig::default()
    };
    let err = Scheduler::new(cfg.clone(), backends(None)).unwrap_err();
    assert!(matches!(&err, ConfigError::Samples(_)));
    assert!(err.to_string().contains("samples"), "{err}");
    assert!(Scheduler::new(cfg, backends(Some(MemBlobs::shared()))).is_ok());
    assert!(Scheduler::new(SchedConfig::default(), backends(None)).is_ok());
}

#[test]
fn an_execution_threads_prompt_and_record_handles_in_answer_order() {
    use gyre_actors::sched::execution::{ExecLinks, ExecMsg, Execution};
    use gyre_actors::sched::ids::CallId;
    use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
    use gyre_actors::sched::proxy::ProxyMsg;

    let mut sim = Sim::new(SimConfig::new(1));
    let sched = sim.probe::<SchedMsg>(Node(1));
    let proxy = sim.probe::<ProxyMsg>(Node(1));
    let eval = sim.probe::<EvaluatorMsg>(Node(1));
    let harness = sim.probe::<HarnessReq>(Node(2));
    let links = ExecLinks {
        sched: as_actor(sched),
        proxy: as_actor(proxy),
        evaluator: as_actor(eval),
        harness: harness.into(),
    };
    let exec = ExecId(6);
    let e = sim.spawn(Node(0), Execution::new(exec, GroupId(1), 0, links, HOUR));
    // Runs stop well before the overall timeout.
    let mut clock = 0;
    sim.inject(TESTER, e, ExecMsg::Start);
    let calls = [
        CallId { exec, seq: 0 },
        CallId { exec, seq: 1 },
        CallId { exec, seq: 2 },
    ];
    for (i, call) in calls.iter().enumerate() {
        let prompt = BlobId(10 + i as u64);
        sim.inject(
            TESTER,
            e,
            HarnessEvent::ModelCall {
                call: *call,
                prompt_tokens: 5,
                prompt,
            },
        );
        let sent = got_by(&mut sim, &mut clock, proxy);
        assert!(
            matches!(sent[..], [ProxyMsg::Call { prompt: p, .. }] if p == prompt),
            "{sent:?}"
        );
    }
    // Answered out of call order; one answer carries no record.
    for (call, output) in [
        (calls[2], BlobId(72)),
        (calls[0], BlobId::NONE),
        (calls[1], BlobId(71)),
    ] {
        let answer = ExecMsg::Answer {
            call,
            output_tokens: 3,
            version: 0,
            output,
        };
        sim.inject(TESTER, e, answer);
    }
    let answers: Vec<_> = got_by(&mut sim, &mut clock, harness)
        .into_iter()
        .filter_map(|m| match m {
            HarnessReq::Answer { call, output, .. } => Some((call.seq, output)),
            _ => None,
        })
        .collect();
    assert_eq!(
        answers,
        vec![(2, BlobId(72)), (0, BlobId::NONE), (1, BlobId(71))]
    );
    sim.inject(
        TESTER,
        e,
        HarnessEvent::Finished {
            outcome: HarnessOutcome::Completed,
        },
    );
    let jobs = got_by(&mut sim, &mut clock, eval);
    let [EvaluatorMsg::Evaluate(job)] = &jobs[..] else {
        panic!("one evaluation job expected: {jobs:?}");
    };
    assert_eq!(job.records, vec![BlobId(72), BlobId(71)]);
    assert_eq!(job.tokens, 9);
}

#[test]
fn the_proxy_releases_records_nobody_waits_for() {
    use gyre_actors::sched::execution::ExecMsg;
    use gyre_actors::sched::ids::{CallId, EngineIx};
    use gyre_actors::sched::proto::engine::{CallEvent, EngineReq};
    use gyre_actors::sched::proxy::{Proxy, ProxyMsg};

    let mut sim = Sim::new(SimConfig::new(1));
    let engine = sim.probe::<EngineReq>(Node(1));
    let exec_probe = sim.probe::<ExecMsg>(Node(2));
    let store = MemBlobs::shared();
    let proxy =
        Proxy::new(BTreeMap::from([(EngineIx::Cell(0), engine.into())])).with_blobs(store.clone());
    let proxy = sim.spawn(Node(0), proxy);
    let exec = ExecId(1);
    let call = CallId { exec, seq: 0 };
    let engine_ix = EngineIx::Cell(0);
    sim.inject(
        TESTER,
        proxy,
        ProxyMsg::Route {
            exec,
            engine: engine_ix,
        },
    );
    sim.inject(
        TESTER,
        proxy,
        ProxyMsg::Call {
            call,
            prompt_tokens: 4,
            prompt: BlobId(900),
            reply_to: exec_probe.into(),
        },
    );
    assert_eq!(got(&mut sim, engine).len(), 1);
    let done = |attempt, output| {
        ProxyMsg::Engine(CallEvent::Done {
            call,
            attempt,
            output_tokens: 2,
            version: 0,
            output,
        })
    };
    let stale = store.put(vec![1]);
    let answer = store.put(vec![2]);
    let late = store.put(vec![3]);
    sim.inject(TESTER, proxy, done(7, stale));
    sim.inject(TESTER, proxy, done(1, answer));
    sim.inject(TESTER, proxy, done(1, late));
    let answers = got(&mut sim, exec_probe);
    assert!(
        matches!(answers[..], [ExecMsg::Answer { output, .. }] if output == answer),
        "{answers:?}"
    );
    // The answer is the execution's now; the others had no taker.
    assert!(store.get(answer).is_some());
    assert_eq!(store.live(), 1);
}
