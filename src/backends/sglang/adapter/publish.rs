//! How a published version reaches the server.
//!
//! `/update_weights_from_tensor` carries Gyre's flat buffer, which only
//! `gyre serve` reads. A real SGLang server reads weights from disk: in
//! [`Publish::Disk`] mode the adapter writes the version as a checkpoint
//! directory on a path the server can read and calls
//! `/update_weights_from_disk` with its `weight_version`. A Llama/Qwen3
//! decoder is written as a Hugging Face directory (`config.json`, F32
//! `model.safetensors`) that SGLang and `gyre serve` both load; Gyre's own
//! model, which SGLang does not know, as its one-file Gyre checkpoint
//! (`model.safetensors` with the configuration in its metadata, no
//! `config.json`). A version is written beside its final name and renamed
//! into place, so a server never reads half a checkpoint; versions older
//! than the one a server just loaded are removed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gyre_actors::sched::ids::Version;
use gyre_gpu::model::hf::{self, HfConfig};
use gyre_gpu::model::{Arch, ModelConfig, ParamBuffer, safetensors_io};

/// The publication mode of an adapter (`tensor` by default).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Publish {
    /// `/update_weights_from_tensor` with Gyre's flat buffer.
    #[default]
    Tensor,
    /// A checkpoint directory under `dir`, then `/update_weights_from_disk`.
    Disk(DiskPublish),
}

#[derive(Clone, Debug, PartialEq)]
pub struct DiskPublish {
    /// Where versions are written, in a subdirectory per engine (`cell0`,
    /// `pool`, …); the server must read the same path.
    pub dir: PathBuf,
    /// The served model (its shape decides the checkpoint format).
    pub model: ModelConfig,
}

/// The directory of `version` under `dir`.
pub fn version_dir(dir: &Path, version: Version) -> PathBuf {
    dir.join(format!("v{version:08}"))
}

static TEMP: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` (a `ParamBuffer::encode` buffer) as `version`'s
/// checkpoint directory under `d.dir`, atomically; a version already
/// there is kept as is.
pub fn write_version(d: &DiskPublish, version: Version, bytes: &[u8]) -> Result<PathBuf, String> {
    let target = version_dir(&d.dir, version);
    if target.is_dir() {
        return Ok(target);
    }
    let mut params = ParamBuffer::decode(bytes).map_err(|e| format!("version {version}: {e}"))?;
    params.version = version;
    std::fs::create_dir_all(&d.dir).map_err(|e| format!("creating {}: {e}", d.dir.display()))?;
    let n = TEMP.fetch_add(1, Ordering::Relaxed);
    let tmp = d
        .dir
        .join(format!(".v{version:08}.tmp-{}-{n}", std::process::id()));
    let written = write_dir(&tmp, &d.model, &params);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &target) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another writer's rename got there first.
        if !target.is_dir() {
            return Err(format!("renaming into {}: {e}", target.display()));
        }
    }
    Ok(target)
}

fn write_dir(tmp: &Path, model: &ModelConfig, params: &ParamBuffer) -> Result<(), String> {
    match &model.arch {
        Arch::Decoder(_) => {
            let config = HfConfig {
                model: model.clone(),
                max_positions: model.context,
                bos_token_id: None,
                eos_token_ids: Vec::new(),
            };
            hf::save(tmp, &config, params, 1).map_err(|e| e.to_string())
        }
        Arch::Gyre => {
            std::fs::create_dir_all(tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
            safetensors_io::save(&tmp.join("model.safetensors"), model, params)
                .map_err(|e| e.to_string())
        }
    }
}

/// Removes the versions under `dir` older than `keep` (a server has
/// loaded `keep`; nobody reads the older ones again).
pub fn prune(dir: &Path, keep: Version) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let older = name
            .to_str()
            .and_then(|n| n.strip_prefix('v'))
            .and_then(|v| v.parse::<Version>().ok())
            .is_some_and(|v| v < keep);
        if older && let Err(err) = std::fs::remove_dir_all(e.path()) {
            tracing::warn!(path = %e.path().display(), error = %err, "could not remove an old version");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gyre-publish-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_version_is_written_whole_reads_back_and_older_ones_go() {
        let model = ModelConfig::tiny();
        let d = DiskPublish {
            dir: tmp("gyre"),
            model: model.clone(),
        };
        let params = ParamBuffer::init(&model, 3).unwrap();
        let one = write_version(&d, 1, &params.encode()).unwrap();
        let two = write_version(&d, 2, &params.encode()).unwrap();
        assert_eq!(write_version(&d, 2, &[]).unwrap(), two, "kept as is");
        let (m, p) = safetensors_io::load(&one.join("model.safetensors")).unwrap();
        assert_eq!((m, p.version), (model, 1));
        assert_eq!(p.data, params.data);
        // Nothing half-written is left beside the versions.
        let names: Vec<String> = std::fs::read_dir(&d.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.starts_with('v')), "{names:?}");
        prune(&d.dir, 2);
        assert!(!one.exists() && two.exists());
        let bad = write_version(&d, 3, b"not a buffer").unwrap_err();
        assert!(bad.contains("version 3"), "{bad}");
        assert!(!version_dir(&d.dir, 3).exists());
        let _ = std::fs::remove_dir_all(&d.dir);
    }
}
