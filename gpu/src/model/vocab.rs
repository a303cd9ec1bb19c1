//! The byte-level vocabulary: ids 0..=255 are raw bytes, then special
//! tokens for sequence boundaries, chat roles and tool calls. Any text
//! round-trips exactly, so the proxy's token ids are the model's.

/// Special tokens, in id order after the 256 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Special {
    Bos,
    Eos,
    System,
    User,
    Assistant,
    ToolCall,
    ToolResult,
    EndTurn,
}

impl Special {
    pub const ALL: [Special; 8] = [
        Special::Bos,
        Special::Eos,
        Special::System,
        Special::User,
        Special::Assistant,
        Special::ToolCall,
        Special::ToolResult,
        Special::EndTurn,
    ];

    pub fn id(self) -> u32 {
        256 + self as u32
    }

    pub fn from_id(id: u32) -> Option<Special> {
        id.checked_sub(256)
            .and_then(|i| Special::ALL.get(i as usize).copied())
    }

    pub fn text(self) -> &'static str {
        match self {
            Special::Bos => "<|bos|>",
            Special::Eos => "<|eos|>",
            Special::System => "<|system|>",
            Special::User => "<|user|>",
            Special::Assistant => "<|assistant|>",
            Special::ToolCall => "<|tool_call|>",
            Special::ToolResult => "<|tool_result|>",
            Special::EndTurn => "<|end|>",
        }
    }
}

/// Bytes plus special tokens.
pub const VOCAB_SIZE: usize = 256 + Special::ALL.len();

/// Who speaks a chat turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    ToolCall,
    ToolResult,
}

impl Role {
    fn special(self) -> Special {
        match self {
            Role::System => Special::System,
            Role::User => Special::User,
            Role::Assistant => Special::Assistant,
            Role::ToolCall => Special::ToolCall,
            Role::ToolResult => Special::ToolResult,
        }
    }
}

/// Text to ids: one id per byte.
pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Ids to text; special tokens are rendered by name, ids outside the
/// vocabulary as `<|?N|>`, invalid UTF-8 lossily.
pub fn decode(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut bytes = Vec::new();
    let flush = |bytes: &mut Vec<u8>, out: &mut String| {
        out.push_str(&String::from_utf8_lossy(bytes));
        bytes.clear();
    };
    for &id in ids {
        if id < 256 {
            bytes.push(id as u8);
            continue;
        }
        flush(&mut bytes, &mut out);
        match Special::from_id(id) {
            Some(s) => out.push_str(s.text()),
            None => out.push_str(&format!("<|?{id}|>")),
        }
    }
    flush(&mut bytes, &mut out);
    out
}

/// A chat rendered to ids: `<|bos|>` then, per turn, the role marker, the
/// content bytes and `<|end|>`; ends with `<|assistant|>` so the model
/// writes the next assistant turn.
pub fn chat(turns: &[(Role, &str)]) -> Vec<u32> {
    let mut ids = vec![Special::Bos.id()];
    for (role, text) in turns {
        ids.push(role.special().id());
        ids.extend(encode(text));
        ids.push(Special::EndTurn.id());
    }
    ids.push(Special::Assistant.id());
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_specials_render() {
        let s = "héllo, {\"tool\": 1}";
        assert_eq!(decode(&encode(s)), s);
        let ids = chat(&[(Role::User, "hi")]);
        assert_eq!(decode(&ids), "<|bos|><|user|>hi<|end|><|assistant|>");
        assert_eq!(
            Special::from_id(Special::ToolCall.id()),
            Some(Special::ToolCall)
        );
        assert_eq!(Special::from_id(255), None);
        assert_eq!(decode(&[9999]), "<|?9999|>");
        assert_eq!(VOCAB_SIZE, 264);
    }
}
