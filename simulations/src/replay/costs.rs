//! The cost model a record implies: the mean duration of each kind of
//! backend operation it holds, as the fixed costs of the simulated
//! backends. They price only what the record does not hold one by one:
//! model calls, evaluations, engine controls and every trainer,
//! device-memory and transfer operation take their own recorded time
//! ([`super::ReplayWorkload`]), and the means apply past the record (an
//! operation the recorded run did not make).
//!
//! A kind the record never saw costs nothing (a run without role changes
//! has no unload to price).

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_runtime::Nanos;

use super::schema::Recording;
use super::workload::ReplayWorkload;
use crate::costs::{Costs, Span};

/// Mean duration by operation kind.
pub fn mean_ops(rec: &Recording) -> BTreeMap<String, Nanos> {
    let mut sums: BTreeMap<String, (Nanos, u64)> = BTreeMap::new();
    for o in &rec.ops {
        let e = sums.entry(o.op.clone()).or_default();
        e.0 += o.end_ns - o.start_ns;
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(k, (sum, n))| (k, sum / n.max(1)))
        .collect()
}

/// The simulated backends' costs for replaying `rec` with `workload`.
pub fn replay_costs(rec: &Recording, workload: Arc<ReplayWorkload>) -> Costs {
    let m = mean_ops(rec);
    let get = |k: &str| m.get(k).copied().unwrap_or(0);
    let mut c = Costs::default();
    let calls: Vec<_> = rec.executions.iter().flat_map(|e| &e.calls).collect();
    let mean = |f: &dyn Fn(&&super::schema::Call) -> Option<u64>| {
        let v: Vec<u64> = calls.iter().filter_map(f).collect();
        if v.is_empty() {
            0
        } else {
            v.iter().sum::<u64>() / v.len() as u64
        }
    };
    // Calls the record does not hold (see `ReplayWorkload`) cost the mean.
    c.engine.call_base = Span::fixed(mean(&|c| c.service_ns));
    c.engine.output_tokens = Span::fixed(mean(&|c| Some(c.output_tokens)));
    c.engine.prefill_per_token = 0;
    c.engine.decode_per_token = 0;
    c.engine.unload = get("engine.unload");
    c.engine.load = get("engine.load");
    c.memory.release = Span::fixed(get("memory.release_rollout"));
    c.memory.release_training = Some(Span::fixed(get("memory.release_training")));
    c.memory.restore = Span::fixed(get("memory.restore_training"));
    c.memory.restore_rollout = Some(Span::fixed(get("memory.restore_rollout")));
    c.trainer.warmup = get("trainer.warmup");
    c.trainer.drain = get("trainer.drain");
    c.trainer.per_token = 0;
    c.trainer.per_micro_step = get("trainer.fwd_bwd");
    c.trainer.build_groups = 0;
    c.trainer.reduce = get("trainer.reduce");
    c.trainer.reduce_once = true;
    c.trainer.update = get("trainer.update");
    c.trainer.broadcast = 0;
    c.transfer.publish = Span::fixed(get("transfer.publish"));
    c.transfer.latency = get("transfer.read");
    c.transfer.expose = Some(get("transfer.expose"));
    c.transfer.ns_per_kib = 0;
    // The embedded transfer worker runs one operation at a time.
    c.transfer.serial = true;
    c.eval.latency = Span::fixed(0);
    c.eval.p_fail = 0.0;
    // The recorded harness's own timeouts are in its calls; none here.
    c.workload.timer_per_call = false;
    c.replay = Some(workload);
    c
}
