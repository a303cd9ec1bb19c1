//! A seeded generator of harness-like traces: a main agent whose turns call
//! tools and spawn sub-agents (each with its own system prompt, some sharing
//! one), compaction into summaries that are pasted into a fresh context,
//! retried requests whose first output the harness discarded, and tool calls
//! the harness re-serialises (keys reordered, ids renamed) before sending
//! them back. A simulated proxy restores payloads through the
//! [`ToolCallCache`] and tokenises with the toy [`template`], producing the
//! [`TitoRecord`]s a real proxy would.
//!
//! The plan fixes the message-level shape exactly (calls per segment, path
//! length in messages per segment); the seed fixes contents, sizes, retries
//! and which turns call more than one tool. [`shape`] recomputes the
//! expected statistics from the generator's bookkeeping.

pub mod shape;
pub mod template;

use std::collections::BTreeMap;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::profile::ProfileConfig;
use super::tito::{CallPurpose, TitoRecord};
use super::tool_cache::{ChatMessage, Role, ToolCacheError, ToolCall, ToolCallCache};
use template::{GENERATION_PROMPT, encode, encode_text, render_message, render_output};

/// Text in the main agent's system prompt that a profile can match.
pub const MAIN_MARKER: &str = "You are the main coding agent.";
/// Text of the instruction that asks for a compaction summary.
pub const COMPACTION_MARKER: &str = "Summarize the conversation so far for compaction.";

/// The Claude-Code-like profile matching this generator's prompts.
pub fn profile() -> ProfileConfig {
    ProfileConfig::claude_code(encode(MAIN_MARKER), encode(COMPACTION_MARKER))
}

/// Message sizes in bytes (one toy token per byte); ranges are inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    pub system: usize,
    pub task: usize,
    pub env: usize,
    pub output: (usize, usize),
    pub tool_result: (usize, usize),
    pub summary: (usize, usize),
}

impl Sizes {
    /// Tiny messages: shape tests and sample files.
    pub fn tiny() -> Self {
        Sizes {
            system: 120,
            task: 40,
            env: 30,
            output: (12, 40),
            tool_result: (12, 60),
            summary: (30, 60),
        }
    }

    /// About 1,100 new tokens per call and a 12K-token system prompt: the
    /// reference shape then holds about 700K unique tokens.
    pub fn realistic() -> Self {
        Sizes {
            system: 12_000,
            task: 400,
            env: 300,
            output: (150, 650),
            tool_result: (200, 1_500),
            summary: (2_000, 4_000),
        }
    }

    /// Every size multiplied by `k`.
    pub fn scaled(self, k: usize) -> Self {
        Sizes {
            system: self.system * k,
            task: self.task * k,
            env: self.env * k,
            output: (self.output.0 * k, self.output.1 * k),
            tool_result: (self.tool_result.0 * k, self.tool_result.1 * k),
            summary: (self.summary.0 * k, self.summary.1 * k),
        }
    }
}

/// Between two compactions: `calls` model calls; the last call's output ends
/// a path of `path_messages` messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentPlan {
    pub calls: usize,
    pub path_messages: usize,
}

/// One agent thread. `system_variant` 0 is the main agent's prompt; sub-agents
/// with the same variant share a system prompt (and hence a root).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPlan {
    pub system_variant: u32,
    /// A third initial message (environment) after the system prompt and task.
    pub extra_context: bool,
    /// A compaction separates consecutive segments.
    pub segments: Vec<SegmentPlan>,
}

impl ThreadPlan {
    fn initial_messages(&self) -> usize {
        2 + usize::from(self.extra_context)
    }
}

/// Main-agent call `call` (1-based) of `segment` spawns these sub-agent threads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawn {
    pub segment: usize,
    pub call: usize,
    pub threads: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SynthConfig {
    pub seed: u64,
    pub execution: String,
    /// Thread 0 is the main agent; every other thread is spawned once.
    pub threads: Vec<ThreadPlan>,
    pub spawns: Vec<Spawn>,
    pub sizes: Sizes,
    /// Chance that a call is preceded by an attempt the harness discarded.
    pub retry_probability: f64,
    pub reserialize_tool_calls: bool,
    pub restore_tool_calls: bool,
    /// Write each record's class into its `role` field.
    pub emit_roles: bool,
    pub calls_per_version: u64,
}

impl SynthConfig {
    /// The reference execution of SPEC 3.2: 636 requests, 1,347 unique
    /// message nodes, 10 candidates of 53–293 messages, 1,716 occurrences
    /// expanded; after compaction the main agent shares 168 message nodes
    /// with its summary and a sub-agent 193.
    pub fn reference(seed: u64, sizes: Sizes) -> Self {
        let seg = |calls, path_messages| SegmentPlan {
            calls,
            path_messages,
        };
        let sub = |extra_context, variant, segments| ThreadPlan {
            system_variant: variant,
            extra_context,
            segments,
        };
        SynthConfig {
            seed,
            execution: format!("ref-{seed}"),
            threads: vec![
                sub(false, 0, vec![seg(80, 169), seg(118, 250)]),
                sub(true, 1, vec![seg(92, 194), seg(24, 53)]),
                sub(true, 1, vec![seg(70, 150)]),
                sub(true, 1, vec![seg(61, 130)]),
                sub(true, 1, vec![seg(52, 112)]),
                sub(false, 2, vec![seg(137, 293)]),
            ],
            spawns: vec![
                Spawn {
                    segment: 0,
                    call: 10,
                    threads: vec![1],
                },
                Spawn {
                    segment: 0,
                    call: 40,
                    threads: vec![2, 3],
                },
                Spawn {
                    segment: 1,
                    call: 20,
                    threads: vec![4],
                },
                Spawn {
                    segment: 1,
                    call: 60,
                    threads: vec![5],
                },
            ],
            sizes,
            retry_probability: 0.0,
            reserialize_tool_calls: true,
            restore_tool_calls: true,
            emit_roles: false,
            calls_per_version: 64,
        }
    }

    /// A short execution: a main agent with one compaction and two
    /// sub-agents sharing a system prompt; retries at `retry_probability`.
    pub fn small(seed: u64, execution: impl Into<String>) -> Self {
        let seg = |calls, path_messages| SegmentPlan {
            calls,
            path_messages,
        };
        SynthConfig {
            seed,
            execution: execution.into(),
            threads: vec![
                ThreadPlan {
                    system_variant: 0,
                    extra_context: false,
                    segments: vec![seg(8, 17), seg(6, 14)],
                },
                ThreadPlan {
                    system_variant: 1,
                    extra_context: true,
                    segments: vec![seg(5, 12)],
                },
                ThreadPlan {
                    system_variant: 1,
                    extra_context: true,
                    segments: vec![seg(4, 11)],
                },
            ],
            spawns: vec![
                Spawn {
                    segment: 0,
                    call: 3,
                    threads: vec![1],
                },
                Spawn {
                    segment: 1,
                    call: 2,
                    threads: vec![2],
                },
            ],
            sizes: Sizes::tiny(),
            retry_probability: 0.1,
            reserialize_tool_calls: true,
            restore_tool_calls: true,
            emit_roles: true,
            calls_per_version: 8,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SynthError {
    #[error("synthetic plan: {0}")]
    Plan(String),
    #[error(transparent)]
    ToolCache(#[from] ToolCacheError),
}

/// A generated execution.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthExecution {
    pub records: Vec<TitoRecord>,
    /// Per record: the message instances of its context, then its output.
    pub message_paths: Vec<Vec<u64>>,
    /// Retried attempts generated (each is one extra record and leaf).
    pub retries: usize,
}

/// One message of a history: its instance id and the harness's view of it.
#[derive(Clone, Debug)]
struct Msg {
    id: u64,
    harness: ChatMessage,
}

#[derive(Clone, Debug, Default)]
struct ThreadState {
    initial: Vec<Msg>,
    history: Vec<Msg>,
    rendered: Vec<u32>,
    ends: Vec<u32>,
    rendered_msgs: usize,
    segment: usize,
    calls: usize,
    /// Tool calls per call, per segment (index call - 1).
    tools: Vec<Vec<usize>>,
    parent_call: Option<String>,
    /// Tool calls of the last turn, waiting for sub-agents to answer.
    pending: Vec<(ToolCall, Option<usize>)>,
    final_answer: Option<String>,
}

enum Step {
    Continue,
    Done,
    Spawned(Vec<usize>),
}

const WORDS: &[&str] = &[
    "the",
    "parser",
    "returns",
    "a",
    "list",
    "of",
    "tokens",
    "for",
    "each",
    "file",
    "in",
    "repository",
    "test",
    "fails",
    "because",
    "config",
    "is",
    "missing",
    "we",
    "need",
    "to",
    "update",
    "module",
    "function",
    "error",
    "handling",
    "build",
    "passes",
    "now",
    "check",
    "output",
    "line",
    "value",
    "index",
    "struct",
    "field",
    "import",
    "path",
    "crate",
    "read",
    "write",
    "cache",
    "request",
    "response",
    "client",
    "server",
    "retry",
    "loop",
    "count",
    "schema",
    "table",
    "query",
    "result",
    "option",
    "string",
    "number",
    "array",
    "object",
];

fn text(rng: &mut ChaCha8Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 12);
    while s.len() < bytes {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS.choose(rng).copied().unwrap_or("x"));
    }
    s
}

fn sized(rng: &mut ChaCha8Rng, (lo, hi): (usize, usize)) -> usize {
    rng.random_range(lo..=hi.max(lo))
}

/// How a harness re-serialises arguments: keys reversed, spaced out.
fn reorder_keys(arguments: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(map)) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            keys.reverse();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}: {}", serde_json::Value::String(k.clone()), map[k]))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        _ => arguments.to_string(),
    }
}

struct Gen<'a> {
    cfg: &'a SynthConfig,
    rng: ChaCha8Rng,
    cache: ToolCallCache,
    records: Vec<TitoRecord>,
    paths: Vec<Vec<u64>>,
    threads: Vec<ThreadState>,
    spawn_at: BTreeMap<(usize, usize), Vec<usize>>,
    next_msg: u64,
    next_tool: u64,
    clock: u64,
    retries: usize,
    /// Message ids of shared system prompts, by variant.
    system_ids: BTreeMap<u32, (u64, String)>,
}

/// Generates one execution. Deterministic in the config.
pub fn generate(cfg: &SynthConfig) -> Result<SynthExecution, SynthError> {
    let spawn_at = validate(cfg)?;
    let mut g = Gen {
        cfg,
        rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        cache: ToolCallCache::new(),
        records: Vec::new(),
        paths: Vec::new(),
        threads: vec![ThreadState::default(); cfg.threads.len()],
        spawn_at,
        next_msg: 0,
        next_tool: 0,
        clock: 0,
        retries: 0,
        system_ids: BTreeMap::new(),
    };
    for t in 0..cfg.threads.len() {
        g.threads[t].tools = g.distribute_tools(t)?;
    }
    g.start_thread(
        0,
        None,
        "Build the project described in the specification.".into(),
    );
    loop {
        match g.step(0)? {
            Step::Continue => {}
            Step::Done => break,
            Step::Spawned(subs) => {
                let mut live = subs.clone();
                while !live.is_empty() {
                    let mut still = Vec::new();
                    for &s in &live {
                        if !matches!(g.step(s)?, Step::Done) {
                            still.push(s);
                        }
                    }
                    live = still;
                }
                g.answer_pending(0);
            }
        }
    }
    Ok(SynthExecution {
        records: g.records,
        message_paths: g.paths,
        retries: g.retries,
    })
}

/// Checks the plan can be realised; returns the spawn table.
fn validate(cfg: &SynthConfig) -> Result<BTreeMap<(usize, usize), Vec<usize>>, SynthError> {
    let bad = |s: String| Err(SynthError::Plan(s));
    if cfg.threads.is_empty() {
        return bad("no threads".into());
    }
    let mut spawned = vec![0usize; cfg.threads.len()];
    let mut table = BTreeMap::new();
    for s in &cfg.spawns {
        let Some(seg) = cfg.threads[0].segments.get(s.segment) else {
            return bad(format!("spawn in missing main segment {}", s.segment));
        };
        if s.call == 0 || s.call >= seg.calls || s.threads.is_empty() {
            return bad(format!(
                "spawn at call {} of a {}-call segment needs 1 <= call < calls and threads",
                s.call, seg.calls
            ));
        }
        for &t in &s.threads {
            if t == 0 || t >= cfg.threads.len() {
                return bad(format!("spawn names thread {t}"));
            }
            spawned[t] += 1;
        }
        if table
            .insert((s.segment, s.call), s.threads.clone())
            .is_some()
        {
            return bad(format!("two spawns at ({}, {})", s.segment, s.call));
        }
    }
    if let Some(t) = (1..cfg.threads.len()).find(|&t| spawned[t] != 1) {
        return bad(format!(
            "thread {t} is spawned {} times, not once",
            spawned[t]
        ));
    }
    if !(0.0..1.0).contains(&cfg.retry_probability) {
        return bad("retry_probability must be in [0, 1)".into());
    }
    for (t, th) in cfg.threads.iter().enumerate() {
        if th.segments.is_empty() || th.segments.iter().any(|s| s.calls == 0) {
            return bad(format!("thread {t} needs segments of at least one call"));
        }
    }
    Ok(table)
}

impl Gen<'_> {
    /// Tool calls per call so that each segment's path has its planned
    /// length: Σ_{j<T} (1 + p_j) + 1 + initial messages = path_messages.
    fn distribute_tools(&mut self, t: usize) -> Result<Vec<Vec<usize>>, SynthError> {
        let plan = &self.cfg.threads[t];
        let mut out = Vec::new();
        for (k, seg) in plan.segments.iter().enumerate() {
            let last = k + 1 == plan.segments.len();
            let h0 = plan.initial_messages() + usize::from(k > 0);
            let mut p = vec![1usize; seg.calls];
            let fixed: Vec<bool> = (1..=seg.calls)
                .map(|j| t == 0 && self.spawn_at.contains_key(&(k, j)))
                .collect();
            for j in 1..=seg.calls {
                if fixed[j - 1] {
                    p[j - 1] = self.spawn_at[&(k, j)].len();
                }
            }
            if last {
                p[seg.calls - 1] = 0;
            }
            let have: usize = p[..seg.calls - 1].iter().sum();
            let want = seg
                .path_messages
                .checked_sub(h0 + seg.calls)
                .ok_or_else(|| {
                    SynthError::Plan(format!("thread {t} segment {k}: path too short"))
                })?;
            if want < have {
                return Err(SynthError::Plan(format!(
                    "thread {t} segment {k}: {} messages cannot hold {} calls",
                    seg.path_messages, seg.calls
                )));
            }
            let mut extra = want - have;
            let free: Vec<usize> = (0..seg.calls - 1).filter(|&j| !fixed[j]).collect();
            if extra > 2 * free.len() {
                return Err(SynthError::Plan(format!(
                    "thread {t} segment {k}: {} messages need more than 3 tools per call",
                    seg.path_messages
                )));
            }
            while extra > 0 {
                let j = free[self.rng.random_range(0..free.len())];
                if p[j] < 3 {
                    p[j] += 1;
                    extra -= 1;
                }
            }
            out.push(p);
        }
        Ok(out)
    }

    fn new_msg(&mut self, role: Role, content: String) -> Msg {
        self.next_msg += 1;
        Msg {
            id: self.next_msg,
            harness: ChatMessage {
                role,
                content,
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
        }
    }

    fn start_thread(&mut self, t: usize, parent: Option<String>, task: String) {
        let plan = &self.cfg.threads[t];
        let variant = plan.system_variant;
        let extra = plan.extra_context;
        let (sys_id, sys_text) = match self.system_ids.get(&variant) {
            Some(v) => v.clone(),
            None => {
                let mut r = ChaCha8Rng::seed_from_u64(self.cfg.seed ^ (u64::from(variant) << 32));
                let head = if variant == 0 {
                    MAIN_MARKER.to_string()
                } else {
                    format!("You are a sub-agent of type {variant}.")
                };
                let body = text(&mut r, self.cfg.sizes.system);
                self.next_msg += 1;
                let v = (self.next_msg, format!("{head} {body}"));
                self.system_ids.insert(variant, v.clone());
                v
            }
        };
        let mut initial = vec![Msg {
            id: sys_id,
            harness: ChatMessage {
                role: Role::System,
                content: sys_text,
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
        }];
        let task_body = text(&mut self.rng, self.cfg.sizes.task);
        initial.push(self.new_msg(Role::User, format!("{task} {task_body}")));
        if extra {
            let env = text(&mut self.rng, self.cfg.sizes.env);
            initial.push(self.new_msg(Role::User, format!("<env> cwd=/repo/t{t} {env}")));
        }
        let th = &mut self.threads[t];
        th.history = initial.clone();
        th.initial = initial;
        th.parent_call = parent;
        th.rendered.clear();
        th.ends.clear();
        th.rendered_msgs = 0;
    }

    /// The proxy: restore and tokenise the messages new since the last call.
    fn render_new(&mut self, t: usize) -> Result<(), SynthError> {
        let th = &self.threads[t];
        let fresh: Vec<ChatMessage> = th.history[th.rendered_msgs..]
            .iter()
            .map(|m| m.harness.clone())
            .collect();
        let msgs = if self.cfg.restore_tool_calls {
            self.cache.restore(&fresh)?.0
        } else {
            fresh
        };
        let th = &mut self.threads[t];
        for m in &msgs {
            render_message(m, &mut th.rendered);
            th.ends.push(th.rendered.len() as u32);
        }
        th.rendered_msgs = th.history.len();
        Ok(())
    }

    fn role(&self, t: usize, summary: bool) -> Option<String> {
        if !self.cfg.emit_roles {
            return None;
        }
        let r = match (t == 0, summary) {
            (true, false) => "main",
            (true, true) => "main-summary",
            (false, false) => "sub-agent",
            (false, true) => "sub-agent-summary",
        };
        Some(r.to_string())
    }

    /// Records one call; returns the message id of its output.
    fn emit(
        &mut self,
        t: usize,
        input: Vec<u32>,
        ends: Vec<u32>,
        output: Vec<u32>,
        summary: bool,
        mut path: Vec<u64>,
    ) -> u64 {
        let n = self.records.len() as u64;
        let logprobs = (0..output.len())
            .map(|_| -self.rng.random_range(0.001f32..4.0))
            .collect();
        let version = n / self.cfg.calls_per_version.max(1);
        let start = self.clock + 1_000_000 * self.rng.random_range(1..50u64);
        let end = start + 20_000 * output.len() as u64;
        self.clock = end;
        self.next_msg += 1;
        path.push(self.next_msg);
        self.paths.push(path);
        self.records.push(TitoRecord {
            execution: self.cfg.execution.clone(),
            call_id: format!("c{n}"),
            thread: Some(if t == 0 {
                "main".into()
            } else {
                format!("sub-{t}")
            }),
            parent_call: self.threads[t].parent_call.clone(),
            role: self.role(t, summary),
            purpose: CallPurpose::Policy,
            policy_version: version,
            engine: Some(format!("cell-{}", version % 4)),
            start_ns: start,
            end_ns: end,
            input_ids: input,
            input_message_ends: ends,
            output_ids: output,
            output_logprobs: logprobs,
            output_sources: Vec::new(),
        });
        self.next_msg
    }

    fn tool_call(&mut self, name: &str, arguments: String) -> ToolCall {
        self.next_tool += 1;
        ToolCall {
            id: format!("call_{}", self.next_tool),
            name: name.into(),
            arguments,
        }
    }

    fn harness_view(&self, c: &ToolCall) -> ToolCall {
        if !self.cfg.reserialize_tool_calls {
            return c.clone();
        }
        ToolCall {
            id: format!(
                "toolu_{:08x}",
                (c.id.len() as u64 * 2_654_435_761) ^ self.hash_id(&c.id)
            ),
            name: c.name.clone(),
            arguments: reorder_keys(&c.arguments),
        }
    }

    fn hash_id(&self, id: &str) -> u64 {
        id.bytes().fold(self.cfg.seed ^ 0x9E37_79B9, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        })
    }

    /// One model call of thread `t` (a turn or a compaction).
    fn step(&mut self, t: usize) -> Result<Step, SynthError> {
        let plan = &self.cfg.threads[t];
        let k = self.threads[t].segment;
        let seg = plan.segments[k];
        let last_segment = k + 1 == plan.segments.len();
        if self.threads[t].calls == seg.calls {
            self.compact(t)?;
            return Ok(Step::Continue);
        }
        self.render_new(t)?;
        let j = self.threads[t].calls + 1;
        let th = &self.threads[t];
        let mut input = th.rendered.clone();
        input.extend_from_slice(&GENERATION_PROMPT);
        let ends = th.ends.clone();
        let ids: Vec<u64> = th.history.iter().map(|m| m.id).collect();

        if self.rng.random_bool(self.cfg.retry_probability) {
            // A malformed first attempt: cut-off text, no parsable tool call.
            let junk = text(&mut self.rng, 8);
            let mut out = Vec::new();
            encode_text(&format!("{junk} <tool_call>{{\"com"), &mut out);
            self.emit(t, input.clone(), ends.clone(), out, false, ids.clone());
            self.retries += 1;
        }

        let n_tools = self.threads[t].tools[k][j - 1];
        let spawns = if t == 0 {
            self.spawn_at.get(&(k, j)).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut calls = Vec::new();
        let mut targets = Vec::new();
        for &s in &spawns {
            let prompt = text(&mut self.rng, 24);
            let args = format!(
                "{{\"description\":\"explore part {s}\",\"prompt\":\"{prompt}\",\"subagent_type\":\"type-{}\"}}",
                self.cfg.threads[s].system_variant
            );
            calls.push(self.tool_call("Task", args));
            targets.push(Some(s));
        }
        while calls.len() < n_tools {
            let cmd = text(&mut self.rng, 16);
            let timeout = self.rng.random_range(1..600u32);
            let args = format!("{{\"command\":\"{cmd}\",\"timeout\":{timeout}}}");
            calls.push(self.tool_call("Bash", args));
            targets.push(None);
        }
        let len = sized(&mut self.rng, self.cfg.sizes.output);
        let content = text(&mut self.rng, len);
        let mut output = Vec::new();
        render_output(&content, &calls, &mut output);
        self.cache.record(&calls)?;
        let out_id = self.emit(t, input, ends, output, false, ids);
        self.threads[t].calls = j;

        if last_segment && j == seg.calls {
            self.threads[t].final_answer = Some(content);
            return Ok(Step::Done);
        }
        if j == seg.calls {
            // The turn before a compaction is replayed after it: its tool
            // round never reaches a recorded context.
            return Ok(Step::Continue);
        }
        let msg = Msg {
            id: out_id,
            harness: ChatMessage {
                role: Role::Assistant,
                content,
                tool_calls: calls.iter().map(|c| self.harness_view(c)).collect(),
                tool_call_id: None,
            },
        };
        self.threads[t].history.push(msg);
        self.threads[t].pending = calls.into_iter().zip(targets).collect();
        if spawns.is_empty() {
            self.answer_pending(t);
            return Ok(Step::Continue);
        }
        let parent = self.records.last().map(|r| r.call_id.clone());
        for &s in &spawns {
            let task = format!("Sub-task for thread {s}.");
            self.start_thread(s, parent.clone(), task);
        }
        Ok(Step::Spawned(spawns))
    }

    /// Appends the tool responses of `t`'s last turn to its history.
    fn answer_pending(&mut self, t: usize) {
        let pending = std::mem::take(&mut self.threads[t].pending);
        for (call, sub) in pending {
            let content = match sub {
                Some(s) => self.threads[s].final_answer.clone().unwrap_or_default(),
                None => {
                    let len = sized(&mut self.rng, self.cfg.sizes.tool_result);
                    text(&mut self.rng, len)
                }
            };
            let id = self.harness_view(&call).id;
            let mut msg = self.new_msg(Role::Tool, content);
            msg.harness.tool_call_id = Some(id);
            self.threads[t].history.push(msg);
        }
    }

    /// The compaction request, then a fresh context holding its summary.
    fn compact(&mut self, t: usize) -> Result<(), SynthError> {
        self.render_new(t)?;
        let instr_text = format!("{COMPACTION_MARKER} {}", text(&mut self.rng, 20));
        let instr = self.new_msg(Role::User, instr_text);
        let th = &self.threads[t];
        let mut input = th.rendered.clone();
        let mut ends = th.ends.clone();
        render_message(&instr.harness, &mut input);
        ends.push(input.len() as u32);
        input.extend_from_slice(&GENERATION_PROMPT);
        let mut ids: Vec<u64> = th.history.iter().map(|m| m.id).collect();
        ids.push(instr.id);
        let len = sized(&mut self.rng, self.cfg.sizes.summary);
        let summary = text(&mut self.rng, len);
        let mut output = Vec::new();
        render_output(&summary, &[], &mut output);
        self.emit(t, input, ends, output, true, ids);

        let msg = self.new_msg(
            Role::User,
            format!("This session continues an earlier conversation. Summary: {summary}"),
        );
        let th = &mut self.threads[t];
        th.history = th.initial.clone();
        th.history.push(msg);
        th.rendered.clear();
        th.ends.clear();
        th.rendered_msgs = 0;
        th.segment += 1;
        th.calls = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_trace_and_plans_are_checked() {
        let a = generate(&SynthConfig::small(5, "e")).unwrap();
        let b = generate(&SynthConfig::small(5, "e")).unwrap();
        assert_eq!(a, b);
        let c = generate(&SynthConfig::small(6, "e")).unwrap();
        assert_ne!(a.records, c.records);
        for r in &a.records {
            r.validate().unwrap();
        }
        let mut bad = SynthConfig::small(5, "e");
        bad.threads[0].segments[0].path_messages = 3;
        assert!(matches!(generate(&bad), Err(SynthError::Plan(_))));
        let mut bad = SynthConfig::small(5, "e");
        bad.spawns.pop();
        assert!(matches!(generate(&bad), Err(SynthError::Plan(_))));
    }

    #[test]
    fn harness_reorders_keys() {
        assert_eq!(reorder_keys(r#"{"a":1,"b":"x"}"#), r#"{"b": "x", "a": 1}"#);
    }
}
