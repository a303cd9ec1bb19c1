//! Sending: a message enters the network model, optionally after a trip
//! through the codec, and is scheduled for arrival (once, twice, or never).

use crate::hosted::{BoxMsg, ErasedMsg};
use crate::id::ActorId;

use super::error::SimFailure;
use super::event::EventKind;
use super::net::Route;
use super::world::Sim;

impl Sim {
    /// Puts a message on the network, now.
    pub(crate) fn send(&mut self, from: ActorId, to: ActorId, msg: BoxMsg) {
        self.stats.sent += 1;
        let msg = if self.cfg.codec_roundtrip {
            match self.roundtrip(to, msg) {
                Ok(msg) => msg,
                Err(failure) => {
                    if self.failure.is_none() {
                        self.failure = Some(self.error(failure));
                    }
                    return;
                }
            }
        } else {
            msg
        };
        match self
            .net
            .route(&self.cfg, &mut self.draw, from.node, to.node, self.now)
        {
            Route::Lost => self.stats.dropped_loss += 1,
            Route::Partitioned => self.stats.dropped_partition += 1,
            Route::Arrive { at, copy } => {
                let copy = copy.and_then(|at| Some((at, self.copy_of(to, &*msg)?)));
                self.agenda.push(at, EventKind::Deliver { from, to, msg });
                if let Some((at, msg)) = copy {
                    self.stats.duplicated += 1;
                    self.agenda.push(at, EventKind::Deliver { from, to, msg });
                }
            }
        }
    }

    /// A second copy of `msg`, made the way the wire would make it; `None`
    /// when the receiver is unknown or the message does not survive the
    /// codec (the original still goes).
    fn copy_of(&self, to: ActorId, msg: &dyn ErasedMsg) -> Option<BoxMsg> {
        let decoder = self.slots.get(&to)?.decoder;
        let bytes = msg.encode().ok()?;
        decoder(msg.tag(), &bytes).ok()
    }

    /// Sends `msg` through the codec as the wire would.
    fn roundtrip(&self, to: ActorId, msg: BoxMsg) -> Result<BoxMsg, SimFailure> {
        let ty = (*msg).type_name();
        let bytes = msg
            .encode()
            .map_err(|source| SimFailure::Codec { ty, to, source })?;
        let Some(slot) = self.slots.get(&to) else {
            // Nobody to decode it: it will be dropped as dead anyway.
            return Ok(msg);
        };
        let back = (slot.decoder)(msg.tag(), &bytes).map_err(|source| SimFailure::Codec {
            ty,
            to,
            source,
        })?;
        if self.cfg.codec_compare_debug {
            let sent = format!("{msg:?}");
            let received = format!("{back:?}");
            if sent != received {
                return Err(SimFailure::Changed {
                    ty,
                    to,
                    sent,
                    received,
                });
            }
        }
        Ok(back)
    }
}
