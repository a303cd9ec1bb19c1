//! The task's harness and evaluator under the simulator host, with a probe
//! playing the execution and proxy side (and the engine: it writes the TITO
//! records the answers point at).

use std::sync::Arc;

use gyre_actors::sched::buffer::{Buffer, BufferMsg};
use gyre_actors::sched::evaluator::{EvalJob, Evaluator, EvaluatorMsg};
use gyre_actors::sched::execution::{ExecMsg, ExecStatus};
use gyre_actors::sched::ids::{CallId, ExecId, GroupId};
use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::sched::proto::port;
use gyre_actors::trajectory::scoring::Outcome;
use gyre_actors::trajectory::{CallPurpose, TitoRecord};
use gyre_gpu::model::ModelConfig;
use gyre_gpu::model::vocab::Special;
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{
    ActorId, Addr, BlobId, BlobStore, External, MILLIS, MemBlobs, NodeId, SECS, get_decoded,
    put_encoded,
};

use super::spec::{MAIN_SYSTEM, SUB_SYSTEM, TaskConfig, target};
use super::workspace::{CallNote, Workspace, Workspaces};
use super::{EvaluatorWorker, HarnessWorker};
use crate::embedded::shared::Shared;

const N: NodeId = NodeId(0);
const VERSION: u64 = 7;

struct World {
    sim: Sim,
    harness: Addr<HarnessWorker>,
    exec: Addr<External<HarnessEvent>>,
    blobs: Arc<MemBlobs>,
    board: Arc<Workspaces>,
    context: usize,
}

/// One call as the probe saw it.
#[derive(Debug, Clone)]
struct Seen {
    call: CallId,
    prompt_tokens: u64,
    prompt: Prompt,
    /// The call id written into its record.
    record_id: String,
}

#[derive(Debug, Default)]
struct Run {
    calls: Vec<Seen>,
    /// Outcomes of the runs that finished, in order.
    finished: Vec<HarnessOutcome>,
}

impl World {
    fn new(cfg: TaskConfig, seed: u64) -> Self {
        let blobs = MemBlobs::shared();
        let model = ModelConfig::tiny();
        let context = model.context;
        let shared = Shared::new(model, blobs.clone());
        let board = Arc::new(Workspaces::new());
        let mut c = SimConfig::new(seed);
        c.codec_roundtrip = true;
        let mut sim = Sim::new(c);
        let worker = HarnessWorker::new(cfg, &shared, board.clone(), seed).unwrap();
        let harness = sim.spawn(N, worker);
        let exec = sim.probe::<HarnessEvent>(N);
        Self {
            sim,
            harness,
            exec,
            blobs,
            board,
            context,
        }
    }

    fn begin(&mut self, exec: u64, group: u64) {
        let reply_to = self.exec.into();
        self.sim.inject(
            self.exec.id(),
            self.harness,
            HarnessReq::Begin {
                exec: ExecId(exec),
                group: GroupId(group),
                reply_to,
            },
        );
    }

    fn record(call: CallId, prompt: &Prompt, output_ids: Vec<u32>) -> TitoRecord {
        TitoRecord {
            execution: format!("{:?}", call.exec),
            call_id: format!("{call:?}"),
            thread: prompt.thread.clone(),
            parent_call: prompt.parent_call.clone(),
            role: prompt.role.clone(),
            purpose: CallPurpose::Policy,
            policy_version: VERSION,
            engine: None,
            start_ns: 0,
            end_ns: 0,
            input_ids: prompt.input_ids.clone(),
            input_message_ends: prompt.message_ends.clone(),
            output_logprobs: vec![-1.0; output_ids.len()],
            output_ids,
            output_sources: Vec::new(),
        }
    }

    /// Runs until the harness is quiet, answering every call with what
    /// `policy` returns for it (`None`: leave it unanswered).
    fn drive(&mut self, mut policy: impl FnMut(&Seen) -> Option<BlobId>) -> Run {
        let mut run = Run::default();
        loop {
            self.sim.run().unwrap();
            let got = self.sim.take_probe(self.exec);
            if got.is_empty() {
                return run;
            }
            for r in got {
                match ExecMsg::from(r.msg) {
                    ExecMsg::Harness(HarnessEvent::ModelCall {
                        call,
                        prompt_tokens,
                        prompt,
                    }) => {
                        let p: Prompt = get_decoded(&*self.blobs, prompt).unwrap();
                        let seen = Seen {
                            call,
                            prompt_tokens,
                            prompt: p,
                            record_id: format!("{call:?}"),
                        };
                        let answer = policy(&seen);
                        run.calls.push(seen);
                        if let Some(output) = answer {
                            self.sim.inject(
                                self.exec.id(),
                                self.harness,
                                HarnessReq::Answer {
                                    call,
                                    output_tokens: 1,
                                    output,
                                },
                            );
                        }
                    }
                    ExecMsg::Harness(HarnessEvent::Finished { outcome }) => {
                        run.finished.push(outcome);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    /// A policy that answers main calls with `main(seen)` and sub-agent
    /// calls with one byte, writing records as the engine would.
    fn answering(
        blobs: Arc<MemBlobs>,
        mut main: impl FnMut(&Seen) -> Vec<u32>,
    ) -> impl FnMut(&Seen) -> Option<BlobId> {
        move |seen| {
            let out = if seen.prompt.role.as_deref() == Some("main") {
                main(seen)
            } else {
                vec![u32::from(b'x'), Special::EndTurn.id()]
            };
            let rec = Self::record(seen.call, &seen.prompt, out);
            Some(put_encoded(&*blobs, &rec).unwrap())
        }
    }

    /// Frees the record blobs, as the sample source does downstream.
    fn release_records(&self) {
        for id in 1..=1000 {
            self.blobs.release(BlobId(id));
        }
    }
}

fn hit(q: u64) -> Vec<u32> {
    vec![target(q), Special::EndTurn.id()]
}

#[test]
fn one_execution_extends_prompts_compacts_and_spawns_sub_agents() {
    let cfg = TaskConfig {
        turns: 4,
        compact_after: 2,
        sub_agent_p: 1.0,
        ..TaskConfig::default()
    };
    let mut w = World::new(cfg, 1);
    w.begin(10, 3);
    let policy = World::answering(w.blobs.clone(), |_| hit(3));
    let run = w.drive(policy);
    assert_eq!(run.finished, [HarnessOutcome::Completed]);
    let threads: Vec<_> = run
        .calls
        .iter()
        .map(|s| s.prompt.thread.clone().unwrap())
        .collect();
    assert_eq!(
        threads,
        [
            "main", "sub0", "main", "sub1", "main", "sub2", "main", "sub3"
        ]
    );
    let seqs: Vec<u32> = run.calls.iter().map(|s| s.call.seq).collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());
    let main: Vec<&Seen> = run.calls.iter().step_by(2).collect();
    let extends = |a: &Seen, b: &Seen| {
        let (a, b) = (&a.prompt.input_ids, &b.prompt.input_ids);
        b.len() > a.len() && b[..a.len()] == a[..]
    };
    // Call 1 extends call 0 by its exact output; call 2 is compacted (a
    // branch: same system prompt and query, not an extension); 3 extends 2.
    assert!(extends(main[0], main[1]));
    let out = hit(3);
    let n0 = main[0].prompt.input_ids.len();
    assert_eq!(main[1].prompt.input_ids[n0..n0 + 2], out[..]);
    assert!(!extends(main[1], main[2]));
    assert_eq!(
        main[2].prompt.input_ids[..16],
        main[0].prompt.input_ids[..16]
    );
    assert!(extends(main[2], main[3]));
    for (k, sub) in run.calls.iter().skip(1).step_by(2).enumerate() {
        let spawner = &run.calls[2 * k];
        assert_eq!(sub.prompt.parent_call.as_deref(), Some(&*spawner.record_id));
        assert_eq!(sub.prompt.role.as_deref(), Some("sub-agent"));
        let text = String::from_utf8(
            sub.prompt.input_ids[2..2 + SUB_SYSTEM.len()]
                .iter()
                .map(|t| *t as u8)
                .collect(),
        )
        .unwrap();
        assert_eq!(text, SUB_SYSTEM);
        assert_ne!(SUB_SYSTEM, MAIN_SYSTEM);
    }
    for m in &main {
        assert_eq!(m.prompt.parent_call, None);
        assert_eq!((m.prompt.temperature, m.prompt.top_p), (1.0, 1.0));
    }
    let s = w.board.stats();
    assert_eq!((s.calls, s.sub_agent_calls, s.compactions), (8, 4, 1));
    assert_eq!(
        (s.begun, s.completed, s.hits, s.main_answered),
        (1, 1, 4, 4)
    );
    let ws = w.board.get(ExecId(10)).unwrap();
    assert_eq!(ws.reward(&TaskConfig::default()), 1.0);
    assert_eq!(ws.version(), Some(VERSION));
    assert_eq!(ws.calls.len(), 8);
    // Every prompt was freed by the harness; records belong downstream.
    assert_eq!(w.blobs.live(), run.calls.len());
    w.release_records();
    assert_eq!(w.blobs.live(), 0);
    assert_eq!(w.sim.actor(w.harness).unwrap().live(), 0);
}

#[test]
fn prompts_never_exceed_the_context_budget() {
    let cfg = TaskConfig {
        turns: 12,
        compact_after: 0,
        sub_agent_p: 0.5,
        max_calls: 100,
        ..TaskConfig::default()
    };
    let max_new = cfg.max_new_tokens as usize;
    let mut w = World::new(cfg, 2);
    for e in 0..4 {
        w.begin(e, e * 5);
    }
    // Length-capped answers that never stop: the context grows fastest.
    let policy = World::answering(w.blobs.clone(), |_| vec![u32::from(b'z'); 4]);
    let run = w.drive(policy);
    assert!(run.calls.len() >= 48);
    for s in &run.calls {
        assert!(s.prompt.input_ids.len() + max_new <= w.context, "{s:?}");
        assert_eq!(s.prompt_tokens as usize, s.prompt.input_ids.len());
        assert_eq!(s.prompt.max_new_tokens as usize, max_new);
    }
    let s = w.board.stats();
    assert!(s.compactions >= 4, "{s:?}");
    assert!(s.sub_agent_calls > 0 && s.sub_agent_calls < 48, "{s:?}");
    assert_eq!(s.completed, 4);
    assert_eq!(run.finished, [HarnessOutcome::Completed; 4]);
}

#[test]
fn rewards_come_from_the_outputs_and_scoring_frees_the_workspace() {
    let cfg = TaskConfig {
        turns: 4,
        sub_agent_p: 0.0,
        shaping_width: 0,
        eval_failure_rate: 0.0,
        ..TaskConfig::default()
    };
    let mut w = World::new(cfg.clone(), 3);
    w.begin(0, 2);
    let mut k = 0;
    let policy = World::answering(w.blobs.clone(), move |_| {
        k += 1;
        if k % 2 == 1 {
            hit(2)
        } else {
            vec![u32::from(b'a'), Special::EndTurn.id()]
        }
    });
    let run = w.drive(policy);
    assert_eq!(run.finished, [HarnessOutcome::Completed]);
    assert_eq!(w.board.get(ExecId(0)).unwrap().reward(&cfg), 0.5);

    let eval = w
        .sim
        .spawn(N, EvaluatorWorker::new(cfg, w.board.clone(), 3).unwrap());
    let reply = w.sim.probe::<EvalEvent>(N);
    let reply_to = reply.into();
    for attempt in 0..2 {
        w.sim.inject(
            reply.id(),
            eval,
            EvalReq::Score {
                exec: ExecId(0),
                attempt,
                reply_to,
            },
        );
        w.sim.run().unwrap();
    }
    let got: Vec<_> = w
        .sim
        .take_probe(reply)
        .into_iter()
        .map(|r| EvaluatorMsg::from(r.msg))
        .collect();
    assert!(matches!(
        got[0],
        EvaluatorMsg::Backend(EvalEvent::Scored { reward, attempt: 0, .. }) if reward == 0.5
    ));
    // Scored once, freed: a second attempt finds nothing.
    assert!(matches!(
        got[1],
        EvaluatorMsg::Backend(EvalEvent::Failed { attempt: 1, .. })
    ));
    let s = w.board.stats();
    assert_eq!((s.scored, s.eval_missing), (1, 1));
    assert_eq!(s.by_version[&VERSION].mean(), Some(0.5));
    assert!(w.board.is_empty());
}

fn workspace(first: u8) -> Workspace {
    Workspace {
        query: 0,
        target: target(0),
        planned: 1,
        calls: vec![CallNote {
            seq: 0,
            thread: "main".into(),
            sub_agent: false,
            first: Some(u32::from(first)),
            version: Some(1),
            prompt_tokens: 17,
        }],
        outcome: HarnessOutcome::Completed,
        compactions: 0,
    }
}

#[test]
fn failed_evaluations_are_retried_and_missing_workspaces_excluded() {
    let cfg = TaskConfig {
        eval_failure_rate: 0.5,
        ..TaskConfig::default()
    };
    let board = Arc::new(Workspaces::new());
    let mut sim = Sim::new(SimConfig::new(4));
    let backend = sim.spawn(N, EvaluatorWorker::new(cfg, board.clone(), 4).unwrap());
    let buffer = sim.probe::<BufferMsg>(N);
    let buffer: Addr<Buffer> = Addr::new(buffer.id());
    let evaluator = sim.spawn(N, Evaluator::new(port(backend), buffer, 100 * MILLIS));
    let jobs = 20u64;
    for e in 0..jobs {
        board.preserve(ExecId(e), workspace(if e % 2 == 0 { b'a' } else { b'q' }));
    }
    // Execution 99 was aborted: its harness preserved nothing.
    for e in (0..jobs).chain([99]) {
        sim.inject(
            ActorId::new(0, 999),
            evaluator,
            EvalJob {
                exec: ExecId(e),
                group: GroupId(e),
                v_d: 0,
                status: ExecStatus::Completed,
                tokens: 2,
                deadline: 2 * SECS,
                records: Vec::new(),
            },
        );
    }
    sim.run().unwrap();
    let probe: Addr<External<BufferMsg>> = Addr::new(buffer.id());
    let mut valid = Vec::new();
    let mut excluded = Vec::new();
    for r in sim.take_probe(probe) {
        if let BufferMsg::Resolved { exec, outcome, .. } = r.msg {
            match outcome {
                Outcome::Valid { score, .. } => valid.push((exec.0, score)),
                Outcome::Excluded { attempts } => excluded.push((exec.0, attempts)),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    valid.sort_by_key(|v| v.0);
    assert_eq!(valid.len(), jobs as usize);
    for (e, score) in valid {
        assert_eq!(score, if e % 2 == 0 { 1.0 } else { 0.0 }, "exec {e}");
    }
    assert_eq!(excluded.len(), 1);
    assert_eq!(excluded[0].0, 99);
    assert!(excluded[0].1 > 1, "retried until the budget ran out");
    let s = board.stats();
    assert!(s.eval_failures > 0, "{s:?}");
    assert_eq!(s.scored, jobs);
    assert!(s.eval_missing > 1);
    assert!(board.is_empty());
    assert_eq!(sim.actor(evaluator).unwrap().stats().scored, jobs);
}

#[test]
fn abort_releases_the_outstanding_prompt() {
    let mut w = World::new(TaskConfig::default(), 5);
    w.begin(4, 1);
    let run = w.drive(|_| None);
    assert_eq!(run.calls.len(), 1);
    assert_eq!(w.blobs.live(), 1);
    w.sim.inject(
        w.exec.id(),
        w.harness,
        HarnessReq::Abort { exec: ExecId(4) },
    );
    w.sim.run().unwrap();
    assert_eq!(w.blobs.live(), 0);
    // A late answer to the aborted run is ignored and counted.
    let rec = World::record(run.calls[0].call, &run.calls[0].prompt, hit(1));
    let output = put_encoded(&*w.blobs, &rec).unwrap();
    w.sim.inject(
        w.exec.id(),
        w.harness,
        HarnessReq::Answer {
            call: run.calls[0].call,
            output_tokens: 2,
            output,
        },
    );
    let after = w.drive(|_| None);
    assert!(after.calls.is_empty() && after.finished.is_empty());
    let s = w.board.stats();
    assert_eq!((s.aborted, s.stray_answers, s.finished()), (1, 1, 0));
    assert!(w.board.get(ExecId(4)).is_none());
    w.blobs.release(output);
    assert_eq!(w.blobs.live(), 0);
}

#[test]
fn garbage_answers_fail_the_run_cleanly() {
    type Garbage = Box<dyn Fn(&MemBlobs, &Seen) -> BlobId>;
    let cases: Vec<Garbage> = vec![
        Box::new(|b, _| b.put(vec![0xff; 7])),
        Box::new(|_, _| BlobId::NONE),
        Box::new(|b, s| {
            let rec = World::record(s.call, &s.prompt, vec![1_000_000]);
            put_encoded(b, &rec).unwrap()
        }),
    ];
    for (i, garbage) in cases.into_iter().enumerate() {
        let mut w = World::new(TaskConfig::default(), 6);
        w.begin(1, 0);
        let blobs = w.blobs.clone();
        let run = w.drive(move |s| Some(garbage(&blobs, s)));
        assert_eq!(
            run.finished,
            [HarnessOutcome::Failed { complete: false }],
            "case {i}"
        );
        assert_eq!(run.calls.len(), 1);
        let s = w.board.stats();
        assert_eq!((s.bad_answers, s.failed), (1, 1), "case {i}");
        let ws = w.board.get(ExecId(1)).unwrap();
        assert_eq!(ws.calls[0].first, None);
        assert_eq!(ws.reward(&TaskConfig::default()), 0.0);
        w.release_records();
        assert_eq!(w.blobs.live(), 0, "case {i}");
    }
}

#[test]
fn the_harness_times_out_after_max_calls() {
    let cfg = TaskConfig {
        turns: 5,
        max_calls: 3,
        sub_agent_p: 0.0,
        shaping_width: 0,
        ..TaskConfig::default()
    };
    let mut w = World::new(cfg.clone(), 7);
    w.begin(2, 6);
    let policy = World::answering(w.blobs.clone(), |_| hit(6));
    let run = w.drive(policy);
    assert_eq!(run.finished, [HarnessOutcome::HarnessTimeout]);
    assert_eq!(run.calls.len(), 3);
    let ws = w.board.get(ExecId(2)).unwrap();
    assert_eq!(ws.reward(&cfg), 3.0 / 5.0);
    assert_eq!(w.board.stats().harness_timeouts, 1);
}

#[test]
fn runs_replay_exactly_from_the_seed() {
    let threads = |seed| {
        let cfg = TaskConfig {
            turns: 6,
            sub_agent_p: 0.5,
            ..TaskConfig::default()
        };
        let mut w = World::new(cfg, seed);
        for e in 0..3 {
            w.begin(e, e);
        }
        let policy = World::answering(w.blobs.clone(), |s| hit(s.call.exec.0));
        let run = w.drive(policy);
        let t: Vec<_> = run
            .calls
            .iter()
            .map(|s| (s.call, s.prompt.input_ids.clone()))
            .collect();
        (t, w.sim.trace_hash())
    };
    assert_eq!(threads(11), threads(11));
    assert_ne!(threads(11).0, threads(12).0);
}

#[test]
fn a_task_that_cannot_fit_is_refused() {
    let shared = Shared::new(ModelConfig::tiny(), MemBlobs::shared());
    let cfg = TaskConfig {
        max_new_tokens: 50,
        ..TaskConfig::default()
    };
    let err = HarnessWorker::new(cfg, &shared, Arc::default(), 0).unwrap_err();
    assert!(err.to_string().contains("max_new_tokens"));
}
