//! What the SGLang client adds per call over a plain HTTP POST to the same
//! `gyre serve` process: both send the same one-token `/generate` to a tiny
//! model; the difference of the means is the client's own cost (request
//! building, response parsing into a `Generation`). Prints figures.
//!
//! `cargo bench -p gyre --bench sglang_overhead`

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gyre::backends::sglang::{ClientConfig, GenerateRequest, Sampling, SglangClient};

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
        // Warm both paths, then alternate rounds so drift hits both.
        for _ in 0..20 {
            direct().await;
            via_client().await;
        }
        let (mut t_direct, mut t_client) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..CALLS {
            let t = Instant::now();
            direct().await;
            t_direct += t.elapsed();
            let t = Instant::now();
            via_client().await;
            t_client += t.elapsed();
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / CALLS as f64;
        println!("gyre serve, tiny model, one-token /generate, {CALLS} calls each:");
        println!("  direct HTTP POST      {:8.1} µs/call", per(t_direct));
        println!("  SglangClient.generate {:8.1} µs/call", per(t_client));
        println!(
            "  client overhead       {:8.1} µs/call",
            per(t_client) - per(t_direct)
        );
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
