//! The built-in agent task of `gyre train`: a harness and an evaluator
//! backend that make the embedded cluster learn something real.
//!
//! The task. Query `q` (an execution of group `g` works on `q = g mod Q`)
//! is stated in a user turn, "task q"; its answer is the target byte
//! `t(q) = 'a' + q mod 8`. The main agent is called `turns` times: each
//! call should start with `t(q)`; the harness appends the model's exact
//! output and a tool result ("ok" on a hit, "retry" otherwise) and calls
//! again. The reward is the mean credit over the planned main calls: 1 for
//! the target first, half credit fading over `shaping_width` bytes around
//! it, 0 otherwise.
//!
//! Why it is learnable. Everything the answer depends on is in the prompt
//! (the query digits), the answer is a single token at a fixed position,
//! and the shaped credit gives a randomly initialised byte model signal
//! from its first steps, so group-relative advantages point at the target
//! within tens of steps even for the tiny model; the tool results also make
//! later turns conditionable on earlier ones.
//!
//! What it exercises. Real multi-call executions over exact token ids
//! (every prompt extends the previous one token for token, so the calls of
//! a thread share one path of the trajectory tree); a compaction before
//! main call `compact_after` (or whenever the context is full), which
//! restarts from the system prompt, the query and a short summary — a new
//! branch of the tree; sub-agent calls on their own thread with another
//! system prompt and `parent_call` set to the spawning call (a new root
//! with a causal link); the harness's own timeout (`max_calls`); evaluator
//! failures and retries; and blob lifetimes (prompts written and freed by
//! the harness, records read but owned downstream). Contexts are kept under
//! `context - max_new_tokens` of the model (64 tokens for the tiny one):
//! the harness never sends a prompt the engine could not serve in full.

pub mod context;
pub mod evaluator;
pub mod harness;
pub mod spec;
pub mod workspace;

#[cfg(test)]
mod tests;

pub use evaluator::EvaluatorWorker;
pub use harness::HarnessWorker;
pub use spec::{TaskConfig, TaskConfigError};
pub use workspace::{CallNote, RewardTally, TaskStats, Workspace, Workspaces};
