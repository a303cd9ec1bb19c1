//! Notifications: small messages a peer delivers after its writes complete
//! ("the gradients are in your inbox"), routed to subscribers by topic.
//!
//! Messages for a topic nobody has subscribed to yet are held (bounded), so
//! a fast peer's signal is not lost to a slow subscriber's start-up.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// The largest notification payload; bulk data goes through segments.
pub const MAX_NOTIFICATION: usize = 64 * 1024;

/// How many notifications are held per topic before anyone subscribes.
const HELD_PER_TOPIC: usize = 4096;

/// One delivered notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending node's name, as it introduced itself in the handshake.
    pub from: Arc<str>,
    pub topic: Arc<str>,
    pub payload: Bytes,
}

#[derive(Default)]
struct Topics {
    subscribers: HashMap<Arc<str>, Sender<Notification>>,
    held: HashMap<Arc<str>, VecDeque<Notification>>,
}

/// A node's notification router.
#[derive(Default)]
pub(crate) struct NotificationHub {
    topics: Mutex<Topics>,
}

impl NotificationHub {
    pub fn deliver(&self, note: Notification) {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let note = match topics.subscribers.get(&note.topic) {
            Some(tx) => match tx.send(note) {
                Ok(()) => None,
                // The subscriber went away: hold the message for the next one.
                Err(back) => {
                    topics.subscribers.remove(&back.0.topic);
                    Some(back.0)
                }
            },
            None => Some(note),
        };
        if let Some(note) = note {
            hold(&mut topics, note);
        }
    }

    /// Starts receiving `topic`, first the messages held for it; a second
    /// subscription to the same topic replaces the first.
    pub fn subscribe(&self, topic: &str) -> Receiver<Notification> {
        let (tx, rx) = channel();
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let topic: Arc<str> = topic.into();
        for note in topics.held.remove(&topic).into_iter().flatten() {
            let _ = tx.send(note);
        }
        topics.subscribers.insert(topic, tx);
        rx
    }
}

fn hold(topics: &mut Topics, note: Notification) {
    let queue = topics.held.entry(note.topic.clone()).or_default();
    if queue.len() == HELD_PER_TOPIC {
        tracing::warn!(topic = %note.topic, "no subscriber; dropping the oldest held notification");
        queue.pop_front();
    }
    queue.push_back(note);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(topic: &str, n: u8) -> Notification {
        Notification {
            from: "a".into(),
            topic: topic.into(),
            payload: Bytes::from(vec![n]),
        }
    }

    #[test]
    fn held_messages_reach_a_late_subscriber_in_order_and_topics_stay_apart() {
        let hub = NotificationHub::default();
        hub.deliver(note("x", 1));
        hub.deliver(note("y", 9));
        hub.deliver(note("x", 2));
        let rx = hub.subscribe("x");
        hub.deliver(note("x", 3));
        let got: Vec<u8> = rx.try_iter().map(|n| n.payload[0]).collect();
        assert_eq!(got, vec![1, 2, 3]);
        let y = hub.subscribe("y");
        assert_eq!(y.try_recv().unwrap().payload[0], 9);
    }
}
