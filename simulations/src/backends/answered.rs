//! What a backend remembers of the requests it answered, so that a repeated
//! request (a resend after a lost answer, or the network's duplicate) is
//! answered again without doing its work twice. Keys are per requester:
//! two cells reading the same snapshot are two requests.
//!
//! Bounded: the oldest answers are forgotten first. A request repeated
//! after that many later ones would be done again, so the bound is far
//! above what one actor has outstanding at a time.

use std::collections::{BTreeMap, VecDeque};

use gyre_actors::sched::retry::ReqKey;
use gyre_runtime::{ActorId, Recipient};

/// Answers kept per backend.
const KEEP: usize = 4096;

#[derive(Debug)]
pub struct Answered<E> {
    by_key: BTreeMap<(ReqKey, ActorId), (Recipient<E>, E)>,
    order: VecDeque<(ReqKey, ActorId)>,
    /// Repeated requests answered from here.
    pub repeats: u64,
}

impl<E> Default for Answered<E> {
    fn default() -> Self {
        Self {
            by_key: BTreeMap::new(),
            order: VecDeque::new(),
            repeats: 0,
        }
    }
}

impl<E: Clone + gyre_runtime::Message> Answered<E> {
    /// Remembers the answer `event` to `key`, sent to `to`.
    pub fn put(&mut self, key: ReqKey, to: Recipient<E>, event: E) {
        let key = (key, to.id());
        if self.by_key.insert(key, (to, event)).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > KEEP {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
    }

    /// The answer to send again if `key` from `from` was answered before.
    pub fn again(&mut self, key: ReqKey, from: ActorId) -> Option<(Recipient<E>, E)> {
        let hit = self.by_key.get(&(key, from)).cloned();
        if hit.is_some() {
            self.repeats += 1;
        }
        hit
    }
}
