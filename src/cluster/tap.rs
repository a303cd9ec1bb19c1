//! The token tap across processes: a node agent's engines stream every
//! token they sample to the head, where the gateway's call streams are
//! (`gyre train --cluster … --gateway-listen` / `--job`).
//!
//! An engine's step job calls its [`TokenTap`] synchronously; on a node
//! agent that tap is a [`RemoteTap`], which queues each call's new tokens
//! on the live link to the head's tap endpoint before the job returns, so
//! they travel ahead of the engine's answer on the same ordered link. The
//! head's [`serve_tap`] feeds them to the call streams, and the streams
//! end a call only once they hold as many tokens as its answer says
//! (whatever path got there first).
//!
//! A retried attempt asks the head for the tokens earlier attempts
//! produced ([`TapMsg::Resume`], answered by [`TapReply`]) through the same
//! endpoint, so it queues behind every token already sent to it: a call
//! cancelled on one node and retried on another continues after the last
//! token the first one sampled.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gyre_actors::sched::ids::{CallId, EngineIx, Version};
use gyre_runtime::live::LiveNode;
use gyre_runtime::{ActorId, Addr, External};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Receiver;

use crate::embedded::engine::TokenTap;
use crate::embedded::external::streams::CallStreams;
use crate::embedded::shared::lock;

/// How long a retried attempt waits for the head's answer before it
/// starts without the earlier tokens (and says so in the log).
const RESUME_WAIT: Duration = Duration::from_secs(10);
/// Calls whose sent positions a node remembers at most; past it the
/// memory is cleared (the head drops positions it already holds).
const SENT_CALLS: usize = 4096;

/// What a node agent's tap tells the head's tap endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TapMsg {
    /// `ids[i]` (log-prob `logprobs[i]`) is output token `at + i` of
    /// `call`, sampled by `engine` serving `version`.
    Sampled {
        call: CallId,
        at: u32,
        ids: Vec<u32>,
        logprobs: Vec<f32>,
        engine: EngineIx,
        version: Version,
    },
    /// The output tokens of `call` so far, for a retried attempt.
    Resume {
        call: CallId,
        ask: u64,
        reply_to: Addr<External<TapReply>>,
    },
}

/// The head's answer to [`TapMsg::Resume`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TapReply {
    pub ask: u64,
    pub tokens: Vec<u32>,
}

type Waiting = Arc<Mutex<HashMap<u64, std::sync::mpsc::Sender<Vec<u32>>>>>;

/// A node agent's token tap: the head's call streams, over the link.
pub struct RemoteTap {
    live: LiveNode,
    rt: tokio::runtime::Handle,
    head: Addr<External<TapMsg>>,
    replies: Addr<External<TapReply>>,
    waiting: Waiting,
    asks: AtomicU64,
    /// Per call, the output positions already sent.
    sent: Mutex<HashMap<CallId, usize>>,
}

impl fmt::Debug for RemoteTap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTap")
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl RemoteTap {
    /// The tap of `live`'s engines, sending to the head's endpoint
    /// `head`; call it from inside the node's tokio runtime.
    pub fn start(live: &LiveNode, head: Addr<External<TapMsg>>) -> Arc<Self> {
        let (replies, rx) = live.probe::<TapReply>(1024);
        let waiting: Waiting = Arc::default();
        tokio::spawn(deliver_replies(rx, waiting.clone()));
        Arc::new(RemoteTap {
            live: live.clone(),
            rt: tokio::runtime::Handle::current(),
            head,
            replies,
            waiting,
            asks: AtomicU64::new(0),
            sent: Mutex::default(),
        })
    }

    /// Queues `msg` on the link to the head. Step jobs run on the
    /// blocking pool, outside any async context, where waiting is allowed.
    fn send(&self, msg: TapMsg) -> bool {
        let from: ActorId = self.replies.id();
        match self.rt.block_on(self.live.send(from, self.head, msg)) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "a token for the head's tap was not sent");
                false
            }
        }
    }
}

async fn deliver_replies(mut rx: Receiver<(ActorId, TapReply)>, waiting: Waiting) {
    while let Some((_, reply)) = rx.recv().await {
        if let Some(tx) = lock(&waiting).remove(&reply.ask) {
            let _ = tx.send(reply.tokens);
        }
    }
}

impl TokenTap for RemoteTap {
    fn resume(&self, call: CallId) -> Vec<u32> {
        let ask = self.asks.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        lock(&self.waiting).insert(ask, tx);
        let asked = TapMsg::Resume {
            call,
            ask,
            reply_to: self.replies,
        };
        if !self.send(asked) {
            lock(&self.waiting).remove(&ask);
            return Vec::new();
        }
        match rx.recv_timeout(RESUME_WAIT) {
            Ok(tokens) => tokens,
            Err(_) => {
                lock(&self.waiting).remove(&ask);
                tracing::warn!(
                    ?call,
                    "the head did not say what earlier attempts produced; this attempt starts over"
                );
                Vec::new()
            }
        }
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
        let end = at + ids.len().min(logprobs.len());
        let from = {
            let mut sent = lock(&self.sent);
            if sent.len() >= SENT_CALLS && !sent.contains_key(&call) {
                sent.clear();
            }
            let upto = sent.entry(call).or_insert(0);
            let from = (*upto).max(at);
            if end <= from {
                return;
            }
            *upto = end;
            from
        };
        let skip = from - at;
        self.send(TapMsg::Sampled {
            call,
            at: u32::try_from(from).unwrap_or(u32::MAX),
            ids: ids[skip..end - at].to_vec(),
            logprobs: logprobs[skip..end - at].to_vec(),
            engine,
            version,
        });
    }

    fn finished(&self, call: CallId) {
        lock(&self.sent).remove(&call);
    }
}

/// The head's tap endpoint: node agents' tokens into `streams`, and the
/// answers to their resumes, in the order they arrived.
pub async fn serve_tap(
    live: LiveNode,
    from: ActorId,
    mut rx: Receiver<(ActorId, TapMsg)>,
    streams: Arc<CallStreams>,
) {
    while let Some((_, msg)) = rx.recv().await {
        match msg {
            TapMsg::Sampled {
                call,
                at,
                ids,
                logprobs,
                engine,
                version,
            } => streams.sampled(call, at as usize, &ids, &logprobs, engine, version),
            TapMsg::Resume {
                call,
                ask,
                reply_to,
            } => {
                let tokens = streams.resume(call);
                if let Err(error) = live.send(from, reply_to, TapReply { ask, tokens }).await {
                    tracing::debug!(%error, "a resume's answer was not sent");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::external::streams::drain;
    use gyre_actors::sched::ids::ExecId;
    use gyre_runtime::NodeId;
    use gyre_runtime::live::LiveConfig;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_reach_the_heads_streams_once_and_a_resume_gets_them_back() {
        let live = LiveNode::start(LiveConfig::local(NodeId(0), 1))
            .await
            .unwrap();
        let (head, rx) = live.probe::<TapMsg>(64);
        let streams = Arc::new(CallStreams::default());
        tokio::spawn(serve_tap(live.clone(), head.id(), rx, streams.clone()));
        let call = CallId {
            exec: ExecId(4),
            seq: 0,
        };
        let stream = streams.open(call);
        let tap = RemoteTap::start(&live, head);
        let prior = tokio::task::spawn_blocking(move || {
            // A step job's view: every step resends what the request has
            // produced so far.
            tap.sampled(call, 0, &[5], &[-0.5], EngineIx::Cell(1), 3);
            tap.sampled(call, 0, &[5, 6], &[-0.5, -0.6], EngineIx::Cell(1), 3);
            tap.finished(call);
            // The retry elsewhere asks what came before it.
            let prior = tap.resume(call);
            tap.sampled(call, 2, &[7], &[-0.7], EngineIx::Pool, 3);
            prior
        })
        .await
        .unwrap();
        assert_eq!(prior, vec![5, 6]);
        streams.answered(call, 3);
        let (ids, answered) = drain(stream).await;
        assert_eq!(
            ids,
            vec![
                (5, EngineIx::Cell(1)),
                (6, EngineIx::Cell(1)),
                (7, EngineIx::Pool)
            ]
        );
        assert!(answered);
        live.shutdown().await;
    }
}
