//! Opening connections: the accept loop for peers that dial us, and one
//! dial loop per configured peer that redials with exponential backoff.
//!
//! Every connection is handshaken here and then handed to
//! [`peer::serve`](super::peer::serve). All loops stop at shutdown; the
//! accept loop joins the connections it started before it returns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::id::NodeId;

use super::error::ConnError;
use super::handshake;
use super::links::Dir;
use super::node::NodeInner;
use super::peer::{self, framed};

/// Pause after a failed accept (out of file descriptors, say) so the loop
/// does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

pub(crate) async fn accept_loop(inner: Arc<NodeInner>, listener: TcpListener) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = inner.shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    conns.spawn(serve_accepted(Arc::clone(&inner), stream, addr));
                }
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

async fn serve_accepted(inner: Arc<NodeInner>, stream: TcpStream, addr: SocketAddr) {
    let (mut reader, mut writer) = framed(stream, inner.cfg.max_frame);
    let timeout = inner.cfg.peer_timeout;
    let shaken = tokio::select! {
        () = inner.shutdown.cancelled() => return,
        r = tokio::time::timeout(
            timeout,
            handshake::accept(&mut reader, &mut writer, inner.node(), timeout, inner.cfg.secret.as_ref()),
        ) => r.unwrap_or(Err(ConnError::HandshakeTimeout(timeout))),
    };
    match shaken {
        Ok(peer) => peer::serve(&inner, peer, addr, Dir::Accepted, (reader, writer)).await,
        Err(err) => refuse(&inner, None, addr, &err),
    }
}

fn refuse(inner: &NodeInner, peer: Option<NodeId>, addr: SocketAddr, err: &ConnError) {
    err.count(&inner.counters);
    let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    if err.is_bad_input() {
        tracing::error!(%peer, %addr, "handshake failed, closing connection: {err}");
    } else {
        tracing::warn!(%peer, %addr, "handshake failed: {err}");
    }
}

pub(crate) async fn dial_loop(inner: Arc<NodeInner>, peer: NodeId, addr: SocketAddr) {
    let (min, max) = (inner.cfg.reconnect_min, inner.cfg.reconnect_max);
    let mut backoff = min;
    loop {
        let attempt = tokio::select! {
            () = inner.shutdown.cancelled() => return,
            r = dial_once(&inner, peer, addr) => r,
        };
        match attempt {
            Ok(io) => {
                backoff = min;
                peer::serve(&inner, peer, addr, Dir::Dialed, io).await;
            }
            Err(DialError::Connect(err)) => {
                tracing::debug!(%peer, %addr, "dial failed: {err}; retrying in {backoff:?}");
            }
            Err(DialError::Handshake(err)) => refuse(&inner, Some(peer), addr, &err),
        }
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max);
    }
}

enum DialError {
    Connect(std::io::Error),
    Handshake(ConnError),
}

async fn dial_once(
    inner: &NodeInner,
    peer: NodeId,
    addr: SocketAddr,
) -> Result<(peer::Reader, peer::Writer), DialError> {
    let timeout = inner.cfg.peer_timeout;
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => return Err(DialError::Connect(err)),
        Err(_) => {
            return Err(DialError::Connect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect timed out after {timeout:?}"),
            )));
        }
    };
    let (mut reader, mut writer) = framed(stream, inner.cfg.max_frame);
    tokio::time::timeout(
        timeout,
        handshake::dial(
            &mut reader,
            &mut writer,
            inner.node(),
            peer,
            timeout,
            inner.cfg.secret.as_ref(),
        ),
    )
    .await
    .unwrap_or(Err(ConnError::HandshakeTimeout(timeout)))
    .map_err(DialError::Handshake)?;
    Ok((reader, writer))
}
