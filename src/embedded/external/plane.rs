//! The gateway's side of the scheduling plane: an [`Engine`] whose every
//! generation is a model call of the execution's actor (so the proxy
//! router routes it, and reroutes and retries it on role changes), and the
//! [`RecordSink`] that hands each committed record to that execution for
//! training.
//!
//! Both talk to the bridge actor through one ordered inbox, so a call's
//! record always reaches its execution before the run's `Finished` (the
//! gateway commits before the response's last byte, the process exits
//! after it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, ExecId};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::trajectory::{CallPurpose, TitoRecord};
use gyre_gpu::model::vocab::Special;
use gyre_runtime::{BlobStore, put_encoded};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::board::Board;
use super::bridge::BridgeMsg;
use super::streams::{CallStreams, StreamEvent};
use crate::embedded::engine::engine_name;
use crate::embedded::shared::{WeightStore, lock};
use crate::gateway::engine::{
    Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation, RecordSink,
};

/// Messages for the bridge actor, delivered in the order they were sent.
pub type Inbox = mpsc::UnboundedSender<BridgeMsg>;

#[derive(Debug)]
struct PlaneExec {
    exec: ExecId,
    next_seq: u32,
}

#[derive(Debug, Default)]
struct Ledger {
    by_gateway: HashMap<String, PlaneExec>,
    /// The gateway call (execution, call id) each plane call served.
    served: HashMap<CallId, (String, String)>,
    /// The last plane call of each gateway call.
    last: HashMap<(String, String), CallId>,
    answered: HashSet<CallId>,
    recorded: HashSet<(String, String)>,
    /// Executions whose harness ended on its own (not killed at the end).
    finished: HashSet<ExecId>,
}

/// Which plane execution each gateway execution is, and which calls were
/// answered and recorded.
#[derive(Debug, Default)]
pub struct Executions {
    ledger: std::sync::Mutex<Ledger>,
}

impl Executions {
    pub fn register(&self, gateway_id: &str, exec: ExecId) {
        lock(&self.ledger)
            .by_gateway
            .insert(gateway_id.to_string(), PlaneExec { exec, next_seq: 0 });
    }

    fn next_call(&self, gateway_id: &str, call_id: &str) -> Option<CallId> {
        let mut l = lock(&self.ledger);
        let e = l.by_gateway.get_mut(gateway_id)?;
        let call = CallId {
            exec: e.exec,
            seq: e.next_seq,
        };
        e.next_seq += 1;
        let key = (gateway_id.to_string(), call_id.to_string());
        l.last.insert(key.clone(), call);
        l.served.insert(call, key);
        Some(call)
    }

    /// A record an earlier head committed for `gateway_id`'s call
    /// `call_id`, handed to the execution that adopts it: a call of its own,
    /// recorded and never answered here.
    fn replay(&self, gateway_id: &str, call_id: &str) -> Option<CallId> {
        self.next_call(gateway_id, call_id)?;
        self.recorded(gateway_id, call_id)
    }

    /// The proxy answered `call`.
    pub fn answered(&self, call: CallId) {
        lock(&self.ledger).answered.insert(call);
    }

    /// The harness of `exec` ended by itself.
    pub fn finished(&self, exec: ExecId) {
        lock(&self.ledger).finished.insert(exec);
    }

    fn recorded(&self, gateway_id: &str, call_id: &str) -> Option<CallId> {
        let mut l = lock(&self.ledger);
        let key = (gateway_id.to_string(), call_id.to_string());
        let call = *l.last.get(&key)?;
        l.recorded.insert(key);
        Some(call)
    }

    /// Plane calls answered, and those of them whose harness ended by
    /// itself yet whose gateway call has no record (a client that went
    /// away before the end of its answer; harnesses killed when the run
    /// ends are not counted).
    pub fn answered_unrecorded(&self) -> (u64, u64) {
        let l = lock(&self.ledger);
        let missing = l
            .answered
            .iter()
            .filter(|c| l.finished.contains(&c.exec))
            .filter(|c| l.served.get(c).is_none_or(|g| !l.recorded.contains(g)))
            .count();
        (l.answered.len() as u64, missing as u64)
    }
}

/// The scheduling plane as the gateway's engine.
pub struct PlaneEngine {
    pub inbox: Inbox,
    pub streams: Arc<CallStreams>,
    pub executions: Arc<Executions>,
    pub blobs: Arc<dyn BlobStore>,
    pub weights: Arc<dyn WeightStore>,
    pub context: usize,
    /// The policy's own output cap per call; reaching it ends the turn
    /// (a client asking for more is not told its limit was hit).
    pub max_tokens: Option<usize>,
}

impl PlaneEngine {
    /// The call's prompt, and whether the policy's own cap (not the
    /// client's `max_tokens`) bounds it.
    fn prompt(&self, req: &GenerateRequest) -> (Prompt, bool) {
        let asked = req.params.max_tokens.max(1);
        let cap = |c: usize| u32::try_from(c).unwrap_or(u32::MAX).max(1);
        let max_new_tokens = self.max_tokens.map_or(asked, |c| asked.min(cap(c)));
        let prompt = Prompt {
            input_ids: req.prompt.to_vec(),
            message_ends: Vec::new(),
            max_new_tokens,
            stop_tokens: vec![Special::EndTurn.id()],
            temperature: req.params.temperature.unwrap_or(1.0),
            top_p: req.params.top_p.unwrap_or(1.0),
            thread: None,
            parent_call: None,
            role: None,
            purpose: CallPurpose::Policy,
        };
        (prompt, max_new_tokens < asked)
    }
}

/// Relays a call's stream to the gateway; ends it at the proxy's answer.
async fn relay(
    call: CallId,
    streams: Arc<CallStreams>,
    mut from: mpsc::UnboundedReceiver<StreamEvent>,
    to: mpsc::Sender<EngineEvent>,
    cancel: CancellationToken,
    capped: bool,
) {
    let mut last = None;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return streams.close(call),
            e = from.recv() => e,
        };
        let out = match event {
            Some(StreamEvent::Token {
                id,
                logprob,
                engine,
                version,
            }) => {
                if last.is_none() {
                    let served = EngineEvent::Served {
                        engine: engine_name(engine),
                        version,
                    };
                    if to.send(served).await.is_err() {
                        return streams.close(call);
                    }
                }
                last = Some(id);
                EngineEvent::Token { id, logprob }
            }
            Some(StreamEvent::Answered) => {
                let finish = match last {
                    None => EngineFinish::Failed("the engine answered without a token".into()),
                    Some(t) if t == Special::EndTurn.id() => EngineFinish::EndOfTurn,
                    Some(_) if capped => EngineFinish::EndOfTurn,
                    Some(_) => EngineFinish::Length,
                };
                let _ = to.send(EngineEvent::Finish(finish)).await;
                return;
            }
            None => {
                let why = "the call's stream closed".to_string();
                let _ = to
                    .send(EngineEvent::Finish(EngineFinish::Failed(why)))
                    .await;
                return;
            }
        };
        if to.send(out).await.is_err() {
            return streams.close(call);
        }
    }
}

impl Engine for PlaneEngine {
    fn name(&self) -> &str {
        "gyre-plane"
    }

    fn policy_version(&self) -> u64 {
        self.weights.latest().map_or(0, |(v, _)| v)
    }

    fn context_window(&self) -> usize {
        self.context
    }

    fn start(&self, req: GenerateRequest) -> Result<Generation, EngineError> {
        let call = self
            .executions
            .next_call(&req.execution, &req.call_id)
            .ok_or_else(|| {
                EngineError::Rejected(format!(
                    "execution {} is not one the scheduling plane runs",
                    req.execution
                ))
            })?;
        let (prompt, capped) = self.prompt(&req);
        let prompt_tokens = prompt.input_ids.len() as u64;
        let blob = put_encoded(&*self.blobs, &prompt)
            .map_err(|e| EngineError::Unavailable(format!("the prompt does not encode: {e}")))?;
        let stream = self.streams.open(call);
        let sent = self.inbox.send(BridgeMsg::Call {
            call,
            prompt_tokens,
            prompt: blob,
        });
        if sent.is_err() {
            self.streams.close(call);
            self.blobs.release(blob);
            return Err(EngineError::Unavailable(
                "the scheduling plane has stopped".into(),
            ));
        }
        let (tx, events) = mpsc::channel(1024);
        let cancel = CancellationToken::new();
        tokio::spawn(relay(
            call,
            self.streams.clone(),
            stream,
            tx,
            cancel.clone(),
            capped,
        ));
        Ok(Generation { events, cancel })
    }
}

/// Hands every committed record to its execution.
pub struct PlaneRecords {
    pub inbox: Inbox,
    pub executions: Arc<Executions>,
    pub blobs: Arc<dyn BlobStore>,
    pub board: Arc<Board>,
}

impl PlaneRecords {
    /// Hands `record`, committed by an earlier head, to the execution that
    /// adopted its gateway execution (registered already).
    pub fn replay(&self, record: &TitoRecord) {
        match self.executions.replay(&record.execution, &record.call_id) {
            Some(call) => self.hand_over(call, record),
            None => {
                tracing::warn!(execution = %record.execution, "a replayed record of no plane execution")
            }
        }
    }

    fn hand_over(&self, call: CallId, record: &TitoRecord) {
        self.board.recorded(call.exec, record.policy_version);
        match put_encoded(&*self.blobs, record) {
            Ok(blob) => {
                let _ = self.inbox.send(BridgeMsg::Recorded { call, record: blob });
            }
            Err(error) => tracing::error!(%error, "a record does not encode"),
        }
    }
}

impl RecordSink for PlaneRecords {
    fn committed(&self, record: &TitoRecord) {
        match self.executions.recorded(&record.execution, &record.call_id) {
            Some(call) => self.hand_over(call, record),
            None => tracing::warn!(execution = %record.execution, "a record of no plane execution"),
        }
    }
}
