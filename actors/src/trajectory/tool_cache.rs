//! The tool-call payload cache (SPEC 3.1).
//!
//! Harnesses re-serialise the tool calls they got back from the model: they
//! reorder JSON keys, reformat whitespace, rename call ids. Tokenised as is,
//! the history of the next request would differ from the recorded output and
//! the tree would grow a false branch at every turn. The proxy therefore
//! caches every tool call the model produced, by call id, exactly as
//! produced; before it tokenises a later request it replaces each tool call
//! in the history by the cached original, and rewrites tool responses to the
//! original id, while remembering which incoming id maps to which original
//! so that responses still correlate.
//!
//! An incoming call is resolved by, in order: its id is an original id; its
//! id is a known alias; the first not-yet-claimed original (in recording
//! order) with the same tool name and the same canonical arguments (JSON with
//! sorted keys, no whitespace). Unresolved calls were written by the harness
//! itself and are left untouched. A restore is all or nothing: an error
//! leaves the cache as it was.

use std::fmt::Write as _;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool call as the model wrote it (or as the harness re-wrote it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text of the arguments, byte for byte.
    pub arguments: String,
}

/// A chat message in the harness's own interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool response: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCacheError {
    #[error("tool call id {id} was already cached; model call ids must be unique in an execution")]
    DuplicateId { id: String },
    #[error(
        "message #{message}: tool response for call id {id}, which no tool call in this request or in the cache has"
    )]
    UnknownToolResponse { message: usize, id: String },
}

/// What a restore did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Tool calls replaced by their cached original.
    pub restored: usize,
    /// Restored calls whose payload (not just id) differed from the original.
    pub reformatted: usize,
    /// Tool calls the model never produced (left as they are).
    pub foreign: usize,
}

/// One execution's cache. See the module doc.
#[derive(Clone, Debug, Default)]
pub struct ToolCallCache {
    originals: Vec<ToolCall>,
    by_id: FxHashMap<String, usize>,
    by_fingerprint: FxHashMap<String, Vec<usize>>,
    aliases: FxHashMap<String, usize>,
}

/// Tool name plus canonical arguments: equal for any re-serialisation.
pub fn fingerprint(call: &ToolCall) -> String {
    let mut out = call.name.clone();
    out.push('\u{0}');
    match serde_json::from_str::<serde_json::Value>(&call.arguments) {
        Ok(v) => write_canonical(&v, &mut out),
        Err(_) => out.push_str(call.arguments.trim()),
    }
    out
}

/// JSON with object keys sorted and no whitespace, whatever serde_json's
/// map features are in this build.
pub fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{}:", Value::String(k.clone()));
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => {
            let _ = write!(out, "{scalar}");
        }
    }
}

impl ToolCallCache {
    pub fn new() -> Self {
        ToolCallCache::default()
    }

    /// Caches the tool calls of one model output, exactly as produced.
    pub fn record(&mut self, calls: &[ToolCall]) -> Result<(), ToolCacheError> {
        let mut seen = FxHashSet::default();
        for c in calls {
            if self.by_id.contains_key(&c.id) || !seen.insert(c.id.as_str()) {
                return Err(ToolCacheError::DuplicateId { id: c.id.clone() });
            }
        }
        for c in calls {
            let i = self.originals.len();
            self.by_id.insert(c.id.clone(), i);
            self.by_fingerprint
                .entry(fingerprint(c))
                .or_default()
                .push(i);
            self.originals.push(c.clone());
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.originals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.originals.is_empty()
    }

    /// The original call an incoming id (original or alias) stands for.
    pub fn original(&self, incoming_id: &str) -> Option<&ToolCall> {
        let i = self
            .by_id
            .get(incoming_id)
            .or_else(|| self.aliases.get(incoming_id))?;
        Some(&self.originals[*i])
    }

    /// The messages to tokenise for matching: tool calls restored, tool
    /// responses pointed at original ids. Learns new aliases on success.
    pub fn restore(
        &mut self,
        messages: &[ChatMessage],
    ) -> Result<(Vec<ChatMessage>, RestoreReport), ToolCacheError> {
        let mut report = RestoreReport::default();
        let mut claimed: FxHashSet<usize> = FxHashSet::default();
        let mut learned: FxHashMap<String, usize> = FxHashMap::default();
        let mut incoming_ids: FxHashSet<&str> = FxHashSet::default();
        let mut out = Vec::with_capacity(messages.len());
        for (mi, m) in messages.iter().enumerate() {
            incoming_ids.extend(m.tool_calls.iter().map(|c| c.id.as_str()));
            let mut m2 = m.clone();
            for call in &mut m2.tool_calls {
                let known = self
                    .by_id
                    .get(&call.id)
                    .or_else(|| self.aliases.get(&call.id))
                    .or_else(|| learned.get(&call.id))
                    .copied();
                let found = known.or_else(|| {
                    self.by_fingerprint
                        .get(&fingerprint(call))?
                        .iter()
                        .copied()
                        .find(|i| !claimed.contains(i))
                });
                match found {
                    Some(i) => {
                        claimed.insert(i);
                        let original = &self.originals[i];
                        if original.id != call.id {
                            learned.insert(call.id.clone(), i);
                        }
                        if original.arguments != call.arguments || original.name != call.name {
                            report.reformatted += 1;
                        }
                        report.restored += 1;
                        *call = original.clone();
                    }
                    None => report.foreign += 1,
                }
            }
            if let Some(id) = &m.tool_call_id {
                let mapped = self
                    .by_id
                    .get(id)
                    .or_else(|| self.aliases.get(id))
                    .or_else(|| learned.get(id))
                    .map(|&i| self.originals[i].id.clone());
                match mapped {
                    Some(orig) => m2.tool_call_id = Some(orig),
                    None if incoming_ids.contains(id.as_str()) => {}
                    None => {
                        return Err(ToolCacheError::UnknownToolResponse {
                            message: mi,
                            id: id.clone(),
                        });
                    }
                }
            }
            out.push(m2);
        }
        self.aliases.extend(learned);
        Ok((out, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "bash".into(),
            arguments: args.into(),
        }
    }

    fn assistant(calls: Vec<ToolCall>) -> ChatMessage {
        ChatMessage {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: calls,
            tool_call_id: None,
        }
    }

    fn tool(id: &str) -> ChatMessage {
        ChatMessage {
            role: Role::Tool,
            content: "ok".into(),
            tool_calls: vec![],
            tool_call_id: Some(id.into()),
        }
    }

    #[test]
    fn canonical_form_ignores_key_order_and_spacing() {
        let a = call("x", r#"{"cmd": "ls", "opts": {"a": 1, "b": [true, null]}}"#);
        let b = call("y", r#"{"opts":{"b":[true,null],"a":1},"cmd":"ls"}"#);
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&call("x", r#"{"cmd":"pwd"}"#)));
    }

    #[test]
    fn renamed_and_reordered_calls_are_restored() {
        let mut cache = ToolCallCache::new();
        let orig = call("call_1", r#"{"cmd": "ls", "dir": "/"}"#);
        cache.record(std::slice::from_ref(&orig)).unwrap();
        let incoming = vec![
            assistant(vec![call("toolu_A", r#"{"dir":"/","cmd":"ls"}"#)]),
            tool("toolu_A"),
        ];
        let (restored, report) = cache.restore(&incoming).unwrap();
        assert_eq!(restored[0].tool_calls[0], orig);
        assert_eq!(restored[1].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(
            report,
            RestoreReport {
                restored: 1,
                reformatted: 1,
                foreign: 0
            }
        );
        // The incoming id still correlates to the original.
        assert_eq!(cache.original("toolu_A"), Some(&orig));
    }

    #[test]
    fn identical_calls_map_in_order() {
        let mut cache = ToolCallCache::new();
        cache.record(&[call("a", r#"{"cmd":"ls"}"#)]).unwrap();
        cache.record(&[call("b", r#"{"cmd":"ls"}"#)]).unwrap();
        let incoming = vec![
            assistant(vec![call("x", r#"{ "cmd" : "ls" }"#)]),
            tool("x"),
            assistant(vec![call("y", r#"{"cmd":"ls"}"#)]),
            tool("y"),
        ];
        let (restored, _) = cache.restore(&incoming).unwrap();
        assert_eq!(restored[0].tool_calls[0].id, "a");
        assert_eq!(restored[2].tool_calls[0].id, "b");
        assert_eq!(restored[3].tool_call_id.as_deref(), Some("b"));
    }

    #[test]
    fn unknown_tool_response_is_an_error_and_changes_nothing() {
        let mut cache = ToolCallCache::new();
        cache.record(&[call("a", r#"{"cmd":"ls"}"#)]).unwrap();
        let incoming = vec![
            assistant(vec![call("renamed", r#"{"cmd":"ls"}"#)]),
            tool("ghost"),
        ];
        assert_eq!(
            cache.restore(&incoming),
            Err(ToolCacheError::UnknownToolResponse {
                message: 1,
                id: "ghost".into()
            })
        );
        assert_eq!(cache.original("renamed"), None);
    }

    #[test]
    fn foreign_calls_pass_through_and_duplicates_are_refused() {
        let mut cache = ToolCallCache::new();
        cache.record(&[call("a", r#"{"cmd":"ls"}"#)]).unwrap();
        assert!(matches!(
            cache.record(&[call("a", "{}")]),
            Err(ToolCacheError::DuplicateId { .. })
        ));
        let foreign = call("h1", r#"{"cmd":"make"}"#);
        let (restored, report) = cache
            .restore(&[assistant(vec![foreign.clone()]), tool("h1")])
            .unwrap();
        assert_eq!(restored[0].tool_calls[0], foreign);
        assert_eq!(report.foreign, 1);
    }
}
