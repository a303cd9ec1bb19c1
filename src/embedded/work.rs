//! Long work on a device as an I/O request: the live host runs it on its
//! blocking pool, the simulator inline (so it must be deterministic, which
//! candle's CPU kernels are for a fixed thread count).

use gyre_runtime::{IoError, IoRequest, Nanos};

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

/// A worker's operations, started one at a time in arrival order: a
/// completion always belongs to the one operation in flight, and two jobs
/// never contend for one device. Each keeps when it arrived, so a record
/// (`gyre train --record`) can say how long it queued.
#[derive(Debug)]
pub struct Serial<Op> {
    queue: std::collections::VecDeque<(Op, Nanos)>,
    running: Option<Op>,
    /// When the operation last taken arrived.
    taken_arrived: Nanos,
}

impl<Op> Default for Serial<Op> {
    fn default() -> Self {
        Self {
            queue: std::collections::VecDeque::new(),
            running: None,
            taken_arrived: 0,
        }
    }
}

impl<Op> Serial<Op> {
    /// `op` arrived at `at`.
    pub fn push(&mut self, op: Op, at: Nanos) {
        self.queue.push_back((op, at));
    }

    /// The next operation to start, unless one is in flight. The caller
    /// starts it and hands it back with [`Serial::begin`], or answers it at
    /// once if it needs no work.
    pub fn take_next(&mut self) -> Option<Op> {
        if self.running.is_some() {
            return None;
        }
        let (op, at) = self.queue.pop_front()?;
        self.taken_arrived = at;
        Some(op)
    }

    /// When the operation [`Serial::take_next`] last gave arrived.
    pub fn arrived(&self) -> Nanos {
        self.taken_arrived
    }

    /// `op` is now in flight.
    pub fn begin(&mut self, op: Op) {
        self.running = Some(op);
    }

    /// The operation in flight finished.
    pub fn finish(&mut self) -> Option<Op> {
        self.running.take()
    }

    /// Operations waiting to start.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_operation_at_a_time_in_order() {
        let mut s = Serial::default();
        s.push(1, 5);
        s.push(2, 7);
        let first = s.take_next().unwrap();
        assert_eq!((first, s.arrived()), (1, 5));
        s.begin(first);
        assert_eq!(s.take_next(), None, "one is in flight");
        assert_eq!(s.finish(), Some(1));
        assert_eq!(s.finish(), None);
        assert_eq!(s.take_next(), Some(2));
        assert_eq!(s.arrived(), 7);
        assert_eq!(s.waiting(), 0);
    }
}
