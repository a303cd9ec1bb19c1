//! The `script` engine: replays scripted completions, one JSONL line per
//! model call of an execution (the n-th call gets line n, the last line
//! repeats), so client tests get deterministic text and tool calls.
//!
//! A line: `{"text": "...", "thinking": "...", "tool_calls": [{"name": "...",
//! "arguments": {...}}], "finish": "stop"|"length", "token_delay_ms": 0}`
//! (all optional). The completion is written in the model's format (think
//! tags, hermes tool calls, end-of-turn token), tokenised, and sent token by
//! token with a deterministic log-prob, honouring `max_tokens`. With
//! `"fail_after": N` the first attempt fails after N tokens; the retry
//! (prompt + output so far) continues where it stopped.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::engine::{Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation};
use super::template::py_json;
use super::tokenizer::Tokenizer;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptLine {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub thinking: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    /// `length` ends without the end-of-turn token, as if cut off.
    #[serde(default)]
    pub finish: Option<String>,
    #[serde(default)]
    pub token_delay_ms: u64,
    /// The first attempt fails after this many tokens (a reroute to test).
    #[serde(default)]
    pub fail_after: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("script {path} has no completions")]
    Empty { path: String },
}

struct Scripted {
    ids: Vec<u32>,
    finish: EngineFinish,
    delay: Duration,
    fail_after: Option<usize>,
}

pub struct ScriptEngine {
    lines: Vec<Scripted>,
    context_window: usize,
}

/// The model-format text of a scripted completion.
fn completion_text(line: &ScriptLine) -> String {
    let mut out = String::new();
    if let Some(t) = &line.thinking {
        out.push_str(&format!("<think>\n{t}\n</think>\n\n"));
    }
    out.push_str(&line.text);
    for (i, c) in line.tool_calls.iter().enumerate() {
        if i > 0 || !line.text.is_empty() {
            out.push('\n');
        }
        let args = if c.arguments.is_null() {
            serde_json::json!({})
        } else {
            c.arguments.clone()
        };
        let mut a = String::new();
        py_json(&args, None, &mut a, 0);
        out.push_str(&format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {a}}}\n</tool_call>",
            Value::String(c.name.clone())
        ));
    }
    out
}

impl ScriptEngine {
    pub fn load(
        path: &Path,
        tokenizer: &Tokenizer,
        context_window: usize,
    ) -> Result<ScriptEngine, ScriptError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: p.clone(),
            source,
        })?;
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let err = |message: String| ScriptError::Line {
                path: p.clone(),
                line: i + 1,
                message,
            };
            let line: ScriptLine = serde_json::from_str(raw).map_err(|e| err(e.to_string()))?;
            let finish = match line.finish.as_deref() {
                None | Some("stop") => EngineFinish::EndOfTurn,
                Some("length") => EngineFinish::Length,
                Some(other) => {
                    return Err(err(format!("finish {other:?} is not one of stop, length")));
                }
            };
            let mut ids = tokenizer
                .encode(&completion_text(&line))
                .map_err(|e| err(e.to_string()))?;
            if finish == EngineFinish::EndOfTurn {
                ids.push(tokenizer.eos());
            }
            lines.push(Scripted {
                ids,
                finish,
                delay: Duration::from_millis(line.token_delay_ms),
                fail_after: line.fail_after,
            });
        }
        if lines.is_empty() {
            return Err(ScriptError::Empty { path: p });
        }
        Ok(ScriptEngine {
            lines,
            context_window,
        })
    }
}

/// Deterministic behaviour log-prob of the `i`-th token.
fn logprob(id: u32, i: usize) -> f32 {
    -0.01 - ((id as usize + i) % 17) as f32 * 0.05
}

struct Replay {
    ids: Arc<[u32]>,
    /// Index of the first token to send (tokens before it were sent by an
    /// earlier attempt and are now part of the prompt).
    from: usize,
    finish: EngineFinish,
    delay: Duration,
    max_tokens: usize,
    fail_at: Option<usize>,
}

async fn replay(r: Replay, tx: mpsc::Sender<EngineEvent>, cancel: CancellationToken) {
    let end = r.ids.len().min(r.from + r.max_tokens);
    for i in r.from..end {
        if r.fail_at == Some(i) {
            let why = format!("scripted failure after {i} tokens");
            let _ = tx
                .send(EngineEvent::Finish(EngineFinish::Failed(why)))
                .await;
            return;
        }
        if !r.delay.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(r.delay) => {}
            }
        }
        let id = r.ids[i];
        let token = EngineEvent::Token {
            id,
            logprob: logprob(id, i),
        };
        if cancel.is_cancelled() || tx.send(token).await.is_err() {
            return;
        }
    }
    let finish = if end < r.ids.len() {
        EngineFinish::Length
    } else {
        r.finish
    };
    let _ = tx.send(EngineEvent::Finish(finish)).await;
}

impl Engine for ScriptEngine {
    fn name(&self) -> &str {
        "script"
    }

    fn policy_version(&self) -> u64 {
        0
    }

    fn context_window(&self) -> usize {
        self.context_window
    }

    fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        let i = (request.call_index as usize).min(self.lines.len() - 1);
        let line = &self.lines[i];
        let (tx, rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let replay_of = Replay {
            ids: line.ids.clone().into(),
            from: request.resumed.min(line.ids.len()),
            finish: line.finish.clone(),
            delay: line.delay,
            max_tokens: request.params.max_tokens as usize,
            fail_at: line.fail_after.filter(|_| request.resumed == 0),
        };
        tokio::spawn(replay(replay_of, tx, cancel.clone()));
        Ok(Generation { events: rx, cancel })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_text_is_hermes() {
        let line: ScriptLine = serde_json::from_str(
            r#"{"text":"ok","thinking":"t","tool_calls":[{"name":"f","arguments":{"a":1}}]}"#,
        )
        .unwrap();
        assert_eq!(
            completion_text(&line),
            "<think>\nt\n</think>\n\nok\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"
        );
    }

    #[test]
    fn bad_lines_name_the_line() {
        let dir = std::env::temp_dir().join(format!("gyre-script-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.jsonl");
        std::fs::write(&p, "{\"text\":\"a\"}\n{\"txt\":1}\n").unwrap();
        let t = Tokenizer::builtin().unwrap();
        let e = ScriptEngine::load(&p, &t, 100).err().unwrap().to_string();
        assert!(e.contains("s.jsonl:2:"), "{e}");
        std::fs::write(&p, "\n").unwrap();
        assert!(matches!(
            ScriptEngine::load(&p, &t, 100),
            Err(ScriptError::Empty { .. })
        ));
    }
}
