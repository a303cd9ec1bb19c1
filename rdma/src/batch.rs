//! Batches: a group of requests submitted together, polled per request or
//! awaited as a whole (Mooncake's batch ids).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::request::{Completion, RequestStatus};

/// Names a submitted batch on the engine that accepted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchId(pub u64);

struct Slots {
    completions: Vec<Option<Completion>>,
    remaining: usize,
}

/// Completion slots of one batch, filled from transport threads.
pub(crate) struct BatchState {
    slots: Mutex<Slots>,
    all_done: Condvar,
}

impl BatchState {
    pub fn new(len: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(Slots {
                completions: (0..len).map(|_| None).collect(),
                remaining: len,
            }),
            all_done: Condvar::new(),
        })
    }

    pub fn complete(&self, index: usize, completion: Completion) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.completions.get_mut(index)
            && slot.is_none()
        {
            *slot = Some(completion);
            slots.remaining -= 1;
            if slots.remaining == 0 {
                self.all_done.notify_all();
            }
        }
    }

    pub fn status(&self) -> Vec<RequestStatus> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .completions
            .iter()
            .map(|c| match c {
                None => RequestStatus::Pending,
                Some(Ok(t)) => RequestStatus::Completed { bytes: t.bytes },
                Some(Err(e)) => RequestStatus::Failed(e.clone()),
            })
            .collect()
    }

    /// Blocks until every request completed (or `timeout` passed: `None`).
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Vec<Completion>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        while slots.remaining > 0 {
            slots = match deadline {
                None => self.all_done.wait(slots).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.all_done
                        .wait_timeout(slots, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        Some(
            slots
                .completions
                .iter_mut()
                .filter_map(Option::take)
                .collect(),
        )
    }
}
