//! What the SGLang client, and the SGLang adapter of the scheduling plane,
//! add per call over a plain HTTP POST to the same `gyre serve` process:
//! each sends the same one-token `/generate` to a tiny model; the
//! difference of the means is the client's own cost (request building,
//! response parsing into a `Generation`), and the adapter's (an engine
//! protocol `Serve` through the actor under the simulator: the prompt read
//! from the payload store, the HTTP call as an I/O request on the
//! adapter's runtime, the TITO record written, `Done` delivered). Prints
//! figures.
//!
//! `cargo bench -p gyre --bench sglang_overhead`

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gyre::actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre::actors::sched::proto::engine::{CallEvent, EngineReq};
use gyre::actors::sched::proto::payload::Prompt;
use gyre::actors::trajectory::CallPurpose;
use gyre::backends::sglang::adapter::{AdapterConfig, SglangEngine};
use gyre::backends::sglang::{ClientConfig, GenerateRequest, Sampling, SglangClient};
use gyre::embedded::shared::Shared;
use gyre::gpu::model::{ModelConfig, ParamBuffer};
use gyre::runtime::sim::{Sim, SimConfig};
use gyre::runtime::{ActorId, Addr, MemBlobs, NodeId, put_encoded};

/// The adapter under the simulator, answering `Serve`s one at a time.
struct AdapterRig {
    sim: Sim,
    engine: Addr<SglangEngine>,
    proxy: Addr<gyre::runtime::External<CallEvent>>,
    shared: Shared,
    prompt: gyre::runtime::BlobId,
    seq: u32,
}

impl AdapterRig {
    fn new(url: &str) -> Self {
        let model = ModelConfig {
            context: 64,
            ..ModelConfig::tiny()
        };
        let shared = Shared::new(model.clone(), MemBlobs::shared());
        let params = ParamBuffer::init(&model, 1).expect("params");
        shared.weights.publish(0, params.encode().into());
        let mut sim = Sim::new(SimConfig::new(1));
        let client = SglangClient::new(url, ClientConfig::default()).expect("client");
        let adapter = SglangEngine::new(
            EngineIx::Pool,
            client,
            AdapterConfig::default(),
            shared.clone(),
            1,
        );
        let engine = sim.spawn(NodeId(1), adapter);
        let proxy = sim.probe::<CallEvent>(NodeId(2));
        sim.run().expect("start-up sync");
        let prompt = put_encoded(
            &*shared.blobs,
            &Prompt {
                input_ids: vec![1, 2, 3, 4],
                message_ends: vec![4],
                max_new_tokens: 1,
                stop_tokens: Vec::new(),
                temperature: 1.0,
                top_p: 1.0,
                thread: None,
                parent_call: None,
                role: None,
                purpose: CallPurpose::Policy,
            },
        )
        .expect("prompt");
        Self {
            sim,
            engine,
            proxy,
            shared,
            prompt,
            seq: 0,
        }
    }

    fn call(&mut self) {
        self.seq += 1;
        let req = EngineReq::Serve {
            call: CallId {
                exec: ExecId(1),
                seq: self.seq,
            },
            attempt: 0,
            prompt_tokens: 4,
            prompt: self.prompt,
            reply_to: self.proxy.into(),
        };
        self.sim.inject(ActorId::new(9, 1), self.engine, req);
        self.sim.run().expect("served");
        for r in self.sim.take_probe(self.proxy) {
            match r.msg {
                CallEvent::Done { output, .. } => {
                    self.shared.blobs.release(output);
                }
                other => panic!("the adapter answered {other:?}"),
            }
        }
    }
}

const CALLS: usize = 300;

fn main() {
    let dir = std::env::temp_dir().join(format!("gyre-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        "gyre_model = { vocab = 264, layers = 2, heads = 2, width = 32, ffn = 64, context = 64 }\n",
    )
    .expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["serve", "--listen", "127.0.0.1:0", "--model"])
        .arg(&cfg)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("gyre serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("address line");
    let url = format!(
        "http://{}",
        line.trim().trim_start_matches("gyre serve listening on ")
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut adapter = AdapterRig::new(&url);
    rt.block_on(async {
        let client = SglangClient::new(&url, ClientConfig::default()).expect("client");
        client
            .wait_serving(Duration::from_secs(30))
            .await
            .expect("serving");
        let req = GenerateRequest {
            input_ids: Some(vec![1, 2, 3, 4]),
            sampling_params: Sampling {
                max_new_tokens: Some(1),
                seed: Some(1),
                ..Sampling::default()
            },
            return_logprob: true,
            ..GenerateRequest::default()
        };
        let body = serde_json::to_string(&req).expect("body");
        let http = reqwest::Client::new();
        let direct = || async {
            let r = http
                .post(format!("{url}/generate"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("post");
            r.bytes().await.expect("body")
        };
        let via_client = || async { client.generate(&req).await.expect("generate") };
        // Warm every path, then alternate rounds so drift hits each.
        for _ in 0..20 {
            direct().await;
            via_client().await;
            tokio::task::block_in_place(|| adapter.call());
        }
        let (mut t_direct, mut t_client, mut t_adapter) =
            (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..CALLS {
            let t = Instant::now();
            direct().await;
            t_direct += t.elapsed();
            let t = Instant::now();
            via_client().await;
            t_client += t.elapsed();
            let t = Instant::now();
            tokio::task::block_in_place(|| adapter.call());
            t_adapter += t.elapsed();
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / CALLS as f64;
        println!("gyre serve, tiny model, one-token /generate, {CALLS} calls each:");
        println!("  direct HTTP POST      {:8.1} µs/call", per(t_direct));
        println!("  SglangClient.generate {:8.1} µs/call", per(t_client));
        println!("  SGLang adapter Serve  {:8.1} µs/call", per(t_adapter));
        println!(
            "  client overhead       {:8.1} µs/call",
            per(t_client) - per(t_direct)
        );
        println!(
            "  adapter overhead      {:8.1} µs/call",
            per(t_adapter) - per(t_direct)
        );
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
