//! Device memory on an NVIDIA GPU through cudarc, loaded at run time: a
//! build with the `cuda` feature starts anywhere, and on a machine without
//! a driver [`CudaBackend::new`] returns [`MemoryError::NoDriver`] instead
//! of panicking inside cudarc.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};

use super::MemoryError;
use super::backend::{Backend, check_range};

/// Whether libcuda can be loaded here. cudarc panics on first use when it
/// cannot, so every entry point checks this first.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library and drops it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn drv(e: DriverError) -> MemoryError {
    MemoryError::Backend(format!("CUDA driver: {e:?}"))
}

/// One GPU's memory, with copies ordered on one stream.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl CudaBackend {
    pub fn new(ordinal: usize) -> Result<Self, MemoryError> {
        if !driver_present() {
            return Err(MemoryError::NoDriver(
                "libcuda could not be loaded; run on a machine with an NVIDIA driver, or use the host backend"
                    .into(),
            ));
        }
        let count = CudaContext::device_count().map_err(drv)?;
        if ordinal >= count.max(0) as usize {
            return Err(MemoryError::NoDriver(format!(
                "GPU {ordinal} requested, the driver sees {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        let stream = ctx.default_stream();
        Ok(CudaBackend { ctx, stream })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn device_name(&self) -> Result<String, MemoryError> {
        self.ctx.name().map_err(drv)
    }

    /// (free, total) bytes on the device.
    pub fn mem_info(&self) -> Result<(usize, usize), MemoryError> {
        self.ctx.mem_get_info().map_err(drv)
    }
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&mut self, len: usize) -> Result<CudaSlice<f32>, MemoryError> {
        self.stream.alloc_zeros::<f32>(len.max(1)).map_err(drv)
    }

    fn len(buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn write(
        &mut self,
        buf: &mut CudaSlice<f32>,
        offset: usize,
        src: &[f32],
    ) -> Result<(), MemoryError> {
        check_range(buf.len(), offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let mut view = buf.slice_mut(offset..offset + src.len());
        self.stream.memcpy_htod(src, &mut view).map_err(drv)?;
        self.stream.synchronize().map_err(drv)
    }

    fn read(
        &mut self,
        buf: &CudaSlice<f32>,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), MemoryError> {
        check_range(buf.len(), offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let view = buf.slice(offset..offset + dst.len());
        self.stream.memcpy_dtoh(&view, dst).map_err(drv)?;
        self.stream.synchronize().map_err(drv)
    }
}
