//! `gyre bench gateway`: added latency and throughput of the gateway over a
//! direct engine call at several client counts, LiteLLM side by side when
//! it is installed, and the tokenisation saved by token-exact history.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::gateway::bench::{
    Cell, FixedEngine, direct_engine, http_load, tokenisation_ratio, upstream_router,
};
use crate::gateway::http::api_router;
use crate::gateway::parse::ToolFormat;
use crate::gateway::render::Renderer;
use crate::gateway::service::{Gateway, GatewayConfig};
use crate::gateway::store::Store;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// The gateway against a direct engine call, and LiteLLM against a
    /// direct upstream call, on the same machine.
    Gateway(GatewayBenchArgs),
    /// Execution start-up overhead (workspace copy, sandbox, process start,
    /// teardown) at several concurrencies, and runner memory per live
    /// execution.
    Harness(super::bench_harness::HarnessBenchArgs),
}

#[derive(Debug, Args)]
pub struct GatewayBenchArgs {
    /// Concurrent clients per cell.
    #[arg(long, value_delimiter = ',', default_value = "1,32,256")]
    pub clients: Vec<usize>,
    /// Seconds of load per cell.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Fixed latency of the engine and of the upstream, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// The `litellm` executable (default: on PATH, else
    /// target/litellm-venv/bin/litellm); `off` skips LiteLLM.
    #[arg(long)]
    pub litellm: Option<String>,
    /// Context and added tokens of the tokenisation comparison.
    #[arg(long, default_value_t = 700_000)]
    pub context_tokens: usize,
    #[arg(long, default_value_t = 2_000)]
    pub added_tokens: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchWhat::Gateway(a) => gateway(a),
        BenchWhat::Harness(a) => super::bench_harness::run(a),
    }
}

struct Row {
    target: &'static str,
    direct: Cell,
    proxied: Cell,
}

fn find_litellm(arg: &Option<String>) -> Option<PathBuf> {
    match arg.as_deref() {
        Some("off") => None,
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("litellm"))
                .find(|p| p.exists())
        }),
    }
}

struct Litellm {
    child: Child,
    addr: SocketAddr,
    key: String,
    _dir: PathBuf,
}

impl Drop for Litellm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start_litellm(exe: &PathBuf, upstream: SocketAddr) -> Result<Litellm> {
    let dir = std::env::temp_dir().join(format!("gyre-bench-litellm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n      api_base: http://{upstream}/v1\n      api_key: x\n"
        ),
    )?;
    let port = free_port()?;
    let key = format!("sk-bench-{}", std::process::id());
    let child = Command::new(exe)
        .args([
            "--config",
            cfg.to_str().unwrap_or_default(),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("LITELLM_LOG", "ERROR")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_MASTER_KEY", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    Ok(Litellm {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        key,
        _dir: dir,
    })
}

fn print_table(rows: &[Row]) {
    println!(
        "| proxy | clients | direct p50 ms | direct p99 ms | direct req/s | proxied p50 ms | proxied p99 ms | proxied req/s | added p50 ms | errors |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.0} | {:+.3} | {} |",
            r.target,
            r.direct.clients,
            r.direct.p50_ms,
            r.direct.p99_ms,
            r.direct.req_per_s,
            r.proxied.p50_ms,
            r.proxied.p99_ms,
            r.proxied.req_per_s,
            r.proxied.p50_ms - r.direct.p50_ms,
            r.proxied.errors
        );
    }
}

fn gateway(a: GatewayBenchArgs) -> Result<()> {
    if a.clients.is_empty() || a.clients.contains(&0) {
        bail!("--clients: give positive client counts, e.g. 1,32,256");
    }
    let duration = Duration::from_secs_f64(a.seconds.max(0.1));
    let latency = Duration::from_millis(a.latency_ms);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let renderer = Renderer::builtin()?;
    let output = renderer
        .tokenizer
        .encode("a fixed reply of about twenty tokens<|im_end|>")?;
    let engine: Arc<dyn crate::gateway::engine::Engine> = Arc::new(FixedEngine { latency, output });
    let config = GatewayConfig {
        model: "bench".into(),
        tool_format: ToolFormat::Hermes,
        max_body_bytes: 1 << 20,
        max_concurrency: 4096,
        request_timeout: Duration::from_secs(60),
    };
    let gw = Arc::new(Gateway::new(
        engine.clone(),
        renderer,
        Store::temporary()?,
        config,
    )?);
    let key = gw
        .create_execution(None, None)
        .map_err(|e| anyhow::anyhow!(e.message().to_string()))?
        .key;
    let serve = |router: axum::Router| -> Result<SocketAddr> {
        server_rt.block_on(async {
            use axum::serve::ListenerExt;
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = l.local_addr()?;
            let l = l.tap_io(|s| {
                let _ = s.set_nodelay(true);
            });
            tokio::spawn(async move { axum::serve(l, router).await });
            Ok(addr)
        })
    };
    let gyre_addr = serve(api_router(gw.clone()))?;
    let upstream = serve(upstream_router(latency))?;
    let body = Bytes::from(
        json!({"model": "bench", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hello"}]})
        .to_string(),
    );
    let mut rows = Vec::new();
    for &c in &a.clients {
        let direct = server_rt.block_on(direct_engine(engine.clone(), c, duration));
        let proxied = client_rt.block_on(http_load(
            gyre_addr,
            "/v1/chat/completions",
            &key,
            body.clone(),
            c,
            duration,
        ));
        rows.push(Row {
            target: "gyre",
            direct,
            proxied,
        });
    }
    let litellm = find_litellm(&a.litellm);
    let mut litellm_note = None;
    match &litellm {
        None => litellm_note = Some("LiteLLM not measured: no `litellm` on PATH (pip install 'litellm[proxy]') or --litellm off".to_string()),
        Some(exe) => {
            let proc_ = start_litellm(exe, upstream)?;
            let ready = Instant::now();
            loop {
                let probe = client_rt.block_on(http_load(proc_.addr, "/v1/chat/completions", &proc_.key, body.clone(), 1, Duration::from_millis(300)));
                if probe.requests > 0 {
                    break;
                }
                if ready.elapsed() > Duration::from_secs(120) {
                    bail!("LiteLLM did not answer within 120 s on {}", proc_.addr);
                }
            }
            for &c in &a.clients {
                let direct = client_rt.block_on(http_load(upstream, "/v1/chat/completions", "x", body.clone(), c, duration));
                let proxied = client_rt.block_on(http_load(proc_.addr, "/v1/chat/completions", &proc_.key, body.clone(), c, duration));
                rows.push(Row { target: "litellm", direct, proxied });
            }
        }
    }
    let r = Renderer::builtin()?;
    let (suffix_s, full_s, n_ext, n_full) =
        tokenisation_ratio(&r, a.context_tokens, a.added_tokens)?;
    if a.json {
        let cells: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"proxy": r.target, "direct": r.direct, "proxied": r.proxied,
            "added_p50_ms": r.proxied.p50_ms - r.direct.p50_ms})
            })
            .collect();
        println!(
            "{}",
            json!({"cells": cells, "litellm": litellm_note,
            "tokenisation": {"context_tokens": n_full, "extended_tokens": n_ext, "suffix_s": suffix_s,
                             "full_s": full_s, "ratio": full_s / suffix_s}})
        );
        return Ok(());
    }
    println!(
        "gateway bench: {:.1} s per cell, engine/upstream latency {} ms, load generator on the same cores",
        a.seconds, a.latency_ms
    );
    print_table(&rows);
    if let Some(n) = litellm_note {
        println!("{n}");
    }
    println!(
        "tokenisation: extending a {n_full}-token context by {} tokens: {:.3} ms for the suffix vs {:.1} ms re-tokenising everything ({:.0}x)",
        a.added_tokens,
        suffix_s * 1e3,
        full_s * 1e3,
        full_s / suffix_s
    );
    Ok(())
}
