//! A simulated evaluator backend: a drawn latency, a failure probability
//! (the evaluator actor retries), and a reward drawn independently of how
//! long the run took or how it ended. A repeated request is ignored while
//! under way and answered again once done (see [`super::answered`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::ExecId;
use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq};
use gyre_runtime::{Actor, ActorId, Cx, Recipient};
use rand::Rng;

use gyre_actors::sched::retry::ReqKey;

use super::answered::Answered;
use crate::costs::EvalCosts;
use crate::replay::ReplayWorkload;

#[derive(Debug)]
pub struct SimEvaluator {
    costs: EvalCosts,
    pending: BTreeMap<(ExecId, u32), Recipient<EvalEvent>>,
    pub scored: u64,
    pub failed: u64,
    answered: Answered<EvalEvent>,
    /// A recorded run: each attempt fails as it did then.
    replay: Option<Arc<ReplayWorkload>>,
}

impl SimEvaluator {
    pub fn new(costs: EvalCosts) -> Self {
        Self {
            costs,
            pending: BTreeMap::new(),
            scored: 0,
            failed: 0,
            answered: Answered::default(),
            replay: None,
        }
    }

    /// Evaluates as the recorded run did (latency, failed attempts).
    pub fn replaying(mut self, replay: Arc<ReplayWorkload>) -> Self {
        self.replay = Some(replay);
        self
    }
}

impl Actor for SimEvaluator {
    type Msg = EvalReq;
    type Timer = (ExecId, u32);

    fn on_msg(&mut self, _from: ActorId, msg: EvalReq, cx: &mut Cx<'_, Self>) {
        let EvalReq::Score {
            exec,
            attempt,
            reply_to,
        } = msg;
        if self.pending.contains_key(&(exec, attempt)) {
            return; // under way: its answer will come
        }
        if let Some((to, event)) = self
            .answered
            .again(ReqKey::Score(exec, attempt), reply_to.id())
        {
            return cx.send(to, event);
        }
        self.pending.insert((exec, attempt), reply_to);
        let t = match &self.replay {
            Some(r) => r.exec(exec).eval_latency,
            None => self.costs.latency.draw(cx.rng()),
        };
        cx.set_timer((exec, attempt), t);
    }

    fn on_timer(&mut self, key: (ExecId, u32), cx: &mut Cx<'_, Self>) {
        let Some(reply_to) = self.pending.remove(&key) else {
            return;
        };
        let (exec, attempt) = key;
        let replayed = self.replay.as_ref().map(|r| {
            let failed = &r.exec(exec).eval_failed;
            failed.get(attempt as usize).copied().unwrap_or(false)
        });
        let rng = cx.rng();
        let fails = match replayed {
            Some(f) => f,
            None => rng.random_bool(self.costs.p_fail.clamp(0.0, 1.0)),
        };
        let event = if fails {
            self.failed += 1;
            EvalEvent::Failed { exec, attempt }
        } else {
            self.scored += 1;
            let reward = if rng.random_bool(0.5) { 1.0 } else { 0.0 };
            EvalEvent::Scored {
                exec,
                attempt,
                reward,
            }
        };
        self.answered
            .put(ReqKey::Score(exec, attempt), reply_to, event.clone());
        cx.send(reply_to, event);
    }
}
