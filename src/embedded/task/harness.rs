//! The harness backend of the built-in task: runs each execution as a
//! small multi-call agent over real token contexts.
//!
//! It stands for an external agent program, so it is one actor whose
//! message type is the harness protocol (no front, no I/O: reading a small
//! record from the blob store is what the program's HTTP client would do).
//! Per execution it keeps one call in flight at a time, so no thread ever
//! has two; every choice comes from the run's query and a draw keyed on
//! `(seed, exec, turn)`, so a run replays exactly whatever else happens.
//!
//! Blob ownership: the harness writes each call's `Prompt` and frees it
//! when that call is answered or the run is aborted; it reads the engine's
//! TITO record behind an answer but never frees it (the sample source does).

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, ExecId, GroupId};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::trajectory::{CallPurpose, TitoRecord};
use gyre_runtime::{Actor, ActorId, BlobId, BlobStore, Cx, Recipient, get_decoded, put_encoded};

use super::context::{Context, stop_tokens};
use super::spec::{TOOL_OK, TOOL_RETRY, TaskConfig, TaskConfigError, target, unit_draw};
use super::workspace::{CallNote, TaskStats, Workspace, Workspaces};
use crate::embedded::journal::Journal;
use crate::embedded::shared::Shared;

/// Thread name of the main agent.
pub const MAIN_THREAD: &str = "main";

/// The call a run waits on.
#[derive(Debug)]
struct Outstanding {
    call: CallId,
    prompt: BlobId,
    prompt_tokens: u32,
    /// The main turn that spawned it, for a sub-agent call.
    sub_of: Option<u32>,
}

#[derive(Debug)]
struct Run {
    reply_to: Recipient<HarnessEvent>,
    query: u64,
    target: u32,
    main: Context,
    /// Main calls answered.
    turn: u32,
    hits: u32,
    seq: u32,
    compactions: u32,
    outstanding: Option<Outstanding>,
    /// A sub-agent call to make next: the spawning turn and its call id.
    pending_sub: Option<(u32, String)>,
    notes: Vec<CallNote>,
}

/// What the next call of a run is.
enum Next {
    Main,
    Sub { turn: u32, parent: String },
    Finish(HarnessOutcome),
}

/// The task's harness (`Msg = HarnessReq`; address it with `port(addr)`).
#[derive(Debug)]
pub struct HarnessWorker {
    cfg: TaskConfig,
    context: usize,
    vocab: usize,
    seed: u64,
    blobs: Arc<dyn BlobStore>,
    board: Arc<Workspaces>,
    runs: BTreeMap<ExecId, Run>,
    /// `gyre train --record`: where every run and call is written.
    journal: Option<Journal>,
}

impl HarnessWorker {
    /// Refuses a task whose prompts could not fit the model's context.
    pub fn new(
        cfg: TaskConfig,
        shared: &Shared,
        board: Arc<Workspaces>,
        seed: u64,
    ) -> Result<Self, TaskConfigError> {
        cfg.check_fits(shared.model.context)?;
        Ok(Self {
            cfg,
            context: shared.model.context,
            vocab: shared.model.vocab,
            seed,
            blobs: shared.blobs.clone(),
            board,
            runs: BTreeMap::new(),
            journal: None,
        })
    }

    /// Writes every run's start, calls and end to `journal`.
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }

    pub fn stats(&self) -> TaskStats {
        self.board.stats()
    }

    /// Runs going on.
    pub fn live(&self) -> usize {
        self.runs.len()
    }

    /// Longest prompt the engine can still serve in full.
    fn budget(&self) -> usize {
        self.context
            .saturating_sub(self.cfg.max_new_tokens as usize)
    }

    fn begin(
        &mut self,
        exec: ExecId,
        group: GroupId,
        reply_to: Recipient<HarnessEvent>,
        cx: &mut Cx<'_, Self>,
    ) {
        if self.runs.contains_key(&exec) {
            return;
        }
        let query = self.cfg.query(group.0);
        if let Some(j) = &self.journal {
            j.begun(exec, group, cx.now());
        }
        self.board.count(|s| s.begun += 1);
        self.runs.insert(
            exec,
            Run {
                reply_to,
                query,
                target: target(query),
                main: Context::main(query),
                turn: 0,
                hits: 0,
                seq: 0,
                compactions: 0,
                outstanding: None,
                pending_sub: None,
                notes: Vec::new(),
            },
        );
        self.advance(exec, cx);
    }

    fn next_of(&self, run: &mut Run) -> Next {
        if run.seq >= self.cfg.max_calls {
            return Next::Finish(HarnessOutcome::HarnessTimeout);
        }
        if let Some((turn, parent)) = run.pending_sub.take() {
            return Next::Sub { turn, parent };
        }
        if run.turn >= self.cfg.turns {
            return Next::Finish(HarnessOutcome::Completed);
        }
        Next::Main
    }

    /// Makes the run's next call, or ends it.
    fn advance(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let budget = self.budget();
        let Some(mut run) = self.runs.remove(&exec) else {
            return;
        };
        let next = self.next_of(&mut run);
        let (ids, ends, thread, parent, role, sub_of) = match next {
            Next::Finish(outcome) => return self.finish(exec, run, outcome, cx),
            Next::Sub { turn, parent } => {
                let c = Context::sub_agent(run.query);
                let thread = format!("sub{turn}");
                (
                    c.prompt(),
                    c.message_ends(),
                    thread,
                    Some(parent),
                    "sub-agent",
                    Some(turn),
                )
            }
            Next::Main => {
                let scheduled = self.cfg.compact_after > 0 && run.turn == self.cfg.compact_after;
                if scheduled || run.main.prompt_len() > budget {
                    run.main = Context::compacted(run.query, run.hits, run.turn);
                    run.compactions += 1;
                    self.board.count(|s| s.compactions += 1);
                }
                let (ids, ends) = (run.main.prompt(), run.main.message_ends());
                (ids, ends, MAIN_THREAD.to_owned(), None, "main", None)
            }
        };
        if ids.len() > budget {
            // check_fits rules this out; never send what cannot be served.
            tracing::error!(
                ?exec,
                len = ids.len(),
                budget,
                "prompt does not fit the context"
            );
            return self.finish(exec, run, HarnessOutcome::Failed { complete: false }, cx);
        }
        let prompt_tokens = ids.len() as u32;
        let prompt = Prompt {
            input_ids: ids,
            message_ends: ends,
            max_new_tokens: self.cfg.max_new_tokens,
            stop_tokens: stop_tokens(),
            temperature: self.cfg.temperature,
            top_p: self.cfg.top_p,
            thread: Some(thread),
            parent_call: parent,
            role: Some(role.to_owned()),
            purpose: CallPurpose::Policy,
        };
        let blob = match put_encoded(&*self.blobs, &prompt) {
            Ok(b) => b,
            Err(error) => {
                tracing::error!(?exec, %error, "prompt does not encode");
                return self.finish(exec, run, HarnessOutcome::Failed { complete: false }, cx);
            }
        };
        let call = CallId { exec, seq: run.seq };
        run.seq += 1;
        run.outstanding = Some(Outstanding {
            call,
            prompt: blob,
            prompt_tokens,
            sub_of,
        });
        self.board.count(|s| {
            s.calls += 1;
            s.sub_agent_calls += u64::from(sub_of.is_some());
        });
        let to = run.reply_to;
        self.runs.insert(exec, run);
        if let Some(j) = &self.journal {
            j.called(call, u64::from(prompt_tokens), cx.now());
        }
        cx.send(
            to,
            HarnessEvent::ModelCall {
                call,
                prompt_tokens: u64::from(prompt_tokens),
                prompt: blob,
            },
        );
    }

    fn finish(
        &mut self,
        exec: ExecId,
        mut run: Run,
        outcome: HarnessOutcome,
        cx: &mut Cx<'_, Self>,
    ) {
        if let Some(o) = run.outstanding.take() {
            self.blobs.release(o.prompt);
        }
        self.board.count(|s| match outcome {
            HarnessOutcome::Completed => s.completed += 1,
            HarnessOutcome::HarnessTimeout => s.harness_timeouts += 1,
            HarnessOutcome::Failed { .. } => s.failed += 1,
        });
        tracing::debug!(
            ?exec,
            ?outcome,
            calls = run.seq,
            hits = run.hits,
            "task run finished"
        );
        if let Some(j) = &self.journal {
            j.finished(exec, outcome, cx.now());
        }
        self.board.preserve(
            exec,
            Workspace {
                query: run.query,
                target: run.target,
                planned: self.cfg.turns,
                calls: std::mem::take(&mut run.notes),
                outcome,
                compactions: run.compactions,
            },
        );
        cx.send(run.reply_to, HarnessEvent::Finished { outcome });
    }

    /// The record behind an answer, if it is one this harness can go on with.
    fn record(&self, output: BlobId) -> Result<TitoRecord, String> {
        let rec: TitoRecord = get_decoded(&*self.blobs, output).map_err(|e| e.to_string())?;
        if let Some(bad) = rec.output_ids.iter().find(|t| **t as usize >= self.vocab) {
            return Err(format!("output token {bad} is outside the vocabulary"));
        }
        Ok(rec)
    }

    fn answer(&mut self, call: CallId, output: BlobId, cx: &mut Cx<'_, Self>) {
        let exec = call.exec;
        let Some(o) = self
            .runs
            .get_mut(&exec)
            .and_then(|r| r.outstanding.take_if(|o| o.call == call))
        else {
            self.board.count(|s| s.stray_answers += 1);
            return;
        };
        self.blobs.release(o.prompt);
        self.board.count(|s| s.answered += 1);
        let record = self.record(output);
        let Some(run) = self.runs.get_mut(&exec) else {
            return;
        };
        let thread = match o.sub_of {
            Some(turn) => format!("sub{turn}"),
            None => MAIN_THREAD.to_owned(),
        };
        let rec = match record {
            Ok(rec) => rec,
            Err(error) => {
                tracing::warn!(?call, %output, %error, "unusable answer; the run fails");
                run.notes.push(CallNote {
                    seq: call.seq,
                    thread,
                    sub_agent: o.sub_of.is_some(),
                    first: None,
                    version: None,
                    prompt_tokens: o.prompt_tokens,
                });
                self.board.count(|s| s.bad_answers += 1);
                if let Some(run) = self.runs.remove(&exec) {
                    self.finish(exec, run, HarnessOutcome::Failed { complete: false }, cx);
                }
                return;
            }
        };
        if let Some(j) = &self.journal {
            j.answered(call, rec.output_ids.len() as u64, cx.now());
        }
        let first = rec.output_ids.first().copied();
        run.notes.push(CallNote {
            seq: call.seq,
            thread,
            sub_agent: o.sub_of.is_some(),
            first,
            version: Some(rec.policy_version),
            prompt_tokens: o.prompt_tokens,
        });
        if o.sub_of.is_none() {
            let hit = first == Some(run.target);
            run.main.push_answer(&rec.output_ids);
            run.main
                .push_tool_result(if hit { TOOL_OK } else { TOOL_RETRY });
            let turn = run.turn;
            run.turn += 1;
            run.hits += u32::from(hit);
            if unit_draw(self.seed, exec.0, u64::from(turn)) < self.cfg.sub_agent_p {
                run.pending_sub = Some((turn, rec.call_id));
            }
            self.board.count(|s| {
                s.main_answered += 1;
                s.hits += u64::from(hit);
            });
        }
        self.advance(exec, cx);
    }

    fn abort(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let Some(mut run) = self.runs.remove(&exec) else {
            return;
        };
        if let Some(j) = &self.journal {
            j.aborted(exec, cx.now());
        }
        if let Some(o) = run.outstanding.take() {
            self.blobs.release(o.prompt);
        }
        self.board.count(|s| s.aborted += 1);
        tracing::debug!(?exec, calls = run.seq, "task run aborted");
    }
}

impl Actor for HarnessWorker {
    type Msg = HarnessReq;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: HarnessReq, cx: &mut Cx<'_, Self>) {
        match msg {
            HarnessReq::Begin {
                exec,
                group,
                reply_to,
            } => self.begin(exec, group, reply_to, cx),
            HarnessReq::Answer { call, output, .. } => self.answer(call, output, cx),
            HarnessReq::Abort { exec } | HarnessReq::TimedOut { exec } => self.abort(exec, cx),
        }
    }
}
