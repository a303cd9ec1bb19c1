//! The requesting side: a pool of authenticated connections to one peer.
//!
//! Each connection has a writer thread (frames queued by `submit`, sent in
//! bursts, large payloads written vectored straight from the caller's
//! `Bytes`) and a reader thread (responses matched to pending requests by
//! id, READ payloads read straight into the destination buffer). A request
//! larger than the stripe is cut into stripes spread over the connections
//! and reassembled without copying (`BytesMut::unsplit` of one allocation).
//! When a connection breaks, exactly the requests pending on it fail with
//! [`RequestError::PeerLost`].

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::auth::{self, ClusterSecret};
use super::wire::{Kind, RequestHeader, ResponseHeader, Status, read_direct, write_framed};
use crate::error::{RequestError, TransferError};
use crate::request::{Completer, Op, TransferRequest, Transferred};
use crate::segment::SegmentInfo;
use crate::transport::Transport;

const BUFFER: usize = 256 * 1024;
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a peer connection is set up.
#[derive(Debug, Clone, Copy)]
pub struct TcpOptions {
    /// Connections opened to the peer; requests spread over them.
    pub connections: usize,
    /// Requests longer than this are split across connections.
    pub stripe_bytes: u64,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self {
            connections: 4,
            stripe_bytes: 4 << 20,
        }
    }
}

/// A request cut into stripes, completed when its last stripe is.
struct Striped {
    peer: Arc<str>,
    name: Arc<str>,
    offset: u64,
    len: u64,
    state: Mutex<StripedState>,
}

struct StripedState {
    pieces: Vec<Option<BytesMut>>,
    left: usize,
    error: Option<RequestError>,
    done: Option<Completer>,
    is_read: bool,
}

impl Striped {
    fn finish(&self, index: usize, outcome: Result<Option<BytesMut>, RequestError>) {
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
    fn refused(&self, h: &ResponseHeader, version: u64) -> RequestError {
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

enum Pending {
    Stripe {
        request: Arc<Striped>,
        index: usize,
        version: u64,
        /// The destination of a READ stripe.
        into: Option<BytesMut>,
    },
    Describe {
        name: Arc<str>,
        reply: std::sync::mpsc::SyncSender<Result<SegmentInfo, RequestError>>,
    },
    Notify {
        bytes: u64,
        done: Completer,
    },
}

impl Pending {
    fn fail(self, error: RequestError) {
        match self {
            Pending::Stripe { request, index, .. } => request.finish(index, Err(error)),
            Pending::Describe { reply, .. } => drop(reply.try_send(Err(error))),
            Pending::Notify { done, .. } => done(Err(error)),
        }
    }
}

struct Outgoing {
    frame: Vec<u8>,
    payload: Option<Bytes>,
}

#[derive(Default)]
struct ConnState {
    pending: HashMap<u64, Pending>,
    dead: Option<String>,
}

/// One connection's shared state.
struct Conn {
    peer: Arc<str>,
    /// Taken on death so the writer thread sees its queue close.
    outgoing: Mutex<Option<Sender<Outgoing>>>,
    state: Mutex<ConnState>,
    next_id: AtomicU64,
    socket: TcpStream,
}

impl Conn {
    fn lost(&self, reason: &str) -> RequestError {
        RequestError::PeerLost {
            peer: self.peer.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Registers `pending` and queues its frame; on a dead connection the
    /// request fails at once.
    fn send(&self, header: RequestHeader, name: &[u8], payload: Option<Bytes>, pending: Pending) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader { id, ..header };
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(reason) = state.dead.clone() {
                drop(state);
                return pending.fail(self.lost(&reason));
            }
            state.pending.insert(id, pending);
        }
        let frame = header.encode(name);
        let sent = match &*self.outgoing.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.send(Outgoing { frame, payload }).is_ok(),
            None => false,
        };
        if !sent {
            self.kill("the connection's writer stopped");
        }
    }

    /// Marks the connection dead and fails everything pending on it.
    fn kill(&self, reason: &str) {
        let drained: Vec<Pending> = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.dead.get_or_insert_with(|| reason.to_string());
            state.pending.drain().map(|(_, p)| p).collect()
        };
        self.outgoing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let _ = self.socket.shutdown(Shutdown::Both);
        if !drained.is_empty() {
            tracing::warn!(peer = %self.peer, %reason, failed = drained.len(), "transfer connection lost");
        }
        for p in drained {
            p.fail(self.lost(reason));
        }
    }

    fn take(&self, id: u64) -> Option<Pending> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .remove(&id)
    }
}

fn write_loop(conn: Arc<Conn>, rx: Receiver<Outgoing>, stream: TcpStream) {
    let mut wr = BufWriter::with_capacity(BUFFER, stream);
    let result = (|| -> io::Result<()> {
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            while let Some(msg) = next {
                write_one(&mut wr, msg)?;
                next = rx.try_recv().ok();
            }
            wr.flush()?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        conn.kill(&format!("sending failed: {e}"));
    }
}

fn write_one(wr: &mut BufWriter<TcpStream>, msg: Outgoing) -> io::Result<()> {
    match msg.payload {
        Some(payload) => write_framed(wr, &msg.frame, &payload),
        None => wr.write_all(&msg.frame),
    }
}

fn read_loop(conn: Arc<Conn>, stream: TcpStream) {
    let mut rd = BufReader::with_capacity(BUFFER, stream);
    let reason = loop {
        let h = match ResponseHeader::read(&mut rd) {
            Ok(Some(h)) => h,
            Ok(None) => break "the peer closed the connection".to_string(),
            Err(e) => break format!("receiving failed: {e}"),
        };
        let Some(pending) = conn.take(h.id) else {
            break format!("response to unknown request id {}", h.id);
        };
        if let Err(reason) = complete(&conn, &mut rd, &h, pending) {
            break reason;
        }
    };
    conn.kill(&reason);
}

/// Finishes one pending request from its response; an error means the
/// connection cannot continue (the request itself has been failed).
fn complete(
    conn: &Conn,
    rd: &mut BufReader<TcpStream>,
    h: &ResponseHeader,
    pending: Pending,
) -> Result<(), String> {
    let ok = h.status == Status::Ok as u8;
    match pending {
        Pending::Stripe {
            request,
            index,
            version,
            into,
        } => {
            if !ok {
                request.finish(index, Err(request.refused(h, version)));
                return Ok(());
            }
            let Some(mut buf) = into else {
                request.finish(index, Ok(None));
                return Ok(());
            };
            if h.len != buf.len() as u64 {
                let reason = format!("READ answered {} bytes, {} asked", h.len, buf.len());
                request.finish(index, Err(conn.lost(&reason)));
                return Err(reason);
            }
            match read_direct(rd, &mut buf) {
                Ok(()) => {
                    request.finish(index, Ok(Some(buf)));
                    Ok(())
                }
                Err(e) => {
                    let reason = format!("peer died mid-READ: {e}");
                    request.finish(index, Err(conn.lost(&reason)));
                    Err(reason)
                }
            }
        }
        Pending::Describe { name, reply } => {
            let result = if ok {
                Ok(SegmentInfo {
                    name,
                    version: h.a,
                    len: h.b,
                    writable: h.len != 0,
                })
            } else if h.status == Status::UnknownSegment as u8 {
                Err(RequestError::UnknownSegment {
                    peer: conn.peer.to_string(),
                    name: name.to_string(),
                })
            } else {
                Err(RequestError::Protocol {
                    peer: conn.peer.to_string(),
                    detail: format!("status {} answering a lookup", h.status),
                })
            };
            let _ = reply.try_send(result);
            Ok(())
        }
        Pending::Notify { bytes, done } => {
            done(if ok {
                Ok(Transferred { bytes, data: None })
            } else {
                Err(RequestError::Protocol {
                    peer: conn.peer.to_string(),
                    detail: "the peer refused the notification".into(),
                })
            });
            Ok(())
        }
    }
}

/// A peer reached over TCP.
pub struct TcpPeer {
    label: Arc<str>,
    conns: Vec<Arc<Conn>>,
    next: AtomicUsize,
    stripe: u64,
}

impl TcpPeer {
    pub(crate) fn connect(
        addr: impl ToSocketAddrs,
        secret: &ClusterSecret,
        own_name: &str,
        options: TcpOptions,
    ) -> Result<Self, TransferError> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| TransferError::io("resolving the peer address", e))?
            .collect();
        let shown = addrs.first().map(|a| a.to_string()).unwrap_or_default();
        let mut conns = Vec::new();
        let mut label: Arc<str> = shown.as_str().into();
        for _ in 0..options.connections.max(1) {
            let mut stream = TcpStream::connect(&addrs[..])
                .map_err(|e| TransferError::io(format!("connecting to {shown}"), e))?;
            let _ = stream.set_nodelay(true);
            let server = auth::connect(&mut stream, secret, own_name, &shown)?;
            label = format!("{server}@{shown}").into();
            conns.push(spawn_conn(label.clone(), stream)?);
        }
        Ok(Self {
            label,
            conns,
            next: AtomicUsize::new(0),
            stripe: options.stripe_bytes.max(1),
        })
    }

    fn pick(&self) -> &Arc<Conn> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        &self.conns[i]
    }
}

fn spawn_conn(peer: Arc<str>, stream: TcpStream) -> Result<Arc<Conn>, TransferError> {
    let clone = |s: &TcpStream| {
        s.try_clone()
            .map_err(|e| TransferError::io("cloning a socket", e))
    };
    let (tx, rx) = channel();
    let conn = Arc::new(Conn {
        peer,
        outgoing: Mutex::new(Some(tx)),
        state: Mutex::default(),
        next_id: AtomicU64::new(1),
        socket: clone(&stream)?,
    });
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map_err(|e| TransferError::io("spawning a connection thread", e))
    };
    let (c, s) = (conn.clone(), clone(&stream)?);
    spawn("transfer-write", Box::new(move || write_loop(c, rx, s)))?;
    let c = conn.clone();
    spawn("transfer-read", Box::new(move || read_loop(c, stream)))?;
    Ok(conn)
}

impl Drop for TcpPeer {
    fn drop(&mut self) {
        for c in &self.conns {
            c.kill("the local engine closed the connection");
        }
    }
}

impl Transport for TcpPeer {
    fn label(&self) -> &str {
        &self.label
    }

    fn describe(&self, name: &str) -> Result<SegmentInfo, RequestError> {
        let (tx, rx) = sync_channel(1);
        let header = RequestHeader {
            kind: Kind::Describe,
            name_len: name.len() as u16,
            id: 0,
            version: 0,
            offset: 0,
            len: 0,
        };
        let pending = Pending::Describe {
            name: name.into(),
            reply: tx,
        };
        self.pick().send(header, name.as_bytes(), None, pending);
        rx.recv_timeout(DESCRIBE_TIMEOUT).unwrap_or_else(|_| {
            Err(RequestError::PeerLost {
                peer: self.label.to_string(),
                reason: format!("no answer to a segment lookup within {DESCRIBE_TIMEOUT:?}"),
            })
        })
    }

    fn submit(&self, request: TransferRequest, done: Completer) {
        let TransferRequest { target, offset, op } = request;
        let len = match &op {
            Op::Read { len, .. } => *len,
            Op::Write { data } => data.len() as u64,
        };
        let stripes = len.div_ceil(self.stripe).max(1) as usize;
        let striped = Arc::new(Striped {
            peer: self.label.clone(),
            name: target.name.clone(),
            offset,
            len,
            state: Mutex::new(StripedState {
                pieces: (0..stripes).map(|_| None).collect(),
                left: stripes,
                error: None,
                done: Some(done),
                is_read: matches!(op, Op::Read { .. }),
            }),
        });
        let (mut read_buf, write_data) = match op {
            Op::Read { into, .. } => (
                Some(into.unwrap_or_else(|| BytesMut::zeroed(len as usize))),
                None,
            ),
            Op::Write { data } => (None, Some(data)),
        };
        let name = target.name.as_bytes();
        for index in 0..stripes {
            let start = index as u64 * self.stripe;
            let piece_len = self.stripe.min(len - start);
            let header = RequestHeader {
                kind: if write_data.is_some() {
                    Kind::Write
                } else {
                    Kind::Read
                },
                name_len: name.len() as u16,
                id: 0,
                version: target.version,
                offset: offset + start,
                len: piece_len,
            };
            let into = read_buf.as_mut().map(|b| b.split_to(piece_len as usize));
            let payload = write_data
                .as_ref()
                .map(|d| d.slice(start as usize..(start + piece_len) as usize));
            let pending = Pending::Stripe {
                request: striped.clone(),
                index,
                version: target.version,
                into,
            };
            self.pick().send(header, name, payload, pending);
        }
    }

    fn notify(&self, topic: &str, payload: Bytes, done: Completer) {
        let header = RequestHeader {
            kind: Kind::Notify,
            name_len: topic.len().min(u16::MAX as usize) as u16,
            id: 0,
            version: 0,
            offset: 0,
            len: payload.len() as u64,
        };
        let pending = Pending::Notify {
            bytes: payload.len() as u64,
            done,
        };
        let topic = &topic.as_bytes()[..header.name_len as usize];
        self.pick().send(header, topic, Some(payload), pending);
    }
}
