//! The prefix cache: keys and values of finished requests kept, keyed by
//! their tokens, so a later request that starts with the same tokens (the
//! next turn of a conversation: its previous prompt, the reply, then what
//! is new) prefills only what differs.
//!
//! A finished request's cached rows stay in its blocks as an entry (the
//! most recent entries, up to [`EngineConfig::prefix_cache`]; an entry a
//! newer one extends is dropped). A request admitted with a common prefix
//! of `n` tokens with an entry of the serving version shares the entry's
//! full blocks (reference-counted, never written again: a sequence writes
//! only at positions at or past its cached length) and gets a private copy
//! of the partial block, so entries, pins and running requests never see
//! each other's writes. Entries are evicted oldest first when admission
//! needs their blocks, and dropped when the weights change or the KV cache
//! is released. The last sampled token of a finished request was never fed
//! to the model, so a next turn computes it with its new suffix.
//!
//! [`EngineConfig::prefix_cache`]: super::EngineConfig::prefix_cache

use super::{Engine, EngineError, Seq};
use crate::memory::Tag;

/// The cached rows of one finished request.
#[derive(Debug)]
pub(super) struct CachedPrefix {
    id: u64,
    tokens: Vec<u32>,
    /// Blocks holding rows `0..tokens.len()`; one reference is the cache's.
    blocks: Vec<u32>,
    version: u64,
}

/// A cache hit for a request about to be admitted.
struct Hit {
    entry: usize,
    id: u64,
    /// Tokens whose rows the request takes from the entry.
    tokens: usize,
}

impl Engine {
    /// The entry sharing the longest prefix with `tokens`, leaving at least
    /// the last token to compute (its logits start decoding).
    fn lookup(&self, tokens: &[u32]) -> Option<Hit> {
        let limit = tokens.len().saturating_sub(1);
        self.prefixes
            .iter()
            .enumerate()
            .filter(|(_, e)| e.version == self.version)
            .map(|(i, e)| {
                let n = e
                    .tokens
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                (i, n.min(limit))
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, i))
            .map(|(entry, tokens)| Hit {
                entry,
                id: self.prefixes[entry].id,
                tokens,
            })
    }

    /// Drops the oldest entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        if self.prefixes.is_empty() {
            return false;
        }
        let e = self.prefixes.remove(0);
        self.pool.release(&e.blocks);
        true
    }

    /// Drops every entry (weights changed, or the KV cache goes away).
    pub(super) fn clear_prefixes(&mut self) {
        while self.evict_oldest() {}
    }

    /// Blocks for `seq` (`need` in all), its leading rows taken from the
    /// cache where it can; evicts entries when memory is short. `None`
    /// when the blocks cannot be had even with the cache empty.
    pub(super) fn blocks_with_prefix(
        &mut self,
        seq: &mut Seq,
        need: usize,
    ) -> Result<Option<Vec<u32>>, EngineError> {
        let hit = if self.cfg.prefix_cache > 0 && seq.import.is_none() {
            self.lookup(&seq.tokens)
        } else {
            None
        };
        let bs = self.cfg.block_size;
        let (shared, partial, take) = match &hit {
            Some(h) => {
                let e = &self.prefixes[h.entry];
                let full = h.tokens / bs;
                let partial = (h.tokens % bs != 0).then(|| e.blocks[full]);
                (e.blocks[..full].to_vec(), partial, h.tokens)
            }
            None => (Vec::new(), None, 0),
        };
        // Hold what is taken before evicting: the hit may be evicted too.
        self.pool.retain(&shared);
        if let Some(p) = partial {
            self.pool.retain(&[p]);
        }
        let fresh = loop {
            if let Some(b) = self.pool.allocate(need - shared.len()) {
                break Some(b);
            }
            if !self.evict_oldest() {
                break None;
            }
        };
        let Some(fresh) = fresh else {
            self.pool.release(&shared);
            if let Some(p) = partial {
                self.pool.release(&[p]);
            }
            return Ok(None);
        };
        if let Some(src) = partial {
            let geo = self.cfg.geometry();
            let region = self.memory.host_mut(Tag::KvCache)?;
            let rows = take % bs;
            for layer in 0..geo.layers {
                for kv in 0..2 {
                    let from = geo.offset(src, layer, kv, 0);
                    let to = geo.offset(fresh[0], layer, kv, 0);
                    region.copy_within(from..from + rows * geo.width, to);
                }
            }
            self.pool.release(&[src]);
        }
        if let Some(h) = hit {
            // Most recently used last; it may have been evicted meanwhile.
            if let Some(at) = self.prefixes.iter().position(|e| e.id == h.id) {
                let e = self.prefixes.remove(at);
                self.prefixes.push(e);
            }
        }
        seq.cached = take;
        self.prefix_reused += take as u64;
        let mut blocks = shared;
        blocks.extend(fresh);
        Ok(Some(blocks))
    }

    /// Frees a finished request's blocks, keeping its cached rows as an
    /// entry when the cache is on.
    pub(super) fn retire(&mut self, seq: &Seq) {
        let geo = self.cfg.geometry();
        if self.cfg.prefix_cache == 0 || seq.cached == 0 || !self.memory.is_resident(Tag::KvCache) {
            self.pool.release(&seq.blocks);
            return;
        }
        let keep = geo.blocks_for(seq.cached).min(seq.blocks.len());
        self.pool.release(&seq.blocks[keep..]);
        self.next_prefix += 1;
        let entry = CachedPrefix {
            id: self.next_prefix,
            tokens: seq.tokens[..seq.cached].to_vec(),
            blocks: seq.blocks[..keep].to_vec(),
            version: self.version,
        };
        let mut i = 0;
        while i < self.prefixes.len() {
            let old = &self.prefixes[i];
            if old.version != self.version || entry.tokens.starts_with(&old.tokens) {
                let old = self.prefixes.remove(i);
                self.pool.release(&old.blocks);
            } else {
                i += 1;
            }
        }
        self.prefixes.push(entry);
        while self.prefixes.len() > self.cfg.prefix_cache {
            self.evict_oldest();
        }
    }

    /// Rows of `tokens` kept by the cache (for tests and metrics).
    pub fn cached_prefix_len(&self, tokens: &[u32]) -> usize {
        self.lookup(tokens).map_or(0, |h| h.tokens)
    }
}
