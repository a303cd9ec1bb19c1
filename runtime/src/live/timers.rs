//! An actor task's armed timers as real deadlines.
//!
//! The actor's own [`TimerTable`](crate::timers::TimerTable) maps typed keys
//! to tokens; this queue maps tokens to instants and sleeps until the
//! earliest. Cancelled tokens are removed at once so a timer that is re-armed
//! on every message (a lease, a watchdog) costs no memory and no wake-ups;
//! a token that goes stale anyway is ignored by the actor when it fires.

use std::collections::BTreeSet;
use std::pin::Pin;

use rustc_hash::FxHashMap;
use tokio::time::{Instant, Sleep};

pub(crate) struct TimerQueue {
    by_deadline: BTreeSet<(Instant, u64)>,
    by_token: FxHashMap<u64, Instant>,
    sleep: Pin<Box<Sleep>>,
    sleep_until: Option<Instant>,
}

impl TimerQueue {
    pub fn new() -> Self {
        Self {
            by_deadline: BTreeSet::new(),
            by_token: FxHashMap::default(),
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            sleep_until: None,
        }
    }

    pub fn insert(&mut self, token: u64, at: Instant) {
        if let Some(old) = self.by_token.insert(token, at) {
            self.by_deadline.remove(&(old, token));
        }
        self.by_deadline.insert((at, token));
    }

    pub fn remove(&mut self, token: u64) {
        if let Some(at) = self.by_token.remove(&token) {
            self.by_deadline.remove(&(at, token));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_deadline.len()
    }

    /// Waits for the earliest deadline and pops its token; pending for ever
    /// when nothing is armed. Cancel-safe: nothing is popped until it fires.
    pub async fn next(&mut self) -> u64 {
        loop {
            let Some(&(at, token)) = self.by_deadline.first() else {
                return std::future::pending().await;
            };
            if self.sleep_until != Some(at) {
                self.sleep.as_mut().reset(at);
                self.sleep_until = Some(at);
            }
            self.sleep.as_mut().await;
            if self.by_deadline.remove(&(at, token)) {
                self.by_token.remove(&token);
                return token;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn fires_in_deadline_order_and_skips_removed() {
        let mut q = TimerQueue::new();
        let t0 = Instant::now();
        q.insert(1, t0 + Duration::from_millis(30));
        q.insert(2, t0 + Duration::from_millis(10));
        q.insert(3, t0 + Duration::from_millis(20));
        q.remove(3);
        q.insert(1, t0 + Duration::from_millis(40)); // re-armed later
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, 2);
        assert!(Instant::now() >= t0 + Duration::from_millis(10));
        assert_eq!(q.next().await, 1);
        assert!(Instant::now() >= t0 + Duration::from_millis(40));
        assert!(q.is_empty());
        let idle = tokio::time::timeout(Duration::from_millis(50), q.next()).await;
        assert!(idle.is_err(), "an empty queue never fires");
    }
}
