//! The per-cluster secret that lets a node join: with one configured, a
//! connection is only handshaken once both ends proved they hold it.
//!
//! The acceptor challenges the dialer's hello with a fresh nonce; the dialer
//! answers its own nonce and an HMAC-SHA256 over both nonces and both node
//! ids; the acceptor checks it and proves itself the same way before its
//! `HelloAck`. The secret never crosses the wire, a recorded exchange cannot
//! be replayed (the nonces are fresh), and a node without the secret gets
//! no further than its hello: it can neither join nor inject frames.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::RuntimeError;
use crate::id::NodeId;

pub(crate) const NONCE: usize = 32;
const MIN_SECRET: usize = 16;

/// The secret every node of one cluster holds (at least 16 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct LinkSecret(Arc<[u8]>);

impl std::fmt::Debug for LinkSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkSecret(<redacted>)")
    }
}

/// Which side a proof is for, so one side's tag never verifies as the other's.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Dialer,
    Acceptor,
}

impl LinkSecret {
    pub fn new(bytes: impl AsRef<[u8]>) -> Result<Self, RuntimeError> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET {
            return Err(RuntimeError::Config(format!(
                "a cluster secret needs at least {MIN_SECRET} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Self(bytes.into()))
    }

    fn mac(
        &self,
        side: Side,
        acceptor_nonce: &[u8],
        dialer_nonce: &[u8],
        dialer: NodeId,
        acceptor: NodeId,
    ) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(match side {
            Side::Dialer => b"gyre-live dialer  ",
            Side::Acceptor => b"gyre-live acceptor",
        });
        mac.update(acceptor_nonce);
        mac.update(dialer_nonce);
        mac.update(&dialer.0.to_le_bytes());
        mac.update(&acceptor.0.to_le_bytes());
        mac
    }

    /// The tag `side` sends for this exchange.
    pub(crate) fn prove(
        &self,
        side: Side,
        nonces: (&[u8; NONCE], &[u8; NONCE]),
        dialer: NodeId,
        acceptor: NodeId,
    ) -> [u8; 32] {
        self.mac(side, nonces.0, nonces.1, dialer, acceptor)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks the other side's tag, in constant time.
    pub(crate) fn verify(
        &self,
        side: Side,
        nonces: (&[u8; NONCE], &[u8; NONCE]),
        dialer: NodeId,
        acceptor: NodeId,
        tag: &[u8; 32],
    ) -> bool {
        self.mac(side, nonces.0, nonces.1, dialer, acceptor)
            .verify_slice(tag)
            .is_ok()
    }
}

pub(crate) fn nonce() -> [u8; NONCE] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_verifies_only_for_its_side_nonces_nodes_and_secret() {
        let s = LinkSecret::new([7u8; 16]).unwrap();
        let (a, d) = (nonce(), nonce());
        let tag = s.prove(Side::Dialer, (&a, &d), NodeId(1), NodeId(0));
        assert!(s.verify(Side::Dialer, (&a, &d), NodeId(1), NodeId(0), &tag));
        assert!(!s.verify(Side::Acceptor, (&a, &d), NodeId(1), NodeId(0), &tag));
        assert!(!s.verify(Side::Dialer, (&d, &a), NodeId(1), NodeId(0), &tag));
        assert!(!s.verify(Side::Dialer, (&a, &d), NodeId(2), NodeId(0), &tag));
        let other = LinkSecret::new([8u8; 16]).unwrap();
        assert!(!other.verify(Side::Dialer, (&a, &d), NodeId(1), NodeId(0), &tag));
        assert!(LinkSecret::new([1u8; 15]).is_err());
        assert_eq!(format!("{s:?}"), "LinkSecret(<redacted>)");
    }
}
