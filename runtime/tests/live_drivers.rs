//! What the live host's drivers (one scheduler loop per executor thread)
//! must keep: a panicking actor stops alone; order and the mailbox bound
//! hold across drivers; sends to itself keep their order past a full
//! mailbox; a busy driver still serves outside senders and timers; a child
//! spawned on another driver is reachable at once; a parked sender finishes
//! its effects, stop included.

use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, MILLIS, NodeId, RuntimeError};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(10);
const OUTSIDE: ActorId = ActorId::new(1, 999_999);

async fn recv<T>(rx: &mut Receiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a message")
        .expect("probe closed")
}

async fn node(threads: usize, cap: usize) -> LiveNode {
    let mut cfg = LiveConfig::local(NodeId(1), 3);
    cfg.actor_threads = threads;
    cfg.mailbox_capacity = cap;
    LiveNode::start(cfg).await.unwrap()
}

/// Waits until sends to `to` fail because it is gone.
async fn wait_gone<A: Actor>(node: &LiveNode, to: Addr<A>, msg: impl Fn() -> A::Msg) {
    let deadline = Instant::now() + WAIT;
    loop {
        match node.send(OUTSIDE, to, msg()).await {
            Err(RuntimeError::NoSuchActor(id)) => {
                assert_eq!(id, to.id());
                return;
            }
            Ok(()) => assert!(Instant::now() < deadline, "{to:?} still accepts"),
            Err(e) => panic!("unexpected {e}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// ---------- a panicking actor ----------

/// Echoes numbers to `report`; panics on zero.
struct Fragile {
    report: Addr<External<u64>>,
}

impl Actor for Fragile {
    type Msg = u64;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, n: u64, cx: &mut Cx<'_, Self>) {
        assert_ne!(n, 0, "zero is fatal");
        cx.send(self.report, n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_actor_stops_alone() {
    let node = node(1, 16).await;
    let (report, mut rx) = node.probe(16);
    let doomed = node.spawn(Fragile { report });
    let healthy = node.spawn(Fragile { report });
    node.send(OUTSIDE, doomed, 0u64).await.unwrap();
    wait_gone(&node, doomed, || 1u64).await;
    // Its neighbour on the same thread carries on.
    for n in 1..=3 {
        node.send(OUTSIDE, healthy, n).await.unwrap();
        assert_eq!(recv(&mut rx).await, (healthy.id(), n));
    }
    node.shutdown().await;
}

// ---------- order and backpressure across drivers ----------

/// Checks that numbers arrive in order and reports after `total`.
struct Counter {
    next: u64,
    total: u64,
    delay: Duration,
    report: Addr<External<u64>>,
}

impl Actor for Counter {
    type Msg = u64;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, n: u64, cx: &mut Cx<'_, Self>) {
        assert_eq!(n, self.next, "lost or reordered");
        self.next += 1;
        std::thread::sleep(self.delay); // slow on purpose
        if self.next == self.total {
            cx.send(self.report, self.next);
        }
    }
}

/// Sends `0..total` to `to` from one handler, then reports.
struct Burst {
    to: Addr<Counter>,
    total: u64,
    done: Addr<External<u64>>,
}

impl Actor for Burst {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        for n in 0..self.total {
            cx.send(self.to, n);
        }
        cx.send(self.done, u64::MAX);
    }
    fn on_msg(&mut self, _: ActorId, _: (), _: &mut Cx<'_, Self>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_another_driver_waits_for_room_and_keeps_order() {
    const CAP: usize = 4;
    const TOTAL: u64 = 60;
    let delay = Duration::from_millis(1);
    for threads in [2usize, 0] {
        let node = node(threads, CAP).await;
        let (report, mut rx) = node.probe(4);
        // Ids 2 and 3: with two drivers they run on different ones.
        let counter = node.spawn(Counter {
            next: 0,
            total: TOTAL,
            delay,
            report,
        });
        let t0 = Instant::now();
        let burst = node.spawn(Burst {
            to: counter,
            total: TOTAL,
            done: report,
        });
        let mut got = Vec::new();
        for _ in 0..2 {
            let (from, n) = recv(&mut rx).await;
            got.push((from, n, t0.elapsed()));
        }
        assert!(
            got.iter()
                .any(|(f, n, _)| *f == counter.id() && *n == TOTAL),
            "threads={threads}: {got:?}"
        );
        let burst_done = got.iter().find(|(f, ..)| *f == burst.id()).unwrap().2;
        let floor = delay * (TOTAL as u32 - CAP as u32 - 1);
        assert!(
            burst_done >= floor,
            "threads={threads}: the sender was not slowed ({burst_done:?} < {floor:?})"
        );
        node.shutdown().await;
    }
}

// ---------- sends to itself past a full mailbox ----------

#[derive(Debug, Serialize, Deserialize)]
enum SelfMsg {
    Go(u64),
    Own(u64),
    Outside(u64),
}

/// On `Go(n)` sends itself `0..n`; reports the order its own messages
/// came in, once all have.
struct Looper {
    expect: u64,
    own: Vec<u64>,
    outside: u64,
    report: Addr<External<(Vec<u64>, u64)>>,
}

impl Actor for Looper {
    type Msg = SelfMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, msg: SelfMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            SelfMsg::Go(n) => {
                self.expect = n;
                for i in 0..n {
                    cx.send_self(SelfMsg::Own(i));
                }
            }
            SelfMsg::Own(i) => {
                self.own.push(i);
                if self.own.len() as u64 == self.expect {
                    cx.send(self.report, (self.own.clone(), self.outside));
                }
            }
            SelfMsg::Outside(_) => self.outside += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_to_itself_keep_their_order_past_a_full_mailbox() {
    let node = node(1, 4).await;
    let (report, mut rx) = node.probe(4);
    let looper = node.spawn(Looper {
        expect: 0,
        own: Vec::new(),
        outside: 0,
        report,
    });
    node.send(OUTSIDE, looper, SelfMsg::Go(50)).await.unwrap();
    for i in 0..20 {
        node.send(OUTSIDE, looper, SelfMsg::Outside(i))
            .await
            .unwrap();
    }
    let (_, (own, _)) = recv(&mut rx).await;
    assert_eq!(
        own,
        (0..50).collect::<Vec<_>>(),
        "sends to itself reordered"
    );
    node.shutdown().await;
}

// ---------- a busy driver still serves outside senders and timers ----------

#[derive(Debug, Serialize, Deserialize)]
enum BallMsg {
    Peer(Addr<Ball>),
    Hit,
    Outside(u64),
    Stop,
}

/// Bounces a ball with its peer for ever; counts outside messages.
struct Ball {
    peer: Option<Addr<Ball>>,
    outside: u64,
    want: u64,
    report: Addr<External<u64>>,
}

impl Actor for Ball {
    type Msg = BallMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, msg: BallMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            BallMsg::Peer(p) => {
                self.peer = Some(p);
                cx.send(p, BallMsg::Hit);
            }
            BallMsg::Hit => {
                if let Some(p) = self.peer {
                    cx.send(p, BallMsg::Hit);
                }
            }
            BallMsg::Outside(_) => {
                self.outside += 1;
                if self.outside == self.want {
                    cx.send(self.report, self.outside);
                }
            }
            BallMsg::Stop => self.peer = None,
        }
    }
}

/// Reports each time its timer fires, three times.
struct Alarm {
    fired: u64,
    report: Addr<External<u64>>,
}

impl Actor for Alarm {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.set_timer((), 5 * MILLIS);
    }
    fn on_msg(&mut self, _: ActorId, _: (), _: &mut Cx<'_, Self>) {}
    fn on_timer(&mut self, _: (), cx: &mut Cx<'_, Self>) {
        self.fired += 1;
        cx.send(self.report, self.fired);
        if self.fired < 3 {
            cx.set_timer((), 5 * MILLIS);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_driver_still_serves_outside_senders_and_timers() {
    // A tiny mailbox: places the driver holds for the rally would starve
    // outside senders if it kept them.
    let node = node(1, 2).await;
    let (report, mut rx) = node.probe(16);
    let ball = |want| Ball {
        peer: None,
        outside: 0,
        want,
        report,
    };
    let a = node.spawn(ball(200));
    let b = node.spawn(ball(0));
    node.send(OUTSIDE, a, BallMsg::Peer(b)).await.unwrap();
    node.send(OUTSIDE, b, BallMsg::Peer(a)).await.unwrap();
    let t0 = Instant::now();
    for i in 0..200 {
        let sent = tokio::time::timeout(WAIT, node.send(OUTSIDE, a, BallMsg::Outside(i))).await;
        assert!(matches!(sent, Ok(Ok(()))), "outside send {i} starved");
    }
    assert_eq!(recv(&mut rx).await, (a.id(), 200));
    let alarm = node.spawn(Alarm { fired: 0, report });
    for n in 1..=3 {
        assert_eq!(recv(&mut rx).await, (alarm.id(), n));
    }
    assert!(t0.elapsed() < WAIT, "took {:?}", t0.elapsed());
    node.send(OUTSIDE, a, BallMsg::Stop).await.unwrap();
    node.shutdown().await;
}

// ---------- spawning onto another driver ----------

#[derive(Debug, Serialize, Deserialize)]
enum KidMsg {
    Hello(Addr<External<u64>>),
}

struct Kid(u64);

impl Actor for Kid {
    type Msg = KidMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, KidMsg::Hello(to): KidMsg, cx: &mut Cx<'_, Self>) {
        cx.send(to, self.0);
    }
}

/// Spawns `n` kids and greets each at once.
struct Parent {
    n: u64,
    report: Addr<External<u64>>,
}

impl Actor for Parent {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        for i in 0..self.n {
            let kid = cx.spawn(Kid(i));
            cx.send(kid, KidMsg::Hello(self.report));
        }
    }
    fn on_msg(&mut self, _: ActorId, _: (), _: &mut Cx<'_, Self>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kids_spawned_on_other_drivers_are_reachable_at_once() {
    for threads in [1usize, 3] {
        let node = node(threads, 8).await;
        let (report, mut rx) = node.probe(64);
        node.spawn(Parent { n: 12, report });
        let mut got: Vec<u64> = Vec::new();
        for _ in 0..12 {
            got.push(recv(&mut rx).await.1);
        }
        got.sort_unstable();
        assert_eq!(got, (0..12).collect::<Vec<_>>(), "threads={threads}");
        node.shutdown().await;
    }
}

// ---------- a parked sender finishes its effects ----------

/// Sends `0..total` to `to`, then stops.
struct Quitter {
    to: Addr<Counter>,
    total: u64,
}

impl Actor for Quitter {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        for n in 0..self.total {
            cx.send(self.to, n);
        }
        cx.stop();
    }
    fn on_msg(&mut self, _: ActorId, _: (), _: &mut Cx<'_, Self>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_sender_delivers_everything_then_stops() {
    for threads in [1usize, 2] {
        let node = node(threads, 2).await;
        let (report, mut rx) = node.probe(4);
        let counter = node.spawn(Counter {
            next: 0,
            total: 40,
            delay: Duration::from_micros(200),
            report,
        });
        let quitter = node.spawn(Quitter {
            to: counter,
            total: 40,
        });
        assert_eq!(recv(&mut rx).await, (counter.id(), 40), "threads={threads}");
        wait_gone(&node, quitter, || ()).await;
        node.shutdown().await;
    }
}
