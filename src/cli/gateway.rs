//! `gyre gateway`: serve the Anthropic and OpenAI APIs in front of an
//! engine, recording every call; admin API on its own listener.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::gateway::embedded::EmbeddedEngine;
use crate::gateway::http::{admin_router, api_router};
use crate::gateway::parse::ToolFormat;
use crate::gateway::render::Renderer;
use crate::gateway::script::ScriptEngine;
use crate::gateway::service::{Gateway, GatewayConfig};
use crate::gateway::store::Store;

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// `script=FILE.jsonl` (replays scripted completions), `embedded[=CONFIG.toml]`, or
    /// `sglang=URL[,URL…]` (SGLang servers or `gyre serve` processes, least-loaded).
    #[arg(long)]
    pub engine: String,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub admin_listen: String,
    /// Directory of the durable store; absent means a temporary in-memory store.
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// File holding the admin bearer token (else GYRE_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Directory with the model's tokenizer.json and tokenizer_config.json
    /// (chat_template, eos_token); default: the built-in byte-level ChatML one.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Tool-call format of the model's output: hermes, qwen3-coder, llama3.
    #[arg(long, default_value = "hermes")]
    pub tool_format: String,
    /// Model name answered in responses and /v1/models.
    #[arg(long, default_value = "gyre-policy")]
    pub model: String,
    #[arg(long, default_value_t = 32768)]
    pub context_window: usize,
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    #[arg(long, default_value_t = 1024)]
    pub max_concurrency: usize,
    #[arg(long, default_value_t = 600)]
    pub request_timeout_s: u64,
}

fn admin_token(args: &GatewayArgs) -> Result<String> {
    let token = match &args.admin_token_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading the admin token file {}", p.display()))?,
        None => std::env::var("GYRE_ADMIN_TOKEN")
            .context("no admin token: set GYRE_ADMIN_TOKEN or pass --admin-token-file")?,
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("the admin token is empty");
    }
    Ok(token)
}

fn renderer(args: &GatewayArgs) -> Result<Renderer> {
    Ok(match &args.tokenizer {
        Some(dir) => Renderer::from_dir(dir)?,
        None => Renderer::builtin()?,
    })
}

pub fn run(args: GatewayArgs) -> Result<()> {
    let token = admin_token(&args)?;
    let tool_format: ToolFormat = args.tool_format.parse().map_err(anyhow::Error::msg)?;
    let (kind, file) = args.engine.split_once('=').unwrap_or((&args.engine, ""));
    let (engine, renderer): (Arc<dyn crate::gateway::engine::Engine>, Renderer) = match kind {
        "script" if !file.is_empty() => {
            let renderer = renderer(&args)?;
            let engine =
                ScriptEngine::load(file.as_ref(), &renderer.tokenizer, args.context_window)?;
            (Arc::new(engine), renderer)
        }
        "embedded" => {
            if args.tokenizer.is_some() {
                bail!(
                    "--tokenizer does not apply to --engine embedded: the model has its own vocabulary"
                );
            }
            let config = (!file.is_empty()).then(|| std::path::Path::new(file));
            let (engine, renderer) = EmbeddedEngine::start(config)?;
            (Arc::new(engine), renderer)
        }
        "sglang" if !file.is_empty() => {
            crate::gateway::sglang::connect(file, args.tokenizer.as_deref())?
        }
        _ => bail!(
            "--engine {:?}: expected script=FILE.jsonl, embedded[=CONFIG.toml] or sglang=URL[,URL…]",
            args.engine
        ),
    };
    let store = match &args.store {
        Some(dir) => {
            Store::open(dir).with_context(|| format!("opening the store {}", dir.display()))?
        }
        None => {
            tracing::warn!(
                "no --store: records live in a temporary in-memory store and are lost on exit"
            );
            Store::temporary()?
        }
    };
    let config = GatewayConfig {
        model: args.model.clone(),
        tool_format,
        max_body_bytes: args.max_body_bytes,
        max_concurrency: args.max_concurrency.max(1),
        request_timeout: Duration::from_secs(args.request_timeout_s.max(1)),
    };
    let gw = Arc::new(Gateway::new(engine, renderer, store, config)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        use axum::serve::ListenerExt;
        let api = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding --listen {}", args.listen))?;
        let admin = tokio::net::TcpListener::bind(&args.admin_listen)
            .await
            .with_context(|| format!("binding --admin-listen {}", args.admin_listen))?;
        println!(
            "gyre gateway: api http://{} admin http://{}",
            api.local_addr()?,
            admin.local_addr()?
        );
        use std::io::Write as _;
        std::io::stdout().flush().ok();
        let api = api.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let admin = admin.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let a = axum::serve(api, api_router(gw.clone()));
        let b = axum::serve(admin, admin_router(gw.clone(), &token));
        tokio::select! {
            r = a => r.context("API listener")?,
            r = b => r.context("admin listener")?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}
