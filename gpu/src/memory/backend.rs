//! A place to put `f32` buffers: host memory always, a GPU through cudarc
//! behind the `cuda` feature. Regions, tags and accounting are built on top
//! of this, once, for every backend.

use super::MemoryError;

/// Allocation and copies; freeing is dropping the buffer.
pub trait Backend {
    type Buf;
    fn name(&self) -> &'static str;
    /// A zeroed buffer of `len` floats.
    fn alloc(&mut self, len: usize) -> Result<Self::Buf, MemoryError>;
    fn len(buf: &Self::Buf) -> usize;
    /// Host → device at `offset`.
    fn write(&mut self, buf: &mut Self::Buf, offset: usize, src: &[f32])
    -> Result<(), MemoryError>;
    /// Device → host from `offset`.
    fn read(&mut self, buf: &Self::Buf, offset: usize, dst: &mut [f32]) -> Result<(), MemoryError>;
}

/// Rejects a copy that would run past the end of a buffer.
pub(crate) fn check_range(buf_len: usize, offset: usize, len: usize) -> Result<(), MemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf_len => Ok(()),
        _ => Err(MemoryError::OutOfRange {
            offset,
            len,
            buf_len,
        }),
    }
}

/// Plain host memory: the backend of CPU runs and of the embedded engine.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostBackend;

impl Backend for HostBackend {
    type Buf = Vec<f32>;

    fn name(&self) -> &'static str {
        "host"
    }

    fn alloc(&mut self, len: usize) -> Result<Vec<f32>, MemoryError> {
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| MemoryError::Backend(format!("host allocation of {len} floats failed")))?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn len(buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn write(&mut self, buf: &mut Vec<f32>, offset: usize, src: &[f32]) -> Result<(), MemoryError> {
        check_range(buf.len(), offset, src.len())?;
        buf[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&mut self, buf: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<(), MemoryError> {
        check_range(buf.len(), offset, dst.len())?;
        dst.copy_from_slice(&buf[offset..offset + dst.len()]);
        Ok(())
    }
}
