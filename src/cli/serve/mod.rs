//! `gyre serve`: the embedded engine as its own process, speaking SGLang's
//! native HTTP API, so a cluster runs Gyre engines exactly as it runs
//! SGLang servers and the SGLang adapter is tested against a real server.
//!
//! - [`model`]: the `--model` TOML and loading it into an engine;
//! - [`engine_loop`]: the thread that owns the engine and batches every
//!   open request;
//! - [`routes`]: the HTTP endpoints.
//!
//! The listener is bound before the model loads: `/health` answers 503
//! while it loads, then 200. The first line on stdout is
//! `gyre serve listening on ADDR` (with `--listen 127.0.0.1:0`, the port
//! the system chose).

pub mod engine_loop;
pub mod model;
pub mod routes;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use engine_loop::EngineHandle;
use model::ServeConfig;
use routes::{AppState, Served};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file naming the model (`checkpoint = "DIR"` for a Hugging
    /// Face Llama/Qwen3 checkpoint) and the engine's sizes; without it,
    /// Gyre's default model with fresh weights.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:30000")]
    pub listen: String,
    /// Waits this long before loading the model (to exercise clients'
    /// start-up handling).
    #[arg(long, default_value_t = 0, hide = true)]
    pub load_delay_ms: u64,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = match &args.model {
        Some(p) => ServeConfig::read(p)?,
        None => ServeConfig::default(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve(args, cfg))
}

async fn serve(args: ServeArgs, cfg: ServeConfig) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    println!("gyre serve listening on {addr}");
    std::io::stdout().flush().ok();
    tracing::info!(%addr, "gyre serve listening");
    let state = AppState::new();
    let loading = state.clone();
    let delay = Duration::from_millis(args.load_delay_ms);
    tokio::task::spawn_blocking(move || {
        std::thread::sleep(delay);
        if let Err(e) = load_into(&loading, &cfg) {
            tracing::error!(error = %format!("{e:#}"), "the model failed to load");
            let _ = loading.startup_error.set(format!("{e:#}"));
        }
    });
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving HTTP")
}

fn load_into(state: &Arc<AppState>, cfg: &ServeConfig) -> Result<()> {
    let loaded = cfg.load()?;
    let label = loaded.engine.version().to_string();
    let ec = loaded.engine.config().clone();
    let engine = EngineHandle::spawn(loaded.engine, label).context("starting the engine")?;
    tracing::info!(model = %loaded.model_path, "model loaded");
    let _ = state.served.set(Served {
        engine,
        model_path: loaded.model_path,
        served_model_name: loaded.served_model_name,
        model: loaded.model,
        eos_token_ids: loaded.eos_token_ids,
        max_context: loaded.max_context,
        max_running: ec.max_running,
        block_size: ec.block_size,
    });
    Ok(())
}

/// A `gyre serve` inside this process (tests and benches drive the SGLang
/// adapter against it without a child process): loaded before
/// [`InProcess::start`] returns, stopped (its listener closed, requests
/// cut) when dropped — what a killed server looks like to its clients.
pub struct InProcess {
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl InProcess {
    pub fn start(cfg: &ServeConfig) -> Result<InProcess> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("listening on 127.0.0.1:0")?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let state = AppState::new();
        load_into(&state, cfg)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(async move {
            let served = axum::serve(listener, routes::router(state))
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "in-process gyre serve");
            }
        });
        Ok(InProcess {
            url: format!("http://{addr}"),
            stop: Some(stop),
            rt: Some(rt),
        })
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
