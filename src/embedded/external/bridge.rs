//! The harness backend of external harness processes: the actor that
//! stands between the executions of the scheduling plane and the gateway's
//! front (which creates gateway executions, runs the processes and serves
//! their HTTP calls).
//!
//! It is the same protocol the built-in task answers, kept sans-IO: what
//! the front must do goes out as [`ToFront`] messages to its probe address,
//! and what the processes did comes back as [`BridgeMsg`]s (a call to route,
//! a record the gateway committed, an exit). Payload handles the front hands
//! over are released here, as effects, when nobody else will own them: a
//! prompt once its call is answered or its run is gone, a record whose
//! execution closed before it arrived.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, ExecId, GroupId};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_runtime::{Actor, ActorId, BlobId, BlobStore, Cx, PayloadRelease, Recipient};
use serde::{Deserialize, Serialize};

/// What the front is asked to do.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToFront {
    /// Create the gateway execution of `exec` and start its harness.
    Begin { exec: ExecId, group: GroupId },
    /// `call` was answered by the proxy with `output_tokens` tokens in
    /// all (earlier attempts' included): its stream is complete once it
    /// holds that many.
    Answered { call: CallId, output_tokens: u64 },
    /// Stop the run's harness: `timed_out` when its overall timeout ended
    /// it, else a cancellation.
    Abort { exec: ExecId, timed_out: bool },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum BridgeMsg {
    Req(HarnessReq),
    /// The gateway serves an HTTP request of `call.exec` as this call.
    Call {
        call: CallId,
        prompt_tokens: u64,
        prompt: BlobId,
    },
    /// The gateway committed a call's record (durably); it goes to the
    /// execution for training.
    Recorded {
        call: CallId,
        record: BlobId,
    },
    /// The harness process of `exec` ended.
    Finished {
        exec: ExecId,
        outcome: HarnessOutcome,
    },
    /// A release effect completed.
    Released,
}

impl From<HarnessReq> for BridgeMsg {
    fn from(r: HarnessReq) -> Self {
        BridgeMsg::Req(r)
    }
}

#[derive(Debug)]
struct Run {
    reply_to: Recipient<HarnessEvent>,
    /// Prompt handle of each call not answered yet.
    outstanding: BTreeMap<CallId, BlobId>,
}

/// Counters, for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BridgeStats {
    pub begun: u64,
    pub calls: u64,
    pub answered: u64,
    pub recorded: u64,
    pub finished: u64,
    pub aborted: u64,
    /// Calls, records or exits for a run that is gone (aborted, closed).
    pub late: u64,
}

/// The external harnesses' backend (`Msg` accepts `HarnessReq`).
#[derive(Debug)]
pub struct GatewayHarness {
    front: Recipient<ToFront>,
    blobs: Arc<dyn BlobStore>,
    runs: BTreeMap<ExecId, Run>,
    stats: BridgeStats,
}

impl GatewayHarness {
    pub fn new(front: Recipient<ToFront>, blobs: Arc<dyn BlobStore>) -> Self {
        Self {
            front,
            blobs,
            runs: BTreeMap::new(),
            stats: BridgeStats::default(),
        }
    }

    pub fn stats(&self) -> BridgeStats {
        self.stats
    }

    fn release(&self, blob: BlobId, cx: &mut Cx<'_, Self>) {
        if blob.is_some() {
            cx.io(PayloadRelease::new(self.blobs.clone(), blob), |_| {
                BridgeMsg::Released
            });
        }
    }

    fn end(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) -> Option<Run> {
        let run = self.runs.remove(&exec)?;
        for prompt in run.outstanding.values() {
            self.release(*prompt, cx);
        }
        Some(run)
    }

    fn request(&mut self, req: HarnessReq, cx: &mut Cx<'_, Self>) {
        match req {
            HarnessReq::Begin {
                exec,
                group,
                reply_to,
            } => {
                if self.runs.contains_key(&exec) {
                    return;
                }
                self.stats.begun += 1;
                self.runs.insert(
                    exec,
                    Run {
                        reply_to,
                        outstanding: BTreeMap::new(),
                    },
                );
                cx.send(self.front, ToFront::Begin { exec, group });
            }
            HarnessReq::Answer {
                call,
                output_tokens,
                ..
            } => {
                let prompt = self
                    .runs
                    .get_mut(&call.exec)
                    .and_then(|r| r.outstanding.remove(&call));
                if let Some(prompt) = prompt {
                    self.stats.answered += 1;
                    self.release(prompt, cx);
                    cx.send(
                        self.front,
                        ToFront::Answered {
                            call,
                            output_tokens,
                        },
                    );
                }
            }
            HarnessReq::Abort { exec } => self.stop(exec, false, cx),
            HarnessReq::TimedOut { exec } => self.stop(exec, true, cx),
        }
    }

    fn stop(&mut self, exec: ExecId, timed_out: bool, cx: &mut Cx<'_, Self>) {
        if self.end(exec, cx).is_some() {
            self.stats.aborted += 1;
            cx.send(self.front, ToFront::Abort { exec, timed_out });
        }
    }
}

impl Actor for GatewayHarness {
    type Msg = BridgeMsg;
    type Timer = ();
    gyre_runtime::accepts!(HarnessReq);

    fn on_msg(&mut self, _from: ActorId, msg: BridgeMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            BridgeMsg::Req(req) => self.request(req, cx),
            BridgeMsg::Call {
                call,
                prompt_tokens,
                prompt,
            } => {
                let Some(run) = self.runs.get_mut(&call.exec) else {
                    self.stats.late += 1;
                    return self.release(prompt, cx);
                };
                if run.outstanding.contains_key(&call) {
                    return;
                }
                run.outstanding.insert(call, prompt);
                self.stats.calls += 1;
                cx.send(
                    run.reply_to,
                    HarnessEvent::ModelCall {
                        call,
                        prompt_tokens,
                        prompt,
                    },
                );
            }
            BridgeMsg::Recorded { call, record } => {
                let Some(run) = self.runs.get(&call.exec) else {
                    self.stats.late += 1;
                    return self.release(record, cx);
                };
                self.stats.recorded += 1;
                cx.send(run.reply_to, HarnessEvent::Recorded { call, record });
            }
            BridgeMsg::Finished { exec, outcome } => {
                let Some(run) = self.end(exec, cx) else {
                    self.stats.late += 1;
                    return;
                };
                self.stats.finished += 1;
                cx.send(run.reply_to, HarnessEvent::Finished { outcome });
            }
            BridgeMsg::Released => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_runtime::sim::{Sim, SimConfig};
    use gyre_runtime::{Addr, MemBlobs, NodeId};

    const TESTER: ActorId = ActorId::new(9, 1);

    #[test]
    fn calls_records_and_exits_reach_the_execution_and_nothing_leaks() {
        let mut cfg = SimConfig::new(3);
        cfg.codec_roundtrip = true;
        let mut sim = Sim::new(cfg);
        let blobs = MemBlobs::shared();
        let front = sim.probe::<ToFront>(NodeId(2));
        let exec_port = sim.probe::<HarnessEvent>(NodeId(2));
        let bridge = sim.spawn(
            NodeId(1),
            GatewayHarness::new(Recipient::of(front), blobs.clone()),
        );
        let (exec, other) = (ExecId(4), ExecId(5));
        for e in [exec, other] {
            let begin = HarnessReq::Begin {
                exec: e,
                group: GroupId(1),
                reply_to: Recipient::of(exec_port),
            };
            sim.inject(TESTER, bridge, begin);
        }
        let call = CallId { exec, seq: 0 };
        let prompt = blobs.put(vec![1, 2, 3]);
        sim.inject(
            TESTER,
            bridge,
            BridgeMsg::Call {
                call,
                prompt_tokens: 3,
                prompt,
            },
        );
        sim.run().unwrap();
        let fronted: Vec<_> = sim.take_probe(front).into_iter().map(|r| r.msg).collect();
        assert!(matches!(
            fronted[..],
            [ToFront::Begin { exec: a, .. }, ToFront::Begin { exec: b, .. }] if a == exec && b == other
        ));
        let heard = |sim: &mut Sim, p: Addr<_>| -> Vec<HarnessEvent> {
            sim.take_probe(p).into_iter().map(|r| r.msg).collect()
        };
        assert!(matches!(
            heard(&mut sim, exec_port)[..],
            [HarnessEvent::ModelCall { call: c, prompt_tokens: 3, prompt: p }] if c == call && p == prompt
        ));
        // The proxy's answer frees the prompt and ends the stream; the
        // gateway's record goes to the execution, then the exit.
        let answer = HarnessReq::Answer {
            call,
            output_tokens: 2,
            output: BlobId::NONE,
        };
        sim.inject(TESTER, bridge, answer);
        let record = blobs.put(vec![7]);
        sim.inject(TESTER, bridge, BridgeMsg::Recorded { call, record });
        let outcome = HarnessOutcome::Completed;
        sim.inject(TESTER, bridge, BridgeMsg::Finished { exec, outcome });
        // The other run is aborted; what arrives for it later is released.
        sim.inject(TESTER, bridge, HarnessReq::Abort { exec: other });
        let late = blobs.put(vec![8]);
        let late_call = CallId {
            exec: other,
            seq: 0,
        };
        sim.inject(
            TESTER,
            bridge,
            BridgeMsg::Recorded {
                call: late_call,
                record: late,
            },
        );
        sim.run().unwrap();
        assert!(matches!(
            sim.take_probe(front).into_iter().map(|r| r.msg).collect::<Vec<_>>()[..],
            [ToFront::Answered { call: c, .. }, ToFront::Abort { exec: e, timed_out: false }] if c == call && e == other
        ));
        assert!(matches!(
            heard(&mut sim, exec_port)[..],
            [
                HarnessEvent::Recorded { call: c, record: r },
                HarnessEvent::Finished { outcome: HarnessOutcome::Completed }
            ] if c == call && r == record
        ));
        // Left: only the record the execution now owns.
        assert_eq!(blobs.live(), 1);
        let s = sim.actor(bridge).unwrap().stats();
        assert_eq!(
            (
                s.begun, s.calls, s.answered, s.recorded, s.finished, s.aborted, s.late
            ),
            (2, 1, 1, 1, 1, 1, 1)
        );
    }
}
