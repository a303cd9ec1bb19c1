//! One agent thread's context as exact token ids, in the chat format of
//! `gyre_gpu::model::vocab::chat`.
//!
//! The harness only ever appends to a context (the previous prompt, the
//! exact output ids the engine returned, a tool result), so each call's
//! prompt extends the last one token for token and the calls of a thread
//! share one path of the execution's trajectory tree. A compaction starts a
//! fresh context, which is a new root there.

use gyre_gpu::model::vocab::{Role, Special, encode};

use super::spec::{MAIN_SYSTEM, SUB_SYSTEM, query_text};

/// Ids of a thread's context, without the assistant header of the next call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    ids: Vec<u32>,
    /// Offsets where each message ends (exclusive), ascending.
    ends: Vec<u32>,
}

fn role_id(role: Role) -> u32 {
    match role {
        Role::System => Special::System.id(),
        Role::User => Special::User.id(),
        Role::Assistant => Special::Assistant.id(),
        Role::ToolCall => Special::ToolCall.id(),
        Role::ToolResult => Special::ToolResult.id(),
    }
}

/// Tokens that end an answer; the engine keeps the stop token it sampled.
pub fn stop_tokens() -> Vec<u32> {
    vec![Special::EndTurn.id(), Special::Eos.id()]
}

impl Context {
    fn open(turns: &[(Role, &str)]) -> Self {
        let mut c = Self {
            ids: vec![Special::Bos.id()],
            ends: Vec::new(),
        };
        for (role, text) in turns {
            c.push_turn(*role, text);
        }
        c
    }

    /// The main agent's first context on query `q`.
    pub fn main(q: u64) -> Self {
        Self::open(&[(Role::System, MAIN_SYSTEM), (Role::User, &query_text(q))])
    }

    /// A sub-agent's context on query `q`.
    pub fn sub_agent(q: u64) -> Self {
        Self::open(&[(Role::System, SUB_SYSTEM), (Role::User, &query_text(q))])
    }

    /// The main agent's context after compaction: the query again and a
    /// summary of the `hits` of `done` main calls so far.
    pub fn compacted(q: u64, hits: u32, done: u32) -> Self {
        let summary = format!("so far {hits}/{done}");
        Self::open(&[
            (Role::System, MAIN_SYSTEM),
            (Role::User, &query_text(q)),
            (Role::User, &summary),
        ])
    }

    fn push_turn(&mut self, role: Role, text: &str) {
        self.ids.push(role_id(role));
        self.ids.extend(encode(text));
        self.ids.push(Special::EndTurn.id());
        self.ends.push(self.ids.len() as u32);
    }

    /// Appends the answer to the call whose prompt was this context's
    /// [`Context::prompt`]: the assistant header, the exact output ids and,
    /// when the engine stopped on length, an end-of-turn.
    pub fn push_answer(&mut self, output: &[u32]) {
        self.ids.push(Special::Assistant.id());
        self.ids.extend_from_slice(output);
        let stops = stop_tokens();
        if !output.last().is_some_and(|t| stops.contains(t)) {
            self.ids.push(Special::EndTurn.id());
        }
        self.ends.push(self.ids.len() as u32);
    }

    pub fn push_tool_result(&mut self, text: &str) {
        self.push_turn(Role::ToolResult, text);
    }

    /// The next call's input ids: the context and an assistant header.
    pub fn prompt(&self) -> Vec<u32> {
        let mut p = self.ids.clone();
        p.push(Special::Assistant.id());
        p
    }

    pub fn prompt_len(&self) -> usize {
        self.ids.len() + 1
    }

    /// Message ends of [`Context::prompt`].
    pub fn message_ends(&self) -> Vec<u32> {
        self.ends.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_gpu::model::vocab::chat;

    #[test]
    fn prompts_are_the_chat_format_and_extend_each_other() {
        let c = Context::main(3);
        assert_eq!(
            c.prompt(),
            chat(&[(Role::System, MAIN_SYSTEM), (Role::User, "task 3")])
        );
        assert_eq!(c.prompt_len(), c.prompt().len());
        let first = c.prompt();
        let mut c2 = c.clone();
        let out = [u32::from(b'd'), u32::from(b'x')];
        c2.push_answer(&out);
        c2.push_tool_result("ok");
        let second = c2.prompt();
        assert_eq!(&second[..first.len()], &first[..]);
        assert_eq!(&second[first.len()..first.len() + 2], &out[..]);
        // Stopped on length: the harness closes the turn itself.
        assert_eq!(second[first.len() + 2], Special::EndTurn.id());
        let ends = c2.message_ends();
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*ends.last().unwrap() as usize, second.len() - 1);
    }

    #[test]
    fn a_stop_token_closes_the_turn_once() {
        // The next prompt is the last one, the output and a new header.
        let mut c = Context::main(0);
        let before = c.prompt_len();
        c.push_answer(&[u32::from(b'a'), Special::EndTurn.id()]);
        assert_eq!(c.prompt_len(), before + 2 + 1);
        c.push_answer(&[u32::from(b'a'), u32::from(b'b')]);
        assert_eq!(c.prompt_len(), before + 3 + 2 + 1 + 1);
    }

    #[test]
    fn compaction_branches_and_sub_agents_start_a_new_root() {
        let main = Context::main(5).prompt();
        let comp = Context::compacted(5, 1, 2).prompt();
        let sub = Context::sub_agent(5).prompt();
        assert_ne!(&comp[..main.len()], &main[..]);
        assert_ne!(sub[2], main[2]);
    }
}
