//! Checkpoints in the safetensors format: one named F32 tensor per
//! parameter, the configuration and policy version in the metadata, so a
//! file is readable by any safetensors tool and loads back bit-exact.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};

use super::config::ModelConfig;
use super::params::{ParamBuffer, ParamLayout};
use crate::error::ModelError;

const CONFIG_KEY: &str = "gyre.model_config";
const VERSION_KEY: &str = "gyre.policy_version";

/// A slice of the flat buffer as one safetensors tensor.
pub(crate) struct F32View<'a> {
    pub(crate) shape: &'a [usize],
    pub(crate) data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            Cow::Borrowed(bytemuck::cast_slice(self.data))
        } else {
            Cow::Owned(self.data.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
    }
    fn data_len(&self) -> usize {
        self.data.len() * 4
    }
}

fn st_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Safetensors(e.to_string())
}

/// The buffer as safetensors bytes.
pub fn to_bytes(cfg: &ModelConfig, params: &ParamBuffer) -> Result<Vec<u8>, ModelError> {
    let layout = ParamLayout::new(cfg)?;
    params.check(&layout)?;
    let views = layout.specs.iter().map(|s| {
        (
            s.name.clone(),
            F32View {
                shape: &s.shape,
                data: &params.data[s.offset..s.offset + s.len],
            },
        )
    });
    let meta = HashMap::from([
        (
            CONFIG_KEY.to_string(),
            serde_json::to_string(cfg).map_err(st_err)?,
        ),
        (VERSION_KEY.to_string(), params.version.to_string()),
    ]);
    safetensors::serialize(views, Some(meta)).map_err(st_err)
}

/// Parses safetensors bytes written by [`to_bytes`] (or by any tool that
/// used the same names, shapes and F32); returns the configuration stored
/// in the metadata and the parameters.
pub fn from_bytes(bytes: &[u8]) -> Result<(ModelConfig, ParamBuffer), ModelError> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(st_err)?;
    let info = meta.metadata().as_ref();
    let cfg_text = info
        .and_then(|m| m.get(CONFIG_KEY))
        .ok_or_else(|| st_err(format!("metadata has no {CONFIG_KEY}")))?;
    let cfg: ModelConfig = serde_json::from_str(cfg_text).map_err(st_err)?;
    let version = match info.and_then(|m| m.get(VERSION_KEY)) {
        Some(v) => v
            .parse()
            .map_err(|_| st_err(format!("{VERSION_KEY} is not an integer: {v}")))?,
        None => 0,
    };
    let layout = ParamLayout::new(&cfg)?;
    let st = SafeTensors::deserialize(bytes).map_err(st_err)?;
    let mut data = vec![0f32; layout.total];
    for s in &layout.specs {
        let t = st.tensor(&s.name).map_err(st_err)?;
        if t.dtype() != Dtype::F32 || t.shape() != s.shape.as_slice() {
            return Err(st_err(format!(
                "{}: expected F32 {:?}, found {:?} {:?}",
                s.name,
                s.shape,
                t.dtype(),
                t.shape()
            )));
        }
        for (o, c) in data[s.offset..s.offset + s.len]
            .iter_mut()
            .zip(t.data().chunks_exact(4))
        {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    Ok((
        cfg,
        ParamBuffer {
            version,
            fingerprint: layout.fingerprint,
            data,
        },
    ))
}

pub fn save(path: &Path, cfg: &ModelConfig, params: &ParamBuffer) -> Result<(), ModelError> {
    let bytes = to_bytes(cfg, params)?;
    std::fs::write(path, bytes).map_err(|e| st_err(format!("writing {}: {e}", path.display())))
}

pub fn load(path: &Path) -> Result<(ModelConfig, ParamBuffer), ModelError> {
    let bytes =
        std::fs::read(path).map_err(|e| st_err(format!("reading {}: {e}", path.display())))?;
    from_bytes(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_and_rejects_garbage() {
        let cfg = ModelConfig::tiny();
        let mut p = ParamBuffer::init(&cfg, 3).unwrap();
        p.version = 9;
        let dir = std::env::temp_dir().join(format!("gyre-gpu-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        save(&path, &cfg, &p).unwrap();
        let (c2, p2) = load(&path).unwrap();
        assert_eq!(c2, cfg);
        assert_eq!(p2, p);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(from_bytes(b"not a safetensors file").is_err());
        let bytes = to_bytes(&cfg, &p).unwrap();
        assert!(from_bytes(&bytes[..bytes.len() / 2]).is_err());
    }
}
