//! Gyre across processes: a head and node agents, started and watched by a
//! launcher actor through a placement backend, with payloads moved between
//! them by the transfer engine.
//!
//! The head (`gyre train --cluster …`) hosts the scheduling plane
//! (scheduler, proxy router, executions, evaluator, buffer, packer, queue,
//! core owner), the task's harness and evaluator, the transfer worker and
//! the [`launcher`]. Each node agent (`gyre node --head ADDR`) hosts what
//! the [`ClusterPlan`](gyre_actors::sched::plan::ClusterPlan) places on its
//! node: a cell's engine, trainer and device memory, or the pool's engine.
//! Messages travel over the live host's TCP links, authenticated by the
//! cluster secret; weights, gradients, KV and token payloads travel through
//! the [`plane`], each process's gyre-rdma engine.
//!
//! - [`proto`]: what the head and the node agents say to each other.
//! - [`launcher`]: the launcher actor (start, watch, report).
//! - [`placement`]: where node agents run (`local`, `slurm`) and the
//!   Kubernetes manifest.
//! - [`managed`]: node agents submitted to a manager (`sbatch`, `kubectl`).
//! - [`node`]: the node agent.
//! - [`head`]: the head's run.
//! - [`plane`]: payloads across processes.
//! - [`prefix`]: the training prefix's all-reduce and broadcast.
//! - [`tap`]: node agents' sampled tokens to the head's gateway streams.

pub mod head;
pub mod launcher;
pub mod managed;
pub mod node;
pub mod placement;
pub mod plane;
pub mod prefix;
pub mod proto;
pub mod tap;
