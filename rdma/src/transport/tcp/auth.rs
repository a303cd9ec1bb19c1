//! Mutual authentication by a per-cluster secret: each side proves it holds
//! the secret by an HMAC-SHA256 over both sides' fresh nonces and its name,
//! so a recorded handshake cannot be replayed and neither side ever sends
//! the secret itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::TransferError;

const MAGIC: &[u8; 5] = b"GYRT\x01";
const NONCE: usize = 32;
const TAG: usize = 32;
const MIN_SECRET: usize = 16;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_NAME: usize = 256;

/// The secret every node of one cluster holds.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

impl ClusterSecret {
    pub fn new(bytes: impl AsRef<[u8]>) -> Result<Self, TransferError> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET {
            return Err(TransferError::WeakSecret {
                len: bytes.len(),
                min: MIN_SECRET,
            });
        }
        Ok(Self(bytes.into()))
    }

    /// A fresh random secret, for a launcher to hand its nodes.
    pub fn generate() -> Self {
        Self(rand::random::<[u8; 32]>().as_slice().into())
    }

    fn tag(&self, role: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(role);
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }
}

fn io(peer: &str, step: &str) -> impl FnOnce(std::io::Error) -> TransferError {
    let context = format!("handshake with {peer}: {step}");
    move |e| TransferError::io(context, e)
}

fn read_name(stream: &mut TcpStream, peer: &str) -> Result<Vec<u8>, TransferError> {
    let mut len = [0u8; 2];
    stream
        .read_exact(&mut len)
        .map_err(io(peer, "reading a name"))?;
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_NAME {
        return Err(TransferError::Handshake {
            peer: peer.into(),
            detail: format!("node name of {len} bytes is longer than {MAX_NAME}"),
        });
    }
    let mut name = vec![0; len];
    stream
        .read_exact(&mut name)
        .map_err(io(peer, "reading a name"))?;
    Ok(name)
}

fn name_frame(name: &str) -> Vec<u8> {
    let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
    let mut out = (name.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(name);
    out
}

/// The accepting side; returns the client's name once it proved the secret.
pub(crate) fn accept(
    stream: &mut TcpStream,
    secret: &ClusterSecret,
    own_name: &str,
    peer: &str,
) -> Result<Arc<str>, TransferError> {
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io(peer, "setting a timeout"))?;
    let server_nonce: [u8; NONCE] = rand::random();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&server_nonce);
    stream
        .write_all(&hello)
        .map_err(io(peer, "sending the challenge"))?;

    let mut client_nonce = [0u8; NONCE];
    stream
        .read_exact(&mut client_nonce)
        .map_err(io(peer, "reading the client nonce"))?;
    let client_name = read_name(stream, peer)?;
    let mut tag = [0u8; TAG];
    stream
        .read_exact(&mut tag)
        .map_err(io(peer, "reading the proof"))?;
    let proof = secret.tag(
        b"gyre-transfer client",
        &[&server_nonce, &client_nonce, &client_name],
    );
    if proof.verify_slice(&tag).is_err() {
        let _ = stream.write_all(&[0]);
        return Err(TransferError::PeerNotAuthenticated { peer: peer.into() });
    }
    let mut reply = vec![1u8];
    reply.extend_from_slice(&name_frame(own_name));
    let own = &reply[3..].to_vec();
    let tag = secret
        .tag(
            b"gyre-transfer server",
            &[&client_nonce, &server_nonce, own],
        )
        .finalize()
        .into_bytes();
    reply.extend_from_slice(&tag);
    stream
        .write_all(&reply)
        .map_err(io(peer, "sending the verdict"))?;
    stream
        .set_read_timeout(None)
        .map_err(io(peer, "clearing the timeout"))?;
    Ok(String::from_utf8_lossy(&client_name).into())
}

/// The connecting side; returns the server's name once it proved the secret.
pub(crate) fn connect(
    stream: &mut TcpStream,
    secret: &ClusterSecret,
    own_name: &str,
    peer: &str,
) -> Result<Arc<str>, TransferError> {
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io(peer, "setting a timeout"))?;
    let mut hello = [0u8; MAGIC.len() + NONCE];
    stream
        .read_exact(&mut hello)
        .map_err(io(peer, "reading the challenge"))?;
    if &hello[..MAGIC.len()] != MAGIC {
        return Err(TransferError::Handshake {
            peer: peer.into(),
            detail: "the peer is not a Gyre transfer engine (bad magic)".into(),
        });
    }
    let server_nonce = &hello[MAGIC.len()..];
    let client_nonce: [u8; NONCE] = rand::random();
    let name = name_frame(own_name);
    let tag = secret
        .tag(
            b"gyre-transfer client",
            &[server_nonce, &client_nonce, &name[2..]],
        )
        .finalize()
        .into_bytes();
    let mut answer = client_nonce.to_vec();
    answer.extend_from_slice(&name);
    answer.extend_from_slice(&tag);
    stream
        .write_all(&answer)
        .map_err(io(peer, "sending the proof"))?;

    let mut verdict = [0u8; 1];
    match stream.read_exact(&mut verdict) {
        Ok(()) if verdict[0] == 1 => {}
        // A refusing server closes right after its verdict byte.
        Ok(()) | Err(_) => return Err(TransferError::AuthRefused { peer: peer.into() }),
    }
    let server_name = read_name(stream, peer)?;
    let mut tag = [0u8; TAG];
    stream
        .read_exact(&mut tag)
        .map_err(io(peer, "reading the server's proof"))?;
    let proof = secret.tag(
        b"gyre-transfer server",
        &[&client_nonce, server_nonce, &server_name],
    );
    if proof.verify_slice(&tag).is_err() {
        return Err(TransferError::PeerNotAuthenticated { peer: peer.into() });
    }
    stream
        .set_read_timeout(None)
        .map_err(io(peer, "clearing the timeout"))?;
    Ok(String::from_utf8_lossy(&server_name).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_secret() {
        assert!(matches!(
            ClusterSecret::new(b"short"),
            Err(TransferError::WeakSecret { len: 5, .. })
        ));
        let s = ClusterSecret::new(b"0123456789abcdef").unwrap();
        assert_eq!(format!("{s:?}"), "ClusterSecret(<redacted>)");
    }
}
