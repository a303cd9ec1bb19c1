//! The codec every message crosses the wire (or the simulator's optional
//! round-trip check) with.
//!
//! bincode 2.x through its serde layer, fixed-int little-endian with a hard
//! size limit so that a corrupt length prefix inside a payload cannot make a
//! decoder allocate gigabytes. A message enum *is* its wire enum: bincode
//! encodes variants by position, so variants are append-only.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest payload a decoder accepts (bytes). Large data travels by handle.
pub const MAX_PAYLOAD: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encode {ty}: {source}")]
    Encode {
        ty: &'static str,
        #[source]
        source: bincode::error::EncodeError,
    },
    #[error("decode {ty}: {source}")]
    Decode {
        ty: &'static str,
        #[source]
        source: bincode::error::DecodeError,
    },
    #[error("decode {ty}: {trailing} trailing bytes after a complete value")]
    Trailing { ty: &'static str, trailing: usize },
    /// A tagged message (sent through a `Recipient`) whose type the
    /// receiver does not accept.
    #[error("{ty} accepts no message with key {key:#018x}")]
    NotAccepted { ty: &'static str, key: u64 },
}

/// Turns values into bytes and back; one implementation per wire format.
pub trait Codec {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError>;
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError>;
}

/// bincode 2.x, standard config with fixed-width integers and [`MAX_PAYLOAD`].
pub struct Bincode;

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_fixed_int_encoding()
        .with_limit::<MAX_PAYLOAD>()
}

impl Codec for Bincode {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
        bincode::serde::encode_to_vec(value, config()).map_err(|source| CodecError::Encode {
            ty: std::any::type_name::<T>(),
            source,
        })
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
        let ty = std::any::type_name::<T>();
        let (value, read) = bincode::serde::decode_from_slice(bytes, config())
            .map_err(|source| CodecError::Decode { ty, source })?;
        if read != bytes.len() {
            return Err(CodecError::Trailing {
                ty,
                trailing: bytes.len() - read,
            });
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Wire {
        A(u32),
        B { s: String },
    }

    #[test]
    fn round_trip() {
        let v = Wire::B { s: "hi".into() };
        let bytes = Bincode::encode(&v).unwrap();
        assert_eq!(Bincode::decode::<Wire>(&bytes).unwrap(), v);
    }

    #[test]
    fn unknown_variant_is_an_error() {
        let mut bytes = Bincode::encode(&Wire::A(1)).unwrap();
        bytes[0] = 9; // variant index 9 does not exist
        let err = Bincode::decode::<Wire>(&bytes).unwrap_err();
        assert!(err.to_string().contains("Wire"), "{err}");
    }

    #[test]
    fn truncated_and_trailing_are_errors() {
        let bytes = Bincode::encode(&Wire::B { s: "hello".into() }).unwrap();
        assert!(Bincode::decode::<Wire>(&bytes[..bytes.len() - 2]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            Bincode::decode::<Wire>(&long),
            Err(CodecError::Trailing { trailing: 1, .. })
        ));
    }

    #[test]
    fn absurd_length_prefix_is_rejected_without_allocating() {
        // Variant B, then a string length of u64::MAX.
        let mut bytes = vec![1, 0, 0, 0];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Bincode::decode::<Wire>(&bytes).is_err());
    }
}
