//! Per-actor timer bookkeeping: typed keys on the actor side, plain tokens on
//! the host side.
//!
//! Hosts only know `(actor, token, deadline)`; this table maps an actor's
//! typed timer keys to tokens so that re-arming or cancelling a key makes any
//! older token stale. A stale token that still fires is ignored, which lets
//! hosts skip eager removal from their queues.
//!
//! Both directions are hash maps: a simulated run sets and fires millions
//! of timers, and nothing iterates the table, so its order never shows.

use std::hash::Hash;

use rustc_hash::FxHashMap;

#[derive(Debug)]
pub struct TimerTable<T> {
    by_key: FxHashMap<T, u64>,
    by_token: FxHashMap<u64, T>,
    next_token: u64,
}

impl<T> Default for TimerTable<T> {
    fn default() -> Self {
        Self {
            by_key: FxHashMap::default(),
            by_token: FxHashMap::default(),
            next_token: 0,
        }
    }
}

impl<T: Eq + Hash + Clone> TimerTable<T> {
    /// Arms `key`; returns the new token and the token it replaces, if any.
    pub fn arm(&mut self, key: T) -> (u64, Option<u64>) {
        let token = self.next_token;
        self.next_token += 1;
        let old = self.by_key.insert(key.clone(), token);
        if let Some(old) = old {
            self.by_token.remove(&old);
        }
        self.by_token.insert(token, key);
        (token, old)
    }

    /// Disarms `key`; returns its token if it was armed.
    pub fn disarm(&mut self, key: &T) -> Option<u64> {
        let token = self.by_key.remove(key)?;
        self.by_token.remove(&token);
        Some(token)
    }

    /// Resolves a fired token to its key, or `None` if it went stale.
    pub fn fire(&mut self, token: u64) -> Option<T> {
        let key = self.by_token.remove(&token)?;
        self.by_key.remove(&key);
        Some(key)
    }

    pub fn is_armed(&self, key: &T) -> bool {
        self.by_key.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Forgets every timer (an actor crashed).
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_token.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rearm_makes_old_token_stale() {
        let mut t = TimerTable::default();
        let (a, none) = t.arm("x");
        assert!(none.is_none());
        let (b, old) = t.arm("x");
        assert_eq!(old, Some(a));
        assert_eq!(t.fire(a), None);
        assert_eq!(t.fire(b), Some("x"));
        assert!(t.is_empty());
    }

    #[test]
    fn disarm_then_fire_is_ignored() {
        let mut t = TimerTable::default();
        let (a, _) = t.arm(1u8);
        assert_eq!(t.disarm(&1), Some(a));
        assert_eq!(t.fire(a), None);
        assert_eq!(t.disarm(&1), None);
    }
}
