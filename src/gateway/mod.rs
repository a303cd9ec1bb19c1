//! The gateway: the HTTP front of the proxy router, where unmodified
//! harnesses reach the policy (SPEC 3.1). Requests are rendered and
//! tokenised here, engines take and return token ids, and the TITO record
//! of every call is written here, so every engine is recorded the same way.
//!
//! - [`http`]: listeners, routes, keys, limits, streaming bodies.
//! - [`anthropic`], [`openai`], [`responses`]: each API's request parsing, responses,
//!   stream events and error shape; [`fields`] reads JSON by path.
//! - [`chat`]: the API-neutral request; [`service`]: executions, prepare
//!   and commit; [`execution`]: one execution's records, tree, tool-call
//!   cache and history index; [`store`]: redb durability.
//! - [`render`], [`template`], [`tokenizer`]: prompt ids with token-exact
//!   history reuse; [`parse`]: output text to thinking, text and tool calls;
//!   [`turn`]: one call from engine tokens to API deltas.
//! - [`engine`]: the narrow engine trait; [`script`]: the replaying test
//!   engine; [`embedded`]: the gpu crate's engine behind that trait;
//!   [`bench`]: the pieces of `gyre bench gateway`.

pub mod anthropic;
pub mod bench;
pub mod bpe;
pub mod chat;
pub mod choice;
pub mod embedded;
pub mod engine;
pub mod execution;
pub mod fields;
pub mod http;
pub mod openai;
pub mod parse;
pub mod render;
pub mod responses;
pub mod script;
pub mod service;
pub mod sglang;
pub mod store;
pub mod template;
pub mod tokenizer;
pub mod turn;
