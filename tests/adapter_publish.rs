//! The SGLang adapter's two ways of publishing weights, against real
//! `gyre serve` processes: Gyre's flat buffer by
//! `/update_weights_from_tensor`, and a checkpoint directory written on a
//! shared path and loaded by `/update_weights_from_disk` (how a real
//! SGLang server takes new weights). For Gyre's tiny model and a tiny
//! Qwen3-shaped Hugging Face checkpoint, in both modes, the adapter (under
//! the simulator, as in `gyre train`) pushes version 0 at start-up, then a
//! publication of version 1: the next call reports `weight_version` 1 and
//! samples exactly what the in-process engine samples with those weights.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Serve, tiny_qwen3};
use gyre::backends::sglang::adapter::{AdapterConfig, DiskPublish, Publish, SglangEngine};
use gyre::backends::sglang::{ClientConfig, SglangClient};
use gyre::embedded::engine::{call_seed, request};
use gyre::embedded::shared::Shared;
use gyre_actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre_actors::sched::proto::engine::{CallEvent, EngineReq};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::trajectory::TitoRecord;
use gyre_gpu::engine::{Engine, EngineConfig};
use gyre_gpu::model::hf;
use gyre_gpu::model::{Arch, ModelConfig, ParamBuffer};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, MemBlobs, NodeId, get_decoded, put_encoded};

const TESTER: ActorId = ActorId::new(9, 1);
const SEED: u64 = 17;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-publish-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn weights(model: &ModelConfig, version: u64) -> ParamBuffer {
    let mut p = ParamBuffer::init(model, 100 + version).unwrap();
    p.version = version;
    p
}

/// A `gyre serve` process for `model` with fresh weights of its own
/// (seed 99, neither version the adapter publishes).
fn server(dir: &Path, model: &ModelConfig) -> Serve {
    let toml = dir.join("serve.toml");
    let body = match &model.arch {
        Arch::Gyre => format!(
            "seed = 99\nmax_running = 4\ngyre_model = {{ vocab = {}, layers = {}, heads = {}, width = {}, ffn = {}, context = {} }}\n",
            model.vocab, model.layers, model.heads, model.width, model.ffn, model.context
        ),
        Arch::Decoder(_) => {
            let mut cfg = tiny_qwen3();
            cfg.model = model.clone();
            hf::save(
                &dir.join("ckpt"),
                &cfg,
                &ParamBuffer::init(model, 99).unwrap(),
                1,
            )
            .unwrap();
            "checkpoint = \"ckpt\"\nmax_running = 4\n".to_string()
        }
    };
    std::fs::write(&toml, body).unwrap();
    Serve::start(&toml)
}

fn prompt() -> Prompt {
    Prompt::main_turn((10..22).collect(), 8)
}

/// Serves one call through the adapter and returns its record.
fn serve(sim: &mut Sim, shared: &Shared, engine: Addr<SglangEngine>, seq: u32) -> TitoRecord {
    let proxy = sim.probe::<CallEvent>(NodeId(2));
    let p = prompt();
    let req = EngineReq::Serve {
        call: call(seq),
        attempt: 1,
        prompt_tokens: p.input_ids.len() as u64,
        prompt: put_encoded(&*shared.blobs, &p).unwrap(),
        reply_to: proxy.into(),
    };
    sim.inject(TESTER, engine, req);
    sim.run().unwrap();
    let got: Vec<CallEvent> = sim.take_probe(proxy).into_iter().map(|r| r.msg).collect();
    match &got[..] {
        [CallEvent::Done { output, .. }] => get_decoded(&*shared.blobs, *output).unwrap(),
        other => panic!("expected one Done, got {other:?}"),
    }
}

fn call(seq: u32) -> CallId {
    CallId {
        exec: ExecId(4),
        seq,
    }
}

fn check_publication(tag: &str, model: ModelConfig, disk: bool) {
    let dir = temp_dir(tag);
    let s = server(&dir, &model);
    let published = dir.join("published");
    let publish = if disk {
        Publish::Disk(DiskPublish {
            dir: published.clone(),
            model: model.clone(),
        })
    } else {
        Publish::Tensor
    };
    let shared = Shared::new(model.clone(), MemBlobs::shared());
    shared
        .weights
        .publish(0, weights(&model, 0).encode().into());
    let client = SglangClient::new(
        &s.url,
        ClientConfig {
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
        },
    )
    .unwrap();
    let cfg = AdapterConfig {
        publish,
        ..AdapterConfig::default()
    };
    let adapter = SglangEngine::new(EngineIx::Cell(0), client, cfg, shared.clone(), SEED);
    let mut sim = Sim::new(SimConfig::new(3));
    let engine = sim.spawn(NodeId(1), adapter);

    for version in [0u64, 1] {
        if version > 0 {
            shared
                .weights
                .publish(version, weights(&model, version).encode().into());
            sim.inject(TESTER, engine, EngineReq::SetWeights { version });
        }
        let seq = version as u32 + 1;
        let rec = serve(&mut sim, &shared, engine, seq);
        assert_eq!(
            rec.policy_version, version,
            "{tag}: the server's weight_version"
        );
        let local_cfg = EngineConfig::for_model(model.clone(), 4);
        let mut local = Engine::new(local_cfg, &weights(&model, version)).unwrap();
        let want = local
            .generate(request(&prompt(), call_seed(SEED, call(seq))))
            .unwrap();
        assert_eq!(
            rec.output_ids, want.tokens,
            "{tag}: version {version}'s tokens"
        );
        for (a, b) in rec.output_logprobs.iter().zip(&want.logprobs) {
            assert!((a - b).abs() < 1e-5, "{tag}: log-probs {a} vs {b}");
        }
    }
    let st = sim.actor(engine).unwrap().stats();
    assert_eq!(
        (st.served, st.weight_updates, st.errors),
        (2, 1, 0),
        "{tag}"
    );
    if disk {
        // Only the version the server serves is left on disk, whole.
        let published = published.join("cell0");
        let names: Vec<String> = std::fs::read_dir(&published)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["v00000001"], "{tag}");
        let v1 = published.join("v00000001");
        match &model.arch {
            Arch::Decoder(_) => {
                let ck = hf::load(&v1, &hf::LoadOptions::default()).unwrap();
                assert_eq!(ck.config.model, model);
                assert_eq!(ck.params.data, weights(&model, 1).data);
            }
            Arch::Gyre => assert!(v1.join("model.safetensors").is_file()),
        }
    } else {
        assert!(!published.exists(), "{tag}: tensor mode writes nothing");
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tiny_gyre() -> ModelConfig {
    ModelConfig {
        context: 64,
        ..ModelConfig::tiny()
    }
}

#[test]
fn gyre_model_published_by_tensor() {
    check_publication("gyre-tensor", tiny_gyre(), false);
}

#[test]
fn gyre_model_published_by_disk() {
    check_publication("gyre-disk", tiny_gyre(), true);
}

#[test]
fn qwen3_checkpoint_published_by_tensor() {
    check_publication("qwen3-tensor", tiny_qwen3().model, false);
}

#[test]
fn qwen3_checkpoint_published_by_disk_as_a_hugging_face_directory() {
    check_publication("qwen3-disk", tiny_qwen3().model, true);
}
