//! Long work on a device as an I/O request: the live host runs it on its
//! blocking pool, the simulator inline (so it must be deterministic, which
//! candle's CPU kernels are for a fixed thread count).

use gyre_runtime::{IoError, IoRequest};

/// A closure over shared device state, labelled for the simulator's
/// latency model.
pub struct Work<T> {
    kind: &'static str,
    job: Box<dyn FnOnce() -> Result<T, String> + Send>,
}

impl<T: Send + 'static> Work<T> {
    pub fn new(
        kind: &'static str,
        job: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Self {
        Self {
            kind,
            job: Box::new(job),
        }
    }
}

impl<T: Send + 'static> IoRequest for Work<T> {
    type Output = T;

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn run(self) -> Result<T, IoError> {
        (self.job)().map_err(IoError::Failed)
    }
}
