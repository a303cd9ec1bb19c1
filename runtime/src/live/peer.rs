//! One handshaken connection to a peer node: a reader that decodes frames
//! and delivers them in order, and a writer that drains the connection's
//! bounded outbound queue and sends heartbeats.
//!
//! Reader and writer run as two halves of one future: whichever ends first
//! (end of stream, bad input, silence, socket error, shutdown) ends the
//! connection, and the socket closes with it. Frames are delivered one at a
//! time, each awaiting room in its destination's mailbox, which keeps
//! per-sender order and pushes back on the peer through TCP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rustc_hash::FxHashMap;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::id::{ActorId, NodeId};

use super::error::ConnError;
use super::frame::{Frame, WireCodec, WireFrame};
use super::links::Dir;
use super::mailbox::{Route, Undelivered};
use super::node::NodeInner;
use super::stats::{add, bump};

pub(crate) type Reader = FramedRead<OwnedReadHalf, WireCodec>;
pub(crate) type Writer = FramedWrite<OwnedWriteHalf, WireCodec>;

/// Frames written before one flush.
const WRITE_BATCH: usize = 256;
/// Bytes buffered before the writer flushes mid-batch.
const WRITE_BUFFER: usize = 64 * 1024;
/// Routes a connection reader remembers.
const ROUTE_CACHE_LIMIT: usize = 4096;
/// How long a closing writer tries to say goodbye.
const GOODBYE_TIMEOUT: Duration = Duration::from_millis(200);

/// Frames a socket with the node's limit.
pub(crate) fn framed(stream: TcpStream, max_frame: usize) -> (Reader, Writer) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let codec = WireCodec::new(max_frame);
    let mut writer = FramedWrite::new(wr, codec);
    writer.set_backpressure_boundary(WRITE_BUFFER);
    (FramedRead::new(rd, codec), writer)
}

/// How a connection ended without a fault of the peer's.
#[derive(Debug)]
pub(crate) enum ConnEnd {
    Shutdown,
    Goodbye,
    Eof,
}

/// One connection, from handshake to close.
pub(crate) struct Conn {
    pub id: u64,
    pub peer: NodeId,
    pub addr: SocketAddr,
    pub dir: Dir,
}

/// Registers a handshaken connection, runs it to its end, logs why it
/// ended, and reports the peer down if it was the last connection to it.
pub(crate) async fn serve(
    inner: &Arc<NodeInner>,
    peer: NodeId,
    addr: SocketAddr,
    dir: Dir,
    io: (Reader, Writer),
) {
    let conn = Conn {
        id: inner.next_conn(),
        peer,
        addr,
        dir,
    };
    let token = inner.shutdown.child_token();
    let (tx, rx) = mpsc::channel(inner.cfg.outbound_capacity);
    inner.links.register(peer, conn.id, dir, tx, token.clone());
    bump(&inner.counters.handshakes);
    tracing::info!(peer = %peer, %addr, %dir, conn = conn.id, "connected");
    let (mut reader, mut writer) = io;
    let end = tokio::select! {
        r = read_loop(inner, &conn, &mut reader) => r,
        w = write_loop(inner, &conn, &mut writer, rx, &token) => w,
    };
    report_end(inner, &conn, end);
    drop((reader, writer));
    if inner.links.unregister(peer, conn.id) {
        inner.peer_down(peer).await;
    }
}

fn report_end(inner: &NodeInner, conn: &Conn, end: Result<ConnEnd, ConnError>) {
    let (peer, addr, dir, id) = (conn.peer, conn.addr, conn.dir, conn.id);
    match end {
        Ok(ConnEnd::Shutdown) => {
            tracing::debug!(%peer, %addr, %dir, conn = id, "connection closed: shutting down")
        }
        Ok(ConnEnd::Goodbye) => {
            tracing::info!(%peer, %addr, %dir, conn = id, "connection closed: peer said goodbye")
        }
        Ok(ConnEnd::Eof) => {
            tracing::warn!(%peer, %addr, %dir, conn = id, "connection closed: peer closed the stream")
        }
        Err(err) => {
            err.count(&inner.counters);
            if err.is_bad_input() {
                tracing::error!(%peer, %addr, %dir, conn = id, "closing connection on bad input: {err}");
            } else {
                tracing::warn!(%peer, %addr, %dir, conn = id, "connection lost: {err}");
            }
        }
    }
}

async fn read_loop(
    inner: &NodeInner,
    conn: &Conn,
    reader: &mut Reader,
) -> Result<ConnEnd, ConnError> {
    let timeout = inner.cfg.peer_timeout;
    let mut check = tokio::time::interval(inner.cfg.heartbeat);
    check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut seen, mut seen_at_check, mut quiet_since) = (0u64, 0u64, Instant::now());
    let mut cache: FxHashMap<ActorId, Route> = FxHashMap::default();
    loop {
        tokio::select! {
            biased;
            item = reader.next() => {
                let bytes = match item {
                    None => return Ok(ConnEnd::Eof),
                    Some(item) => item?,
                };
                seen += 1;
                match WireFrame::decode(&bytes).map_err(ConnError::Decode)? {
                    WireFrame::Msg(frame) => deliver(inner, conn, &mut cache, None, frame).await?,
                    WireFrame::Tell { key, frame } => {
                        deliver(inner, conn, &mut cache, Some(key), frame).await?
                    }
                    WireFrame::Heartbeat => {}
                    WireFrame::Goodbye => return Ok(ConnEnd::Goodbye),
                    other => {
                        return Err(ConnError::Unexpected {
                            expected: "Msg, Tell, Heartbeat or Goodbye",
                            got: other.kind(),
                        });
                    }
                }
            }
            _ = check.tick() => {
                if seen != seen_at_check {
                    seen_at_check = seen;
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= timeout {
                    return Err(ConnError::PeerTimeout(timeout));
                }
            }
        }
    }
}

/// Decodes one message with its destination's decoder (as the protocol
/// message `tag` names, for a `Tell`) and hands it over.
/// A message for an actor that is not here is dropped; one that does not
/// decode closes the connection (the peer is broken or hostile).
async fn deliver(
    inner: &NodeInner,
    conn: &Conn,
    cache: &mut FxHashMap<ActorId, Route>,
    tag: Option<u64>,
    frame: Frame,
) -> Result<(), ConnError> {
    let Frame { src, dst, payload } = frame;
    if src.node != conn.peer {
        return Err(ConnError::Spoofed {
            src,
            peer: conn.peer,
        });
    }
    bump(&inner.counters.frames_in);
    if !cache.contains_key(&dst) {
        let Some(route) = inner.routes.get(&dst).map(|r| r.clone()) else {
            bump(&inner.counters.dropped_no_actor);
            tracing::warn!(peer = %conn.peer, %src, %dst, "message dropped: no such actor on this node");
            return Ok(());
        };
        if cache.len() >= ROUTE_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(dst, route);
    }
    let Some(route) = cache.get(&dst) else {
        return Ok(());
    };
    let msg = (route.decoder())(tag, &payload).map_err(|source| ConnError::Payload {
        src,
        dst,
        source,
    })?;
    match route.deliver(src, dst, msg).await {
        Ok(()) => {}
        Err(Undelivered::Closed) => {
            cache.remove(&dst);
            bump(&inner.counters.dropped_no_actor);
            tracing::debug!(peer = %conn.peer, %src, %dst, "message dropped: actor stopped");
        }
        Err(err @ Undelivered::WrongType { .. }) => {
            bump(&inner.counters.dropped_invalid);
            tracing::warn!(peer = %conn.peer, %src, %dst, "message dropped: {err:?}");
        }
    }
    Ok(())
}

async fn write_loop(
    inner: &NodeInner,
    conn: &Conn,
    writer: &mut Writer,
    mut rx: mpsc::Receiver<Vec<u8>>,
    token: &CancellationToken,
) -> Result<ConnEnd, ConnError> {
    let heartbeat = WireFrame::Heartbeat.encode().map_err(ConnError::Decode)?;
    let mut beat = tokio::time::interval(inner.cfg.heartbeat);
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let cancelled = token.cancelled();
    tokio::pin!(cancelled);
    let mut queue_open = true;
    // A peer that stops reading must not hold our senders for ever.
    let stall = inner.cfg.peer_timeout;
    loop {
        tokio::select! {
            biased;
            () = &mut cancelled => {
                let goodbye = WireFrame::Goodbye.encode().map_err(ConnError::Decode)?;
                if tokio::time::timeout(GOODBYE_TIMEOUT, writer.send(goodbye)).await.is_err() {
                    tracing::debug!(peer = %conn.peer, conn = conn.id, "goodbye not sent: peer not reading");
                }
                return Ok(ConnEnd::Shutdown);
            }
            frame = rx.recv(), if queue_open => {
                let Some(frame) = frame else {
                    // Nobody sends on this connection any more; keep it for
                    // receiving and heartbeats.
                    queue_open = false;
                    continue;
                };
                let batch = async {
                    writer.feed(frame).await?;
                    let mut n = 1u64;
                    while n < WRITE_BATCH as u64 {
                        let Ok(frame) = rx.try_recv() else { break };
                        writer.feed(frame).await?;
                        n += 1;
                    }
                    writer.flush().await?;
                    Ok::<u64, ConnError>(n)
                };
                let n = tokio::time::timeout(stall, batch)
                    .await
                    .map_err(|_| ConnError::WriteStalled(stall))??;
                add(&inner.counters.frames_out, n);
            }
            _ = beat.tick() => {
                tokio::time::timeout(stall, writer.send(heartbeat.clone()))
                    .await
                    .map_err(|_| ConnError::WriteStalled(stall))??;
            }
        }
    }
}
