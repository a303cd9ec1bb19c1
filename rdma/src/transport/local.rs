//! In-process backend: another engine in the same address space. Reads of
//! frozen segments hand over `Bytes` slices of the registered memory itself.

use std::sync::Arc;

use bytes::Bytes;

use crate::engine::NodeMemory;
use crate::error::RequestError;
use crate::notify::Notification;
use crate::request::{Completer, Op, TransferRequest, Transferred};
use crate::segment::SegmentInfo;
use crate::transport::Transport;

pub struct LocalTransport {
    node: Arc<NodeMemory>,
    from: Arc<str>,
    label: String,
}

impl LocalTransport {
    pub(crate) fn new(node: Arc<NodeMemory>, from: Arc<str>) -> Self {
        let label = format!("local:{}", node.name);
        Self { node, from, label }
    }

    fn run(&self, request: TransferRequest) -> Result<Transferred, RequestError> {
        let segment = self
            .node
            .segments
            .lookup(&self.label, &request.target.name)?;
        let len = request.len();
        segment.admit(
            &self.label,
            request.target.version,
            request.offset,
            len,
            request.is_write(),
        )?;
        match request.op {
            Op::Read { into: None, .. } => Ok(Transferred {
                bytes: len,
                data: Some(segment.read_bytes(request.offset, len)),
            }),
            Op::Read {
                into: Some(mut buf),
                ..
            } => {
                segment.with_range(request.offset, len, |src| buf.copy_from_slice(src));
                Ok(Transferred {
                    bytes: len,
                    data: Some(buf.freeze()),
                })
            }
            Op::Write { data } => {
                segment.with_range_mut(request.offset, len, |dst| dst.copy_from_slice(&data));
                Ok(Transferred {
                    bytes: len,
                    data: None,
                })
            }
        }
    }
}

impl Transport for LocalTransport {
    fn label(&self) -> &str {
        &self.label
    }

    fn describe(&self, name: &str) -> Result<SegmentInfo, RequestError> {
        Ok(self.node.segments.lookup(&self.label, name)?.info())
    }

    fn submit(&self, request: TransferRequest, done: Completer) {
        done(self.run(request));
    }

    fn notify(&self, topic: &str, payload: Bytes, done: Completer) {
        let bytes = payload.len() as u64;
        self.node.hub.deliver(Notification {
            from: self.from.clone(),
            topic: topic.into(),
            payload,
        });
        done(Ok(Transferred { bytes, data: None }));
    }
}
