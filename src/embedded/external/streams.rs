//! Each gateway call's token stream, fed by the engines' token tap.
//!
//! The gateway opens a stream before its call enters the plane; the engine
//! that serves an attempt sends every token it samples (from its step
//! job); the proxy's answer, relayed by the front, ends the stream. The
//! tokens kept per call are what a retried attempt continues after, so the
//! stream a client saw is the call's output however many engines served
//! it.
//!
//! The answer says how many tokens the call produced in all, and the
//! stream ends only once it holds them: in one process the tap has every
//! token before the answer exists, but an engine in another process (a
//! cluster's node agent) sends its tokens and its answer by different
//! paths, and the answer must not cut the stream short.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gyre_actors::sched::ids::{CallId, EngineIx, Version};
use tokio::sync::mpsc;

use crate::embedded::engine::TokenTap;
use crate::embedded::shared::lock;

/// What a call's stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Token {
        id: u32,
        logprob: f32,
        engine: EngineIx,
        version: Version,
    },
    /// The proxy answered the call: no token follows.
    Answered,
}

#[derive(Debug)]
struct Stream {
    tokens: Vec<u32>,
    /// The engine of the last token, to count calls that changed engine.
    last_engine: Option<EngineIx>,
    /// The proxy answered with this many tokens, not all of them here yet.
    answered_at: Option<usize>,
    tx: mpsc::UnboundedSender<StreamEvent>,
}

/// Counters of the streams.
#[derive(Debug, Default)]
pub struct StreamStats {
    pub tokens: AtomicU64,
    /// Attempts that continued after tokens an earlier attempt sampled.
    pub resumed: AtomicU64,
    /// Calls whose tokens came from more than one engine.
    pub engine_changes: AtomicU64,
}

/// Every open call's stream (the engines' [`TokenTap`]).
#[derive(Debug, Default)]
pub struct CallStreams {
    calls: Mutex<HashMap<CallId, Stream>>,
    pub stats: StreamStats,
}

impl CallStreams {
    /// Opens `call`'s stream; its tokens arrive on the receiver.
    pub fn open(&self, call: CallId) -> mpsc::UnboundedReceiver<StreamEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.calls).insert(
            call,
            Stream {
                tokens: Vec::new(),
                last_engine: None,
                answered_at: None,
                tx,
            },
        );
        rx
    }

    /// The proxy answered `call` with `output_tokens` tokens in all: ends
    /// its stream, at once or when the last of them arrives.
    pub fn answered(&self, call: CallId, output_tokens: u64) {
        let mut calls = lock(&self.calls);
        let Some(s) = calls.get_mut(&call) else {
            return;
        };
        let n = usize::try_from(output_tokens).unwrap_or(usize::MAX);
        if s.tokens.len() >= n {
            if let Some(s) = calls.remove(&call) {
                let _ = s.tx.send(StreamEvent::Answered);
            }
        } else {
            s.answered_at = Some(n);
        }
    }

    /// Forgets `call` (its client went away).
    pub fn close(&self, call: CallId) {
        lock(&self.calls).remove(&call);
    }

    pub fn open_calls(&self) -> usize {
        lock(&self.calls).len()
    }
}

impl TokenTap for CallStreams {
    fn resume(&self, call: CallId) -> Vec<u32> {
        let prior = lock(&self.calls)
            .get(&call)
            .map(|s| s.tokens.clone())
            .unwrap_or_default();
        if !prior.is_empty() {
            self.stats.resumed.fetch_add(1, Ordering::Relaxed);
        }
        prior
    }

    fn sampled(
        &self,
        call: CallId,
        at: usize,
        ids: &[u32],
        logprobs: &[f32],
        engine: EngineIx,
        version: Version,
    ) {
        let mut calls = lock(&self.calls);
        let Some(s) = calls.get_mut(&call) else {
            return;
        };
        // Positions are contiguous per attempt and an attempt starts where
        // the last one ended; a gap would be a bug upstream, never filled.
        let Some(seen) = s.tokens.len().checked_sub(at) else {
            return;
        };
        for (&id, &logprob) in ids.iter().zip(logprobs).skip(seen) {
            s.tokens.push(id);
            if s.last_engine.is_some_and(|e| e != engine) {
                self.stats.engine_changes.fetch_add(1, Ordering::Relaxed);
            }
            s.last_engine = Some(engine);
            self.stats.tokens.fetch_add(1, Ordering::Relaxed);
            let _ = s.tx.send(StreamEvent::Token {
                id,
                logprob,
                engine,
                version,
            });
        }
        if s.answered_at.is_some_and(|n| s.tokens.len() >= n)
            && let Some(s) = calls.remove(&call)
        {
            let _ = s.tx.send(StreamEvent::Answered);
        }
    }
}

/// A test's view of a stream: its tokens with their engines until it
/// ends, and whether the answer ended it.
#[cfg(test)]
pub(crate) async fn drain(
    mut rx: mpsc::UnboundedReceiver<StreamEvent>,
) -> (Vec<(u32, EngineIx)>, bool) {
    let mut got = Vec::new();
    while let Some(e) = rx.recv().await {
        got.push(e);
    }
    let ids = got
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Token { id, engine, .. } => Some((*id, *engine)),
            StreamEvent::Answered => None,
        })
        .collect();
    (ids, got.last() == Some(&StreamEvent::Answered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_actors::sched::ids::ExecId;

    fn call() -> CallId {
        CallId {
            exec: ExecId(3),
            seq: 1,
        }
    }

    #[tokio::test]
    async fn tokens_pass_once_in_order_and_a_retry_resumes_after_them() {
        let s = CallStreams::default();
        let rx = s.open(call());
        s.sampled(call(), 0, &[5], &[-0.5], EngineIx::Cell(0), 1);
        s.sampled(call(), 0, &[5, 6], &[-0.5, -0.6], EngineIx::Cell(0), 1);
        assert_eq!(s.resume(call()), vec![5, 6]);
        // The retry on the pool continues at position 2.
        s.sampled(call(), 2, &[7], &[-0.7], EngineIx::Pool, 1);
        // A stale resend of old positions changes nothing.
        s.sampled(call(), 0, &[9, 9], &[-1.0, -1.0], EngineIx::Cell(0), 1);
        s.answered(call(), 3);
        let (ids, answered) = drain(rx).await;
        assert_eq!(
            ids,
            vec![
                (5, EngineIx::Cell(0)),
                (6, EngineIx::Cell(0)),
                (7, EngineIx::Pool)
            ]
        );
        assert!(answered);
        assert_eq!(s.stats.engine_changes.load(Ordering::Relaxed), 1);
        assert_eq!(s.stats.resumed.load(Ordering::Relaxed), 1);
        // After the answer the call is gone: late tokens are dropped.
        s.sampled(call(), 3, &[8], &[-0.1], EngineIx::Pool, 1);
        assert_eq!(s.open_calls(), 0);
    }

    #[tokio::test]
    async fn an_answer_ahead_of_its_last_tokens_waits_for_them() {
        let s = CallStreams::default();
        let rx = s.open(call());
        s.sampled(call(), 0, &[5], &[-0.5], EngineIx::Cell(1), 2);
        // The answer overtook tokens 6 and 7 (another process's engine).
        s.answered(call(), 3);
        assert_eq!(s.open_calls(), 1);
        s.sampled(
            call(),
            0,
            &[5, 6, 7],
            &[-0.5, -0.6, -0.7],
            EngineIx::Cell(1),
            2,
        );
        assert_eq!(s.open_calls(), 0);
        let (ids, answered) = drain(rx).await;
        assert_eq!(ids.len(), 3, "three tokens, then the answer: {ids:?}");
        assert!(answered);
    }
}
