//! Hugging Face checkpoints of the Qwen3 and Llama families, tiny and
//! randomly initialised by the test helper (no download): loaded back and
//! checked against an independent f64 reference, served by the paged
//! engine (batched equals unbatched, KV export/import continues exactly),
//! trained by the trainer (teacher forcing equals the engine's log-probs,
//! a supervised step lowers the loss), saved bit-exact, and refused when
//! broken, naming what is wrong.

mod common;

use common::{Reference, Shape, TempDir, Tiny, Write, write_tiny};
use gyre_gpu::engine::{Engine, EngineConfig, KvSnapshot, Request, SamplingParams};
use gyre_gpu::model::hf::{self, HfCheckpoint, LoadOptions};
use gyre_gpu::model::{Family, ParamBuffer, ParamLayout};
use gyre_gpu::trainer::{Loss, MicroStep, OptimConfig, TrainRow, Trainer};

const SHAPES: [Shape; 2] = [Shape::Qwen3, Shape::Llama];

fn written(shape: Shape, w: &Write) -> (TempDir, Tiny, common::Tensors) {
    let dir = TempDir::new(&format!("{shape:?}"));
    let t = Tiny::new(shape);
    let tensors = write_tiny(&dir.0, &t, 42 + shape as u64, w);
    (dir, t, tensors)
}

fn load(dir: &TempDir) -> HfCheckpoint {
    hf::load(&dir.0, &LoadOptions::default()).unwrap()
}

/// Small blocks, so requests span several of them.
fn engine_with(ck: &HfCheckpoint, running: usize, batch_tokens: usize) -> Engine {
    let mut cfg = EngineConfig::for_model(ck.config.model.clone(), running);
    cfg.block_size = 4;
    cfg.kv_blocks = running * ck.config.model.context.div_ceil(4);
    cfg.max_batch_tokens = batch_tokens;
    Engine::new(cfg, &ck.params).unwrap()
}

fn engine(ck: &HfCheckpoint, running: usize) -> Engine {
    engine_with(ck, running, 256)
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 3) % 250 + 10)
        .collect()
}

fn req(prompt: Vec<u32>, max_new: u32, seed: u64) -> Request {
    Request {
        prompt,
        params: SamplingParams {
            max_new_tokens: max_new,
            seed,
            ..Default::default()
        },
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Rows whose targets are the output tokens, behaviour log-probs recorded.
fn row(prompt: &[u32], out: &[u32], lp: &[f32]) -> TrainRow {
    let p = prompt.len();
    let mut ids = prompt.to_vec();
    ids.extend(out);
    let n = ids.len();
    let mut b = vec![0.0; p];
    b.extend(lp);
    TrainRow {
        execution: 0,
        target: (0..n).map(|u| u >= p).collect(),
        behaviour_logprobs: b,
        coefficients: (0..n).map(|u| if u >= p { 1.0 } else { 0.0 }).collect(),
        advantage: 0.0,
        input_ids: ids,
    }
}

#[test]
fn the_checkpoint_reads_with_its_family_template_and_stop_tokens() {
    for shape in SHAPES {
        let (dir, t, _) = written(shape, &Write::default());
        let ck = load(&dir);
        let d = ck.config.model.decoder().unwrap();
        let fam = if shape == Shape::Qwen3 {
            Family::Qwen3
        } else {
            Family::Llama
        };
        assert_eq!(d.family, fam);
        assert_eq!(d.tie_embeddings, t.tied);
        assert_eq!(ck.config.model.kv_width(), t.kv_heads * t.head_dim);
        assert_eq!(ck.eos_token_ids, vec![t.eos, t.eos + 1]);
        assert!(ck.chat_template.as_deref().unwrap().contains("m.role"));
        assert_eq!(ck.params.version, 0);
    }
}

#[test]
fn logits_match_the_reference_forward() {
    for shape in SHAPES {
        let (dir, t, tensors) = written(shape, &Write::default());
        let ck = load(&dir);
        let ids = prompt(13, 1);
        let reference = Reference { t: &t, w: &tensors }.logprobs(&ids);
        // The engine: prefill, then the next-token distribution.
        let mut e = engine(&ck, 2);
        let id = e.submit(req(ids.clone(), 4, 1)).unwrap();
        let got = e.next_token_logprobs(id).unwrap();
        let want: Vec<f32> = reference[ids.len() - 1].iter().map(|&x| x as f32).collect();
        let d = max_diff(&got, &want);
        assert!(d < 1e-4, "{shape:?}: engine vs reference {d}");
        // The trainer: teacher-forced log-probs of every next token.
        let mut tr = Trainer::new(&ck.config.model, &ck.params).unwrap();
        let r = row(&ids[..1], &ids[1..], &vec![0.0; ids.len() - 1]);
        let lp = tr
            .token_logprobs(
                std::slice::from_ref(&r),
                &MicroStep::whole(std::slice::from_ref(&r)),
            )
            .unwrap();
        let want: Vec<f32> = (1..ids.len())
            .map(|u| reference[u - 1][ids[u] as usize] as f32)
            .collect();
        let d = max_diff(&lp, &want);
        assert!(d < 1e-4, "{shape:?}: trainer vs reference {d}");
    }
}

#[test]
fn bf16_single_file_checkpoints_widen_exactly() {
    let (dir, t, tensors) = written(
        Shape::Llama,
        &Write {
            shards: None,
            bf16: true,
            ..Write::default()
        },
    );
    let ck = load(&dir);
    let layout = ParamLayout::new(&ck.config.model).unwrap();
    for s in &layout.specs {
        let got = &ck.params.data[s.offset..s.offset + s.len];
        assert_eq!(got, tensors[&s.name].1.as_slice(), "{}", s.name);
    }
    let ids = prompt(6, 2);
    let reference = Reference { t: &t, w: &tensors }.logprobs(&ids);
    let mut e = engine(&ck, 1);
    let id = e.submit(req(ids.clone(), 2, 1)).unwrap();
    let got = e.next_token_logprobs(id).unwrap();
    let want: Vec<f32> = reference[5].iter().map(|&x| x as f32).collect();
    assert!(max_diff(&got, &want) < 1e-4);
}

#[test]
fn batched_paged_decoding_equals_unbatched() {
    for shape in SHAPES {
        let (dir, _, _) = written(shape, &Write::default());
        let ck = load(&dir);
        let alone = engine(&ck, 1).generate(req(prompt(9, 3), 10, 5)).unwrap();
        assert_eq!(alone.tokens.len(), 10);
        // Prompts chunked into 7-token iterations among five others.
        let mut e = engine_with(&ck, 6, 7);
        let mut ids = Vec::new();
        for i in 0..6u32 {
            let r = if i == 2 {
                req(prompt(9, 3), 10, 5)
            } else {
                req(prompt(5 + i as usize, 10 + i), 4 + i, u64::from(i))
            };
            ids.push(e.submit(r).unwrap());
        }
        let done = e.run_until_idle().unwrap();
        let c = done.iter().find(|c| c.id == ids[2]).unwrap();
        assert_eq!(c.tokens, alone.tokens, "{shape:?}");
        assert!(max_diff(&c.logprobs, &alone.logprobs) < 1e-5, "{shape:?}");
        assert_eq!(e.load().kv_blocks_used, 0);
    }
}

#[test]
fn teacher_forced_trainer_logprobs_equal_engine_logprobs() {
    for shape in SHAPES {
        let (dir, _, _) = written(shape, &Write::default());
        let ck = load(&dir);
        let mut e = engine(&ck, 4);
        let mut tr = Trainer::new(&ck.config.model, &ck.params).unwrap();
        for i in 0..3u32 {
            let p = prompt(4 + 3 * i as usize, i);
            let c = e.generate(req(p.clone(), 12, u64::from(i) + 7)).unwrap();
            let r = row(&p, &c.tokens, &c.logprobs);
            let rows = std::slice::from_ref(&r);
            let lp = tr.token_logprobs(rows, &MicroStep::whole(rows)).unwrap();
            let d = max_diff(&lp, &c.logprobs);
            assert!(d < 1e-4, "{shape:?} request {i}: {d}");
        }
    }
}

#[test]
fn kv_export_import_continues_with_the_same_distribution() {
    for shape in SHAPES {
        let (dir, _, _) = written(shape, &Write::default());
        let ck = load(&dir);
        let p = prompt(7, 4);
        let reference = engine(&ck, 1).generate(req(p.clone(), 12, 3)).unwrap();
        let mut src = engine(&ck, 2);
        let id = src.submit(req(p.clone(), 12, 3)).unwrap();
        for _ in 0..6 {
            src.step().unwrap();
        }
        let expected = src.next_token_logprobs(id).unwrap();
        let pin = src.pin_kv(id).unwrap();
        let partial = src.abort(id).unwrap();
        let snap = KvSnapshot::decode(&src.export_pinned(pin).unwrap().encode()).unwrap();
        assert_eq!(snap.width, ck.config.model.kv_width());
        let mut dst = engine(&ck, 2);
        let mut cont = partial.prompt.clone();
        cont.extend(&partial.tokens);
        let done = partial.tokens.len();
        let did = dst
            .submit_with_kv(req(cont, 12 - done as u32, 3), snap)
            .unwrap();
        let got = dst.next_token_logprobs(did).unwrap();
        assert!(max_diff(&got, &expected) < 1e-5, "{shape:?}");
        let rest = dst.run_until_idle().unwrap().pop().unwrap();
        assert_eq!(rest.tokens, reference.tokens[done..].to_vec(), "{shape:?}");
        src.release_pin(pin).unwrap();
    }
}

#[test]
fn safetensors_round_trip_is_bit_exact() {
    for shape in SHAPES {
        let (dir, _, tensors) = written(shape, &Write::default());
        let mut ck = load(&dir);
        let layout = ParamLayout::new(&ck.config.model).unwrap();
        for s in &layout.specs {
            let got = &ck.params.data[s.offset..s.offset + s.len];
            assert_eq!(got, tensors[&s.name].1.as_slice(), "{}", s.name);
        }
        ck.params.version = 17;
        for shards in [1, 3] {
            let out = TempDir::new("save");
            hf::save(&out.0, &ck.config, &ck.params, shards).unwrap();
            let back = load(&out);
            assert_eq!(back.config.model, ck.config.model);
            assert_eq!(back.params.version, 17);
            let bits = |p: &ParamBuffer| p.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&back.params),
                bits(&ck.params),
                "{shape:?} {shards} shards"
            );
        }
        // The publication buffer round-trips too, and an engine takes it.
        let buf = ParamBuffer::decode(&ck.params.encode()).unwrap();
        assert_eq!(buf, ck.params);
        let mut e = engine(&load(&dir), 1);
        e.update_weights(&buf).unwrap();
        assert_eq!(e.version(), 17);
    }
}

#[test]
fn a_supervised_step_lowers_the_loss() {
    for shape in SHAPES {
        let (dir, _, _) = written(shape, &Write::default());
        let ck = load(&dir);
        let optim = OptimConfig {
            lr: 1e-2,
            ..Default::default()
        };
        let mut core = Trainer::core(&ck.config.model, &ck.params, optim).unwrap();
        let rows: Vec<TrainRow> = (0..2)
            .map(|i| {
                let ids = prompt(10, 20 + i);
                row(&ids[..1], &ids[1..], &[0.0; 9])
            })
            .collect();
        let step = MicroStep::whole(&rows);
        let mut losses = Vec::new();
        for _ in 0..4 {
            core.accumulate(&rows, &step, &Loss::Supervised, None)
                .unwrap();
            let g = core.export_grads().unwrap();
            losses.push(core.apply(&g).unwrap().loss);
        }
        assert!(
            losses.windows(2).all(|w| w[1] < w[0]),
            "{shape:?}: {losses:?}"
        );
        // The trained weights publish to an engine as the flat buffer.
        let mut e = engine(&ck, 1);
        e.update_weights(&core.params().unwrap()).unwrap();
        assert_eq!(e.version(), 4);
    }
}

#[test]
fn broken_checkpoints_are_refused_naming_the_problem() {
    let missing = "model.layers.1.mlp.up_proj.weight".to_string();
    let (dir, _, _) = written(
        Shape::Qwen3,
        &Write {
            skip: vec![missing.clone()],
            ..Write::default()
        },
    );
    let e = hf::load(&dir.0, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&missing), "{e}");
    let shaped = "model.layers.0.self_attn.k_proj.weight".to_string();
    let (dir, _, _) = written(
        Shape::Llama,
        &Write {
            misshape: vec![shaped.clone()],
            ..Write::default()
        },
    );
    let e = hf::load(&dir.0, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&shaped) && e.contains("[17, 32]"), "{e}");
    let (dir, t, _) = written(Shape::Llama, &Write::default());
    let mut cfg = t.config_json();
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    std::fs::write(dir.0.join("config.json"), cfg.to_string()).unwrap();
    let e = hf::load(&dir.0, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("MistralForCausalLM"), "{e}");
    let empty = TempDir::new("empty");
    let e = hf::load(&empty.0, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
}
