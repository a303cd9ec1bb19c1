//! KV migration (SPEC 2.5 step 4): the source pins a request's blocks
//! before cancelling it, the destination imports a snapshot of them and
//! continues the request without recomputing the prefix, and the source
//! drops the pin when the destination acknowledges.

use super::kv::{KvSnapshot, Rows};
use super::request::{ReqId, Request};
use super::{Engine, EngineError};
use crate::memory::Tag;

/// A pin on the cached prefix of a request.
pub type PinId = u64;

#[derive(Debug)]
pub(super) struct Pin {
    pub(super) blocks: Vec<u32>,
    tokens: Vec<u32>,
    version: u64,
}

impl Engine {
    /// Pins the blocks that hold a running request's cached prefix: they
    /// stay valid after the request is aborted, until [`Engine::release_pin`].
    pub fn pin_kv(&mut self, id: ReqId) -> Result<PinId, EngineError> {
        let seq = self.running.get(&id).ok_or(EngineError::Unknown(id))?;
        let geo = self.cfg.geometry();
        let blocks = seq.blocks[..geo.blocks_for(seq.cached)].to_vec();
        let pin = Pin {
            tokens: seq.tokens[..seq.cached].to_vec(),
            blocks,
            version: self.version,
        };
        self.pool.retain(&pin.blocks);
        let pid = self.next_pin;
        self.next_pin += 1;
        self.pins.insert(pid, pin);
        Ok(pid)
    }

    /// The pinned prefix's keys and values, for the transfer engine.
    pub fn export_pinned(&self, pin: PinId) -> Result<KvSnapshot, EngineError> {
        let p = self.pins.get(&pin).ok_or(EngineError::UnknownPin(pin))?;
        let geo = self.cfg.geometry();
        let region = self.memory.host(Tag::KvCache)?;
        let n = p.tokens.len();
        let mut data = vec![0.0; geo.layers * 2 * n * geo.width];
        for layer in 0..geo.layers {
            for kv in 0..2 {
                let at = (layer * 2 + kv) * n * geo.width;
                geo.read_rows(
                    region,
                    &p.blocks,
                    Rows::new(layer, kv, 0, n),
                    &mut data[at..at + n * geo.width],
                );
            }
        }
        Ok(KvSnapshot {
            fingerprint: self.layout.fingerprint,
            version: p.version,
            layers: geo.layers,
            width: geo.width,
            tokens: p.tokens.clone(),
            data,
        })
    }

    /// Drops a pin; blocks nobody else holds are freed.
    pub fn release_pin(&mut self, pin: PinId) -> Result<(), EngineError> {
        let p = self.pins.remove(&pin).ok_or(EngineError::UnknownPin(pin))?;
        self.pool.release(&p.blocks);
        Ok(())
    }

    /// Queues a request whose prompt starts with the snapshot's tokens;
    /// at admission the snapshot's keys and values fill its first blocks
    /// and only the rest of the prompt is computed.
    pub fn submit_with_kv(&mut self, req: Request, snap: KvSnapshot) -> Result<ReqId, EngineError> {
        let geo = self.cfg.geometry();
        let mismatch = |m: String| Err(EngineError::KvMismatch(m));
        if snap.fingerprint != self.layout.fingerprint
            || snap.layers != geo.layers
            || snap.width != geo.width
        {
            return mismatch("computed by a different model".into());
        }
        if snap.version != self.version {
            return mismatch(format!(
                "computed under weights v{}, this engine serves v{}",
                snap.version, self.version
            ));
        }
        if snap.data.len() != geo.layers * 2 * snap.tokens.len() * geo.width {
            return mismatch("data length does not match its tokens".into());
        }
        if !req.prompt.starts_with(&snap.tokens) {
            return mismatch("the prompt does not start with the snapshot's tokens".into());
        }
        self.enqueue(req, Some(snap))
    }
}
