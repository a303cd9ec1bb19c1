//! The requesting side: a pool of authenticated connections to one peer
//! (see `conn` for one connection's threads). A request larger than the
//! stripe is cut into stripes spread round-robin over the connections
//! (`striped`); WRITE stripes are `Bytes` slices of the caller's buffer, READ
//! stripes disjoint slices of one destination allocation.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::auth::{self, ClusterSecret};
use super::conn::{Conn, Pending, spawn_conn};
use super::striped::{Striped, StripedState};
use super::wire::{Kind, RequestHeader};
use crate::error::{RequestError, TransferError};
use crate::request::{Completer, Op, TransferRequest};
use crate::segment::SegmentInfo;
use crate::transport::Transport;

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
