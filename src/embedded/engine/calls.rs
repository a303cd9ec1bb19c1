//! The call book: what an engine backend keeps of each accepted call
//! attempt, and the steps every backend takes the same way whatever serves
//! the tokens.
//!
//! The embedded engine worker and the SGLang adapter answer the engine
//! protocol's calls identically around their different engines: a `Serve`
//! is refused while not serving, a duplicate is ignored, an accepted one
//! has its prompt read from the payload store (an unreadable prompt is
//! answered empty and counted), a finished one has its TITO record written
//! and is answered `Done` once it is, a cancelled one is answered
//! `Cancelled`, a refused one `Rejected`. The book does those steps; each
//! backend keeps its own per-call state in `X` (the engine request id, the
//! adapter's "sent" flag) and does its engine's part.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::{EngineIx, Version};
use gyre_actors::sched::proto::engine::CallEvent;
use gyre_actors::sched::proto::payload::Prompt;
use gyre_runtime::{Actor, BlobId, BlobStore, Cx, IoError, Nanos, PayloadRead, Recipient};
use serde::{Deserialize, Serialize};

use super::EngineStats;
use super::ops::CallKey;
use super::record::{self, Served};

/// An accepted call attempt.
#[derive(Debug)]
pub struct Live<X> {
    pub reply_to: Recipient<CallEvent>,
    /// `None` while its payload is being read.
    pub prompt: Option<Prompt>,
    pub start_ns: Nanos,
    /// The backend's own state of the call.
    pub ext: X,
}

/// A call's record is written (or could not be): the message that answers
/// it `Done` through [`CallBook::recorded`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Recorded {
    pub key: CallKey,
    pub reply_to: Recipient<CallEvent>,
    pub output_tokens: u64,
    pub version: Version,
    pub output: Result<BlobId, IoError>,
}

/// What became of a call whose prompt read finished.
#[derive(Debug)]
pub enum PromptRead<X> {
    /// Its prompt is stored: start it.
    Ready,
    /// Out of the book: answer it empty.
    Unreadable(Live<X>),
    /// Cancelled meanwhile, or read already.
    Ignored,
}

/// The book of calls accepted and not answered yet.
#[derive(Debug)]
pub struct CallBook<X> {
    calls: BTreeMap<CallKey, Live<X>>,
}

impl<X> Default for CallBook<X> {
    fn default() -> Self {
        Self {
            calls: BTreeMap::new(),
        }
    }
}

impl<X> CallBook<X> {
    /// A `Serve`: answered `Rejected` unless `serving`, ignored when the
    /// attempt is booked already, else booked with `ext` and its prompt
    /// read; `read` makes the actor's message of the read's result.
    #[allow(clippy::too_many_arguments)]
    pub fn accept<A: Actor>(
        &mut self,
        serving: bool,
        key: CallKey,
        prompt: BlobId,
        reply_to: Recipient<CallEvent>,
        ext: X,
        blobs: Arc<dyn BlobStore>,
        stats: &mut EngineStats,
        cx: &mut Cx<'_, A>,
        read: impl FnOnce(Result<Prompt, IoError>) -> A::Msg + Send + 'static,
    ) {
        if !serving {
            return reject(key, reply_to, stats, cx);
        }
        if self.calls.contains_key(&key) {
            tracing::warn!(call = ?key.call, attempt = key.attempt, "duplicate Serve ignored");
            return;
        }
        let live = Live {
            reply_to,
            prompt: None,
            start_ns: cx.now(),
            ext,
        };
        self.calls.insert(key, live);
        cx.io(PayloadRead::new(blobs, prompt).decoded::<Prompt>(), read);
    }

    /// A booked call's prompt arrived: stored, and the backend may start
    /// the call. Unreadable, the call leaves the book and is returned to be
    /// answered empty (counted in `bad_prompts`). A call cancelled
    /// meanwhile, or whose prompt is there already, is ignored.
    pub fn prompt_read(
        &mut self,
        key: CallKey,
        prompt: Result<Prompt, IoError>,
        stats: &mut EngineStats,
    ) -> PromptRead<X> {
        let Some(live) = self.calls.get_mut(&key).filter(|l| l.prompt.is_none()) else {
            return PromptRead::Ignored;
        };
        match prompt {
            Ok(p) => {
                live.prompt = Some(p);
                PromptRead::Ready
            }
            Err(e) => {
                tracing::warn!(call = ?key.call, error = %e, "unreadable prompt: answered empty");
                stats.bad_prompts += 1;
                match self.calls.remove(&key) {
                    Some(live) => PromptRead::Unreadable(live),
                    None => PromptRead::Ignored,
                }
            }
        }
    }

    /// Answers `Cancelled` for each of `keys` still booked; `each` cleans
    /// up the backend's side of a removed call. Returns how many.
    pub fn cancel<A: Actor>(
        &mut self,
        keys: &[CallKey],
        stats: &mut EngineStats,
        cx: &mut Cx<'_, A>,
        mut each: impl FnMut(CallKey, &Live<X>),
    ) -> u32 {
        let mut n = 0;
        for key in keys {
            let Some(live) = self.calls.remove(key) else {
                continue;
            };
            each(*key, &live);
            n += 1;
            stats.cancelled += 1;
            let ev = CallEvent::Cancelled {
                call: key.call,
                attempt: key.attempt,
            };
            cx.send(live.reply_to, ev);
        }
        n
    }

    pub fn get(&self, key: &CallKey) -> Option<&Live<X>> {
        self.calls.get(key)
    }

    pub fn get_mut(&mut self, key: &CallKey) -> Option<&mut Live<X>> {
        self.calls.get_mut(key)
    }

    pub fn remove(&mut self, key: &CallKey) -> Option<Live<X>> {
        self.calls.remove(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&CallKey, &Live<X>)> {
        self.calls.iter()
    }

    pub fn keys(&self) -> Vec<CallKey> {
        self.calls.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The record is written (or could not be): answer the proxy `Done`.
    pub fn recorded<A: Actor>(r: Recorded, stats: &mut EngineStats, cx: &mut Cx<'_, A>) {
        let done = record::done(
            r.key,
            r.output_tokens,
            r.version,
            r.output,
            &mut stats.errors,
        );
        cx.send(r.reply_to, done);
    }
}

/// The engine protocol's "serve it elsewhere": the proxy retries the call
/// on its next route (counted in `rejected`).
pub fn reject<A: Actor>(
    key: CallKey,
    reply_to: Recipient<CallEvent>,
    stats: &mut EngineStats,
    cx: &mut Cx<'_, A>,
) {
    stats.rejected += 1;
    let ev = CallEvent::Rejected {
        call: key.call,
        attempt: key.attempt,
    };
    cx.send(reply_to, ev);
}

/// Writes the TITO record of `live` (engine `engine`, the output under
/// `version`), then [`Recorded`] comes back as `msg` makes it. A call whose
/// prompt could not be read has a record without input.
#[allow(clippy::too_many_arguments)]
pub fn write_answer<A: Actor, X>(
    cx: &mut Cx<'_, A>,
    blobs: Arc<dyn BlobStore>,
    engine: EngineIx,
    key: CallKey,
    live: Live<X>,
    output: Vec<u32>,
    logprobs: Vec<f32>,
    version: Version,
    msg: impl FnOnce(Recorded) -> A::Msg + Send + 'static,
) {
    let served = Served {
        call: key.call,
        engine,
        version,
        start_ns: live.start_ns,
        end_ns: cx.now(),
    };
    let rec = record::tito(&served, live.prompt.as_ref(), output, logprobs);
    let output_tokens = rec.output_ids.len() as u64;
    let reply_to = live.reply_to;
    record::write(cx, blobs, &rec, move |output| {
        msg(Recorded {
            key,
            reply_to,
            output_tokens,
            version,
            output,
        })
    });
}
