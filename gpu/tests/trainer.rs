//! The embedded trainer on the tiny model: TITO consistency with the
//! engine, correct gradients, exact reduction across cells and micro-steps,
//! supervised overfitting, bad input, memory release.

use gyre_gpu::engine::{Engine, EngineConfig, Request, SamplingParams};
use gyre_gpu::model::vocab::{self, Role};
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_gpu::trainer::{
    GradBuffer, GradScale, Loss, MicroStep, ObjectiveConfig, OptimConfig, RowChunk, SeqStats,
    TrainRow, Trainer, TrainerError,
};

fn tiny() -> ModelConfig {
    ModelConfig::tiny()
}

/// Rows from engine completions: prompt is context, output tokens are
/// targets with their recorded log-probs.
fn rollout_rows(seed: u64, n: usize, batch: usize) -> (ParamBuffer, Vec<TrainRow>) {
    let params = ParamBuffer::init(&tiny(), seed).unwrap();
    let mut e = Engine::new(EngineConfig::for_model(tiny(), 8), &params).unwrap();
    for i in 0..n {
        let temperature = [1.0, 0.7, 1.3][i % 3];
        e.submit(Request {
            prompt: vocab::chat(&[(Role::User, &format!("task {i}"))]),
            params: SamplingParams {
                temperature,
                top_p: if i % 2 == 0 { 1.0 } else { 0.9 },
                max_new_tokens: 6 + i as u32 % 5,
                seed: seed * 100 + i as u64,
                ..Default::default()
            },
        })
        .unwrap();
    }
    let mut done = e.run_until_idle().unwrap();
    done.sort_by_key(|c| c.id);
    let rows = done
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let p = c.prompt.len();
            let len = p + c.tokens.len();
            let l = c.tokens.len() as f32;
            let mut ids = c.prompt.clone();
            ids.extend(&c.tokens);
            let mut lp = vec![0.0; p];
            lp.extend(&c.logprobs);
            TrainRow {
                execution: i as u32,
                input_ids: ids,
                target: (0..len).map(|u| u >= p).collect(),
                behaviour_logprobs: lp,
                coefficients: (0..len)
                    .map(|u| {
                        if u >= p {
                            1.0 / (l * batch as f32)
                        } else {
                            0.0
                        }
                    })
                    .collect(),
                advantage: if i % 2 == 0 { 1.0 } else { -0.5 },
            }
        })
        .collect();
    (params, rows)
}

#[test]
fn teacher_forcing_reproduces_the_engine_logprobs() {
    let (params, rows) = rollout_rows(1, 6, 6);
    let mut t = Trainer::new(&tiny(), &params).unwrap();
    let lp = t.token_logprobs(&rows, &MicroStep::whole(&rows)).unwrap();
    let recorded: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            r.target
                .iter()
                .zip(&r.behaviour_logprobs)
                .filter(|x| *x.0)
                .map(|x| *x.1)
        })
        .collect();
    assert_eq!(lp.len(), recorded.len());
    let worst = lp
        .iter()
        .zip(&recorded)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "max |Δ log p| = {worst}");
}

fn supervised_loss(t: &mut Trainer, rows: &[TrainRow]) -> f64 {
    let lp = t.token_logprobs(rows, &MicroStep::whole(rows)).unwrap();
    let cs: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            r.target
                .iter()
                .zip(&r.coefficients)
                .filter(|x| *x.0)
                .map(|x| *x.1)
        })
        .collect();
    lp.iter()
        .zip(cs)
        .map(|(l, c)| -f64::from(c) * f64::from(*l))
        .sum()
}

#[test]
fn gradients_match_finite_differences() {
    let (params, rows) = rollout_rows(2, 3, 3);
    let mut t = Trainer::new(&tiny(), &params).unwrap();
    t.accumulate(&rows, &MicroStep::whole(&rows), &Loss::Supervised, None)
        .unwrap();
    let g = t.export_grads().unwrap();
    t.zero_grads().unwrap();
    // The largest coordinates, spread over the layout.
    let mut idx: Vec<usize> = (0..g.data.len()).collect();
    idx.sort_by(|&a, &b| g.data[b].abs().total_cmp(&g.data[a].abs()));
    let eps = 1e-2f32;
    for &i in idx.iter().take(6) {
        let mut p = params.clone();
        p.data[i] += eps;
        t.load_params(&p).unwrap();
        let up = supervised_loss(&mut t, &rows);
        p.data[i] -= 2.0 * eps;
        t.load_params(&p).unwrap();
        let down = supervised_loss(&mut t, &rows);
        let fd = (up - down) / (2.0 * f64::from(eps));
        let ad = f64::from(g.data[i]);
        assert!(
            (fd - ad).abs() <= 0.05 * ad.abs() + 1e-4,
            "param {i}: autograd {ad}, finite difference {fd}"
        );
    }
}

#[test]
fn split_batches_reduce_to_the_whole_batch_gradient() {
    let (params, rows) = rollout_rows(3, 8, 8);
    let cfg = ObjectiveConfig::default();
    let whole = MicroStep::whole(&rows);
    let mut one = Trainer::new(&tiny(), &params).unwrap();
    let r = one
        .accumulate(&rows, &whole, &Loss::Policy(cfg), None)
        .unwrap();
    let g_one = one.export_grads().unwrap();
    // Two cells, each half of the executions, in micro-steps of one or two rows.
    let halves = [
        vec![
            MicroStep {
                chunks: whole.chunks[0..2].to_vec(),
            },
            MicroStep {
                chunks: whole.chunks[2..4].to_vec(),
            },
        ],
        vec![
            MicroStep {
                chunks: whole.chunks[4..5].to_vec(),
            },
            MicroStep {
                chunks: whole.chunks[5..8].to_vec(),
            },
        ],
    ];
    let mut parts = Vec::new();
    let mut loss = 0.0;
    for steps in &halves {
        let mut cell = Trainer::new(&tiny(), &params).unwrap();
        loss += cell
            .accumulate_batch(&rows, steps, &cfg)
            .unwrap()
            .iter()
            .map(|r| r.loss)
            .sum::<f64>();
        parts.push(cell.export_grads().unwrap());
    }
    let reduced = GradBuffer::sum(&parts).unwrap();
    assert_eq!(reduced.cells, 2);
    assert_eq!(reduced.micro_steps, 4);
    assert!((loss - r.loss).abs() <= 1e-6 * r.loss.abs().max(1.0));
    let scale = g_one.norm();
    assert!(scale > 0.0);
    let worst = g_one
        .data
        .iter()
        .zip(&reduced.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        f64::from(worst) <= 1e-5 * scale.max(1.0),
        "max |Δ| = {worst}, ‖g‖ = {scale}"
    );
}

#[test]
fn rows_cut_across_micro_steps_keep_the_exact_sequence_ratio() {
    let (params, mut rows) = rollout_rows(4, 2, 2);
    // Off-policy: behaviour log-probs shifted, so s_i matters.
    for (k, r) in rows.iter_mut().enumerate() {
        for (u, lp) in r.behaviour_logprobs.iter_mut().enumerate() {
            if r.target[u] {
                *lp += if k == 0 { 0.004 * u as f32 } else { -0.003 };
            }
        }
    }
    let cfg = ObjectiveConfig::default();
    let mut whole = Trainer::new(&tiny(), &params).unwrap();
    let rw = whole
        .accumulate_batch(&rows, &[MicroStep::whole(&rows)], &cfg)
        .unwrap();
    let gw = whole.export_grads().unwrap();
    // Row 0 cut in two chunks in different micro-steps.
    let n0 = rows[0].len() as u32;
    let cut = n0 - 3;
    let steps = vec![
        MicroStep {
            chunks: vec![RowChunk {
                row: 0,
                start: 0,
                end: cut,
            }],
        },
        MicroStep {
            chunks: vec![
                RowChunk {
                    row: 0,
                    start: cut,
                    end: n0,
                },
                RowChunk {
                    row: 1,
                    start: 0,
                    end: rows[1].len() as u32,
                },
            ],
        },
    ];
    let mut split = Trainer::new(&tiny(), &params).unwrap();
    let rs = split.accumulate_batch(&rows, &steps, &cfg).unwrap();
    let gs = split.export_grads().unwrap();
    let lw: f64 = rw.iter().map(|r| r.loss).sum();
    let ls: f64 = rs.iter().map(|r| r.loss).sum();
    assert!((lw - ls).abs() < 1e-6);
    let worst = gw
        .data
        .iter()
        .zip(&gs.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-5, "max |Δ| = {worst}");
    // Local statistics (no batch-wide sums) see only part of row 0 and
    // therefore clip differently: the batch-wide sums are needed.
    let stats: SeqStats = split.sequence_stats(&rows, &steps[0]).unwrap();
    assert_eq!(
        stats.executions[&0].count as usize,
        rows[0].target[..cut as usize]
            .iter()
            .filter(|&&t| t)
            .count()
    );
}

#[test]
fn supervised_training_overfits_a_tiny_dataset() {
    let cfg = tiny();
    let texts = ["the cat sat", "on the mat", "gyre trains"];
    let rows: Vec<TrainRow> = texts
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut ids = vec![vocab::Special::Bos.id()];
            ids.extend(vocab::encode(s));
            let n = ids.len();
            TrainRow {
                execution: i as u32,
                target: (0..n).map(|u| u > 0).collect(),
                behaviour_logprobs: vec![0.0; n],
                coefficients: (0..n)
                    .map(|u| {
                        if u > 0 {
                            1.0 / ((n - 1) * texts.len()) as f32
                        } else {
                            0.0
                        }
                    })
                    .collect(),
                advantage: 0.0,
                input_ids: ids,
            }
        })
        .collect();
    let optim = OptimConfig {
        lr: 1e-2,
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut core = Trainer::core(&cfg, &ParamBuffer::init(&cfg, 5).unwrap(), optim).unwrap();
    let step = MicroStep::whole(&rows);
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..150 {
        core.accumulate(&rows, &step, &Loss::Supervised, None)
            .unwrap();
        let g = core.export_grads().unwrap();
        let rep = core.apply(&g).unwrap();
        first.get_or_insert(rep.loss);
        last = rep.loss;
    }
    let first = first.unwrap();
    assert!(last < 0.1 * first, "loss {first} → {last}");
    assert_eq!(core.version(), 150);
    // The exported parameters serve: the engine now completes the text.
    let mut e = Engine::new(
        EngineConfig::for_model(cfg.clone(), 2),
        &core.params().unwrap(),
    )
    .unwrap();
    let mut prompt = vec![vocab::Special::Bos.id()];
    prompt.extend(vocab::encode("gyre"));
    let c = e
        .generate(Request {
            prompt,
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 7,
                ..Default::default()
            },
        })
        .unwrap();
    assert_eq!(vocab::decode(&c.tokens), " trains");
}

#[test]
fn updates_need_the_core_and_matching_gradients() {
    let cfg = tiny();
    let p = ParamBuffer::init(&cfg, 6).unwrap();
    let mut sat = Trainer::new(&cfg, &p).unwrap();
    let g = sat.export_grads().unwrap();
    assert!(matches!(sat.apply(&g), Err(TrainerError::NotCore)));
    let mut core = Trainer::core(
        &cfg,
        &p,
        OptimConfig {
            scale: GradScale::PerCell,
            ..Default::default()
        },
    )
    .unwrap();
    let mut stale = g.clone();
    stale.version = 7;
    assert!(matches!(core.apply(&stale), Err(TrainerError::BadInput(_))));
    let mut nan = g.clone();
    nan.data[3] = f32::NAN;
    assert!(matches!(core.apply(&nan), Err(TrainerError::BadInput(_))));
    // A zero gradient moves nothing but still advances the version.
    let rep = core.apply(&g).unwrap();
    assert_eq!(rep.version, 1);
    assert_eq!(core.params().unwrap().data, p.data);
    // Satellites refuse new weights mid-accumulation.
    let (_, rows) = rollout_rows(6, 1, 1);
    sat.accumulate(&rows, &MicroStep::whole(&rows), &Loss::Supervised, None)
        .unwrap();
    assert!(matches!(
        sat.load_params(&core.params().unwrap()),
        Err(TrainerError::Accumulating(1))
    ));
    sat.zero_grads().unwrap();
    sat.load_params_from_bytes(&core.params().unwrap().encode())
        .unwrap();
    assert_eq!(sat.version(), 1);
}

#[test]
fn bad_rows_are_rejected() {
    let cfg = tiny();
    let mut t = Trainer::new(&cfg, &ParamBuffer::init(&cfg, 1).unwrap()).unwrap();
    let good = TrainRow {
        execution: 0,
        input_ids: vec![1, 2, 3],
        target: vec![false, true, true],
        behaviour_logprobs: vec![0.0, -1.0, -1.0],
        coefficients: vec![0.0, 0.5, 0.5],
        advantage: 1.0,
    };
    let run = |t: &mut Trainer, rows: &[TrainRow], step: &MicroStep| {
        t.accumulate(rows, step, &Loss::Policy(ObjectiveConfig::default()), None)
    };
    let whole = |rows: &[TrainRow]| MicroStep::whole(rows);
    let mut r = good.clone();
    r.target[0] = true;
    assert!(matches!(
        run(
            &mut t,
            std::slice::from_ref(&r),
            &whole(std::slice::from_ref(&r))
        ),
        Err(TrainerError::BadInput(_))
    ));
    let mut r = good.clone();
    r.input_ids[1] = 100_000;
    assert!(matches!(
        run(
            &mut t,
            std::slice::from_ref(&r),
            &whole(std::slice::from_ref(&r))
        ),
        Err(TrainerError::BadInput(_))
    ));
    let mut r = good.clone();
    r.coefficients.pop();
    assert!(matches!(
        run(
            &mut t,
            std::slice::from_ref(&r),
            &whole(std::slice::from_ref(&r))
        ),
        Err(TrainerError::BadInput(_))
    ));
    let mut r = good.clone();
    r.behaviour_logprobs[2] = f32::INFINITY;
    assert!(matches!(
        run(
            &mut t,
            std::slice::from_ref(&r),
            &whole(std::slice::from_ref(&r))
        ),
        Err(TrainerError::BadInput(_))
    ));
    let bad_chunk = MicroStep {
        chunks: vec![RowChunk {
            row: 0,
            start: 2,
            end: 9,
        }],
    };
    assert!(matches!(
        run(&mut t, std::slice::from_ref(&good), &bad_chunk),
        Err(TrainerError::BadInput(_))
    ));
    let bad_row = MicroStep {
        chunks: vec![RowChunk {
            row: 4,
            start: 0,
            end: 1,
        }],
    };
    assert!(matches!(
        run(&mut t, std::slice::from_ref(&good), &bad_row),
        Err(TrainerError::BadInput(_))
    ));
    let long = TrainRow {
        input_ids: vec![1; 65],
        target: vec![false; 65],
        behaviour_logprobs: vec![0.0; 65],
        coefficients: vec![0.0; 65],
        ..good.clone()
    };
    assert!(matches!(
        run(
            &mut t,
            std::slice::from_ref(&long),
            &whole(std::slice::from_ref(&long))
        ),
        Err(TrainerError::BadInput(_))
    ));
    // Nothing was accumulated by the failures; the good row still trains.
    assert_eq!(t.export_grads().unwrap().micro_steps, 0);
    let rep = run(
        &mut t,
        std::slice::from_ref(&good),
        &whole(std::slice::from_ref(&good)),
    )
    .unwrap();
    assert_eq!(rep.targets, 2);
}

#[test]
fn training_memory_is_released_and_restored_by_role() {
    let cfg = tiny();
    let p = ParamBuffer::init(&cfg, 9).unwrap();
    let mut core = Trainer::core(&cfg, &p, OptimConfig::default()).unwrap();
    let full = core.memory_report().resident;
    assert_eq!(full, 4 * 4 * p.data.len() as u64);
    let freed = core.release_memory().unwrap();
    assert_eq!(freed, full);
    assert_eq!(core.memory_report().resident, 0);
    assert!(core.params().is_err());
    core.restore_memory().unwrap();
    assert_eq!(core.params().unwrap(), p);
    assert_eq!(core.memory_report().peak, full);
}

#[test]
fn a_two_cell_step_reduces_updates_and_broadcasts() {
    use gyre_gpu::collective::PrefixGroups;
    use std::time::Duration;
    let (params, rows) = rollout_rows(10, 6, 6);
    let cfg = ObjectiveConfig::default();
    let optim = OptimConfig {
        lr: 1e-3,
        ..Default::default()
    };
    // Reference: the core alone on the whole batch.
    let mut alone = Trainer::core(&tiny(), &params, optim).unwrap();
    alone
        .accumulate_batch(&rows, &[MicroStep::whole(&rows)], &cfg)
        .unwrap();
    let g = alone.export_grads().unwrap();
    alone.apply(&g).unwrap();
    let expected = alone.params().unwrap();
    let whole_grads = &g.data;
    let scale = whole_grads.iter().fold(0f32, |m, x| m.max(x.abs()));

    let groups = PrefixGroups::host(2, Duration::from_secs(30));
    let whole = MicroStep::whole(&rows);
    let shares = [
        MicroStep {
            chunks: whole.chunks[..2].to_vec(),
        },
        MicroStep {
            chunks: whole.chunks[2..].to_vec(),
        },
    ];
    let out: Vec<ParamBuffer> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .iter()
            .zip(&shares)
            .map(|(grp, share)| {
                let (rows, params) = (&rows, &params);
                s.spawn(move || {
                    let mut t = if grp.cell() == 0 {
                        Trainer::core(&tiny(), params, optim).unwrap()
                    } else {
                        Trainer::new(&tiny(), params).unwrap()
                    };
                    t.accumulate_batch(rows, std::slice::from_ref(share), &cfg)
                        .unwrap();
                    let mut g = t.export_grads().unwrap();
                    g.all_reduce(grp.group(2).unwrap().unwrap()).unwrap();
                    assert_eq!((g.cells, g.micro_steps), (2, 2));
                    // The halves' sum is the whole batch's gradient, up to
                    // the order in which each product sums over rows.
                    let worst = g
                        .data
                        .iter()
                        .zip(whole_grads)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(worst < 1e-5 * scale, "max |Δg| = {worst} of {scale}");
                    let mut p = if grp.cell() == 0 {
                        t.apply(&g).unwrap();
                        t.params().unwrap()
                    } else {
                        t.zero_grads().unwrap();
                        t.params().unwrap()
                    };
                    grp.broadcast_from_core(2, &mut p.data).unwrap();
                    p.version = 1;
                    t.load_params(&p).unwrap();
                    t.params().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(out[0], out[1]);
    assert_eq!(out[0].version, 1);
    let worst = out[0]
        .data
        .iter()
        .zip(&expected.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // Adam's first step is about lr · g/|g|, so a gradient entry near zero
    // turns its rounding into a visible share of lr (1e-3).
    assert!(worst < 1e-4, "max |Δθ| = {worst}");
}

/// A core restored from a durable checkpoint continues the model's history
/// exactly: the same next update gives bit-identical parameters and moments
/// as the core that never stopped.
#[test]
fn a_restored_core_continues_bit_for_bit() {
    let (params, rows) = rollout_rows(8, 4, 4);
    let cfg = tiny();
    let optim = OptimConfig {
        lr: 1e-2,
        ..Default::default()
    };
    let step = MicroStep::whole(&rows);
    let mut first = Trainer::core(&cfg, &params, optim).unwrap();
    let update = |t: &mut Trainer| {
        t.accumulate(&rows, &step, &Loss::Supervised, None).unwrap();
        let g = t.export_grads().unwrap();
        t.apply(&g).unwrap()
    };
    update(&mut first);
    update(&mut first);
    let dir = std::env::temp_dir().join(format!("gyre-restore-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("core.ckpt");
    first.checkpoint(1).unwrap().save(&path).unwrap();
    update(&mut first);
    // A new core from the initial parameters (a fresh process) adopts it.
    let mut second = Trainer::core(&cfg, &params, optim).unwrap();
    let loaded = gyre_gpu::trainer::CoreCheckpoint::load(&path).unwrap();
    assert_eq!((loaded.step, loaded.version, loaded.adam_t), (1, 2, 2));
    second.restore(&loaded).unwrap();
    assert_eq!(second.version(), 2);
    update(&mut second);
    assert_eq!(second.version(), 3);
    assert_eq!(second.params().unwrap().data, first.params().unwrap().data);
    assert_eq!(second.checkpoint(2).unwrap(), first.checkpoint(2).unwrap());
    // A checkpoint of another model is refused.
    let mut other = loaded.clone();
    other.fingerprint ^= 1;
    assert!(matches!(
        second.restore(&other),
        Err(TrainerError::Checkpoint(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}
