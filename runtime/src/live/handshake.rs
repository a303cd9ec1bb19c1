//! The first exchange on every connection: who is speaking, and in which
//! version of the protocol.
//!
//! The dialer sends `Hello`; the acceptor checks the magic, the version and
//! the node id, and answers `HelloAck`. On a version mismatch the acceptor
//! still answers with its own version before closing, so both ends log the
//! two versions. Nothing but a hello is accepted first, and a peer that says
//! nothing within the timeout is dropped. With a cluster secret, the
//! acceptor challenges the hello and both sides prove the secret (see
//! `auth`) before the `HelloAck`; either side without it is refused.

use std::time::Duration;

use futures::{SinkExt, StreamExt};

use crate::PROTOCOL_VERSION;
use crate::id::NodeId;

use super::auth::{LinkSecret, NONCE, Side, nonce};
use super::error::ConnError;
use super::frame::{MAGIC, WireFrame};
use super::peer::{Reader, Writer};

fn hello(node: NodeId) -> WireFrame {
    WireFrame::Hello {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        node,
    }
}

fn hello_ack(node: NodeId) -> WireFrame {
    WireFrame::HelloAck {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        node,
    }
}

async fn send(writer: &mut Writer, frame: &WireFrame) -> Result<(), ConnError> {
    let bytes = frame.encode().map_err(ConnError::Decode)?;
    writer.send(bytes).await?;
    Ok(())
}

async fn first_frame(reader: &mut Reader, timeout: Duration) -> Result<WireFrame, ConnError> {
    match tokio::time::timeout(timeout, reader.next()).await {
        Err(_) => Err(ConnError::HandshakeTimeout(timeout)),
        Ok(None) => Err(ConnError::ClosedInHandshake),
        Ok(Some(Err(err))) => Err(err.into()),
        Ok(Some(Ok(bytes))) => WireFrame::decode(&bytes).map_err(ConnError::Decode),
    }
}

fn check(magic: u32, version: u32) -> Result<(), ConnError> {
    if magic != MAGIC {
        return Err(ConnError::Magic { got: magic });
    }
    if version != PROTOCOL_VERSION {
        return Err(ConnError::Version {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    Ok(())
}

/// The dialer's side: succeeds once `expect` has acknowledged us.
pub(crate) async fn dial(
    reader: &mut Reader,
    writer: &mut Writer,
    me: NodeId,
    expect: NodeId,
    timeout: Duration,
    secret: Option<&LinkSecret>,
) -> Result<(), ConnError> {
    send(writer, &hello(me)).await?;
    let mut answer = first_frame(reader, timeout).await?;
    match (secret, &answer) {
        (Some(secret), WireFrame::AuthChallenge { nonce: theirs }) => {
            let ours = nonce();
            let theirs = *theirs;
            let tag = secret.prove(Side::Dialer, (&theirs, &ours), me, expect);
            send(writer, &WireFrame::AuthProof { nonce: ours, tag }).await?;
            match first_frame(reader, timeout).await? {
                WireFrame::AuthProof { tag, .. }
                    if secret.verify(Side::Acceptor, (&theirs, &ours), me, expect, &tag) => {}
                WireFrame::AuthProof { .. } => {
                    return Err(ConnError::Auth(
                        "the acceptor does not hold the cluster secret",
                    ));
                }
                _ => {
                    return Err(ConnError::Auth(
                        "the acceptor refused our proof of the cluster secret",
                    ));
                }
            }
            answer = first_frame(reader, timeout).await?;
        }
        (None, WireFrame::AuthChallenge { .. }) => {
            return Err(ConnError::Auth(
                "the acceptor requires a cluster secret this node does not have",
            ));
        }
        (Some(_), WireFrame::HelloAck { .. }) => {
            return Err(ConnError::Auth(
                "the acceptor did not prove the cluster secret",
            ));
        }
        _ => {}
    }
    match answer {
        WireFrame::HelloAck {
            magic,
            protocol_version,
            node,
        } => {
            check(magic, protocol_version)?;
            if node != expect {
                return Err(ConnError::WrongNode {
                    expected: expect,
                    got: node,
                });
            }
            Ok(())
        }
        other => Err(ConnError::Unexpected {
            expected: "HelloAck",
            got: other.kind(),
        }),
    }
}

/// The acceptor's side: returns the node that dialed us.
pub(crate) async fn accept(
    reader: &mut Reader,
    writer: &mut Writer,
    me: NodeId,
    timeout: Duration,
    secret: Option<&LinkSecret>,
) -> Result<NodeId, ConnError> {
    let (magic, protocol_version, node) = match first_frame(reader, timeout).await? {
        WireFrame::Hello {
            magic,
            protocol_version,
            node,
        } => (magic, protocol_version, node),
        other => {
            return Err(ConnError::Unexpected {
                expected: "Hello",
                got: other.kind(),
            });
        }
    };
    if let Err(err) = check(magic, protocol_version) {
        if matches!(err, ConnError::Version { .. }) {
            // Best effort: let the dialer log the mismatch too.
            let _ = tokio::time::timeout(timeout, send(writer, &hello_ack(me))).await;
        }
        return Err(err);
    }
    if node == me {
        return Err(ConnError::SelfConnect(node));
    }
    if let Some(secret) = secret {
        challenge(reader, writer, me, node, timeout, secret).await?;
    }
    send(writer, &hello_ack(me)).await?;
    Ok(node)
}

/// The acceptor's half of the proof: `dialer` must answer our nonce with
/// its tag before we prove ourselves.
async fn challenge(
    reader: &mut Reader,
    writer: &mut Writer,
    me: NodeId,
    dialer: NodeId,
    timeout: Duration,
    secret: &LinkSecret,
) -> Result<(), ConnError> {
    let ours: [u8; NONCE] = nonce();
    send(writer, &WireFrame::AuthChallenge { nonce: ours }).await?;
    let (theirs, tag) = match first_frame(reader, timeout).await? {
        WireFrame::AuthProof { nonce, tag } => (nonce, tag),
        _ => return Err(ConnError::Auth("the dialer did not answer the challenge")),
    };
    if !secret.verify(Side::Dialer, (&ours, &theirs), dialer, me, &tag) {
        // Say nothing more: a node without the secret learns nothing.
        return Err(ConnError::Auth(
            "the dialer does not hold the cluster secret",
        ));
    }
    let tag = secret.prove(Side::Acceptor, (&ours, &theirs), dialer, me);
    send(writer, &WireFrame::AuthProof { nonce: ours, tag }).await
}
