//! The serving side: accepts authenticated connections and answers each
//! one's requests in order against the node's segments.
//!
//! Every request is admitted (known name, current version, range inside the
//! segment, writable) before memory is touched; a refused WRITE's payload is
//! drained so the connection stays in frame. READ bytes go from segment
//! memory to the socket and WRITE bytes from the socket into segment memory,
//! without staging copies.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use bytes::BytesMut;

use super::auth::{self, ClusterSecret};
use super::wire::{Kind, RequestHeader, ResponseHeader, Status, read_direct, write_framed};
use crate::engine::NodeMemory;
use crate::error::{RequestError, TransferError};
use crate::notify::{MAX_NOTIFICATION, Notification};
use crate::segment::MAX_SEGMENT_NAME;

const BUFFER: usize = 256 * 1024;

/// A listening endpoint; dropping it stops accepting new connections.
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub(crate) fn start(
        node: Arc<NodeMemory>,
        addr: impl ToSocketAddrs,
        secret: ClusterSecret,
    ) -> Result<Self, TransferError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| TransferError::io("binding the transfer listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TransferError::io("reading the listener address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("transfer-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, node, secret, stop))
                .map_err(|e| TransferError::io("spawning the accept thread", e))?
        };
        Ok(Self {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accept so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    node: Arc<NodeMemory>,
    secret: ClusterSecret,
    stop: Arc<AtomicBool>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(mut stream) = stream else { continue };
        let node = node.clone();
        let secret = secret.clone();
        let spawned = std::thread::Builder::new()
            .name("transfer-serve".into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "unknown peer".into());
                let _ = stream.set_nodelay(true);
                match auth::accept(&mut stream, &secret, &node.name, &peer) {
                    Ok(client) => {
                        let label = format!("{client}@{peer}");
                        if let Err(e) = serve(stream, &node, client) {
                            tracing::debug!(peer = %label, error = %e, "transfer connection closed");
                        }
                    }
                    Err(e) => tracing::warn!(%peer, error = %e, "refused a transfer connection"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not spawn a transfer connection thread");
        }
    }
}

fn protocol(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

fn refusal(id: u64, error: &RequestError) -> ResponseHeader {
    let (status, a) = match error {
        RequestError::UnknownSegment { .. } => (Status::UnknownSegment, 0),
        RequestError::StaleVersion { current, .. } => (Status::StaleVersion, *current),
        RequestError::OutOfBounds { segment_len, .. } => (Status::OutOfBounds, *segment_len),
        RequestError::ReadOnly { .. } => (Status::ReadOnly, 0),
        _ => (Status::Refused, 0),
    };
    ResponseHeader {
        id,
        status: status as u8,
        a,
        b: 0,
        len: 0,
    }
}

fn ok(id: u64, a: u64, b: u64, len: u64) -> ResponseHeader {
    ResponseHeader {
        id,
        status: Status::Ok as u8,
        a,
        b,
        len,
    }
}

fn serve(stream: TcpStream, node: &NodeMemory, client: Arc<str>) -> io::Result<()> {
    let mut rd = BufReader::with_capacity(BUFFER, stream.try_clone()?);
    let mut wr = BufWriter::with_capacity(BUFFER, stream);
    let me = node.name.to_string();
    let mut name = Vec::with_capacity(MAX_SEGMENT_NAME);
    loop {
        // Answers go out in bursts: flush only when no request is waiting.
        if rd.buffer().is_empty() {
            wr.flush()?;
        }
        let Some(h) = RequestHeader::read(&mut rd)? else {
            return Ok(());
        };
        if h.name_len as usize > MAX_SEGMENT_NAME {
            return Err(protocol(format!("name of {} bytes", h.name_len)));
        }
        name.resize(h.name_len as usize, 0);
        rd.read_exact(&mut name)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        match h.kind {
            Kind::Describe => match node.segments.lookup(&me, &name) {
                Ok(seg) => {
                    let info = seg.info();
                    wr.write_all(&ok(h.id, info.version, info.len, info.writable as u64).encode())?;
                }
                Err(e) => wr.write_all(&refusal(h.id, &e).encode())?,
            },
            Kind::Read => {
                let admitted = node.segments.lookup(&me, &name).and_then(|seg| {
                    seg.admit(&me, h.version, h.offset, h.len, false)
                        .map(|()| seg)
                });
                match admitted {
                    Ok(seg) => {
                        let head = ok(h.id, 0, 0, h.len).encode();
                        seg.with_range(h.offset, h.len, |bytes| {
                            write_framed(&mut wr, &head, bytes)
                        })?;
                    }
                    Err(e) => wr.write_all(&refusal(h.id, &e).encode())?,
                }
            }
            Kind::Write => {
                let admitted = node.segments.lookup(&me, &name).and_then(|seg| {
                    seg.admit(&me, h.version, h.offset, h.len, true)
                        .map(|()| seg)
                });
                match admitted {
                    Ok(seg) => {
                        seg.with_range_mut(h.offset, h.len, |dst| read_direct(&mut rd, dst))
                            .unwrap_or(Ok(()))?;
                        wr.write_all(&ok(h.id, 0, 0, 0).encode())?;
                    }
                    Err(e) => {
                        io::copy(&mut (&mut rd).take(h.len), &mut io::sink())?;
                        wr.write_all(&refusal(h.id, &e).encode())?;
                    }
                }
            }
            Kind::Notify => {
                if h.len as usize > MAX_NOTIFICATION {
                    return Err(protocol(format!("notification of {} bytes", h.len)));
                }
                let mut payload = BytesMut::zeroed(h.len as usize);
                rd.read_exact(&mut payload)?;
                node.hub.deliver(Notification {
                    from: client.clone(),
                    topic: name.into(),
                    payload: payload.freeze(),
                });
                wr.write_all(&ok(h.id, 0, 0, 0).encode())?;
            }
        }
    }
}
