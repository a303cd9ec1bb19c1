//! The engine's lifecycle outside of serving: release and resume of memory
//! by tag (SGLang's `release_memory_occupation` / `resume_memory_occupation`),
//! weight updates from a flat buffer, health and load.

use super::{Engine, EngineError};
use crate::memory::{Keep, MemoryReport, Tag};
use crate::model::{ParamBuffer, Weights};

/// The engine's two memory tags, by SGLang's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemTag {
    Weights,
    KvCache,
}

impl MemTag {
    pub fn parse(s: &str) -> Result<MemTag, EngineError> {
        match s {
            "weights" => Ok(MemTag::Weights),
            "kv_cache" => Ok(MemTag::KvCache),
            _ => Err(EngineError::BadTag(s.to_string())),
        }
    }

    fn tag(self) -> Tag {
        match self {
            MemTag::Weights => Tag::RolloutWeights,
            MemTag::KvCache => Tag::KvCache,
        }
    }
}

/// Whether the engine can serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub serving: bool,
    pub weights_resident: bool,
    pub kv_resident: bool,
    pub version: u64,
}

/// How busy the engine is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Blocks kept alive by pins (migration in progress).
    pub kv_blocks_pinned: usize,
    pub pins: usize,
    /// Output tokens sampled since start.
    pub generated: u64,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub prefix_reused: u64,
    /// Prompt tokens computed at admission.
    pub prefilled: u64,
    /// Finished requests kept in the prefix cache.
    pub prefix_entries: usize,
}

impl Engine {
    fn idle_or_busy(&self) -> Result<(), EngineError> {
        if self.is_idle() {
            Ok(())
        } else {
            Err(EngineError::Busy {
                running: self.running.len(),
                waiting: self.waiting.len(),
            })
        }
    }

    /// Frees the memory of the given tags. Weights go to a host backup
    /// (resume restores them bit-exact); the KV cache is dropped. Only an
    /// idle engine releases, and the KV cache only with no pins held.
    pub fn release_memory(&mut self, tags: &[MemTag]) -> Result<u64, EngineError> {
        self.idle_or_busy()?;
        if tags.contains(&MemTag::KvCache) && !self.pins.is_empty() {
            return Err(EngineError::PinsHeld(self.pins.len()));
        }
        if tags.contains(&MemTag::KvCache) {
            self.clear_prefixes();
        }
        let mut freed = 0;
        for &t in tags {
            if !self.memory.is_resident(t.tag()) {
                continue;
            }
            let keep = match t {
                MemTag::Weights => Keep::Backup,
                MemTag::KvCache => Keep::Discard,
            };
            freed += self.memory.release(t.tag(), keep)?;
            if t == MemTag::Weights {
                self.weights = None;
            }
        }
        Ok(freed)
    }

    /// Brings released tags back; with both resident the engine serves.
    pub fn resume_memory(&mut self, tags: &[MemTag]) -> Result<(), EngineError> {
        for &t in tags {
            if self.memory.is_resident(t.tag()) {
                continue;
            }
            self.memory.restore(t.tag())?;
            if t == MemTag::Weights {
                let data = self.memory.host(Tag::RolloutWeights)?;
                self.weights = Some(Weights::from_flat(&self.cfg.model, data)?);
            }
        }
        Ok(())
    }

    /// Serves `params` from now on. Requests in flight keep their tokens
    /// and recompute their cache under the new weights, so every sampled
    /// token's log-prob is exact under the weights that sampled it.
    pub fn update_weights(&mut self, params: &ParamBuffer) -> Result<(), EngineError> {
        params.check(&self.layout)?;
        params.check_finite()?;
        if !self.pins.is_empty() {
            return Err(EngineError::PinsHeld(self.pins.len()));
        }
        self.memory.write(Tag::RolloutWeights, 0, &params.data)?;
        self.weights = Some(Weights::from_flat(&self.cfg.model, &params.data)?);
        self.version = params.version;
        self.clear_prefixes();
        for seq in self.running.values_mut() {
            seq.cached = 0;
        }
        tracing::debug!(version = params.version, "weights updated");
        Ok(())
    }

    /// [`Engine::update_weights`] from the bytes of a publication.
    pub fn update_weights_from_bytes(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        let params = ParamBuffer::decode(bytes)?;
        self.update_weights(&params)
    }

    /// The serving weights as a flat buffer (for checks and migration).
    pub fn export_weights(&mut self) -> Result<ParamBuffer, EngineError> {
        Ok(ParamBuffer {
            version: self.version,
            fingerprint: self.layout.fingerprint,
            data: self.memory.read_all(Tag::RolloutWeights)?,
        })
    }

    pub fn health(&self) -> Health {
        let weights_resident = self.weights.is_some();
        let kv_resident = self.memory.is_resident(Tag::KvCache);
        Health {
            serving: weights_resident && kv_resident,
            weights_resident,
            kv_resident,
            version: self.version,
        }
    }

    pub fn load(&self) -> Load {
        Load {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_blocks_used: self.pool.total() - self.pool.free_count(),
            kv_blocks_total: self.pool.total(),
            kv_blocks_pinned: self.pins.values().map(|p| p.blocks.len()).sum(),
            pins: self.pins.len(),
            generated: self.generated,
            prefix_reused: self.prefix_reused,
            prefilled: self.prefilled,
            prefix_entries: self.prefixes.len(),
        }
    }

    pub fn memory_report(&self) -> MemoryReport {
        self.memory.report()
    }
}
