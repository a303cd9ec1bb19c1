//! A request cut into stripes spread over a peer's connections: it
//! completes when its last stripe does, with the first error any stripe met,
//! and a READ's stripes (disjoint slices of one allocation) are rejoined
//! without copying.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;

use super::wire::{ResponseHeader, Status};
use crate::error::RequestError;
use crate::request::{Completer, Transferred};

/// A request cut into stripes, completed when its last stripe is.
pub(super) struct Striped {
    pub peer: Arc<str>,
    pub name: Arc<str>,
    pub offset: u64,
    pub len: u64,
    pub state: Mutex<StripedState>,
}

pub(super) struct StripedState {
    pub pieces: Vec<Option<BytesMut>>,
    pub left: usize,
    pub error: Option<RequestError>,
    pub done: Option<Completer>,
    pub is_read: bool,
}

impl Striped {
    pub fn finish(&self, index: usize, outcome: Result<Option<BytesMut>, RequestError>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(piece) => state.pieces[index] = piece,
            Err(e) => {
                state.error.get_or_insert(e);
            }
        }
        state.left -= 1;
        if state.left > 0 {
            return;
        }
        let Some(done) = state.done.take() else {
            return;
        };
        let result = match state.error.take() {
            Some(e) => Err(e),
            None if state.is_read => {
                let mut pieces = state
                    .pieces
                    .iter_mut()
                    .map(|p| p.take().unwrap_or_default());
                let mut whole = pieces.next().unwrap_or_default();
                for p in pieces {
                    whole.unsplit(p);
                }
                Ok(Transferred {
                    bytes: self.len,
                    data: Some(whole.freeze()),
                })
            }
            None => Ok(Transferred {
                bytes: self.len,
                data: None,
            }),
        };
        drop(state);
        done(result);
    }

    /// Turns a refusal from the server into a status naming this request.
    pub fn refused(&self, h: &ResponseHeader, version: u64) -> RequestError {
        let (peer, name) = (self.peer.to_string(), self.name.to_string());
        match Status::from_u8(h.status) {
            Some(Status::UnknownSegment) => RequestError::UnknownSegment { peer, name },
            Some(Status::StaleVersion) => RequestError::StaleVersion {
                peer,
                name,
                requested: version,
                current: h.a,
            },
            Some(Status::OutOfBounds) => RequestError::OutOfBounds {
                peer,
                name,
                offset: self.offset,
                len: self.len,
                segment_len: h.a,
            },
            Some(Status::ReadOnly) => RequestError::ReadOnly { peer, name },
            _ => RequestError::Protocol {
                peer,
                detail: format!("unexpected status {} for a transfer", h.status),
            },
        }
    }
}
