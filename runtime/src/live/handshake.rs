//! The first exchange on every connection: who is speaking, and in which
//! version of the protocol.
//!
//! The dialer sends `Hello`; the acceptor checks the magic, the version and
//! the node id, and answers `HelloAck`. On a version mismatch the acceptor
//! still answers with its own version before closing, so both ends log the
//! two versions. Nothing but a hello is accepted first, and a peer that says
//! nothing within the timeout is dropped.

use std::time::Duration;

use futures::{SinkExt, StreamExt};

use crate::PROTOCOL_VERSION;
use crate::id::NodeId;

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
) -> Result<(), ConnError> {
    send(writer, &hello(me)).await?;
    match first_frame(reader, timeout).await? {
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
    send(writer, &hello_ack(me)).await?;
    Ok(node)
}
