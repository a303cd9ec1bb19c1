//! What `gyre serve` serves: the `--model` TOML file (a Hugging Face
//! checkpoint directory, a Gyre checkpoint file, or fresh weights of Gyre's
//! own model) and the engine's sizes, loaded into an [`Engine`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gyre_gpu::engine::{Engine, EngineConfig};
use gyre_gpu::model::hf::{self, LoadOptions};
use gyre_gpu::model::{Arch, ModelConfig, ParamBuffer, safetensors_io};
use serde::{Deserialize, Serialize};

/// The `--model` file. Paths are relative to the file's directory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// A Hugging Face checkpoint directory (`LlamaForCausalLM`,
    /// `Qwen3ForCausalLM`).
    pub checkpoint: Option<PathBuf>,
    /// A Gyre safetensors checkpoint (one file, its configuration inside).
    pub gyre_checkpoint: Option<PathBuf>,
    /// Gyre's model shape for fresh weights when no checkpoint is named
    /// (default: `ModelConfig::default()`).
    pub gyre_model: Option<ModelConfig>,
    /// Seed of fresh weights.
    #[serde(default)]
    pub seed: u64,
    /// Caps a checkpoint's context (default 4096; KV blocks are reserved
    /// per request for prompt plus output).
    pub max_context: Option<usize>,
    /// Memory for the KV cache when `kv_blocks` is not given (default
    /// 2048 MiB, or less when `max_running` full-context requests need less).
    pub kv_cache_mib: Option<usize>,
    /// Requests decoding at once (default 32).
    pub max_running: Option<usize>,
    /// KV blocks (default: room for `max_running` full-context requests).
    pub kv_blocks: Option<usize>,
    pub block_size: Option<usize>,
    /// Tokens per engine iteration.
    pub max_batch_tokens: Option<usize>,
    /// The name `/get_model_info` reports.
    pub served_model_name: Option<String>,
}

/// A loaded model, ready to serve.
pub struct Loaded {
    pub engine: Engine,
    pub model_path: String,
    pub served_model_name: String,
    pub model: ModelConfig,
    /// Stop tokens added to every request unless it sets `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    pub max_context: Option<usize>,
}

impl ServeConfig {
    pub fn read(path: &Path) -> Result<ServeConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading model config {}", path.display()))?;
        let mut cfg: ServeConfig =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [&mut cfg.checkpoint, &mut cfg.gyre_checkpoint]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(cfg)
    }

    /// Loads the weights and builds the engine.
    pub fn load(&self) -> Result<Loaded> {
        let (model, params, eos, model_path) = match (&self.checkpoint, &self.gyre_checkpoint) {
            (Some(_), Some(_)) => bail!("name either checkpoint or gyre_checkpoint, not both"),
            (Some(dir), None) => {
                let ck = hf::load(
                    dir,
                    &LoadOptions {
                        max_context: Some(self.max_context.unwrap_or(DEFAULT_CHECKPOINT_CONTEXT)),
                    },
                )
                .with_context(|| format!("loading checkpoint {}", dir.display()))?;
                let model = ck.config.model.clone();
                (
                    model,
                    ck.params,
                    ck.eos_token_ids,
                    dir.display().to_string(),
                )
            }
            (None, Some(file)) => {
                let (model, params) = safetensors_io::load(file)
                    .with_context(|| format!("loading {}", file.display()))?;
                (model, params, gyre_eos(), file.display().to_string())
            }
            (None, None) => {
                let model = self.gyre_model.clone().unwrap_or_default();
                let params = ParamBuffer::init(&model, self.seed)
                    .context("initialising the default model")?;
                (model, params, gyre_eos(), "gyre-default".to_string())
            }
        };
        let running = self.max_running.unwrap_or(32).max(1);
        let mut ec = EngineConfig::for_model(model.clone(), running);
        if let Some(b) = self.block_size {
            ec.block_size = b;
            ec.kv_blocks = running * model.context.div_ceil(b.max(1));
        }
        let block_bytes = ec.geometry().block_floats() * 4;
        let budget = self.kv_cache_mib.unwrap_or(2048) << 20;
        // At least one full-context request fits, whatever the budget.
        let one = ec.geometry().blocks_for(model.context);
        ec.kv_blocks = ec.kv_blocks.min(budget / block_bytes.max(1)).max(one);
        if let Some(k) = self.kv_blocks {
            ec.kv_blocks = k;
        }
        if let Some(t) = self.max_batch_tokens {
            ec.max_batch_tokens = t;
        }
        let engine = Engine::new(ec, &params).context("building the engine")?;
        let served_model_name = self
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_path.clone());
        Ok(Loaded {
            engine,
            model_path,
            served_model_name,
            model,
            eos_token_ids: eos,
            max_context: Some(self.max_context.unwrap_or(DEFAULT_CHECKPOINT_CONTEXT)),
        })
    }
}

/// A checkpoint's context unless `max_context` says otherwise: Qwen3
/// declares 40 960 positions, which would reserve KV blocks for 40 K tokens
/// per request.
const DEFAULT_CHECKPOINT_CONTEXT: usize = 4096;

/// Gyre's byte model ends a turn with `<|end|>` or `<|eos|>`.
fn gyre_eos() -> Vec<u32> {
    use gyre_gpu::model::vocab::Special;
    vec![Special::EndTurn.id(), Special::Eos.id()]
}

/// Reads weights for `/update_weights_from_disk`: a Hugging Face
/// checkpoint directory (with config.json), a Gyre safetensors file, or a
/// directory holding one as `model.safetensors` (no config.json: what an
/// adapter publishing Gyre's own model writes), of the served model's
/// shape.
pub fn read_params(
    path: &Path,
    serving: &ModelConfig,
    max_context: Option<usize>,
) -> Result<ParamBuffer, String> {
    let gyre_dir = path.join("model.safetensors");
    let (model, params) = if path.is_dir() && !path.join("config.json").exists() {
        safetensors_io::load(&gyre_dir).map_err(|e| e.to_string())?
    } else if path.is_dir() {
        let ck = hf::load(path, &LoadOptions { max_context }).map_err(|e| e.to_string())?;
        (ck.config.model, ck.params)
    } else {
        safetensors_io::load(path).map_err(|e| e.to_string())?
    };
    if &model != serving {
        let what = |m: &ModelConfig| match &m.arch {
            Arch::Gyre => format!("gyre {}x{}", m.layers, m.width),
            Arch::Decoder(d) => format!("{} {}x{}", d.family.name(), m.layers, m.width),
        };
        return Err(format!(
            "{} holds a {} model, this server serves {}",
            path.display(),
            what(&model),
            what(serving)
        ));
    }
    Ok(params)
}
