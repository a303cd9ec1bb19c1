//! One execution's state at the proxy: its key, its TITO records, its
//! trajectory tree and tool-call cache (the trajectory plane's, used as
//! they are), and the index that finds which recorded call a request's
//! history extends.
//!
//! History is compared as canonical messages (role, trimmed text, tool name
//! and canonical arguments, the original call id a tool result answers),
//! never as bytes: harnesses re-serialise what they sent (a string becomes a
//! text block, cache_control moves, tool inputs are re-encoded).

use gyre_actors::trajectory::tool_cache::{self, ToolCallCache};
use gyre_actors::trajectory::{TitoRecord, TrajectoryTree, TreeConfig};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::chat::{Message, Role, ToolCall};

/// What the store keeps about an execution besides its calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionMeta {
    pub id: String,
    pub key: String,
    #[serde(default)]
    pub query: Option<serde_json::Value>,
    #[serde(default)]
    pub group: Option<String>,
    pub closed: bool,
}

/// One committed call as stored: the record and what rebuilds the indexes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredCall {
    pub record: TitoRecord,
    /// Chain hash of the request's messages plus the reply.
    pub history_hash: u64,
    /// The reply's tool calls exactly as produced: (id, name, arguments).
    pub tool_calls: Vec<(String, String, String)>,
}

pub struct Execution {
    pub meta: ExecutionMeta,
    pub records: Vec<TitoRecord>,
    pub tree: TrajectoryTree,
    pub tool_cache: ToolCallCache,
    /// History chain hash → index into `records`.
    turns: FxHashMap<u64, usize>,
    /// Call numbers handed out (committed or not).
    pub next_call: u64,
    /// Stored Responses-API conversations (request and reply) by response
    /// id, for `previous_response_id`; kept in memory only.
    pub responses: FxHashMap<String, Vec<Message>>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Canonical text of a message for history matching (reasoning excluded:
/// clients drop or keep it freely).
fn canonical(m: &Message, out: &mut String) {
    out.clear();
    out.push_str(m.role.as_str());
    out.push('\u{1}');
    out.push_str(m.content.trim());
    for c in &m.tool_calls {
        out.push('\u{2}');
        out.push_str(&c.name);
        out.push('\u{3}');
        match serde_json::from_str::<serde_json::Value>(&c.arguments) {
            Ok(v) => tool_cache::write_canonical(&v, out),
            Err(_) => out.push_str(c.arguments.trim()),
        }
    }
    if let Some(id) = &m.tool_call_id {
        out.push('\u{4}');
        out.push_str(id);
    }
}

/// Chain hashes: element `j` covers `messages[..=j]`.
pub fn chain_hashes(messages: &[Message], start: u64) -> Vec<u64> {
    let mut h = start;
    let mut buf = String::new();
    messages
        .iter()
        .map(|m| {
            canonical(m, &mut buf);
            h = fnv(h, &(buf.len() as u64).to_le_bytes());
            h = fnv(h, buf.as_bytes());
            h
        })
        .collect()
}

pub fn chain_start() -> u64 {
    FNV_OFFSET
}

fn to_cache(m: &Message) -> tool_cache::ChatMessage {
    tool_cache::ChatMessage {
        role: match m.role {
            Role::System => tool_cache::Role::System,
            Role::User => tool_cache::Role::User,
            Role::Assistant => tool_cache::Role::Assistant,
            Role::Tool => tool_cache::Role::Tool,
        },
        content: String::new(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| tool_cache::ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
        tool_call_id: m.tool_call_id.clone(),
    }
}

impl Execution {
    pub fn new(meta: ExecutionMeta, vocab_size: u32) -> Execution {
        let config = TreeConfig {
            vocab_size: Some(vocab_size),
            ..TreeConfig::anchored(64)
        };
        Execution {
            tree: TrajectoryTree::new(meta.id.clone(), config),
            meta,
            records: Vec::new(),
            tool_cache: ToolCallCache::new(),
            turns: FxHashMap::default(),
            next_call: 0,
            responses: FxHashMap::default(),
        }
    }

    /// Restores re-serialised tool calls to the originals the model produced
    /// and points tool results at original ids.
    pub fn restore(&mut self, messages: &mut [Message]) -> Result<(), tool_cache::ToolCacheError> {
        let incoming: Vec<_> = messages.iter().map(to_cache).collect();
        let (restored, _) = self.tool_cache.restore(&incoming)?;
        for (m, r) in messages.iter_mut().zip(restored) {
            for (c, rc) in m.tool_calls.iter_mut().zip(r.tool_calls) {
                *c = ToolCall {
                    id: rc.id,
                    name: rc.name,
                    arguments: rc.arguments,
                };
            }
            m.tool_call_id = r.tool_call_id;
        }
        Ok(())
    }

    /// The recorded call the history extends the furthest: (record, number
    /// of messages it covers, ending with its assistant reply).
    pub fn find_prior(&self, hashes: &[u64], messages: &[Message]) -> Option<(&TitoRecord, usize)> {
        (1..=hashes.len()).rev().find_map(|n| {
            if messages[n - 1].role != Role::Assistant {
                return None;
            }
            let &i = self.turns.get(&hashes[n - 1])?;
            Some((&self.records[i], n))
        })
    }

    /// Adds a committed call to the record list, tree, cache and index.
    pub fn apply(&mut self, stored: &StoredCall) {
        if let Err(e) = self.tree.insert(&stored.record) {
            tracing::warn!(execution = %self.meta.id, call = %stored.record.call_id,
                "record kept but not added to the trajectory tree: {e}");
        }
        let calls: Vec<_> = stored
            .tool_calls
            .iter()
            .map(|(id, name, arguments)| tool_cache::ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            })
            .collect();
        if let Err(e) = self.tool_cache.record(&calls) {
            tracing::warn!(execution = %self.meta.id, "tool calls not cached: {e}");
        }
        self.turns.insert(stored.history_hash, self.records.len());
        self.records.push(stored.record.clone());
        self.next_call = self.next_call.max(self.records.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_history_ignores_formatting() {
        let mut a = Message::text(Role::Assistant, " done \n");
        a.tool_calls.push(ToolCall {
            id: "x".into(),
            name: "f".into(),
            arguments: r#"{"b": 1, "a": [2]}"#.into(),
        });
        let mut b = Message::text(Role::Assistant, "done");
        b.tool_calls.push(ToolCall {
            id: "y".into(),
            name: "f".into(),
            arguments: r#"{"a":[2],"b":1}"#.into(),
        });
        b.reasoning = Some("hidden".into());
        assert_eq!(chain_hashes(&[a.clone()], 1), chain_hashes(&[b], 1));
        let c = Message::text(Role::User, " done \n");
        assert_ne!(chain_hashes(&[a], 1), chain_hashes(&[c], 1));
    }
}
