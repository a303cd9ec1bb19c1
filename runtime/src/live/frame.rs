//! What travels on a connection between two nodes, and how it is framed.
//!
//! Each TCP frame is a 4-byte big-endian length followed by one bincode
//! [`WireFrame`], the layout of `tokio_util`'s `LengthDelimitedCodec` with its
//! defaults. Decoding is done here by hand so that a frame cut short by the
//! end of the stream is reported as such (the stock codec forgets a length it
//! has already consumed and would take a truncated frame for a clean close),
//! and so that the length is checked against the limit before any buffer is
//! reserved for it.

use bytes::{Buf, BufMut, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder};

use crate::codec::{Bincode, Codec, CodecError};
use crate::id::{ActorId, NodeId};

/// First field of every hello: tells a Gyre peer from a stray client.
pub const MAGIC: u32 = 0x4759_5245; // "GYRE"

/// Bytes of the length prefix in front of every frame.
pub const LENGTH_PREFIX: usize = 4;

/// One actor message between nodes; `payload` is the message encoded with
/// [`Bincode`], decoded at the receiver with the destination actor's decoder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub src: ActorId,
    pub dst: ActorId,
    #[serde(with = "byte_buf")]
    pub payload: Vec<u8>,
}

/// Everything a connection carries. Variants are append-only, and `Hello` /
/// `HelloAck` must keep their position and fields for ever: they are what
/// peers of different versions read to learn they disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireFrame {
    /// The dialer's opening frame.
    Hello {
        magic: u32,
        protocol_version: u32,
        node: NodeId,
    },
    /// The acceptor's answer; also sent, with the acceptor's own version,
    /// just before it closes a connection over a version mismatch.
    HelloAck {
        magic: u32,
        protocol_version: u32,
        node: NodeId,
    },
    Msg(Frame),
    /// Sent on an otherwise idle connection so the peer can tell silence
    /// from death.
    Heartbeat,
    /// A clean close: the sender is shutting down.
    Goodbye,
    /// A message sent through a `Recipient`: `payload` encodes the protocol
    /// message whose key is `key`, which the destination converts into its
    /// own type.
    Tell {
        key: u64,
        frame: Frame,
    },
    /// An acceptor holding the cluster secret answers a hello with this
    /// fresh nonce (see `auth`).
    AuthChallenge {
        nonce: [u8; 32],
    },
    /// A side's proof that it holds the secret: its own nonce (the dialer's;
    /// the acceptor repeats its challenge) and the HMAC tag.
    AuthProof {
        nonce: [u8; 32],
        tag: [u8; 32],
    },
}

impl WireFrame {
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        Bincode::encode(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        Bincode::decode(bytes)
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            WireFrame::Hello { .. } => "Hello",
            WireFrame::HelloAck { .. } => "HelloAck",
            WireFrame::Msg(_) => "Msg",
            WireFrame::Heartbeat => "Heartbeat",
            WireFrame::Goodbye => "Goodbye",
            WireFrame::Tell { .. } => "Tell",
            WireFrame::AuthChallenge { .. } => "AuthChallenge",
            WireFrame::AuthProof { .. } => "AuthProof",
        }
    }
}

/// Why the byte stream could not be cut into frames.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("stream ended inside a frame: {have} of {need} bytes received")]
    Truncated { have: usize, need: usize },
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Length-delimited frames of at most `max` bytes.
#[derive(Debug, Clone, Copy)]
pub struct WireCodec {
    max: usize,
}

impl WireCodec {
    pub fn new(max: usize) -> Self {
        Self { max }
    }
}

impl Decoder for WireCodec {
    type Item = BytesMut;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        let Some(head) = src.get(..LENGTH_PREFIX) else {
            return Ok(None);
        };
        let mut len_bytes = [0u8; LENGTH_PREFIX];
        len_bytes.copy_from_slice(head);
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        let need = LENGTH_PREFIX + len;
        if src.len() < need {
            src.reserve(need - src.len());
            return Ok(None);
        }
        src.advance(LENGTH_PREFIX);
        Ok(Some(src.split_to(len)))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        if src.is_empty() {
            return Ok(None);
        }
        let need = match src.get(..LENGTH_PREFIX) {
            Some(head) => {
                let mut len_bytes = [0u8; LENGTH_PREFIX];
                len_bytes.copy_from_slice(head);
                LENGTH_PREFIX + u32::from_be_bytes(len_bytes) as usize
            }
            None => LENGTH_PREFIX,
        };
        Err(FrameError::Truncated {
            have: src.len(),
            need,
        })
    }
}

impl Encoder<Vec<u8>> for WireCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Vec<u8>, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = frame.len();
        let prefix = u32::try_from(len)
            .ok()
            .filter(|_| len <= self.max)
            .ok_or(FrameError::TooLarge { len, max: self.max })?;
        dst.reserve(LENGTH_PREFIX + len);
        dst.put_u32(prefix);
        dst.extend_from_slice(&frame);
        Ok(())
    }
}

/// Serialises a `Vec<u8>` as one byte string rather than a sequence of
/// `u8`s: the same bincode layout (length, then bytes), decoded in one copy.
mod byte_buf {
    use std::fmt;

    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte string")
        }

        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(b) = seq.next_element()? {
                out.push(b);
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::SinkExt;
    use tokio_util::codec::{FramedWrite, LengthDelimitedCodec};

    fn msg() -> WireFrame {
        WireFrame::Msg(Frame {
            src: ActorId::new(1, 2),
            dst: ActorId::new(3, 4),
            payload: vec![9, 8, 7],
        })
    }

    #[test]
    fn wire_frame_round_trips_and_payload_layout_matches_a_plain_vec() {
        let bytes = msg().encode().unwrap();
        assert_eq!(WireFrame::decode(&bytes).unwrap(), msg());
        #[derive(Serialize)]
        struct Plain {
            src: ActorId,
            dst: ActorId,
            payload: Vec<u8>,
        }
        let plain = Bincode::encode(&Plain {
            src: ActorId::new(1, 2),
            dst: ActorId::new(3, 4),
            payload: vec![9, 8, 7],
        })
        .unwrap();
        assert_eq!(
            &bytes[4..],
            &plain[..],
            "byte_buf must not change the layout"
        );
    }

    #[tokio::test]
    async fn decodes_what_the_stock_length_delimited_codec_writes() {
        let mut out = FramedWrite::new(Vec::new(), LengthDelimitedCodec::new());
        out.send(bytes::Bytes::from_static(b"hello")).await.unwrap();
        out.send(bytes::Bytes::from_static(b"")).await.unwrap();
        let mut buf = BytesMut::from(&out.get_ref()[..]);
        let mut codec = WireCodec::new(64);
        assert_eq!(&codec.decode(&mut buf).unwrap().unwrap()[..], b"hello");
        assert_eq!(&codec.decode(&mut buf).unwrap().unwrap()[..], b"");
        assert!(codec.decode_eof(&mut buf).unwrap().is_none());
    }

    #[test]
    fn partial_frame_waits_then_is_truncated_at_eof() {
        let mut codec = WireCodec::new(64);
        let mut buf = BytesMut::new();
        codec.encode(vec![1, 2, 3, 4, 5], &mut buf).unwrap();
        buf.truncate(6);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        let err = codec.decode_eof(&mut buf).unwrap_err();
        assert!(
            matches!(err, FrameError::Truncated { have: 6, need: 9 }),
            "{err}"
        );
        let mut half_head = BytesMut::from(&[0u8, 0][..]);
        assert!(matches!(
            codec.decode_eof(&mut half_head),
            Err(FrameError::Truncated { have: 2, need: 4 })
        ));
    }

    #[test]
    fn oversized_length_is_rejected_before_buffering() {
        let mut codec = WireCodec::new(64);
        let mut buf = BytesMut::new();
        buf.put_u32(65);
        let err = codec.decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len: 65, max: 64 }));
        assert!(buf.capacity() < 65);
        assert!(codec.encode(vec![0; 65], &mut BytesMut::new()).is_err());
    }
}
