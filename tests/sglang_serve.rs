//! The SGLang client against a real `gyre serve` process (spawned from the
//! built binary, port chosen by the system): generation streamed and not,
//! equal to the in-process engine; abort mid-generation returns the
//! partial output with finish reason abort; release/resume; weight updates
//! by version; health while starting and when dead; bad requests get 400s
//! naming the problem; a hung server times out; a Hugging Face checkpoint
//! serves end to end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gyre::backends::sglang::client::Health;
use gyre::backends::sglang::distributed::{DEFAULT_GROUP, DistributedTensors, WeightsGroup};
use gyre::backends::sglang::{
    ClientConfig, Finish, GenerateRequest, Sampling, SglangClient, SglangError,
};
use gyre::gpu::engine::{Engine, EngineConfig, Request, SamplingParams};
use gyre::gpu::model::hf;
use gyre::gpu::model::{ModelConfig, ParamBuffer, safetensors_io};

mod common;

use common::{Serve as Server, tiny_qwen3};

fn client(s: &Server) -> SglangClient {
    SglangClient::new(&s.url, ClientConfig::default()).unwrap()
}

async fn ready(s: &Server) -> SglangClient {
    let c = client(s);
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    c
}

fn request(ids: Vec<u32>, max_new: u32, seed: u64, rid: &str) -> GenerateRequest {
    GenerateRequest {
        input_ids: Some(ids),
        sampling_params: Sampling {
            max_new_tokens: Some(max_new),
            seed: Some(seed),
            ignore_eos: true,
            ..Sampling::default()
        },
        rid: Some(rid.to_string()),
        return_logprob: true,
        ..GenerateRequest::default()
    }
}

fn prompt() -> Vec<u32> {
    gyre::gpu::model::vocab::encode("tell me a story")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_streamed_and_not_equals_the_in_process_engine() {
    let s = Server::with_args(&[]);
    let c = ready(&s).await;
    let g = c.generate(&request(prompt(), 12, 7, "a")).await.unwrap();
    assert_eq!(g.output_ids.len(), 12);
    assert_eq!(g.logprobs.len(), 12);
    assert_eq!(g.finish, Some(Finish::Length));
    assert_eq!(g.weight_version.as_deref(), Some("0"));
    assert_eq!(g.rid.as_deref(), Some("a"));
    // The same model and request in process: the HTTP path adds nothing.
    let model = ModelConfig::default();
    let mut e = Engine::new(
        EngineConfig::for_model(model.clone(), 32),
        &ParamBuffer::init(&model, 0).unwrap(),
    )
    .unwrap();
    let local = e
        .generate(Request {
            prompt: prompt(),
            params: SamplingParams {
                max_new_tokens: 12,
                seed: 7,
                ..SamplingParams::default()
            },
        })
        .unwrap();
    assert_eq!(g.output_ids, local.tokens);
    assert_eq!(g.logprobs, local.logprobs);
    // Streamed: cumulative chunks, the last one finished, then [DONE].
    let mut st = c
        .generate_stream(&request(prompt(), 12, 7, "b"))
        .await
        .unwrap();
    let mut chunks = Vec::new();
    while let Some(ch) = st.next().await {
        chunks.push(ch.unwrap());
    }
    assert!(chunks.len() >= 2, "{} chunks", chunks.len());
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c.finish.is_none())
    );
    let last = chunks.last().unwrap();
    assert_eq!(last.finish, Some(Finish::Length));
    assert_eq!(last.output_ids, g.output_ids);
    assert_eq!(last.logprobs, g.logprobs);
    for w in chunks.windows(2) {
        assert!(w[1].output_ids.starts_with(&w[0].output_ids));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_mid_generation_returns_the_partial_output() {
    let s = Server::with_args(&[]);
    let c = ready(&s).await;
    // Streamed: abort after three chunks.
    let mut st = c
        .generate_stream(&request(prompt(), 200, 1, "long-1"))
        .await
        .unwrap();
    for _ in 0..3 {
        st.next().await.unwrap().unwrap();
    }
    c.abort("long-1").await.unwrap();
    let last = st.finish().await.unwrap();
    assert!(
        matches!(last.finish, Some(Finish::Abort { .. })),
        "{last:?}"
    );
    assert!(last.output_ids.len() >= 3 && last.output_ids.len() < 200);
    assert_eq!(last.logprobs.len(), last.output_ids.len());
    // Not streamed: abort once the server reports it running.
    let c2 = c.clone();
    let task = tokio::spawn(async move { c2.generate(&request(prompt(), 200, 2, "long-2")).await });
    loop {
        if c.get_load().await.unwrap().running > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.abort("long-2").await.unwrap();
    let g = task.await.unwrap().unwrap();
    assert!(matches!(g.finish, Some(Finish::Abort { .. })), "{g:?}");
    assert!(g.output_ids.len() < 200);
    // Unknown rids are fine; the server still serves.
    c.abort("nobody").await.unwrap();
    assert_eq!(c.get_load().await.unwrap().running, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_resume_memory_by_tag() {
    let s = Server::with_args(&[]);
    let c = ready(&s).await;
    let before = c.generate(&request(prompt(), 6, 3, "r1")).await.unwrap();
    c.release_memory(&["weights", "kv_cache"]).await.unwrap();
    assert!(matches!(
        c.health().await.unwrap(),
        Health::NotServing { status: 503, .. }
    ));
    let e = c
        .generate(&request(prompt(), 6, 3, "r2"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SglangError::Server { status: 503, message, .. } if message.contains("resume")),
        "{e}"
    );
    c.resume_memory(&["kv_cache"]).await.unwrap();
    assert!(matches!(
        c.health().await.unwrap(),
        Health::NotServing { .. }
    ));
    c.resume_memory(&[]).await.unwrap();
    assert_eq!(c.health().await.unwrap(), Health::Serving);
    let after = c.generate(&request(prompt(), 6, 3, "r3")).await.unwrap();
    assert_eq!(after.output_ids, before.output_ids);
    assert_eq!(after.logprobs, before.logprobs);
    let e = c.release_memory(&["optimizer"]).await.unwrap_err();
    assert!(
        matches!(&e, SglangError::Refused { status: 400, message, .. } if message.contains("optimizer")),
        "{e}"
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_updates_by_version_reach_the_next_generation() {
    let s = Server::with_args(&[]);
    let c = ready(&s).await;
    let model = ModelConfig::default();
    let v0 = c.generate(&request(prompt(), 8, 4, "w0")).await.unwrap();
    // From a tensor: the flat buffer, labelled 3.
    let new = ParamBuffer::init(&model, 99).unwrap();
    c.update_weights_from_tensor(&new.encode(), Some("3"))
        .await
        .unwrap();
    assert_eq!(c.get_weight_version().await.unwrap(), "3");
    let v3 = c.generate(&request(prompt(), 8, 4, "w3")).await.unwrap();
    assert_eq!(v3.weight_version.as_deref(), Some("3"));
    assert_ne!(v3.logprobs, v0.logprobs);
    // From disk: a Gyre checkpoint file with the original weights.
    let dir = temp_dir("weights");
    let file = dir.join("v4.safetensors");
    safetensors_io::save(&file, &model, &ParamBuffer::init(&model, 0).unwrap()).unwrap();
    c.update_weights_from_disk(file.to_str().unwrap(), Some("4"))
        .await
        .unwrap();
    let v4 = c.generate(&request(prompt(), 8, 4, "w4")).await.unwrap();
    assert_eq!(v4.weight_version.as_deref(), Some("4"));
    assert_eq!(v4.logprobs, v0.logprobs);
    // A version label alone, while a request runs: it is not aborted
    // (the client sends abort_all_requests: false) and ends under "5".
    let mut st = c
        .generate_stream(&request(prompt(), 60, 4, "w5"))
        .await
        .unwrap();
    st.next().await.unwrap().unwrap();
    c.update_weight_version("5").await.unwrap();
    let last = st.finish().await.unwrap();
    assert_eq!(last.finish, Some(Finish::Length));
    assert_eq!(last.weight_version.as_deref(), Some("5"));
    // A buffer of another model is refused, naming the mismatch.
    let other = ParamBuffer::init(&ModelConfig::tiny(), 1).unwrap();
    let e = c
        .update_weights_from_tensor(&other.encode(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SglangError::Refused { status: 400, message, .. } if message.contains("layout")),
        "{e}"
    );
    let e = c
        .update_weights_from_disk("/nonexistent/dir", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent"), "{e}");
    assert_eq!(c.get_weight_version().await.unwrap(), "5");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_while_starting_and_when_dead() {
    let mut s = Server::with_args(&["--load-delay-ms", "1500"]);
    let c = client(&s);
    match c.health().await.unwrap() {
        Health::NotServing { status, message } => {
            assert_eq!(status, 503);
            assert!(message.contains("loading"), "{message}");
        }
        h => panic!("serving before the model loaded: {h:?}"),
    }
    let e = c
        .generate(&request(prompt(), 2, 1, "early"))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    let info = c.get_server_info().await.unwrap();
    assert_eq!(info["engine"], "gyre-embedded");
    assert_eq!(info["kv_migration"], false);
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let e = c.health().await.unwrap_err();
    assert!(
        matches!(e, SglangError::Unreachable { .. }) && e.is_retryable(),
        "{e}"
    );
    let e = c
        .generate(&request(prompt(), 2, 1, "late"))
        .await
        .unwrap_err();
    assert!(matches!(e, SglangError::Unreachable { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400s_naming_the_problem() {
    let s = Server::with_args(&[]);
    let c = ready(&s).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: &str| {
        http.post(format!("{}{path}", s.url))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    for (path, body, says) in [
        ("/generate", "not json", "invalid request body"),
        ("/generate", r#"{"input_ids": [[1, 2], [3]]}"#, "batched"),
        (
            "/generate",
            r#"{"sampling_params": {}}"#,
            "neither input_ids nor text",
        ),
        ("/generate", r#"{"input_ids": []}"#, "empty prompt"),
        (
            "/generate",
            r#"{"input_ids": [1, 99999]}"#,
            "outside the vocabulary",
        ),
        (
            "/generate",
            r#"{"input_ids": [1], "sampling_params": {"top_k": -5}}"#,
            "top_k",
        ),
        (
            "/generate",
            r#"{"input_ids": [1], "sampling_params": {"temperature": -1}}"#,
            "temperature",
        ),
        (
            "/generate",
            r#"{"input_ids": [1], "sampling_params": {"stop": ["\n"]}}"#,
            "stop_token_ids",
        ),
        ("/abort_request", "{}", "rid"),
        ("/release_memory_occupation", r#"{"tags": ["gpu"]}"#, "gpu"),
        (
            "/update_weights_from_tensor",
            r#"{"serialized_named_tensors": ["x"]}"#,
            "load_format",
        ),
        (
            "/update_weights_from_disk",
            r#"{"weight_version": "1"}"#,
            "model_path",
        ),
        ("/update_weights_from_distributed", "{}", "NCCL"),
    ] {
        let r = post(path, body).await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{path} {body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(says), "{path} {body}: {text}");
    }
    // The client maps a refused generation to a typed, non-retryable error.
    let e = c
        .generate(&request(vec![1, 99999], 2, 1, "bad"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SglangError::Refused { status: 400, .. }) && !e.is_retryable(),
        "{e}"
    );
    // The typed NCCL calls (the GPU path) reach the endpoints, which a
    // CPU server refuses naming the CPU ones.
    let group = WeightsGroup::nccl("127.0.0.1", 29500, 1);
    let e = c.init_weights_update_group(&group).await.unwrap_err();
    assert!(e.to_string().contains("update_weights_from_disk"), "{e}");
    let layout = gyre::gpu::model::ParamLayout::new(&ModelConfig::default()).unwrap();
    let tensors = DistributedTensors::of_layout(&layout);
    let e = c
        .update_weights_from_distributed(&tensors, DEFAULT_GROUP, Some("1"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("NCCL") && !e.is_retryable(), "{e}");
    // And the server still serves.
    assert_eq!(c.health().await.unwrap(), Health::Serving);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_times_out() {
    // Accepts connections (the kernel's backlog) and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    let c = SglangClient::new(
        &url,
        ClientConfig {
            timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
        },
    )
    .unwrap();
    let e = c.generate(&request(prompt(), 2, 1, "t")).await.unwrap_err();
    assert!(
        matches!(e, SglangError::Timeout { .. }) && e.is_retryable(),
        "{e}"
    );
    assert!(matches!(
        SglangClient::new("ftp://x", ClientConfig::default()),
        Err(SglangError::BadUrl { .. })
    ));
}

fn write_config(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("serve.toml");
    std::fs::write(&p, body).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hugging_face_checkpoint_serves_end_to_end() {
    let dir = temp_dir("qwen3");
    let hf_cfg = tiny_qwen3();
    let params = ParamBuffer::init(&hf_cfg.model, 11).unwrap();
    hf::save(&dir.join("ckpt"), &hf_cfg, &params, 2).unwrap();
    let toml = write_config(&dir, "checkpoint = \"ckpt\"\nmax_running = 4\n");
    let s = Server::with_args(&["--model", toml.to_str().unwrap()]);
    let c = ready(&s).await;
    let ids: Vec<u32> = (10..30).collect();
    let g = c.generate(&request(ids.clone(), 10, 2, "q")).await.unwrap();
    let ck = hf::load(&dir.join("ckpt"), &hf::LoadOptions::default()).unwrap();
    let mut e = Engine::new(
        EngineConfig::for_model(ck.config.model.clone(), 4),
        &ck.params,
    )
    .unwrap();
    let local = e
        .generate(Request {
            prompt: ids.clone(),
            params: SamplingParams {
                max_new_tokens: 10,
                seed: 2,
                ..SamplingParams::default()
            },
        })
        .unwrap();
    assert_eq!(g.output_ids, local.tokens);
    assert_eq!(g.logprobs, local.logprobs);
    // eos (5) stops a request unless ignore_eos; force it with a stop list.
    let mut r = request(ids.clone(), 10, 2, "q2");
    r.sampling_params.ignore_eos = false;
    r.sampling_params.stop_token_ids = vec![local.tokens[3]];
    let stopped = c.generate(&r).await.unwrap();
    assert!(matches!(stopped.finish, Some(Finish::Stop { .. })));
    assert!(stopped.output_ids.len() <= 4);
    // Text prompts need a tokenizer this server does not load.
    let text = GenerateRequest {
        text: Some("hello".into()),
        ..GenerateRequest::default()
    };
    let e = c.generate(&text).await.unwrap_err();
    assert!(e.to_string().contains("input_ids"), "{e}");
    // New weights from a checkpoint directory.
    let p2 = ParamBuffer::init(&hf_cfg.model, 12).unwrap();
    hf::save(&dir.join("ckpt2"), &hf_cfg, &p2, 1).unwrap();
    c.update_weights_from_disk(dir.join("ckpt2").to_str().unwrap(), Some("2"))
        .await
        .unwrap();
    let g2 = c.generate(&request(ids, 10, 2, "q3")).await.unwrap();
    assert_eq!(g2.weight_version.as_deref(), Some("2"));
    assert_ne!(g2.logprobs, g.logprobs);
    std::fs::remove_dir_all(&dir).unwrap();
}
