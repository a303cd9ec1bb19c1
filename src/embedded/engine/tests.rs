//! The engine worker under the simulator, with probes as the proxy and the
//! cell: what it answers, what it records, and that a call migrated with
//! its KV blocks samples exactly what it would have sampled unmoved.

use std::sync::{Arc, Mutex};

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq, KV_WAIT};
use gyre_actors::sched::proto::payload::Prompt;

use gyre_actors::trajectory::TitoRecord;
use gyre_gpu::engine::{Completion, Engine, EngineConfig, MemTag, Request};
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{
    ActorId, Addr, BlobId, MILLIS, MemBlobs, NodeId, Recipient, get_decoded, put_encoded,
};

use super::record::{call_seed, request};
use super::{EngineStats, EngineWorker};
use crate::embedded::shared::{EngineHandle, Shared, lock};

const TESTER: ActorId = ActorId::new(9, 1);
const SEED: u64 = 77;

fn params(seed: u64, version: u64) -> ParamBuffer {
    let mut p = ParamBuffer::init(&ModelConfig::tiny(), seed).unwrap();
    p.version = version;
    p
}

fn new_engine() -> Engine {
    Engine::new(
        EngineConfig::for_model(ModelConfig::tiny(), 4),
        &params(1, 0),
    )
    .unwrap()
}

struct Rig {
    sim: Sim,
    shared: Shared,
    proxy: Recipient<CallEvent>,
    cell: Recipient<EngineEvent>,
}

impl Rig {
    fn new() -> Self {
        let shared = Shared::new(ModelConfig::tiny(), MemBlobs::shared());
        shared.weights.publish(0, params(1, 0).encode().into());
        let mut cfg = SimConfig::new(4);
        cfg.codec_roundtrip = true;
        let mut sim = Sim::new(cfg);
        let proxy = sim.probe::<CallEvent>(NodeId(2)).into();
        let cell = sim.probe::<EngineEvent>(NodeId(2)).into();
        Rig {
            sim,
            shared,
            proxy,
            cell,
        }
    }

    fn engine(&mut self, ix: EngineIx) -> (Addr<EngineWorker>, EngineHandle) {
        let handle: EngineHandle = Arc::new(Mutex::new(new_engine()));
        let w = EngineWorker::new(ix, handle.clone(), self.shared.clone(), SEED);
        (self.sim.spawn(NodeId(1), w), handle)
    }

    fn worker(&self, engine: Addr<EngineWorker>) -> &EngineWorker {
        self.sim.actor(engine).unwrap()
    }

    fn stats(&self, engine: Addr<EngineWorker>) -> EngineStats {
        self.worker(engine).stats()
    }

    fn serve(&mut self, to: Addr<EngineWorker>, call: CallId, attempt: u32, prompt: BlobId) {
        let req = EngineReq::Serve {
            call,
            attempt,
            prompt_tokens: 0,
            prompt,
            reply_to: self.proxy,
        };
        self.sim.inject(TESTER, to, req);
    }

    fn send(&mut self, to: Addr<EngineWorker>, req: EngineReq) {
        self.sim.inject(TESTER, to, req);
    }

    fn put(&self, p: &Prompt) -> BlobId {
        put_encoded(&*self.shared.blobs, p).unwrap()
    }

    fn calls(&mut self) -> Vec<CallEvent> {
        self.sim
            .take_probe::<CallEvent>(Addr::new(self.proxy.id()))
            .into_iter()
            .map(|r| r.msg)
            .collect()
    }

    fn cell_events(&mut self) -> Vec<EngineEvent> {
        self.sim
            .take_probe::<EngineEvent>(Addr::new(self.cell.id()))
            .into_iter()
            .map(|r| r.msg)
            .collect()
    }

    fn record(&self, blob: BlobId) -> TitoRecord {
        get_decoded(&*self.shared.blobs, blob).unwrap()
    }
}

fn call(exec: u64, seq: u32) -> CallId {
    CallId {
        exec: ExecId(exec),
        seq,
    }
}

fn prompt(input_ids: Vec<u32>, max_new_tokens: u32) -> Prompt {
    Prompt::main_turn(input_ids, max_new_tokens)
}

/// What a fresh engine serving the same weights samples for `call`.
fn reference(p: &Prompt, call: CallId, weights: &ParamBuffer) -> Completion {
    let mut e = Engine::new(EngineConfig::for_model(ModelConfig::tiny(), 4), weights).unwrap();
    let req: Request = request(p, call_seed(SEED, call));
    e.generate(req).unwrap()
}

fn done(ev: &CallEvent) -> (CallId, u32, u64, u64, BlobId) {
    match ev {
        CallEvent::Done {
            call,
            attempt,
            output_tokens,
            version,
            output,
        } => (*call, *attempt, *output_tokens, *version, *output),
        other => panic!("expected Done, got {other:?}"),
    }
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
}

#[test]
fn a_served_call_records_exactly_what_generate_samples() {
    let mut r = Rig::new();
    let (eng, _) = r.engine(EngineIx::Cell(0));
    let p = prompt((1..12).collect(), 8);
    let blob = r.put(&p);
    let c = call(3, 1);
    r.serve(eng, c, 0, blob);
    r.sim.run().unwrap();
    let got = r.calls();
    assert_eq!(got.len(), 1);
    let (gc, attempt, n, version, out) = done(&got[0]);
    assert_eq!((gc, attempt, version), (c, 0, 0));
    let rec = r.record(out);
    rec.validate().unwrap();
    let want = reference(&p, c, &params(1, 0));
    assert_eq!(n as usize, want.tokens.len());
    assert_eq!(rec.output_ids, want.tokens);
    assert_eq!(rec.output_logprobs, want.logprobs);
    assert_eq!(rec.input_ids, p.input_ids);
    assert_eq!(rec.input_message_ends, p.message_ends);
    assert_eq!((rec.execution.as_str(), rec.call_id.as_str()), ("3", "1"));
    assert_eq!(rec.engine.as_deref(), Some("cell0"));
    assert_eq!(rec.thread.as_deref(), Some("main"));
    // Accepted at injection, answered after the steps' modelled latency.
    assert!(rec.end_ns >= rec.start_ns + 8 * MILLIS, "{rec:?}");
    let s = r.stats(eng);
    assert_eq!((s.served, s.prefilled_tokens, s.output_tokens), (1, 11, 8));
    assert_eq!(r.worker(eng).in_flight(), 0);
}

#[test]
fn calls_arriving_together_are_batched_and_each_samples_its_own_stream() {
    let mut r = Rig::new();
    let (eng, _) = r.engine(EngineIx::Pool);
    let prompts: Vec<Prompt> = (0..4u32)
        .map(|i| prompt((i * 10 + 1..i * 10 + 6 + i).collect(), 6))
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        let b = r.put(p);
        r.serve(eng, call(i as u64, 0), 0, b);
    }
    r.sim.run().unwrap();
    let got = r.calls();
    assert_eq!(got.len(), 4);
    for ev in &got {
        let (c, _, n, _, out) = done(ev);
        let p = &prompts[c.exec.0 as usize];
        let want = reference(p, c, &params(1, 0));
        let rec = r.record(out);
        assert_eq!(n, 6);
        assert_eq!(rec.output_ids, want.tokens, "{c:?}");
        assert!(close(&rec.output_logprobs, &want.logprobs), "{c:?}");
        assert_eq!(rec.engine.as_deref(), Some("pool"));
    }
    let s = r.stats(eng);
    // One at a time would take at least 4 × 6 iterations.
    assert!(s.steps < 12, "{s:?}");
    assert_eq!(s.served, 4);
}

#[test]
fn after_stop_admitting_new_calls_are_rejected() {
    let mut r = Rig::new();
    let (eng, _) = r.engine(EngineIx::Cell(1));
    r.send(eng, EngineReq::StopAdmitting { reply_to: r.cell });
    let b = r.put(&prompt(vec![1, 2, 3], 4));
    r.serve(eng, call(0, 0), 2, b);
    r.sim.run().unwrap();
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::AdmissionStopped]
    ));
    assert!(matches!(
        r.calls()[..],
        [CallEvent::Rejected { attempt: 2, .. }]
    ));
    assert_eq!(r.stats(eng).rejected, 1);
    assert!(!r.worker(eng).is_serving());
}

/// A call of exec 5 moving from engine `a` to engine `b`: served on `a`
/// for a few iterations, then `a` is drained as a switching cell does
/// (stop admitting, pin exec 5's and 6's blocks, cancel), which exports
/// the call's prefix (`tokens` long) onto the board.
struct Moved {
    a: Addr<EngineWorker>,
    ha: EngineHandle,
    b: Addr<EngineWorker>,
    hb: EngineHandle,
    p: Prompt,
    blob: BlobId,
    c: CallId,
    tokens: u64,
}

impl Moved {
    fn new(r: &mut Rig) -> Self {
        let (a, ha) = r.engine(EngineIx::Cell(0));
        let (b, hb) = r.engine(EngineIx::Cell(1));
        let p = prompt((3..23).collect(), 16);
        let blob = r.put(&p);
        let c = call(5, 2);
        let tokens = pin_and_cancel(r, a, &ha, c, blob);
        Moved {
            a,
            ha,
            b,
            hb,
            p,
            blob,
            c,
            tokens,
        }
    }
}

fn pin_and_cancel(
    r: &mut Rig,
    a: Addr<EngineWorker>,
    ha: &EngineHandle,
    c: CallId,
    blob: BlobId,
) -> u64 {
    r.serve(a, c, 0, blob);
    // A few iterations in: the prompt is cached, some tokens sampled.
    r.sim.run_until(5 * MILLIS).unwrap();
    assert!(r.calls().is_empty());
    let cell = r.cell;
    r.send(a, EngineReq::StopAdmitting { reply_to: cell });
    r.send(
        a,
        EngineReq::PinKv {
            execs: vec![ExecId(5), ExecId(6)],
            reply_to: cell,
        },
    );
    r.send(a, EngineReq::CancelAll { reply_to: cell });
    r.sim.run().unwrap();
    let ev = r.cell_events();
    let tokens = match &ev[..] {
        [
            EngineEvent::AdmissionStopped,
            EngineEvent::KvPinned { blocks },
            EngineEvent::CancelComplete { cancelled: 1 },
        ] => {
            assert_eq!(blocks.len(), 1, "{blocks:?}");
            assert_eq!(blocks[0].exec, ExecId(5));
            assert_eq!(blocks[0].engine, EngineIx::Cell(0));
            blocks[0].tokens
        }
        other => panic!("{other:?}"),
    };
    assert!(tokens > 20, "pinned {tokens}");
    assert!(matches!(
        r.calls()[..],
        [CallEvent::Cancelled { attempt: 0, .. }]
    ));
    assert_eq!(lock(ha).load().pins, 1);
    assert_eq!(r.shared.kv.len(), 1);
    tokens
}

#[test]
fn a_call_moved_with_its_blocks_prefills_less_and_samples_the_same_tokens() {
    let mut r = Rig::new();
    let Moved {
        a,
        ha,
        b,
        hb,
        p,
        blob,
        c,
        tokens,
    } = Moved::new(&mut r);

    r.send(
        b,
        EngineReq::AdoptKv {
            exec: ExecId(5),
            tokens,
        },
    );
    r.serve(b, c, 1, blob);
    r.send(
        a,
        EngineReq::ReleaseKv {
            execs: vec![ExecId(5)],
        },
    );
    r.sim.run().unwrap();
    let got = r.calls();
    assert_eq!(got.len(), 1);
    let (_, attempt, _, _, out) = done(&got[0]);
    assert_eq!(attempt, 1);
    let rec = r.record(out);
    let want = reference(&p, c, &params(1, 0));
    assert_eq!(rec.output_ids, want.tokens);
    assert!(close(&rec.output_logprobs, &want.logprobs));
    assert_eq!(rec.engine.as_deref(), Some("cell1"));

    let sb = r.stats(b);
    // Everything but the prompt's last token came with the blocks.
    assert_eq!(
        (sb.kv_adopted, sb.adopted_tokens, sb.prefilled_tokens),
        (1, 19, 1)
    );
    let sa = r.stats(a);
    assert_eq!((sa.kv_pinned, sa.cancelled, sa.served), (1, 1, 0));
    assert_eq!(lock(&ha).load().pins, 0);
    assert!(r.worker(a).pinned().is_empty());
    assert!(r.shared.kv.is_empty());
    assert!(lock(&hb).is_idle());
}

/// `c` was answered once, by `b`, with what an unmoved engine samples;
/// `b`'s (calls held for blocks, waits expired, prompt tokens adopted,
/// prompt tokens prefilled) are `want`.
fn assert_served_as_unmoved(
    r: &mut Rig,
    b: Addr<EngineWorker>,
    p: &Prompt,
    c: CallId,
    want: (u64, u64, u64, u64),
) {
    let got = r.calls();
    assert_eq!(got.len(), 1);
    let rec = r.record(done(&got[0]).4);
    assert_eq!(rec.output_ids, reference(p, c, &params(1, 0)).tokens);
    let sb = r.stats(b);
    let seen = (
        sb.kv_waits,
        sb.kv_wait_expired,
        sb.adopted_tokens,
        sb.prefilled_tokens,
    );
    assert_eq!(seen, want);
}

/// The race a switch sets up: the cancel makes the proxy retry the call on
/// its destination at once, while the blocks are read only after the
/// cancel. Warned by `ExpectKv`, the destination holds the retried call
/// until `AdoptKv` and starts it from the blocks.
#[test]
fn a_retried_call_waits_for_its_expected_blocks_and_starts_from_them() {
    let mut r = Rig::new();
    let Moved {
        b,
        p,
        blob,
        c,
        tokens,
        ..
    } = Moved::new(&mut r);

    r.send(b, EngineReq::ExpectKv { exec: ExecId(5) });
    r.serve(b, c, 1, blob);
    let now = r.sim.now();
    r.sim.run_until(now + 200 * MILLIS).unwrap();
    assert!(r.calls().is_empty(), "held for its blocks");
    assert_eq!(r.stats(b).steps, 0);
    r.send(
        b,
        EngineReq::AdoptKv {
            exec: ExecId(5),
            tokens,
        },
    );
    r.sim.run().unwrap();
    assert_served_as_unmoved(&mut r, b, &p, c, (1, 0, 19, 1));
    assert!(r.shared.kv.is_empty(), "the blocks were taken");
}

/// A hand-over that never comes (its source died mid-switch) costs the
/// held call `KV_WAIT` once; then it is prefilled and served as usual.
#[test]
fn a_held_call_is_prefilled_when_its_blocks_do_not_come() {
    let mut r = Rig::new();
    let (b, _) = r.engine(EngineIx::Cell(1));
    let p = prompt((3..23).collect(), 16);
    let blob = r.put(&p);
    let c = call(5, 2);
    r.send(b, EngineReq::ExpectKv { exec: ExecId(5) });
    r.serve(b, c, 1, blob);
    let start = r.sim.now();
    r.sim.run_until(start + KV_WAIT - MILLIS).unwrap();
    assert!(r.calls().is_empty(), "held until the wait ends");
    r.sim.run().unwrap();
    assert_served_as_unmoved(&mut r, b, &p, c, (1, 1, 0, 20));
}

#[test]
fn set_weights_and_load_change_the_served_version() {
    let mut r = Rig::new();
    let (eng, handle) = r.engine(EngineIx::Cell(0));
    let p = prompt(vec![5, 6, 7, 8], 3);
    let blob = r.put(&p);
    r.shared.weights.publish(1, params(2, 1).encode().into());
    r.send(eng, EngineReq::SetWeights { version: 1 });
    r.serve(eng, call(0, 0), 0, blob);
    r.sim.run().unwrap();
    let got = r.calls();
    let (_, _, _, version, out) = done(&got[0]);
    assert_eq!(version, 1);
    let rec = r.record(out);
    assert_eq!(rec.policy_version, 1);
    assert_eq!(
        rec.output_ids,
        reference(&p, call(0, 0), &params(2, 1)).tokens
    );

    // Unload, the memory manager frees the rollout memory, then a load of
    // a version published meanwhile.
    let cell = r.cell;
    r.send(eng, EngineReq::Unload { reply_to: cell });
    r.sim.run().unwrap();
    lock(&handle)
        .release_memory(&[MemTag::Weights, MemTag::KvCache])
        .unwrap();
    r.serve(eng, call(0, 1), 0, blob);
    r.shared.weights.publish(2, params(3, 2).encode().into());
    r.send(
        eng,
        EngineReq::Load {
            version: 2,
            reply_to: cell,
        },
    );
    r.sim.run().unwrap();
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::Unloaded, EngineEvent::Loaded { version: 2 }]
    ));
    assert!(matches!(r.calls()[..], [CallEvent::Rejected { .. }]));
    r.serve(eng, call(0, 1), 1, blob);
    r.sim.run().unwrap();
    let got = r.calls();
    let (_, _, _, version, out) = done(&got[0]);
    assert_eq!(version, 2);
    assert_eq!(
        r.record(out).output_ids,
        reference(&p, call(0, 1), &params(3, 2)).tokens
    );
    let s = r.stats(eng);
    assert_eq!((s.weight_updates, s.violations, s.errors), (2, 0, 0));
    assert_eq!(r.worker(eng).version(), 2);
}

#[test]
fn bad_prompts_are_answered_empty_and_the_engine_keeps_serving() {
    let mut r = Rig::new();
    let (eng, _) = r.engine(EngineIx::Cell(0));
    let garbage = r.shared.blobs.put(vec![0xff; 7]);
    let outside = r.put(&prompt(vec![1, 100_000], 4));
    let too_long = r.put(&prompt(vec![1; 80], 4));
    let good = r.put(&prompt(vec![1, 2, 3], 2));
    r.serve(eng, call(0, 0), 0, garbage);
    r.serve(eng, call(1, 0), 0, BlobId(987_654));
    r.serve(eng, call(2, 0), 0, outside);
    r.serve(eng, call(3, 0), 0, too_long);
    r.serve(eng, call(4, 0), 0, good);
    r.sim.run().unwrap();
    let got = r.calls();
    assert_eq!(got.len(), 5);
    for ev in &got {
        let (c, _, n, _, out) = done(ev);
        let rec = r.record(out);
        assert_eq!(rec.execution, c.exec.0.to_string());
        if c.exec.0 == 4 {
            assert_eq!(n, 2);
            rec.validate().unwrap();
        } else {
            assert_eq!(n, 0, "{c:?}");
            assert!(rec.output_ids.is_empty());
        }
    }
    let s = r.stats(eng);
    assert_eq!((s.bad_prompts, s.served, s.errors), (4, 1, 0));
}

#[test]
fn with_a_tap_tokens_stream_as_sampled_and_a_retry_continues_after_them() {
    use super::tap::TokenTap;
    use super::tap::tests::RecordingTap;
    let mut r = Rig::new();
    let tap = Arc::new(RecordingTap::default());
    let tapped = |r: &mut Rig, ix| {
        let handle: EngineHandle = Arc::new(Mutex::new(new_engine()));
        let w = EngineWorker::new(ix, handle, r.shared.clone(), SEED).with_tap(tap.clone());
        r.sim.spawn(NodeId(1), w)
    };
    let a = tapped(&mut r, EngineIx::Cell(0));
    let b = tapped(&mut r, EngineIx::Pool);
    let p = prompt((3..23).collect(), 16);
    let blob = r.put(&p);
    let c = call(6, 0);
    r.serve(a, c, 1, blob);
    r.sim.run_until(5 * MILLIS).unwrap();
    // Tokens are out before the call is answered.
    let early = tap.resume(c).len();
    assert!(r.calls().is_empty());
    assert!(early > 0 && early < 16, "{early} tokens streamed");
    let cell = r.cell;
    r.send(a, EngineReq::StopAdmitting { reply_to: cell });
    r.send(a, EngineReq::CancelAll { reply_to: cell });
    r.sim.run().unwrap();
    assert!(matches!(
        r.calls()[..],
        [CallEvent::Cancelled { attempt: 1, .. }]
    ));
    let k = tap.resume(c).len();
    assert!(k >= early && k < 16);
    // The proxy's retry on the pool continues after the k tokens.
    r.serve(b, c, 2, blob);
    r.sim.run().unwrap();
    let got = r.calls();
    let (gc, attempt, n, _, out) = done(&got[0]);
    assert_eq!((gc, attempt, n), (c, 2, 16));
    assert_eq!(out, BlobId::NONE, "the tap's owner records the call");
    let streamed = lock(&tap.calls).get(&c).cloned().unwrap();
    assert_eq!(streamed.len(), 16, "one output across both engines");
    assert!(streamed[..k].iter().all(|t| t.2 == EngineIx::Cell(0)));
    assert!(streamed[k..].iter().all(|t| t.2 == EngineIx::Pool));
    // The first engine's tokens are what it alone would have sampled.
    let want = reference(&p, c, &params(1, 0));
    let ids: Vec<u32> = streamed.iter().map(|t| t.0).collect();
    assert_eq!(ids[..k], want.tokens[..k]);
    // The pool prefilled the prompt and the k tokens, then decoded the rest.
    let s = r.stats(b);
    assert_eq!(
        (s.prefilled_tokens, s.output_tokens),
        (20 + k as u64, 16 - k as u64)
    );
}
