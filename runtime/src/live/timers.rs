//! The armed timers of every actor on one driver, as real deadlines.
//!
//! Each actor's own [`TimerTable`](crate::timers::TimerTable) maps typed keys
//! to tokens; this queue maps `(actor, token)` to instants and sleeps until
//! the earliest, with one tokio timer for the whole driver. Cancelled tokens
//! are removed at once so a timer that is re-armed on every message (a
//! lease, a watchdog) costs no memory and no wake-ups; a token that goes
//! stale anyway is ignored by the actor when it fires. An actor that stops
//! takes all its entries with it.

use std::collections::BTreeSet;
use std::pin::Pin;

use rustc_hash::FxHashMap;
use tokio::time::{Instant, Sleep};

use super::slot::Key;

pub(crate) struct TimerQueue {
    by_deadline: BTreeSet<(Instant, Key, u64)>,
    by_actor: FxHashMap<Key, FxHashMap<u64, Instant>>,
    /// Made on first use, so that it belongs to the runtime the driver
    /// runs on rather than the one that built the driver.
    sleep: Option<Pin<Box<Sleep>>>,
    sleep_until: Option<Instant>,
}

impl TimerQueue {
    pub fn new() -> Self {
        Self {
            by_deadline: BTreeSet::new(),
            by_actor: FxHashMap::default(),
            sleep: None,
            sleep_until: None,
        }
    }

    pub fn insert(&mut self, key: Key, token: u64, at: Instant) {
        if let Some(old) = self.by_actor.entry(key).or_default().insert(token, at) {
            self.by_deadline.remove(&(old, key, token));
        }
        self.by_deadline.insert((at, key, token));
    }

    pub fn remove(&mut self, key: Key, token: u64) {
        let Some(armed) = self.by_actor.get_mut(&key) else {
            return;
        };
        if let Some(at) = armed.remove(&token) {
            self.by_deadline.remove(&(at, key, token));
        }
        if armed.is_empty() {
            self.by_actor.remove(&key);
        }
    }

    /// Forgets every timer of an actor that stopped.
    pub fn remove_actor(&mut self, key: Key) {
        for (token, at) in self.by_actor.remove(&key).unwrap_or_default() {
            self.by_deadline.remove(&(at, key, token));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_deadline.len()
    }

    /// Pops one timer whose deadline is at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Key, u64)> {
        let &(at, key, token) = self.by_deadline.first()?;
        if at > now {
            return None;
        }
        self.by_deadline.pop_first();
        self.remove(key, token);
        Some((key, token))
    }

    /// Waits until the earliest deadline has passed; pending for ever when
    /// nothing is armed. Cancel-safe: it pops nothing.
    pub async fn wait(&mut self) {
        let Some(&(at, ..)) = self.by_deadline.first() else {
            return std::future::pending().await;
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if self.sleep_until != Some(at) {
            sleep.as_mut().reset(at);
            self.sleep_until = Some(at);
        }
        sleep.as_mut().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(idx: u32) -> Key {
        Key { idx, generation: 0 }
    }

    #[tokio::test]
    async fn fires_in_deadline_order_and_skips_removed() {
        let mut q = TimerQueue::new();
        let t0 = Instant::now();
        let (a, b) = (key(0), key(1));
        q.insert(a, 1, t0 + Duration::from_millis(30));
        q.insert(b, 1, t0 + Duration::from_millis(10));
        q.insert(a, 3, t0 + Duration::from_millis(20));
        q.remove(a, 3);
        q.insert(a, 1, t0 + Duration::from_millis(40)); // re-armed later
        assert_eq!(q.len(), 2);
        q.wait().await;
        let now = Instant::now();
        assert!(now >= t0 + Duration::from_millis(10));
        assert_eq!(q.pop_due(now), Some((b, 1)));
        assert_eq!(q.pop_due(now), None, "the re-armed deadline is later");
        q.wait().await;
        assert_eq!(q.pop_due(Instant::now()), Some((a, 1)));
        assert!(q.is_empty());
        let idle = tokio::time::timeout(Duration::from_millis(50), q.wait()).await;
        assert!(idle.is_err(), "an empty queue never fires");
    }

    #[tokio::test]
    async fn a_stopped_actor_takes_its_timers_along() {
        let mut q = TimerQueue::new();
        let t = Instant::now() + Duration::from_secs(60);
        q.insert(key(0), 1, t);
        q.insert(key(0), 2, t);
        q.insert(key(1), 1, t);
        q.remove_actor(key(0));
        assert_eq!(q.len(), 1);
        q.remove(key(1), 1);
        assert!(q.is_empty());
        assert!(q.by_actor.is_empty(), "no empty per-actor maps linger");
    }
}
