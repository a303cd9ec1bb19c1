//! The adapter under the simulator against an in-process `gyre serve`
//! (the real HTTP server, tiny model), with probes as the proxy and the
//! cell: served calls record exactly what the embedded engine samples
//! under the same weights and seed; publications reach the server by
//! version; cancel, unload and load go through; KV pins fall back to
//! recompute, counted; a dead or hung server answers calls `Rejected`.

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::trajectory::TitoRecord;
use gyre_gpu::engine::{Engine, EngineConfig};
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_runtime::sim::{IoModel, Latency, Sim, SimConfig};
use gyre_runtime::{
    ActorId, Addr, BlobId, MILLIS, MemBlobs, NodeId, Recipient, get_decoded, put_encoded,
};

use super::{AdapterConfig, SglangEngine};
use crate::backends::sglang::client::Health;
use crate::backends::sglang::{ClientConfig, SglangClient};
use crate::cli::serve::InProcess;
use crate::cli::serve::model::ServeConfig;
use crate::embedded::engine::{call_seed, request};
use crate::embedded::shared::Shared;

const TESTER: ActorId = ActorId::new(9, 1);
const SEED: u64 = 41;

fn params(version: u64) -> ParamBuffer {
    let mut p = ParamBuffer::init(&ModelConfig::tiny(), 3 + version).unwrap();
    p.version = version;
    p
}

/// A tiny-model server whose own fresh weights differ from the board's.
fn server() -> InProcess {
    InProcess::start(&ServeConfig {
        gyre_model: Some(ModelConfig::tiny()),
        seed: 1234,
        max_running: Some(4),
        ..ServeConfig::default()
    })
    .unwrap()
}

fn client(url: &str, timeout: Duration) -> SglangClient {
    SglangClient::new(
        url,
        ClientConfig {
            timeout,
            connect_timeout: Duration::from_secs(2),
        },
    )
    .unwrap()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

struct Rig {
    sim: Sim,
    shared: Shared,
    proxy: Recipient<CallEvent>,
    cell: Recipient<EngineEvent>,
    engine: Addr<SglangEngine>,
}

impl Rig {
    fn new(url: &str, cfg: AdapterConfig, timeout: Duration) -> Self {
        let shared = Shared::new(ModelConfig::tiny(), MemBlobs::shared());
        shared.weights.publish(0, params(0).encode().into());
        let mut sc = SimConfig::new(4);
        sc.codec_roundtrip = true;
        // A generation's answer arrives 10 ms (virtual) after it is sent.
        sc.io = IoModel::default().with_kind("sglang.generate", Latency::Const(10 * MILLIS), 0.0);
        let mut sim = Sim::new(sc);
        let proxy = sim.probe::<CallEvent>(NodeId(2)).into();
        let cell = sim.probe::<EngineEvent>(NodeId(2)).into();
        let adapter = SglangEngine::new(
            EngineIx::Cell(0),
            client(url, timeout),
            cfg,
            shared.clone(),
            SEED,
        );
        let engine = sim.spawn(NodeId(1), adapter);
        Rig {
            sim,
            shared,
            proxy,
            cell,
            engine,
        }
    }

    fn on(s: &InProcess) -> Self {
        Self::new(&s.url, AdapterConfig::default(), Duration::from_secs(60))
    }

    fn adapter(&self) -> &SglangEngine {
        self.sim.actor(self.engine).unwrap()
    }

    fn serve(&mut self, call: CallId, attempt: u32, p: &Prompt) {
        let prompt = put_encoded(&*self.shared.blobs, p).unwrap();
        let req = EngineReq::Serve {
            call,
            attempt,
            prompt_tokens: p.input_ids.len() as u64,
            prompt,
            reply_to: self.proxy,
        };
        self.sim.inject(TESTER, self.engine, req);
    }

    fn send(&mut self, req: EngineReq) {
        self.sim.inject(TESTER, self.engine, req);
    }

    fn calls(&mut self) -> Vec<CallEvent> {
        self.sim.run().unwrap();
        self.sim
            .take_probe::<CallEvent>(Addr::new(self.proxy.id()))
            .into_iter()
            .map(|r| r.msg)
            .collect()
    }

    fn cell_events(&mut self) -> Vec<EngineEvent> {
        self.sim.run().unwrap();
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

fn done(ev: &CallEvent) -> (CallId, u64, BlobId) {
    match ev {
        CallEvent::Done {
            call,
            version,
            output,
            ..
        } => (*call, *version, *output),
        other => panic!("expected Done, got {other:?}"),
    }
}

#[test]
fn served_calls_record_what_the_embedded_engine_samples_and_follow_publications() {
    let s = server();
    let mut r = Rig::on(&s);
    let p = prompt((1..12).collect(), 8);
    let c = call(3, 1);
    r.serve(c, 0, &p);
    let got = r.calls();
    assert_eq!(got.len(), 1, "{got:?}");
    let (gc, version, out) = done(&got[0]);
    assert_eq!((gc, version), (c, 0));
    let rec = r.record(out);
    rec.validate().unwrap();
    // The start-up sync pushed the board's weights: the server samples
    // what an engine on those weights samples, token and log-prob.
    let mut e = Engine::new(EngineConfig::for_model(ModelConfig::tiny(), 4), &params(0)).unwrap();
    let want = e.generate(request(&p, call_seed(SEED, c))).unwrap();
    assert_eq!(rec.output_ids, want.tokens);
    assert!(
        rec.output_logprobs
            .iter()
            .zip(&want.logprobs)
            .all(|(a, b)| (a - b).abs() < 1e-5),
        "{:?} vs {:?}",
        rec.output_logprobs,
        want.logprobs
    );
    assert_eq!(
        (rec.engine.as_deref(), rec.policy_version),
        (Some("cell0"), 0)
    );

    // A publication reaches the server by version.
    r.shared.weights.publish(1, params(1).encode().into());
    r.send(EngineReq::SetWeights { version: 1 });
    r.serve(call(3, 2), 0, &p);
    let got = r.calls();
    let (_, version, out) = done(&got[0]);
    assert_eq!(version, 1);
    let mut e1 = Engine::new(EngineConfig::for_model(ModelConfig::tiny(), 4), &params(1)).unwrap();
    let want1 = e1
        .generate(request(&p, call_seed(SEED, call(3, 2))))
        .unwrap();
    assert_eq!(r.record(out).output_ids, want1.tokens);
    assert_eq!(
        block_on(client(&s.url, Duration::from_secs(5)).get_weight_version()).unwrap(),
        "1"
    );
    let st = r.adapter().stats();
    assert_eq!((st.served, st.weight_updates, st.errors), (2, 1, 0));
    assert_eq!(r.adapter().version(), 1);
}

#[test]
fn a_role_change_stops_cancels_unloads_and_loads_through_the_server() {
    let s = server();
    let mut r = Rig::on(&s);
    let cell = r.cell;
    r.send(EngineReq::StopAdmitting { reply_to: cell });
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::AdmissionStopped]
    ));
    r.serve(call(1, 1), 0, &prompt(vec![5, 6, 7], 4));
    assert!(matches!(r.calls()[..], [CallEvent::Rejected { .. }]));

    // No KV export in SGLang's API: nothing pinned, the fallback counted.
    r.send(EngineReq::PinKv {
        execs: vec![ExecId(1), ExecId(2)],
        reply_to: cell,
    });
    match &r.cell_events()[..] {
        [EngineEvent::KvPinned { blocks }] => assert!(blocks.is_empty()),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.adapter().stats().kv_recomputed, 2);
    r.send(EngineReq::CancelAll { reply_to: cell });
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::CancelComplete { cancelled: 0 }]
    ));

    r.send(EngineReq::Unload { reply_to: cell });
    assert!(matches!(r.cell_events()[..], [EngineEvent::Unloaded]));
    let c = client(&s.url, Duration::from_secs(5));
    assert!(matches!(
        block_on(c.health()).unwrap(),
        Health::NotServing { .. }
    ));

    // A version published while unloaded is loaded with the memory.
    r.shared.weights.publish(2, params(2).encode().into());
    r.send(EngineReq::SetWeights { version: 2 });
    r.send(EngineReq::Load {
        version: 1,
        reply_to: cell,
    });
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::Loaded { version: 2 }]
    ));
    assert_eq!(block_on(c.health()).unwrap(), Health::Serving);
    assert_eq!(block_on(c.get_weight_version()).unwrap(), "2");
    r.serve(call(1, 2), 0, &prompt(vec![5, 6, 7], 4));
    let got = r.calls();
    assert_eq!(done(&got[0]).1, 2);
    assert_eq!(r.adapter().stats().errors, 0);
}

#[test]
fn calls_in_flight_at_a_cancel_are_cancelled_and_aborted_by_rid() {
    let s = server();
    let mut r = Rig::on(&s);
    let cell = r.cell;
    r.sim.run().unwrap(); // the start-up sync
    // The cancel is delivered after the calls went to the server and
    // before their answers: they are answered Cancelled, their rids
    // aborted, their late answers dropped.
    r.serve(call(4, 1), 0, &prompt(vec![9; 6], 6));
    r.serve(call(5, 1), 3, &prompt(vec![8; 6], 6));
    let soon = r.sim.now() + MILLIS;
    r.sim.run_until(soon).unwrap();
    assert_eq!(r.adapter().in_flight(), 2);
    r.send(EngineReq::CancelAll { reply_to: cell });
    let calls = r.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls
            .iter()
            .all(|c| matches!(c, CallEvent::Cancelled { .. }))
    );
    assert!(matches!(
        r.cell_events()[..],
        [EngineEvent::CancelComplete { cancelled: 2 }]
    ));
    let a = r.adapter();
    assert_eq!(
        (a.stats().cancelled, a.http_stats().aborts, a.in_flight()),
        (2, 2, 0)
    );
}

#[test]
fn a_dead_server_and_a_hung_one_answer_calls_rejected() {
    // Killed after start-up: calls fail to connect and are rejected.
    let s = server();
    let mut r = Rig::on(&s);
    r.sim.run().unwrap();
    drop(s);
    r.serve(call(1, 1), 0, &prompt(vec![1, 2, 3], 4));
    assert!(matches!(r.calls()[..], [CallEvent::Rejected { .. }]));
    let a = r.adapter();
    assert_eq!((a.stats().rejected, a.http_stats().failures), (1, 1));

    // A server that accepts and never answers: start-up times out, and
    // calls are refused until a load succeeds.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    let keep = std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in hung.incoming().take(8) {
            let Ok(mut conn) = conn else { break };
            let mut buf = [0u8; 512];
            let _ = conn.read(&mut buf);
            held.push(conn);
        }
    });
    let cfg = AdapterConfig {
        startup: Duration::from_millis(300),
        ..AdapterConfig::default()
    };
    let mut r = Rig::new(&url, cfg, Duration::from_millis(200));
    r.serve(call(2, 1), 0, &prompt(vec![1, 2, 3], 4));
    assert!(matches!(r.calls()[..], [CallEvent::Rejected { .. }]));
    let a = r.adapter();
    assert!(a.http_stats().timeouts >= 1, "{:?}", a.http_stats());
    assert!(!a.is_serving());
    drop(keep);
}

#[test]
fn a_prompt_the_server_refuses_is_answered_empty() {
    let s = server();
    let mut r = Rig::on(&s);
    // Token 100000 is outside the tiny vocabulary: a 400, which no retry fixes.
    r.serve(call(6, 1), 0, &prompt(vec![1, 100_000], 4));
    let got = r.calls();
    let (_, _, out) = done(&got[0]);
    assert!(r.record(out).output_ids.is_empty());
    let a = r.adapter();
    assert_eq!((a.stats().bad_prompts, a.http_stats().refused), (1, 1));
}
