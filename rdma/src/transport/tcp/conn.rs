//! One connection of a peer: a writer thread sends queued frames in
//! bursts, a reader thread matches responses to pending requests by id and
//! reads READ payloads straight into their destination. When either side
//! breaks, exactly the requests pending on this connection fail with
//! [`RequestError::PeerLost`].

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use super::striped::Striped;
use super::wire::{RequestHeader, ResponseHeader, Status, read_direct, write_framed};
use crate::error::{RequestError, TransferError};
use crate::request::{Completer, Transferred};
use crate::segment::SegmentInfo;

const BUFFER: usize = 256 * 1024;

pub(super) enum Pending {
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
pub(super) struct Conn {
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
    pub fn send(
        &self,
        header: RequestHeader,
        name: &[u8],
        payload: Option<Bytes>,
        pending: Pending,
    ) {
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
    pub fn kill(&self, reason: &str) {
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

pub(super) fn spawn_conn(peer: Arc<str>, stream: TcpStream) -> Result<Arc<Conn>, TransferError> {
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
