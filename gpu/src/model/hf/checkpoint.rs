//! Loading and saving a Hugging Face checkpoint directory as Gyre's flat
//! buffer. Every tensor the layout names must be in the shards with its
//! exact shape (a missing or misshapen one is refused, named); the shards'
//! other tensors (rotary caches, a tied checkpoint's duplicate head) are
//! ignored. BF16 and F16 widen to F32 exactly; Gyre writes F32, so saving
//! and loading again is bit-exact.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::{Value, json};

use super::config::{HfConfig, parse_config, to_json, token_ids};
use crate::error::ModelError;
use crate::model::params::{ParamBuffer, ParamLayout, ParamSpec};
use crate::model::safetensors_io::F32View;

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
const VERSION_KEY: &str = "gyre.policy_version";

/// A loaded checkpoint: the model, its parameters, and what serving it
/// needs besides (stop tokens, tokenizer, chat template).
#[derive(Clone, Debug)]
pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub config: HfConfig,
    pub params: ParamBuffer,
    /// `config.json`'s and `generation_config.json`'s `eos_token_id`s.
    pub eos_token_ids: Vec<u32>,
    /// `tokenizer.json`, when the directory has one.
    pub tokenizer: Option<PathBuf>,
    pub chat_template: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Caps the context below `max_position_embeddings`.
    pub max_context: Option<usize>,
}

fn bad(m: String) -> ModelError {
    ModelError::Checkpoint(m)
}

fn read(path: &Path) -> Result<Vec<u8>, ModelError> {
    std::fs::read(path).map_err(|e| bad(format!("reading {}: {e}", path.display())))
}

fn read_text(path: &Path) -> Result<Option<String>, ModelError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(format!("reading {}: {e}", path.display()))),
    }
}

/// The shard files, in order, with the tensors each holds (from the index)
/// or one `model.safetensors`.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    if let Some(text) = read_text(&dir.join(INDEX))? {
        let v: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("{INDEX} is not JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("{INDEX} has no weight_map")))?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        files.sort();
        files.dedup();
        if files.iter().any(|f| f.contains('/') || f.contains("..")) {
            return Err(bad(format!("{INDEX} names a shard outside the directory")));
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join(SINGLE);
    if single.exists() {
        Ok(vec![single])
    } else {
        Err(bad(format!(
            "{} has neither {INDEX} nor {SINGLE}",
            dir.display()
        )))
    }
}

fn widen(dtype: Dtype, bytes: &[u8], out: &mut [f32]) -> Result<(), ModelError> {
    match dtype {
        Dtype::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        other => return Err(bad(format!("unsupported tensor dtype {other:?}"))),
    }
    Ok(())
}

/// Reads a checkpoint directory.
pub fn load(dir: &Path, opts: &LoadOptions) -> Result<HfCheckpoint, ModelError> {
    let cfg_text = read_text(&dir.join("config.json"))?
        .ok_or_else(|| bad(format!("{} has no config.json", dir.display())))?;
    let config = parse_config(&cfg_text, opts.max_context)?;
    let layout = ParamLayout::new(&config.model)?;
    let wanted: HashMap<&str, &ParamSpec> =
        layout.specs.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut data = vec![0f32; layout.total];
    let mut filled = vec![false; layout.specs.len()];
    let index: HashMap<&str, usize> = layout
        .specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut version = 0;
    for file in shard_files(dir)? {
        let bytes = read(&file)?;
        let name_of = file.display();
        let (_, meta) =
            SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{name_of}: {e}")))?;
        if let Some(v) = meta.metadata().as_ref().and_then(|m| m.get(VERSION_KEY)) {
            version = v
                .parse()
                .map_err(|_| bad(format!("{name_of}: {VERSION_KEY} is not an integer: {v}")))?;
        }
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{name_of}: {e}")))?;
        for (name, t) in st.tensors() {
            let Some(spec) = wanted.get(name.as_str()) else {
                tracing::debug!(tensor = %name, "checkpoint tensor not used by the model");
                continue;
            };
            if t.shape() != spec.shape.as_slice() {
                return Err(bad(format!(
                    "tensor {name} has shape {:?}, the configuration needs {:?}",
                    t.shape(),
                    spec.shape
                )));
            }
            widen(
                t.dtype(),
                t.data(),
                &mut data[spec.offset..spec.offset + spec.len],
            )
            .map_err(|e| bad(format!("tensor {name}: {e}")))?;
            filled[index[name.as_str()]] = true;
        }
    }
    if let Some(i) = filled.iter().position(|f| !f) {
        return Err(bad(format!(
            "{} lacks tensor {}",
            dir.display(),
            layout.specs[i].name
        )));
    }
    let params = ParamBuffer {
        version,
        fingerprint: layout.fingerprint,
        data,
    };
    params.check_finite()?;
    let mut eos = config.eos_token_ids.clone();
    if let Some(text) = read_text(&dir.join("generation_config.json"))? {
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad(format!("generation_config.json is not JSON: {e}")))?;
        for id in token_ids(v.get("eos_token_id")) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let tokenizer = Some(dir.join("tokenizer.json")).filter(|p| p.exists());
    Ok(HfCheckpoint {
        dir: dir.to_path_buf(),
        chat_template: chat_template(dir)?,
        config,
        params,
        eos_token_ids: eos,
        tokenizer,
    })
}

/// `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or a list of named templates of which `default` is taken).
fn chat_template(dir: &Path) -> Result<Option<String>, ModelError> {
    if let Some(t) = read_text(&dir.join("chat_template.jinja"))? {
        return Ok(Some(t));
    }
    let Some(text) = read_text(&dir.join("tokenizer_config.json"))? else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("tokenizer_config.json is not JSON: {e}")))?;
    Ok(match v.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    })
}

/// Writes `params` as a checkpoint directory: `config.json` and F32
/// safetensors, split into `shards` files with an index when more than
/// one (the layout's tensors in order, about equal bytes per shard). The
/// policy version goes into each shard's metadata.
pub fn save(
    dir: &Path,
    config: &HfConfig,
    params: &ParamBuffer,
    shards: usize,
) -> Result<(), ModelError> {
    let layout = ParamLayout::new(&config.model)?;
    params.check(&layout)?;
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("creating {}: {e}", dir.display())))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| bad(format!("writing {}: {e}", p.display())))
    };
    write("config.json", to_json(config)?.as_bytes())?;
    let shards = shards.clamp(1, layout.specs.len());
    let per = layout.total.div_ceil(shards);
    let mut groups: Vec<Vec<&ParamSpec>> = vec![Vec::new(); shards];
    for s in &layout.specs {
        groups[(s.offset / per).min(shards - 1)].push(s);
    }
    groups.retain(|g| !g.is_empty());
    let n = groups.len();
    let meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (VERSION_KEY.to_string(), params.version.to_string()),
    ]);
    let mut weight_map = BTreeMap::new();
    for (i, g) in groups.iter().enumerate() {
        let file = if n == 1 {
            SINGLE.to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let views = g.iter().map(|s| {
            weight_map.insert(s.name.clone(), file.clone());
            (
                s.name.clone(),
                F32View {
                    shape: &s.shape,
                    data: &params.data[s.offset..s.offset + s.len],
                },
            )
        });
        let bytes = safetensors::serialize(views.collect::<Vec<_>>(), Some(meta.clone()))
            .map_err(|e| bad(e.to_string()))?;
        write(&file, &bytes)?;
    }
    if n > 1 {
        let index = json!({
            "metadata": {"total_size": layout.bytes()},
            "weight_map": weight_map,
        });
        write(INDEX, index.to_string().as_bytes())?;
    }
    Ok(())
}
