//! Driving one model call: engine tokens → incremental detokenisation →
//! stop sequences → output parsing → deltas for the API, as the tokens
//! arrive. The API layer turns deltas into its own events.

use bytes::Bytes;
use tokio::sync::mpsc;

use super::chat::{Message, Role, ToolCall};
use super::engine::{EngineEvent, EngineFinish, GenerateRequest};
use super::parse::{OutputParser, Piece};
use super::service::{CallError, Gateway, Prepared, Produced};

/// Engine failures survived within one call before the client is told.
pub const MAX_RETRIES: u32 = 2;

#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Thinking(String),
    Text(String),
    Call(ToolCall),
    /// An output token as sampled, sent before the text it decodes to (for
    /// streamed log-probs; fronts without them ignore it).
    Token(SampledToken),
}

#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
    /// The token's own text (lossy for a partial character).
    pub text: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence(String),
}

pub struct Outcome {
    pub stop: Stop,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    pub reply: Message,
    /// The engine and version that sampled the first token, if the engine
    /// said ([`EngineEvent::Served`]).
    pub served: Option<(String, u64)>,
}

/// Output ids → text deltas, holding back incomplete UTF-8.
struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// What is still held back (an incomplete character at the end), lossily.
    fn finish(&mut self, gw: &Gateway) -> String {
        let tok = &gw.renderer.tokenizer;
        let before = tok.decode(&self.ids[self.prefix..self.read]);
        let after = tok.decode(&self.ids[self.prefix..]);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        after.get(before.len()..).unwrap_or("").to_string()
    }

    fn push(&mut self, gw: &Gateway, id: u32) -> Option<String> {
        self.ids.push(id);
        let tok = &gw.renderer.tokenizer;
        let before = tok.decode(&self.ids[self.prefix..self.read]);
        let after = tok.decode(&self.ids[self.prefix..]);
        if after.ends_with('\u{FFFD}') || after.len() <= before.len() {
            return None;
        }
        let delta = after.get(before.len()..)?.to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Some(delta)
    }
}

/// Cuts text at the first stop sequence, holding back possible starts.
struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    /// Text safe to pass on, and the stop sequence if one was hit.
    fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.pending.push_str(text);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s)))
            .min_by_key(|(i, _)| *i);
        if let Some((i, s)) = hit {
            let s = s.clone();
            let out = self.pending[..i].to_string();
            self.pending.clear();
            return (out, Some(s));
        }
        let hold = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.pending.is_char_boundary(self.pending.len() - n)
                            && s.starts_with(&self.pending[self.pending.len() - n..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let out: String = self.pending.drain(..self.pending.len() - hold).collect();
        (out, None)
    }
}

struct Reply {
    text: String,
    thinking: String,
    calls: Vec<ToolCall>,
}

impl Reply {
    fn take(&mut self, pieces: Vec<Piece>, id_prefix: &str, call_index: u64) -> Vec<Delta> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Text(t) => {
                    self.text.push_str(&t);
                    Delta::Text(t)
                }
                Piece::Thinking(t) => {
                    self.thinking.push_str(&t);
                    Delta::Thinking(t)
                }
                Piece::Call(c) => {
                    let call = ToolCall {
                        id: format!("{id_prefix}{call_index}_{}", self.calls.len()),
                        name: c.name,
                        arguments: c.arguments,
                    };
                    self.calls.push(call.clone());
                    Delta::Call(call)
                }
            })
            .collect()
    }
}

async fn send(
    deltas: Vec<Delta>,
    frames: &mut (dyn FnMut(&Delta) -> Vec<Bytes> + Send),
    out: Option<&mpsc::Sender<Bytes>>,
) -> Result<(), CallError> {
    for d in &deltas {
        for f in frames(d) {
            if let Some(tx) = out {
                tx.send(f)
                    .await
                    .map_err(|_| CallError::Internal("the client went away".into()))?;
            }
        }
    }
    Ok(())
}

/// Runs the call; `frames` turns deltas into bytes for `out` (a stream) as
/// they come. Returns what will be recorded; the caller commits.
pub async fn run(
    gw: &Gateway,
    p: &Prepared,
    stops: &[String],
    id_prefix: &str,
    out: Option<&mpsc::Sender<Bytes>>,
    frames: &mut (dyn FnMut(&Delta) -> Vec<Bytes> + Send),
) -> Result<Outcome, CallError> {
    let start = |produced: &[u32]| {
        let mut prompt = p.prompt.to_vec();
        prompt.extend_from_slice(produced);
        let mut params = p.params.clone();
        params.max_tokens = params
            .max_tokens
            .saturating_sub(produced.len() as u32)
            .max(1);
        gw.engine
            .start(GenerateRequest {
                execution: p.execution.clone(),
                call_id: p.call_id.clone(),
                call_index: p.call_index,
                prompt: prompt.into(),
                resumed: produced.len(),
                params,
            })
            .map_err(|e| CallError::Overloaded(e.to_string()))
    };
    let mut generation = start(&[])?;
    let mut retries_left = MAX_RETRIES;
    let eos = gw.renderer.tokenizer.eos();
    let mut detok = Detokenizer {
        ids: Vec::new(),
        prefix: 0,
        read: 0,
    };
    let mut stop = StopMatcher {
        stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
        pending: String::new(),
    };
    let mut parser = OutputParser::new(gw.config.tool_format);
    // A forced call opening (tool_choice) is read before the model's text.
    let _ = parser.push(&p.forced);
    let mut reply = Reply {
        text: String::new(),
        thinking: String::new(),
        calls: Vec::new(),
    };
    let mut ids = Vec::new();
    let mut logprobs = Vec::new();
    let deadline = tokio::time::Instant::now() + gw.config.request_timeout;
    let mut finish = None;
    let mut hit = None;
    let mut served = None;
    while finish.is_none() && hit.is_none() {
        let event = tokio::time::timeout_at(deadline, generation.events.recv())
            .await
            .map_err(|_| {
                CallError::Timeout("the model call took longer than the request timeout".into())
            })?;
        match event {
            Some(EngineEvent::Token { id, logprob }) => {
                ids.push(id);
                logprobs.push(logprob.min(0.0));
                let token = SampledToken {
                    id,
                    logprob: logprob.min(0.0),
                    text: gw.renderer.tokenizer.decode(&[id]),
                };
                send(vec![Delta::Token(token)], frames, out).await?;
                if id == eos {
                    continue;
                }
                let Some(text) = detok.push(gw, id) else {
                    continue;
                };
                let (ready, s) = stop.push(&text);
                hit = s;
                let deltas = reply.take(parser.push(&ready), id_prefix, p.call_index);
                send(deltas, frames, out).await?;
            }
            Some(EngineEvent::Served { engine, version }) => {
                if ids.is_empty() || served.is_none() {
                    served = Some((engine, version));
                }
            }
            Some(EngineEvent::Finish(f)) if !matches!(f, EngineFinish::Failed(_)) => {
                finish = Some(f)
            }
            failed => {
                // Failed or cancelled (a role switch): retry on the current
                // route from prompt + output so far; the client sees nothing.
                let why = match failed {
                    Some(EngineEvent::Finish(EngineFinish::Failed(why))) => why,
                    _ => "the engine stopped without finishing".to_string(),
                };
                if retries_left == 0 {
                    return Err(CallError::Internal(format!("the engine failed: {why}")));
                }
                retries_left -= 1;
                tracing::info!(call = %p.call_id, produced = ids.len(), "rerouting after: {why}");
                gw.metrics
                    .reroutes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                generation = start(&ids)?;
            }
        }
    }
    drop(generation);
    let held = if hit.is_none() {
        detok.finish(gw)
    } else {
        String::new()
    };
    let (rest, s) = stop.push(&held);
    hit = hit.or(s);
    let mut pieces = parser.push(&rest);
    if hit.is_none() {
        pieces.extend(parser.push(&std::mem::take(&mut stop.pending)));
    }
    pieces.extend(parser.finish());
    let deltas = reply.take(pieces, id_prefix, p.call_index);
    send(deltas, frames, out).await?;
    let stop = match (hit, finish) {
        (Some(s), _) => Stop::StopSequence(s),
        (None, Some(EngineFinish::Length)) => Stop::MaxTokens,
        _ if !reply.calls.is_empty() => Stop::ToolUse,
        _ => Stop::EndTurn,
    };
    let message = Message {
        role: Role::Assistant,
        content: reply.text,
        reasoning: (!reply.thinking.is_empty()).then_some(reply.thinking),
        tool_calls: reply.calls,
        tool_call_id: None,
        is_error: false,
    };
    Ok(Outcome {
        stop,
        input_tokens: p.prompt.len(),
        output_tokens: ids.len(),
        output_ids: ids,
        output_logprobs: logprobs,
        reply: message,
        served,
    })
}

/// Commits the outcome (durable before this returns).
pub async fn commit(gw: &Gateway, p: Prepared, o: &Outcome) -> Result<Prepared, CallError> {
    let produced = Produced {
        output_ids: o.output_ids.clone(),
        output_logprobs: o.output_logprobs.clone(),
        reply: o.reply.clone(),
        served: o.served.clone(),
    };
    gw.commit(&p, produced).await.map(|_| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_and_cuts() {
        let mut m = StopMatcher {
            stops: vec!["END".into()],
            pending: String::new(),
        };
        assert_eq!(m.push("abc E"), ("abc ".into(), None));
        assert_eq!(m.push("N"), (String::new(), None));
        assert_eq!(m.push("Dx"), (String::new(), Some("END".into())));
        let mut m = StopMatcher {
            stops: vec!["END".into()],
            pending: String::new(),
        };
        assert_eq!(m.push("EN"), (String::new(), None));
        assert_eq!(m.push("d"), ("ENd".into(), None));
    }
}
