//! The engine worker's device jobs: everything that locks the engine runs
//! here, inside an I/O request, and comes back as plain data (ids, tokens,
//! log-probs, errors as text) the worker's handlers turn into protocol
//! answers.
//!
//! Each function takes the locked engine and the boards it touches, does
//! one job to completion and never panics: an engine error is part of the
//! job's result, so the worker can answer the protocol for it.

use gyre_actors::sched::ids::{CallId, ExecId, Version};
use gyre_gpu::engine::{
    Engine, EngineError, FinishReason, KvSnapshot, MemTag, PinId, ReqId, Request,
};
use serde::{Deserialize, Serialize};

use super::tap::Tapping;
use crate::embedded::shared::{KvStore, WeightStore};

/// One attempt of one call: a retried call is a new attempt, answered on
/// its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallKey {
    pub call: CallId,
    pub attempt: u32,
}

/// A request to queue in the engine before the next step.
#[derive(Debug)]
pub struct Submit {
    pub key: CallKey,
    pub request: Request,
    /// The execution adopted KV blocks: use the board's snapshot of it.
    pub adopt: bool,
}

/// What became of one submission.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Submitted {
    Queued {
        req: ReqId,
        /// Prompt tokens the engine computes (not taken from adopted blocks).
        prefill: u64,
        /// Prompt tokens taken from adopted blocks.
        reused: u64,
        /// Why adopted blocks could not be used, if they were offered.
        kv_refused: Option<String>,
        /// Output tokens of earlier attempts the request continues after
        /// (only with a token tap; 0 otherwise).
        #[serde(default)]
        resumed: usize,
    },
    /// The engine refused the request itself (outside the vocabulary, too
    /// long for the context, bad sampling parameters): retrying elsewhere
    /// cannot help.
    Invalid(String),
}

/// A request that finished in a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub req: ReqId,
    pub output: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Versions that served the first and the last output token.
    pub versions: (Version, Version),
}

/// One continuous-batching iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stepped {
    pub submitted: Vec<(CallKey, Submitted)>,
    pub finished: Vec<Finished>,
    /// The step itself failed; every request in the engine was aborted.
    pub failed: Option<String>,
    pub aborted: Vec<ReqId>,
    /// Requests still running or waiting after the step.
    pub busy: bool,
}

/// A pinned prefix, exported onto the KV board.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinOut {
    pub exec: ExecId,
    pub pin: PinId,
    pub tokens: u64,
}

/// How a weight update went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WeightsOutcome {
    Applied,
    /// Already serving this version or a newer one.
    Current,
    /// KV pins are held (a migration is in progress); apply after release.
    Deferred,
    Failed(String),
}

/// The result of one job, as the worker's completion message carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum JobOut {
    Stepped(Stepped),
    Pinned {
        pins: Vec<PinOut>,
        errors: Vec<String>,
    },
    Cancelled {
        aborted: u32,
    },
    PinsReleased {
        errors: Vec<String>,
    },
    Unloaded {
        aborted: u32,
        errors: Vec<String>,
    },
    Loaded {
        version: Version,
        serving: bool,
        error: Option<String>,
    },
    WeightsSet {
        version: Version,
        outcome: WeightsOutcome,
    },
}

/// The longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Queues `req` on top of the snapshot in `bytes`, cut to the part its
/// prompt shares; returns the request and the prompt tokens reused.
fn submit_adopted(engine: &mut Engine, bytes: &[u8], req: Request) -> Result<(ReqId, u64), String> {
    let snap = KvSnapshot::decode(bytes).map_err(|e| e.to_string())?;
    // The engine recomputes at least the prompt's last token (its logits
    // start decoding), so that one is never reused.
    let usable = common_prefix(&snap.tokens, &req.prompt).min(req.prompt.len().saturating_sub(1));
    if usable == 0 {
        return Err("the prompt shares no prefix with the adopted blocks".into());
    }
    let snap = snap.prefix(usable).map_err(|e| e.to_string())?;
    let id = engine
        .submit_with_kv(req, snap)
        .map_err(|e| e.to_string())?;
    Ok((id, usable as u64))
}

fn submit_one(engine: &mut Engine, kv: &dyn KvStore, s: Submit) -> Submitted {
    let exec = s.key.call.exec;
    let prompt = s.request.prompt.len() as u64;
    let mut kv_refused = None;
    if s.adopt {
        match kv.remove(exec) {
            Some(bytes) => match submit_adopted(engine, &bytes, s.request.clone()) {
                Ok((req, reused)) => {
                    return Submitted::Queued {
                        req,
                        prefill: prompt - reused,
                        reused,
                        kv_refused: None,
                        resumed: 0,
                    };
                }
                Err(why) => kv_refused = Some(why),
            },
            None => kv_refused = Some("no blocks on the KV board".into()),
        }
    }
    match engine.submit(s.request) {
        Ok(req) => Submitted::Queued {
            req,
            prefill: prompt,
            reused: 0,
            kv_refused,
            resumed: 0,
        },
        Err(e) => Submitted::Invalid(e.to_string()),
    }
}

/// Queues `submits`, then runs one iteration of the engine; with a tap,
/// a new attempt first continues after its earlier attempts' output, and
/// every request's tokens so far go to the tap after the iteration.
pub fn step(
    engine: &mut Engine,
    kv: &dyn KvStore,
    submits: Vec<Submit>,
    tapping: Option<&Tapping>,
) -> Stepped {
    let mut tapped = tapping.map(|t| t.running.clone()).unwrap_or_default();
    let mut submitted = Vec::with_capacity(submits.len());
    for mut s in submits {
        let key = s.key;
        let resumed = tapping.map_or(0, |t| t.resume(key.call, &mut s.request));
        let mut sub = submit_one(engine, kv, s);
        if let Submitted::Queued {
            req, resumed: r, ..
        } = &mut sub
        {
            *r = resumed;
            tapped.push((*req, key.call, resumed));
        }
        submitted.push((key, sub));
    }
    let mut out = Stepped {
        submitted,
        finished: Vec::new(),
        failed: None,
        aborted: Vec::new(),
        busy: false,
    };
    match engine.step() {
        Ok(done) => {
            if let Some(t) = tapping {
                t.progress(engine, &tapped);
                for c in &done {
                    if let Some(&(_, call, at)) = tapped.iter().find(|r| r.0 == c.id) {
                        t.tap
                            .sampled(call, at, &c.tokens, &c.logprobs, t.engine, c.versions.1);
                        t.tap.finished(call);
                    }
                }
            }
            out.finished = done
                .into_iter()
                .filter(|c| c.finish != FinishReason::Aborted)
                .map(|c| Finished {
                    req: c.id,
                    output: c.tokens,
                    logprobs: c.logprobs,
                    versions: c.versions,
                })
                .collect();
        }
        Err(e) => {
            out.failed = Some(e.to_string());
            out.aborted = engine.abort_all().into_iter().map(|c| c.id).collect();
        }
    }
    out.busy = !engine.is_idle();
    out
}

/// Pins and exports the cached prefix of each execution's requests (the
/// longest one when an execution has several) onto the KV board.
pub fn pin(engine: &mut Engine, kv: &dyn KvStore, wanted: Vec<(ExecId, Vec<ReqId>)>) -> JobOut {
    let mut pins = Vec::new();
    let mut errors = Vec::new();
    for (exec, reqs) in wanted {
        let mut best: Option<(PinId, KvSnapshot)> = None;
        for req in reqs {
            // A request still waiting for admission has no blocks to pin.
            let Ok(pid) = engine.pin_kv(req) else {
                continue;
            };
            let snap = match engine.export_pinned(pid) {
                Ok(s) => s,
                Err(e) => {
                    errors.push(format!("{exec:?}: export: {e}"));
                    drop_pin(engine, pid, &mut errors);
                    continue;
                }
            };
            let better = best
                .as_ref()
                .is_none_or(|(_, b)| snap.tokens.len() > b.tokens.len());
            if snap.tokens.is_empty() || !better {
                drop_pin(engine, pid, &mut errors);
                continue;
            }
            if let Some((old, _)) = best.replace((pid, snap)) {
                drop_pin(engine, old, &mut errors);
            }
        }
        if let Some((pin, snap)) = best {
            kv.put(exec, snap.encode().into());
            pins.push(PinOut {
                exec,
                pin,
                tokens: snap.tokens.len() as u64,
            });
        }
    }
    JobOut::Pinned { pins, errors }
}

fn drop_pin(engine: &mut Engine, pin: PinId, errors: &mut Vec<String>) {
    if let Err(e) = engine.release_pin(pin) {
        errors.push(format!("release pin {pin}: {e}"));
    }
}

pub fn cancel_all(engine: &mut Engine) -> JobOut {
    JobOut::Cancelled {
        aborted: engine.abort_all().len() as u32,
    }
}

pub fn release_pins(engine: &mut Engine, pins: Vec<PinId>) -> JobOut {
    let mut errors = Vec::new();
    for pin in pins {
        drop_pin(engine, pin, &mut errors);
    }
    JobOut::PinsReleased { errors }
}

/// Stops serving: anything still in flight is aborted and every pin
/// dropped, so the memory manager can free the cache.
pub fn unload(engine: &mut Engine, pins: Vec<PinId>) -> JobOut {
    let aborted = engine.abort_all().len() as u32;
    let mut errors = Vec::new();
    for pin in pins {
        drop_pin(engine, pin, &mut errors);
    }
    JobOut::Unloaded { aborted, errors }
}

/// The published weights for `version`, or newer ones when it was already
/// dropped from the board (see [`WeightStore::at_least`]).
fn published(board: &dyn WeightStore, version: Version) -> Result<std::sync::Arc<[u8]>, String> {
    board
        .at_least(version)
        .ok_or_else(|| format!("weights v{version} are not on the board"))
}

/// Brings the engine's memory back if it was released and serves the
/// published `version` (or newer).
pub fn load(engine: &mut Engine, board: &dyn WeightStore, version: Version) -> JobOut {
    let mut error = None;
    if let Err(e) = engine.resume_memory(&[MemTag::Weights, MemTag::KvCache]) {
        error = Some(format!("resume memory: {e}"));
    } else if engine.version() < version {
        let r = published(board, version).and_then(|b| {
            engine
                .update_weights_from_bytes(&b)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = r {
            error = Some(e);
        }
    }
    JobOut::Loaded {
        version: engine.version(),
        serving: engine.health().serving,
        error,
    }
}

/// Serves `version` from the next step on; requests in flight continue
/// and recompute their cache under it.
pub fn set_weights(engine: &mut Engine, board: &dyn WeightStore, version: Version) -> JobOut {
    let outcome = if engine.version() >= version {
        WeightsOutcome::Current
    } else {
        match published(board, version) {
            Err(e) => WeightsOutcome::Failed(e),
            Ok(b) => match engine.update_weights_from_bytes(&b) {
                Ok(()) => WeightsOutcome::Applied,
                Err(EngineError::PinsHeld(_)) => WeightsOutcome::Deferred,
                Err(e) => WeightsOutcome::Failed(e.to_string()),
            },
        }
    };
    JobOut::WeightsSet {
        version: engine.version(),
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::shared::{KvBoard, WeightBoard};
    use gyre_gpu::engine::{EngineConfig, SamplingParams};
    use gyre_gpu::model::{ModelConfig, ParamBuffer};

    fn engine() -> Engine {
        let m = ModelConfig::tiny();
        let p = ParamBuffer::init(&m, 3).unwrap();
        Engine::new(EngineConfig::for_model(m, 4), &p).unwrap()
    }

    fn key(exec: u64) -> CallKey {
        CallKey {
            call: CallId {
                exec: ExecId(exec),
                seq: 0,
            },
            attempt: 0,
        }
    }

    fn request(prompt: Vec<u32>, n: u32) -> Request {
        Request {
            prompt,
            params: SamplingParams {
                max_new_tokens: n,
                seed: 11,
                ..Default::default()
            },
        }
    }

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[7, 8], &[7, 8]), 2);
    }

    #[test]
    fn an_invalid_request_is_reported_and_others_still_step() {
        let mut e = engine();
        let kv = KvBoard::default();
        let out = step(
            &mut e,
            &kv,
            vec![
                Submit {
                    key: key(0),
                    request: request(vec![9_999], 2),
                    adopt: false,
                },
                Submit {
                    key: key(1),
                    request: request(vec![5, 6, 7], 2),
                    adopt: false,
                },
            ],
            None,
        );
        assert!(matches!(out.submitted[0].1, Submitted::Invalid(_)));
        assert!(matches!(
            out.submitted[1].1,
            Submitted::Queued {
                prefill: 3,
                reused: 0,
                ..
            }
        ));
        assert!(out.failed.is_none());
        assert!(out.busy);
    }

    #[test]
    fn adopting_without_blocks_on_the_board_falls_back_to_prefill() {
        let mut e = engine();
        let kv = KvBoard::default();
        kv.put(ExecId(2), vec![1u8, 2, 3].into());
        let out = step(
            &mut e,
            &kv,
            vec![
                Submit {
                    key: key(1),
                    request: request(vec![5, 6, 7], 2),
                    adopt: true,
                },
                Submit {
                    key: key(2),
                    request: request(vec![5, 6, 7], 2),
                    adopt: true,
                },
            ],
            None,
        );
        for (_, s) in &out.submitted {
            let Submitted::Queued {
                reused, kv_refused, ..
            } = s
            else {
                panic!("{s:?}");
            };
            assert_eq!(*reused, 0);
            assert!(kv_refused.is_some());
        }
        // The garbage entry was taken (it can never become usable).
        assert!(kv.is_empty());
    }

    #[test]
    fn weights_missing_from_the_board_fail_without_changing_the_engine() {
        let mut e = engine();
        let board = WeightBoard::default();
        let out = set_weights(&mut e, &board, 1);
        assert!(matches!(
            out,
            JobOut::WeightsSet {
                version: 0,
                outcome: WeightsOutcome::Failed(_)
            }
        ));
        assert!(matches!(
            set_weights(&mut e, &board, 0),
            JobOut::WeightsSet {
                outcome: WeightsOutcome::Current,
                ..
            }
        ));
    }
}
