//! The demo protocol: a coordinator fans work out to workers in rounds, each
//! worker answers after a think time of its own choosing, and the coordinator
//! retries whoever is late.
//!
//! It exists to prove the hosts equivalent. It uses every part of the actor
//! contract (spawn, typed request/reply with request ids, fan-out, timers that
//! are armed, re-armed and cancelled, per-actor randomness, stop) and its
//! observable result does not depend on timing or message loss: a worker
//! draws its answer from its own seeded stream the first time it sees a
//! request and repeats it verbatim on retries. So the simulator, the live
//! host and the actix adapter must all report the same [`DemoResult`], while
//! schedules, retries and the trace hash may differ.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Addr, Cx, External, MILLIS, Nanos};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// What the demo measures; identical in every host for the same seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoResult {
    pub rounds: u32,
    pub workers: u32,
    /// Sum of the answers of each round.
    pub round_sums: Vec<u64>,
    /// Order-independent digest of every (round, worker, answer).
    pub checksum: u64,
}

/// What the coordinator reports at the end, with host-dependent details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoReport {
    pub result: DemoResult,
    /// Requests sent again after a round timeout (depends on the network).
    pub retries: u64,
    /// Duplicate answers ignored (a retry crossed a late answer).
    pub duplicates: u64,
    /// Time from start to the last answer, in the host's clock.
    pub elapsed: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoConfig {
    pub workers: u32,
    pub rounds: u32,
    /// How long the coordinator waits for a round before retrying the late.
    pub round_timeout: Nanos,
    /// Upper bound of a worker's think time.
    pub max_think: Nanos,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            rounds: 20,
            round_timeout: 40 * MILLIS,
            max_think: 4 * MILLIS,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum WorkerMsg {
    /// Compute the answer for `input` and reply to `reply_to` with `req`.
    Work {
        req: u64,
        input: u64,
        reply_to: Addr<Coordinator>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum CoordinatorMsg {
    Done { req: u64, worker: u32, value: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CoordinatorTimer {
    RoundTimeout(u32),
}

/// Answers work requests after a random think time; remembers its answers.
#[derive(Debug, Default)]
pub struct Worker {
    index: u32,
    answers: BTreeMap<u64, u64>,
    /// Replies waiting for their think timer: req -> (reply_to, value).
    thinking: BTreeMap<u64, Addr<Coordinator>>,
    max_think: Nanos,
}

impl Worker {
    pub fn new(index: u32, max_think: Nanos) -> Self {
        Self {
            index,
            max_think,
            ..Self::default()
        }
    }

    pub fn answered(&self) -> usize {
        self.answers.len()
    }
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type Timer = u64;

    fn on_msg(&mut self, _from: ActorId, msg: WorkerMsg, cx: &mut Cx<'_, Self>) {
        let WorkerMsg::Work {
            req,
            input,
            reply_to,
        } = msg;
        if !self.answers.contains_key(&req) {
            // First sight of this request: the only place randomness is drawn,
            // so the answer stream is the same whatever the network did.
            let noise: u64 = cx.rng().random_range(0..1000);
            let think = cx.rng().random_range(0..=self.max_think);
            self.answers.insert(req, input.wrapping_mul(31) + noise);
            self.thinking.insert(req, reply_to);
            cx.set_timer(req, think);
        } else if !cx.timer_armed(&req) {
            // A retry of an answered request: answer again at once.
            let value = self.answers[&req];
            cx.send(
                reply_to,
                CoordinatorMsg::Done {
                    req,
                    worker: self.index,
                    value,
                },
            );
        }
    }

    fn on_timer(&mut self, req: u64, cx: &mut Cx<'_, Self>) {
        if let Some(reply_to) = self.thinking.remove(&req) {
            let value = self.answers[&req];
            cx.send(
                reply_to,
                CoordinatorMsg::Done {
                    req,
                    worker: self.index,
                    value,
                },
            );
        }
    }
}

/// Spawns the workers, runs the rounds, reports, stops.
#[derive(Debug)]
pub struct Coordinator {
    cfg: DemoConfig,
    report_to: Addr<External<DemoReport>>,
    workers: Vec<Addr<Worker>>,
    round: u32,
    /// Answers of the current round by worker index.
    answers: BTreeMap<u32, u64>,
    round_sums: Vec<u64>,
    checksum: u64,
    retries: u64,
    duplicates: u64,
    started: Nanos,
    finished: bool,
}

impl Coordinator {
    pub fn new(cfg: DemoConfig, report_to: Addr<External<DemoReport>>) -> Self {
        Self {
            cfg,
            report_to,
            workers: Vec::new(),
            round: 0,
            answers: BTreeMap::new(),
            round_sums: Vec::new(),
            checksum: 0,
            retries: 0,
            duplicates: 0,
            started: 0,
            finished: false,
        }
    }

    pub fn rounds_done(&self) -> u32 {
        self.round_sums.len() as u32
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn req_id(&self, worker: u32) -> u64 {
        u64::from(self.round) * u64::from(self.cfg.workers) + u64::from(worker)
    }

    fn send_work(&self, worker: u32, cx: &mut Cx<'_, Self>) {
        let req = self.req_id(worker);
        let input = u64::from(self.round) * 1_000 + u64::from(worker);
        let reply_to = cx.me();
        cx.send(
            self.workers[worker as usize],
            WorkerMsg::Work {
                req,
                input,
                reply_to,
            },
        );
    }

    fn start_round(&mut self, cx: &mut Cx<'_, Self>) {
        self.answers.clear();
        for w in 0..self.cfg.workers {
            self.send_work(w, cx);
        }
        cx.set_timer(
            CoordinatorTimer::RoundTimeout(self.round),
            self.cfg.round_timeout,
        );
    }

    fn finish(&mut self, cx: &mut Cx<'_, Self>) {
        self.finished = true;
        let report = DemoReport {
            result: DemoResult {
                rounds: self.cfg.rounds,
                workers: self.cfg.workers,
                round_sums: self.round_sums.clone(),
                checksum: self.checksum,
            },
            retries: self.retries,
            duplicates: self.duplicates,
            elapsed: cx.now().saturating_sub(self.started),
        };
        cx.send(self.report_to, report);
        cx.stop();
    }
}

impl Actor for Coordinator {
    type Msg = CoordinatorMsg;
    type Timer = CoordinatorTimer;

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.started = cx.now();
        self.workers = (0..self.cfg.workers)
            .map(|i| cx.spawn(Worker::new(i, self.cfg.max_think)))
            .collect();
        if self.cfg.rounds == 0 || self.cfg.workers == 0 {
            self.finish(cx);
        } else {
            self.start_round(cx);
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: CoordinatorMsg, cx: &mut Cx<'_, Self>) {
        let CoordinatorMsg::Done { req, worker, value } = msg;
        if self.finished || worker >= self.cfg.workers || req != self.req_id(worker) {
            self.duplicates += 1; // late answer from an earlier round
            return;
        }
        if self.answers.insert(worker, value).is_some() {
            self.duplicates += 1;
            return;
        }
        if self.answers.len() < self.cfg.workers as usize {
            return;
        }
        cx.cancel_timer(&CoordinatorTimer::RoundTimeout(self.round));
        let sum = self.answers.values().fold(0u64, |a, v| a.wrapping_add(*v));
        for (w, v) in &self.answers {
            let item = gyre_runtime::rng::mix64(
                (u64::from(self.round) << 32) ^ (u64::from(*w) << 20) ^ *v,
            );
            self.checksum = self.checksum.wrapping_add(item);
        }
        self.round_sums.push(sum);
        self.round += 1;
        if self.round == self.cfg.rounds {
            self.finish(cx);
        } else {
            self.start_round(cx);
        }
    }

    fn on_timer(&mut self, timer: CoordinatorTimer, cx: &mut Cx<'_, Self>) {
        let CoordinatorTimer::RoundTimeout(round) = timer;
        if round != self.round || self.finished {
            return;
        }
        for w in 0..self.cfg.workers {
            if !self.answers.contains_key(&w) {
                self.retries += 1;
                self.send_work(w, cx);
            }
        }
        cx.set_timer(timer, self.cfg.round_timeout);
    }
}
