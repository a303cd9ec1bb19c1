//! Messages per second for the same two workloads in every host, in one run:
//! ping-pong (two actors, one message in flight) and fan-out (one hub, 64
//! leaves, every round a request to each leaf and a reply from each).
//!
//! Compared side by side: the simulator (one core, virtual time), the live
//! tokio host in one process, Gyre actors in the actix adapter, and the same
//! workloads written directly against actix. Every side does the same work:
//! each actor knows its peers from the start (no reply address travels), each
//! message carries one `u64` (a count or the round), and no mailbox applies
//! backpressure (actix's `do_send` ignores its capacity, the adapter's inbox
//! is unbounded). Criterion reports elements (messages) per second;
//! README.md quotes the medians and their ratios.
//! A last group times what a live row pays per iteration besides messages
//! (node start, spawns, shutdown), to show that it is not what they measure.
//!
//! The `*_cpu` groups measure the two actix rows again in this thread's CPU
//! time instead of wall time. Both run wholly on this thread (one actix
//! arbiter, no I/O), so its CPU time is their whole cost, while the time the
//! thread spends preempted by other processes on a shared machine is left
//! out: their ratio holds still where the wall-time one does not.

use std::time::Duration;

use actix::{Actor as ActixActor, AsyncContext, Context, Handler};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use gyre_runtime::actix_host::{ActixGyre, Tell};
use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};
use serde::{Deserialize, Serialize};

const PING_PONG_ROUNDS: u64 = 20_000;
const FAN_OUT_LEAVES: u64 = 64;
const FAN_OUT_ROUNDS: u64 = 300;

// ---------- the workloads as Gyre actors ----------

#[derive(Debug, Serialize, Deserialize)]
enum PingMsg {
    Start(Addr<Ponger>),
    Pong(u64),
}

#[derive(Debug, Serialize, Deserialize)]
struct Ping(u64);

struct Pinger {
    rounds: u64,
    peer: Option<Addr<Ponger>>,
    done: Addr<External<u64>>,
}

impl Actor for Pinger {
    type Msg = PingMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, msg: PingMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            PingMsg::Start(peer) => {
                self.peer = Some(peer);
                cx.send(peer, Ping(0));
            }
            PingMsg::Pong(n) if n + 1 >= self.rounds => cx.send(self.done, n + 1),
            PingMsg::Pong(n) => {
                if let Some(peer) = self.peer {
                    cx.send(peer, Ping(n + 1));
                }
            }
        }
    }
}

struct Ponger {
    pinger: Addr<Pinger>,
}
impl Actor for Ponger {
    type Msg = Ping;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, Ping(n): Ping, cx: &mut Cx<'_, Self>) {
        cx.send(self.pinger, PingMsg::Pong(n));
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum HubMsg {
    Start(Vec<Addr<Leaf>>),
    Reply(u64),
}

/// A request of round `.0`.
#[derive(Debug, Serialize, Deserialize)]
struct Request(u64);

struct Hub {
    leaves: Vec<Addr<Leaf>>,
    waiting: u64,
    round: u64,
    done: Addr<External<u64>>,
}

impl Hub {
    fn fan_out(&mut self, cx: &mut Cx<'_, Self>) {
        for leaf in &self.leaves {
            cx.send(*leaf, Request(self.round));
        }
        self.waiting = self.leaves.len() as u64;
    }
}

impl Actor for Hub {
    type Msg = HubMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, msg: HubMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            HubMsg::Start(leaves) => {
                self.leaves = leaves;
                self.fan_out(cx);
            }
            HubMsg::Reply(round) => {
                debug_assert_eq!(round, self.round);
                self.waiting -= 1;
                if self.waiting == 0 {
                    self.round += 1;
                    if self.round == FAN_OUT_ROUNDS {
                        cx.send(self.done, self.round);
                    } else {
                        self.fan_out(cx);
                    }
                }
            }
        }
    }
}

struct Leaf {
    hub: Addr<Hub>,
}
impl Actor for Leaf {
    type Msg = Request;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, Request(round): Request, cx: &mut Cx<'_, Self>) {
        cx.send(self.hub, HubMsg::Reply(round));
    }
}

fn pinger(done: Addr<External<u64>>) -> Pinger {
    Pinger {
        rounds: PING_PONG_ROUNDS,
        peer: None,
        done,
    }
}

fn hub(done: Addr<External<u64>>) -> Hub {
    Hub {
        leaves: Vec::new(),
        waiting: 0,
        round: 0,
        done,
    }
}

const OUTSIDE: ActorId = ActorId::new(99, 0);

// ---------- simulator ----------

fn sim_ping_pong() -> u64 {
    let mut sim = Sim::new(SimConfig::new(1));
    let done = sim.probe::<u64>(NodeId(0));
    let pinger = sim.spawn(NodeId(0), pinger(done));
    let ponger = sim.spawn(NodeId(0), Ponger { pinger });
    sim.inject(OUTSIDE, pinger, PingMsg::Start(ponger));
    sim.run().expect("no invariant to break");
    sim.events()
}

fn sim_fan_out() -> u64 {
    let mut sim = Sim::new(SimConfig::new(1));
    let done = sim.probe::<u64>(NodeId(0));
    let hub = sim.spawn(NodeId(0), hub(done));
    let leaves = (0..FAN_OUT_LEAVES)
        .map(|_| sim.spawn(NodeId(0), Leaf { hub }))
        .collect();
    sim.inject(OUTSIDE, hub, HubMsg::Start(leaves));
    sim.run().expect("no invariant to break");
    sim.events()
}

// ---------- live host, one process ----------

async fn live_ping_pong() {
    let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
        .await
        .expect("local node starts");
    let (done, mut rx) = node.probe::<u64>(4);
    let pinger = node.spawn(pinger(done));
    let ponger = node.spawn(Ponger { pinger });
    node.send(OUTSIDE, pinger, PingMsg::Start(ponger))
        .await
        .expect("pinger is local");
    rx.recv().await.expect("pinger reports");
    node.shutdown().await;
}

async fn live_fan_out() {
    let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
        .await
        .expect("local node starts");
    let (done, mut rx) = node.probe::<u64>(4);
    let hub = node.spawn(hub(done));
    let leaves = (0..FAN_OUT_LEAVES)
        .map(|_| node.spawn(Leaf { hub }))
        .collect();
    node.send(OUTSIDE, hub, HubMsg::Start(leaves))
        .await
        .expect("hub is local");
    rx.recv().await.expect("hub reports");
    node.shutdown().await;
}

// ---------- Gyre actors in the actix adapter ----------

struct Finish(Option<tokio::sync::oneshot::Sender<()>>);
impl ActixActor for Finish {
    type Context = Context<Self>;
}
impl Handler<Tell<u64>> for Finish {
    type Result = ();
    fn handle(&mut self, _: Tell<u64>, _: &mut Context<Self>) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

fn adapter_ping_pong(sys: &mut actix::SystemRunner) {
    sys.block_on(async {
        let gyre = ActixGyre::new(NodeId(0), 1);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = gyre.external(Finish(Some(tx)).start().recipient());
        let pinger = gyre.start(pinger(done));
        let ponger = gyre.start(Ponger { pinger: pinger.id });
        pinger.tell(OUTSIDE, PingMsg::Start(ponger.id));
        rx.await.expect("pinger reports");
    });
}

fn adapter_fan_out(sys: &mut actix::SystemRunner) {
    sys.block_on(async {
        let gyre = ActixGyre::new(NodeId(0), 1);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = gyre.external(Finish(Some(tx)).start().recipient());
        let hub = gyre.start(hub(done));
        let leaves = (0..FAN_OUT_LEAVES)
            .map(|_| gyre.start(Leaf { hub: hub.id }).id)
            .collect();
        hub.tell(OUTSIDE, HubMsg::Start(leaves));
        rx.await.expect("hub reports");
    });
}

// ---------- the same workloads written directly against actix ----------

#[derive(actix::Message)]
#[rtype(result = "()")]
struct APing(u64);
#[derive(actix::Message)]
#[rtype(result = "()")]
struct APong(u64);

struct APinger {
    rounds: u64,
    peer: Option<actix::Addr<APonger>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}
struct APonger {
    pinger: Option<actix::Addr<APinger>>,
}
impl ActixActor for APinger {
    type Context = Context<Self>;
}
impl ActixActor for APonger {
    type Context = Context<Self>;
}
impl Handler<APing> for APonger {
    type Result = ();
    fn handle(&mut self, APing(n): APing, _: &mut Context<Self>) {
        if let Some(p) = &self.pinger {
            p.do_send(APong(n));
        }
    }
}
impl Handler<APong> for APinger {
    type Result = ();
    fn handle(&mut self, APong(n): APong, _: &mut Context<Self>) {
        if n + 1 >= self.rounds {
            if let Some(tx) = self.done.take() {
                let _ = tx.send(());
            }
        } else if let Some(p) = &self.peer {
            p.do_send(APing(n + 1));
        }
    }
}

fn actix_ping_pong(sys: &mut actix::SystemRunner) {
    sys.block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pinger_ctx = Context::<APinger>::new();
        let pinger_addr = pinger_ctx.address();
        let ponger = APonger {
            pinger: Some(pinger_addr.clone()),
        }
        .start();
        pinger_ctx.run(APinger {
            rounds: PING_PONG_ROUNDS,
            peer: Some(ponger.clone()),
            done: Some(tx),
        });
        ponger.do_send(APing(0));
        rx.await.expect("pinger reports");
    });
}

#[derive(actix::Message)]
#[rtype(result = "()")]
struct AReq(u64);
#[derive(actix::Message)]
#[rtype(result = "()")]
struct AReply(u64);

struct AHub {
    leaves: Vec<actix::Addr<ALeaf>>,
    waiting: u64,
    round: u64,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}
struct ALeaf {
    hub: actix::Addr<AHub>,
}
impl ActixActor for AHub {
    type Context = Context<Self>;
}
impl ActixActor for ALeaf {
    type Context = Context<Self>;
}
impl AHub {
    fn fan_out(&mut self) {
        for leaf in &self.leaves {
            leaf.do_send(AReq(self.round));
        }
        self.waiting = self.leaves.len() as u64;
    }
}
impl Handler<AReq> for ALeaf {
    type Result = ();
    fn handle(&mut self, AReq(round): AReq, _: &mut Context<Self>) {
        self.hub.do_send(AReply(round));
    }
}
impl Handler<AReply> for AHub {
    type Result = ();
    fn handle(&mut self, AReply(round): AReply, _: &mut Context<Self>) {
        debug_assert_eq!(round, self.round);
        self.waiting -= 1;
        if self.waiting == 0 {
            self.round += 1;
            if self.round == FAN_OUT_ROUNDS {
                if let Some(tx) = self.done.take() {
                    let _ = tx.send(());
                }
            } else {
                self.fan_out();
            }
        }
    }
}

fn actix_fan_out(sys: &mut actix::SystemRunner) {
    sys.block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let hub_ctx = Context::<AHub>::new();
        let hub_addr = hub_ctx.address();
        let leaves = (0..FAN_OUT_LEAVES)
            .map(|_| {
                ALeaf {
                    hub: hub_addr.clone(),
                }
                .start()
            })
            .collect();
        let mut hub = AHub {
            leaves,
            waiting: 0,
            round: 0,
            done: Some(tx),
        };
        hub.fan_out();
        hub_ctx.run(hub);
        rx.await.expect("hub reports");
    });
}

// ---------- criterion ----------

fn ping_pong(c: &mut Criterion) {
    let mut g = c.benchmark_group("ping_pong");
    g.throughput(Throughput::Elements(2 * PING_PONG_ROUNDS));
    g.measurement_time(Duration::from_secs(4));
    g.sample_size(10);
    g.bench_function(BenchmarkId::new("host", "sim"), |b| b.iter(sim_ping_pong));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    g.bench_function(BenchmarkId::new("host", "live"), |b| {
        b.iter(|| rt.block_on(live_ping_pong()))
    });
    let mut sys = actix::System::new();
    g.bench_function(BenchmarkId::new("host", "actix-adapter"), |b| {
        b.iter(|| adapter_ping_pong(&mut sys))
    });
    g.bench_function(BenchmarkId::new("host", "actix-direct"), |b| {
        b.iter(|| actix_ping_pong(&mut sys))
    });
    g.finish();
}

fn fan_out(c: &mut Criterion) {
    let mut g = c.benchmark_group("fan_out");
    g.throughput(Throughput::Elements(2 * FAN_OUT_LEAVES * FAN_OUT_ROUNDS));
    g.measurement_time(Duration::from_secs(4));
    g.sample_size(10);
    g.bench_function(BenchmarkId::new("host", "sim"), |b| b.iter(sim_fan_out));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    g.bench_function(BenchmarkId::new("host", "live"), |b| {
        b.iter(|| rt.block_on(live_fan_out()))
    });
    let mut sys = actix::System::new();
    g.bench_function(BenchmarkId::new("host", "actix-adapter"), |b| {
        b.iter(|| adapter_fan_out(&mut sys))
    });
    g.bench_function(BenchmarkId::new("host", "actix-direct"), |b| {
        b.iter(|| actix_fan_out(&mut sys))
    });
    g.finish();
}

/// What the live rows pay per iteration besides messages: starting a node
/// (its actor thread and runtime), spawning the fan-out's 65 actors, and
/// shutting it all down again.
fn live_node_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("live_node_overhead");
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    g.bench_function("start_spawn_65_shutdown", |b| {
        b.iter(|| {
            rt.block_on(async {
                let node = LiveNode::start(LiveConfig::local(NodeId(0), 1))
                    .await
                    .expect("local node starts");
                let (done, _rx) = node.probe::<u64>(4);
                let hub = node.spawn(hub(done));
                for _ in 0..FAN_OUT_LEAVES {
                    node.spawn(Leaf { hub });
                }
                node.shutdown().await;
            })
        })
    });
    g.finish();
}

// ---------- the actix rows in thread CPU time ----------

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion's measurement in this thread's CPU time.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu() - start
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Values in nanoseconds, shown as milliseconds and messages per second.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v *= 1e-6);
        "ms (cpu)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let per_iter = match *t {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
        } as f64;
        values
            .iter_mut()
            .for_each(|v| *v = per_iter * 1e9 / *v / 1e6);
        "Melem/s"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn actix_cpu(c: &mut Criterion<ThreadCpu>) {
    let mut sys = actix::System::new();
    for (name, msgs, adapter, direct) in [
        (
            "ping_pong_cpu",
            2 * PING_PONG_ROUNDS,
            adapter_ping_pong as fn(&mut actix::SystemRunner),
            actix_ping_pong as fn(&mut actix::SystemRunner),
        ),
        (
            "fan_out_cpu",
            2 * FAN_OUT_LEAVES * FAN_OUT_ROUNDS,
            adapter_fan_out,
            actix_fan_out,
        ),
    ] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(msgs));
        g.measurement_time(Duration::from_secs(4));
        g.sample_size(10);
        g.bench_function(BenchmarkId::new("host", "actix-adapter"), |b| {
            b.iter(|| adapter(&mut sys))
        });
        g.bench_function(BenchmarkId::new("host", "actix-direct"), |b| {
            b.iter(|| direct(&mut sys))
        });
        g.finish();
    }
}

criterion_group!(benches, ping_pong, fan_out, live_node_overhead);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = actix_cpu
}
criterion_main!(benches, cpu);
